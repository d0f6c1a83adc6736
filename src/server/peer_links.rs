//! A core's Raft links to its peers: the outbound links it dials (one per
//! shard and peer member), and the decoding of what arrives on any link into
//! the shards' inbound queues, snapshot streams included.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message as _;
use tokio::sync::mpsc;

use super::shard::{PeerSender, ShardInbound};
use crate::raft;
use crate::routing::ShardId;

/// Largest snapshot stream a member accepts. A snapshot is assembled in memory
/// (as slices of the receive buffers) before the store is restored from it.
pub const MAX_SNAPSHOT_STREAM_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// A link and the peer URLs it was dialed at.
type DialedLink = (cairn_net::Link, Vec<String>);

/// The outbound links of one core: one per (shard, peer member).
pub(super) struct CorePeers {
    pub(super) links: RefCell<HashMap<(ShardId, u64), DialedLink>>,
    pub(super) net: cairn_net::Config,
    pub(super) inbound: Arc<Vec<mpsc::Sender<ShardInbound>>>,
}

impl CorePeers {
    pub(super) fn dial(&self, shard: ShardId, to: u64, peer_urls: &[String]) -> Result<(), String> {
        let url = peer_urls
            .first()
            .ok_or_else(|| format!("member {to:x} has no peer URL"))?;
        let target = crate::config::url_host_port("peer-urls", url).map_err(|e| e.to_string())?;
        // The URL's scheme says whether the peer speaks TLS, as with etcd.
        let net = if crate::config::url_is_https(url) {
            if self.net.tls.is_none() {
                return Err(format!(
                    "{url} is https but this member has no peer TLS \
                     (--peer-cert-file and --peer-key-file, or --peer-auto-tls)"
                ));
            }
            self.net.clone()
        } else {
            cairn_net::Config {
                tls: None,
                ..self.net.clone()
            }
        };
        let (link, rx) = cairn_net::dial(&net, to, cairn_net::PeerTarget::HostPort(target), shard)
            .map_err(|e| format!("peer transport config: {e}"))?;
        tokio::task::spawn_local(forward_inbound(rx, self.inbound.clone(), to, None));
        // Dropping a replaced link closes its connection.
        self.links
            .borrow_mut()
            .insert((shard, to), (link, peer_urls.to_vec()));
        Ok(())
    }
}

impl PeerSender for CorePeers {
    fn send(&self, shard: ShardId, msg: raft::Message) -> bool {
        let links = self.links.borrow();
        let Some((link, _)) = links.get(&(shard, msg.to)) else {
            return false;
        };
        let payload = Bytes::from(msg.encode_to_vec());
        link.send(shard, 0, payload).is_ok()
    }

    fn link(&self, shard: ShardId, to: u64) -> Option<cairn_net::Link> {
        self.links
            .borrow()
            .get(&(shard, to))
            .map(|(l, _)| l.clone())
    }

    fn connect(&self, shard: ShardId, to: u64, peer_urls: &[String]) {
        let current = self
            .links
            .borrow()
            .get(&(shard, to))
            .map(|(_, u)| u.clone());
        if current.is_some_and(|u| super::members::same_urls(&u, peer_urls)) {
            return;
        }
        if let Err(e) = self.dial(shard, to, peer_urls) {
            tracing::warn!(shard, member = format_args!("{to:x}"), error = %e, "cannot reach member");
        }
    }

    fn disconnect(&self, shard: ShardId, to: u64) {
        if let Some((link, _)) = self.links.borrow_mut().remove(&(shard, to)) {
            link.close();
        }
    }
}

/// Decodes Raft messages from an inbound link and hands them to their shard.
/// `_link` is the link the receiver belongs to when nothing else holds it (an
/// accepted connection): dropping a link closes its connection.
pub(super) async fn forward_inbound(
    mut rx: cairn_net::InboundReceiver,
    inbound: Arc<Vec<mpsc::Sender<ShardInbound>>>,
    peer: u64,
    _link: Option<cairn_net::Link>,
) {
    // Snapshot streams being received: stream id -> (shard, chunks, bytes).
    let mut streams: HashMap<u64, (u32, Vec<Bytes>, u64)> = HashMap::new();
    while let Some(item) = rx.recv().await {
        let (shard_id, delivery) = match item {
            cairn_net::Inbound::Message {
                shard_id, payload, ..
            } => match raft::Message::decode(payload) {
                Ok(m) => (shard_id, ShardInbound::Raft(m)),
                Err(e) => {
                    tracing::warn!(peer, shard = shard_id, error = %e, "undecodable raft message dropped");
                    continue;
                }
            },
            cairn_net::Inbound::StreamStart {
                stream_id,
                shard_id,
                ..
            } => {
                streams.insert(stream_id, (shard_id, Vec::new(), 0));
                continue;
            }
            cairn_net::Inbound::StreamChunk {
                stream_id, data, ..
            } => {
                let mut over = false;
                if let Some((shard, chunks, total)) = streams.get_mut(&stream_id) {
                    *total += data.len() as u64;
                    if *total > MAX_SNAPSHOT_STREAM_BYTES {
                        tracing::warn!(
                            peer,
                            shard = *shard,
                            limit_bytes = MAX_SNAPSHOT_STREAM_BYTES,
                            "snapshot stream over the limit dropped"
                        );
                        over = true;
                    } else {
                        chunks.push(data);
                    }
                }
                if over {
                    streams.remove(&stream_id);
                }
                continue;
            }
            cairn_net::Inbound::StreamEnd { stream_id, .. } => match streams.remove(&stream_id) {
                Some((shard, chunks, _)) => (shard, ShardInbound::Snapshot(chunks)),
                None => continue,
            },
            cairn_net::Inbound::StreamAborted { stream_id, .. } => {
                streams.remove(&stream_id);
                continue;
            }
        };
        let Some(tx) = inbound.get(shard_id as usize) else {
            tracing::warn!(
                peer,
                shard = shard_id,
                "message for an unknown shard dropped"
            );
            continue;
        };
        if tx.send(delivery).await.is_err() {
            return;
        }
    }
}

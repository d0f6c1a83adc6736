//! A core's Raft links to its peers: the outbound links it dials (one per
//! shard and peer member), and the decoding of what arrives on any link into
//! the shards' inbound queues, snapshot streams included.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message as _;
use tokio::sync::mpsc;

use crate::raft;
use crate::routing::ShardId;
use crate::server::member::data_dir::shard_dir;
use crate::server::shard::{
    PeerSender, ShardInbound, SnapshotTransfer, SpoolError, SpoolWriterThread, StreamSpool,
};

/// Largest snapshot stream a member accepts, checked as its bytes arrive. A
/// snapshot is spooled to a file as it arrives, so this bounds disk, not memory.
pub const MAX_SNAPSHOT_STREAM_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// A link and the peer URLs it was dialed at.
type DialedLink = (cairn_net::Link, Vec<String>);

/// The outbound links of one core: one per (shard, peer member).
pub(super) struct CorePeers {
    pub(super) links: RefCell<HashMap<(ShardId, u64), DialedLink>>,
    pub(super) net: cairn_net::Config,
    pub(super) inbound: Arc<Vec<mpsc::Sender<ShardInbound>>>,
    /// The member's data directory, where received snapshots are spooled.
    pub(super) data_dir: PathBuf,
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
        tokio::task::spawn_local(forward_inbound(
            rx,
            self.inbound.clone(),
            self.data_dir.clone(),
            to,
            None,
        ));
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

    fn has_link(&self, shard: ShardId, to: u64) -> bool {
        self.links.borrow().contains_key(&(shard, to))
    }

    fn connected_since(&self, shard: ShardId, to: u64) -> Option<std::time::Instant> {
        self.links
            .borrow()
            .get(&(shard, to))
            .and_then(|(link, _)| link.connected_since())
    }

    fn send_snapshot<'a>(
        &self,
        shard: ShardId,
        to: u64,
        source: &'a mut dyn cairn_net::StreamSource,
    ) -> Option<SnapshotTransfer<'a>> {
        let link = self
            .links
            .borrow()
            .get(&(shard, to))
            .map(|(l, _)| l.clone())?;
        Some(Box::pin(async move {
            link.send_stream(shard, source).await.map(|_| ())
        }))
    }

    fn connect(&self, shard: ShardId, to: u64, peer_urls: &[String]) {
        let current = self
            .links
            .borrow()
            .get(&(shard, to))
            .map(|(_, u)| u.clone());
        if current.is_some_and(|u| crate::server::members::same_urls(&u, peer_urls)) {
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

/// Decodes Raft messages from an inbound link and hands them to their shard;
/// spools snapshot streams to files in the shard's directory as they arrive
/// (see [`StreamSpool`]), and hands a complete one to the shard as its file.
/// `_link` is the link the receiver belongs to when nothing else holds it (an
/// accepted connection): dropping a link closes its connection.
///
/// While a stream's writer is behind, this waits; the link's inbound queue
/// fills and the transport stops acknowledging the stream, so the sender
/// slows to the disk's pace. It also
/// waits for the end of a stream to be synced, so the messages the leader
/// sends after a snapshot reach the shard after it.
pub(super) async fn forward_inbound(
    mut rx: cairn_net::InboundReceiver,
    inbound: Arc<Vec<mpsc::Sender<ShardInbound>>>,
    data_dir: PathBuf,
    peer: u64,
    _link: Option<cairn_net::Link>,
) {
    // Snapshot streams being received, by stream id. Dropping one deletes its file.
    let mut streams: HashMap<u64, StreamSpool> = HashMap::new();
    // Messages dropped on full shard queues, from this peer.
    let mut dropped = 0u64;
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
                attempt,
            } => {
                // An earlier attempt of the same stream is dropped.
                streams.remove(&stream_id);
                if inbound.get(shard_id as usize).is_none() {
                    tracing::warn!(
                        peer,
                        shard = shard_id,
                        "snapshot stream for an unknown shard dropped"
                    );
                    continue;
                }
                let dir = shard_dir(&data_dir, shard_id);
                match StreamSpool::start(
                    &dir,
                    shard_id,
                    peer,
                    stream_id,
                    attempt,
                    MAX_SNAPSHOT_STREAM_BYTES,
                    SpoolWriterThread::Own,
                ) {
                    Ok(spool) => {
                        streams.insert(stream_id, spool);
                    }
                    Err(e) => {
                        tracing::warn!(peer, shard = shard_id, error = %e, "snapshot stream dropped")
                    }
                }
                continue;
            }
            cairn_net::Inbound::StreamChunk {
                stream_id, data, ..
            } => {
                let Some(spool) = streams.get_mut(&stream_id) else {
                    continue;
                };
                match spool.append(data).await {
                    Ok(()) => {}
                    // The writer logged why, naming the file.
                    Err(SpoolError::WriterGone { .. }) => {
                        streams.remove(&stream_id);
                    }
                    Err(e) => {
                        tracing::warn!(
                            peer,
                            shard = spool.shard(),
                            file = %spool.path().display(),
                            error = %e,
                            "snapshot stream dropped"
                        );
                        streams.remove(&stream_id);
                    }
                }
                continue;
            }
            cairn_net::Inbound::StreamEnd { stream_id, .. } => {
                let Some(spool) = streams.remove(&stream_id) else {
                    continue;
                };
                let shard = spool.shard();
                match spool.finish().await {
                    Ok(spooled) => (shard, ShardInbound::Snapshot(spooled)),
                    Err(SpoolError::WriterGone { .. }) => continue,
                    Err(e) => {
                        tracing::warn!(peer, shard, error = %e, "snapshot stream dropped");
                        continue;
                    }
                }
            }
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
        // A shard whose queue is full (busy, or waiting for its disk) loses
        // the message, as Raft allows: waiting here would stop every other
        // shard's messages from this peer behind it.
        match tx.try_send(delivery) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                dropped += 1;
                if dropped.is_power_of_two() {
                    tracing::warn!(
                        peer,
                        shard = shard_id,
                        dropped,
                        "shard's inbound queue full: message dropped"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

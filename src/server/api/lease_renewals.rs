//! Keep-alives a follower forwards to a shard's leader, gathered.
//!
//! Every LeaseKeepAlive a client sends to a member that does not lead the
//! lease's shard is renewed at the leader over the peer port. One HTTP
//! request per keep-alive costs both members a request's parsing, writes and
//! wake-ups, more than the renewal itself (which the leader's shard answers
//! for a whole turn's keep-alives with one ReadIndex round). So a core
//! gathers the keep-alives bound for one leader and shard, and sends them as
//! one `POST /cairn/lease-renews` (`crate::server::member::peer_lease`):
//!
//! - one request per leader and shard is in flight from a core at a time;
//!   keep-alives arriving meanwhile wait for the next one, as writes wait for
//!   the next WAL sync, so the batch grows with the load and a lone
//!   keep-alive goes at once (after the turn that brought it);
//! - at most [`MAX_RENEWALS`] leases per request; a queue holds at most one
//!   keep-alive per stream on the core, since a stream's next keep-alive
//!   waits for the answer to its last;
//! - the answer (each lease's TTL, or that another member leads, or the
//!   failure) goes to each keep-alive of the batch, which then does what a
//!   keep-alive forwarded alone would: `peer_client::at_shard_leader` retries
//!   through leader changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::cairnpb::{LeaseRenewalTtls, LeaseRenewals};
use prost::Message as _;
use tokio::sync::oneshot;

use crate::routing::ShardId;
use crate::server::peer_client::{Forwarded, PeerClient};

/// Most leases renewed by one request to a leader.
pub const MAX_RENEWALS: usize = 1024;

/// The path a batch is posted to.
const RENEWALS_PATH: &str = "/cairn/lease-renews";

/// A keep-alive waiting for its batch's answer: its lease, and where the
/// answer (the granted TTL, `None` when the shard has no such lease) goes.
type Waiting = (i64, oneshot::Sender<Forwarded<Option<i64>>>);

/// The keep-alives waiting, by leader (peer URL) and shard.
type Queues = HashMap<(String, ShardId), Vec<Waiting>>;

/// One core's gathered keep-alives, by leader URL and shard. A queue exists
/// while a request for it is in flight or about to be sent; the task that
/// sends its batches removes it once it finds it empty. Cheap to clone.
#[derive(Clone)]
pub struct Renewals {
    peers: PeerClient,
    cluster_id: u64,
    /// How long one request to a leader may take.
    timeout: Duration,
    queues: Arc<Mutex<Queues>>,
}

impl Renewals {
    pub fn new(peers: PeerClient, cluster_id: u64, timeout: Duration) -> Renewals {
        Renewals {
            peers,
            cluster_id,
            timeout,
            queues: Arc::default(),
        }
    }

    /// Renews lease `id` at the member at `url`, which should lead `shard`:
    /// its granted TTL, `None` when the shard has no such lease.
    pub async fn renew(&self, url: &str, shard: ShardId, id: i64) -> Forwarded<Option<i64>> {
        let (tx, rx) = oneshot::channel();
        let key = (url.to_string(), shard);
        let start = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            let mut start = false;
            let queue = queues.entry(key.clone()).or_insert_with(|| {
                start = true;
                Vec::new()
            });
            queue.push((id, tx));
            start
        };
        if start {
            tokio::spawn(self.clone().send_batches(key));
        }
        rx.await.unwrap_or_else(|_| {
            Forwarded::Failed(tonic::Status::unavailable(
                "the keep-alive's forwarding task ended without an answer",
            ))
        })
    }

    /// Sends the queue's batches one after the other until it is empty.
    async fn send_batches(self, key: (String, ShardId)) {
        // The keep-alives that arrived in the same turn join the first batch.
        tokio::task::yield_now().await;
        loop {
            let batch = self.take_batch(&key);
            if batch.is_empty() {
                return;
            }
            let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
            let answer = self.post(&key.0, key.1, ids).await;
            for (i, (_, reply)) in batch.into_iter().enumerate() {
                let _ = reply.send(match &answer {
                    Forwarded::Ok(ttls) => Forwarded::Ok((ttls[i] > 0).then_some(ttls[i])),
                    Forwarded::NotLeader(leader) => Forwarded::NotLeader(*leader),
                    Forwarded::Refused(status) => Forwarded::Refused(status.clone()),
                    Forwarded::Failed(status) => Forwarded::Failed(status.clone()),
                });
            }
        }
    }

    /// The next batch of the queue at `key`; an empty one (and the queue
    /// removed) when nothing waits.
    fn take_batch(&self, key: &(String, ShardId)) -> Vec<Waiting> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queues.get_mut(key) else {
            return Vec::new();
        };
        if queue.is_empty() {
            queues.remove(key);
            return Vec::new();
        }
        let n = queue.len().min(MAX_RENEWALS);
        queue.drain(..n).collect()
    }

    /// Posts one batch: each lease's TTL (0 for none), in order.
    async fn post(&self, url: &str, shard: ShardId, ids: Vec<i64>) -> Forwarded<Vec<i64>> {
        let asked = ids.len();
        let body = Bytes::from(LeaseRenewals { ids }.encode_to_vec());
        self.peers
            .post_for_shard(
                url,
                RENEWALS_PATH,
                self.cluster_id,
                shard,
                body,
                self.timeout,
            )
            .await
            .and_decode(|b: Bytes| {
                let ttls = LeaseRenewalTtls::decode(b)
                    .map_err(|e| format!("{url}: renewals answer: {e}"))?
                    .ttls;
                if ttls.len() != asked {
                    return Err(format!(
                        "{url}: {} TTLs answered for {asked} leases",
                        ttls.len()
                    ));
                }
                Ok(ttls)
            })
    }
}

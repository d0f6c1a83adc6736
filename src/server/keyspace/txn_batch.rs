//! Txns over several shards that wait for the same holds run as one batch.
//!
//! Txns over the same shards take them one after another from the hold
//! table, each for a hop to every shard and back; under load that hold time,
//! not Raft, bounds their rate. A txn that finds another txn over the same
//! shards still waiting for them joins it, when no key it names is named by
//! a txn already in the batch: the batch takes the holds once, every txn's
//! compares are read together (each sees the keyspace just before its own
//! revision, since no other txn of the batch touches its keys), and the
//! txns take increasing revisions in the order they joined; each shard
//! proposes the batch's parts there in one entry, in that order.
//! A txn that cannot join the last batch waiting for its shards (a key in
//! common, or the batch full) leads a new batch, which waits behind it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use cairn_proto::etcdserverpb::{TxnRequest, TxnResponse};
use prost::Message as _;
use tokio::sync::oneshot;

use crate::routing::ShardId;
use crate::server::errors::ApiError;
use crate::server::key_ranges::KeyRangeSet;

/// Most txns one batch runs: bounds the hold on its shards.
pub const MAX_BATCH: usize = 64;

/// Most bytes of txns (encoded) a txn joins a batch up to. Each shard
/// proposes the batch's parts there in one Raft entry, and a part carries
/// its ops and the whole txn's plan: so an entry stays within twice this,
/// well inside a WAL record (at least 2 MiB). A leader larger than this
/// runs alone.
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

/// What a txn that joined a batch is answered.
pub type Answer = Result<TxnResponse, ApiError>;

/// The batches still waiting for their holds, by the shards they want, in
/// the order their leaders came.
#[derive(Debug, Default)]
pub struct Batches {
    open: Mutex<HashMap<Vec<ShardId>, Vec<Open>>>,
    next: std::sync::atomic::AtomicU64,
    /// Txns that joined a batch led by another.
    joined: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Open {
    id: u64,
    batch: Batch,
    /// The encoded size of its txns.
    bytes: usize,
}

/// The txns of one batch, the leader's first, in the order they came.
#[derive(Debug, Default)]
pub struct Batch {
    pub txns: Vec<TxnRequest>,
    /// Where to answer each txn after the leader's.
    pub joined: Vec<oneshot::Sender<Answer>>,
    /// Every key range the txns name.
    pub keys: Vec<(Bytes, Bytes)>,
}

/// How a txn is run.
#[derive(Debug)]
pub enum Entry {
    /// It leads a new batch: it takes the holds, then runs the batch.
    Lead(Leading),
    /// It joined a batch, whose leader answers it.
    Joined(oneshot::Receiver<Answer>),
}

/// The batch a leading txn gathers while it waits for the holds.
#[derive(Debug)]
pub struct Leading {
    batches: Arc<Batches>,
    shards: Vec<ShardId>,
    id: u64,
}

impl Batches {
    /// How many txns joined a batch led by another.
    pub fn joined(&self) -> u64 {
        self.joined.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<ShardId>, Vec<Open>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters `txn`, over `shards` (sorted) and naming `keys`: joins the
    /// last batch waiting for the same shards if it can, or leads a new
    /// one. Only the last may be joined: a txn then goes after every txn
    /// that came before it and names one of its keys.
    pub fn enter(
        self: &Arc<Self>,
        shards: &[ShardId],
        keys: Vec<(Bytes, Bytes)>,
        txn: TxnRequest,
    ) -> Entry {
        let bytes = txn.encoded_len();
        // Built before the lock, which every core's txns take.
        let mine = KeyRangeSet::new(&keys);
        let mut open = self.lock();
        let waiting = open.entry(shards.to_vec()).or_default();
        if let Some(last) = waiting.last_mut() {
            // The cheap conditions first: the key check costs the batch's
            // ranges times the log of this txn's.
            if last.batch.txns.len() < MAX_BATCH
                && last.bytes + bytes <= MAX_BATCH_BYTES
                && !mine.overlaps_any(&last.batch.keys)
            {
                let (reply, rx) = oneshot::channel();
                last.bytes += bytes;
                last.batch.keys.extend(keys);
                last.batch.txns.push(txn);
                last.batch.joined.push(reply);
                self.joined
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Entry::Joined(rx);
            }
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        waiting.push(Open {
            id,
            batch: Batch {
                txns: vec![txn],
                joined: Vec::new(),
                keys,
            },
            bytes,
        });
        Entry::Lead(Leading {
            batches: self.clone(),
            shards: shards.to_vec(),
            id,
        })
    }
}

impl Leading {
    /// Closes the batch (no txn joins it any more) and hands it over.
    pub fn close(self) -> Batch {
        self.take().unwrap_or_default()
    }

    fn take(&self) -> Option<Batch> {
        let mut open = self.batches.lock();
        let waiting = open.get_mut(&self.shards)?;
        let batch = waiting
            .iter()
            .position(|b| b.id == self.id)
            .map(|i| waiting.remove(i).batch);
        if waiting.is_empty() {
            open.remove(&self.shards);
        }
        batch
    }
}

impl Drop for Leading {
    /// A batch whose leader ended without closing it (its task failed)
    /// ends too: nothing of its joined txns was proposed, so they are
    /// answered with an error the caller retries.
    fn drop(&mut self) {
        for reply in self.take().map(|b| b.joined).unwrap_or_default() {
            let _ = reply.send(Err(ApiError::LeaderChanged));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::etcdserverpb::{request_op, PutRequest, RequestOp};

    fn put(key: &str) -> (Vec<(Bytes, Bytes)>, TxnRequest) {
        let req = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: Bytes::copy_from_slice(key.as_bytes()),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        (
            vec![(Bytes::copy_from_slice(key.as_bytes()), Bytes::new())],
            req,
        )
    }

    #[test]
    fn txns_over_the_same_shards_and_other_keys_join_the_waiting_batch() {
        let b = Arc::new(Batches::default());
        let (k1, r1) = put("a");
        let (k2, r2) = put("b");
        let (k3, r3) = put("c");
        let Entry::Lead(lead) = b.enter(&[0, 1], k1.clone(), r1.clone()) else {
            panic!("the first txn leads");
        };
        assert!(matches!(
            b.enter(&[0, 1], k2.clone(), r2.clone()),
            Entry::Joined(_)
        ));
        // Other shards: a batch of its own.
        let Entry::Lead(other) = b.enter(&[0, 2], k3, r3) else {
            panic!("a txn over other shards leads its own batch");
        };
        let batch = lead.close();
        assert_eq!(batch.joined.len(), 1);
        assert_eq!(batch.txns, vec![r1, r2.clone()]);
        assert_eq!(batch.keys, [k1, k2.clone()].concat());
        assert!(other.close().joined.is_empty());
        // Closed: the next txn leads a new batch.
        assert!(matches!(
            b.enter(&[0, 1], k2.clone(), r2.clone()),
            Entry::Lead(_)
        ));
    }

    #[test]
    fn a_txn_naming_a_key_of_the_batch_leads_the_next_and_later_txns_join_that() {
        let b = Arc::new(Batches::default());
        let (k1, r1) = put("a");
        let (k2, r2) = put("b");
        let Entry::Lead(first) = b.enter(&[0, 1], k1.clone(), r1.clone()) else {
            panic!("the first txn leads");
        };
        let prefix = vec![(Bytes::from_static(b"a"), Bytes::from_static(b"b"))];
        let Entry::Lead(second) = b.enter(&[0, 1], prefix, r1.clone()) else {
            panic!("a txn over a key of the batch leads a new one");
        };
        // "b" is named by neither "a" nor [a, b), but only the last batch is
        // joined: it goes after the txn over [a, b).
        assert!(matches!(
            b.enter(&[0, 1], k2.clone(), r2.clone()),
            Entry::Joined(_)
        ));
        assert!(first.close().joined.is_empty());
        let batch = second.close();
        assert_eq!(batch.joined.len(), 1);
        assert_eq!(batch.txns[1], r2);
        assert!(b.lock().is_empty(), "closed batches are gone");
    }

    #[test]
    fn a_batch_is_bounded_and_its_joiners_hear_when_its_leader_ends() {
        let b = Arc::new(Batches::default());
        let (k0, r0) = put("k0");
        let Entry::Lead(lead) = b.enter(&[0, 1], k0, r0) else {
            panic!("the first txn leads");
        };
        let mut waiting = Vec::new();
        for i in 1..MAX_BATCH {
            let (k, r) = put(&format!("k{i}"));
            match b.enter(&[0, 1], k, r) {
                Entry::Joined(rx) => waiting.push(rx),
                other => panic!("txn {i} of the batch: {other:?}"),
            }
        }
        let (k, r) = put("full");
        let Entry::Lead(next) = b.enter(&[0, 1], k, r) else {
            panic!("a full batch is followed by a new one");
        };
        drop(lead);
        for mut rx in waiting {
            assert_eq!(rx.try_recv().unwrap(), Err(ApiError::LeaderChanged));
        }
        assert!(next.close().joined.is_empty());
    }

    #[test]
    fn a_batch_holds_at_most_max_batch_bytes_of_txns() {
        let b = Arc::new(Batches::default());
        let big = |key: &str| {
            let (k, mut r) = put(key);
            if let Some(request_op::Request::RequestPut(p)) = &mut r.success[0].request {
                p.value = vec![0u8; MAX_BATCH_BYTES / 4].into();
            }
            (k, r)
        };
        let (k, r) = big("a");
        let Entry::Lead(lead) = b.enter(&[0, 1], k, r) else {
            panic!("the first txn leads");
        };
        let (k, r) = big("b");
        assert!(matches!(b.enter(&[0, 1], k, r), Entry::Joined(_)));
        let (k, r) = big("c");
        assert!(matches!(b.enter(&[0, 1], k, r), Entry::Joined(_)));
        // A fourth quarter, with the encoding around each, passes the bound.
        let (k, r) = big("d");
        let Entry::Lead(next) = b.enter(&[0, 1], k, r) else {
            panic!("a batch over its bytes is followed by a new one");
        };
        assert_eq!(lead.close().txns.len(), 3);
        assert_eq!(next.close().txns.len(), 1);
    }
}

//! How a txn over several shards enters a batch on the keyspace leader
//! (`src/server/keyspace/txn_batch.rs`): it joins the last batch over the same
//! shards still waiting for its holds, when no key it names is named by a
//! txn of that batch and the batch has room (fewer than
//! [`MAX_BATCH_TXNS`] txns, and its txns' encoded size within
//! [`MAX_BATCH_BYTES`] with this one); else it leads a new batch, which
//! waits behind the others for the holds. A batch closes once it holds
//! every shard.

use std::collections::BTreeSet;

use super::coordinator::{BatchTxn, RunStage, TxnRun};
use crate::sim::keyspace::kv::TxnSpec;
use crate::sim::keyspace::world::World;
use crate::sim::keyspace::{Bug, MAX_BATCH_BYTES, MAX_BATCH_TXNS};

impl World {
    /// Member `idx` runs client op `op`: joins the last open batch over
    /// the same shards or leads a new one. Returns the run.
    pub fn enter_batch(&mut self, idx: usize, op: u64, spec: TxnSpec) -> u64 {
        let shards: Vec<usize> = spec.shards().into_iter().collect();
        let incarnation = self.members[idx].incarnation;
        let keys = spec.keys();
        let bytes = spec.encoded_len();
        let last = self
            .runs
            .values()
            .filter(|r| {
                r.idx == idx
                    && r.incarnation == incarnation
                    && r.shards == shards
                    && matches!(r.stage, RunStage::Hold { .. })
            })
            .map(|r| r.run)
            .max();
        if let Some(run) = last {
            let r = &self.runs[&run];
            let disjoint = r.keys.is_disjoint(&keys) || self.bug == Bug::JoinIgnoresOverlap;
            let room = r.txns.len() < MAX_BATCH_TXNS && r.bytes + bytes <= MAX_BATCH_BYTES;
            if disjoint && room {
                let r = self.runs.get_mut(&run).expect("found");
                r.txns.push(BatchTxn { op, spec });
                r.keys.extend(keys);
                r.bytes += bytes;
                self.stats.batch_joins += 1;
                return run;
            }
            if !disjoint {
                self.stats.joins_refused_overlap += 1;
            } else {
                self.stats.joins_refused_full += 1;
            }
        }
        self.next_run += 1;
        let run = self.next_run;
        self.runs.insert(
            run,
            TxnRun {
                run,
                idx,
                incarnation,
                txns: vec![BatchTxn { op, spec }],
                keys,
                bytes,
                shards,
                stage_since_tick: self.tick,
                stage: RunStage::Hold {
                    next: 0,
                    queued: false,
                },
            },
        );
        self.stats.txn_runs += 1;
        run
    }

    /// The batch holds every shard: no txn joins it any more.
    pub(super) fn close_batch(&mut self, run: u64) {
        let Some(r) = self.runs.get(&run) else {
            return;
        };
        let n = r.txns.len() as u64;
        if n > 1 {
            for t in &r.txns {
                self.batch_of.insert(t.op, run);
            }
        }
        debug_assert!(
            self.bug == Bug::JoinIgnoresOverlap || {
                let mut seen = BTreeSet::new();
                r.txns
                    .iter()
                    .all(|t| t.spec.keys().into_iter().all(|k| seen.insert(k)))
            },
            "no two txns of a batch name one key"
        );
        self.stats.batches += 1;
        self.stats.batched_txns += n;
        self.stats.batch_max_txns = self.stats.batch_max_txns.max(n);
    }
}

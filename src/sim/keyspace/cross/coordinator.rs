//! The coordinator of a batch of txns over several shards
//! (`src/server/keyspace/cross_txn.rs`), on the keyspace leader: a run's state, and
//! its steps from holding every shard of the batch through taking each
//! txn's revision, the compares and the checks that the holds stand. How
//! a txn joins or leads a batch is in `batch.rs`; the steps after the
//! checks are in `parts.rs`.

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::SliceRandom;
use rand::Rng;

use crate::sim::keyspace::checker::Check;
use crate::sim::keyspace::kv::{shard_of, GetResult, Key, Plan, TxnSpec};
use crate::sim::keyspace::world::World;
use crate::sim::keyspace::MAX_TXN_TICKS;

/// Where a shard's entry of the batch's parts stands, at the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::sim::keyspace) enum PartState {
    Unasked,
    Proposed(u64),
    /// Each part's gets, in the entry's order.
    Applied(Vec<Vec<GetResult>>),
    Failed,
}

/// One written shard's entry: the parts of the batch's txns that write it.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) struct ShardEntry {
    /// The txns with a part here, by their place in the batch (so by
    /// revision).
    pub txns: Vec<usize>,
    /// When the batch's parts reach the shard's core, which then proposes
    /// them in one entry.
    pub due: u64,
    pub state: PartState,
}

/// The batch once each txn's branch is known.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) struct PartsStage {
    /// Each txn's revision, in join order.
    pub revs: Vec<u64>,
    pub succeeded: Vec<bool>,
    /// Each txn's plan, when it writes several shards.
    pub plans: Vec<Option<Plan>>,
    /// Each txn's gets on the shards it does not write, read at its
    /// revision less one.
    pub reads: Vec<BTreeMap<usize, Vec<GetResult>>>,
    /// Every shard some txn writes.
    pub entries: BTreeMap<usize, ShardEntry>,
}

#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) enum RunStage {
    /// Holding `shards[next]`; `queued` once it waits behind another
    /// batch. Txns may join while the batch is here.
    Hold { next: usize, queued: bool },
    /// Every shard held (the batch is closed): take each txn's revision.
    Revision,
    /// Each shard's outcomes of the compares on its keys, of every txn:
    /// `(txn, compare, outcome)`.
    Compare {
        revs: Vec<u64>,
        answered: BTreeMap<usize, Vec<(usize, usize, bool)>>,
    },
    /// Each shard some txn writes checks that its hold stands.
    Check {
        revs: Vec<u64>,
        succeeded: Vec<bool>,
        checked: BTreeSet<usize>,
    },
    /// The gets of shards a txn does not write, at its revision less one.
    ReadOnly {
        revs: Vec<u64>,
        succeeded: Vec<bool>,
    },
    /// Each written shard's entry of parts.
    Parts(Box<PartsStage>),
}

/// A client's txn in a batch.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) struct BatchTxn {
    pub op: u64,
    pub spec: TxnSpec,
}

/// One batch of txns over the same shards, run by a keyspace leader.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) struct TxnRun {
    /// Names the batch in the holds (a retry is a new run).
    pub run: u64,
    pub idx: usize,
    pub incarnation: u64,
    /// The batch's txns in join order, its leader first.
    pub txns: Vec<BatchTxn>,
    /// Every key the txns name.
    pub keys: BTreeSet<Key>,
    /// The txns' encoded size.
    pub bytes: usize,
    pub shards: Vec<usize>,
    /// When the current stage began: each ask of the real code times out
    /// on its own (`REQUEST_TIMEOUT`).
    pub stage_since_tick: u64,
    pub stage: RunStage,
}

impl TxnRun {
    /// For the trace: the run and its txns.
    pub fn name(&self) -> String {
        let ops: Vec<String> = self.txns.iter().map(|t| format!("x{}", t.op)).collect();
        format!("batch {} [{}]", self.run, ops.join(","))
    }
}

/// How a txn of a run ended, for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::sim::keyspace) enum RunEnd {
    Acked,
    /// Nothing was proposed: the client may try again.
    Retry,
    /// A part may have been proposed: etcd's "request timed out, possibly
    /// due to previous leader failure".
    Unknown,
}

impl World {
    /// Ends a run: every hold it has is released (`run`'s last loop), and
    /// each txn's client is told how it ended (`ends[k]`; answered txns
    /// were acknowledged before).
    pub(super) fn finish_run(&mut self, run: u64, ends: &[RunEnd], why: &str) -> Check {
        let Some(r) = self.runs.remove(&run) else {
            return Ok(());
        };
        let alive = self.members[r.idx].incarnation == r.incarnation && self.members[r.idx].is_up();
        if alive {
            for &s in &r.shards {
                self.cross_release(r.idx, s, run)?;
            }
        }
        self.note(|| format!("  {} ends {ends:?}: {why}", r.name()));
        for (t, &how) in r.txns.iter().zip(ends) {
            match how {
                RunEnd::Acked => {}
                RunEnd::Retry => self.stats.txn_retries += 1,
                RunEnd::Unknown => self.stats.txn_unknown += 1,
            }
            self.client_run_ended(t.op, how);
        }
        Ok(())
    }

    /// Ends a run the same way for every txn.
    pub(super) fn end_run(&mut self, run: u64, how: RunEnd, why: &str) -> Check {
        let n = self.runs.get(&run).map_or(0, |r| r.txns.len());
        self.finish_run(run, &vec![how; n], why)
    }

    /// One step of run `run`.
    pub fn step_run(&mut self, run: u64) -> Check {
        let Some(r) = self.runs.get(&run).cloned() else {
            return Ok(());
        };
        let idx = r.idx;
        let m = &self.members[idx];
        if m.incarnation != r.incarnation || !m.is_up() {
            // The coordinator died with its member: its clients hear
            // nothing, and cannot tell whether a part was proposed.
            self.runs.remove(&run);
            for t in &r.txns {
                self.client_run_ended(t.op, RunEnd::Unknown);
                self.stats.txn_unknown += 1;
            }
            return Ok(());
        }
        if m.is_paused() {
            return Ok(());
        }
        if self.tick - r.stage_since_tick > MAX_TXN_TICKS {
            self.begin_step(|| format!("{} on n{} times out", r.name(), idx + 1));
            if let RunStage::Parts(p) = &r.stage {
                return self.time_out_parts(&r, p);
            }
            self.end_run(run, RunEnd::Retry, "timed out")?;
            return self.end_step();
        }
        match r.stage.clone() {
            RunStage::Hold { next, queued } => self.step_hold(&r, next, queued),
            RunStage::Revision => self.step_revisions(&r),
            RunStage::Compare { revs, answered } => self.step_compare(&r, revs, answered),
            RunStage::Check {
                revs,
                succeeded,
                checked,
            } => self.step_check(&r, revs, succeeded, checked),
            RunStage::ReadOnly { revs, succeeded } => self.step_read_only(&r, revs, succeeded),
            RunStage::Parts(p) => self.step_parts(&r, *p),
        }
    }

    pub(super) fn set_stage(&mut self, run: u64, stage: RunStage) {
        let tick = self.tick;
        if let Some(r) = self.runs.get_mut(&run) {
            if std::mem::discriminant(&r.stage) != std::mem::discriminant(&stage) {
                r.stage_since_tick = tick;
            }
            r.stage = stage;
        }
    }

    fn step_hold(&mut self, r: &TxnRun, next: usize, queued: bool) -> Check {
        let (run, idx) = (r.run, r.idx);
        let shard = r.shards[next];
        if !self.calm && self.rng.gen_range(0..1000) < self.plan.batch_abandon_per_mille {
            // The leading txn's task ends before the batch closes (its
            // client went away): `Leading`'s drop tells every joined txn
            // to retry; nothing was proposed.
            self.begin_step(|| format!("{}: its leader ends before the holds", r.name()));
            self.stats.batches_abandoned += 1;
            let mut ends = vec![RunEnd::Retry; r.txns.len()];
            ends[0] = RunEnd::Unknown;
            self.finish_run(run, &ends, "leader gone")?;
            return self.end_step();
        }
        let advance = |w: &mut World| {
            if next + 1 == r.shards.len() {
                w.close_batch(run);
                w.set_stage(run, RunStage::Revision);
            } else {
                w.set_stage(
                    run,
                    RunStage::Hold {
                        next: next + 1,
                        queued: false,
                    },
                );
            }
        };
        if queued {
            let s = &self.members[idx].shards[shard];
            if s.holder.is_some_and(|h| h.run == run) {
                self.begin_step(|| format!("{} holds shard {shard}", r.name()));
                advance(self);
                return self.end_step();
            }
            if s.hold_waiting.contains(&run) {
                return Ok(());
            }
            self.begin_step(|| format!("{} lost its place on shard {shard}", r.name()));
            self.end_run(run, RunEnd::Retry, "hold refused")?;
            return self.end_step();
        }
        self.begin_step(|| format!("{} asks n{} to hold shard {shard}", r.name(), idx + 1));
        match self.cross_hold(idx, shard, run) {
            Ok(true) => advance(self),
            Ok(false) => {
                self.note(|| "  queued".into());
                self.set_stage(run, RunStage::Hold { next, queued: true });
            }
            Err(why) => self.end_run(run, RunEnd::Retry, why)?,
        }
        self.end_step()
    }

    /// Each txn's revision from the counter, in join order
    /// (`keyspace.next_revision()` per txn).
    fn step_revisions(&mut self, r: &TxnRun) -> Check {
        let (run, idx) = (r.run, r.idx);
        self.begin_step(|| format!("{} takes its revisions on n{}", r.name(), idx + 1));
        if let Err(why) = self.members[idx].assigns(self.guard) {
            self.end_run(run, RunEnd::Retry, &format!("{why:?}"))?;
            return self.end_step();
        }
        let revs: Vec<u64> = r
            .txns
            .iter()
            .map(|_| self.members[idx].next_revision())
            .collect();
        self.note(|| format!("  revisions {revs:?}"));
        self.set_stage(
            run,
            RunStage::Compare {
                revs,
                answered: BTreeMap::new(),
            },
        );
        self.end_step()
    }

    fn step_compare(
        &mut self,
        r: &TxnRun,
        revs: Vec<u64>,
        mut answered: BTreeMap<usize, Vec<(usize, usize, bool)>>,
    ) -> Check {
        let (run, idx) = (r.run, r.idx);
        let mut open: Vec<usize> = r
            .shards
            .iter()
            .copied()
            .filter(|s| !answered.contains_key(s))
            .collect();
        open.shuffle(&mut self.rng);
        for shard in open {
            let index = match self.holder_index(idx, shard, run) {
                Ok(i) => i,
                Err(why) => {
                    self.begin_step(|| format!("{}: shard {shard} cannot compare", r.name()));
                    self.end_run(run, RunEnd::Retry, why)?;
                    return self.end_step();
                }
            };
            let s = &self.members[idx].shards[shard];
            if s.sm.applied_index < index {
                continue;
            }
            // Every txn's compares at once, over the keyspace before the
            // batch: for each txn, that is the keyspace before its own
            // revision, since no txn of the batch names another's keys.
            let outcomes: Vec<(usize, usize, bool)> = r
                .txns
                .iter()
                .enumerate()
                .flat_map(|(k, t)| {
                    t.spec
                        .compares
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| shard_of(c.key()) == shard)
                        .map(move |(i, c)| (k, i, c))
                })
                .map(|(k, i, c)| (k, i, c.holds(s.store.latest(c.key()))))
                .collect();
            self.begin_step(|| {
                format!(
                    "{}: shard {shard} compares {outcomes:?} (applied through the hold's index {index})",
                    r.name()
                )
            });
            answered.insert(shard, outcomes);
            if answered.len() == r.shards.len() {
                let succeeded: Vec<bool> = (0..r.txns.len())
                    .map(|k| {
                        answered
                            .values()
                            .flatten()
                            .filter(|(t, _, _)| *t == k)
                            .all(|(_, _, ok)| *ok)
                    })
                    .collect();
                let n = answered.values().map(Vec::len).sum::<usize>();
                let want: usize = r.txns.iter().map(|t| t.spec.compares.len()).sum();
                assert_eq!(n, want, "each compare on one shard");
                self.set_stage(
                    run,
                    RunStage::Check {
                        revs,
                        succeeded,
                        checked: BTreeSet::new(),
                    },
                );
            } else {
                self.set_stage(run, RunStage::Compare { revs, answered });
            }
            return self.end_step();
        }
        Ok(())
    }

    fn step_check(
        &mut self,
        r: &TxnRun,
        revs: Vec<u64>,
        succeeded: Vec<bool>,
        mut checked: BTreeSet<usize>,
    ) -> Check {
        let (run, idx) = (r.run, r.idx);
        let written: BTreeSet<usize> = r
            .txns
            .iter()
            .zip(&succeeded)
            .flat_map(|(t, ok)| t.spec.written(*ok))
            .collect();
        let Some(shard) = written.iter().copied().find(|s| !checked.contains(s)) else {
            self.set_stage(run, RunStage::ReadOnly { revs, succeeded });
            return Ok(());
        };
        self.begin_step(|| format!("{}: shard {shard} checks its ops", r.name()));
        let ok = self
            .holder_index(idx, shard, run)
            .is_ok_and(|i| i <= self.members[idx].shards[shard].sm.applied_index);
        if !ok {
            self.end_run(run, RunEnd::Retry, "hold gone at check")?;
            return self.end_step();
        }
        checked.insert(shard);
        self.set_stage(
            run,
            RunStage::Check {
                revs,
                succeeded,
                checked,
            },
        );
        self.end_step()
    }
}

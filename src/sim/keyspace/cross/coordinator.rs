//! The coordinator of a txn over several shards (`src/server/cross_txn.rs`),
//! on the keyspace leader: a run's state, and its steps from holding every
//! touched shard through taking `T`, the compares and the checks that the
//! holds stand. The steps after the checks are in `parts.rs`.

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::SliceRandom;

use crate::sim::keyspace::checker::Check;
use crate::sim::keyspace::kv::{shard_of, GetResult, Plan, TxnSpec};
use crate::sim::keyspace::world::World;
use crate::sim::keyspace::MAX_TXN_TICKS;

/// Where a txn's part stands, at its coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::sim::keyspace) enum PartState {
    Unasked,
    Proposed(u64),
    Applied(Vec<GetResult>),
    Failed,
}

#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) enum RunStage {
    /// Holding `shards[next]`; `queued` once it waits behind another txn.
    Hold { next: usize, queued: bool },
    /// Every shard held: take `T`.
    Revision,
    /// Each shard's outcomes of the compares on its keys.
    Compare {
        t: u64,
        answered: BTreeMap<usize, Vec<(usize, bool)>>,
    },
    /// Each written shard checks that its hold stands.
    Check {
        t: u64,
        succeeded: bool,
        checked: BTreeSet<usize>,
    },
    /// The gets of shards not written, at `T - 1`.
    ReadOnly { t: u64, succeeded: bool },
    /// Each written shard's part.
    Parts {
        t: u64,
        succeeded: bool,
        plan: Option<Plan>,
        reads: BTreeMap<usize, Vec<GetResult>>,
        parts: BTreeMap<usize, PartState>,
        /// When each part's proposal reaches its shard's core.
        due: BTreeMap<usize, u64>,
    },
}

/// One txn over several shards, run by a keyspace leader for a client.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) struct TxnRun {
    /// Names the run in the holds (a retry is a new run).
    pub run: u64,
    /// The client's op.
    pub op: u64,
    pub idx: usize,
    pub incarnation: u64,
    pub spec: TxnSpec,
    pub shards: Vec<usize>,
    /// When the current stage began: each ask of the real code times out
    /// on its own (`REQUEST_TIMEOUT`).
    pub stage_since_tick: u64,
    pub stage: RunStage,
}

/// How a run ended, for its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::sim::keyspace) enum RunEnd {
    Acked,
    /// Nothing was proposed: the client may try again.
    Retry,
    /// A part may have been proposed: etcd's "request timed out, possibly
    /// due to previous leader failure".
    Unknown,
}

impl World {
    /// Starts a txn over several shards on member `idx` for client op `op`.
    pub fn start_run(&mut self, idx: usize, op: u64, spec: TxnSpec) -> u64 {
        self.next_run += 1;
        let run = self.next_run;
        let shards: Vec<usize> = spec.shards().into_iter().collect();
        let incarnation = self.members[idx].incarnation;
        self.runs.insert(
            run,
            TxnRun {
                run,
                op,
                idx,
                incarnation,
                spec,
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

    /// Ends a run: every hold it has is released (`run`'s last loop), and
    /// its client is told.
    pub(super) fn end_run(&mut self, run: u64, how: RunEnd, why: &str) -> Check {
        let Some(r) = self.runs.remove(&run) else {
            return Ok(());
        };
        let alive = self.members[r.idx].incarnation == r.incarnation && self.members[r.idx].is_up();
        if alive {
            for &s in &r.shards {
                self.cross_release(r.idx, s, run)?;
            }
        }
        self.note(|| format!("  txn x{} (run {run}) ends {how:?}: {why}", r.op));
        match how {
            RunEnd::Acked => {}
            RunEnd::Retry => self.stats.txn_retries += 1,
            RunEnd::Unknown => self.stats.txn_unknown += 1,
        }
        self.client_run_ended(r.op, how);
        Ok(())
    }

    /// One step of run `run`.
    pub fn step_run(&mut self, run: u64) -> Check {
        let Some(r) = self.runs.get(&run).cloned() else {
            return Ok(());
        };
        let idx = r.idx;
        let m = &self.members[idx];
        if m.incarnation != r.incarnation || !m.is_up() {
            // The coordinator died with its member: its client hears
            // nothing, and cannot tell whether a part was proposed.
            self.runs.remove(&run);
            self.client_run_ended(r.op, RunEnd::Unknown);
            self.stats.txn_unknown += 1;
            return Ok(());
        }
        if m.is_paused() {
            return Ok(());
        }
        if self.tick - r.stage_since_tick > MAX_TXN_TICKS {
            self.begin_step(|| format!("txn x{} (run {run}) on n{} times out", r.op, idx + 1));
            let how = if let RunStage::Parts {
                t,
                succeeded,
                plan,
                parts,
                ..
            } = &r.stage
            {
                // The proposals were sent when the stage began: each core
                // takes its part before the release that follows it.
                for (shard, p) in parts {
                    if *p == PartState::Unasked {
                        self.propose_part(&r, *t, *succeeded, plan, *shard)?;
                    }
                }
                RunEnd::Unknown
            } else {
                RunEnd::Retry
            };
            self.end_run(run, how, "timed out")?;
            return self.end_step();
        }
        match r.stage.clone() {
            RunStage::Hold { next, queued } => self.step_hold(&r, next, queued),
            RunStage::Revision => {
                self.begin_step(|| format!("txn x{} (run {run}) takes T on n{}", r.op, idx + 1));
                if let Err(why) = self.members[idx].assigns(self.guard) {
                    self.end_run(run, RunEnd::Retry, &format!("{why:?}"))?;
                    return self.end_step();
                }
                let t = self.members[idx].next_revision();
                self.note(|| format!("  T = {t}"));
                self.set_stage(
                    run,
                    RunStage::Compare {
                        t,
                        answered: BTreeMap::new(),
                    },
                );
                self.end_step()
            }
            RunStage::Compare { t, answered } => self.step_compare(&r, t, answered),
            RunStage::Check {
                t,
                succeeded,
                checked,
            } => self.step_check(&r, t, succeeded, checked),
            RunStage::ReadOnly { t, succeeded } => self.step_read_only(&r, t, succeeded),
            RunStage::Parts {
                t,
                succeeded,
                plan,
                reads,
                parts,
                due,
            } => self.step_parts(&r, t, succeeded, plan, reads, parts, due),
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
        let advance = |w: &mut World| {
            let stage = if next + 1 == r.shards.len() {
                RunStage::Revision
            } else {
                RunStage::Hold {
                    next: next + 1,
                    queued: false,
                }
            };
            w.set_stage(run, stage);
        };
        if queued {
            let s = &self.members[idx].shards[shard];
            if s.holder.is_some_and(|h| h.run == run) {
                self.begin_step(|| format!("txn x{} (run {run}) holds shard {shard}", r.op));
                advance(self);
                return self.end_step();
            }
            if s.hold_waiting.contains(&run) {
                return Ok(());
            }
            self.begin_step(|| {
                format!("txn x{} (run {run}) lost its place on shard {shard}", r.op)
            });
            self.end_run(run, RunEnd::Retry, "hold refused")?;
            return self.end_step();
        }
        self.begin_step(|| {
            format!(
                "txn x{} (run {run}) asks n{} to hold shard {shard}",
                r.op,
                idx + 1
            )
        });
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

    fn step_compare(
        &mut self,
        r: &TxnRun,
        t: u64,
        mut answered: BTreeMap<usize, Vec<(usize, bool)>>,
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
                    self.begin_step(|| {
                        format!("txn x{} (run {run}): shard {shard} cannot compare", r.op)
                    });
                    self.end_run(run, RunEnd::Retry, why)?;
                    return self.end_step();
                }
            };
            let s = &self.members[idx].shards[shard];
            if s.sm.applied_index < index {
                continue;
            }
            let outcomes: Vec<(usize, bool)> = r
                .spec
                .compares
                .iter()
                .enumerate()
                .filter(|(_, c)| shard_of(c.key()) == shard)
                .map(|(i, c)| (i, c.holds(s.store.latest(c.key()))))
                .collect();
            self.begin_step(|| {
                format!(
                    "txn x{} (run {run}): shard {shard} compares {outcomes:?} (applied through the hold's index {index})",
                    r.op
                )
            });
            answered.insert(shard, outcomes);
            if answered.len() == r.shards.len() {
                let succeeded = answered.values().flatten().all(|(_, ok)| *ok);
                let n = answered.values().map(Vec::len).sum::<usize>();
                assert_eq!(n, r.spec.compares.len(), "each compare on one shard");
                self.set_stage(
                    run,
                    RunStage::Check {
                        t,
                        succeeded,
                        checked: BTreeSet::new(),
                    },
                );
            } else {
                self.set_stage(run, RunStage::Compare { t, answered });
            }
            return self.end_step();
        }
        Ok(())
    }

    fn step_check(
        &mut self,
        r: &TxnRun,
        t: u64,
        succeeded: bool,
        mut checked: BTreeSet<usize>,
    ) -> Check {
        let (run, idx) = (r.run, r.idx);
        let written = r.spec.written(succeeded);
        let Some(shard) = written.iter().copied().find(|s| !checked.contains(s)) else {
            self.set_stage(run, RunStage::ReadOnly { t, succeeded });
            return Ok(());
        };
        self.begin_step(|| format!("txn x{} (run {run}): shard {shard} checks its ops", r.op));
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
                t,
                succeeded,
                checked,
            },
        );
        self.end_step()
    }
}

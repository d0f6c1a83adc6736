//! Txns over several shards, modelled on `src/server/cross_txn.rs` (the
//! coordinator and `finish_earlier`) and `src/server/shard/cross.rs` (the
//! shard's side), step for step where the simulator allows.
//!
//! Each call the real code makes from one core to another (hold, compare,
//! check, propose, release, records, forget) is one step here, taken when
//! the run's actor is picked among the tick's events, so that messages,
//! disk writes, crashes and other txns interleave with it as they would
//! with the real calls. A call the real code answers later (a compare once
//! the entries from before the hold are applied, a part once applied) is
//! answered at the first step after the condition holds.
//!
//! # The coordinator ([`TxnRun`]), on the keyspace leader
//! 1. Hold every touched shard in shard order (`cross_hold`: the shard must
//!    be led here with its no-op applied, and the counter open; a held
//!    shard queues the txn). The holder remembers the shard's last index.
//! 2. Take `T` from the counter.
//! 3. Each shard answers the compares on its keys once it has applied
//!    through the holder's index; a compare's key lives on one shard.
//! 4. Each written shard checks its hold still stands.
//! 5. Gets on shards the chosen branch does not write are read at `T - 1`;
//!    with no written shard the txn is answered there. Else the shards not
//!    written are released, and each written shard proposes its part at
//!    `T`, with the whole plan when more than one is written; proposing
//!    (or failing to) releases the shard.
//! 6. Once every part is applied here, the written shards are told to
//!    forget the record and the client is answered. A part that failed, or
//!    a timeout after a part was proposed, answers "unknown" (etcd's
//!    timeout); before that, the client may retry.
//!
//! # The opening ([`Opening`]), on every member whose shards all became ready
//! The counter stays closed until `finish_earlier` has run: each shard is
//! asked for its records (`cross_records`: first the fence, which ends
//! every hold; then the answer waits until the log's last index is
//! applied, and carries the records and the store's revision); every part
//! of each record whose shard has not reached `T` is proposed at `T` and
//! awaited, then each record is forgotten; then the counter opens at the
//! largest of what it handed out, the shards' revisions at readiness and
//! the epoch's start. A failure starts the finishing again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::seq::SliceRandom;
use rand::Rng;

use super::checker::{Answer, Check, TxnAnswer};
use super::kv::{shard_of, Compare, GetResult, Op, Payload, Plan, ReqTag, TxnSpec};
use super::member::{epoch_start, Holder};
use super::world::World;
use super::{Bug, MAX_TXN_TICKS};

/// Where a txn's part stands, at its coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PartState {
    Unasked,
    Proposed(u64),
    Applied(Vec<GetResult>),
    Failed,
}

#[derive(Debug, Clone)]
pub(super) enum RunStage {
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
pub(super) struct TxnRun {
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
pub(super) enum RunEnd {
    Acked,
    /// Nothing was proposed: the client may try again.
    Retry,
    /// A part may have been proposed: etcd's "request timed out, possibly
    /// due to previous leader failure".
    Unknown,
}

/// One shard's answer to an opening's ask for records.
#[derive(Debug, Clone)]
pub(super) enum RecordsAsk {
    Unasked,
    /// Fenced; waiting for the log's last index (then) to be applied.
    Waiting {
        index: u64,
    },
    Answered {
        rev: u64,
        records: BTreeMap<u64, Plan>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FinishAction {
    Part { shard: usize, rev: u64, plan: Plan },
    Forget { shard: usize, rev: u64 },
}

#[derive(Debug, Clone)]
pub(super) enum OpeningStage {
    Records(Vec<RecordsAsk>),
    Finish {
        actions: VecDeque<FinishAction>,
        /// The request awaited, and when it was proposed.
        waiting: Option<(u64, u64)>,
    },
}

/// The counter's opening on a member, waiting for `finish_earlier`.
#[derive(Debug, Clone)]
pub(super) struct Opening {
    pub gen: u64,
    pub epoch: u64,
    pub base: u64,
    pub stage: OpeningStage,
}

impl Opening {
    pub fn new(gen: u64, epoch: u64, base: u64, shards: usize) -> Self {
        Opening {
            gen,
            epoch,
            base,
            stage: OpeningStage::Records(vec![RecordsAsk::Unasked; shards]),
        }
    }
}

/// Why a shard refused a call of a txn or an opening.
type Refused = &'static str;

impl World {
    // ---- the shard's side (`src/server/shard/cross.rs`) ---------------------

    /// `cross_led`: this member leads the shard and has applied its no-op
    /// (the shard's `cross.ready`).
    fn cross_led(&self, idx: usize, shard: usize) -> Result<(), Refused> {
        let m = &self.members[idx];
        let s = &m.shards[shard];
        let Some(n) = s.node.as_ref() else {
            return Err("down");
        };
        if n.leader_id() != m.id {
            return Err("not leader");
        }
        if s.ready_term != Some(n.term()) {
            return Err("no-op not applied");
        }
        Ok(())
    }

    /// `cross_hold`: Ok(true) held, Ok(false) queued.
    fn cross_hold(&mut self, idx: usize, shard: usize, run: u64) -> Result<bool, Refused> {
        self.cross_led(idx, shard)?;
        if self.members[idx].assigns(self.guard).is_err() {
            return Err("counter closed");
        }
        let s = &mut self.members[idx].shards[shard];
        if s.holder.is_some() {
            s.hold_waiting.push_back(run);
            return Ok(false);
        }
        let index = s.node.as_ref().expect("led").last_index();
        s.holder = Some(Holder { run, index });
        Ok(true)
    }

    /// The holder's index if `run` holds the shard.
    fn holder_index(&self, idx: usize, shard: usize, run: u64) -> Result<u64, Refused> {
        match self.members[idx].shards[shard].holder {
            Some(h) if h.run == run => Ok(h.index),
            _ => Err("hold gone"),
        }
    }

    /// `cross_release`: ends `run`'s hold, asks the waiting read points
    /// again and hands the hold to the next txn waiting; or takes `run`
    /// out of the queue.
    pub fn cross_release(&mut self, idx: usize, shard: usize, run: u64) -> Check {
        let s = &mut self.members[idx].shards[shard];
        if s.holder.is_some_and(|h| h.run == run) {
            s.holder = None;
            let points = std::mem::take(&mut s.points_waiting);
            for ask in points {
                self.shard_read_point(idx, shard, ask)?;
            }
            if let Some(next) = self.members[idx].shards[shard].hold_waiting.pop_front() {
                // As the real code: a refusal answers that txn only; the
                // ones queued behind it stay queued.
                let _ = self.cross_hold(idx, shard, next);
            }
        } else {
            s.hold_waiting.retain(|r| *r != run);
        }
        Ok(())
    }

    /// `end_holds`: every hold and wait ends (the waiting txns see their
    /// hold gone), and the waiting read points are asked again.
    pub fn end_holds(&mut self, idx: usize, shard: usize) -> Check {
        let s = &mut self.members[idx].shards[shard];
        s.holder = None;
        s.hold_waiting.clear();
        let points = std::mem::take(&mut s.points_waiting);
        for ask in points {
            self.shard_read_point(idx, shard, ask)?;
        }
        Ok(())
    }

    /// Proposes `payload` on the shard of member `idx`; false when Raft
    /// refuses it.
    pub fn propose_payload(&mut self, idx: usize, shard: usize, payload: &Payload) -> bool {
        let res = self.members[idx].shards[shard]
            .node
            .as_mut()
            .map(|n| n.propose(payload.encode()));
        match res {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                self.note(|| format!("  n{} s{shard} refused {payload:?}: {e}", idx + 1));
                false
            }
            None => false,
        }
    }

    fn tag(&mut self, idx: usize) -> ReqTag {
        let m = &mut self.members[idx];
        let seq = m.next_req();
        ReqTag {
            member: m.id,
            incarnation: m.incarnation,
            seq,
        }
    }

    // ---- the coordinator (`src/server/cross_txn.rs`) ------------------------

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
    fn end_run(&mut self, run: u64, how: RunEnd, why: &str) -> Check {
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

    fn set_stage(&mut self, run: u64, stage: RunStage) {
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

    fn step_read_only(&mut self, r: &TxnRun, t: u64, succeeded: bool) -> Check {
        let (run, idx) = (r.run, r.idx);
        let written = r.spec.written(succeeded);
        self.begin_step(|| {
            format!(
                "txn x{} (run {run}) at T {t}: {} branch, writes shards {written:?}",
                r.op,
                if succeeded { "success" } else { "failure" }
            )
        });
        // Ranges of shards the txn does not write: at T - 1, off whatever
        // the shard has applied (the real code reads with index 0).
        let mut reads: BTreeMap<usize, Vec<GetResult>> = BTreeMap::new();
        for op in r.spec.branch(succeeded) {
            let s = shard_of(op.key());
            if let Op::Get(k) = op {
                if !written.contains(&s) {
                    let v = self.members[idx].shards[s].store.get_at(*k, t - 1);
                    reads.entry(s).or_default().push(v);
                }
            }
        }
        if written.is_empty() {
            let answer = self.txn_answer(r, t, succeeded, &reads, &BTreeMap::new());
            self.ack_txn(r.op, answer)?;
            self.end_run(run, RunEnd::Acked, "read only")?;
            return self.end_step();
        }
        for &s in r.shards.iter().filter(|s| !written.contains(s)) {
            self.cross_release(idx, s, run)?;
        }
        let by_shard = r.spec.ops_by_shard(succeeded);
        let plan = (written.len() > 1).then(|| Plan {
            id: r.op,
            parts: written.iter().map(|s| (*s, by_shard[s].clone())).collect(),
        });
        let max_delay = self.plan.max_part_delay_ticks;
        let due = written
            .iter()
            .map(|s| (*s, self.tick + self.rng.gen_range(0..=max_delay)))
            .collect();
        self.set_stage(
            run,
            RunStage::Parts {
                t,
                succeeded,
                plan,
                reads,
                parts: written.iter().map(|s| (*s, PartState::Unasked)).collect(),
                due,
            },
        );
        self.end_step()
    }

    #[allow(clippy::too_many_arguments)]
    fn step_parts(
        &mut self,
        r: &TxnRun,
        t: u64,
        succeeded: bool,
        plan: Option<Plan>,
        reads: BTreeMap<usize, Vec<GetResult>>,
        mut parts: BTreeMap<usize, PartState>,
        due: BTreeMap<usize, u64>,
    ) -> Check {
        let (run, idx) = (r.run, r.idx);
        let mut unasked: Vec<usize> = parts
            .iter()
            .filter(|(s, p)| **p == PartState::Unasked && due[s] <= self.tick)
            .map(|(s, _)| *s)
            .collect();
        if let Some(&shard) = unasked.choose(&mut self.rng) {
            unasked.clear();
            self.begin_step(|| {
                format!(
                    "txn x{} (run {run}): shard {shard} proposes its part at {t}",
                    r.op
                )
            });
            let state = self.propose_part(r, t, succeeded, &plan, shard)?;
            let waiting = parts
                .iter()
                .any(|(s, p)| *s != shard && *p == PartState::Unasked);
            parts.insert(shard, state);
            self.set_stage(
                run,
                RunStage::Parts {
                    t,
                    succeeded,
                    plan,
                    reads,
                    parts,
                    due,
                },
            );
            self.end_step()?;
            if waiting && self.rng.gen_range(0..1000) < self.plan.txn_transfer_per_mille {
                self.transfer_under_txn(run)?;
            }
            return Ok(());
        }
        if parts.values().any(|p| *p == PartState::Unasked) {
            return Ok(());
        }
        // Every part asked: wait for each to be applied here.
        let mut changed = false;
        for p in parts.values_mut() {
            if let PartState::Proposed(seq) = *p {
                if let Some(res) = self.members[idx].answers.remove(&seq) {
                    *p = PartState::Applied(res);
                    changed = true;
                }
            }
        }
        let pending = parts.values().any(|p| matches!(p, PartState::Proposed(_)));
        if pending {
            if changed {
                self.set_stage(
                    run,
                    RunStage::Parts {
                        t,
                        succeeded,
                        plan,
                        reads,
                        parts,
                        due,
                    },
                );
            }
            return Ok(());
        }
        self.begin_step(|| format!("txn x{} (run {run}): every part answered", r.op));
        if parts.values().any(|p| *p == PartState::Failed) {
            self.end_run(run, RunEnd::Unknown, "a part failed")?;
            return self.end_step();
        }
        let results: BTreeMap<usize, Vec<GetResult>> = parts
            .into_iter()
            .map(|(s, p)| match p {
                PartState::Applied(res) => (s, res),
                _ => unreachable!("every part applied"),
            })
            .collect();
        if plan.is_some() {
            for &s in results.keys() {
                // `CrossForget`, told without waiting for its answer.
                if self.cross_led(idx, s).is_ok() {
                    let by = self.tag(idx);
                    self.propose_payload(idx, s, &Payload::Done { rev: t, by });
                    self.pump(idx, s)?;
                }
            }
        }
        let answer = self.txn_answer(r, t, succeeded, &reads, &results);
        self.ack_txn(r.op, answer)?;
        self.end_run(run, RunEnd::Acked, "every part applied")?;
        self.end_step()
    }

    /// `cross_propose` of `r`'s part on `shard`.
    fn propose_part(
        &mut self,
        r: &TxnRun,
        t: u64,
        succeeded: bool,
        plan: &Option<Plan>,
        shard: usize,
    ) -> Result<PartState, super::checker::Found> {
        let (run, idx) = (r.run, r.idx);
        if let Err(why) = self.holder_index(idx, shard, run) {
            self.note(|| format!("  shard {shard} refuses the part: {why}"));
            return Ok(PartState::Failed);
        }
        let by = self.tag(idx);
        let ops = r.spec.ops_by_shard(succeeded)[&shard].clone();
        let payload = Payload::Part {
            id: r.op,
            rev: t,
            by,
            shard,
            ops,
            plan: plan.clone(),
        };
        let ok = self.propose_payload(idx, shard, &payload);
        // Proposed or refused, the shard lets go (`cross_propose`).
        let tick = self.tick;
        self.members[idx].shards[shard].proposed_revision(t, tick);
        self.cross_release(idx, shard, run)?;
        if !ok && self.protocol.reopens_on_part_failure() {
            // The fix: the shard is not ready until an opening has finished
            // what this txn may have left half-proposed.
            self.note(|| format!("  shard {shard} not ready until the next opening's finishing"));
            let m = &mut self.members[idx];
            m.shards[shard].ready_term = None;
            m.open = false;
            m.opening = None;
            self.end_holds(idx, shard)?;
        }
        self.pump(idx, shard)?;
        Ok(if ok {
            self.stats.parts_proposed += 1;
            PartState::Proposed(by.seq)
        } else {
            PartState::Failed
        })
    }

    /// The client's answer: each get of the chosen branch, from its shard's
    /// part if written, else from the read at `T - 1`.
    fn txn_answer(
        &self,
        r: &TxnRun,
        t: u64,
        succeeded: bool,
        reads: &BTreeMap<usize, Vec<GetResult>>,
        parts: &BTreeMap<usize, Vec<GetResult>>,
    ) -> TxnAnswer {
        let mut at: BTreeMap<usize, usize> = BTreeMap::new();
        let mut gets = Vec::new();
        for op in r.spec.branch(succeeded) {
            if let Op::Get(k) = op {
                let s = shard_of(*k);
                let i = at.entry(s).or_default();
                let v = parts
                    .get(&s)
                    .or_else(|| reads.get(&s))
                    .and_then(|v| v.get(*i))
                    .copied()
                    .expect("every get answered");
                *i += 1;
                gets.push((*k, v));
            }
        }
        TxnAnswer {
            rev: t,
            wrote: !parts.is_empty(),
            succeeded,
            gets,
        }
    }

    fn ack_txn(&mut self, op: u64, answer: TxnAnswer) -> Check {
        let step = self.stats.steps;
        self.note(|| format!("  acknowledges txn x{op}: {answer:?}"));
        if self.checker.acked(op, step, Answer::Txn(answer))? {
            self.stats.txns_acked += 1;
        }
        Ok(())
    }

    // ---- readiness and the opening -----------------------------------------

    /// Follows each shard's readiness on member `idx` (`Keyspace::
    /// shard_ready` / `shard_not_ready`, `cross_role_changed`): a shard that
    /// stops being ready closes the counter and ends its holds; once every
    /// shard is ready, an opening starts.
    pub fn track_readiness(&mut self, idx: usize) -> Check {
        if !self.members[idx].is_up() {
            return Ok(());
        }
        for shard in 0..self.shard_count {
            let s = &self.members[idx].shards[shard];
            let now = s.ready_now();
            if now == s.ready_term {
                continue;
            }
            let was = s.ready_term;
            self.members[idx].shards[shard].ready_term = now;
            if was.is_some() {
                let m = &mut self.members[idx];
                if m.open || m.opening.is_some() {
                    let id = m.id;
                    self.note(|| format!("  n{id}: shard {shard} not ready, the counter closes"));
                }
                let m = &mut self.members[idx];
                m.open = false;
                m.opening = None;
                self.end_holds(idx, shard)?;
            }
        }
        let m = &mut self.members[idx];
        let all: Option<Vec<u64>> = m.shards.iter().map(|s| s.ready_term).collect();
        if let Some(terms) = all {
            if !m.open && m.opening.is_none() {
                m.ready_gen += 1;
                let base = m.shards.iter().map(|s| s.store.rev).max().unwrap_or(0);
                let (id, gen) = (m.id, m.ready_gen);
                m.opening = Some(Opening::new(gen, terms[0], base, m.shards.len()));
                self.note(|| {
                    format!("  n{id}: every shard ready (epoch {}); opening {gen} waits for the finishing", terms[0])
                });
            }
        }
        Ok(())
    }

    /// Whether the txn holding `shard` on `idx` has proposed a part
    /// elsewhere: the case the fence is for.
    fn half_proposed_holder(&self, idx: usize, shard: usize) -> bool {
        let Some(h) = self.members[idx].shards[shard].holder else {
            return false;
        };
        self.runs.get(&h.run).is_some_and(|r| {
            matches!(&r.stage, RunStage::Parts { parts, .. }
                if parts.values().any(|p| matches!(p, PartState::Proposed(_) | PartState::Applied(_))))
        })
    }

    /// Restarts the finishing of member `idx`'s opening (an error, after
    /// which `finish_at_every_opening` tries again).
    fn opening_failed(&mut self, idx: usize, why: &str) {
        let shards = self.shard_count;
        let id = self.members[idx].id;
        if let Some(o) = self.members[idx].opening.as_mut() {
            o.stage = OpeningStage::Records(vec![RecordsAsk::Unasked; shards]);
        }
        self.stats.finish_retries += 1;
        self.note(|| format!("  n{id}: finishing fails ({why}); tries again"));
    }

    /// One step of member `idx`'s opening.
    pub fn step_opening(&mut self, idx: usize) -> Check {
        let m = &self.members[idx];
        if !m.is_running() {
            return Ok(());
        }
        let Some(o) = m.opening.clone() else {
            return Ok(());
        };
        let id = m.id;
        match o.stage {
            OpeningStage::Records(mut asks) => {
                let mut order: Vec<usize> = (0..asks.len()).collect();
                order.shuffle(&mut self.rng);
                for shard in order {
                    match asks[shard] {
                        RecordsAsk::Unasked => {
                            self.begin_step(|| format!("n{id} asks shard {shard} for its records"));
                            if let Err(why) = self.cross_led(idx, shard) {
                                self.opening_failed(idx, why);
                                return self.end_step();
                            }
                            if self.half_proposed_holder(idx, shard) {
                                self.stats.fences_under_half_txn += 1;
                            }
                            if self.bug != Bug::NoFence {
                                self.end_holds(idx, shard)?;
                            }
                            let index = self.members[idx].shards[shard]
                                .node
                                .as_ref()
                                .expect("led")
                                .last_index();
                            asks[shard] = RecordsAsk::Waiting { index };
                        }
                        RecordsAsk::Waiting { index } => {
                            let s = &self.members[idx].shards[shard];
                            if s.sm.applied_index < index {
                                continue;
                            }
                            self.begin_step(|| format!("n{id}: shard {shard} answers its records"));
                            if let Err(why) = self.cross_led(idx, shard) {
                                self.opening_failed(idx, why);
                                return self.end_step();
                            }
                            let s = &self.members[idx].shards[shard];
                            asks[shard] = RecordsAsk::Answered {
                                rev: s.store.rev,
                                records: s.store.records.clone(),
                            };
                        }
                        RecordsAsk::Answered { .. } => continue,
                    }
                    let all = asks
                        .iter()
                        .all(|a| matches!(a, RecordsAsk::Answered { .. }));
                    let stage = if all {
                        let actions = self.finish_actions(&asks);
                        self.note(|| format!("  finishing: {actions:?}"));
                        OpeningStage::Finish {
                            actions,
                            waiting: None,
                        }
                    } else {
                        OpeningStage::Records(asks)
                    };
                    if let Some(o) = self.members[idx].opening.as_mut() {
                        o.stage = stage;
                    }
                    return self.end_step();
                }
                Ok(())
            }
            OpeningStage::Finish {
                mut actions,
                waiting,
            } => {
                if let Some((seq, since)) = waiting {
                    if self.members[idx].answers.remove(&seq).is_none() {
                        if self.tick - since > MAX_TXN_TICKS {
                            self.begin_step(|| format!("n{id}: a finishing request timed out"));
                            self.opening_failed(idx, "timed out");
                            return self.end_step();
                        }
                        return Ok(());
                    }
                    actions.pop_front();
                }
                let Some(action) = actions.front().cloned() else {
                    self.begin_step(|| format!("n{id}: finishing done"));
                    self.finished(idx, o.gen);
                    return self.end_step();
                };
                self.begin_step(|| format!("n{id} finishing: {action:?}"));
                let shard = match &action {
                    FinishAction::Part { shard, .. } | FinishAction::Forget { shard, .. } => *shard,
                };
                if let Err(why) = self.cross_led(idx, shard) {
                    self.opening_failed(idx, why);
                    return self.end_step();
                }
                let payload = match action {
                    FinishAction::Part { shard, rev, plan } => {
                        if self.members[idx].shards[shard].store.rev >= rev {
                            // Answered at once: the part is there.
                            actions.pop_front();
                            if let Some(o) = self.members[idx].opening.as_mut() {
                                o.stage = OpeningStage::Finish {
                                    actions,
                                    waiting: None,
                                };
                            }
                            return self.end_step();
                        }
                        let ops = plan
                            .ops_of(shard)
                            .expect("the plan names the shard")
                            .to_vec();
                        Payload::Part {
                            id: plan.id,
                            rev,
                            by: self.tag(idx),
                            shard,
                            ops,
                            plan: Some(plan),
                        }
                    }
                    FinishAction::Forget { rev, .. } => Payload::Done {
                        rev,
                        by: self.tag(idx),
                    },
                };
                let seq = match &payload {
                    Payload::Part { by, .. } | Payload::Done { by, .. } => by.seq,
                    _ => unreachable!(),
                };
                if !self.propose_payload(idx, shard, &payload) {
                    self.opening_failed(idx, "proposal refused");
                    return self.end_step();
                }
                if matches!(payload, Payload::Part { .. }) {
                    self.stats.parts_finished += 1;
                }
                self.pump(idx, shard)?;
                let tick = self.tick;
                if let Some(o) = self.members[idx].opening.as_mut() {
                    o.stage = OpeningStage::Finish {
                        actions,
                        waiting: Some((seq, tick)),
                    };
                }
                self.end_step()
            }
        }
    }

    /// `finish_earlier`'s plan: for each record, by revision, every part
    /// whose shard has not reached it; then forget the record everywhere it
    /// is or will be.
    fn finish_actions(&self, asks: &[RecordsAsk]) -> VecDeque<FinishAction> {
        let mut actions = VecDeque::new();
        if self.bug == Bug::SkipFinish {
            return actions;
        }
        let mut reached = Vec::new();
        let mut plans: BTreeMap<u64, (Plan, BTreeSet<usize>)> = BTreeMap::new();
        for (s, a) in asks.iter().enumerate() {
            let RecordsAsk::Answered { rev, records } = a else {
                unreachable!("every shard answered");
            };
            reached.push(*rev);
            for (t, plan) in records {
                plans
                    .entry(*t)
                    .or_insert_with(|| (plan.clone(), BTreeSet::new()))
                    .1
                    .insert(s);
            }
        }
        for (rev, (plan, mut holders)) in plans {
            for (shard, _) in &plan.parts {
                if reached.get(*shard).is_none_or(|r| *r >= rev) {
                    continue;
                }
                actions.push_back(FinishAction::Part {
                    shard: *shard,
                    rev,
                    plan: plan.clone(),
                });
                holders.insert(*shard);
            }
            for shard in holders {
                actions.push_back(FinishAction::Forget { shard, rev });
            }
        }
        actions
    }

    /// `Keyspace::finished`: opens the counter, unless the opening is stale.
    fn finished(&mut self, idx: usize, gen: u64) {
        let m = &mut self.members[idx];
        let Some(o) = m.opening.as_ref().filter(|o| o.gen == gen) else {
            return;
        };
        let base = o.base.max(epoch_start(o.epoch));
        m.counter = m.counter.max(base);
        m.open = true;
        m.opened += 1;
        m.opening = None;
        let (id, counter) = (m.id, m.counter);
        self.stats.openings += 1;
        self.note(|| format!("  n{id} opens its counter at {counter}"));
    }
}

/// A txn over 2 to 4 of `shards` shards, with compares that hold about
/// half the time: their targets are read off `peek` (some member's state),
/// as a client that read before would write them.
pub(super) fn draw_txn(
    rng: &mut impl Rng,
    shards: usize,
    peek: impl Fn(super::kv::Key) -> GetResult,
) -> TxnSpec {
    let k = rng.gen_range(2..=shards.min(4));
    let mut chosen: Vec<usize> = (0..shards).collect();
    chosen.shuffle(rng);
    chosen.truncate(k);
    let key = |rng: &mut dyn rand::RngCore, chosen: &[usize]| {
        let s = chosen[rng.gen_range(0..chosen.len())];
        (s * super::kv::KEYS_PER_SHARD + rng.gen_range(0..super::kv::KEYS_PER_SHARD)) as u32
    };
    let compares = (0..rng.gen_range(1..=2))
        .map(|_| {
            let k = key(rng, &chosen);
            let now = peek(k);
            let right = rng.gen_bool(0.7);
            if rng.gen_bool(0.5) {
                let v = if right {
                    now.map_or(0, |x| x.version)
                } else {
                    rng.gen_range(0..3)
                };
                Compare::Version(k, v)
            } else {
                let v = if right { now.map(|x| x.value) } else { None };
                Compare::Value(k, v)
            }
        })
        .collect();
    let ops = |rng: &mut dyn rand::RngCore, n: usize| -> Vec<Op> {
        (0..n)
            .map(|_| {
                let k = key(rng, &chosen);
                match rng.gen_range(0..20) {
                    0..=9 => Op::Put(k),
                    10..=12 => Op::Del(k),
                    _ => Op::Get(k),
                }
            })
            .collect()
    };
    let mut spec = TxnSpec {
        compares,
        success: {
            let n = rng.gen_range(1..=4);
            ops(rng, n)
        },
        failure: {
            let n = rng.gen_range(0..=3);
            ops(rng, n)
        },
    };
    // Over several shards; and most of the time writing more than one
    // on success, so that there is a plan to keep.
    let want_written = if rng.gen_bool(0.7) { 2 } else { 1 };
    for s in chosen {
        if spec.shards().len() >= 2 && spec.written(true).len() >= want_written {
            break;
        }
        if !spec.written(true).contains(&s) {
            let k = (s * super::kv::KEYS_PER_SHARD + rng.gen_range(0..super::kv::KEYS_PER_SHARD))
                as u32;
            spec.success.push(Op::Put(k));
        }
    }
    spec
}

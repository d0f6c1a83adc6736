//! A txn's last steps at its coordinator (`src/server/cross_txn.rs`): the
//! gets of shards it does not write, read at `T - 1` (the whole answer when
//! it writes none); each written shard's part, proposed at `T` through the
//! shard's `cross_propose`; then forgetting the record and answering the
//! client.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::Rng;

use super::coordinator::{PartState, RunEnd, RunStage, TxnRun};
use crate::sim::keyspace::checker::{Answer, Check, Found, TxnAnswer};
use crate::sim::keyspace::kv::{shard_of, GetResult, Op, Payload, Plan};
use crate::sim::keyspace::world::World;

impl World {
    pub(super) fn step_read_only(&mut self, r: &TxnRun, t: u64, succeeded: bool) -> Check {
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
    pub(super) fn step_parts(
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
    pub(super) fn propose_part(
        &mut self,
        r: &TxnRun,
        t: u64,
        succeeded: bool,
        plan: &Option<Plan>,
        shard: usize,
    ) -> Result<PartState, Found> {
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
}

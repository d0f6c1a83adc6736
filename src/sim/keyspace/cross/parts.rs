//! A batch's last steps at its coordinator (`src/server/keyspace/cross_txn.rs`):
//! each txn's gets of shards it does not write, read at its revision less
//! one (the whole answer when it writes none); each written shard's entry
//! of the parts of the batch's txns there, proposed at once through the
//! shard's `cross_propose` when the last of them reaches it (one part
//! alone is a part's entry); then one forget per shard of the records of
//! every txn whose parts all applied, and the clients' answers.

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::SliceRandom;
use rand::Rng;

use super::coordinator::{PartState, PartsStage, RunEnd, RunStage, ShardEntry, TxnRun};
use crate::sim::keyspace::checker::{Answer, Check, Found, TxnAnswer};
use crate::sim::keyspace::kv::{shard_of, GetResult, Op, PartAt, Payload, Plan, TxnSpec};
use crate::sim::keyspace::world::World;

impl World {
    pub(super) fn step_read_only(
        &mut self,
        r: &TxnRun,
        revs: Vec<u64>,
        succeeded: Vec<bool>,
    ) -> Check {
        let (run, idx) = (r.run, r.idx);
        let written: Vec<BTreeSet<usize>> = r
            .txns
            .iter()
            .zip(&succeeded)
            .map(|(t, ok)| t.spec.written(*ok))
            .collect();
        self.begin_step(|| {
            format!(
                "{} at {revs:?}: branches {succeeded:?}, writing shards {written:?}",
                r.name()
            )
        });
        // Ranges of shards a txn does not write: at its revision less one,
        // off whatever the shard has applied (the real code reads with
        // index 0).
        let mut reads: Vec<BTreeMap<usize, Vec<GetResult>>> = Vec::new();
        for (k, t) in r.txns.iter().enumerate() {
            let mut got: BTreeMap<usize, Vec<GetResult>> = BTreeMap::new();
            for op in t.spec.branch(succeeded[k]) {
                let s = shard_of(op.key());
                if let Op::Get(key) = op {
                    if !written[k].contains(&s) {
                        let v = self.members[idx].shards[s].store.get_at(*key, revs[k] - 1);
                        got.entry(s).or_default().push(v);
                    }
                }
            }
            reads.push(got);
        }
        let all_written: BTreeSet<usize> = written.iter().flatten().copied().collect();
        for &s in r.shards.iter().filter(|s| !all_written.contains(s)) {
            self.cross_release(idx, s, run)?;
        }
        let plans: Vec<Option<Plan>> = r
            .txns
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let by_shard = t.spec.ops_by_shard(succeeded[k]);
                (written[k].len() > 1).then(|| Plan {
                    id: t.op,
                    parts: written[k]
                        .iter()
                        .map(|s| (*s, by_shard[s].clone()))
                        .collect(),
                })
            })
            .collect();
        let max_delay = self.plan.max_part_delay_ticks;
        let mut entries = BTreeMap::new();
        for &s in &all_written {
            let due = self.tick + self.rng.gen_range(0..=max_delay);
            entries.insert(
                s,
                ShardEntry {
                    txns: (0..r.txns.len())
                        .filter(|k| written[*k].contains(&s))
                        .collect(),
                    due,
                    state: PartState::Unasked,
                },
            );
        }
        let p = PartsStage {
            revs,
            succeeded,
            plans,
            reads,
            entries,
        };
        if all_written.is_empty() {
            return self.settle_batch(r, &p, "read only");
        }
        self.set_stage(run, RunStage::Parts(Box::new(p)));
        self.end_step()
    }

    pub(super) fn step_parts(&mut self, r: &TxnRun, mut p: PartsStage) -> Check {
        let run = r.run;
        let tick = self.tick;
        let unasked: Vec<usize> = p
            .entries
            .iter()
            .filter(|(_, e)| e.state == PartState::Unasked && e.due <= tick)
            .map(|(s, _)| *s)
            .collect();
        if let Some(&shard) = unasked.choose(&mut self.rng) {
            self.begin_step(|| format!("{}: shard {shard} proposes its parts", r.name()));
            let state = self.propose_entry(r, &p, shard)?;
            p.entries.get_mut(&shard).expect("written").state = state;
            let waiting = p.entries.values().any(|e| e.state == PartState::Unasked);
            self.set_stage(run, RunStage::Parts(Box::new(p)));
            self.end_step()?;
            if waiting && self.rng.gen_range(0..1000) < self.plan.txn_transfer_per_mille {
                self.transfer_under_txn(run)?;
            }
            return Ok(());
        }
        if p.entries.values().any(|e| e.state == PartState::Unasked) {
            return Ok(());
        }
        // Every entry asked: wait for each to be applied here.
        let changed = self.collect_answers(r.idx, &mut p);
        if p.entries
            .values()
            .any(|e| matches!(e.state, PartState::Proposed(_)))
        {
            if changed {
                self.set_stage(run, RunStage::Parts(Box::new(p)));
            }
            return Ok(());
        }
        self.begin_step(|| format!("{}: every entry answered", r.name()));
        self.settle_batch(r, &p, "every entry answered")
    }

    /// The stage timed out: the entries not yet proposed are (the calls
    /// were sent when the stage began: each core takes its parts before
    /// the release that follows), and the batch ends with what it has.
    pub(super) fn time_out_parts(&mut self, r: &TxnRun, p: &PartsStage) -> Check {
        let mut p = p.clone();
        let unasked: Vec<usize> = p
            .entries
            .iter()
            .filter(|(_, e)| e.state == PartState::Unasked)
            .map(|(s, _)| *s)
            .collect();
        for shard in unasked {
            let state = self.propose_entry(r, &p, shard)?;
            p.entries.get_mut(&shard).expect("written").state = state;
        }
        self.collect_answers(r.idx, &mut p);
        self.settle_batch(r, &p, "timed out")
    }

    /// Moves the answers of the entries applied here into `p`; whether
    /// any came.
    fn collect_answers(&mut self, idx: usize, p: &mut PartsStage) -> bool {
        let mut changed = false;
        for e in p.entries.values_mut() {
            if let PartState::Proposed(seq) = e.state {
                if let Some(res) = self.members[idx].answers.remove(&seq) {
                    assert_eq!(res.len(), e.txns.len(), "an answer per part");
                    e.state = PartState::Applied(res);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Ends the batch: each txn whose parts all applied (or that writes
    /// nothing) is answered; each shard forgets, in one entry, the records
    /// of the answered txns that keep one; the others' clients hear that
    /// the outcome is unknown. Ends the step.
    fn settle_batch(&mut self, r: &TxnRun, p: &PartsStage, why: &str) -> Check {
        let idx = r.idx;
        let mut ends = Vec::with_capacity(r.txns.len());
        let mut forget: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for (k, t) in r.txns.iter().enumerate() {
            let written = t.spec.written(p.succeeded[k]);
            let mut results: BTreeMap<usize, Vec<GetResult>> = BTreeMap::new();
            for s in &written {
                let e = &p.entries[s];
                if let PartState::Applied(res) = &e.state {
                    let at = e.txns.iter().position(|x| *x == k).expect("a part here");
                    results.insert(*s, res[at].clone());
                }
            }
            if results.len() != written.len() {
                ends.push(RunEnd::Unknown);
                continue;
            }
            if p.plans[k].is_some() {
                for s in &written {
                    forget.entry(*s).or_default().push(p.revs[k]);
                }
            }
            let answer = txn_answer(&t.spec, p.revs[k], p.succeeded[k], &p.reads[k], &results);
            self.ack_txn(t.op, answer)?;
            ends.push(RunEnd::Acked);
        }
        let failed = p.entries.values().any(|e| e.state == PartState::Failed);
        let proposed = p
            .entries
            .values()
            .any(|e| matches!(e.state, PartState::Proposed(_) | PartState::Applied(_)));
        if failed && proposed {
            self.stats.batches_half_proposed += 1;
        }
        for (s, revs) in forget {
            // `CrossForget`, told without waiting for its answer.
            if self.cross_led(idx, s).is_ok() {
                let by = self.tag(idx);
                let (rev, more) = revs.split_first().expect("non-empty");
                let payload = Payload::Done {
                    rev: *rev,
                    more: more.to_vec(),
                    by,
                };
                self.propose_payload(idx, s, &payload);
                self.pump(idx, s)?;
            }
        }
        self.finish_run(r.run, &ends, why)?;
        self.end_step()
    }

    /// `cross_propose` of every part of the batch on `shard`, gathered
    /// into one entry (a lone part in its own).
    fn propose_entry(
        &mut self,
        r: &TxnRun,
        p: &PartsStage,
        shard: usize,
    ) -> Result<PartState, Found> {
        let (run, idx) = (r.run, r.idx);
        if let Err(why) = self.holder_index(idx, shard, run) {
            self.note(|| format!("  shard {shard} refuses the parts: {why}"));
            return Ok(PartState::Failed);
        }
        let by = self.tag(idx);
        let e = &p.entries[&shard];
        let mut parts: Vec<PartAt> = e
            .txns
            .iter()
            .map(|&k| PartAt {
                id: r.txns[k].op,
                rev: p.revs[k],
                ops: r.txns[k].spec.ops_by_shard(p.succeeded[k])[&shard].clone(),
                plan: p.plans[k].clone(),
            })
            .collect();
        let last = parts.last().expect("a part").rev;
        let n = parts.len() as u64;
        let payload = if parts.len() == 1 {
            let part = parts.pop().expect("one");
            Payload::Part {
                id: part.id,
                rev: part.rev,
                by,
                shard,
                ops: part.ops,
                plan: part.plan,
            }
        } else {
            Payload::Parts { by, shard, parts }
        };
        let ok = self.propose_payload(idx, shard, &payload);
        // Proposed or refused, the shard lets go (`cross_propose`).
        let tick = self.tick;
        self.members[idx].shards[shard].proposed_revision(last, tick);
        self.cross_release(idx, shard, run)?;
        if !ok && self.protocol.reopens_on_part_failure() {
            // The fix: the shard is not ready until an opening has finished
            // what this batch may have left half-proposed.
            self.note(|| format!("  shard {shard} not ready until the next opening's finishing"));
            let m = &mut self.members[idx];
            m.shards[shard].ready_term = None;
            m.open = false;
            m.opening = None;
            self.end_holds(idx, shard)?;
        }
        self.pump(idx, shard)?;
        Ok(if ok {
            self.stats.parts_proposed += n;
            if n > 1 {
                self.stats.parts_entries += 1;
            }
            PartState::Proposed(by.seq)
        } else {
            PartState::Failed
        })
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

/// A txn's answer: each get of the chosen branch, from its shard's part if
/// written, else from the read at `t - 1`.
fn txn_answer(
    spec: &TxnSpec,
    t: u64,
    succeeded: bool,
    reads: &BTreeMap<usize, Vec<GetResult>>,
    parts: &BTreeMap<usize, Vec<GetResult>>,
) -> TxnAnswer {
    let mut at: BTreeMap<usize, usize> = BTreeMap::new();
    let mut gets = Vec::new();
    for op in spec.branch(succeeded) {
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

//! Readiness and the counter's opening on a member
//! (`RevisionCounter::shard_ready` and `shard_not_ready`, `finish_earlier`,
//! `RevisionCounter::finished`): a shard that stops being ready closes the
//! counter and ends its holds; once every shard is ready, the opening
//! fences each shard and asks it for its records, finishes what earlier
//! leaders left half-proposed, and opens the counter.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::seq::SliceRandom;

use super::coordinator::{PartState, RunStage};
use crate::sim::keyspace::checker::Check;
use crate::sim::keyspace::kv::{Payload, Plan};
use crate::sim::keyspace::member::epoch_start;
use crate::sim::keyspace::world::World;
use crate::sim::keyspace::{Bug, MAX_TXN_TICKS};

/// One shard's answer to an opening's ask for records.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) enum RecordsAsk {
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
pub(in crate::sim::keyspace) enum FinishAction {
    Part { shard: usize, rev: u64, plan: Plan },
    Forget { shard: usize, rev: u64 },
}

#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) enum OpeningStage {
    Records(Vec<RecordsAsk>),
    Finish {
        actions: VecDeque<FinishAction>,
        /// The request awaited, and when it was proposed.
        waiting: Option<(u64, u64)>,
    },
}

/// The counter's opening on a member, waiting for `finish_earlier`.
#[derive(Debug, Clone)]
pub(in crate::sim::keyspace) struct Opening {
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

impl World {
    /// Follows each shard's readiness on member `idx` (`RevisionCounter::
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
            matches!(&r.stage, RunStage::Parts(p)
                if p.entries.values().any(|e| matches!(e.state, PartState::Proposed(_) | PartState::Applied(_))))
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
                        more: Vec::new(),
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
                if let Payload::Part { id, .. } = payload {
                    self.stats.parts_finished += 1;
                    if let Some(&run) = self.batch_of.get(&id) {
                        self.stats.batch_parts_finished += 1;
                        if self.batches_finished.insert(run) {
                            self.stats.batches_finished_by_opening += 1;
                        }
                    }
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

    /// `RevisionCounter::finished`: opens the counter, unless the opening is
    /// stale.
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

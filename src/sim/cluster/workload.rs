//! The client workload: drawing a tick's operations and carrying them out
//! (proposals, ReadIndex reads, leader transfers, membership changes and
//! log compaction).

use bytes::Bytes;
use rand::seq::SliceRandom;
use rand::Rng;

use super::Sim;
use crate::raft::{ConfChange, ConfChangeType, StateRole, Storage};
use crate::sim::checker::{found, Check, ViolationKind};
use crate::sim::SPARE_MEMBERS;

/// A client operation queued for the current tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Propose,
    Read,
    Transfer,
    ConfChange,
    Compact,
}

impl Sim {
    pub(super) fn draw_ops(&mut self) -> Vec<Op> {
        let p = &self.plan;
        let mut ops = Vec::new();
        for _ in 0..self.rng.gen_range(0..=p.max_proposals_per_tick) {
            ops.push(Op::Propose);
        }
        for _ in 0..self.rng.gen_range(0..=p.max_reads_per_tick) {
            ops.push(Op::Read);
        }
        if self.rng.gen_range(0..1000) < p.compact_per_mille {
            ops.push(Op::Compact);
        }
        if !self.calm {
            if self.rng.gen_range(0..1000) < p.transfer_per_mille {
                ops.push(Op::Transfer);
            }
            if self.rng.gen_range(0..1000) < p.conf_change_per_mille {
                ops.push(Op::ConfChange);
            }
        }
        ops
    }

    fn random_up(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].is_up())
            .collect();
        up.choose(&mut self.rng).copied()
    }

    pub(super) fn leader(&self) -> Option<usize> {
        (0..self.members.len())
            .filter_map(|i| {
                let n = self.members[i].node.as_ref()?;
                (n.role() == StateRole::Leader).then(|| (n.term(), i))
            })
            .max()
            .map(|(_, i)| i)
    }

    pub(super) fn client_op(&mut self, op: Op) -> Check {
        match op {
            Op::Propose => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                self.next_write += 1;
                let data = Bytes::from(format!("w{}", self.next_write));
                self.propose(idx, data)
            }
            Op::Read => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                self.next_read += 1;
                let ctx = Bytes::from(format!("r{}", self.next_read));
                self.read(idx, ctx)
            }
            Op::Transfer => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                let voters: Vec<u64> = self.members[idx].sm.voters.iter().copied().collect();
                let Some(&to) = voters.choose(&mut self.rng) else {
                    return Ok(());
                };
                self.begin_step(|| format!("n{} transfer leadership to {to}", idx + 1));
                self.stats.transfers_requested += 1;
                let res = self.members[idx]
                    .node
                    .as_mut()
                    .expect("up")
                    .transfer_leader(to);
                if let Err(e) = res {
                    self.note(|| format!("  refused: {e}"));
                }
                self.pump(idx)?;
                self.end_step()
            }
            Op::ConfChange => self.conf_change(),
            Op::Compact => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                self.begin_step(|| format!("n{} snapshot and compact", idx + 1));
                self.compact(idx)?;
                self.end_step()
            }
        }
    }

    pub(super) fn propose(&mut self, idx: usize, data: Bytes) -> Check {
        let name = String::from_utf8_lossy(&data).into_owned();
        self.begin_step(|| format!("n{} propose {name}", idx + 1));
        let res = self.members[idx].node.as_mut().expect("up").propose(data);
        if let Err(e) = res {
            self.note(|| format!("  refused: {e}"));
        }
        self.pump(idx)?;
        self.end_step()
    }

    pub(super) fn read(&mut self, idx: usize, ctx: Bytes) -> Check {
        let name = String::from_utf8_lossy(&ctx).into_owned();
        self.begin_step(|| format!("n{} read {name}", idx + 1));
        let id = self.members[idx].id;
        self.checker.read_started(id, ctx.clone());
        let res = self.members[idx]
            .node
            .as_mut()
            .expect("up")
            .read_index(ctx.clone());
        if let Err(e) = res {
            self.checker.read_refused(&ctx);
            self.note(|| format!("  refused: {e}"));
        }
        self.pump(idx)?;
        self.end_step()
    }

    /// Proposes one membership change that makes sense in the leader's view:
    /// add a spare as learner or voter, promote a learner, or remove a
    /// member. Ids never come back once removed.
    fn conf_change(&mut self) -> Check {
        let Some(lead) = self.leader() else {
            return Ok(());
        };
        let sm = self.members[lead].sm.clone();
        let first_spare = self.initial_members as u64 + 1;
        let fresh: Vec<u64> = (first_spare..first_spare + SPARE_MEMBERS as u64)
            .filter(|id| !sm.is_member(*id) && !sm.removed.contains(id))
            .collect();
        let learners: Vec<u64> = sm.learners.iter().copied().collect();
        let mut removable: Vec<u64> = learners.clone();
        if sm.voters.len() > 1 {
            removable.extend(sm.voters.iter().copied());
        }
        let mut choices: Vec<(ConfChangeType, u64)> = Vec::new();
        if let Some(&id) = fresh.choose(&mut self.rng) {
            let t = if self.rng.gen_bool(0.7) {
                ConfChangeType::ConfChangeAddLearnerNode
            } else {
                ConfChangeType::ConfChangeAddNode
            };
            choices.push((t, id));
        }
        if let Some(&id) = learners.choose(&mut self.rng) {
            choices.push((ConfChangeType::ConfChangeAddNode, id));
        }
        if let Some(&id) = removable.choose(&mut self.rng) {
            choices.push((ConfChangeType::ConfChangeRemoveNode, id));
        }
        let Some(&(t, node_id)) = choices.choose(&mut self.rng) else {
            return Ok(());
        };
        let at = if self.rng.gen_bool(0.7) {
            lead
        } else {
            match self.random_up() {
                Some(i) => i,
                None => lead,
            }
        };
        self.next_conf_change += 1;
        let cc = ConfChange {
            id: self.next_conf_change,
            change_type: t as i32,
            node_id,
            context: Bytes::new(),
        };
        self.begin_step(|| format!("n{} propose conf change {t:?} {node_id}", at + 1));
        let res = self.members[at]
            .node
            .as_mut()
            .expect("up")
            .propose_conf_change(&cc);
        if let Err(e) = res {
            self.note(|| format!("  refused: {e}"));
        }
        self.pump(at)?;
        self.end_step()
    }

    /// The driver snapshots its state machine at the applied index and drops
    /// a random prefix of the log it covers.
    fn compact(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let id = m.id;
        let applied = m.sm.applied_index;
        let conf = m.sm.conf_state();
        let data = m.sm.encode();
        let store = m.node.as_mut().expect("up").store_mut();
        let held = store
            .snapshot(0)
            .ok()
            .and_then(|s| s.metadata)
            .map_or(0, |md| md.index);
        let last = store.last_index().unwrap_or(0);
        if applied == 0 || applied > last {
            return Ok(());
        }
        if applied > held {
            store.create_snapshot(applied, conf, data).map_err(|e| {
                found(
                    ViolationKind::PersistenceContract,
                    format!("member {id}: snapshot at applied index {applied} failed: {e}"),
                )
            })?;
        }
        let first = store.first_index().unwrap_or(1);
        if first > applied {
            return Ok(());
        }
        let to = self.rng.gen_range(first..=applied);
        store.compact(to).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {id}: compaction to {to} failed: {e}"),
            )
        })?;
        self.note(|| format!("  n{id} snapshot at {applied}, log compacted to {to}"));
        Ok(())
    }
}

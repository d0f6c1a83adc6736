//! One tick of the keyspace simulation: every running member ticks every
//! shard and does its keyspace duties, then due messages, completed disk
//! writes, client attempts and the steps of txns, reads and openings are
//! taken one at a time in random order; and the checks after every step.

use rand::seq::SliceRandom;
use rand::Rng;

use super::World;
use crate::raft::StateRole;
use crate::sim::keyspace::checker::Check;
use crate::sim::keyspace::{Guard, ACTOR_STEPS_PER_TICK, MAX_EVENTS_PER_TICK};
use crate::sim::network::Network;

/// Something that takes steps of its own among a tick's events.
#[derive(Debug, Clone, Copy)]
enum Actor {
    Run(u64),
    Read(u64),
    Opening(usize),
}

impl World {
    pub fn begin_step(&mut self, what: impl FnOnce() -> String) {
        self.stats.steps += 1;
        self.note(what);
    }

    /// The checks run after every step, and the lease bookkeeping that
    /// watches every shard's role.
    pub fn end_step(&mut self) -> Check {
        let believers = self
            .members
            .iter()
            .filter(|m| m.may_assign(Guard::NoGuard).is_ok())
            .count();
        if believers > 1 {
            self.stats.dual_leader_steps += 1;
        }
        for idx in 0..self.members.len() {
            self.track_readiness(idx)?;
            for shard in 0..self.shard_count {
                let m = &mut self.members[idx];
                let (id, clock) = (m.id, m.clock_mticks);
                let s = &mut m.shards[shard];
                s.observe_role(clock);
                let Some(node) = s.node.as_ref() else {
                    continue;
                };
                let role = node.role();
                let term = node.term();
                let changed = (role, term) != s.last_role;
                s.last_role = (role, term);
                if role == StateRole::Leader && self.checker.observe_leader(shard, term, id)? {
                    self.stats.leaders_elected += 1;
                }
                if changed && self.trace_on {
                    let line = format!(
                        "[t{} s{}]   n{id} is {role:?} of shard {shard} in term {term} (commit {}, last {})",
                        self.tick,
                        self.stats.steps,
                        node.committed_index(),
                        node.last_index()
                    );
                    self.trace.push(line);
                }
            }
        }
        Ok(())
    }

    pub(super) fn tick_round(&mut self) -> Check {
        self.tick += 1;
        self.stats.ticks += 1;
        for net in &mut self.nets {
            net.advance_to(self.tick);
        }
        if !self.calm {
            self.inject_faults()?;
        }
        for idx in 0..self.members.len() {
            let m = &self.members[idx];
            if !m.is_up() && m.restart_at_tick.is_some_and(|t| t <= self.tick) {
                self.begin_step(|| format!("restart n{}", idx + 1));
                self.start_member(idx)?;
                self.end_step()?;
            }
            if self.members[idx]
                .paused_until
                .is_some_and(|t| t <= self.tick)
            {
                self.resume(idx)?;
            }
            for shard in 0..self.shard_count {
                let s = &self.members[idx].shards[shard];
                if s.ticks_stalled_until.is_some_and(|t| t <= self.tick) {
                    self.end_tick_stall(idx, shard)?;
                }
            }
        }
        let mut order: Vec<usize> = (0..self.members.len()).collect();
        order.shuffle(&mut self.rng);
        for idx in order {
            let m = &mut self.members[idx];
            // The monotonic clock runs whether the process is up or not.
            let ticks = m.advance_clock();
            if !m.is_up() {
                continue;
            }
            if m.is_paused() {
                m.missed_ticks += ticks;
                continue;
            }
            self.begin_step(|| format!("tick n{} ({ticks} raft ticks)", idx + 1));
            for s in &mut self.members[idx].shards {
                if s.ticks_stalled_until.is_some() {
                    s.stalled_ticks += ticks;
                } else {
                    for _ in 0..ticks {
                        s.node.as_mut().expect("up").tick();
                    }
                }
            }
            self.keyspace_duties(idx)?;
            for shard in 0..self.shard_count {
                self.pump(idx, shard)?;
            }
            self.end_step()?;
        }
        if !self.settling {
            self.draw_writes();
        }
        let mut attempts: Vec<usize> = (0..self.clients.len()).collect();
        let mut actors: Vec<Actor> = Vec::new();
        for _ in 0..ACTOR_STEPS_PER_TICK {
            actors.extend(self.runs.keys().map(|r| Actor::Run(*r)));
            actors.extend(self.reads.keys().map(|r| Actor::Read(*r)));
            actors.extend(
                (0..self.members.len())
                    .filter(|i| self.members[*i].opening.is_some())
                    .map(Actor::Opening),
            );
        }
        for _ in 0..MAX_EVENTS_PER_TICK {
            let msgs: usize = self.nets.iter().map(Network::due_count).sum();
            let released = self.released.len();
            let writes: Vec<(usize, usize)> = self.due_writes();
            let total = msgs + released + writes.len() + attempts.len() + actors.len();
            if total == 0 {
                break;
            }
            let mut r = self.rng.gen_range(0..total);
            if r < msgs {
                for shard in 0..self.shard_count {
                    let n = self.nets[shard].due_count();
                    if r < n {
                        let m = self.nets[shard].take_due(&mut self.rng).expect("counted");
                        self.deliver(shard, m)?;
                        break;
                    }
                    r -= n;
                }
                continue;
            }
            r -= msgs;
            if r < released {
                let (shard, m) = self.released.swap_remove(r);
                self.deliver(shard, m)?;
                continue;
            }
            r -= released;
            if r < writes.len() {
                let (idx, shard) = writes[r];
                self.begin_step(|| format!("write done n{} shard {shard}", idx + 1));
                self.complete_write(idx, shard)?;
                self.end_step()?;
                continue;
            }
            r -= writes.len();
            if r < attempts.len() {
                let c = attempts.swap_remove(r);
                self.client_attempt(c)?;
                continue;
            }
            r -= attempts.len();
            match actors.swap_remove(r) {
                Actor::Run(run) => self.step_run(run)?,
                Actor::Read(read) => self.step_read(read)?,
                Actor::Opening(idx) => self.step_opening(idx)?,
            }
        }
        self.clients.retain(|c| !c.settled);
        if self.calm && !self.settling {
            self.liveness_round();
        }
        Ok(())
    }

    fn due_writes(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (idx, m) in self.members.iter().enumerate() {
            if m.is_paused() {
                continue;
            }
            for (shard, s) in m.shards.iter().enumerate() {
                if s.pending
                    .as_ref()
                    .is_some_and(|p| p.done_at_tick <= self.tick)
                {
                    out.push((idx, shard));
                }
            }
        }
        out
    }
}

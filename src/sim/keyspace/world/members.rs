//! A member's life in the keyspace simulation: starting (every shard
//! replays its log from its disk), crashing (only what reached the disk
//! survives), resuming after a pause, and a shard's stalled timer
//! recovering.

use rand::Rng;

use super::World;
use crate::raft::RawNode;
use crate::sim::keyspace::checker::{found, Check, KsViolationKind};
use crate::sim::keyspace::watch::Watcher;
use crate::sim::member::StateMachine;

impl World {
    pub fn start_member(&mut self, idx: usize) -> Check {
        let tick = self.tick;
        for shard in 0..self.shard_count {
            let mut cfg = self.raft_template.clone();
            cfg.id = self.members[idx].id;
            cfg.group_id = shard as u64;
            cfg.seed = self.rng.gen();
            cfg.applied_index = 0;
            let s = &mut self.members[idx].shards[shard];
            let mut storage = s.disk.clone();
            // The state machine replays the whole log, so Raft starts from
            // the empty membership and relearns it from the log.
            let sm = StateMachine::default();
            storage.set_conf_state(sm.conf_state());
            let node = RawNode::new(&cfg, storage).map_err(|e| {
                found(
                    KsViolationKind::StateMachineSafety,
                    format!(
                        "member {} shard {shard} cannot restart from its durable state: {e}",
                        cfg.id
                    ),
                )
            })?;
            s.last_role = (node.role(), node.term());
            s.node = Some(node);
            s.sm = sm;
            s.applied_term = 0;
            s.cursor = Default::default();
            s.store = Default::default();
        }
        let m = &mut self.members[idx];
        let old = std::mem::replace(&mut m.watcher, Watcher::new(0));
        if !old.released.is_empty() {
            self.closed_watches.push((m.id, old));
        }
        m.forget_memory();
        m.restart_at_tick = None;
        m.started_at_tick = tick;
        m.started_at_mticks = m.clock_mticks;
        m.incarnation += 1;
        for shard in 0..self.shard_count {
            self.pump(idx, shard)?;
        }
        Ok(())
    }

    pub fn crash(&mut self, idx: usize, down_ticks: u64) {
        let m = &mut self.members[idx];
        if !m.is_up() {
            return;
        }
        for s in &mut m.shards {
            // Only what reached the disk survives: pending writes are lost.
            let node = s.node.take().expect("up");
            s.disk = node.store().clone();
        }
        let old = std::mem::replace(&mut m.watcher, Watcher::new(0));
        if !old.released.is_empty() {
            self.closed_watches.push((m.id, old));
        }
        m.forget_memory();
        m.restart_at_tick = Some(self.tick + down_ticks);
        self.stats.crashes += 1;
    }

    /// A paused or stalled member resumes: its missed ticks arrive in one
    /// bunch, then the messages that waited for it become deliverable.
    pub fn resume(&mut self, idx: usize) -> Check {
        let missed = self.members[idx].missed_ticks;
        self.begin_step(|| format!("resume n{} ({missed} missed ticks at once)", idx + 1));
        let m = &mut self.members[idx];
        m.paused_until = None;
        m.missed_ticks = 0;
        let held = std::mem::take(&mut m.held);
        for _ in 0..missed {
            for shard in 0..self.shard_count {
                if let Some(n) = self.members[idx].shards[shard].node.as_mut() {
                    n.tick();
                }
            }
        }
        self.released.extend(held);
        for shard in 0..self.shard_count {
            self.pump(idx, shard)?;
        }
        self.end_step()
    }

    /// A shard's stalled timer recovers: the ticks it held back arrive in
    /// one bunch.
    pub fn end_tick_stall(&mut self, idx: usize, shard: usize) -> Check {
        let s = &mut self.members[idx].shards[shard];
        let missed = s.stalled_ticks;
        s.ticks_stalled_until = None;
        s.stalled_ticks = 0;
        self.begin_step(|| {
            format!(
                "n{} shard {shard} timer recovers ({missed} held-back ticks at once)",
                idx + 1
            )
        });
        if let Some(n) = self.members[idx].shards[shard].node.as_mut() {
            for _ in 0..missed {
                n.tick();
            }
        }
        self.pump(idx, shard)?;
        self.end_step()
    }
}

//! The fault schedule of a keyspace run: the rates drawn from the seed, and
//! the crashes, pauses and partitions injected at each tick.
//!
//! The partial partition of `docs/KEYSPACE.md` (two members cut from each
//! other, both reaching the rest) is the most likely partition. On its own
//! it changes little: the pivots the two sides share keep hearing the
//! leaders and refuse the other side's candidates. What lets the two sides
//! take shards from each other is a pivot that stops hearing its leaders for
//! a while (paused, or crashed and restarted), and then votes, shard by
//! shard, for whichever candidate reaches it first; so while a partial
//! partition holds, pauses and crash-restart blips aim at the pivots.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::super::network::Faults;
use super::checker::Check;
use super::world::World;
use super::{ELECTION_TIMEOUT_TICKS, MAX_CHAOS_TICKS, MAX_PAUSE_TICKS, MIN_CHAOS_TICKS};
use crate::sim::MAX_DELAY_TICKS;

/// The fault and workload rates of one seed, drawn from the seed.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub chaos_ticks: u64,
    pub chaos_faults: Faults,
    pub crash_per_mille: u32,
    pub max_down_ticks: u64,
    /// Crashes followed by a restart within a few ticks.
    pub blip_per_mille: u32,
    pub pause_per_mille: u32,
    pub partition_per_mille: u32,
    /// Share of partitions that are partial (two members cut from each
    /// other only).
    pub partial_per_mille: u32,
    pub heal_per_mille: u32,
    /// Share of pauses and blips aimed at a pivot while a partial partition
    /// holds.
    pub aim_at_pivot_per_mille: u32,
    pub max_writes_per_tick: u32,
    /// Share of disk writes that complete only in the next tick.
    pub late_write_per_mille: u32,
}

impl Plan {
    pub fn draw(rng: &mut SmallRng) -> Self {
        Plan {
            chaos_ticks: rng.gen_range(MIN_CHAOS_TICKS..=MAX_CHAOS_TICKS),
            chaos_faults: Faults {
                drop_per_mille: rng.gen_range(0..=100),
                duplicate_per_mille: rng.gen_range(0..=50),
                max_delay_ticks: rng.gen_range(0..=MAX_DELAY_TICKS),
            },
            crash_per_mille: rng.gen_range(0..=15),
            max_down_ticks: rng.gen_range(1..=4 * ELECTION_TIMEOUT_TICKS),
            blip_per_mille: rng.gen_range(0..=40),
            pause_per_mille: rng.gen_range(0..=40),
            partition_per_mille: rng.gen_range(5..=40),
            partial_per_mille: rng.gen_range(300..=900),
            heal_per_mille: rng.gen_range(5..=60),
            aim_at_pivot_per_mille: rng.gen_range(500..=1000),
            max_writes_per_tick: rng.gen_range(1..=4),
            late_write_per_mille: rng.gen_range(0..=300),
        }
    }
}

impl World {
    /// A member to crash, pause or blip: a pivot of the partial partition
    /// when one holds and the plan aims there, else any running member.
    fn victim(&mut self) -> Option<usize> {
        let running = self.running();
        let pivots: Vec<usize> = self
            .pivots
            .iter()
            .map(|id| *id as usize - 1)
            .filter(|i| running.contains(i))
            .collect();
        if !pivots.is_empty() && self.rng.gen_range(0..1000) < self.plan.aim_at_pivot_per_mille {
            return pivots.choose(&mut self.rng).copied();
        }
        running.choose(&mut self.rng).copied()
    }

    pub fn inject_faults(&mut self) -> Check {
        let p = self.plan.clone();
        if self.rng.gen_range(0..1000) < p.crash_per_mille {
            if let Some(idx) = self.running().choose(&mut self.rng).copied() {
                let down = self.rng.gen_range(1..=p.max_down_ticks);
                self.begin_step(|| format!("crash n{} for {down} ticks", idx + 1));
                self.crash(idx, down);
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.blip_per_mille {
            if let Some(idx) = self.victim() {
                let down = self.rng.gen_range(1..=3);
                self.begin_step(|| format!("crash n{} for {down} ticks (blip)", idx + 1));
                self.crash(idx, down);
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.pause_per_mille {
            if let Some(idx) = self.victim() {
                let ticks = self.rng.gen_range(1..=MAX_PAUSE_TICKS);
                self.begin_step(|| format!("pause n{} for {ticks} ticks", idx + 1));
                self.members[idx].paused_until = Some(self.tick + ticks);
                self.stats.pauses += 1;
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.partition_per_mille {
            self.partition()?;
        } else if !self.nets[0].blocked_links().is_empty()
            && self.rng.gen_range(0..1000) < p.heal_per_mille
        {
            self.begin_step(|| "heal partition".into());
            for net in &mut self.nets {
                net.heal();
            }
            self.pivots.clear();
            self.end_step()?;
        }
        Ok(())
    }

    fn partition(&mut self) -> Check {
        let all = self.ids();
        self.stats.partitions += 1;
        self.pivots.clear();
        if all.len() >= 3 && self.rng.gen_range(0..1000) < self.plan.partial_per_mille {
            let pair: Vec<u64> = all.choose_multiple(&mut self.rng, 2).copied().collect();
            let (a, b) = (pair[0], pair[1]);
            self.pivots = all.iter().copied().filter(|x| *x != a && *x != b).collect();
            self.stats.partial_partitions += 1;
            let pivots = self.pivots.clone();
            self.begin_step(|| format!("partial partition: n{a} | n{b}, both reach {pivots:?}"));
            for net in &mut self.nets {
                net.partition_one_way(&[(a, b), (b, a)]);
            }
        } else if self.rng.gen_bool(0.5) {
            let k = self.rng.gen_range(1..all.len().max(2));
            let side: Vec<u64> = all.choose_multiple(&mut self.rng, k).copied().collect();
            self.begin_step(|| format!("partition {side:?} | rest"));
            for net in &mut self.nets {
                net.partition_symmetric(&side, &all);
            }
        } else {
            let n = self.rng.gen_range(1..=all.len());
            let mut links = Vec::new();
            for _ in 0..n {
                let a = *all.choose(&mut self.rng).expect("non-empty");
                let b = *all.choose(&mut self.rng).expect("non-empty");
                if a != b {
                    links.push((a, b));
                }
            }
            self.begin_step(|| format!("one-way cuts {links:?}"));
            for net in &mut self.nets {
                net.partition_one_way(&links);
            }
        }
        self.end_step()
    }

    /// The faults stop: the network heals and becomes reliable and prompt,
    /// disks keep up, paused members resume and crashed ones restart.
    pub fn calm_down(&mut self) -> Check {
        self.calm = true;
        self.live.calm_since_tick = self.tick;
        self.pivots.clear();
        for net in &mut self.nets {
            net.heal();
            net.faults = Faults::calm();
        }
        self.plan.late_write_per_mille = 0;
        for idx in 0..self.members.len() {
            if self.members[idx].is_paused() {
                self.resume(idx)?;
            }
            if !self.members[idx].is_up() {
                let id = self.members[idx].id;
                self.note(|| format!("  restart n{id}"));
                self.start_member(idx)?;
            }
        }
        Ok(())
    }
}

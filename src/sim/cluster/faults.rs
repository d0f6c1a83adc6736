//! The faults of the chaos phase (random crashes, crashes aimed at leaders,
//! doomed new leaders, partitions and their healing) and the calm that ends
//! them.

use rand::seq::SliceRandom;
use rand::Rng;

use super::Sim;
use crate::sim::checker::Check;
use crate::sim::network::{self, Faults};

impl Sim {
    fn candidates(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.id).collect()
    }

    /// Crashes or isolates the new leaders whose time has come.
    pub(super) fn doom_leaders(&mut self) -> Check {
        if self.calm || self.doomed.is_empty() {
            return Ok(());
        }
        let due: Vec<(u64, usize, u64, bool)> = self
            .doomed
            .iter()
            .copied()
            .filter(|d| d.0 <= self.tick)
            .collect();
        self.doomed.retain(|d| d.0 > self.tick);
        for (_, idx, incarnation, crash) in due {
            let m = &self.members[idx];
            if !m.is_up() || m.incarnation != incarnation {
                continue;
            }
            if crash {
                self.begin_step(|| format!("crash new leader n{}", idx + 1));
                self.crash(idx);
            } else {
                let id = m.id;
                let all = self.candidates();
                self.begin_step(|| format!("isolate new leader n{id}"));
                self.stats.partitions += 1;
                self.net.partition_symmetric(&[id], &all);
            }
            self.end_step()?;
        }
        Ok(())
    }

    pub(super) fn inject_faults(&mut self) -> Check {
        let p = self.plan.clone();
        if self.rng.gen_range(0..1000) < p.crash_per_mille {
            let up: Vec<usize> = (0..self.members.len())
                .filter(|i| self.members[*i].is_up())
                .collect();
            if let Some(&idx) = up.choose(&mut self.rng) {
                self.begin_step(|| format!("crash n{}", idx + 1));
                self.crash(idx);
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.leader_crash_per_mille {
            if let Some(idx) = self.leader() {
                self.begin_step(|| format!("crash leader n{}", idx + 1));
                self.crash(idx);
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.partition_per_mille {
            let all = self.candidates();
            self.stats.partitions += 1;
            if self.rng.gen_bool(0.5) {
                let k = self.rng.gen_range(1..all.len().max(2));
                let side: Vec<u64> = all.choose_multiple(&mut self.rng, k).copied().collect();
                self.begin_step(|| format!("partition {side:?} | rest"));
                self.net.partition_symmetric(&side, &all);
            } else {
                let links = network::random_one_way_links(&mut self.rng, &all);
                self.begin_step(|| format!("one-way cuts {links:?}"));
                self.net.partition_one_way(&links);
            }
            self.end_step()?;
        } else if !self.net.blocked_links().is_empty()
            && self.rng.gen_range(0..1000) < p.heal_per_mille
        {
            self.begin_step(|| "heal partition".into());
            self.net.heal();
            self.end_step()?;
        }
        Ok(())
    }

    /// The faults stop: the network heals and becomes reliable and prompt,
    /// disks keep up, and crashed members restart.
    pub(super) fn calm_down(&mut self) -> Check {
        self.calm = true;
        self.doomed.clear();
        self.live.calm_since_tick = self.tick;
        self.net.heal();
        self.net.faults = Faults::calm();
        self.plan.late_write_per_mille = 0;
        for idx in 0..self.members.len() {
            if !self.members[idx].is_up() {
                let id = self.members[idx].id;
                self.note(|| format!("  restart n{id}"));
                self.start_member(idx)?;
            }
        }
        Ok(())
    }
}

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
use super::{
    ELECTION_TIMEOUT_TICKS, MAX_CHAOS_TICKS, MAX_CLOCK_SKEW_MTICKS, MAX_PART_DELAY_TICKS,
    MAX_PAUSE_TICKS, MIN_CHAOS_TICKS,
};
use crate::raft::StateRole;
use crate::sim::MAX_DELAY_TICKS;

/// One shard's connection from `from` to `to` that carries nothing until
/// `until_tick`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ShardCut {
    pub from: u64,
    pub to: u64,
    pub until_tick: u64,
}

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
    /// Share of stalled leader connections whose shard timer on the
    /// leader stalls as well: the leader then keeps believing it leads the
    /// shard, since check-quorum runs on ticks.
    pub timer_stall_per_mille: u32,
    pub partition_per_mille: u32,
    /// Share of partitions that are partial (two members cut from each
    /// other only).
    pub partial_per_mille: u32,
    pub heal_per_mille: u32,
    /// Fewest ticks a partial partition holds.
    pub min_partial_ticks: u64,
    /// Chance per tick and shard of stalling one of the shard leader's
    /// connections.
    pub shard_cut_per_mille: u32,
    /// Chance per tick and shard, while a partial partition holds, of
    /// stalling the shard leader's connections to every pivot.
    pub flip_per_mille: u32,
    /// Share of pauses and blips aimed at a pivot while a partial partition
    /// holds.
    pub aim_at_pivot_per_mille: u32,
    /// Chance per tick, while one member leads every shard, of starting a
    /// stale-view episode (`adversary.rs`).
    pub episode_per_mille: u32,
    /// Share of episodes that take shards through pivot restarts.
    pub restart_episode_per_mille: u32,
    pub max_writes_per_tick: u32,
    /// Chance per tick of a client invoking a txn over several shards:
    /// kept below what a shard's holds can serve (one txn per commit
    /// round), since held shards take no single-shard write meanwhile.
    pub txn_per_mille: u32,
    /// Chance per tick of a client invoking a read over several shards.
    pub read_per_mille: u32,
    /// How far each member's clock rate may be from the tick's, in mticks
    /// per tick.
    pub clock_skew_mticks: u64,
    /// Most ticks a part's proposal waits in its shard's core queue (a busy
    /// core: the coordinator's calls to several cores arrive apart).
    pub max_part_delay_ticks: u64,
    /// Chance per tick while a keyspace leader runs a txn over several
    /// shards, and again each time a txn proposes a part while another
    /// waits, of a leader transfer of one of its shards (an operator's
    /// MoveLeader, a handover) to another member: aimed at the windows of
    /// the txn protocol, between the holds and the last part.
    pub txn_transfer_per_mille: u32,
    /// Chance per tick of a burst of txns over the same shards, some naming
    /// keys in common and some not: the load that makes batches.
    pub burst_per_mille: u32,
    /// Most txns in a burst.
    pub max_burst_txns: usize,
    /// Chance per step of a batch waiting for its holds that its leading
    /// txn's task ends (its client went away).
    pub batch_abandon_per_mille: u32,
    /// Share of disk writes that complete only in the next tick.
    pub late_write_per_mille: u32,
    /// Chance per tick of a leader transfer of a random shard to a random
    /// member, asked by a random member (as a stale shard 0 leader or an
    /// operator would): transfer campaigns override the followers' lease.
    pub transfer_per_mille: u32,
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
            timer_stall_per_mille: rng.gen_range(0..=1000),
            partition_per_mille: rng.gen_range(5..=40),
            partial_per_mille: rng.gen_range(300..=900),
            heal_per_mille: rng.gen_range(5..=60),
            min_partial_ticks: rng
                .gen_range(3 * ELECTION_TIMEOUT_TICKS..=10 * ELECTION_TIMEOUT_TICKS),
            shard_cut_per_mille: rng.gen_range(0..=20),
            flip_per_mille: rng.gen_range(10..=80),
            aim_at_pivot_per_mille: rng.gen_range(500..=1000),
            episode_per_mille: rng.gen_range(0..=100),
            restart_episode_per_mille: rng.gen_range(0..=1000),
            max_writes_per_tick: rng.gen_range(1..=4),
            late_write_per_mille: rng.gen_range(0..=300),
            transfer_per_mille: rng.gen_range(0..=40),
            txn_per_mille: rng.gen_range(50..=300),
            read_per_mille: rng.gen_range(100..=700),
            clock_skew_mticks: rng.gen_range(0..=MAX_CLOCK_SKEW_MTICKS),
            max_part_delay_ticks: if rng.gen_bool(0.25) {
                0
            } else {
                rng.gen_range(1..=MAX_PART_DELAY_TICKS)
            },
            txn_transfer_per_mille: rng.gen_range(0..=400),
            burst_per_mille: rng.gen_range(20..=150),
            max_burst_txns: rng.gen_range(2..=5),
            batch_abandon_per_mille: rng.gen_range(0..=4),
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
        if self.run_episode()? {
            return Ok(());
        }
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
        if self.rng.gen_range(0..1000) < p.transfer_per_mille {
            self.random_transfer()?;
        }
        if !self.runs.is_empty() && self.rng.gen_range(0..1000) < p.txn_transfer_per_mille {
            let runs: Vec<u64> = self.runs.keys().copied().collect();
            let run = *runs.choose(&mut self.rng).expect("non-empty");
            self.transfer_under_txn(run)?;
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
        let partial_over = self.partial_until.is_some_and(|t| t <= self.tick);
        if partial_over {
            self.begin_step(|| "partial partition ends".into());
            self.base_links.clear();
            self.pivots.clear();
            self.partial_until = None;
            self.apply_links();
            self.end_step()?;
        } else if self.partial_until.is_none() {
            if self.rng.gen_range(0..1000) < p.partition_per_mille {
                self.partition()?;
            } else if !self.base_links.is_empty() && self.rng.gen_range(0..1000) < p.heal_per_mille
            {
                self.begin_step(|| "heal partition".into());
                self.base_links.clear();
                self.apply_links();
                self.end_step()?;
            }
        }
        let expired = self
            .shard_links
            .iter()
            .any(|l| l.iter().any(|c| c.until_tick <= self.tick));
        if expired {
            let tick = self.tick;
            self.begin_step(|| "stalled shard connections recover".into());
            for l in &mut self.shard_links {
                l.retain(|c| c.until_tick > tick);
            }
            self.apply_links();
            self.end_step()?;
        }
        for shard in 0..self.shard_count {
            if !self.pivots.is_empty() && self.rng.gen_range(0..1000) < p.flip_per_mille {
                self.stall_leader(shard, true)?;
            } else if self.rng.gen_range(0..1000) < p.shard_cut_per_mille {
                self.stall_leader(shard, false)?;
            }
        }
        Ok(())
    }

    fn random_transfer(&mut self) -> Check {
        let Some(idx) = self.running().choose(&mut self.rng).copied() else {
            return Ok(());
        };
        let shard = self.rng.gen_range(0..self.shard_count);
        let to = *self.ids().choose(&mut self.rng).expect("members");
        self.begin_step(|| format!("n{} asks for shard {shard} to move to n{to}", idx + 1));
        self.stats.transfers_requested += 1;
        if let Some(n) = self.members[idx].shards[shard].node.as_mut() {
            let _ = n.transfer_leader(to);
        }
        self.pump(idx, shard)?;
        self.end_step()
    }

    /// Moves one shard of a member running a txn over several shards to
    /// another member. Half the time the shard is one whose part the txn
    /// has yet to propose (Raft then refuses the part while the transfer
    /// runs); else, often, a shard the txn does not touch (the counter
    /// closes, and opens again with a fence and a finishing once shard 0's
    /// leader pulls the shard back, while the txn is still between parts).
    /// The target is, when there is one, often a member that is down or
    /// paused, so that the transfer times out and leadership stays.
    pub fn transfer_under_txn(&mut self, run: u64) -> Check {
        let Some(r) = self.runs.get(&run).cloned() else {
            return Ok(());
        };
        let idx = r.idx;
        if !self.members[idx].is_running() {
            return Ok(());
        }
        let (pending, proposed): (Vec<usize>, Vec<usize>) = match &r.stage {
            super::cross::RunStage::Parts(p) => {
                let pending = p
                    .entries
                    .iter()
                    .filter(|(_, e)| e.state == super::cross::PartState::Unasked)
                    .map(|(s, _)| *s)
                    .collect();
                let proposed = p
                    .entries
                    .iter()
                    .filter(|(s, e)| **s != 0 && e.state != super::cross::PartState::Unasked)
                    .map(|(s, _)| *s)
                    .collect();
                (pending, proposed)
            }
            _ => (r.shards.clone(), Vec::new()),
        };
        // Shards whose move closes the counter without ending the txn's
        // pending holds: one whose part is proposed, or one it does not
        // touch (not shard 0, whose move hands the keyspace over).
        let mut elsewhere: Vec<usize> = (1..self.shard_count)
            .filter(|s| !r.shards.contains(s))
            .collect();
        elsewhere.extend(proposed);
        let shard = match self.rng.gen_range(0..10) {
            0..=3 if !pending.is_empty() => *pending.choose(&mut self.rng).expect("non-empty"),
            4..=8 if !elsewhere.is_empty() => *elsewhere.choose(&mut self.rng).expect("non-empty"),
            _ => self.rng.gen_range(0..self.shard_count),
        };
        let id = self.members[idx].id;
        let away: Vec<u64> = self
            .members
            .iter()
            .filter(|m| m.id != id && !m.is_running())
            .map(|m| m.id)
            .collect();
        let others: Vec<u64> = self.ids().into_iter().filter(|m| *m != id).collect();
        let to = if !away.is_empty() && self.rng.gen_bool(0.5) {
            *away.choose(&mut self.rng).expect("non-empty")
        } else {
            *others.choose(&mut self.rng).expect("several members")
        };
        self.begin_step(|| {
            format!(
                "n{id} is asked to move shard {shard} to n{to} (under {})",
                r.name()
            )
        });
        self.stats.transfers_requested += 1;
        if let Some(n) = self.members[idx].shards[shard].node.as_mut() {
            let _ = n.transfer_leader(to);
        }
        self.pump(idx, shard)?;
        self.end_step()
    }

    /// Sets every shard's network to cut the links cut everywhere plus its
    /// own.
    pub fn apply_links(&mut self) {
        for (shard, net) in self.nets.iter_mut().enumerate() {
            let mut links = self.base_links.clone();
            links.extend(self.shard_links[shard].iter().map(|c| (c.from, c.to)));
            net.partition_one_way(&links);
        }
    }

    /// Stalls one shard's connections from that shard's leader, for an
    /// election timeout or two: to every pivot of the partial partition
    /// (`to_pivots`), or to one random member. The members cut off stop
    /// hearing the leader on this shard alone, so their lease there lapses
    /// while they still follow the same leader, or another, on the other
    /// shards; a candidate of the other side can then take the shard while
    /// the old leader still believes it leads it.
    fn stall_leader(&mut self, shard: usize, to_pivots: bool) -> Check {
        let leader = self
            .running()
            .into_iter()
            .filter_map(|i| {
                let n = self.members[i].shards[shard].node.as_ref()?;
                (n.role() == StateRole::Leader).then(|| (n.term(), self.members[i].id))
            })
            .max()
            .map(|(_, id)| id);
        let Some(from) = leader else {
            return Ok(());
        };
        let targets: Vec<u64> = if to_pivots {
            self.pivots.iter().copied().filter(|p| *p != from).collect()
        } else {
            let others: Vec<u64> = self.ids().into_iter().filter(|p| *p != from).collect();
            others.choose(&mut self.rng).copied().into_iter().collect()
        };
        if targets.is_empty() {
            return Ok(());
        }
        let until_tick = self.tick
            + self
                .rng
                .gen_range(ELECTION_TIMEOUT_TICKS..=4 * ELECTION_TIMEOUT_TICKS);
        self.begin_step(|| {
            format!("stall n{from} -> {targets:?} on shard {shard} until t{until_tick}")
        });
        if self.rng.gen_range(0..1000) < self.plan.timer_stall_per_mille {
            let s = &mut self.members[from as usize - 1].shards[shard];
            if s.ticks_stalled_until.is_none() {
                s.ticks_stalled_until = Some(until_tick);
                self.stats.tick_stalls += 1;
                self.note(|| {
                    format!("  and n{from}'s shard {shard} timer stalls until t{until_tick}")
                });
            }
        }
        for to in targets {
            self.shard_links[shard].push(ShardCut {
                from,
                to,
                until_tick,
            });
        }
        self.apply_links();
        self.end_step()
    }

    fn partition(&mut self) -> Check {
        let all = self.ids();
        self.stats.partitions += 1;
        self.pivots.clear();
        if all.len() >= 3 && self.rng.gen_range(0..1000) < self.plan.partial_per_mille {
            // One side is shard 0's leader when there is one: the incumbent
            // keyspace leader against a challenger.
            let incumbent = self
                .running()
                .into_iter()
                .find(|i| self.members[*i].leads_shard0())
                .map(|i| self.members[i].id);
            let (a, b) = match incumbent {
                Some(a) => {
                    let others: Vec<u64> = all.iter().copied().filter(|x| *x != a).collect();
                    (
                        a,
                        *others.choose(&mut self.rng).expect("three or more members"),
                    )
                }
                None => {
                    let pair: Vec<u64> = all.choose_multiple(&mut self.rng, 2).copied().collect();
                    (pair[0], pair[1])
                }
            };
            self.pivots = all.iter().copied().filter(|x| *x != a && *x != b).collect();
            self.stats.partial_partitions += 1;
            let hold = self
                .rng
                .gen_range(self.plan.min_partial_ticks..=2 * self.plan.min_partial_ticks);
            self.partial_until = Some(self.tick + hold);
            let pivots = self.pivots.clone();
            self.begin_step(|| format!("partial partition: n{a} | n{b}, both reach {pivots:?}"));
            self.base_links = vec![(a, b), (b, a)];
        } else if self.rng.gen_bool(0.5) {
            let k = self.rng.gen_range(1..all.len().max(2));
            let side: Vec<u64> = all.choose_multiple(&mut self.rng, k).copied().collect();
            self.begin_step(|| format!("partition {side:?} | rest"));
            self.base_links.clear();
            for a in &side {
                for b in all.iter().filter(|b| !side.contains(b)) {
                    self.base_links.push((*a, *b));
                    self.base_links.push((*b, *a));
                }
            }
        } else {
            let links = super::super::network::random_one_way_links(&mut self.rng, &all);
            self.begin_step(|| format!("one-way cuts {links:?}"));
            self.base_links = links;
        }
        self.apply_links();
        self.end_step()
    }

    /// The faults stop: the network heals and becomes reliable and prompt,
    /// disks keep up, paused members resume and crashed ones restart.
    pub fn calm_down(&mut self) -> Check {
        self.end_episode("the faults stop")?;
        self.calm = true;
        self.live.calm_since_tick = self.tick;
        self.pivots.clear();
        self.partial_until = None;
        self.base_links.clear();
        for l in &mut self.shard_links {
            l.clear();
        }
        for net in &mut self.nets {
            net.heal();
            net.faults = Faults::calm();
        }
        self.plan.late_write_per_mille = 0;
        for idx in 0..self.members.len() {
            if self.members[idx].is_paused() {
                self.resume(idx)?;
            }
            for shard in 0..self.shard_count {
                if self.members[idx].shards[shard]
                    .ticks_stalled_until
                    .is_some()
                {
                    self.end_tick_stall(idx, shard)?;
                }
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

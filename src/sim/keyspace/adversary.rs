//! The stale-view episode: a scripted adversary that steers a run into the
//! schedule of `docs/KEYSPACE.md` ("Open: a stale view of leadership"),
//! where two members each believe they lead every shard and both commit.
//!
//! Random faults reach that schedule only rarely, because check-quorum
//! makes a leader that stops hearing a quorum step down within two
//! election timeouts, and a stale view must last on both sides at once.
//! The episode builds it on purpose, with faults that each happen in real
//! deployments (a partition between two members, a stalled connection of
//! one shard, a starved timer on the core that runs a shard, a quick
//! restart), timed against the state of the run:
//!
//! 1. The incumbent `I` leads every shard. `I` and a challenger `C` are cut
//!    from each other; the other members (the pivots) reach both. `I`'s
//!    connections to the pivots stall on every shard, and `I`'s timer
//!    stalls on the shards of set `X`, so `I` keeps believing it leads
//!    them. Once the pivots stop hearing `I` (an election timeout, or at
//!    once when they restart), `C` campaigns (its timer may fire any time:
//!    it has heard no leader since the partition) and takes every shard.
//!    `I` steps down on the other shards, `Y`, by check-quorum.
//! 2. Once `C` leads every shard, the same is done to `C` on `Y`: its
//!    connections to the pivots stall there and its timer too; `I`
//!    campaigns on `Y` and takes it back.
//! 3. Now `I` leads `Y` and believes it leads `X`; `C` leads `X` and
//!    believes it leads `Y`. Both take client writes for a while.
//!
//! In the restart variant the pivots crash and restart (down one tick)
//! instead of waiting out an election timeout, and only the shards whose
//! leader must stay stale are cut: that is the schedule the restart vote
//! hold is for, since a restarted pivot would otherwise vote at once while
//! the lease it vouched for still runs.

use rand::seq::SliceRandom;
use rand::Rng;

use super::checker::{Check, Found};
use super::faults::ShardCut;
use super::world::World;
use super::{Guard, ELECTION_TIMEOUT_TICKS};
use crate::raft::StateRole;

/// Longest each phase of an episode waits for its leader to take the
/// shards before the episode is abandoned.
const MAX_PHASE_TICKS: u64 = 8 * ELECTION_TIMEOUT_TICKS;
/// Ticks between two hurried campaigns of one shard.
const HURRY_INTERVAL_TICKS: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The challenger takes every shard.
    TakeAll,
    /// The incumbent takes the shards of `y` back.
    TakeBack,
    /// Both believe they lead every shard; runs until the tick.
    Hold { until_tick: u64 },
}

#[derive(Debug, Clone)]
pub(super) struct Episode {
    incumbent: usize,
    challenger: usize,
    pivots: Vec<usize>,
    /// Shards the incumbent keeps believing it leads.
    x: Vec<usize>,
    /// Shards the incumbent takes back from the challenger.
    y: Vec<usize>,
    via_restart: bool,
    phase: Phase,
    phase_since_tick: u64,
    last_hurry_tick: u64,
}

impl World {
    /// Drives the episode in progress, or starts one. Returns whether an
    /// episode is in progress (the random faults then hold off, so that
    /// they do not undo it).
    pub fn run_episode(&mut self) -> Result<bool, Found> {
        if self.episode.is_none() {
            self.maybe_start_episode()?;
        }
        let Some(ep) = self.episode.clone() else {
            return Ok(false);
        };
        let elapsed = self.tick - ep.phase_since_tick;
        let wait = if ep.via_restart {
            2
        } else {
            ELECTION_TIMEOUT_TICKS + 1
        };
        match ep.phase {
            Phase::TakeAll => {
                let c = &self.members[ep.challenger];
                let i_left_y =
                    ep.y.iter()
                        .all(|s| !self.members[ep.incumbent].shards[*s].is_leader());
                if c.may_assign(Guard::NoGuard, self.tick).is_ok() && i_left_y {
                    self.begin_step(|| {
                        format!(
                            "episode: n{} leads every shard; n{} takes back shards {:?}",
                            ep.challenger + 1,
                            ep.incumbent + 1,
                            ep.y
                        )
                    });
                    self.stall_leader_on(ep.challenger, &ep.pivots, &ep.y);
                    if !ep.via_restart {
                        // The incumbent must reach the pivots on `y` to
                        // campaign there.
                        let inc = self.members[ep.incumbent].id;
                        for s in &ep.y {
                            self.shard_links[*s].retain(|c| c.from != inc);
                        }
                    }
                    self.apply_links();
                    if ep.via_restart {
                        self.restart_pivots(&ep.pivots);
                    }
                    let tick = self.tick;
                    if let Some(e) = self.episode.as_mut() {
                        e.phase = Phase::TakeBack;
                        e.phase_since_tick = tick;
                    }
                    self.end_step()?;
                } else if elapsed > MAX_PHASE_TICKS {
                    self.end_episode("the challenger did not take every shard")?;
                } else if elapsed >= wait {
                    let shards: Vec<usize> = (0..self.shard_count).collect();
                    self.hurry(ep.challenger, &shards, ep.last_hurry_tick)?;
                }
            }
            Phase::TakeBack => {
                if self.members[ep.incumbent]
                    .may_assign(Guard::NoGuard, self.tick)
                    .is_ok()
                {
                    let hold = self
                        .rng
                        .gen_range(ELECTION_TIMEOUT_TICKS..=3 * ELECTION_TIMEOUT_TICKS);
                    let until_tick = self.tick + hold;
                    self.begin_step(|| {
                        format!(
                            "episode: n{} (stale on shards {:?}) and n{} (stale on {:?}) each believe they lead every shard, until t{until_tick}",
                            ep.incumbent + 1,
                            ep.x,
                            ep.challenger + 1,
                            ep.y
                        )
                    });
                    if let Some(e) = self.episode.as_mut() {
                        e.phase = Phase::Hold { until_tick };
                    }
                    self.stats.episodes_held += 1;
                    self.end_step()?;
                } else if elapsed > MAX_PHASE_TICKS {
                    self.end_episode("the incumbent did not take its shards back")?;
                } else if elapsed >= wait {
                    self.hurry(ep.incumbent, &ep.y, ep.last_hurry_tick)?;
                }
            }
            Phase::Hold { until_tick } => {
                if self.tick >= until_tick {
                    self.end_episode("done")?;
                }
            }
        }
        Ok(self.episode.is_some())
    }

    fn maybe_start_episode(&mut self) -> Check {
        if self.members.len() < 3
            || self.shard_count < 2
            || self.rng.gen_range(0..1000) >= self.plan.episode_per_mille
        {
            return Ok(());
        }
        let Some(incumbent) = self.running().into_iter().find(|i| {
            self.members[*i]
                .may_assign(Guard::NoGuard, self.tick)
                .is_ok()
        }) else {
            return Ok(());
        };
        let others: Vec<usize> = self
            .running()
            .into_iter()
            .filter(|i| *i != incumbent)
            .collect();
        if others.len() + 1 < self.members.len() {
            return Ok(());
        }
        let challenger = *others.choose(&mut self.rng).expect("three or more members");
        let pivots: Vec<usize> = others.into_iter().filter(|i| *i != challenger).collect();
        let mut shards: Vec<usize> = (0..self.shard_count).collect();
        shards.shuffle(&mut self.rng);
        let k = self.rng.gen_range(1..self.shard_count);
        let mut x = shards[..k].to_vec();
        let mut y = shards[k..].to_vec();
        x.sort_unstable();
        y.sort_unstable();
        let via_restart = self.rng.gen_range(0..1000) < self.plan.restart_episode_per_mille;
        let (inc_id, ch_id) = (self.members[incumbent].id, self.members[challenger].id);
        self.begin_step(|| {
            format!(
                "episode{}: n{inc_id} | n{ch_id}, pivots {:?}; n{inc_id} is to stay stale on shards {x:?} and take back {y:?}",
                if via_restart { " (via restarts)" } else { "" },
                pivots.iter().map(|p| p + 1).collect::<Vec<_>>()
            )
        });
        self.stats.episodes += 1;
        self.base_links = vec![(inc_id, ch_id), (ch_id, inc_id)];
        for l in &mut self.shard_links {
            l.clear();
        }
        self.pivots = pivots.iter().map(|p| self.members[*p].id).collect();
        self.partial_until = None;
        let cut: Vec<usize> = if via_restart {
            x.clone()
        } else {
            (0..self.shard_count).collect()
        };
        self.cut_from(incumbent, &pivots, &cut);
        for s in &x {
            self.members[incumbent].shards[*s].ticks_stalled_until = Some(u64::MAX);
        }
        self.apply_links();
        if via_restart {
            self.restart_pivots(&pivots);
        }
        self.episode = Some(Episode {
            incumbent,
            challenger,
            pivots,
            x,
            y,
            via_restart,
            phase: Phase::TakeAll,
            phase_since_tick: self.tick,
            last_hurry_tick: 0,
        });
        self.end_step()
    }

    /// Stalls `leader`'s connections to `pivots` and its timer on `shards`.
    fn stall_leader_on(&mut self, leader: usize, pivots: &[usize], shards: &[usize]) {
        self.cut_from(leader, pivots, shards);
        for s in shards {
            self.members[leader].shards[*s].ticks_stalled_until = Some(u64::MAX);
        }
    }

    fn cut_from(&mut self, from: usize, to: &[usize], shards: &[usize]) {
        let from = self.members[from].id;
        for s in shards {
            for t in to {
                self.shard_links[*s].push(ShardCut {
                    from,
                    to: self.members[*t].id,
                    until_tick: u64::MAX,
                });
            }
        }
    }

    fn restart_pivots(&mut self, pivots: &[usize]) {
        for p in pivots {
            self.note(|| format!("  episode: crash n{} for 1 tick", p + 1));
            self.crash(*p, 1);
        }
    }

    /// The election timer of `member` fires on each of `shards` it does not
    /// lead: it has heard no leader there since the partition, so any tick
    /// may be its randomized timeout.
    fn hurry(&mut self, member: usize, shards: &[usize], last: u64) -> Check {
        if self.tick < last + HURRY_INTERVAL_TICKS || !self.members[member].is_running() {
            return Ok(());
        }
        self.begin_step(|| {
            format!(
                "episode: n{}'s timer fires on shards {shards:?}",
                member + 1
            )
        });
        for s in shards {
            let sh = &mut self.members[member].shards[*s];
            if let Some(n) = sh.node.as_mut() {
                if n.role() != StateRole::Leader {
                    let _ = n.campaign();
                }
            }
        }
        for s in shards {
            self.pump(member, *s)?;
        }
        let tick = self.tick;
        if let Some(e) = self.episode.as_mut() {
            e.last_hurry_tick = tick;
        }
        self.end_step()
    }

    /// Heals what the episode cut and lets the stalled timers catch up.
    pub fn end_episode(&mut self, why: &str) -> Check {
        let Some(ep) = self.episode.take() else {
            return Ok(());
        };
        self.begin_step(|| format!("episode ends: {why}"));
        self.base_links.clear();
        for l in &mut self.shard_links {
            l.clear();
        }
        self.pivots.clear();
        self.apply_links();
        self.end_step()?;
        for m in [ep.incumbent, ep.challenger] {
            for s in 0..self.shard_count {
                if self.members[m].shards[s].ticks_stalled_until.is_some() {
                    self.end_tick_stall(m, s)?;
                }
            }
        }
        Ok(())
    }
}

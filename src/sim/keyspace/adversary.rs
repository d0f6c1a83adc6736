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
//! 1. Split. The incumbent `I` leads every shard. On the shards of set
//!    `X` (never shard 0), `I`'s connections to the other members stall;
//!    once they stop hearing `I` there (an election timeout), a challenger
//!    `C` campaigns (its timer may fire at any tick: it has heard no
//!    leader there since the stall) and takes `X`, and `I` follows it. `I`
//!    keeps the other shards, `Y`, and `C` follows it there, so each keeps
//!    the other's shards replicated.
//! 2. Swap. `I` and `C` are cut from each other (a partial partition: the
//!    other members, the pivots, reach both); `I`'s connections to the
//!    pivots and its timer stall on `Y`, and `C`'s on `X`, so that neither
//!    learns it lost them. Once the pivots stop hearing them, `I` takes
//!    `X` and `C` takes `Y`.
//! 3. Now `I` leads `X` and believes it leads `Y`; `C` leads `Y` and
//!    believes it leads `X`. Both take client writes for a while.
//!
//! In the restart variant the pivots crash and restart (down one tick) at
//! the swap instead of waiting out an election timeout, and the swap's
//! campaigns start at once: that is the schedule the restart vote hold is
//! for, since a restarted pivot would otherwise vote at once while the
//! leases it vouched for still run.

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
const HURRY_INTERVAL_TICKS: u64 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The challenger takes the shards of `x`.
    Split,
    /// The incumbent takes `x` and the challenger `y`.
    Swap,
    /// Both believe they lead every shard; runs until the tick.
    Hold { until_tick: u64 },
}

#[derive(Debug, Clone)]
pub(super) struct Episode {
    incumbent: usize,
    challenger: usize,
    pivots: Vec<usize>,
    /// Shards the challenger takes at the split, and the incumbent at the
    /// swap.
    x: Vec<usize>,
    /// Shards the incumbent keeps at the split, and the challenger takes
    /// at the swap.
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
        let (inc, ch) = (ep.incumbent, ep.challenger);
        match ep.phase {
            Phase::Split => {
                let c_took_x =
                    ep.x.iter()
                        .all(|s| self.members[ch].shards[*s].leads_with_noop_applied());
                let i_left_x =
                    ep.x.iter()
                        .all(|s| !self.members[inc].shards[*s].is_leader());
                let i_kept_y =
                    ep.y.iter()
                        .all(|s| self.members[inc].shards[*s].leads_with_noop_applied());
                if c_took_x && i_left_x && i_kept_y {
                    self.begin_step(|| {
                        format!(
                            "episode: n{} leads shards {:?}, n{} leads {:?}; swap",
                            ch + 1,
                            ep.x,
                            inc + 1,
                            ep.y
                        )
                    });
                    // From now on the two hear nothing of each other.
                    let (inc_id, ch_id) = (self.members[inc].id, self.members[ch].id);
                    self.base_links = vec![(inc_id, ch_id), (ch_id, inc_id)];
                    for s in &ep.x {
                        self.shard_links[*s].retain(|c| c.from != inc_id);
                    }
                    self.stall_leader_on(inc, &ep.pivots, &ep.y);
                    self.stall_leader_on(ch, &ep.pivots, &ep.x);
                    self.apply_links();
                    if ep.via_restart {
                        self.restart_pivots(&ep.pivots);
                    }
                    let tick = self.tick;
                    if let Some(e) = self.episode.as_mut() {
                        e.phase = Phase::Swap;
                        e.phase_since_tick = tick;
                        e.last_hurry_tick = 0;
                    }
                    self.end_step()?;
                } else if elapsed > MAX_PHASE_TICKS || !i_kept_y {
                    self.end_episode("the split did not come about")?;
                } else if elapsed >= ELECTION_TIMEOUT_TICKS {
                    self.hurry(ch, &ep.x, ep.last_hurry_tick)?;
                }
            }
            Phase::Swap => {
                let both = [inc, ch]
                    .iter()
                    .all(|m| self.members[*m].may_assign(Guard::NoGuard).is_ok());
                let wait = if ep.via_restart {
                    1
                } else {
                    ELECTION_TIMEOUT_TICKS
                };
                if both {
                    let hold = self
                        .rng
                        .gen_range(ELECTION_TIMEOUT_TICKS..=3 * ELECTION_TIMEOUT_TICKS);
                    let until_tick = self.tick + hold;
                    self.begin_step(|| {
                        format!(
                            "episode: n{} (stale on shards {:?}) and n{} (stale on {:?}) each believe they lead every shard, until t{until_tick}",
                            inc + 1,
                            ep.y,
                            ch + 1,
                            ep.x
                        )
                    });
                    if let Some(e) = self.episode.as_mut() {
                        e.phase = Phase::Hold { until_tick };
                    }
                    self.stats.episodes_held += 1;
                    self.end_step()?;
                } else if elapsed > MAX_PHASE_TICKS {
                    self.end_episode("the swap did not come about")?;
                } else if elapsed >= wait && self.tick >= ep.last_hurry_tick + HURRY_INTERVAL_TICKS
                {
                    self.hurry(inc, &ep.x, 0)?;
                    self.hurry(ch, &ep.y, 0)?;
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
        let Some(incumbent) = self
            .running()
            .into_iter()
            .find(|i| self.members[*i].may_assign(Guard::NoGuard).is_ok())
        else {
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
        // A challenger whose log on every shard is at least as up to date
        // as every pivot's, so that it can win their votes (Raft paper
        // 5.4.1).
        let log_rank = |m: usize, s: usize| {
            self.members[m].shards[s].node.as_ref().map_or((0, 0), |n| {
                let last = n.last_index();
                (n.term_of(last).unwrap_or(0), last)
            })
        };
        let caught_up: Vec<usize> = others
            .iter()
            .copied()
            .filter(|c| {
                (0..self.shard_count)
                    .all(|s| others.iter().all(|o| log_rank(*c, s) >= log_rank(*o, s)))
            })
            .collect();
        let Some(&challenger) = caught_up.choose(&mut self.rng) else {
            return Ok(());
        };
        let pivots: Vec<usize> = others.into_iter().filter(|i| *i != challenger).collect();
        // The incumbent keeps shard 0 at the split, so the transfers it asks
        // for travel on the shards of `x`, which are cut between the two.
        let mut shards: Vec<usize> = (1..self.shard_count).collect();
        shards.shuffle(&mut self.rng);
        let k = self.rng.gen_range(1..=shards.len());
        let mut x = shards[..k].to_vec();
        let mut y = shards[k..].to_vec();
        y.push(0);
        x.sort_unstable();
        y.sort_unstable();
        let via_restart = self.rng.gen_range(0..1000) < self.plan.restart_episode_per_mille;
        let (inc_id, ch_id) = (self.members[incumbent].id, self.members[challenger].id);
        self.begin_step(|| {
            format!(
                "episode{}: n{inc_id} | n{ch_id}, pivots {:?}; n{ch_id} is to take shards {x:?}, then swap with n{inc_id}'s {y:?}",
                if via_restart { " (via restarts)" } else { "" },
                pivots.iter().map(|p| p + 1).collect::<Vec<_>>()
            )
        });
        self.stats.episodes += 1;
        // Until the swap only the incumbent's connections on `x` stall, to
        // the pivots and to the challenger; the challenger's to the
        // incumbent stay up, so that each keeps replicating the shards the
        // other leads and can win the pivots' votes for them later.
        self.base_links.clear();
        for l in &mut self.shard_links {
            l.clear();
        }
        self.pivots = pivots.iter().map(|p| self.members[*p].id).collect();
        self.partial_until = None;
        self.cut_from(incumbent, &pivots, &x);
        self.cut_from(incumbent, &[challenger], &x);
        self.apply_links();
        self.episode = Some(Episode {
            incumbent,
            challenger,
            pivots,
            x,
            y,
            via_restart,
            phase: Phase::Split,
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
    /// lead. In the restart variant this may be sooner than an election
    /// timeout after it last heard a leader: Raft's safety, and the lease's
    /// argument, rest on what voters grant, never on when candidates
    /// campaign, so a hurried candidate only widens the schedules explored
    /// (as a campaign requested by an operator would).
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

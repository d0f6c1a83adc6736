//! The stale-view episode (several shards): a scripted adversary that steers
//! the members into the schedule of docs/KEYSPACE.md ("Leader leases:
//! closing the stale view"), where two members each believe they lead every
//! shard and each truly leads some. Both counters would then hand out
//! revisions, each in its own epoch, and writes acknowledged by one would
//! be ordered before writes acknowledged earlier by the other. The leases
//! on every shard and a restarted member's vote hold are what keep the
//! counters from being open at once; this episode is how the simulation
//! checks them.
//!
//! Random faults rarely build that state: check-quorum makes a leader that
//! stops hearing a quorum step down within an election timeout, and the
//! stale view must last on both sides at once. The episode builds it with
//! faults that each happen in real deployments (a connection of one shard
//! lost, a partition between two members that both still reach the rest,
//! the timer of a shard on a starved core, a quick restart), timed against
//! the run:
//!
//! 1. The incumbent `I` has its counter open (it leads every shard). Its
//!    links on the shards of `X` (never shard 0) to every other member are
//!    cut one way, out of `I`; the challenger `C` is made to campaign there
//!    until it leads them, while `I` keeps `Y`, the other shards, and
//!    follows `C` on `X`.
//! 2. Swap: `I` and `C` are cut from each other both ways; the other
//!    members, the pivots, reach both. On `Y`, `I`'s links to the pivots
//!    are cut and its timer stalls (no check-quorum step-down, no lease
//!    round); on `X` the same for `C`. `I` is made to campaign on `X` and
//!    `C` on `Y` until each leads them. In half the episodes the pivots
//!    restart at the swap instead, so that only their vote hold keeps them
//!    from voting at once.
//! 3. Hold: `I` leads `X` and believes it leads `Y`; `C` leads `Y` and
//!    believes it leads `X`; clients write through both, for two to five
//!    election timeouts. Then every link and timer is restored.
//!
//! A phase that does not reach its state within [`PHASE_BOUND`] ends the
//! episode (the links and timers are restored); the run goes on with
//! random faults either way.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::raft;
use crate::routing::ShardId;
use crate::server::revisions::RevisionCounter;

use super::checks::{driver_stopped, status_of, violation, DriverViolationKind as Kind};
use super::world::{World, ELECTION_TICKS, TICK};

/// Longest a phase waits for its leaders before the episode is given up.
const PHASE_BOUND: Duration = TICK.saturating_mul(8 * ELECTION_TICKS as u32);
/// Fewest time left of the clients' writes for an episode to begin.
const MIN_TIME_LEFT: Duration = TICK.saturating_mul(10 * ELECTION_TICKS as u32);
/// How often a phase looks at the leaders and hurries the campaigns it
/// waits for.
const STEP: Duration = TICK.saturating_mul(2);

/// Runs one episode, if a member's counter opens within [`PHASE_BOUND`]
/// and the clients still write for long enough (until `until`).
pub async fn run(world: &Rc<World>, until: Instant) {
    if until.saturating_duration_since(Instant::now()) < MIN_TIME_LEFT {
        return;
    }
    world.heal();
    let Some(incumbent) = keyspace_leader(world).await else {
        return;
    };
    let ids = world.up_ids();
    if ids.len() < 3 || ids.len() != world.ids().len() {
        return;
    }
    let others: Vec<u64> = ids.iter().copied().filter(|&m| m != incumbent).collect();
    let challenger = others[world.gen_range(0..others.len())];
    let pivots: Vec<u64> = others
        .iter()
        .copied()
        .filter(|&m| m != challenger)
        .collect();
    let shards = world.shards() as ShardId;
    let mut x: Vec<ShardId> = (1..shards).filter(|_| world.chance(500)).collect();
    if x.is_empty() {
        x.push(world.gen_range(1..shards));
    }
    let y: Vec<ShardId> = (0..shards).filter(|s| !x.contains(s)).collect();
    let via_restart = world.chance(500);
    // A txn over several shards that holds a shard the stale leader truly
    // leads keeps that shard's writes waiting behind its parts on the
    // shards it lost, which cannot commit; half the episodes have the
    // clients send single-shard writes only, so that the stale view meets
    // the writes it could misorder.
    world.txns_paused.set(world.chance(500));
    world
        .stale_view_episodes
        .set(world.stale_view_episodes.get() + 1);
    let (inc, ch) = (incumbent, challenger);
    world.note(|| format!("stale view: n{inc} leads; n{ch} takes shards {x:?}"));
    if split(world, inc, ch, &others, &x, &y).await
        && swap(world, inc, ch, &pivots, &x, &y, via_restart).await
    {
        // Counted only while the clients still write through it.
        if Instant::now() < until {
            world.stale_views.set(world.stale_views.get() + 1);
        }
        world.note(|| {
            format!(
                "stale view: n{inc} leads {x:?} and believes it leads {y:?}; n{ch} the other way"
            )
        });
        let hold =
            TICK.saturating_mul(world.gen_range(2 * ELECTION_TICKS..=5 * ELECTION_TICKS) as u32);
        tokio::time::sleep_until((Instant::now() + hold).min(until)).await;
    }
    world.note(|| "stale view: links and timers restored".to_string());
    world.txns_paused.set(false);
    world.heal();
}

/// The member whose counter opens first, within [`PHASE_BOUND`].
async fn keyspace_leader(world: &World) -> Option<u64> {
    let deadline = Instant::now() + PHASE_BOUND;
    while Instant::now() < deadline {
        let open = world
            .up_ids()
            .into_iter()
            .find(|&m| counter_of(world, m).is_some_and(|c| c.is_open()));
        if open.is_some() {
            return open;
        }
        tokio::time::sleep(STEP).await;
    }
    None
}

/// The leader of `shard` as member `id` sees it (NONE when it cannot say).
async fn leader_seen_by(world: &World, id: u64, shard: ShardId) -> u64 {
    status_of(world, id, shard)
        .await
        .map_or(raft::NONE, |s| s.leader)
}

/// Whether member `id` leads each of `shards` with every entry of earlier
/// terms applied, as its revision counter sees it.
fn ready_on(world: &World, id: u64, shards: &[ShardId]) -> bool {
    counter_of(world, id).is_some_and(|c| shards.iter().all(|&s| c.is_shard_ready(s)))
}

/// Member `id`'s revision counter, while it runs.
fn counter_of(world: &World, id: u64) -> Option<Arc<RevisionCounter>> {
    Some(world.router(id)?.keyspace.as_ref()?.counter.clone())
}

/// Whether every one of `shards` is led by `leader` as each of `members`
/// sees it.
async fn all_see(world: &World, members: &[u64], shards: &[ShardId], leader: u64) -> bool {
    for &m in members {
        for &s in shards {
            if leader_seen_by(world, m, s).await != leader {
                return false;
            }
        }
    }
    true
}

/// Makes `candidate` campaign on each of `shards` it does not lead.
async fn hurry(world: &World, candidate: u64, shards: &[ShardId]) {
    for &s in shards {
        if leader_seen_by(world, candidate, s).await != candidate {
            world.timer(candidate, s).campaign();
        }
    }
}

/// Phase 1: the challenger takes `x` while the incumbent keeps `y`.
async fn split(
    world: &World,
    inc: u64,
    ch: u64,
    others: &[u64],
    x: &[ShardId],
    y: &[ShardId],
) -> bool {
    for &s in x {
        for &o in others {
            world.cut_shard(inc, o, s);
        }
    }
    let deadline = Instant::now() + PHASE_BOUND;
    while Instant::now() < deadline {
        tokio::time::sleep(STEP).await;
        if ready_on(world, ch, x) && ready_on(world, inc, y) && all_see(world, &[inc], x, ch).await
        {
            return true;
        }
        hurry(world, ch, x).await;
    }
    false
}

/// Phase 2: the incumbent takes `x` and the challenger `y`, each kept from
/// learning that it lost the other shards.
async fn swap(
    world: &Rc<World>,
    inc: u64,
    ch: u64,
    pivots: &[u64],
    x: &[ShardId],
    y: &[ShardId],
    via_restart: bool,
) -> bool {
    world.cut(inc, ch);
    world.cut(ch, inc);
    for &p in pivots {
        for &s in x {
            world.uncut_shard(inc, p, s);
            world.cut_shard(ch, p, s);
        }
        for &s in y {
            world.cut_shard(inc, p, s);
        }
    }
    for &s in y {
        world.timer(inc, s).stall(true);
    }
    for &s in x {
        world.timer(ch, s).stall(true);
    }
    if via_restart {
        for &p in pivots {
            if let Err(e) = world.crash(p).await {
                world.note_failure(driver_stopped(e));
                return false;
            }
            world.crashes.set(world.crashes.get() + 1);
            if let Err(e) = world.start(p).await {
                world.note_failure(violation(Kind::RestartFailed, e));
                return false;
            }
        }
    }
    let deadline = Instant::now() + PHASE_BOUND;
    while Instant::now() < deadline {
        let every = [x, y].concat();
        if ready_on(world, inc, &every)
            && ready_on(world, ch, &every)
            && all_see(world, pivots, x, inc).await
            && all_see(world, pivots, y, ch).await
        {
            return true;
        }
        hurry(world, inc, x).await;
        hurry(world, ch, y).await;
        tokio::time::sleep(STEP).await;
    }
    false
}

//! The faults of one seed: rates drawn from the seed, random crashes,
//! partitions, one-way cuts, loss and leader transfers (etcd's MoveLeader,
//! asked of the leader seen last), and an adversary aimed at leaders
//! (Raft paper figure 8): a newly elected leader struck before its entries
//! reach a quorum, a leader struck right after its commit index moves.
//! Leaders are recognised on the wire: a member sending appends or
//! heartbeats in a term leads it.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use crate::raft::{self, MessageType};
use crate::routing::ShardId;
use crate::server::command::ShardCommand;

use super::checks::{driver_stopped, violation, DriverViolationKind as Kind};
use super::world::World;

/// The fault rates of one seed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Longest pause between two random faults.
    max_fault_gap_ms: u64,
    /// Weights of the random faults: crash, isolate, one-way cut, heal,
    /// change the loss rate, transfer the leadership.
    weights: [u32; 6],
    /// Highest loss rate, per mille.
    max_drop_per_mille: u32,
    /// Longest a crashed member stays down.
    max_down_ms: u64,
    /// Chance that a newly elected leader is struck.
    new_leader_doom_per_mille: u32,
    /// Chance that a leader is struck right after its commit index moves.
    committed_doom_per_mille: u32,
    /// Latest a doomed leader is struck.
    max_doom_delay_ms: u64,
    /// Share of strikes that crash rather than cut off (a crash lets the
    /// messages already sent arrive; a cut does not).
    doom_crash_per_mille: u32,
    /// With several shards, half the seeds: how long after the faults
    /// begin a stale-view episode runs (see [`super::stale_view`]).
    stale_view_after: Option<Duration>,
}

impl Plan {
    /// The rates of a seed; on a figure-8 seed ([`World::figure8`]) new
    /// leaders and leaders whose commit index moved are struck far more
    /// often, and at once: logs then diverge over many short terms, where
    /// committing an entry of an earlier term by counting goes wrong.
    pub fn draw(world: &World) -> Plan {
        let mut plan = Plan {
            max_fault_gap_ms: world.gen_range(30..=300),
            weights: [
                world.gen_range(0..=30),
                world.gen_range(0..=25),
                world.gen_range(0..=15),
                world.gen_range(5..=30),
                world.gen_range(0..=15),
                world.gen_range(0..=15),
            ],
            max_drop_per_mille: world.gen_range(0..=250),
            max_down_ms: world.gen_range(20..=600),
            new_leader_doom_per_mille: world.gen_range(0..=500),
            committed_doom_per_mille: world.gen_range(0..=50),
            max_doom_delay_ms: world.gen_range(0..=30),
            doom_crash_per_mille: world.gen_range(0..=1000),
            stale_view_after: None,
        };
        // No draw with one shard: its seeds run as they always did.
        if world.shards() > 1 && world.chance(500) {
            plan.stale_view_after = Some(Duration::from_millis(world.gen_range(0..=500)));
        }
        if world.figure8_script.is_some() {
            // The script strikes leaders itself, at its own moments.
            plan.new_leader_doom_per_mille = 0;
            plan.committed_doom_per_mille = 0;
        } else if world.figure8 {
            plan.new_leader_doom_per_mille = world.gen_range(200..=500);
            plan.committed_doom_per_mille = world.gen_range(50..=300);
            plan.max_doom_delay_ms = 0;
            plan.doom_crash_per_mille = world.gen_range(0..=200);
        }
        plan
    }
}

/// What the adversary saw of leadership on the wire.
#[derive(Default)]
pub struct LeaderWatch {
    /// Every term's leader, from the first append or heartbeat it sent (all
    /// the time, not only during the faults).
    leader_of: std::cell::RefCell<std::collections::BTreeMap<u64, u64>>,
    /// The newest (term, leader) seen.
    leader: Cell<(u64, u64)>,
    /// The highest commit index a leader sent.
    commit: Cell<u64>,
}

impl LeaderWatch {
    /// Election safety on the wire: only a term's one leader sends appends
    /// and heartbeats in it.
    pub fn check(&self, msg: &raft::Message) -> Result<(), super::DriverViolation> {
        let t = msg.msg_type();
        if t != MessageType::MsgApp && t != MessageType::MsgHeartbeat {
            return Ok(());
        }
        let mut leader_of = self.leader_of.borrow_mut();
        let leader = *leader_of.entry(msg.term).or_insert(msg.from);
        if leader != msg.from {
            return Err(violation(
                Kind::TwoLeaders,
                format!(
                    "members {leader} and {} both sent {t:?} as leaders of term {}",
                    msg.from, msg.term
                ),
            ));
        }
        Ok(())
    }

    /// Looks at a message a member sends; returns the member to strike
    /// when it is a leader the adversary picks.
    pub fn observe(&self, world: &World, plan: &Plan, msg: &raft::Message) -> Option<u64> {
        let t = msg.msg_type();
        if t != MessageType::MsgApp && t != MessageType::MsgHeartbeat {
            return None;
        }
        let (term, _) = self.leader.get();
        if msg.term > term {
            self.leader.set((msg.term, msg.from));
            if world.chance(plan.new_leader_doom_per_mille) {
                return Some(msg.from);
            }
        }
        if msg.commit > self.commit.get() {
            self.commit.set(msg.commit);
            if world.chance(plan.committed_doom_per_mille) {
                return Some(msg.from);
            }
        }
        None
    }

    /// The leader of the newest term seen on the wire.
    pub fn leader(&self) -> Option<u64> {
        self.newest().map(|(_, leader)| leader)
    }

    /// The newest term seen on the wire, and its leader.
    pub fn newest(&self) -> Option<(u64, u64)> {
        self.leader_of
            .borrow()
            .last_key_value()
            .map(|(&term, &leader)| (term, leader))
    }
}

/// Strikes `id` soon: crashes it (restarted later) or cuts it off.
pub fn doom(world: &Rc<World>, plan: &Plan, id: u64) {
    let delay = Duration::from_millis(world.gen_range(0..=plan.max_doom_delay_ms));
    let crash = world.chance(plan.doom_crash_per_mille);
    let plan = plan.clone();
    let what = move || format!("a fault striking member {id}");
    let task = {
        let world = world.clone();
        async move {
            tokio::time::sleep(delay).await;
            if !world.in_chaos() {
                return;
            }
            if crash {
                crash_and_restart(&world, &plan, id).await;
            } else {
                isolate(&world, id, None);
            }
        }
    };
    world.spawn_checked(what, task);
}

/// Cuts `id` off from every other member, both ways: on `shard` alone, or
/// on every shard.
pub fn isolate(world: &World, id: u64, shard: Option<ShardId>) {
    world.partitions.set(world.partitions.get() + 1);
    for other in world.ids().into_iter().filter(|&o| o != id) {
        cut(world, id, other, shard);
        cut(world, other, id, shard);
    }
}

/// With several shards, half the time: one shard whose links alone a cut
/// takes (a lane's connection lost), so that a member may reach a peer on
/// one shard and not on another. None: every shard's.
fn one_shard(world: &World) -> Option<ShardId> {
    let shards = world.shards() as ShardId;
    (shards > 1 && world.chance(500)).then(|| world.gen_range(0..shards))
}

/// Cuts the link from `from` to `to`, of `shard` alone or of every shard.
fn cut(world: &World, from: u64, to: u64, shard: Option<ShardId>) {
    match shard {
        Some(s) => world.cut_shard(from, to, s),
        None => world.cut(from, to),
    }
}

/// Crashes `id` and restarts it a while later, while the faults last.
async fn crash_and_restart(world: &Rc<World>, plan: &Plan, id: u64) {
    match world.crash_in_chaos(id).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            world.note_failure(driver_stopped(e));
            return;
        }
    }
    world.crashes.set(world.crashes.get() + 1);
    let after = Duration::from_millis(world.gen_range(20..=plan.max_down_ms));
    let what = move || format!("the restart of member {id}");
    let task = {
        let world = world.clone();
        async move {
            tokio::time::sleep(after).await;
            if !world.is_up(id) {
                if let Err(e) = world.start(id).await {
                    world.note_failure(violation(Kind::RestartFailed, e));
                }
            }
        }
    };
    world.spawn_checked(what, task);
}

/// Random faults until `until`.
pub async fn run(world: &Rc<World>, plan: &Plan, until: Instant) {
    let total: u32 = plan.weights.iter().sum::<u32>().max(1);
    let mut stale_view_at = plan.stale_view_after.map(|after| Instant::now() + after);
    while Instant::now() < until {
        if stale_view_at.is_some_and(|at| Instant::now() >= at) {
            super::stale_view::run(world, until).await;
            // At least a millisecond on: an episode that could not begin
            // may have taken no time at all.
            stale_view_at = plan
                .stale_view_after
                .map(|after| Instant::now() + after.max(Duration::from_millis(1)));
            continue;
        }
        let gap = world.gen_range(5..=plan.max_fault_gap_ms);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        // Membership changes add and remove members meanwhile.
        let ids = world.ids();
        let pick = ids[world.gen_range(0..ids.len())];
        let mut roll = world.gen_range(0..total);
        let mut kind = 0;
        while kind < plan.weights.len() - 1 && roll >= plan.weights[kind] {
            roll -= plan.weights[kind];
            kind += 1;
        }
        if world.note_stopped_driver().await {
            return;
        }
        match kind {
            0 => crash_and_restart(world, plan, pick).await,
            1 => isolate(world, pick, one_shard(world)),
            2 => {
                let other = ids[world.gen_range(0..ids.len())];
                let shard = one_shard(world);
                if other != pick {
                    world.partitions.set(world.partitions.get() + 1);
                    cut(world, pick, other, shard);
                }
            }
            3 => world.heal(),
            4 => world
                .drop_per_mille
                .set(world.gen_range(0..=plan.max_drop_per_mille)),
            _ => transfer(world, pick),
        }
    }
}

/// Asks the member seen leading last to hand its leadership to `to`. A
/// transfer the leader starts is counted; one it refuses (it no longer
/// leads, `to` is itself or behind) is not.
fn transfer(world: &Rc<World>, to: u64) {
    let Some(leader) = world.leader_seen().filter(|&l| l != to) else {
        return;
    };
    let Some(commands) = world.commands(leader) else {
        return;
    };
    let (reply, answer) = crate::server::command::Reply::channel();
    if commands
        .try_send(ShardCommand::TransferLeader { to, reply })
        .is_err()
    {
        return;
    }
    let what = move || format!("the transfer of shard 0's leadership to member {to}");
    let task = {
        let world = world.clone();
        async move {
            if let Ok(Ok(())) = answer.await {
                world.transfers.set(world.transfers.get() + 1);
            }
        }
    };
    world.spawn_checked(what, task);
}

//! The scripted adversary of Raft paper figure 8 (5.4.2), played on some
//! figure-8 seeds in place of the random faults. It only cuts and heals
//! links, and shortens appends on the wire; each round:
//!
//! 1. The leader `L` of term `t1` is cut off. The clients' puts that reach
//!    it land in its log alone: entries of `t1` no other member has.
//! 2. The others elect a leader `M` of term `t2`. It is cut off the moment
//!    it first sends as leader, so its entry of `t2`, at index `j`, stays
//!    with it.
//! 3. `L` is let back to the members other than `M`, in a star (no link
//!    between them, so only `L` can gather their votes). It wins a term
//!    `t3` and replicates its entries of `t1`. Its appends arrive only up to
//!    their first entry of `t3`, as if each had been split in two and the
//!    second part lost: nothing of `t3` reaches a quorum.
//! 4. A correct `L` cannot commit index `j` now: Raft commits an entry of
//!    an earlier term only under one of the leader's own term. An `L` that
//!    commits `j` by counting replicas is cut off the moment it first sends
//!    that commit index, before anyone learns it.
//! 5. `M` is let back to the same members, in a star. Its last term `t2`
//!    beats their `t1`: it wins and replaces index `j` with its own entry.
//!    Once every link heals, `L`'s core is told to replace an entry it
//!    committed, and the put it may have acknowledged at `j` is gone.
//!
//! A step that does not come about within its bound ends the round with
//! every link healed, and the next round starts.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use crate::raft::{self, MessageType};

use super::faults::isolate;
use super::world::World;

/// Longest each step of a round may take to come about: a few election
/// timeouts.
const STEP_BOUND: Duration = Duration::from_millis(1_500);
/// How long `M` is given to win and overwrite index `j` before every link
/// heals.
const OVERWRITE_MS: u64 = 800;
/// How long the group runs healed after a round before the next one.
const HEALED_MS: std::ops::Range<u64> = 150..400;

/// Where a round stands; the members are `old` (`L`) and `new` (`M`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Step {
    #[default]
    Idle,
    /// `L`, leader of `term`, is cut off; waiting for another leader.
    OldCut { old: u64, term: u64 },
    /// `M` led `term` from index `conflict` (0: unseen) and is cut off.
    NewCut {
        old: u64,
        new: u64,
        term: u64,
        conflict: u64,
    },
    /// `L` leads `term` again; its appends stop at their first entry of it.
    OldLeads {
        old: u64,
        new: u64,
        term: u64,
        conflict: u64,
    },
    /// `L` committed index `conflict` by counting and is cut off.
    Committed { old: u64, new: u64 },
}

/// The round under way, which the network consults on every message.
#[derive(Default)]
pub struct Figure8 {
    step: Cell<Step>,
}

impl Figure8 {
    /// Looks at a message `from` sends, before the network carries it: cuts
    /// `M` or `L` off when their moment comes, and shortens `L`'s appends.
    /// Returns false when the message is lost.
    pub fn on_send(&self, world: &World, from: u64, msg: &mut raft::Message) -> bool {
        let t = msg.msg_type();
        if t != MessageType::MsgApp && t != MessageType::MsgHeartbeat {
            return true;
        }
        match self.step.get() {
            Step::OldCut { old, term } if from != old && msg.term > term => {
                // A new leader's first append carries its term's first entry.
                let conflict = msg
                    .entries
                    .iter()
                    .find(|e| e.term == msg.term)
                    .map_or(0, |e| e.index);
                isolate(world, from, None);
                self.step.set(Step::NewCut {
                    old,
                    new: from,
                    term: msg.term,
                    conflict,
                });
            }
            Step::NewCut {
                old,
                new,
                term,
                conflict,
            } if from == old && msg.term > term => {
                self.step.set(Step::OldLeads {
                    old,
                    new,
                    term: msg.term,
                    conflict,
                });
                return self.on_old_leader(world, msg);
            }
            Step::OldLeads { old, .. } if from == old => return self.on_old_leader(world, msg),
            _ => {}
        }
        true
    }

    fn on_old_leader(&self, world: &World, msg: &mut raft::Message) -> bool {
        let Step::OldLeads {
            old,
            new,
            term,
            conflict,
        } = self.step.get()
        else {
            return true;
        };
        if msg.term != term {
            return true;
        }
        if msg.commit >= conflict {
            isolate(world, old, None);
            self.step.set(Step::Committed { old, new });
            return true;
        }
        // An append that follows an entry of `t3` is lost whole: the
        // follower would only refuse it, and the leader back off and send
        // it again, over and over.
        if msg.msg_type() == MessageType::MsgApp && msg.log_term == term {
            return false;
        }
        if let Some(own) = msg.entries.iter().position(|e| e.term == term) {
            msg.entries.truncate(own);
        }
        true
    }

    /// Waits until the round reaches a step `reached` accepts; false when
    /// it did not within [`STEP_BOUND`] or before `until`.
    async fn wait_for(&self, until: Instant, reached: impl Fn(Step) -> bool) -> bool {
        let deadline = (Instant::now() + STEP_BOUND).min(until);
        while !reached(self.step.get()) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

/// Links only between `center` and each member but `center` and `left_out`.
fn star(world: &World, center: u64, left_out: u64) {
    world.partitions.set(world.partitions.get() + 1);
    let ids = world.ids();
    for &a in &ids {
        for &b in &ids {
            if a != b {
                world.cut(a, b);
            }
        }
    }
    for &other in &ids {
        if other != center && other != left_out {
            world.connect(center, other);
        }
    }
}

/// Plays rounds until `until`; every link is healed when it returns, and
/// a driver the last round stopped has been seen.
pub async fn run(world: &Rc<World>, script: &Figure8, until: Instant) {
    while Instant::now() < until {
        script.step.set(Step::Idle);
        world.heal();
        let healed = world.gen_range(HEALED_MS);
        tokio::time::sleep(Duration::from_millis(healed)).await;
        if world.note_stopped_driver().await {
            break;
        }
        let Some((term, old)) = world.newest_leader() else {
            continue;
        };
        if Instant::now() >= until || !world.is_up(old) {
            continue;
        }
        script.step.set(Step::OldCut { old, term });
        isolate(world, old, None);
        if !script
            .wait_for(until, |s| matches!(s, Step::NewCut { .. }))
            .await
        {
            continue;
        }
        let Step::NewCut { new, conflict, .. } = script.step.get() else {
            continue;
        };
        if conflict == 0 {
            continue;
        }
        star(world, old, new);
        if !script
            .wait_for(until, |s| matches!(s, Step::Committed { .. }))
            .await
        {
            continue;
        }
        star(world, new, old);
        tokio::time::sleep(Duration::from_millis(OVERWRITE_MS)).await;
        // Healed, `L` learns of `M`'s term and log.
        world.heal();
        tokio::time::sleep(Duration::from_millis(HEALED_MS.start)).await;
    }
    script.step.set(Step::Idle);
    world.heal();
    tokio::time::sleep(Duration::from_millis(HEALED_MS.end)).await;
    world.note_stopped_driver().await;
}

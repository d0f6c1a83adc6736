//! The simulated network: per-message drop, duplication and delay, delivery
//! in random order among the messages that are due, and a set of blocked
//! directed links for symmetric and one-way partitions.

use std::collections::BTreeSet;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::{MAX_DELAY_TICKS, MAX_IN_FLIGHT_MESSAGES};
use crate::raft::Message;

/// Between 1 and `members.len()` random one-way links among `members` to
/// cut (a link from a member to itself is left out).
pub(crate) fn random_one_way_links(rng: &mut SmallRng, members: &[u64]) -> Vec<(u64, u64)> {
    let n = rng.gen_range(1..=members.len());
    let mut links = Vec::new();
    for _ in 0..n {
        let a = *members.choose(rng).expect("non-empty");
        let b = *members.choose(rng).expect("non-empty");
        if a != b {
            links.push((a, b));
        }
    }
    links
}

/// How unreliable the network is right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Faults {
    pub drop_per_mille: u32,
    pub duplicate_per_mille: u32,
    pub max_delay_ticks: u64,
}

impl Faults {
    /// A network that delivers everything within the tick, in random order.
    pub fn calm() -> Self {
        Faults {
            drop_per_mille: 0,
            duplicate_per_mille: 0,
            max_delay_ticks: 0,
        }
    }
}

/// What became of a message handed to the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendFate {
    Queued {
        copies: u32,
    },
    /// The link is cut: the sender's transport would see the peer as
    /// unreachable.
    Blocked,
    Dropped,
}

pub(crate) struct Network {
    /// Messages whose delay has passed; delivered in random order.
    due: Vec<Message>,
    /// `(deliver_at_tick, message)`.
    delayed: Vec<(u64, Message)>,
    /// Directed links `(from, to)` that carry nothing.
    blocked: BTreeSet<(u64, u64)>,
    pub faults: Faults,
}

impl Network {
    pub fn new(faults: Faults) -> Self {
        Network {
            due: Vec::new(),
            delayed: Vec::new(),
            blocked: BTreeSet::new(),
            faults,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.due.len() + self.delayed.len()
    }

    pub fn is_blocked(&self, from: u64, to: u64) -> bool {
        self.blocked.contains(&(from, to))
    }

    pub fn send(&mut self, rng: &mut SmallRng, now_tick: u64, m: Message) -> SendFate {
        if self.is_blocked(m.from, m.to) {
            return SendFate::Blocked;
        }
        let f = self.faults;
        if f.drop_per_mille > 0 && rng.gen_range(0..1000) < f.drop_per_mille {
            return SendFate::Dropped;
        }
        let copies = if f.duplicate_per_mille > 0 && rng.gen_range(0..1000) < f.duplicate_per_mille
        {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.in_flight() >= MAX_IN_FLIGHT_MESSAGES {
                return SendFate::Dropped;
            }
            let delay = rng.gen_range(0..=f.max_delay_ticks.min(MAX_DELAY_TICKS));
            if delay == 0 {
                self.due.push(m.clone());
            } else {
                self.delayed.push((now_tick + delay, m.clone()));
            }
        }
        SendFate::Queued { copies }
    }

    /// Moves messages whose delay has passed into the deliverable set.
    pub fn advance_to(&mut self, now_tick: u64) {
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now_tick {
                let (_, m) = self.delayed.swap_remove(i);
                self.due.push(m);
            } else {
                i += 1;
            }
        }
    }

    pub fn due_count(&self) -> usize {
        self.due.len()
    }

    /// Takes a random due message: random choice among due messages is what
    /// reorders them.
    pub fn take_due(&mut self, rng: &mut SmallRng) -> Option<Message> {
        if self.due.is_empty() {
            return None;
        }
        let i = rng.gen_range(0..self.due.len());
        Some(self.due.swap_remove(i))
    }

    /// Cuts the given directed links only.
    pub fn partition_one_way(&mut self, links: &[(u64, u64)]) {
        self.blocked.clear();
        self.blocked.extend(links.iter().copied());
    }

    pub fn heal(&mut self) {
        self.blocked.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::MessageType;
    use rand::SeedableRng;

    fn msg(from: u64, to: u64) -> Message {
        Message {
            msg_type: MessageType::MsgHeartbeat as i32,
            from,
            to,
            term: 1,
            ..Default::default()
        }
    }

    #[test]
    fn one_way_partition_blocks_one_direction() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut n = Network::new(Faults::calm());
        n.partition_one_way(&[(1, 2)]);
        assert_eq!(n.send(&mut rng, 0, msg(1, 2)), SendFate::Blocked);
        assert_eq!(
            n.send(&mut rng, 0, msg(2, 1)),
            SendFate::Queued { copies: 1 }
        );
    }

    #[test]
    fn delayed_messages_become_due_in_time() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut n = Network::new(Faults {
            drop_per_mille: 0,
            duplicate_per_mille: 0,
            max_delay_ticks: 3,
        });
        for _ in 0..50 {
            n.send(&mut rng, 10, msg(1, 2));
        }
        n.advance_to(13);
        assert_eq!(n.due_count(), 50);
    }
}

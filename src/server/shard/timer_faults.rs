//! A starved core, as the simulation plays it on one shard of one member:
//! its timer stops firing (the shard still takes messages and commands,
//! but its Raft ticks, lease rounds and request timeouts wait), and the
//! ticks it missed arrive in one bunch when it fires again. The simulation
//! also makes a shard's election timer fire now (a campaign), to steer a
//! scripted schedule. The daemon never sets either: its shards run with
//! `ShardSetup::timer_faults` at `None`.
//!
//! The daemon's ticker delays a late tick rather than catch up, so there a
//! shard that was starved counts fewer ticks than time passed, and its
//! election and check-quorum timers run later than here, never sooner. The
//! keyspace leases do not depend on either: they are measured on the
//! monotonic clock.

use std::cell::Cell;

/// Most missed ticks delivered in one bunch when a stall ends.
const MAX_BUNCH: u64 = 64;

/// The timer faults of one shard of one member.
#[derive(Debug, Default)]
pub struct TimerFaults {
    stalled: Cell<bool>,
    missed: Cell<u64>,
    campaign: Cell<bool>,
}

impl TimerFaults {
    /// Stops or restarts the shard's timer.
    pub fn stall(&self, stalled: bool) {
        self.stalled.set(stalled);
    }

    /// Makes the shard campaign at its next tick, unless it leads.
    pub fn campaign(&self) {
        self.campaign.set(true);
    }

    /// The ticks the shard takes now its timer fired: none while stalled,
    /// else this one and those missed (at most [`MAX_BUNCH`] in all).
    pub(super) fn ticks_now(&self) -> u64 {
        if self.stalled.get() {
            self.missed.set(self.missed.get() + 1);
            return 0;
        }
        (self.missed.replace(0) + 1).min(MAX_BUNCH)
    }

    /// The shard's member crashed: the ticks it missed and a campaign asked
    /// of it are gone with the process, so that the restarted shard does
    /// not take the one in a bunch or campaign at its first tick. A stall
    /// stays: it is the core's, not the process's.
    pub fn crashed(&self) {
        self.missed.set(0);
        self.campaign.set(false);
    }

    /// Whether a campaign was asked for since the last tick taken.
    pub(super) fn take_campaign(&self) -> bool {
        !self.stalled.get() && self.campaign.replace(false)
    }
}

impl super::Shard {
    /// Takes the ticks of a timer that fired: one, or with `faults` none
    /// while stalled and the missed ones after, and the campaign asked for.
    /// Answers whether the timer fired for the shard at all.
    pub(super) fn raft_ticks(&mut self, faults: Option<&TimerFaults>) -> bool {
        let (ticks, campaign) = faults.map_or((1, false), |f| (f.ticks_now(), f.take_campaign()));
        if ticks == 0 {
            return false;
        }
        if self.failed.is_none() {
            for _ in 0..ticks {
                self.node.tick();
            }
            if campaign && self.node.leader_id() != self.member_id {
                let _ = self.node.campaign();
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_timer_gives_its_missed_ticks_in_one_bunch() {
        let t = TimerFaults::default();
        assert_eq!(t.ticks_now(), 1);
        t.stall(true);
        assert_eq!((t.ticks_now(), t.ticks_now(), t.ticks_now()), (0, 0, 0));
        t.campaign();
        assert!(
            !t.take_campaign(),
            "a stalled timer campaigns only when it fires"
        );
        t.stall(false);
        assert_eq!(t.ticks_now(), 4);
        assert!(t.take_campaign());
        assert!(!t.take_campaign());
        assert_eq!(t.ticks_now(), 1);
        t.stall(true);
        for _ in 0..200 {
            t.ticks_now();
        }
        t.stall(false);
        assert_eq!(t.ticks_now(), MAX_BUNCH);
    }

    #[test]
    fn a_crash_forgets_the_missed_ticks_and_the_campaign_but_not_the_stall() {
        let t = TimerFaults::default();
        t.stall(true);
        for _ in 0..5 {
            t.ticks_now();
        }
        t.campaign();
        t.crashed();
        assert_eq!(t.ticks_now(), 0, "still stalled");
        t.stall(false);
        assert_eq!(
            t.ticks_now(),
            2,
            "the tick missed since the restart, and this one"
        );
        assert!(!t.take_campaign());
    }
}

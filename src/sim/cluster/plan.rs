//! The fault and workload rates of one seed, drawn from the seed before the
//! run starts.

use rand::rngs::SmallRng;
use rand::Rng;

use crate::sim::network::Faults;
use crate::sim::{ELECTION_TIMEOUT_TICKS, MAX_CHAOS_TICKS, MAX_DELAY_TICKS, MIN_CHAOS_TICKS};

/// The fault and workload rates of one seed, drawn from the seed.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) chaos_ticks: u64,
    pub(super) chaos_faults: Faults,
    pub(super) crash_per_mille: u32,
    /// Crashes aimed at the current leader: the adversary of Raft paper
    /// figure 8, where leaders die between replicating and committing.
    pub(super) leader_crash_per_mille: u32,
    /// Chance that a newly elected leader crashes or is cut off within a few
    /// ticks, before its own entries reach a quorum: how the logs of Raft
    /// paper figure 8 come about.
    pub(super) new_leader_crash_per_mille: u32,
    /// Chance that a leader crashes or is cut off right after its commit
    /// index advances, before the followers learn of it.
    pub(super) committed_leader_crash_per_mille: u32,
    /// Latest a doomed leader is struck after it was elected.
    pub(super) max_doom_delay_ticks: u64,
    /// Share of doomed leaders that crash rather than being cut off (a
    /// crash lets the messages already sent arrive; a cut does not).
    pub(super) doom_crash_per_mille: u32,
    pub(super) max_down_ticks: u64,
    pub(super) partition_per_mille: u32,
    pub(super) heal_per_mille: u32,
    pub(super) max_proposals_per_tick: u32,
    pub(super) max_reads_per_tick: u32,
    pub(super) transfer_per_mille: u32,
    pub(super) conf_change_per_mille: u32,
    pub(super) compact_per_mille: u32,
    /// Share of disk writes that complete only in the next tick.
    pub(super) late_write_per_mille: u32,
}

impl Plan {
    pub(super) fn draw(rng: &mut SmallRng) -> Self {
        Plan {
            chaos_ticks: rng.gen_range(MIN_CHAOS_TICKS..=MAX_CHAOS_TICKS),
            chaos_faults: Faults {
                drop_per_mille: rng.gen_range(0..=250),
                duplicate_per_mille: rng.gen_range(0..=100),
                max_delay_ticks: rng.gen_range(0..=MAX_DELAY_TICKS),
            },
            crash_per_mille: rng.gen_range(0..=40),
            leader_crash_per_mille: rng.gen_range(0..=60),
            new_leader_crash_per_mille: rng.gen_range(0..=500),
            committed_leader_crash_per_mille: rng.gen_range(0..=50),
            max_doom_delay_ticks: rng.gen_range(0..=3),
            doom_crash_per_mille: rng.gen_range(0..=1000),
            max_down_ticks: rng.gen_range(1..=5 * ELECTION_TIMEOUT_TICKS),
            partition_per_mille: rng.gen_range(0..=40),
            heal_per_mille: rng.gen_range(20..=200),
            max_proposals_per_tick: rng.gen_range(0..=3),
            max_reads_per_tick: rng.gen_range(0..=2),
            transfer_per_mille: rng.gen_range(0..=30),
            conf_change_per_mille: rng.gen_range(0..=40),
            compact_per_mille: rng.gen_range(0..=100),
            late_write_per_mille: rng.gen_range(0..=300),
        }
    }
}

//! A deterministic simulator of one keyspace over several shards
//! (`docs/KEYSPACE.md`): every member runs one real
//! [`RawNode`](crate::raft::RawNode) per shard, each shard its own Raft
//! group, and one member at a time, the *keyspace leader*, hands out
//! revisions to the writes of every shard from one in-memory counter.
//!
//! One `u64` seed decides everything, as in the one-group simulator: the
//! network, crashes, pauses, disk-write completions and the client workload.
//! Replaying a seed replays the run exactly.
//!
//! # What a member is
//! A member is `S` shards (`S` in `1..=MAX_SHARDS`, drawn from the seed
//! unless fixed), each a `RawNode<MemStorage>` driven by the same Ready
//! contract as the one-group simulator (messages leave when the Ready is
//! taken; entries, hard state and the messages that wait for them only when
//! the shard's own simulated disk write completes), plus the keyspace state
//! kept in memory: the revision counter and, per shard, the leader lease.
//! Every shard of a member crashes and restarts together; each shard's
//! disk survives, the counter and the leases do not. Logs are never
//! compacted, so a restarted member replays each shard from index 1.
//!
//! Each shard's messages travel on their own simulated network (as they
//! would on their own connections); partitions cut a link between two
//! members on every shard's network at once.
//!
//! # Keyspace leadership
//! - Whoever leads shard 0 asks the leader of every other shard, once it is
//!   itself caught up there, to transfer that shard's leadership to it.
//! - A member may give a write a revision only while it leads every shard,
//!   has applied its current term's no-op in each (so every entry of earlier
//!   terms it holds), and its guard agrees. It then sets
//!   `counter = max(counter, largest revision applied in any shard) + 1`
//!   and proposes the write, stamped with that revision, to the write's
//!   shard. A write's entry carries `w<id> r<revision>`; members apply it at
//!   that revision.
//! - Clients send each write to a random live member (half the time to one
//!   that believes it leads shard 0); a member that may not assign refuses
//!   and the client retries at the next tick, a bounded number of times. A
//!   write is acknowledged when the member that proposed it applies it.
//!
//! # The guard ([`Guard`])
//! With a partial partition, two members can each believe they lead every
//! shard (`docs/KEYSPACE.md`, "Open: a stale view of leadership"). The
//! lease guard closes that: a member assigns revisions only while it holds,
//! on every shard, a lease that runs until
//! `start + ELECTION_TIMEOUT_TICKS - LEASE_MARGIN_TICKS`, where `start` is
//! the tick at which the newest ReadIndex round that came back was issued
//! (its ReadState proves a quorum heard the leader after `start`, and those
//! members refuse votes for an election timeout after hearing it). The lease
//! is dropped the moment the shard's leader starts a leader transfer (a
//! transfer campaign overrides the followers' refusal) and not taken again
//! from a round issued within [`TRANSFER_TAINT_TICKS`] of the last tick the
//! transfer was seen in progress, since the transferee may still receive the
//! timeout-now that late. Lease time is the simulation's tick: the
//! monotonic clock a member reads when it checks the lease, which a pause
//! does not stop; the Raft ticks of a paused member stop, and catch up in a
//! bunch when it resumes.
//!
//! A restarted member has forgotten which leader it heard, so the Raft
//! core's check-quorum rule alone would let it vote at once. The
//! simulator's driver therefore holds back vote and pre-vote requests (but
//! not a transfer's forced ones) from a member for
//! `ELECTION_TIMEOUT_TICKS` after it starts: the core does not do this
//! itself.
//!
//! # Faults
//! Message loss, duplication and delay; symmetric, one-way and partial
//! partitions (two members cut from each other, both reaching the rest: the
//! schedule of `docs/KEYSPACE.md`); stalled connections of one shard
//! (a shard's leader stops reaching some members on that shard only);
//! stalled timers of one shard on one member (a starved core: the shard's
//! Raft ticks stop, then arrive in a bunch, while it keeps handling
//! messages and proposals); leader transfers of random shards to random
//! members; crashes, and short crash-restart blips; and
//! pauses, in which a member neither ticks nor handles anything, then
//! resumes with its missed ticks in one bunch and the messages that waited.
//! While a partial partition holds, members not cut off (the *pivots* that
//! both sides reach) are the favoured target of pauses, blips and stalls.
//!
//! Random faults alone rarely make two members each believe they lead
//! every shard: check-quorum steps a cut-off leader down within two
//! election timeouts. So the schedule also has *stale-view episodes*
//! (`adversary.rs`), which build that state from the same kinds of fault,
//! timed against the run: a split of the shards between an incumbent and a
//! challenger, then a swap during which each keeps believing it leads the
//! shards it lost; in one variant the pivots restart at the swap instead
//! of waiting out an election timeout.
//!
//! # What is checked
//! - election safety, per shard (Raft paper 5.2);
//! - state machine safety, per shard: every member applies the same entry,
//!   with the same revision, at a `(shard, index)` (5.4.3);
//! - along each shard's applied log, revisions strictly increase;
//! - no revision is applied for two different writes;
//! - real-time order: a write invoked after another was acknowledged has a
//!   larger revision, checked for every write that gets applied,
//!   acknowledged or not;
//! - liveness: once the faults stop, a write to every shard is acknowledged
//!   within [`LIVENESS_BOUND_TICKS`].
//!
//! The `keyspace-sim` example runs many seeds with a chosen guard;
//! `tests/keyspace_sim.rs` runs a few hundred and shows that the unguarded
//! variant is caught.

mod adversary;
mod checker;
mod client;
mod faults;
mod member;
mod transport;
mod world;

use std::fmt;

pub use checker::{KsViolation, KsViolationKind};

use super::{ELECTION_TIMEOUT_TICKS, MAX_DELAY_TICKS};

/// Most shards a simulated member runs.
pub const MAX_SHARDS: usize = 4;
/// Most members a simulated keyspace has.
pub const MAX_MEMBERS: usize = 7;
/// Ticks of clock drift, message timing and tick granularity the lease
/// leaves unused at its end.
pub const LEASE_MARGIN_TICKS: u64 = 1;
/// Longest a member is paused, in ticks.
pub const MAX_PAUSE_TICKS: u64 = 3 * ELECTION_TIMEOUT_TICKS;
/// After a transfer was last seen in progress, its timeout-now may still be
/// in the network (delay) or waiting at a paused transferee: a lease is not
/// taken from a round issued within this many ticks of it.
pub const TRANSFER_TAINT_TICKS: u64 = MAX_DELAY_TICKS + MAX_PAUSE_TICKS + 1;
/// After the faults stop, a write to every shard must be acknowledged within
/// this many ticks: elections on every shard, the transfers to shard 0's
/// leader, a lease round and a commit, with room for lost election rounds as
/// in the one-group simulator.
pub const LIVENESS_BOUND_TICKS: u64 = 40 * ELECTION_TIMEOUT_TICKS;
/// Fewest ticks of faults a seed runs.
pub const MIN_CHAOS_TICKS: u64 = 150;
/// Most ticks of faults a seed runs.
pub const MAX_CHAOS_TICKS: u64 = 350;
/// Client writes waiting to be accepted, at most; more are not issued.
pub const MAX_PENDING_CLIENT_WRITES: usize = 64;
/// Ticks a client keeps retrying a write no member accepts.
pub const MAX_CLIENT_RETRY_TICKS: u64 = 2 * ELECTION_TIMEOUT_TICKS;
/// Events (messages, disk writes, client attempts) handled per tick at most.
pub const MAX_EVENTS_PER_TICK: usize = 4_000;

const _: () = assert!(LEASE_MARGIN_TICKS < ELECTION_TIMEOUT_TICKS);
const _: () = assert!(MIN_CHAOS_TICKS <= MAX_CHAOS_TICKS);
const _: () = assert!(LIVENESS_BOUND_TICKS > TRANSFER_TAINT_TICKS + 4 * ELECTION_TIMEOUT_TICKS);

/// What stands between a member's view of leadership and the revisions it
/// hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guard {
    /// The fix: a lease on every shard, and the restart vote hold.
    LeaseGuard,
    /// The planted bug: assign whenever the member believes it leads every
    /// shard (the restart vote hold stays on, so only the lease differs).
    NoGuard,
    /// The lease without the restart vote hold: a restarted member votes at
    /// once, so a lease it vouched for before its crash no longer holds.
    NoRestartVoteHold,
}

impl Guard {
    pub const ALL: [Guard; 3] = [Guard::LeaseGuard, Guard::NoGuard, Guard::NoRestartVoteHold];

    pub fn uses_lease(self) -> bool {
        matches!(self, Guard::LeaseGuard | Guard::NoRestartVoteHold)
    }

    pub fn holds_restart_votes(self) -> bool {
        matches!(self, Guard::LeaseGuard | Guard::NoGuard)
    }

    pub fn name(self) -> &'static str {
        match self {
            Guard::LeaseGuard => "lease",
            Guard::NoGuard => "none",
            Guard::NoRestartVoteHold => "lease-no-restart-hold",
        }
    }

    /// Parses a guard as the example's `--guard` flag spells it.
    pub fn parse(name: &str) -> Result<Guard, KsConfigError> {
        Guard::ALL
            .into_iter()
            .find(|g| g.name() == name)
            .ok_or_else(|| KsConfigError::UnknownGuard(name.to_string()))
    }
}

/// What one keyspace simulation run does.
#[derive(Debug, Clone)]
pub struct KsConfig {
    pub members: usize,
    /// Shards per member; `None` draws `2..=MAX_SHARDS` from the seed.
    pub shards: Option<usize>,
    pub seed: u64,
    pub guard: Guard,
    /// Record a line per step; costs time, so only for replays.
    pub trace: bool,
}

impl KsConfig {
    pub fn new(members: usize, seed: u64, guard: Guard) -> Self {
        KsConfig {
            members,
            shards: None,
            seed,
            guard,
            trace: false,
        }
    }

    pub fn validate(&self) -> Result<(), KsConfigError> {
        if self.members == 0 || self.members > MAX_MEMBERS {
            return Err(KsConfigError::Members {
                members: self.members,
                max_members: MAX_MEMBERS,
            });
        }
        if let Some(s) = self.shards {
            if s == 0 || s > MAX_SHARDS {
                return Err(KsConfigError::Shards {
                    shards: s,
                    max_shards: MAX_SHARDS,
                });
            }
        }
        Ok(())
    }
}

/// A keyspace simulation the simulator refuses to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KsConfigError {
    #[error("simulated keyspace must have 1..={max_members} members, not {members}")]
    Members { members: usize, max_members: usize },
    #[error("simulated members must run 1..={max_shards} shards, not {shards}")]
    Shards { shards: usize, max_shards: usize },
    #[error("unknown guard {0:?} (known: lease, none, lease-no-restart-hold)")]
    UnknownGuard(String),
}

/// Counters of one run, for the summary table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KsStats {
    pub steps: u64,
    pub ticks: u64,
    pub messages_delivered: u64,
    pub messages_dropped: u64,
    pub crashes: u64,
    pub pauses: u64,
    pub tick_stalls: u64,
    pub partitions: u64,
    pub partial_partitions: u64,
    /// Stale-view episodes started (`adversary.rs`).
    pub episodes: u64,
    /// Episodes that reached the point where two members each believed
    /// they led every shard.
    pub episodes_held: u64,
    pub leaders_elected: u64,
    pub transfers_requested: u64,
    pub writes_invoked: u64,
    pub writes_proposed: u64,
    pub writes_applied: u64,
    pub writes_acked: u64,
    /// Writes a member that led every shard, no-ops applied, refused only
    /// because a lease was missing: where the guard acted.
    pub lease_refusals: u64,
    /// Steps after which two members each believed they led every shard,
    /// no-ops applied: the stale view the guard is there for.
    pub dual_leader_steps: u64,
    /// Vote and pre-vote requests held back from a member just restarted.
    pub votes_held: u64,
    /// Ticks from the end of the faults until the liveness goal was met.
    pub recovery_ticks: u64,
}

impl KsStats {
    pub fn add(&mut self, o: &KsStats) {
        self.steps += o.steps;
        self.ticks += o.ticks;
        self.messages_delivered += o.messages_delivered;
        self.messages_dropped += o.messages_dropped;
        self.crashes += o.crashes;
        self.pauses += o.pauses;
        self.tick_stalls += o.tick_stalls;
        self.partitions += o.partitions;
        self.partial_partitions += o.partial_partitions;
        self.episodes += o.episodes;
        self.episodes_held += o.episodes_held;
        self.leaders_elected += o.leaders_elected;
        self.transfers_requested += o.transfers_requested;
        self.writes_invoked += o.writes_invoked;
        self.writes_proposed += o.writes_proposed;
        self.writes_applied += o.writes_applied;
        self.writes_acked += o.writes_acked;
        self.lease_refusals += o.lease_refusals;
        self.votes_held += o.votes_held;
        self.dual_leader_steps += o.dual_leader_steps;
        self.recovery_ticks = self.recovery_ticks.max(o.recovery_ticks);
    }
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct KsOutcome {
    pub seed: u64,
    pub members: usize,
    pub shards: usize,
    pub guard: Guard,
    pub stats: KsStats,
    pub violation: Option<KsViolation>,
    /// One line per step, when `KsConfig::trace` was set.
    pub trace: Vec<String>,
}

/// Runs one seed to the end (faults, then the liveness phase) or to the
/// first violation. A panic inside the Raft core is reported as a violation
/// of kind [`KsViolationKind::CorePanic`].
pub fn run_seed(cfg: &KsConfig) -> Result<KsOutcome, KsConfigError> {
    cfg.validate()?;
    Ok(world::run(cfg))
}

/// The result of many seeds.
#[derive(Debug, Clone)]
pub struct KsSummary {
    pub seeds_run: u64,
    pub stats: KsStats,
    /// Every violating seed's outcome (without trace), at most
    /// `max_violations` of them.
    pub violations: Vec<KsOutcome>,
}

/// Runs seeds `first_seed..first_seed + seeds`, stopping once
/// `max_violations` seeds have violated a check.
pub fn run_seeds(
    members: usize,
    shards: Option<usize>,
    guard: Guard,
    first_seed: u64,
    seeds: u64,
    max_violations: usize,
) -> Result<KsSummary, KsConfigError> {
    let mut summary = KsSummary {
        seeds_run: 0,
        stats: KsStats::default(),
        violations: Vec::new(),
    };
    for seed in first_seed..first_seed + seeds {
        let mut cfg = KsConfig::new(members, seed, guard);
        cfg.shards = shards;
        let out = run_seed(&cfg)?;
        summary.seeds_run += 1;
        summary.stats.add(&out.stats);
        if out.violation.is_some() {
            summary.violations.push(out);
            if summary.violations.len() >= max_violations {
                break;
            }
        }
    }
    Ok(summary)
}

impl fmt::Display for KsOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed={} members={} shards={} guard={}",
            self.seed,
            self.members,
            self.shards,
            self.guard.name()
        )?;
        match &self.violation {
            None => write!(f, " steps={} ok", self.stats.steps),
            Some(v) => write!(f, " VIOLATION {v}"),
        }
    }
}

//! A deterministic simulator of a Raft group, driving the real
//! [`RawNode`](crate::raft::RawNode) of every member the way a shard driver
//! would, under a hostile but seeded world.
//!
//! One `u64` seed decides everything: the network (drops, delays, reordering,
//! duplicates, symmetric and one-way partitions), crashes and restarts, when
//! each member's disk write completes, the client workload (proposals,
//! ReadIndex reads, leader transfers, membership changes) and log compaction.
//! Replaying a seed replays the run exactly, so a failing seed is a complete
//! bug report.
//!
//! # What a member is
//! Each member is a `RawNode<MemStorage>` plus a driver that keeps the Ready
//! contract literally: `messages` leave when the Ready is taken;
//! `entries`, `hard_state` and `snapshot` reach the member's `MemStorage`
//! (its disk) only when the simulated write completes, a later event; only
//! then do `persisted_messages` leave, committed entries get applied and
//! `advance` is called. A crash throws away the node and every pending write;
//! the restart reads back exactly what the disk holds. The state machine is
//! volatile: it restarts from the last snapshot and replays the log, the way
//! a restart from snapshot plus log works.
//!
//! A new cluster bootstraps the way etcd's does: every initial member's log
//! holds one committed `ConfChangeAddNode` per member at term 1, so a member
//! that joins later learns the whole membership from the log or a snapshot.
//!
//! # What is checked after every step
//! - election safety: at most one leader per term (Raft paper 5.2);
//! - log matching: an `(index, term)` names one entry with one predecessor
//!   term, wherever it appears (paper 5.3);
//! - leader completeness: a leader of term `T` holds every entry committed in
//!   a term below `T` (paper 5.4);
//! - state machine safety: no two members apply different entries at an
//!   index, and a snapshot carries the same state the appliers had (5.4.3);
//! - linearizable reads: a ReadIndex answer covers every write committed
//!   before the read began, and is served only once applied (thesis 6.4);
//! - the persistence contract: nothing in `Ready::messages` vouches for state
//!   that is not yet durable.
//!
//! When the faults stop, the group must elect a leader, commit and apply a
//! write on every member and serve a read within [`LIVENESS_BOUND_TICKS`].
//!
//! The `raft-sim` example runs many seeds; `tests/raft_sim.rs` runs a few
//! hundred and shows that each safety mutation of the core is caught.

mod checker;
mod cluster;
pub mod driver;
pub mod keyspace;
mod member;
mod network;

use std::cell::RefCell;
use std::fmt;

use crate::raft::SafetyMutation;

pub use checker::{Violation, ViolationKind};

/// Most members a simulation may have (initial members plus spares).
pub const MAX_MEMBERS: usize = 9;
/// Members that start outside the group and may be added by membership
/// changes during the run.
pub const SPARE_MEMBERS: usize = 2;
/// Election timeout every simulated member uses; the liveness bound and the
/// fault schedule are counted against it.
pub const ELECTION_TIMEOUT_TICKS: u64 = 10;
/// After the faults stop, a leader must be elected, a write applied on every
/// member and a read served within this many ticks. One election round takes
/// at most `2 * ELECTION_TIMEOUT_TICKS`, but rounds can fail: without
/// pre-vote, a candidate whose log is too short to win still bumps the term
/// and resets everyone's timer, and it wins the timeout race about half the
/// time when half the voters lag (seen: 9 lost rounds in a row, 93 ticks, in
/// 2,000 seeds). Thirty timeouts leave room for some 25 lost rounds, a chance
/// near 2^-25 per seed; a deadlock never recovers and is still caught.
pub const LIVENESS_BOUND_TICKS: u64 = 30 * ELECTION_TIMEOUT_TICKS;
/// Fewest ticks of faults a seed runs before the faults stop.
pub const MIN_CHAOS_TICKS: u64 = 100;
/// Most ticks of faults a seed runs before the faults stop.
pub const MAX_CHAOS_TICKS: u64 = 300;
/// Messages, write completions and client operations handled per tick at
/// most; what is left waits for the next tick.
pub const MAX_EVENTS_PER_TICK: usize = 2_000;
/// Messages the simulated network holds in flight at most; more are dropped,
/// as a full socket buffer would.
pub const MAX_IN_FLIGHT_MESSAGES: usize = 4_096;
/// Longest delay the network gives a message, in ticks.
pub const MAX_DELAY_TICKS: u64 = 4;

const _: () = assert!(SPARE_MEMBERS < MAX_MEMBERS);
const _: () = assert!(MIN_CHAOS_TICKS <= MAX_CHAOS_TICKS);
const _: () = assert!(LIVENESS_BOUND_TICKS >= 4 * ELECTION_TIMEOUT_TICKS);
const _: () = assert!(MAX_DELAY_TICKS < ELECTION_TIMEOUT_TICKS);

/// What one simulation run does.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Members of the initial group (3 and 5 are the cases that matter).
    pub members: usize,
    pub seed: u64,
    /// A Raft safety rule switched off in every member, to show the checks
    /// catch it. `None` for a normal run.
    pub mutation: Option<SafetyMutation>,
    /// Record a line per step; costs time, so only for replays.
    pub trace: bool,
    /// Drive every member as a pipelined driver does (Raft's
    /// `async_append`): take the next Ready while earlier writes are in
    /// flight, apply committed entries at once, and finish writes in order.
    pub pipelined: bool,
}

impl SimConfig {
    pub fn new(members: usize, seed: u64) -> Self {
        SimConfig {
            members,
            seed,
            mutation: None,
            trace: false,
            pipelined: false,
        }
    }

    pub fn validate(&self) -> Result<(), SimConfigError> {
        if self.members == 0 || self.members + SPARE_MEMBERS > MAX_MEMBERS {
            return Err(SimConfigError::Members {
                members: self.members,
                max_members: MAX_MEMBERS - SPARE_MEMBERS,
            });
        }
        if self.mutation.is_some() && cfg!(not(feature = "raft-mutations")) {
            return Err(SimConfigError::MutationsNotBuilt);
        }
        Ok(())
    }
}

/// A simulation the simulator refuses to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimConfigError {
    #[error("simulated group must have 1..={max_members} members, not {members}")]
    Members { members: usize, max_members: usize },
    #[error("unknown safety mutation {0:?} (known: commit-previous-term-by-count, vote-without-log-check)")]
    UnknownMutation(String),
    #[error("safety mutations need a build with the `raft-mutations` feature (test and example builds have it)")]
    MutationsNotBuilt,
}

/// Counters of one run, for the summary table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    pub steps: u64,
    pub ticks: u64,
    pub messages_delivered: u64,
    pub messages_dropped: u64,
    pub crashes: u64,
    pub partitions: u64,
    pub leaders_elected: u64,
    pub writes_applied: u64,
    pub reads_served: u64,
    pub snapshots_installed: u64,
    pub conf_changes_applied: u64,
    pub transfers_requested: u64,
    /// Ticks from the end of the faults until the liveness goal was met.
    pub recovery_ticks: u64,
    /// Times a leader's commit index advanced onto an entry of an earlier
    /// term: never in a correct core (Raft paper 5.4.2), so it shows how
    /// often the `CommitPreviousTermByCount` mutation took effect.
    pub old_term_commits: u64,
    /// Most writes one member had in flight at once (above 1 only when
    /// pipelined).
    pub max_writes_in_flight: u64,
}

impl SimStats {
    pub fn add(&mut self, o: &SimStats) {
        self.steps += o.steps;
        self.ticks += o.ticks;
        self.messages_delivered += o.messages_delivered;
        self.messages_dropped += o.messages_dropped;
        self.crashes += o.crashes;
        self.partitions += o.partitions;
        self.leaders_elected += o.leaders_elected;
        self.writes_applied += o.writes_applied;
        self.reads_served += o.reads_served;
        self.snapshots_installed += o.snapshots_installed;
        self.conf_changes_applied += o.conf_changes_applied;
        self.transfers_requested += o.transfers_requested;
        self.recovery_ticks = self.recovery_ticks.max(o.recovery_ticks);
        self.old_term_commits += o.old_term_commits;
        self.max_writes_in_flight = self.max_writes_in_flight.max(o.max_writes_in_flight);
    }
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    pub seed: u64,
    pub members: usize,
    pub stats: SimStats,
    pub violation: Option<Violation>,
    /// One line per step, when `SimConfig::trace` was set.
    pub trace: Vec<String>,
}

/// Runs one seed to the end (faults, then the liveness phase) or to the first
/// violation. A panic inside the Raft core is reported as a violation of kind
/// [`ViolationKind::CorePanic`], not propagated.
pub fn run_seed(cfg: &SimConfig) -> Result<SimOutcome, SimConfigError> {
    cfg.validate()?;
    Ok(cluster::run(cfg))
}

/// The result of many seeds.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub seeds_run: u64,
    pub stats: SimStats,
    /// The first violating seed's outcome (without trace).
    pub first_violation: Option<SimOutcome>,
}

/// Runs seeds `first_seed..first_seed + seeds`, stopping at the first one that
/// violates a check. Under a safety mutation only a consensus-safety
/// violation ([`ViolationKind::is_consensus_safety`]) stops the search: a
/// core with a safety rule switched off may also lose liveness or serve a
/// stale read for other reasons, but that is not what the mutation check is
/// after.
pub fn run_seeds(
    members: usize,
    first_seed: u64,
    seeds: u64,
    mutation: Option<SafetyMutation>,
    pipelined: bool,
) -> Result<RunSummary, SimConfigError> {
    let mut summary = RunSummary {
        seeds_run: 0,
        stats: SimStats::default(),
        first_violation: None,
    };
    for seed in first_seed..first_seed + seeds {
        let mut cfg = SimConfig::new(members, seed);
        cfg.mutation = mutation;
        cfg.pipelined = pipelined;
        let out = run_seed(&cfg)?;
        summary.seeds_run += 1;
        summary.stats.add(&out.stats);
        let stop = match &out.violation {
            Some(v) => mutation.is_none() || v.kind.is_consensus_safety(),
            None => false,
        };
        if stop {
            summary.first_violation = Some(out);
            break;
        }
    }
    Ok(summary)
}

/// Parses a mutation name as the example's `--mutation` flag spells it.
pub fn parse_mutation(name: &str) -> Result<SafetyMutation, SimConfigError> {
    match name {
        "commit-previous-term-by-count" => Ok(SafetyMutation::CommitPreviousTermByCount),
        "vote-without-log-check" => Ok(SafetyMutation::VoteWithoutLogCheck),
        other => Err(SimConfigError::UnknownMutation(other.to_string())),
    }
}

/// Every safety mutation the core offers, for the mutation check.
pub const ALL_MUTATIONS: [SafetyMutation; 2] = [
    SafetyMutation::CommitPreviousTermByCount,
    SafetyMutation::VoteWithoutLogCheck,
];

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the process panic hook with one that records the panic's message
/// and location for the simulator's report instead of printing it. A run
/// under a mutation makes the core panic on purpose, often; printing every
/// one would bury the report.
pub fn install_quiet_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = panic_message(info.payload());
        let loc = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{loc}")));
    }));
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

fn take_panic_report(payload: &(dyn std::any::Any + Send)) -> String {
    LAST_PANIC
        .with(|p| p.borrow_mut().take())
        .unwrap_or_else(|| panic_message(payload))
}

impl fmt::Display for SimOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.violation {
            None => write!(
                f,
                "seed={} members={} steps={} ok",
                self.seed, self.members, self.stats.steps
            ),
            Some(v) => write!(
                f,
                "seed={} members={} VIOLATION {v}",
                self.seed, self.members
            ),
        }
    }
}

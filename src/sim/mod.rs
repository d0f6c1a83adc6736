//! Cairn's deterministic simulators.
//!
//! - [`driver`]: every member of a group runs the daemon's own shard driver
//!   with the real WAL and the real store under seeded faults, and the
//!   checks watch the wire and the clients' history. It is where the Raft
//!   core's safety is checked under the code that drives it in production:
//!   each safety mutation of the core (`raft-mutations`) must be caught.
//!   With several shards per member it runs the real revision counter and
//!   router, the keyspace's tasks and the Watch service's merge over them,
//!   and each keyspace mutation must be caught too.
//!
//! Two simulators that checked models instead of the daemon's code were
//! retired once the driver simulation caught what they caught: one that
//! drove the Raft core through a driver of its own, and a model of one
//! keyspace over several shards (revisions, txns, read points, watches and
//! the stale view of leadership) built on bare Raft nodes.

mod digest;
pub mod driver;

use std::cell::{Cell, RefCell};
use std::sync::Once;

use crate::raft::SafetyMutation;
use crate::server::revisions::KeyspaceMutation;

/// Members that start outside the group and may be added by membership
/// changes during the run.
pub const SPARE_MEMBERS: usize = 2;

/// A simulation the simulator refuses to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimConfigError {
    #[error("simulated group must have 1..={max_members} members, not {members}")]
    Members { members: usize, max_members: usize },
    #[error("a simulated member runs 1..={max_shards} shards, not {shards}")]
    Shards { shards: usize, max_shards: usize },
    #[error("a keyspace mutation needs several shards (--shards)")]
    KeyspaceMutationOneShard,
    #[error("unknown keyspace mutation {0:?} (known: open-before-applied, no-finishing, no-leases, no-restart-vote-hold, join-ignores-overlap, watch-no-merge, watch-from-now-early)")]
    UnknownKeyspaceMutation(String),
    #[error("unknown safety mutation {0:?} (known: commit-previous-term-by-count, vote-without-log-check)")]
    UnknownMutation(String),
    #[error("safety mutations need a build with the `raft-mutations` feature (test and example builds have it)")]
    MutationsNotBuilt,
}

/// Parses a keyspace mutation name as the example's `--keyspace-mutation`
/// flag spells it.
pub fn parse_keyspace_mutation(name: &str) -> Result<KeyspaceMutation, SimConfigError> {
    match name {
        "open-before-applied" => Ok(KeyspaceMutation::OpenBeforeApplied),
        "no-finishing" => Ok(KeyspaceMutation::NoFinishing),
        "no-leases" => Ok(KeyspaceMutation::NoLeases),
        "no-restart-vote-hold" => Ok(KeyspaceMutation::NoRestartVoteHold),
        "join-ignores-overlap" => Ok(KeyspaceMutation::JoinIgnoresOverlap),
        "watch-no-merge" => Ok(KeyspaceMutation::WatchNoMerge),
        "watch-from-now-early" => Ok(KeyspaceMutation::WatchFromNowEarly),
        other => Err(SimConfigError::UnknownKeyspaceMutation(other.to_string())),
    }
}

/// Parses a mutation name as the example's `--mutation` flag spells it.
pub fn parse_mutation(name: &str) -> Result<SafetyMutation, SimConfigError> {
    match name {
        "commit-previous-term-by-count" => Ok(SafetyMutation::CommitPreviousTermByCount),
        "vote-without-log-check" => Ok(SafetyMutation::VoteWithoutLogCheck),
        other => Err(SimConfigError::UnknownMutation(other.to_string())),
    }
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Whether this thread is running a seed ([`driver::run_seed_alone`]).
    static IN_SEED: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once per process, a panic hook that records the message and
/// location of a panic on a thread running a seed for the simulator's
/// report instead of printing it. A run under a mutation makes the core
/// panic on purpose, often; printing every one would bury the report.
/// Panics anywhere else (a test's own assertion, another test of the same
/// binary) still reach the hook that was installed before.
pub fn install_quiet_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_SEED.with(Cell::get) {
                return previous(info);
            }
            let msg = panic_message(info.payload());
            let loc = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{loc}")));
        }));
    });
}

/// Marks this thread as running a seed until dropped: the quiet hook
/// records its panics.
#[cfg(feature = "paused-clock")]
struct InSeed;

#[cfg(feature = "paused-clock")]
impl InSeed {
    fn enter() -> Self {
        IN_SEED.with(|s| s.set(true));
        InSeed
    }
}

#[cfg(feature = "paused-clock")]
impl Drop for InSeed {
    fn drop(&mut self) {
        IN_SEED.with(|s| s.set(false));
        // A panic leaving the seed itself (its tasks' panics become the
        // seed's report) was recorded and not printed: print it now.
        if std::thread::panicking() {
            if let Some(report) = LAST_PANIC.with(|p| p.borrow_mut().take()) {
                eprintln!("a seed panicked: {report}");
            }
        }
    }
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

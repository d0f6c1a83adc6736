//! The production shard driver under simulation: every member of a group
//! runs the daemon's own [`Shard`](crate::server::shard::Shard) (its write
//! pipeline, apply, ReadIndex reads, proposals held for a leader) with the
//! real WAL on its power-cut disk model and the real MVCC store, and the
//! members talk through a seeded network, all on one thread under a paused
//! clock. The Raft core is checked here under the code that drives it in
//! production, and each of its safety mutations must be caught.
//!
//! # The world
//! - Time: tokio's clock, paused. Ticks, message delays, disk syncs and
//!   client pauses are timers; when every task waits, the clock jumps to the
//!   next one, so seconds of cluster time take milliseconds.
//! - Disk: each member's WAL is [`cairn_wal::crash::CrashStorage`] behind
//!   [`disk::SlowDisk`], whose syncs take 50-2,000 µs. A crash keeps what was
//!   synced and, at random, some sectors written since. The store is the real
//!   store in a directory (on `/dev/shm` where it exists), its commits synced
//!   inline rather than on a thread of its own (a thread the paused clock
//!   cannot see would let simulated seconds pass while it waits for a CPU,
//!   so a busy machine made members seem to recover slowly). A commit is
//!   then whole before the driver goes on, and a crash finds the store as
//!   `kill -9` between two commits does.
//! - Network: every message waits 0-5 ms; some are lost (a seeded rate of up
//!   to 25%) or duplicated (not forwarded proposals: TCP never duplicates,
//!   and Raft proposals are not idempotent); links are cut one way or both.
//! - Faults, for 1.5-4 s: crashes with restarts 20-600 ms later,
//!   partitions, one-way cuts, loss, leader transfers asked of the leader;
//!   meanwhile clients put and read a few keys through any running member.
//! - Watches (see [`watchers`]): three sessions watch every key from
//!   revision 1 through a running member's router each, as the Watch
//!   service does (`keyspace::watch_shards`), and watch again through
//!   another from where they stopped when it crashes or is removed, or now
//!   and then by themselves; one reads slowly, so its shards move it to
//!   catch-up from the store. With several shards two more watch from now
//!   (start revision 0) each time, moving on often, so that many watches
//!   begin while a member's shards stand at different revisions.
//! - Leases (see [`leases`]): four clients grant one to three leases of 1-2
//!   s with a key each and keep them alive together, one renewal naming
//!   them all, through any running member (sent on to the leader it names),
//!   reading a key now and then, and let them go now and then; the leader
//!   revokes what expires.
//! - Log compaction: most seeds compact every 4-100 entries
//!   (`--snapshot-count`), so a member back from a crash or a partition
//!   often finds its next entries gone and catches up by snapshot. The
//!   leader streams its store through the driver's own snapshot sender; the
//!   receiver spools it to a file in its shard's directory, as the peer
//!   transport's receiving side does (writing on the simulation's thread,
//!   not a writer thread of its own), and installs it (store built beside
//!   the old one, directories swapped) in jobs off the driver. A stream
//!   ends when its link is cut or its receiver crashes.
//! - Membership changes (see [`membership`]): a spare member is added as
//!   a learner, started empty and promoted; later a member, the leader as
//!   likely as any, is removed and stopped for good. Each change is retried
//!   until it is in effect before the group is checked.
//! - Figure-8 seeds (a quarter): on half of them, one entry per append and
//!   new or committing leaders struck at once, so logs diverge over many
//!   short terms; the other half play the scripted adversary of Raft paper
//!   figure 8 instead of random faults and membership changes (see
//!   [`figure8`]): rounds of cuts that leave an old leader able to commit an
//!   entry of an earlier term only by counting replicas, which a correct
//!   core never does.
//! - The driver's jobs off its core (installs, snapshot metadata writes),
//!   which the daemon runs on the blocking pool, are tasks of the
//!   simulation's thread that start after a seeded wait of up to 10 ms
//!   ([`OffCoreJobs::simulated`](crate::server::shard::OffCoreJobs::simulated)):
//!   the driver goes on meanwhile, as in the daemon. A crash aborts the
//!   driver; the jobs it left finish before the member restarts, as if the
//!   crash came just after them.
//! - Then the faults stop, every member runs, the membership change under
//!   way (if any) takes effect within [`LIVENESS_BOUND`], and then a put
//!   must be acknowledged and applied everywhere within [`LIVENESS_BOUND`].
//!
//! # What is checked
//! See [`checks`]: no request lost by a running driver; one revision per
//! acknowledged put, and each value in the log once; puts that did not
//! overlap in time take revisions in their order; a linearizable read sees
//! every put acknowledged before it began and nothing older than an earlier
//! read saw, and never a put that began after it ended; every acknowledged
//! put is in every member's store at its revision; every value read is the
//! log's at its revision; every member's store hashes the same; no driver
//! panics, nor any task of the simulation itself (a client's call and the
//! API layer's code it runs, a watch session, a lease client, a fault, a
//! message on its way: [`DriverViolationKind::TaskPanic`], where the call
//! would otherwise only be missing from the history); every crashed member
//! reopens; every watch session is sent the last revision that changed a
//! key within [`LIVENESS_BOUND`] after the faults, and was sent each
//! revision of the log once, in order (checked as it arrives too), with the
//! log's keys and values, none missing (a watch from now: nothing at or
//! below its created response's header revision, and from there none
//! missing); no
//! lease is gone (its key deleted, or a keep-alive told it
//! is unknown) before the TTL of an answered grant or keep-alive has run
//! from when that was sent; after the faults, every lease ends on every
//! member within [`LEASE_BOUND`]. On the wire, at every append and
//! heartbeat (see [`log_watch`]): one leader per term (election safety); an
//! `(index, term)` names one entry after one term (log matching); an index
//! said committed never changes its term (state machine safety); a leader
//! shows no other term at an index an earlier term's leader committed
//! (leader completeness).
//!
//! # Several shards (`--shards`)
//! Each member runs one driver per shard, each on a WAL of its own (a shard
//! per core, as the daemon places them by default) and all over one real
//! revision counter, with the keyspace's own tasks beside them; the clients'
//! keys spread over the shards by the real routing table.
//! - A put goes to its key's shard.
//! - A linearizable read takes a read point from the keyspace leader (the
//!   member reached, or the member it names, as the peer port would) and
//!   reads the key's shard there; some read every client key over all
//!   shards at one point and merge the answers.
//! - A txn puts one to three keys, half of them only if another key still
//!   holds the value last sent to it (else other puts): on their shard when
//!   they share one, else over several shards by the real
//!   `keyspace::cross_txn` on the keyspace leader (holds answering the
//!   compares, parts with their records, and the finishing of a leader's
//!   half-proposed txns at the next opening).
//! - A watch session's watch is registered on every shard, each also
//!   saying how far it has sent, and their batches are merged into one
//!   revision order by the real `keyspace::watch_merge` (an event goes out
//!   once every shard has sent through its revision; idle shards move on
//!   the keyspace leader's closes). A shard that finds the slow session's
//!   queue full moves it to catch-up there, while the others feed it. A
//!   watch from now starts on every shard at the highest revision they
//!   answered, the created response's header.
//!
//! The checks above then hold across the shards (one revision order for
//! every key). Besides: every read over all shards is the log's state at
//! its point, which lies at or above every write acknowledged before the
//! read began and below every write begun after it ended; every txn is in
//! the log whole at one revision with one branch or not at all, answered or
//! not, the branch its compare chose on the log just before that revision
//! and the one it was answered with; every watch session is sent each
//! revision's changes of every shard (a txn over several shards) in one
//! response, and the last change of any shard once the faults are over
//! (every shard, idle or not, must have sent through it). The wire's
//! checks hold per shard, the stores' shard by shard, and the faults aim at
//! shard 0's leaders (the keyspace leader). Half the partitions and one-way cuts take one shard's
//! links only (each core's shards have connections of their own), so a
//! member may reach a peer on one shard and not on another. Each
//! `KeyspaceMutation` must be caught.
//!
//! Half the seeds also play stale-view episodes (see [`stale_view`]): two
//! members each believing they lead every shard and each truly leading
//! some, built from per-shard cuts, a partition between the two, the
//! timer of a shard stalled as on a starved core (the driver's
//! `ShardSetup::timer_faults`), campaigns at chosen moments and, in half
//! of them, restarts of the other members (a crash forgets the ticks a
//! member's timers missed and a campaign asked of them, as a new process
//! has neither; a stall, the core's, stays). Only the leases of every shard
//! and a restarted member's vote hold keep both counters from handing out
//! revisions at once; with either planted away, the episodes are caught.
//! Txns over the same shards run in the real batches (`keyspace::txn_batch`),
//! and a batch that lets a txn join past a key in common is caught.
//!
//! # Not simulated
//! - With several shards: compares other than a value's, leases and
//!   membership changes (the daemon's API layer carries them to every
//!   shard; `tests/daemon_lease.rs` and `tests/daemon_members.rs` run them
//!   on real processes), and the figure-8 adversaries.
//! - With one shard: watches from now (a shard's watch from now starts at
//!   its own revision; the sessions watch from revision 1 on).
//! - The peer transport's framing: a snapshot stream's chunks go straight
//!   from the sender's store to the receiver's spool.
//! - The store's own power cuts (its syncs go to real files), and its
//!   commits left to a sync thread that falls behind.
//!
//! # Replays
//! A seed replays exactly (`run_seed_alone`, in builds with the
//! `paused-clock` feature: each seed on a runtime of its own, whose timers
//! count from its start): everything runs on one
//! thread under the paused clock, every choice comes from the seed, the
//! driver walks ordered maps only, its `select!`s are biased (tokio draws an
//! unbiased one's order from a seed of its own), the WAL paces itself by
//! tokio's clock, and the jobs the daemon runs on threads (installs, spool
//! writes, store syncs) run on the simulation's thread. The store's files
//! are real but hold the same bytes every run. `--replay-check` runs each
//! seed twice and shows where two runs part: a digest of every message sent
//! (with when) is compared, and a trace of messages, draws from the seed,
//! client calls, syncs, starts and crashes locates the first difference.
//!
//! # Running
//! [`run_seed`] must run inside a `LocalSet` on a current-thread runtime
//! started with its clock paused (tokio's `test-util`, which test and
//! example builds have); it refuses a clock that runs. `run_seed_alone`
//! and `run_seeds` build that runtime themselves.

mod checks;
mod client;
mod disk;
mod faults;
mod figure8;
mod leases;
mod log_watch;
mod membership;
mod outcome;
#[cfg(test)]
mod renewals;
mod stale_view;
mod watchers;
mod wire_trace;
mod world;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use crate::raft::SafetyMutation;
use crate::routing::ShardId;
use crate::server::revisions::KeyspaceMutation;

use checks::{violation, DriverViolationKind as Kind};
pub use checks::{DriverViolation, DriverViolationKind};
use client::{Answer, Call, History, Op};
pub use outcome::{DriverSimError, DriverSimOutcome, DriverSimStats};
use world::World;

use super::SimConfigError;

/// Most members a driver simulation runs.
pub const MAX_DRIVER_MEMBERS: usize = 7;
/// Most shards a simulated member runs (the simulated WAL's lanes).
pub const MAX_DRIVER_SHARDS: usize = 4;
/// After the faults stop, a put must be acknowledged and applied on every
/// member within this much simulated time: a few election rounds.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(20);
/// Real time one seed may take; a normal seed takes well under a second
/// even in a debug build.
pub const REAL_TIME_BUDGET: Duration = Duration::from_secs(20);
/// The same under a safety mutation, where a broken core can keep its
/// members busy without end: such a seed is given up sooner.
pub const MUTATION_REAL_TIME_BUDGET: Duration = Duration::from_secs(3);
/// After the liveness goal, every lease has ended on every member within
/// this much simulated time: a new leader's wait, the longest TTL, a revoke
/// proposed again once, and its commit on every member.
pub const LEASE_BOUND: Duration = LIVENESS_BOUND
    .saturating_add(Duration::from_secs(leases::MAX_TTL_SECS as u64))
    .saturating_add(crate::server::shard::LEASE_REVOKE_RETRY);
/// Shortest and longest stretch of faults, in milliseconds.
pub const CHAOS_MS: std::ops::Range<u64> = 1_500..4_000;

/// What one driver simulation runs.
#[derive(Debug, Clone)]
pub struct DriverSimConfig {
    pub members: usize,
    /// Shards per member: with more than one, every member runs one driver
    /// per shard over one revision counter, as a daemon started with
    /// `--shards` does, and the clients' keys spread over them.
    pub shards: usize,
    pub seed: u64,
    /// A Raft safety rule switched off in every member's core.
    pub mutation: Option<SafetyMutation>,
    /// A rule of the revision order switched off in every member's
    /// revision counter (several shards only).
    pub keyspace_mutation: Option<KeyspaceMutation>,
    /// Keep a line per message sent, to compare two runs of the seed.
    pub trace: bool,
    /// A panic planted in a task of the simulation, to show it is caught.
    #[cfg(feature = "raft-mutations")]
    #[doc(hidden)]
    pub planted_panic: Option<PlantedPanic>,
}

/// A panic planted in a task of the simulation itself (not a member's),
/// which [`DriverViolationKind::TaskPanic`] must catch. Only a build with
/// the `raft-mutations` feature (test builds) can plant one.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedPanic {
    /// The clients' call with this number (from 1) panics once answered,
    /// before its answer enters the history.
    ClientCall(u64),
}

impl DriverSimConfig {
    /// Whether some safety rule is switched off.
    pub fn is_mutated(&self) -> bool {
        self.mutation.is_some() || self.keyspace_mutation.is_some()
    }

    pub fn new(members: usize, seed: u64) -> DriverSimConfig {
        DriverSimConfig {
            members,
            shards: 1,
            seed,
            mutation: None,
            keyspace_mutation: None,
            trace: false,
            #[cfg(feature = "raft-mutations")]
            planted_panic: None,
        }
    }

    fn validate(&self) -> Result<(), SimConfigError> {
        if self.members == 0 || self.members > MAX_DRIVER_MEMBERS {
            return Err(SimConfigError::Members {
                members: self.members,
                max_members: MAX_DRIVER_MEMBERS,
            });
        }
        if self.shards == 0 || self.shards > MAX_DRIVER_SHARDS {
            return Err(SimConfigError::Shards {
                shards: self.shards,
                max_shards: MAX_DRIVER_SHARDS,
            });
        }
        if self.keyspace_mutation.is_some() && self.shards == 1 {
            return Err(SimConfigError::KeyspaceMutationOneShard);
        }
        if self.is_mutated() && cfg!(not(feature = "raft-mutations")) {
            return Err(SimConfigError::MutationsNotBuilt);
        }
        Ok(())
    }
}

/// Runs one seed: faults, then the liveness goal, then the checks.
pub async fn run_seed(cfg: &DriverSimConfig) -> Result<DriverSimOutcome, DriverSimError> {
    cfg.validate()?;
    let real = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    if real.elapsed() >= Duration::from_millis(500) {
        return Err(DriverSimError::ClockRuns);
    }
    let world = World::new(cfg).map_err(DriverSimError::Setup)?;
    let mut stats = DriverSimStats::default();
    let began = Instant::now();
    let budget = if cfg.is_mutated() {
        MUTATION_REAL_TIME_BUDGET
    } else {
        REAL_TIME_BUDGET
    };
    // Biased, as every `select!` the simulation runs through: tokio draws
    // an unbiased one's order from a seed of its own, and a replay would
    // then take another course.
    let result = tokio::select! {
        biased;
        r = run_world(&world, &mut stats) => r,
        v = real_time_budget(real, began, budget) => Err(v),
    };
    // A driver stopped by the core's assertion is seen also when the run
    // ended early; a safety violation found away from the main task (two
    // leaders of a term, a committed entry replaced) outranks what ended it.
    world.note_stopped_driver().await;
    let noted = world.take_failure();
    let violation = match (noted, result) {
        (Some(n), _) if n.kind.is_consensus_safety() => Some(n),
        (_, Err(v)) => Some(v),
        (noted, Ok(())) => noted,
    };
    // Every driver stops before the members' directories go, and no task
    // left over from the faults starts one again.
    world.end();
    for id in world.ids() {
        let _ = world.crash(id).await;
    }
    stats.messages_delivered = world.delivered.get();
    stats.messages_dropped = world.dropped.get();
    stats.crashes = world.crashes.get();
    stats.partitions = world.partitions.get();
    stats.transfers = world.transfers.get();
    stats.keyspace_openings = world.keyspace_openings.get();
    stats.txns_batched = world.txns_batched.get();
    stats.stale_view_episodes = world.stale_view_episodes.get();
    stats.stale_views = world.stale_views.get();
    stats.snapshots_started = world.snapshots_started.get();
    stats.snapshots_delivered = world.snapshots_delivered.get();
    let mut wire = world.wire();
    Ok(DriverSimOutcome {
        seed: cfg.seed,
        members: cfg.members,
        shards: cfg.shards,
        stats,
        violation,
        wire_digest: wire.digest(),
        messages_sent: wire.sent(),
        trace: wire.take_lines(),
    })
}

async fn run_world(world: &Rc<World>, stats: &mut DriverSimStats) -> Result<(), DriverViolation> {
    for id in world.ids() {
        world
            .start(id)
            .await
            .map_err(|e| violation(Kind::RestartFailed, e))?;
    }
    let history: History = Rc::new(RefCell::new(Vec::new()));
    let until = Instant::now() + Duration::from_millis(world.gen_range(CHAOS_MS));
    // Aborted if the seed ends early (its real-time budget ran out).
    let mut clients = AbortOnDrop(world.spawn_checked(
        || "the clients' task".to_string(),
        client::run_clients(world.clone(), history.clone(), until),
    ));
    // The scripted adversary places every member itself: no membership
    // changes under it. With several shards the simulation has no
    // membership changes or leases yet (a change and a lease over several
    // shards are the keyspace layer's, above the drivers): its clients put,
    // read and watch.
    let script = world.figure8_script.clone();
    let one_shard = world.shards() == 1;
    let changes_until = if script.is_some() || !one_shard {
        Instant::now()
    } else {
        until
    };
    let leases_until = if one_shard { until } else { Instant::now() };
    let mut changes = AbortOnDrop(world.spawn_checked(
        || "the membership changes' task".to_string(),
        membership::run(world.clone(), changes_until),
    ));
    let lease_log: leases::Leases = Rc::default();
    let lease_clients = AbortOnDrop(world.spawn_checked(
        || "the lease clients' task".to_string(),
        leases::run(world.clone(), lease_log.clone(), leases_until),
    ));
    let (sessions, watch_tasks) = watchers::start(world);
    let watches: Vec<_> = watch_tasks.into_iter().map(AbortOnDrop).collect();
    let plan = faults::Plan::draw(world);
    world.start_chaos(plan.clone());
    match &script {
        Some(script) => figure8::run(world, script, until).await,
        None => faults::run(world, &plan, until).await,
    }
    let _ = (&mut clients.0).await;
    drop(lease_clients);
    world.end_chaos();
    if let Some(v) = world.take_failure() {
        return Err(v);
    }
    start_down_members(world).await?;
    // The membership change under way takes effect (within its own bound)
    // before the group is checked; members it added are started.
    stats.membership_changes = match (&mut changes.0).await {
        Ok(Some(Ok(n))) => n,
        Ok(Some(Err(v))) => return Err(v),
        // It panicked, and said so.
        Ok(None) | Err(_) => {
            return Err(world.take_failure().unwrap_or_else(|| {
                violation(Kind::TaskPanic, "the membership changes' task ended early")
            }))
        }
    };
    start_down_members(world).await?;
    let healed = Instant::now();
    let final_term = liveness(world).await?;
    stats.recovery_ms = healed.elapsed().as_millis() as u64;
    stats.final_term = final_term;
    // Leases no one keeps alive any more end everywhere; then every watch
    // is sent the last revision that changed a key.
    leases::all_revoked(world, LEASE_BOUND).await?;
    let revision = checks::last_change(world, world.ids()[0])
        .await
        .map_err(|e| violation(Kind::NoLiveness, e))?;
    // With several shards there are no leases to wait for.
    let after = if one_shard {
        "the faults ended and every lease with them"
    } else {
        "the faults ended"
    };
    watchers::caught_up(&sessions, revision, LIVENESS_BOUND, after).await?;
    // Nothing newer than the log read below reaches a session.
    drop(watches);
    // Calls still in flight end within their timeout.
    tokio::time::sleep(crate::server::command::REQUEST_TIMEOUT * 2).await;
    world
        .check_running()
        .await
        .map_err(checks::driver_stopped)?;
    let calls: Vec<Call> = history.borrow().clone();
    for c in &calls {
        match (&c.op, &c.answer) {
            (Op::Put { .. }, Answer::Put { .. }) => stats.puts_acknowledged += 1,
            (Op::Put { .. }, _) => stats.puts_failed += 1,
            (Op::Read { .. }, Answer::Read { .. }) => stats.reads_served += 1,
            (Op::Read { .. }, _) => stats.reads_failed += 1,
            (Op::ReadAll { .. }, Answer::ReadAll { .. }) => stats.reads_over_shards += 1,
            (Op::ReadAll { .. }, _) => stats.reads_failed += 1,
            (Op::Txn { .. }, Answer::Txn { succeeded, .. }) => {
                stats.txns_acknowledged += 1;
                stats.txns_compare_failed += u64::from(!succeeded);
            }
            (Op::Txn { .. }, _) => stats.txns_failed += 1,
        }
        if let Answer::Failed(e) = &c.answer {
            let kind: String = e.chars().take_while(|c| !c.is_ascii_digit()).collect();
            *stats.errors.entry(kind.trim_end().to_string()).or_default() += 1;
        }
    }
    if let Some(v) = world.take_failure() {
        return Err(v);
    }
    checks::check_history(&calls)?;
    let log = checks::check_stores(world, &calls).await?;
    for s in sessions.borrow().iter() {
        stats.watches += s.watches;
        stats.watch_events += s.events.len() as u64;
        stats.watch_window_stops += s.window_stops;
    }
    watchers::check(&sessions, &log)?;
    let lease_log = lease_log.borrow();
    stats.leases = lease_log.len() as u64;
    stats.lease_renewals = lease_log.iter().map(|l| l.alive.len() as u64 - 1).sum();
    stats.lease_renewals_together = lease_log
        .iter()
        .flat_map(|l| &l.alive)
        .filter(|a| a.named > 1)
        .count() as u64;
    stats.leases_seen_gone = lease_log.iter().filter(|l| l.gone.is_some()).count() as u64;
    leases::check(&lease_log)
}

/// A task that ends with the seed's main task.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Restarts every member of the group that is down.
async fn start_down_members(world: &Rc<World>) -> Result<(), DriverViolation> {
    for id in world.ids() {
        if !world.is_up(id) {
            world
                .start(id)
                .await
                .map_err(|e| violation(Kind::RestartFailed, e))?;
        }
    }
    Ok(())
}

/// Resolves once the seed has used `budget` of real time: its drivers are
/// busy far beyond what the simulated load needs (a storm of messages or of
/// retries).
async fn real_time_budget(
    real: std::time::Instant,
    began: Instant,
    budget: Duration,
) -> DriverViolation {
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if real.elapsed() >= budget {
            return violation(
                Kind::Storm,
                format!(
                    "{:?} of real time ran only {:?} of simulated time",
                    real.elapsed(),
                    began.elapsed()
                ),
            );
        }
    }
}

/// On every shard: puts through the members in turn until one is
/// acknowledged, then waits for every member to apply it. Returns shard
/// 0's term.
async fn liveness(world: &Rc<World>) -> Result<u64, DriverViolation> {
    let deadline = Instant::now() + LIVENESS_BOUND;
    let mut term = 0;
    for shard in world.routing.shard_ids() {
        let key = liveness_key(world, shard);
        let t = liveness_of(world, shard, key, deadline).await?;
        if shard == 0 {
            term = t;
        }
    }
    Ok(term)
}

/// A key of `shard`: `liveness` with one shard.
fn liveness_key(world: &World, shard: ShardId) -> bytes::Bytes {
    if world.shards() == 1 {
        return bytes::Bytes::from_static(b"liveness");
    }
    (0..)
        .map(|n| bytes::Bytes::from(format!("liveness-{n}")))
        .find(|k| world.routing.shard_for_key(k) == shard)
        .expect("some key routes to every shard")
}

/// [`liveness`] of one shard, through a put of `key`, before `deadline`;
/// answers the shard's term.
async fn liveness_of(
    world: &Rc<World>,
    shard: ShardId,
    key: bytes::Bytes,
    deadline: Instant,
) -> Result<u64, DriverViolation> {
    let ids = world.ids();
    let mut attempt = 0usize;
    let revision = loop {
        if Instant::now() >= deadline {
            return Err(violation(
                Kind::NoLiveness,
                format!("no put was acknowledged within {LIVENESS_BOUND:?} after the faults"),
            ));
        }
        let id = ids[attempt % ids.len()];
        attempt += 1;
        let op = Op::Put {
            key: key.clone(),
            // Each value once in the log, whichever shard.
            value: bytes::Bytes::from(if world.shards() == 1 {
                format!("attempt {attempt}")
            } else {
                format!("shard {shard} attempt {attempt}")
            }),
        };
        match client::call(world, id, op).await.map(|c| c.answer) {
            Some(Answer::Put { revision }) => break revision,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let mut term = 0;
    for id in ids {
        loop {
            let applied = checks::status_of(world, id, shard).await.ok();
            if let Some(s) = applied.filter(|s| s.revision >= revision) {
                term = term.max(s.term);
                break;
            }
            if Instant::now() >= deadline {
                return Err(violation(
                    Kind::NoLiveness,
                    format!(
                        "member {id} did not apply the put acknowledged at revision {revision} \
                         on shard {shard} within {LIVENESS_BOUND:?} after the faults"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(term)
}

/// Runs one seed on a runtime of its own: a fresh current-thread runtime
/// with its clock paused, so that the seed's timers fall as they do in any
/// other run of it, whatever ran before (a runtime's timers count whole
/// milliseconds from its start). A seed run this way replays exactly.
#[cfg(feature = "paused-clock")]
pub fn run_seed_alone(cfg: &DriverSimConfig) -> Result<DriverSimOutcome, DriverSimError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| DriverSimError::Setup(format!("building a runtime: {e}")))?;
    let _quiet = super::InSeed::enter();
    runtime.block_on(tokio::task::LocalSet::new().run_until(run_seed(cfg)))
}

/// Runs `count` seeds from `base.seed` on, each as `base` says otherwise
/// and on a runtime of its own ([`run_seed_alone`]), stopping at the first
/// violation (under a mutation, the first consensus-safety one).
#[cfg(feature = "paused-clock")]
pub fn run_seeds(
    base: &DriverSimConfig,
    count: u64,
) -> Result<(u64, DriverSimStats, Option<DriverSimOutcome>), DriverSimError> {
    let mut stats = DriverSimStats::default();
    let (first, mutated) = (base.seed, base.is_mutated());
    for seed in first..first + count {
        let cfg = DriverSimConfig {
            seed,
            ..base.clone()
        };
        let out = run_seed_alone(&cfg)?;
        stats.add(&out.stats);
        let stop = out
            .violation
            .as_ref()
            .is_some_and(|v| !mutated || v.kind.is_consensus_safety());
        if stop {
            return Ok((seed - first + 1, stats, Some(out)));
        }
    }
    Ok((count, stats, None))
}

/// The message of a driver's panic.
fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    super::take_panic_report(payload.as_ref())
}

//! The shard driver: one task per shard on the core that owns it, carrying out
//! what its Raft node asks (persist to the core's WAL, send to peers, apply to the
//! shard's MVCC store) and serving the shard's client commands.
//!
//! # One turn of the loop
//! 1. Take input: peer messages, client commands, ticks, and the WAL saying
//!    that earlier writes are durable.
//! 2. For every write now durable, oldest first: hand its entries to the
//!    in-memory log, send the messages that had to wait for it (votes, append
//!    acknowledgements), tell Raft (`advance_append`).
//! 3. Pending linearizable reads of this turn become one ReadIndex round.
//! 4. While Raft has a Ready: send the messages that may leave now (the
//!    leader's appends go out while it writes), queue entries and hard state
//!    in the WAL without waiting (one group fsync shared with the core's
//!    other shards; writes become durable in order), apply committed entries
//!    to the store and answer their clients, serve reads whose index is
//!    applied. Once a turn has applied [`APPLY_BYTES_PER_TURN`], the rest
//!    waits for the next turn, so a long backlog (a follower catching up)
//!    lets this shard's ticks and the core's other shards run in between.
//!
//! Writes are pipelined: while one flush is in flight the driver keeps taking
//! acknowledgements, committing, applying and answering, and the next batch
//! queues behind the flush. Raft runs with `async_append`, so it hands out
//! for applying only entries already durable in this member's WAL, and a
//! leader counts its own replica only once its write is durable.
//!
//! A write is acknowledged only after it is committed by a quorum (Raft) and
//! durable in this member's WAL; an append acknowledgement or a vote leaves
//! only once every write queued before it is durable.
//!
//! # Back of the envelope
//! A durable append costs ~0.1 ms on the reference disk and a loopback hop
//! ~30 µs, so a 3-member write is about one fsync on the leader in parallel
//! with one on a follower, plus two hops: ~0.25 ms. Everything that arrives
//! during one turn rides the same fsync, so throughput grows with concurrency
//! until the CPU, not the disk, is the limit.
//!
//! # Where each concern lives
//! - `open`: recovery at start (store, snapshot metadata, WAL, Raft node).
//! - `pipeline`: Ready handling, the WAL writes and what waits for them.
//! - `apply`: committed entries into the store; commits, quota, compaction.
//! - `reads`: ReadIndex rounds and the reads they confirm.
//! - `proposals`: writes into Raft, and requests held while no leader takes them.
//! - `membership`: conf changes, and leadership handed to shard 0's leader.
//! - `snapshots`: snapshot metadata, sending and installing snapshots.
//! - `leases`: lease TTLs on the leader.
//!
//! This file holds the driver's state and its loop, and dispatches commands.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use cairn_mvcc as mvcc;
use cairn_proto::cairnpb::{shard_request, ShardRequest};
use cairn_proto::etcdserverpb::{self as pb, RangeRequest, RangeResponse};
use prost::Message as _;
use tokio::sync::{mpsc, watch};

use crate::raft::{
    self, ConfChange, ConfState, EntryType, HardState, MemStorage, RawNode, Ready, Snapshot,
    SnapshotMetadata, StateRole,
};
use crate::routing::ShardId;
use crate::server::command::{
    Reply, ShardCommand, ShardPoint, ShardStatus, WriteResult, REQUEST_TIMEOUT,
};
use crate::server::convert;
use crate::server::entry;
use crate::server::errors::ApiError;
use crate::server::reply as answers;
use crate::server::revisions::RevisionCounter;

mod apply;
mod cross;
mod held_snapshot;
mod in_flight;
mod inbound;
mod lease_clock;
mod leases;
mod membership;
mod off_core;
mod open;
mod pipeline;
mod proposals;
mod reads;
mod reconfig_check;
mod snapshots;
mod spool;
mod store_swap;
#[cfg(test)]
mod test_store;
#[cfg(test)]
mod tests;
mod timer_faults;
mod watch_ranges;
mod watchers;

use apply::STORE_COMMIT_INTERVAL;
use held_snapshot::HeldSnapshot;
pub(crate) use in_flight::txn_ranges;
use lease_clock::LeaseClock;
pub use lease_clock::{LEASE_REVOKE_RETRY, MAX_LEASE_TTL_SECS};
pub use off_core::OffCoreJobs;
use pipeline::{InFlightWrite, Waiter};
use proposals::HeldWrite;
use reads::{read_context_counter, PendingPoint, PendingRead, PendingRenewal, Read, ReadRound};
pub(crate) use snapshots::write_snapshot_meta;
use snapshots::{apply_pending_table, read_snapshot_meta, IncomingSnapshot};
pub use spool::{SpoolError, SpoolWriterThread, SpooledSnapshot, StreamSpool};
pub use timer_faults::TimerFaults;

/// Committed entry bytes applied per turn at most (and per Ready): a turn that
/// reaches it yields, and the next turn goes on where it stopped. At the
/// store's apply rate (about 100 MB/s of small writes) a turn then holds its
/// core for tens of milliseconds at most, well inside a tick.
pub const APPLY_BYTES_PER_TURN: usize = 4 << 20;

/// Pages one defragment step moves (4 MiB): the most a step writes on the core.
pub const DEFRAG_STEP_PAGES: usize = 1024;

/// How often a compaction's pass over the key index takes a step while
/// the core has other work every turn (it takes its steps back to back when
/// the core has none). A step of 2,048 keys takes about 0.25 ms (at most
/// about 1.3, measured over a million keys: `cargo test --release -p
/// cairn-mvcc --test read_costs compact_cost -- --ignored --nocapture`),
/// so a busy core gives the pass about 5% of its time, and a pass over a
/// million keys ends within about 2.5 s.
pub const COMPACTION_STEP_BUSY_INTERVAL: Duration = Duration::from_millis(5);

/// Longest a tick spends on defragment steps before the shard goes on.
pub const DEFRAG_TURN: Duration = Duration::from_millis(10);

/// Inputs drained per turn before Raft's Ready is processed: bounds the time one
/// turn takes, so ticks are not starved by a flood of messages.
pub const MAX_INPUTS_PER_TURN: usize = 1024;

/// Entries kept in memory behind the applied index after a log compaction, so a
/// follower that is a little behind catches up from the log, not by snapshot
/// (etcd keeps 5,000).
pub const CATCH_UP_ENTRIES: u64 = 5_000;

/// How long a request waits for a leader to be elected before it fails with
/// etcd's "no leader": about two election timeouts, so an election in progress
/// costs a client latency, not an error.
pub const LEADERLESS_WAIT: Duration = Duration::from_secs(3);

/// Requests that may wait for a leader at once; more fail at once.
pub const MAX_LEADERLESS_REQUESTS: usize = 16_384;
/// Bytes of proposals that may wait for a leader at once; more fail at once.
pub const MAX_LEADERLESS_WRITE_BYTES: usize = 64 << 20;

/// How often the keyspace leader closes the revisions of a shard that
/// proposed nothing meanwhile, while other shards write: how long a watch
/// over several shards may hold an event back for an idle shard.
pub const KEYSPACE_CLOSE_INTERVAL: Duration = Duration::from_millis(5);

/// The part of an election timeout a keyspace lease gives up for the
/// members' clocks running at different rates.
pub const KEYSPACE_LEASE_DRIFT_DIVISOR: u32 = 10;

/// How long a shard's leader waits after trying to hand its leadership to
/// shard 0's leader before it tries again.
pub const LEADERSHIP_HANDOVER_RETRY: Duration = Duration::from_secs(1);

/// A snapshot stream on its way to a peer (see [`PeerSender::send_snapshot`]).
pub type SnapshotTransfer<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), cairn_net::StreamError>> + 'a>>;

/// How the driver sends Raft messages to the other members of its shard.
pub trait PeerSender {
    /// Queues `msg` for its `to` member. Returns false when it could not be
    /// queued (peer unknown, queue full, link closed): Raft tolerates a lost
    /// message, and the driver reports the peer unreachable.
    fn send(&self, shard: ShardId, msg: raft::Message) -> bool;

    /// Whether there is a link to member `to` for `shard` to stream a
    /// snapshot over.
    fn has_link(&self, shard: ShardId, to: u64) -> bool;

    /// Streams a snapshot of `shard` to member `to`, reading it chunk by
    /// chunk from `source`; `None` when there is no link to `to`. The
    /// transfer ends once the receiver has the whole stream, or fails.
    fn send_snapshot<'a>(
        &self,
        shard: ShardId,
        to: u64,
        source: &'a mut dyn cairn_net::StreamSource,
    ) -> Option<SnapshotTransfer<'a>>;

    /// Makes sure `shard` has a link to member `to` at `peer_urls` (a new
    /// member, or one whose URLs changed).
    fn connect(&self, shard: ShardId, to: u64, peer_urls: &[String]);

    /// Drops `shard`'s link to a removed member.
    fn disconnect(&self, shard: ShardId, to: u64);

    /// Since when `shard`'s link to member `to` has been connected without
    /// a break; `None` while it is not (or where connections are not
    /// modelled).
    fn connected_since(&self, shard: ShardId, to: u64) -> Option<std::time::Instant>;
}

/// What the network delivers to a shard.
#[derive(Debug)]
pub enum ShardInbound {
    Raft(raft::Message),
    /// A complete snapshot stream, spooled to a file in the shard's
    /// directory (see [`spool`]): its `MsgSnap`, and its store chunks.
    Snapshot(SpooledSnapshot),
}

/// Everything a shard driver starts from.
pub struct ShardSetup {
    pub shard: ShardId,
    pub member_id: u64,
    /// The voters the log started with at the cluster's creation; ignored
    /// once the log has a snapshot. Every conf change since is in the log
    /// (or behind its snapshot), so the membership rebuilt from them is the
    /// one every other member has at the same index.
    pub initial_voters: Vec<u64>,
    /// Directory of the shard's store and snapshot metadata.
    pub dir: PathBuf,
    pub wal: Rc<cairn_wal::Wal>,
    pub recovered: cairn_wal::RecoveredShard,
    pub peers: Rc<dyn PeerSender>,
    pub commands: crate::server::shard_inbox::CommandInbox,
    pub inbound: mpsc::Receiver<ShardInbound>,
    pub tick: Duration,
    pub election_ticks: u64,
    pub quota_backend_bytes: u64,
    pub snapshot_count: u64,
    pub shutdown: watch::Receiver<bool>,
    /// Where the shard records its metrics (None in tests without a registry).
    pub metrics: Option<crate::ops::server_metrics::ShardRecorder>,
    /// Readiness: told when the shard has a leader and has caught up.
    pub readiness: Option<std::sync::Arc<crate::ops::readiness::Readiness>>,
    /// The member table, updated as membership changes are applied.
    pub members: std::sync::Arc<crate::server::members::MemberRegistry>,
    /// The auth state, which shard 0's log changes.
    pub auth: Option<std::sync::Arc<crate::server::auth_state::AuthReplica>>,
    /// Test-only: the control file that stalls or fails the store's syncs
    /// (`--test-disk-faults`; the WAL reads the same file).
    pub disk_faults: Option<PathBuf>,
    /// Whether the store syncs its commits on a thread of its own (the
    /// daemon) or inline, on the core (the simulation: a thread its paused
    /// clock cannot see would let simulated time pass while a sync waits
    /// for a CPU, and make runs differ from one machine load to another).
    pub store_sync_thread: bool,
    /// Where the shard publishes its Raft term for response headers no shard
    /// produces (shard 0 only).
    pub term_out: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// Where the shard publishes its store's revision, raising the
    /// member's (`Identity::revision`) when it is ahead.
    pub revision_out: Option<std::sync::Arc<std::sync::atomic::AtomicI64>>,
    /// The keyspace's revision counter, one per member, when it runs several
    /// shards (see [`crate::server::revisions`]).
    pub keyspace: Option<std::sync::Arc<RevisionCounter>>,
    /// Seeds the Raft node's election timeouts and this start's request ids
    /// and read contexts; `None` draws them at random. The simulator sets it
    /// so that a seed names a run.
    pub seed: Option<u64>,
    /// Most entry bytes in one append to a follower (Raft's
    /// `max_size_per_msg_bytes`); `None` keeps the core's default (1 MiB).
    /// The simulator sends one entry per append on some seeds.
    pub max_append_bytes: Option<u64>,
    /// etcd's strict reconfiguration check (`reconfig_check`): on in the
    /// daemon; off in the simulator, which does not model connections.
    pub strict_reconfig: bool,
    /// Counts the shard's jobs on the blocking pool (see [`off_core`]).
    pub off_core: OffCoreJobs,
    /// The simulation's starved timer of this shard (see [`TimerFaults`]);
    /// `None` in the daemon.
    pub timer_faults: Option<Rc<TimerFaults>>,
    /// A Raft safety rule switched off, for the simulator's mutation check.
    #[cfg(feature = "raft-mutations")]
    pub mutation: Option<raft::SafetyMutation>,
}

/// An apply of one Ready's committed entries slower than this is counted as a
/// slow apply (etcd's warning threshold).
pub const SLOW_APPLY: Duration = Duration::from_millis(100);

/// Why a shard could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardOpenError {
    #[error("shard {shard}: opening its store in {dir}: {source}")]
    Store {
        shard: ShardId,
        dir: PathBuf,
        #[source]
        source: mvcc::OpenError,
    },
    #[error(transparent)]
    Entry(#[from] entry::EntryDecodeError),
    #[error("shard {shard}: {what}")]
    Recovery { shard: ShardId, what: String },
    #[error("shard {shard}: starting raft: {source}")]
    Raft {
        shard: ShardId,
        #[source]
        source: raft::RaftError,
    },
    #[error("shard {shard}: snapshot metadata {path}: {reason}")]
    SnapshotMeta {
        shard: ShardId,
        path: PathBuf,
        reason: String,
    },
}

pub struct Shard {
    id: ShardId,
    member_id: u64,
    node: RawNode<MemStorage>,
    store: mvcc::Store,
    dir: PathBuf,
    wal: Rc<cairn_wal::Wal>,
    peers: Rc<dyn PeerSender>,
    /// Proposals waiting for their apply, by request id. This and the other
    /// maps the driver walks are ordered, so that a simulated seed replays
    /// exactly.
    waiters: BTreeMap<u64, Waiter>,
    next_request_id: u64,
    /// Reads collected this turn, sent as one ReadIndex round.
    reads_this_turn: Vec<PendingRead>,
    /// Lease keep-alives collected this turn, confirmed by the same round.
    renewals_this_turn: Vec<PendingRenewal>,
    /// Read points asked this turn, confirmed by the same round.
    points_this_turn: Vec<PendingPoint>,
    /// Writes and reads that arrived while no leader was known or while this
    /// leader hands leadership over: they wait (at most [`LEADERLESS_WAIT`])
    /// instead of failing during a short election or transfer.
    leaderless_writes: std::collections::VecDeque<(Instant, HeldWrite)>,
    /// Bytes in `leaderless_writes`, at most [`MAX_LEADERLESS_WRITE_BYTES`].
    leaderless_write_bytes: usize,
    leaderless_reads: Vec<(Instant, PendingRead)>,
    /// Rounds sent, by context, awaiting their read state.
    read_rounds: BTreeMap<u64, ReadRound>,
    next_read_ctx: u64,
    /// Confirmed reads by the index that must be applied first.
    confirmed_reads: BTreeMap<u64, Vec<PendingRead>>,
    /// Keep-alives a round confirmed, with the round's start, by the index
    /// that must be applied first: the leader renews only leases it has
    /// applied, and a grant a follower already answered may be committed
    /// but not yet applied here (etcd's leader waits for its applied index
    /// likewise).
    confirmed_renewals: BTreeMap<u64, Vec<(Instant, PendingRenewal)>>,
    /// A hard state that changed only in its commit index is not synced on its
    /// own (Raft does not need it durable); it rides with the next append.
    unsynced_hard_state: Option<HardState>,
    /// Follows the WAL's durable LSN.
    durable: cairn_wal::DurableWatch,
    /// Readys whose writes are queued, oldest first.
    in_flight: std::collections::VecDeque<InFlightWrite>,
    /// LSN of the last records this shard queued in the WAL.
    last_queued_lsn: u64,
    snapshot_meta: SnapshotMetadata,
    quota_backend_bytes: u64,
    snapshot_count: u64,
    /// The keyspace's revision counter, shared by the member's shards (None
    /// with one shard, whose store numbers its writes itself).
    keyspace: Option<std::sync::Arc<RevisionCounter>>,
    /// Led here: the index this shard must apply before it tells the
    /// keyspace it is ready (its current term's first entry).
    keyspace_ready_at: Option<u64>,
    /// When this leader last tried to hand the shard to shard 0's leader.
    handover_tried: Option<Instant>,
    /// The largest revision this leader gave an entry of the shard or
    /// closed, and when (see [`Shard::maybe_close_revision`]).
    closed_revision: i64,
    closed_at: Instant,
    /// A ReadIndex round is wanted to renew this leader's keyspace lease.
    lease_round_wanted: bool,
    /// How long a confirmed round's start gives a keyspace lease for.
    lease_span: Duration,
    /// Rounds started before this do not renew the lease: a leader transfer
    /// was started, and its timeout-now message (whose campaign overrides
    /// the followers' refusal) may still arrive.
    lease_blocked_until: Option<Instant>,
    /// How long after starting a transfer no round renews the lease.
    lease_transfer_block: Duration,
    /// The txns over several shards this shard takes part in.
    cross: cross::Cross,
    nospace_alarm: bool,
    /// Set once the store or WAL failed: the shard refuses writes until restart.
    failed: Option<String>,
    /// The data of the received snapshot Raft waits to see installed.
    held_snapshot: HeldSnapshot,
    /// Membership after each conf change applied since the log's snapshot
    /// metadata, by entry index: a compaction records the membership at its
    /// own index, not the applied one.
    conf_history: Vec<(u64, ConfState)>,
    /// Outcomes of snapshot transfers to followers, reported to Raft.
    snapshot_reports_tx: mpsc::UnboundedSender<(u64, raft::SnapshotStatus)>,
    snapshot_reports: mpsc::UnboundedReceiver<(u64, raft::SnapshotStatus)>,
    /// Followers a snapshot is being streamed to right now.
    snapshots_in_flight: std::collections::BTreeSet<u64>,
    /// The tasks streaming them, which end with the shard: a stopped
    /// driver leaves no reader of its store behind. By task, the follower.
    snapshot_sends: tokio::task::JoinSet<()>,
    snapshot_send_to: HashMap<tokio::task::Id, u64>,
    /// The snapshot metadata of a log compaction, being written off the
    /// core; the log is compacted once it is durable.
    compaction: Option<apply::Compaction>,
    /// See [`ShardSetup::term_out`].
    term_out: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// See [`ShardSetup::revision_out`].
    revision_out: Option<std::sync::Arc<std::sync::atomic::AtomicI64>>,
    store_config: mvcc::Config,
    metrics: Option<crate::ops::server_metrics::ShardRecorder>,
    readiness: Option<std::sync::Arc<crate::ops::readiness::Readiness>>,
    reported_caught_up: bool,
    /// The pending-proposals figure last exported, to export changes as deltas.
    pending_reported: i64,
    watchers: watchers::ShardWatchers,
    /// Random per start (derived from [`ShardSetup::seed`] when one is
    /// given, which the simulator varies per start): makes read contexts
    /// and request ids of this incarnation distinct from any earlier one's.
    boot_nonce: u64,
    members: std::sync::Arc<crate::server::members::MemberRegistry>,
    auth: Option<std::sync::Arc<crate::server::auth_state::AuthReplica>>,
    /// Membership changes waiting for the previous one to be applied (Raft
    /// takes one at a time).
    conf_change_queue: std::collections::VecDeque<(ConfChange, Reply<WriteResult>)>,
    /// This member is a learner of the shard: it serves serializable reads only.
    is_learner: bool,
    /// Membership changes pass `reconfig_check` first.
    strict_reconfig: bool,
    /// When each peer was last heard from (any Raft message), so that a
    /// peer whose connection stays up but who answers nothing (frozen, cut
    /// off) does not count as connected for `reconfig_check`.
    peer_heard: HashMap<u64, std::time::Instant>,
    /// How long a peer may go unheard and still count: an election timeout.
    peer_heard_within: Duration,
    /// Time left of every lease, while this member leads the shard.
    lease_clock: LeaseClock,
    /// The defragment in progress, carried on in steps on the ticks.
    defrag: Option<apply::Defrag>,
    /// HashKVs that arrived while a compaction's pass over the key index
    /// ran: hashed once it ends (`Shard::answer_compaction_waiters`).
    hashes_waiting: Vec<(i64, Reply<crate::server::command::ShardHash>)>,
    /// Compactions asked with etcd's `physical`, applied, answered once what
    /// they dropped is out of the store's tree (`answer_compaction_waiters`).
    physical_compactions: Vec<(i64, Reply<WriteResult>, Result<WriteResult, ApiError>)>,
    /// When the compaction's pass over the key index last took a step.
    compaction_stepped_at: Instant,
    /// The shard's jobs on the blocking pool.
    off_core: OffCoreJobs,
}

impl Shard {
    /// Runs the shard until shutdown is signalled.
    pub async fn run(mut self, mut setup: ShardSetup) {
        let mut ticker = tokio::time::interval(setup.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut close_ticker = tokio::time::interval(KEYSPACE_CLOSE_INTERVAL);
        close_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // While there is nothing to close, the close ticks stop until the
        // counter moves (see `counter_moved`).
        let mut counter_moved = self
            .keyspace
            .as_ref()
            .map(|k| k.counter_moved.subscribe(self.id));
        let mut closes_wait = false;
        let mut last_commit = Instant::now();
        // A store over its quota raises NOSPACE again at restart, before any
        // write can add to it.
        self.check_quota();
        self.publish_revision();
        loop {
            let oldest_write = self.in_flight.front().map_or(0, |w| w.lsn);
            tokio::select! {
                biased;
                _ = setup.shutdown.changed() => break,
                // The tick first: it is ready once per interval, so it
                // cannot starve the queues below, and a flood of peer
                // messages or commands cannot starve it (elections,
                // heartbeats and lease expiry run on it).
                _ = ticker.tick() => answers::step(|| {
                    if !self.raft_ticks(setup.timer_faults.as_deref()) {
                        return;
                    }
                    if self.failed.is_none() {
                        self.lease_round_wanted |= self.keyspace.is_some()
                            && self.node.leader_id() == self.member_id;
                        self.maybe_hand_over_leadership();
                        self.expire_leases();
                        self.defragment_steps();
                        // Watchers that were behind (full queues) catch up.
                        self.watchers.sweep_closed();
                        self.watchers.notify(self.id, &mut self.store);
                        if last_commit.elapsed() >= STORE_COMMIT_INTERVAL {
                            self.commit_store();
                            last_commit = Instant::now();
                        }
                    }
                    self.expire();
                }),
                _ = close_ticker.tick(), if self.keyspace.is_some()
                    && (!closes_wait || self.cross.unproposed_waits())
                    && self.failed.is_none()
                    && self.node.leader_id() == self.member_id => {
                    self.retry_cross_part();
                    if !self.maybe_close_revision() {
                        if let Some(seen) = counter_moved.as_mut() {
                            closes_wait = self.closes_may_wait(seen);
                        }
                    }
                }
                _ = moved(&mut counter_moved), if closes_wait => closes_wait = false,
                durable = self.durable.wait_for(oldest_write), if !self.in_flight.is_empty() && self.failed.is_none() => {
                    if !durable {
                        self.fail(self.wal_failure());
                    }
                }
                Some(msg) = setup.inbound.recv() => answers::step(|| {
                    self.receive(msg);
                    for _ in 0..MAX_INPUTS_PER_TURN {
                        match setup.inbound.try_recv() {
                            Ok(m) => self.receive(m),
                            Err(_) => break,
                        }
                    }
                }),
                (md, written) = apply::compaction_written(&mut self.compaction), if self.compaction.is_some() => {
                    self.compacted(md, written);
                }
                Some((to, status)) = self.snapshot_reports.recv() => {
                    self.snapshots_in_flight.remove(&to);
                    self.node.report_snapshot(to, status);
                }
                Some(cmd) = setup.commands.recv() => answers::step(|| {
                    // Serializable reads are answered here.
                    self.handle(cmd);
                    for _ in 0..MAX_INPUTS_PER_TURN {
                        match setup.commands.try_recv() {
                            Some(c) => self.handle(c),
                            None => break,
                        }
                    }
                }),
                // The previous turn stopped at its apply budget: go on,
                // after anything above that is ready (the tick first).
                _ = tokio::task::yield_now(), if self.node.has_ready() && self.failed.is_none() => {}
                // A store commit goes on by a step when nothing above is ready.
                _ = tokio::task::yield_now(), if self.store.commit_running() && self.failed.is_none() => {
                    answers::step(|| self.store_commit_step());
                }
                // So does a compaction's pass over the key index.
                _ = tokio::task::yield_now(), if self.store.compaction_running() && self.failed.is_none() => {
                    answers::step(|| self.store_compaction_step());
                }
            }
            if self.failed.is_some() {
                answers::step(|| self.refuse_as_failed());
                continue;
            }
            // A compaction's pass over the key index goes on however busy
            // the core: a step at least every COMPACTION_STEP_BUSY_INTERVAL.
            if self.store.compaction_running()
                && self.compaction_stepped_at.elapsed() >= COMPACTION_STEP_BUSY_INTERVAL
            {
                answers::step(|| self.store_compaction_step());
            }
            answers::step(|| self.after_inputs());
            let mut applied_bytes = 0;
            while self.node.has_ready() && self.failed.is_none() {
                let rd = self.node.ready();
                applied_bytes += rd
                    .committed_entries
                    .iter()
                    .map(|e| e.data.len())
                    .sum::<usize>();
                self.handle_ready(rd).await;
                // A leader may have just become known.
                answers::step(|| self.after_inputs());
                if applied_bytes >= APPLY_BYTES_PER_TURN {
                    if let Some(m) = &self.metrics {
                        m.apply_turn_capped();
                    }
                    break;
                }
            }
        }
        if self.failed.is_none() {
            self.commit_store_now();
        }
        tracing::info!(shard = self.id, "shard stopped");
    }

    /// A failed shard takes no further part in Raft: it cannot make
    /// anything durable. Clients get the failure as their answer.
    fn refuse_as_failed(&mut self) {
        let err = self.storage_error(self.failed.clone().unwrap_or_default());
        for r in self.reads_this_turn.drain(..) {
            r.fail(err.clone());
        }
        let confirmed = self.take_confirmed_renewals();
        for r in self.renewals_this_turn.drain(..).chain(confirmed) {
            let _ = r.reply.send(Err(err.clone()));
        }
        for p in self.points_this_turn.drain(..) {
            let _ = p.reply.send(Err(err.clone()));
        }
        if let Some(defrag) = self.defrag.take() {
            for reply in defrag.into_replies() {
                let _ = reply.send(Err(err.clone()));
            }
        }
        for (_, reply) in self.hashes_waiting.drain(..) {
            let _ = reply.send(Err(err.clone()));
        }
        for (_, reply, _) in self.physical_compactions.drain(..) {
            let _ = reply.send(Err(err.clone()));
        }
    }

    /// After a turn's inputs or a Ready: appends made durable handed to
    /// Raft, requests held for a leader released once one is known, and a
    /// ReadIndex round started for the reads gathered.
    fn after_inputs(&mut self) {
        self.complete_writes();
        self.release_leaderless();
        self.start_read_round();
        self.answer_compaction_waiters();
    }

    fn handle(&mut self, cmd: ShardCommand) {
        match cmd {
            ShardCommand::Write { request, reply } => self.propose(request, reply),
            ShardCommand::Range { request, at, reply } => {
                let serializable = request.serializable;
                self.read(Read::Range(request, reply), serializable, at);
            }
            ShardCommand::ReadTxn {
                request,
                serializable,
                at,
                reply,
            } => self.read(Read::Txn(request, reply), serializable, at),
            ShardCommand::ReadCompares {
                compares,
                serializable,
                at,
                reply,
            } => self.read(Read::Compares(compares, reply), serializable, at),
            ShardCommand::ReadPoint { reply } => self.read_point(reply),
            ShardCommand::Status { reply } => {
                let _ = reply.send(Ok(self.status()));
            }
            ShardCommand::Watch {
                key,
                spec,
                start_revision,
                tx,
                reply,
            } => {
                let current = self.store.current_revision();
                self.watchers.add(key, spec, start_revision, current, tx);
                let _ = reply.send(Ok(current));
                // A watcher starting in the past gets its history now.
                self.watchers.notify(self.id, &mut self.store);
            }
            ShardCommand::CancelWatch { key, reply } => {
                self.watchers.remove(&key);
                let _ = reply.send(Ok(()));
            }
            ShardCommand::Snapshot { tx, reply } => {
                if let Some(reason) = &self.failed {
                    let _ = reply.send(Err(self.storage_error(reason.clone())));
                    return;
                }
                // A consistent image at the applied index, read as the client
                // takes it; the shard keeps writing meanwhile.
                let stream = self.store.snapshot_stream();
                let _ = reply.send(Ok(stream.applied_index()));
                tokio::task::spawn_local(async move {
                    for chunk in stream {
                        let failed = chunk.is_err();
                        if tx.send(chunk.map_err(|e| e.to_string())).await.is_err() || failed {
                            return;
                        }
                    }
                });
            }
            ShardCommand::Defragment { reply } => self.defragment(reply),
            ShardCommand::WatchProgress { stream, reply } => {
                // Deliver what can go out now, then say how far that got.
                self.watchers.notify(self.id, &mut self.store);
                let current = self.store.current_revision();
                let _ = reply.send(Ok(self.watchers.delivered_through(stream, current)));
            }
            ShardCommand::ConfChange {
                change,
                member,
                check_only,
                reply,
            } => self.propose_conf_change(change, member, check_only, reply),
            ShardCommand::HashKv { revision, reply } => self.serve_hash_kv(revision, reply),
            ShardCommand::LeaseRenew { ids, reply } => self.lease_renew(ids, reply),
            ShardCommand::LeaseQuery { id, keys, reply } => {
                let _ = reply.send(self.lease_query(id, keys));
            }
            ShardCommand::LeaseKeys { id, reply } => {
                let _ = reply.send(Ok(self.store.lease(id).map(|l| l.keys)));
            }
            ShardCommand::LeaseList { reply } => {
                let ids = self.store.leases().iter().map(|l| l.id).collect();
                let _ = reply.send(Ok(ids));
            }
            cmd @ (ShardCommand::CrossHold { .. }
            | ShardCommand::CrossCheck { .. }
            | ShardCommand::CrossHasLease { .. }
            | ShardCommand::CrossPropose { .. }
            | ShardCommand::CrossRelease { .. }
            | ShardCommand::CrossForget { .. }
            | ShardCommand::CrossRecords { .. }) => self.handle_cross(cmd),
            ShardCommand::TransferLeader { to, reply } => {
                let _ = reply.send(self.transfer_leader(to));
            }
        }
    }

    fn header(&self, revision: i64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            cluster_id: 0,
            member_id: 0,
            revision,
            raft_term: self.node.term(),
        }
    }

    fn status(&self) -> ShardStatus {
        let conf_state = self.node.status().conf_state;
        ShardStatus {
            shard: self.id,
            leader: self.node.leader_id(),
            term: self.node.term(),
            commit_index: self.node.committed_index(),
            applied_index: self.node.applied_index(),
            revision: self.store.current_revision(),
            compact_revision: self.store.compact_revision(),
            db_size_bytes: self.store.size_bytes(),
            db_size_in_use_bytes: self.store.size_in_use_bytes(),
            is_learner: self.is_learner,
            nospace_alarm: self.nospace_alarm,
            learners: conf_state.learners,
        }
    }
}

/// The next move of the keyspace counter that `seen` waits for (never,
/// without a keyspace).
async fn moved(seen: &mut Option<watch::Receiver<u64>>) {
    match seen {
        Some(rx) => {
            let _ = rx.changed().await;
        }
        None => std::future::pending().await,
    }
}

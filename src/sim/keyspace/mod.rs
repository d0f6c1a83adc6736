//! A deterministic simulator of one keyspace over several shards
//! (`docs/KEYSPACE.md`): every member runs one real
//! [`RawNode`](crate::raft::RawNode) per shard, each shard its own Raft
//! group, and one member at a time, the *keyspace leader*, hands out
//! revisions to the writes of every shard from one in-memory counter. On
//! top: single-shard writes, txns over several shards, linearizable reads
//! over several shards at one read point, and a watch over every shard on
//! every member, each modelled on the code it stands for, with a checker
//! for atomicity, strict serializability of the multi-key history, and
//! watch order and completeness.
//!
//! One `u64` seed decides everything: the network, crashes, pauses,
//! disk-write completions and the client workload.
//! Replaying a seed replays the run exactly.
//!
//! # What a member is
//! A member is `S` shards (`S` in `1..=MAX_SHARDS`, drawn from the seed
//! unless fixed), each a `RawNode<MemStorage>` driven by the same Ready
//! contract as the shard driver (messages leave when the Ready is
//! taken; entries, hard state and the messages that wait for them only when
//! the shard's own simulated disk write completes), plus the keyspace state
//! kept in memory: the revision counter and its opening, and per shard the
//! leader lease, the hold of a txn over several shards, and the read
//! points waiting for it. Each shard's state machine is a small MVCC store
//! of [`KEYS_PER_SHARD`] keys (every key's history, so a shard reads
//! at any revision) with the records of txns over several shards; it is
//! rebuilt by replay. Every shard of a member crashes and restarts
//! together; each shard's disk survives, everything in memory does not.
//! Logs are never compacted, so a restarted member replays each shard from
//! index 1.
//!
//! Each member reads its own monotonic clock, which runs at a rate within
//! [`MAX_CLOCK_SKEW_MTICKS`] (4%) of the simulation's tick, so any two
//! members' rates are within 10% of each other: its Raft timers tick when
//! it passes a whole tick, and its leases are measured on it. That is the
//! only clock the model has, as in Cairn: revisions and leases use no wall
//! clock, so wall-clock jumps have nothing to act on.
//!
//! Each shard's messages travel on their own simulated network (as they
//! would on their own connections); partitions cut a link between two
//! members on every shard's network at once.
//!
//! # Keyspace leadership
//! - Whoever leads shard 0 asks the leader of every other shard, once it is
//!   itself caught up there, to transfer that shard's leadership to it.
//! - Once a member leads every shard with each no-op applied, its counter
//!   *opens*: first the txns over several shards that earlier leaders left
//!   half-proposed are finished (`cross/opening.rs`: the fence, the
//!   records, the missing parts, the done entries), then the counter is set
//!   to the largest of what it handed out, the shards' revisions and the
//!   start of its epoch (shard 0's term `<< 32`, as
//!   `src/server/revisions/mod.rs`). Any shard ceasing to be ready closes it.
//! - A member gives a write a revision only while its counter is open, it
//!   leads every shard with each no-op applied, its guard agrees, and no
//!   txn holds the write's shard. It proposes the write stamped with
//!   `counter + 1`; members apply it at that revision. Payloads are text
//!   (`kv.rs`).
//! - Clients send each op to a random live member (half the time to one
//!   that believes it leads shard 0); a write there is refused unless that
//!   member assigns, a txn is forwarded to the member it believes leads
//!   shard 0, and a read asks that member for its read point. A refused op
//!   is retried at the next tick, a bounded number of times. A write is
//!   acknowledged when the member that proposed it applies it.
//! - Txns over several shards (`cross/`) run in batches, as
//!   `src/server/keyspace/txn_batch.rs` runs them: a txn joins the last batch over
//!   the same shards still waiting for its holds when it names no key a
//!   txn of the batch names and the batch has room ([`MAX_BATCH_TXNS`],
//!   [`MAX_BATCH_BYTES`]), else leads a new one. A batch holds each shard
//!   once, gives its txns revisions in join order, and each shard it
//!   writes proposes the batch's parts there in one entry, each applied at
//!   its own revision; one forget per shard.
//! - Txns and reads over several shards
//!   (`reads.rs`) are run step by step, each call between cores one step
//!   among the tick's events; the watch (`watch.rs`) merges every shard's
//!   applied events by revision, moved on idle shards by the keyspace
//!   leader's close entries.
//! - A read point gives each shard's index with the term of the entry
//!   there in the log of the shard's leader that answered; a member serves
//!   the read once it has applied the index, only if its entry there has
//!   that term (Raft's log matching), else refuses it as "leader changed"
//!   and the client asks again (`reads.rs`).
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
//! timeout-now that late. Lease time is the member's monotonic clock,
//! which a pause does not stop; the Raft ticks of a paused member stop, and
//! catch up in a bunch when it resumes. The margin is one tick (the
//! followers' timers count whole ticks) and 10% of the election timeout
//! (the clocks' rates), as in `src/server/revisions/mod.rs`.
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
//! Aimed at the batches: clients send bursts of txns over the same shards,
//! most naming keys no other txn of the burst names and some not, so that
//! txns join batches and are turned away for a key in common or a full
//! batch; and the leading txn of a batch still waiting for its holds may
//! end (its client went away), which tells its joiners to retry.
//!
//! Aimed at the txn protocol: each seed draws how long a part's proposal
//! may wait in its shard's core queue (so a txn's parts reach their shards
//! apart), and leader transfers of the coordinator's shards while it runs
//! a txn, per tick and right after it proposed a part while another waits:
//! of a shard whose part is still to come (Raft refuses the part while the
//! transfer runs), or of another one (the counter closes, and opens again
//! with a fence and a finishing when shard 0's leader pulls it back), often
//! to a member that is down, so that the transfer times out.
//!
//! # What is checked
//! As the run goes:
//! - election safety, per shard (Raft paper 5.2);
//! - state machine safety, per shard: every member applies the same entry,
//!   with the same revision, at a `(shard, index)` (5.4.3);
//! - along each shard's applied log, revisions (writes, parts, closes)
//!   strictly increase;
//! - no revision is applied for two different ops (a txn's parts share
//!   one), and a txn's parts are all at one revision; in an entry of a
//!   batch's parts, each part's revision is above the one before it;
//! - real-time order: an op invoked after another was acknowledged sits
//!   later in the revision order (a write or txn at a larger revision, a
//!   read at a point at or above), checked for every write and txn that gets
//!   applied, acknowledged or not, and every acknowledged read;
//! - every watch releases events in revision order, and no shard sends it
//!   an event at or below what it already released;
//! - liveness: once the faults stop, a write to every shard is acknowledged
//!   within [`LIVENESS_BOUND_TICKS`].
//!
//! Then the run settles (no new ops; everything in progress ends, an open
//! keyspace leader has finished what earlier ones left, every member has
//! applied every shard's whole log, within [`SETTLE_BOUND_TICKS`]), and
//! `history.rs` checks atomicity (every txn with a part anywhere has its
//! parts on exactly the shards its plan writes, at one revision, applied on
//! every member), strict serializability (the committed history replayed
//! in revision order: every txn applied the branch its compares choose at
//! `T - 1`; every acknowledged txn's answer and read's values are that
//! history's at their revision), and each watch's completeness (exactly the
//! history's events up to where it released).
//!
//! # Not modelled
//! The batch closes once it holds every shard (the real one once the hold
//! table gives it its shards, before it asks them: the model takes its
//! holds one shard at a time and stays open meanwhile); its compares are
//! read after its revisions are taken, not with the holds. A txn of a
//! batch whose ops a shard's check refuses (NOSPACE) fails alone in the
//! real code; here no check refuses. As in the real code, a shard gets
//! all of a batch's parts there at once and proposes them in one entry.
//!
//! Nested txns, ranges (a read reads every key of its shards; a txn's gets
//! read one key), leases (etcd's), compaction, snapshots, membership
//! changes, serializable reads, the held-write and hold queues' bounds,
//! Raft's uncommitted-entry limit (a part Raft refuses for it is retried by
//! the real code with the hold kept), the CrossCheck refusals (NOSPACE, a
//! missing lease), forwarded single-shard writes and the held-write queue
//! (a write a member cannot take now is refused and retried by its
//! client), and the real shard driver itself (issue 20): this is a model
//! of it, step for step.
//!
//! The `keyspace-sim` example runs many seeds with a chosen guard,
//! [`Protocol`] and planted [`Bug`]; `tests/keyspace_sim.rs` runs a few
//! hundred and shows that the unguarded variant, the protocol as built and
//! each planted bug are caught.

mod adversary;
mod checker;
mod client;
mod cross;
mod faults;
mod history;
mod kv;
mod member;
mod reads;
mod transport;
mod watch;
mod world;

use std::fmt;

pub use checker::{KsViolation, KsViolationKind};
pub use kv::KEYS_PER_SHARD;

use super::{ELECTION_TIMEOUT_TICKS, MAX_DELAY_TICKS};

/// Most shards a simulated member runs.
pub const MAX_SHARDS: usize = 4;
/// Most members a simulated keyspace has.
pub const MAX_MEMBERS: usize = 7;
/// Ticks the lease leaves unused at its end: one for the tick granularity
/// of the followers' election timers, and 10% of the election timeout for
/// the members' clock rates (`src/server/revisions/mod.rs`: "election timeout
/// less one tick and a drift margin").
pub const LEASE_MARGIN_TICKS: u64 = 1 + ELECTION_TIMEOUT_TICKS / 10;
/// A member's clock counts thousandths of a tick.
pub const MTICKS_PER_TICK: u64 = 1_000;
/// A member's clock gains or loses at most this many mticks per tick (4%):
/// any two members' rates are within 10% of each other, the lease's
/// assumption.
pub const MAX_CLOCK_SKEW_MTICKS: u64 = 40;
/// Steps each txn, read and opening in progress may take per tick.
pub const ACTOR_STEPS_PER_TICK: usize = 3;
/// A txn or a read in progress, or a request of an opening's finishing,
/// gives up after this many ticks (the real code's request timeout).
pub const MAX_TXN_TICKS: u64 = 3 * ELECTION_TIMEOUT_TICKS;
/// Longest a part's proposal waits in its shard's core queue.
pub const MAX_PART_DELAY_TICKS: u64 = 2 * ELECTION_TIMEOUT_TICKS;
/// After liveness, the run must settle (nothing in progress, every log
/// applied everywhere) within this many ticks.
pub const SETTLE_BOUND_TICKS: u64 = 20 * ELECTION_TIMEOUT_TICKS;
/// Longest a member is paused, in ticks.
pub const MAX_PAUSE_TICKS: u64 = 3 * ELECTION_TIMEOUT_TICKS;
/// After a transfer was last seen in progress, its timeout-now may still be
/// in the network (delay) or waiting at a paused transferee: a lease is not
/// taken from a round issued within this many ticks of it.
pub const TRANSFER_TAINT_TICKS: u64 = MAX_DELAY_TICKS + MAX_PAUSE_TICKS + 1;
/// After the faults stop, a write to every shard must be acknowledged within
/// this many ticks: elections on every shard, the transfers to shard 0's
/// leader, a lease round and a commit, with room for lost election rounds (a
/// candidate whose log is too short to win can lose several in a row).
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
/// Most txns one batch runs: the real bound (`src/server/keyspace/txn_batch.rs`).
pub const MAX_BATCH_TXNS: usize = crate::server::keyspace::txn_batch::MAX_BATCH;
/// Most bytes of txns (their encoded text) a txn joins a batch up to. The
/// real bound (512 KiB) is far above anything the model's txns reach; this
/// one, about three of them, binds, so that both reasons to lead a new
/// batch (a key in common, a full batch) come about.
pub const MAX_BATCH_BYTES: usize = 120;

const _: () = assert!(LEASE_MARGIN_TICKS < ELECTION_TIMEOUT_TICKS);
// Rates within 10% of each other.
const _: () = assert!(
    (MTICKS_PER_TICK + MAX_CLOCK_SKEW_MTICKS) * 10
        <= (MTICKS_PER_TICK - MAX_CLOCK_SKEW_MTICKS) * 11
);
// The lease, measured on the slowest clock, ends before the fastest
// follower's election timer (which may fire one of its ticks early) can.
const _: () = assert!(
    (ELECTION_TIMEOUT_TICKS - LEASE_MARGIN_TICKS) * (MTICKS_PER_TICK + MAX_CLOCK_SKEW_MTICKS)
        <= (ELECTION_TIMEOUT_TICKS - 1) * (MTICKS_PER_TICK - MAX_CLOCK_SKEW_MTICKS)
);
const _: () = assert!(MAX_TXN_TICKS < LIVENESS_BOUND_TICKS);
const _: () = assert!(MAX_PART_DELAY_TICKS < MAX_TXN_TICKS);
const _: () = assert!(MIN_CHAOS_TICKS <= MAX_CHAOS_TICKS);
const _: () = assert!(MAX_BATCH_TXNS >= 2 && MAX_BATCH_BYTES > 0);
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

/// Which protocol for txns and reads over several shards the members run.
///
/// The model of the code as built (`AsBuilt`) is caught by the checker:
/// when a part is refused by Raft (a leader transfer of its shard is in
/// progress), `cross_propose` still releases the hold, and if the transfer
/// then times out the same member keeps its counter open, with no opening
/// and so no finishing: the shard takes later revisions, the part never
/// comes, and a read point asked while the shard was held is answered
/// without it. `Fixed` adds two changes (see `cross/parts.rs` and
/// `reads.rs`):
///
/// 1. a part refused after `T` was taken makes its shard not ready
///    (`RevisionCounter::shard_not_ready`), so the counter closes and opens again
///    only after a finishing, which proposes the missing part if another
///    part committed;
/// 2. a read point is answered only if the counter is still open, in the
///    same opening, once every shard has answered its index (so that no
///    finishing ran in between, whose parts the indexes may lack).
///
/// `ReopenOnly` is the first change alone: the fence of a later opening
/// still answers read points held back by a half-proposed txn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    AsBuilt,
    ReopenOnly,
    Fixed,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::AsBuilt, Protocol::ReopenOnly, Protocol::Fixed];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::AsBuilt => "as-built",
            Protocol::ReopenOnly => "reopen-only",
            Protocol::Fixed => "fixed",
        }
    }

    /// A refused part closes the counter until a finishing has run.
    pub fn reopens_on_part_failure(self) -> bool {
        matches!(self, Protocol::ReopenOnly | Protocol::Fixed)
    }

    /// A read point checks that the counter stayed open in one opening.
    pub fn checks_point_opening(self) -> bool {
        matches!(self, Protocol::Fixed)
    }

    /// Parses a protocol as the example's `--protocol` flag spells it.
    pub fn parse(name: &str) -> Result<Protocol, KsConfigError> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| KsConfigError::UnknownProtocol(name.to_string()))
    }
}

/// A bug planted in the model of txns, reads and watches over several
/// shards, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The model as built.
    None,
    /// An opening does not finish the txns earlier leaders left
    /// half-proposed.
    SkipFinish,
    /// An opening's ask for records does not end the holds first.
    NoFence,
    /// A read at a point is served without waiting for the point's index
    /// to be applied.
    SkipReadWait,
    /// A read at a point is served once the point's index is applied
    /// without checking that the entry there has the point's term: an
    /// entry of a new shard leader that replaced the one the point's
    /// leader had appended passes.
    SkipReadTerm,
    /// A watch releases each shard's events as they come, not merged.
    WatchNoMerge,
    /// A shard applies an entry of a batch's parts all at the entry's
    /// revision (its last part's), not each part at its own.
    BatchOneRevision,
    /// A txn joins the last batch over its shards even when it names a key
    /// a txn of the batch names: its compares and reads are still those of
    /// the keyspace before the batch.
    JoinIgnoresOverlap,
}

impl Bug {
    pub const ALL: [Bug; 8] = [
        Bug::None,
        Bug::SkipFinish,
        Bug::NoFence,
        Bug::SkipReadWait,
        Bug::SkipReadTerm,
        Bug::WatchNoMerge,
        Bug::BatchOneRevision,
        Bug::JoinIgnoresOverlap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::None => "none",
            Bug::SkipFinish => "skip-finish",
            Bug::NoFence => "no-fence",
            Bug::SkipReadWait => "skip-read-wait",
            Bug::SkipReadTerm => "skip-read-term",
            Bug::WatchNoMerge => "watch-no-merge",
            Bug::BatchOneRevision => "batch-one-revision",
            Bug::JoinIgnoresOverlap => "join-ignores-overlap",
        }
    }

    /// Parses a bug as the example's `--bug` flag spells it.
    pub fn parse(name: &str) -> Result<Bug, KsConfigError> {
        Bug::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| KsConfigError::UnknownBug(name.to_string()))
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
    pub protocol: Protocol,
    pub bug: Bug,
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
            protocol: Protocol::Fixed,
            bug: Bug::None,
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
    #[error(
        "unknown bug {0:?} (known: none, skip-finish, no-fence, skip-read-wait, skip-read-term, watch-no-merge, batch-one-revision, join-ignores-overlap)"
    )]
    UnknownBug(String),
    #[error("unknown protocol {0:?} (known: as-built, reopen-only, fixed)")]
    UnknownProtocol(String),
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
    pub txns_invoked: u64,
    /// Batches of txns over several shards started by keyspace leaders
    /// (a txn that joins a batch starts none; a client's retry enters
    /// anew).
    pub txn_runs: u64,
    /// Txns with a part applied somewhere.
    pub txns_applied: u64,
    pub txns_acked: u64,
    /// Runs that ended before proposing anything (the client retried).
    pub txn_retries: u64,
    /// Runs whose client was told the outcome is unknown (or heard nothing).
    pub txn_unknown: u64,
    pub parts_proposed: u64,
    /// Parts proposed by an opening's finishing.
    pub parts_finished: u64,
    pub finish_retries: u64,
    /// Fences (an opening's ask for records) that ended the hold of a txn
    /// with a part already proposed on another shard.
    pub fences_under_half_txn: u64,
    /// Times a counter opened.
    pub openings: u64,
    /// Batches of txns over several shards that took their holds (a
    /// batch of one txn included), and the txns they ran.
    pub batches: u64,
    pub batched_txns: u64,
    /// Most txns one batch ran.
    pub batch_max_txns: u64,
    /// Txns that joined a batch another txn led.
    pub batch_joins: u64,
    /// Txns that led a new batch because the last one over their shards
    /// named one of their keys, or was full (txns or bytes).
    pub joins_refused_overlap: u64,
    pub joins_refused_full: u64,
    /// Entries of a batch's parts with more than one part.
    pub parts_entries: u64,
    /// Batches with an entry of parts refused (or never proposed) on one
    /// shard while another shard's was proposed.
    pub batches_half_proposed: u64,
    /// Batches of several txns of which an opening's finishing proposed
    /// a part, and the parts it proposed.
    pub batches_finished_by_opening: u64,
    pub batch_parts_finished: u64,
    /// Batches whose leader ended before they took their holds: their
    /// joined txns were told to retry.
    pub batches_abandoned: u64,
    pub reads_invoked: u64,
    pub reads_acked: u64,
    /// Reads refused because the entry at a shard's point index had
    /// another term where they were served (a new leader replaced it).
    pub reads_leader_changed: u64,
    pub closes_proposed: u64,
    /// Events released by the watches (every incarnation's), at the end.
    pub watch_events_released: u64,
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
        self.txns_invoked += o.txns_invoked;
        self.txn_runs += o.txn_runs;
        self.txns_applied += o.txns_applied;
        self.txns_acked += o.txns_acked;
        self.txn_retries += o.txn_retries;
        self.txn_unknown += o.txn_unknown;
        self.parts_proposed += o.parts_proposed;
        self.parts_finished += o.parts_finished;
        self.finish_retries += o.finish_retries;
        self.fences_under_half_txn += o.fences_under_half_txn;
        self.openings += o.openings;
        self.batches += o.batches;
        self.batched_txns += o.batched_txns;
        self.batch_max_txns = self.batch_max_txns.max(o.batch_max_txns);
        self.batch_joins += o.batch_joins;
        self.joins_refused_overlap += o.joins_refused_overlap;
        self.joins_refused_full += o.joins_refused_full;
        self.parts_entries += o.parts_entries;
        self.batches_half_proposed += o.batches_half_proposed;
        self.batches_finished_by_opening += o.batches_finished_by_opening;
        self.batch_parts_finished += o.batch_parts_finished;
        self.batches_abandoned += o.batches_abandoned;
        self.reads_invoked += o.reads_invoked;
        self.reads_acked += o.reads_acked;
        self.reads_leader_changed += o.reads_leader_changed;
        self.closes_proposed += o.closes_proposed;
        self.watch_events_released += o.watch_events_released;
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
    pub protocol: Protocol,
    pub bug: Bug,
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

/// Runs seeds `first_seed..first_seed + seeds` of `template` (its seed is
/// ignored), stopping once `max_violations` seeds have violated a check.
pub fn run_seeds(
    template: &KsConfig,
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
        let mut cfg = template.clone();
        cfg.seed = seed;
        cfg.trace = false;
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
            "seed={} members={} shards={} guard={} protocol={} bug={}",
            self.seed,
            self.members,
            self.shards,
            self.guard.name(),
            self.protocol.name(),
            self.bug.name()
        )?;
        match &self.violation {
            None => write!(f, " steps={} ok", self.stats.steps),
            Some(v) => write!(f, " VIOLATION {v}"),
        }
    }
}

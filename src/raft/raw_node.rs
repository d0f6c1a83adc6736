//! The synchronous interface a driver uses: feed inputs, take a `Ready`,
//! carry it out, `advance`.
//!
//! # The driver loop
//!
//! ```text
//! loop {
//!     feed: tick() on a timer, step(msg) per received message,
//!           propose / read_index / transfer_leader from clients
//!     if node.has_ready() {
//!         let rd = node.ready();
//!         1. send rd.messages now (the leader's appends go out while it writes)
//!         2. persist rd.snapshot, rd.entries (replacing any overlapped suffix)
//!            and rd.hard_state, then make them durable (fsync)
//!         3. send rd.persisted_messages (votes and append acknowledgements)
//!         4. apply rd.snapshot and rd.committed_entries to the state machine,
//!            calling apply_conf_change for conf change entries; serve
//!            rd.read_states once applied reaches their index
//!         5. node.advance(rd)
//!     }
//! }
//! ```
//!
//! Every `MsgSnap` sent must be followed by `report_snapshot(to, outcome)`;
//! an unreachable peer may be reported with `report_unreachable(to)`.
//!
//! `advance(rd)` says: everything in `rd` is durable and applied. A driver
//! that applies asynchronously calls `advance_append(rd)` after step 3 and
//! `advance_apply_to(index)` once the state machine has applied up to
//! `index`. Without `Config::async_append`, exactly one `Ready` may be
//! outstanding: do not call `ready()` again before advancing the previous
//! one. Stepping messages while a Ready is outstanding is allowed.
//!
//! Committed entries may include entries of the same Ready's `entries`; the
//! driver persists before it applies, so nothing is applied that is not
//! durable locally.
//!
//! # Pipelined writes (`Config::async_append`)
//!
//! The driver may take the next `Ready` while earlier ones are still being
//! written, so a write is always in flight while the next batch forms:
//!
//! ```text
//! loop {
//!     feed inputs, as above
//!     for each outstanding Ready whose write is durable, oldest first:
//!         send its persisted_messages, then advance_append(rd)
//!     if node.has_ready() {
//!         let rd = node.ready();
//!         1. send rd.messages now
//!         2. start writing rd.snapshot, rd.entries, rd.hard_state; writes
//!            become durable in the order they were started
//!         3. keep rd outstanding; its persisted_messages wait for its write
//!            (and so for every earlier one)
//!         4. apply rd.committed_entries now and report them with
//!            on_entries_applied: they are committed and already durable here
//!     }
//! }
//! ```
//!
//! Each `Ready` carries only entries not handed out before; an entry
//! replaced while it was being written (a new leader overwrote the tail) is
//! handed out again. A `Ready` in which a candidate or leader changed its
//! term or vote is the last one handed out until it is advanced: nothing of
//! a new term (entries, appends to learners of a single-voter group) leaves
//! before the term and vote are durable, so a crash cannot let a member lead
//! the same term twice with different entries. `advance_append` of a write whose tail was replaced
//! meanwhile changes nothing: the later write covers it.

use bytes::Bytes;
use prost::Message as _;

use super::config::Config;
use super::core::{is_local_msg, new_msg, Raft, StateRole};
use super::progress::ProgressState;
use super::storage::Storage;
use super::{
    ConfChange, ConfState, Entry, EntryType, HardState, Message, MessageType, RaftError, Snapshot,
    NONE,
};

/// Volatile state worth reporting: who leads and what this member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SoftState {
    pub leader_id: u64,
    pub role: StateRole,
}

/// A linearizable read the leader confirmed: once the state machine has
/// applied `index`, the read identified by `request_ctx` may be served.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadState {
    pub index: u64,
    pub request_ctx: Bytes,
}

/// Whether a snapshot reached its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotStatus {
    Finish,
    Failure,
}

/// Everything the driver must do after feeding inputs.
#[derive(Debug, Default)]
pub struct Ready {
    /// Set when leader or role changed.
    pub soft_state: Option<SoftState>,
    /// Set when term, vote or commit changed; persist it with `entries`.
    pub hard_state: Option<HardState>,
    /// Linearizable reads confirmed since the last Ready.
    pub read_states: Vec<ReadState>,
    /// Entries to append to durable storage, replacing any suffix at or
    /// after the first one's index.
    pub entries: Vec<Entry>,
    /// A snapshot to install (persist, then restore the state machine from).
    pub snapshot: Option<Snapshot>,
    /// Committed entries to apply, in order.
    pub committed_entries: Vec<Entry>,
    /// Messages that may be sent at once, before anything is persisted.
    pub messages: Vec<Message>,
    /// Messages that may be sent only after `entries`, `hard_state` and
    /// `snapshot` are durable.
    pub persisted_messages: Vec<Message>,
    /// Whether the persisted state must reach the disk with a sync before
    /// `persisted_messages` go out (false when only the commit index moved).
    pub must_sync: bool,
}

/// Replication state of one member, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    pub id: u64,
    pub matched: u64,
    pub next_idx: u64,
    pub state: ProgressState,
    pub is_learner: bool,
    pub inflight_msgs: usize,
}

/// A snapshot of a member's Raft state, for observation and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub id: u64,
    pub hard_state: HardState,
    pub soft_state: SoftState,
    pub applied: u64,
    pub last_index: u64,
    pub first_index: u64,
    pub lead_transferee: u64,
    pub conf_state: ConfState,
    /// Only on the leader.
    pub progress: Vec<PeerStatus>,
}

/// One member of a Raft group, driven synchronously.
pub struct RawNode<S: Storage> {
    raft: Raft<S>,
    prev_soft_state: SoftState,
    prev_hard_state: HardState,
    /// With `async_append`: the term and vote of a handed-out Ready in which
    /// this member, as candidate or leader, changed them and that is not yet
    /// durable. No further Ready is handed out until it is, so nothing of a
    /// new term leaves before the term does.
    term_vote_in_flight: Option<(u64, u64)>,
}

impl<S: Storage> RawNode<S> {
    /// Starts a member from what `storage` holds: a new member of a new
    /// cluster (empty log with initial membership), or a restart from a
    /// snapshot plus log. `config.applied_index` says how far the state
    /// machine got.
    pub fn new(config: &Config, storage: S) -> Result<Self, RaftError> {
        let raft = Raft::new(config, storage)?;
        let prev_hard_state = raft.hard_state();
        let prev_soft_state = SoftState {
            leader_id: raft.leader_id,
            role: raft.state,
        };
        Ok(RawNode {
            raft,
            prev_soft_state,
            prev_hard_state,
            term_vote_in_flight: None,
        })
    }

    /// One unit of logical time (Raft paper 5.2: timeouts are counted in ticks).
    pub fn tick(&mut self) {
        self.raft.tick();
    }

    /// Starts an election now.
    pub fn campaign(&mut self) -> Result<(), RaftError> {
        self.raft.step(new_msg(NONE, MessageType::MsgHup))
    }

    /// Feeds a message received from a peer. Local-only message types are
    /// refused.
    pub fn step(&mut self, m: Message) -> Result<(), RaftError> {
        let t = MessageType::try_from(m.msg_type).map_err(|_| RaftError::UnknownMessageType {
            msg_type: m.msg_type,
            from: m.from,
        })?;
        if is_local_msg(t) || m.from == NONE {
            return Err(RaftError::LocalMessage {
                msg_type: t,
                from: m.from,
            });
        }
        if !matches!(t, MessageType::MsgProp | MessageType::MsgReadIndex) && m.term == 0 {
            return Err(RaftError::LocalMessage {
                msg_type: t,
                from: m.from,
            });
        }
        self.raft.step(m)
    }

    /// Proposes `data` for the log. On a follower it is forwarded to the
    /// leader; the error cases are returned here only when known locally.
    pub fn propose(&mut self, data: Bytes) -> Result<(), RaftError> {
        let mut m = new_msg(NONE, MessageType::MsgProp);
        m.from = self.raft.id;
        m.entries = vec![Entry {
            data,
            ..Default::default()
        }];
        self.raft.step(m)
    }

    /// Proposes a single-member change. Refused while a previous change is
    /// not yet applied (thesis 4.1).
    pub fn propose_conf_change(&mut self, cc: &ConfChange) -> Result<(), RaftError> {
        let mut m = new_msg(NONE, MessageType::MsgProp);
        m.from = self.raft.id;
        m.entries = vec![Entry {
            entry_type: EntryType::EntryConfChange as i32,
            data: Bytes::from(cc.encode_to_vec()),
            ..Default::default()
        }];
        self.raft.step(m)
    }

    /// Applies a committed conf change entry's change; call while applying.
    pub fn apply_conf_change(&mut self, cc: &ConfChange) -> ConfState {
        self.raft.apply_conf_change(cc)
    }

    /// Requests a linearizable read identified by `ctx` (unique across the
    /// cluster). The answer arrives as a `ReadState` in a later Ready.
    pub fn read_index(&mut self, ctx: Bytes) -> Result<(), RaftError> {
        let mut m = new_msg(NONE, MessageType::MsgReadIndex);
        m.from = self.raft.id;
        m.entries = vec![Entry {
            data: ctx,
            ..Default::default()
        }];
        self.raft.step(m)
    }

    /// Asks the leader to hand leadership to `transferee`.
    pub fn transfer_leader(&mut self, transferee: u64) -> Result<(), RaftError> {
        let mut m = new_msg(NONE, MessageType::MsgTransferLeader);
        m.from = transferee;
        self.raft.step(m)
    }

    /// The driver could not deliver to `id`: stop pipelining to it.
    pub fn report_unreachable(&mut self, id: u64) {
        let mut m = new_msg(NONE, MessageType::MsgUnreachable);
        m.from = id;
        let _ = self.raft.step(m);
    }

    /// The driver finished (or failed) sending a snapshot to `id`.
    ///
    /// Call it for every `MsgSnap` handed out: `Finish` once delivered,
    /// `Failure` when it could not be. The leader sends nothing else to `id`
    /// until it hears the outcome (or `id` acknowledges the snapshot), so a
    /// lost snapshot that is never reported stalls that member.
    pub fn report_snapshot(&mut self, id: u64, status: SnapshotStatus) {
        let mut m = new_msg(NONE, MessageType::MsgSnapStatus);
        m.from = id;
        m.reject = status == SnapshotStatus::Failure;
        let _ = self.raft.step(m);
    }

    fn soft_state(&self) -> SoftState {
        SoftState {
            leader_id: self.raft.leader_id,
            role: self.raft.state,
        }
    }

    pub fn has_ready(&self) -> bool {
        if self.term_vote_in_flight.is_some() {
            return false;
        }
        let r = &self.raft;
        self.soft_state() != self.prev_soft_state
            || r.hard_state() != self.prev_hard_state
            || !r.msgs.is_empty()
            || !r.msgs_after_persist.is_empty()
            || !r.log.unstable.entries_to_persist().is_empty()
            || r.log.unstable.snapshot_to_persist().is_some()
            || r.log.has_next_committed_entries(r.config().async_append)
            || !r.read_states.is_empty()
            || r.has_unsent_read_round()
    }

    /// Collects what the driver must do. Call `advance` (or
    /// `advance_append`) before the next call, unless `Config::async_append`
    /// is set (see the module docs).
    pub fn ready(&mut self) -> Ready {
        self.raft.flush_read_round();
        let r = &mut self.raft;
        let mut rd = Ready::default();
        let ss = SoftState {
            leader_id: r.leader_id,
            role: r.state,
        };
        if ss != self.prev_soft_state {
            rd.soft_state = Some(ss);
            self.prev_soft_state = ss;
        }
        let hs = r.hard_state();
        if hs != self.prev_hard_state {
            rd.must_sync =
                hs.term != self.prev_hard_state.term || hs.vote != self.prev_hard_state.vote;
            // A candidate or leader acts on its own vote for itself, before
            // anyone else sees the new term: it must not go on until that
            // vote is durable. A follower's acknowledgements and votes wait
            // for its writes anyway.
            if rd.must_sync && r.config().async_append && r.state != StateRole::Follower {
                self.term_vote_in_flight = Some((hs.term, hs.vote));
            }
            rd.hard_state = Some(hs);
            self.prev_hard_state = hs;
        }
        rd.entries = r.log.unstable.entries_to_persist().to_vec();
        if !rd.entries.is_empty() {
            rd.must_sync = true;
        }
        rd.snapshot = r.log.unstable.snapshot_to_persist().cloned();
        if rd.snapshot.is_some() {
            rd.must_sync = true;
        }
        r.log.unstable.accept_in_progress();
        let only_durable = r.config().async_append;
        rd.committed_entries = r
            .log
            .next_committed_entries(r.config().max_committed_size_per_ready_bytes, only_durable);
        if let Some(last) = rd.committed_entries.last() {
            r.log.applying = last.index;
        }
        rd.read_states = std::mem::take(&mut r.read_states);
        rd.messages = std::mem::take(&mut r.msgs);
        rd.persisted_messages = std::mem::take(&mut r.msgs_after_persist);
        rd
    }

    /// Everything in `rd` is durable and its committed entries are applied.
    pub fn advance(&mut self, mut rd: Ready) {
        let committed = std::mem::take(&mut rd.committed_entries);
        self.advance_append(rd);
        self.on_entries_applied(&committed);
    }

    /// `rd`'s entries, hard state and snapshot are durable (and a snapshot
    /// has been restored into the state machine); its committed entries
    /// will be applied later and reported with `advance_apply_to`.
    pub fn advance_append(&mut self, rd: Ready) {
        if let (Some(hs), Some(tv)) = (rd.hard_state, self.term_vote_in_flight) {
            if (hs.term, hs.vote) == tv {
                self.term_vote_in_flight = None;
            }
        }
        if let Some(snap) = &rd.snapshot {
            let idx = snap.metadata.as_ref().map_or(0, |m| m.index);
            self.raft.log.stable_snap_to(idx);
            self.raft.log.applied_to(idx.min(self.raft.log.committed));
        }
        if let Some(last) = rd.entries.last() {
            self.raft.on_persist_entries(last.index, last.term);
        }
    }

    /// The state machine applied everything up to `index`.
    pub fn advance_apply_to(&mut self, index: u64) {
        self.raft.log.applied_to(index);
    }

    /// The uncommitted-size accounting of entries the driver applied after
    /// an `advance_append`.
    pub fn on_entries_applied(&mut self, entries: &[Entry]) {
        self.raft.reduce_uncommitted_size(entries);
        if let Some(last) = entries.last() {
            self.raft.log.applied_to(last.index);
        }
    }

    pub fn status(&self) -> Status {
        let r = &self.raft;
        let progress = if r.state == StateRole::Leader {
            r.prs
                .progress
                .iter()
                .map(|(id, p)| PeerStatus {
                    id: *id,
                    matched: p.matched,
                    next_idx: p.next_idx,
                    state: p.state,
                    is_learner: p.is_learner,
                    inflight_msgs: p.inflights.count(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Status {
            id: r.id,
            hard_state: r.hard_state(),
            soft_state: self.soft_state(),
            applied: r.log.applied,
            last_index: r.log.last_index(),
            first_index: r.log.first_index(),
            lead_transferee: r.lead_transferee,
            conf_state: r.prs.conf_state(),
            progress,
        }
    }

    pub fn id(&self) -> u64 {
        self.raft.id
    }

    pub fn term(&self) -> u64 {
        self.raft.term
    }

    pub fn leader_id(&self) -> u64 {
        self.raft.leader_id
    }

    /// The member leadership is being handed to, or `NONE`. While it is set the
    /// leader refuses proposals (they would be lost with the old term).
    pub fn lead_transferee(&self) -> u64 {
        self.raft.lead_transferee
    }

    pub fn role(&self) -> StateRole {
        self.raft.state
    }

    pub fn committed_index(&self) -> u64 {
        self.raft.log.committed
    }

    pub fn applied_index(&self) -> u64 {
        self.raft.log.applied
    }

    pub fn last_index(&self) -> u64 {
        self.raft.log.last_index()
    }

    /// Index of the snapshot Raft accepted and still waits to see persisted
    /// (handed out in a `Ready` or not yet), if any: the driver must keep its
    /// data until then.
    pub fn pending_snapshot_index(&self) -> Option<u64> {
        self.raft
            .log
            .unstable
            .snapshot
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map(|m| m.index)
    }

    /// Term of the entry at `index`, if the log still holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.raft.log.term(index).ok()
    }

    /// This term's randomized election timeout (Raft paper 5.2).
    pub fn randomized_election_timeout_ticks(&self) -> u64 {
        self.raft.randomized_election_timeout_ticks()
    }

    pub fn uncommitted_size_bytes(&self) -> u64 {
        self.raft.uncommitted_size_bytes
    }

    pub fn store(&self) -> &S {
        &self.raft.log.storage
    }

    /// The driver writes persisted state through this between `ready` and
    /// `advance`.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.raft.log.storage
    }
}

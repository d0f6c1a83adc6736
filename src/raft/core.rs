//! The Raft state machine of one member: roles, elections, replication,
//! reads, leader transfer and membership. Driven by `RawNode`.

use bytes::Bytes;
use prost::Message as _;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, info, warn};

use super::config::{Config, ReadOnlyOption, SafetyMutation};
use super::log::RaftLog;
use super::progress::{ProgressState, ProgressTracker, VoteResult};
use super::read_only::{ctx_to_round, round_to_ctx, ReadOnly};
use super::storage::{entry_size_bytes, Storage, StorageError};
use super::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, MessageType,
    RaftError, ReadState, Snapshot, NONE,
};

/// Context of MsgVote/MsgPreVote sent by a leader transfer's target: voters
/// grant it even while they still hear from the old leader (thesis 3.10).
pub(crate) const CAMPAIGN_TRANSFER: &[u8] = b"CampaignTransfer";

/// The role a member plays in its current term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateRole {
    #[default]
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CampaignType {
    PreElection,
    Election,
    Transfer,
}

pub(crate) struct Raft<S: Storage> {
    pub id: u64,
    pub group_id: u64,
    pub term: u64,
    pub vote: u64,
    pub log: RaftLog<S>,
    pub prs: ProgressTracker,
    pub state: StateRole,
    pub leader_id: u64,
    /// Messages that may leave at once.
    pub msgs: Vec<Message>,
    /// Messages that may leave only once entries and hard state are durable.
    pub msgs_after_persist: Vec<Message>,
    pub read_states: Vec<ReadState>,
    pub lead_transferee: u64,
    transfer_elapsed_ticks: u64,
    /// Index of the last conf change appended; a new one waits until this is
    /// applied (thesis 4.1).
    pub pending_conf_index: u64,
    pub uncommitted_size_bytes: u64,
    read_only: ReadOnly,
    /// Reads that arrived before the leader committed an entry of its term.
    pending_read_index_msgs: Vec<Message>,
    election_elapsed_ticks: u64,
    heartbeat_elapsed_ticks: u64,
    randomized_election_timeout_ticks: u64,
    cfg: Config,
    rng: SmallRng,
}

pub(crate) fn is_local_msg(t: MessageType) -> bool {
    matches!(
        t,
        MessageType::MsgHup
            | MessageType::MsgBeat
            | MessageType::MsgUnreachable
            | MessageType::MsgSnapStatus
            | MessageType::MsgCheckQuorum
    )
}

/// Messages that vouch for durable state: an acknowledgement of entries, a
/// vote granted, or a candidate's own vote and term.
fn needs_persist(t: MessageType) -> bool {
    matches!(
        t,
        MessageType::MsgAppResp | MessageType::MsgVote | MessageType::MsgVoteResp
    )
}

fn vote_resp_type(t: MessageType) -> MessageType {
    match t {
        MessageType::MsgVote => MessageType::MsgVoteResp,
        MessageType::MsgPreVote => MessageType::MsgPreVoteResp,
        other => panic!("raft: {other:?} is not a vote request"),
    }
}

pub(crate) fn new_msg(to: u64, t: MessageType) -> Message {
    Message {
        msg_type: t as i32,
        to,
        ..Default::default()
    }
}

impl<S: Storage> Raft<S> {
    pub fn new(cfg: &Config, storage: S) -> Result<Self, RaftError> {
        cfg.validate()?;
        let rs = storage.initial_state()?;
        let log = RaftLog::new(storage)?;
        let mut r = Raft {
            id: cfg.id,
            group_id: cfg.group_id,
            term: 0,
            vote: NONE,
            log,
            prs: ProgressTracker::new(cfg.max_inflight_msgs, cfg.max_inflight_bytes),
            state: StateRole::Follower,
            leader_id: NONE,
            msgs: Vec::new(),
            msgs_after_persist: Vec::new(),
            read_states: Vec::new(),
            lead_transferee: NONE,
            transfer_elapsed_ticks: 0,
            pending_conf_index: 0,
            uncommitted_size_bytes: 0,
            read_only: ReadOnly::default(),
            pending_read_index_msgs: Vec::new(),
            election_elapsed_ticks: 0,
            heartbeat_elapsed_ticks: 0,
            randomized_election_timeout_ticks: cfg.election_timeout_ticks,
            cfg: cfg.clone(),
            rng: SmallRng::seed_from_u64(cfg.seed ^ cfg.id.rotate_left(32)),
        };
        r.apply_conf_state(&rs.conf_state);
        let hs = rs.hard_state;
        if hs != HardState::default() {
            let last = r.log.last_index();
            if hs.commit > last {
                return Err(RaftError::Storage(StorageError::Other(format!(
                    "hard state commit {} is beyond the last log index {last}",
                    hs.commit
                ))));
            }
            r.log.committed = r.log.committed.max(hs.commit);
            r.term = hs.term;
            r.vote = hs.vote;
        }
        if cfg.applied_index > 0 {
            // The state machine applies only committed entries, so what it
            // applied is committed even where the durable hard state's commit
            // lags behind it (with `async_append` entries are applied before
            // the hard state carrying their commit index is durable).
            let applied = cfg.applied_index.min(r.log.last_index());
            r.log.committed = r.log.committed.max(applied);
            r.log.applied_to(applied);
        }
        r.become_follower(r.term, NONE);
        info!(
            group = r.group_id,
            id = r.id,
            term = r.term,
            commit = r.log.committed,
            applied = r.log.applied,
            last_index = r.log.last_index(),
            "raft member started"
        );
        Ok(r)
    }

    pub fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            commit: self.log.committed,
        }
    }

    /// A voter may campaign; so may a member that applied its own removal
    /// (it counts only the remaining voters): the others may not yet know
    /// the removal committed and still need its log to elect anyone. A
    /// learner, or a member that knows no membership yet, never does.
    fn promotable(&self) -> bool {
        let member_or_removed = self.prs.is_voter(self.id)
            || (!self.prs.learners.contains(&self.id) && !self.prs.voters.is_empty());
        member_or_removed && self.log.unstable.snapshot.is_none()
    }

    fn check_term(&self) -> bool {
        self.cfg.mutation != Some(SafetyMutation::CommitPreviousTermByCount)
    }

    fn send(&mut self, mut m: Message) {
        // A forwarded transfer request keeps naming the transferee in `from`.
        if m.from == NONE {
            m.from = self.id;
        }
        let t = m.msg_type();
        if matches!(
            t,
            MessageType::MsgVote
                | MessageType::MsgVoteResp
                | MessageType::MsgPreVote
                | MessageType::MsgPreVoteResp
        ) {
            assert!(m.term != 0, "raft: {t:?} must carry a term");
        } else if !matches!(t, MessageType::MsgProp | MessageType::MsgReadIndex) {
            m.term = self.term;
        }
        if needs_persist(t) {
            self.msgs_after_persist.push(m);
        } else {
            self.msgs.push(m);
        }
    }

    // ---- appending and replication ---------------------------------------

    /// Sends an append (or a snapshot) to `to` if its progress allows;
    /// returns whether something was sent.
    fn maybe_send_append(&mut self, to: u64, send_if_empty: bool) -> bool {
        let Some(pr) = self.prs.progress.get(&to) else {
            return false;
        };
        if pr.is_paused() {
            return false;
        }
        let next = pr.next_idx;
        let term = self.log.term(next - 1);
        let ents = self.log.entries(next, self.cfg.max_size_per_msg_bytes);
        if ents.as_ref().is_ok_and(|e| e.is_empty()) && !send_if_empty {
            return false;
        }
        match (term, ents) {
            (Ok(log_term), Ok(entries)) => {
                let pr = self.prs.progress.get_mut(&to).expect("checked above");
                if let Some(last) = entries.last().map(|e| e.index) {
                    match pr.state {
                        ProgressState::Replicate => {
                            let size: u64 = entries.iter().map(entry_size_bytes).sum();
                            pr.optimistic_update(last);
                            pr.inflights.add(last, size);
                        }
                        ProgressState::Probe => pr.probe_sent = true,
                        ProgressState::Snapshot => {
                            panic!("raft: sending append to {to} in snapshot state")
                        }
                    }
                }
                let mut m = new_msg(to, MessageType::MsgApp);
                m.index = next - 1;
                m.log_term = log_term;
                m.entries = entries;
                m.commit = self.log.committed;
                self.send(m);
                true
            }
            _ => self.send_snapshot(to),
        }
    }

    fn send_snapshot(&mut self, to: u64) -> bool {
        let pr = &self.prs.progress[&to];
        if !pr.recent_active {
            debug!(
                group = self.group_id,
                id = self.id,
                to,
                "skip snapshot to inactive member"
            );
            return false;
        }
        let snap = match self.log.snapshot(pr.next_idx - 1) {
            Ok(s) => s,
            Err(StorageError::SnapshotTemporarilyUnavailable) => return false,
            Err(e) => panic!("raft: snapshot for member {to} unreadable: {e}"),
        };
        let md = snap.metadata.clone().unwrap_or_default();
        assert!(
            md.index != 0,
            "raft: need a snapshot for member {to} but none exists"
        );
        info!(
            group = self.group_id,
            id = self.id,
            term = self.term,
            to,
            index = md.index,
            snapshot_term = md.term,
            "sending snapshot"
        );
        self.prs
            .progress
            .get_mut(&to)
            .expect("checked above")
            .become_snapshot(md.index);
        let mut m = new_msg(to, MessageType::MsgSnap);
        m.snapshot = Some(snap);
        self.send(m);
        true
    }

    fn send_append(&mut self, to: u64) {
        self.maybe_send_append(to, true);
    }

    fn peers(&self) -> Vec<u64> {
        self.prs
            .progress
            .keys()
            .copied()
            .filter(|id| *id != self.id)
            .collect()
    }

    pub fn bcast_append(&mut self) {
        for id in self.peers() {
            self.send_append(id);
        }
    }

    fn send_heartbeat(&mut self, to: u64, ctx: Bytes) {
        let matched = self.prs.progress.get(&to).map_or(0, |p| p.matched);
        let mut m = new_msg(to, MessageType::MsgHeartbeat);
        // A follower may not have the entries up to our commit index yet.
        m.commit = matched.min(self.log.committed);
        m.context = ctx;
        self.send(m);
    }

    fn bcast_heartbeat(&mut self, ctx: Bytes) {
        for id in self.peers() {
            self.send_heartbeat(id, ctx.clone());
        }
    }

    /// Appends entries to the leader's log; refuses them if the uncommitted
    /// tail would exceed its limit.
    fn append_entry(&mut self, es: &mut [Entry]) -> Result<(), RaftError> {
        let size: u64 = es.iter().map(|e| e.data.len() as u64).sum();
        if self.uncommitted_size_bytes > 0
            && size > 0
            && self.uncommitted_size_bytes + size > self.cfg.max_uncommitted_entries_size_bytes
        {
            return Err(RaftError::UncommittedLimit {
                uncommitted_bytes: self.uncommitted_size_bytes,
                limit_bytes: self.cfg.max_uncommitted_entries_size_bytes,
            });
        }
        self.uncommitted_size_bytes += size;
        let last = self.log.last_index();
        for (i, e) in es.iter_mut().enumerate() {
            e.term = self.term;
            e.index = last + 1 + i as u64;
        }
        self.log.append(es);
        // The leader's own replica counts once the driver reports it durable
        // (`on_persist_entries`): its write runs in parallel with the sends.
        Ok(())
    }

    /// The driver persisted entries up to `(index, term)`.
    pub fn on_persist_entries(&mut self, index: u64, term: u64) {
        self.log.stable_to(index, term);
        if self.state == StateRole::Leader {
            let persisted = self.log.persisted_index();
            let updated = self
                .prs
                .progress
                .get_mut(&self.id)
                .is_some_and(|pr| pr.maybe_update(persisted));
            if updated && self.maybe_commit() {
                self.on_commit_advanced();
            }
        }
    }

    pub fn reduce_uncommitted_size(&mut self, ents: &[Entry]) {
        if self.state != StateRole::Leader {
            return;
        }
        let size: u64 = ents.iter().map(|e| e.data.len() as u64).sum();
        self.uncommitted_size_bytes = self.uncommitted_size_bytes.saturating_sub(size);
    }

    fn maybe_commit(&mut self) -> bool {
        let mci = self.prs.committed_index();
        let check = self.check_term();
        self.log.maybe_commit(mci, self.term, check)
    }

    fn committed_entry_in_current_term(&self) -> bool {
        self.log.term_or_zero(self.log.committed) == self.term
    }

    fn on_commit_advanced(&mut self) {
        if self.committed_entry_in_current_term() {
            self.release_pending_read_index_msgs();
        }
        self.bcast_append();
    }

    // ---- role changes ------------------------------------------------------

    fn reset(&mut self, term: u64) {
        if self.term != term {
            self.term = term;
            self.vote = NONE;
        }
        self.leader_id = NONE;
        self.election_elapsed_ticks = 0;
        self.heartbeat_elapsed_ticks = 0;
        self.reset_randomized_election_timeout();
        self.abort_leader_transfer();
        self.prs.reset_votes();
        let last = self.log.last_index();
        let persisted = self.log.persisted_index();
        let id = self.id;
        for (pid, pr) in self.prs.progress.iter_mut() {
            let learner = pr.is_learner;
            *pr = super::progress::Progress::new(
                last + 1,
                self.cfg.max_inflight_msgs,
                self.cfg.max_inflight_bytes,
            );
            pr.is_learner = learner;
            if *pid == id {
                pr.matched = persisted;
            }
        }
        self.pending_conf_index = 0;
        self.uncommitted_size_bytes = 0;
        self.read_only.clear();
        self.pending_read_index_msgs.clear();
    }

    fn reset_randomized_election_timeout(&mut self) {
        let et = self.cfg.election_timeout_ticks;
        self.randomized_election_timeout_ticks = self.rng.gen_range(et..2 * et);
    }

    pub fn become_follower(&mut self, term: u64, leader: u64) {
        self.reset(term);
        self.leader_id = leader;
        self.state = StateRole::Follower;
        debug!(
            group = self.group_id,
            id = self.id,
            term,
            leader,
            "became follower"
        );
    }

    fn become_pre_candidate(&mut self) {
        assert!(
            self.state != StateRole::Leader,
            "raft: leader cannot become pre-candidate"
        );
        // A pre-candidate changes no term and no vote (thesis 9.6).
        self.prs.reset_votes();
        self.leader_id = NONE;
        self.state = StateRole::PreCandidate;
        debug!(
            group = self.group_id,
            id = self.id,
            term = self.term,
            "became pre-candidate"
        );
    }

    fn become_candidate(&mut self) {
        assert!(
            self.state != StateRole::Leader,
            "raft: leader cannot become candidate"
        );
        let term = self.term + 1;
        self.reset(term);
        self.vote = self.id;
        self.state = StateRole::Candidate;
        debug!(
            group = self.group_id,
            id = self.id,
            term,
            "became candidate"
        );
    }

    fn become_leader(&mut self) {
        assert!(
            self.state != StateRole::Follower,
            "raft: follower cannot become leader"
        );
        let term = self.term;
        self.reset(term);
        self.leader_id = self.id;
        self.state = StateRole::Leader;
        if let Some(pr) = self.prs.progress.get_mut(&self.id) {
            pr.become_replicate();
            pr.recent_active = true;
        }
        // Conservatively treat any conf change in the tail as pending.
        self.pending_conf_index = self.log.last_index();
        // Raft paper 5.4.2 / thesis 3.6.2: an empty entry of the new term lets
        // the leader commit the entries of earlier terms.
        let mut noop = [Entry::default()];
        self.append_entry(&mut noop)
            .expect("an empty entry is never refused");
        info!(
            group = self.group_id,
            id = self.id,
            term,
            last_index = self.log.last_index(),
            "became leader"
        );
    }

    fn has_unapplied_conf_change(&self) -> bool {
        if self.log.applied >= self.log.committed {
            return false;
        }
        let lo = (self.log.applied + 1).max(self.log.first_index());
        let ents = match self.log.slice(lo, self.log.committed + 1, u64::MAX) {
            Ok(e) => e,
            Err(e) => panic!("raft: committed entries from {lo} unreadable: {e}"),
        };
        ents.iter()
            .any(|e| e.entry_type() == EntryType::EntryConfChange)
    }

    fn hup(&mut self, t: CampaignType) {
        if self.state == StateRole::Leader {
            return;
        }
        if !self.promotable() {
            debug!(
                group = self.group_id,
                id = self.id,
                "not a voter, not campaigning"
            );
            return;
        }
        if self.has_unapplied_conf_change() {
            // The membership this campaign would use is about to change.
            debug!(
                group = self.group_id,
                id = self.id,
                "conf change pending apply, not campaigning"
            );
            return;
        }
        self.campaign(t);
    }

    fn campaign(&mut self, t: CampaignType) {
        let (vote_msg, term) = if t == CampaignType::PreElection {
            self.become_pre_candidate();
            (MessageType::MsgPreVote, self.term + 1)
        } else {
            self.become_candidate();
            (MessageType::MsgVote, self.term)
        };
        let id = self.id;
        if self.poll(id, vote_msg, true) == VoteResult::Won {
            if t == CampaignType::PreElection {
                self.campaign(CampaignType::Election);
            } else {
                self.become_leader();
            }
            return;
        }
        let voters: Vec<u64> = self
            .prs
            .voters
            .iter()
            .copied()
            .filter(|v| *v != id)
            .collect();
        let last_index = self.log.last_index();
        let last_term = self.log.last_term();
        for v in voters {
            let mut m = new_msg(v, vote_msg);
            m.term = term;
            m.index = last_index;
            m.log_term = last_term;
            if t == CampaignType::Transfer {
                m.context = Bytes::from_static(CAMPAIGN_TRANSFER);
            }
            info!(
                group = self.group_id,
                id = self.id,
                term,
                to = v,
                kind = ?vote_msg,
                "requesting vote"
            );
            self.send(m);
        }
    }

    fn poll(&mut self, from: u64, _t: MessageType, granted: bool) -> VoteResult {
        self.prs.record_vote(from, granted);
        self.prs.tally_votes().2
    }

    // ---- time --------------------------------------------------------------

    pub fn tick(&mut self) {
        match self.state {
            StateRole::Leader => self.tick_heartbeat(),
            _ => self.tick_election(),
        }
    }

    fn past_election_timeout(&self) -> bool {
        self.election_elapsed_ticks >= self.randomized_election_timeout_ticks
    }

    fn tick_election(&mut self) {
        self.election_elapsed_ticks += 1;
        if self.promotable() && self.past_election_timeout() {
            self.election_elapsed_ticks = 0;
            let _ = self.step(new_msg(NONE, MessageType::MsgHup));
        }
    }

    fn tick_heartbeat(&mut self) {
        self.heartbeat_elapsed_ticks += 1;
        self.election_elapsed_ticks += 1;
        if self.lead_transferee != NONE {
            self.transfer_elapsed_ticks += 1;
            if self.transfer_elapsed_ticks >= self.cfg.leader_transfer_timeout_ticks {
                info!(
                    group = self.group_id,
                    id = self.id,
                    term = self.term,
                    transferee = self.lead_transferee,
                    "leader transfer timed out"
                );
                self.abort_leader_transfer();
                if !self.prs.is_voter(self.id) {
                    self.transfer_after_removal();
                }
            }
        }
        if self.election_elapsed_ticks >= self.cfg.election_timeout_ticks {
            self.election_elapsed_ticks = 0;
            if self.cfg.check_quorum {
                let _ = self.step(new_msg(NONE, MessageType::MsgCheckQuorum));
            }
        }
        if self.state != StateRole::Leader {
            return;
        }
        if self.heartbeat_elapsed_ticks >= self.cfg.heartbeat_timeout_ticks {
            self.heartbeat_elapsed_ticks = 0;
            let _ = self.step(new_msg(NONE, MessageType::MsgBeat));
        }
    }

    fn abort_leader_transfer(&mut self) {
        self.lead_transferee = NONE;
        self.transfer_elapsed_ticks = 0;
    }

    // ---- stepping ----------------------------------------------------------

    pub fn step(&mut self, m: Message) -> Result<(), RaftError> {
        let t = m.msg_type();
        if m.term == 0 {
            // Local message, or a forwarded proposal/read.
        } else if m.term > self.term {
            if matches!(t, MessageType::MsgVote | MessageType::MsgPreVote) {
                let force = m.context.as_ref() == CAMPAIGN_TRANSFER;
                let in_lease = self.cfg.check_quorum
                    && self.leader_id != NONE
                    && self.election_elapsed_ticks < self.cfg.election_timeout_ticks;
                if !force && in_lease {
                    // Thesis 4.2.3: a member that hears from a leader ignores
                    // a disruptive candidate.
                    info!(
                        group = self.group_id,
                        id = self.id,
                        term = self.term,
                        from = m.from,
                        msg_term = m.term,
                        "ignoring vote request within the leader lease"
                    );
                    return Ok(());
                }
            }
            if t == MessageType::MsgPreVote || (t == MessageType::MsgPreVoteResp && !m.reject) {
                // A pre-vote never changes terms.
            } else if matches!(
                t,
                MessageType::MsgApp | MessageType::MsgHeartbeat | MessageType::MsgSnap
            ) {
                self.become_follower(m.term, m.from);
            } else {
                self.become_follower(m.term, NONE);
            }
        } else if m.term < self.term {
            if (self.cfg.check_quorum || self.cfg.pre_vote)
                && matches!(t, MessageType::MsgHeartbeat | MessageType::MsgApp)
            {
                // A stale leader, perhaps cut off while we moved on: tell it
                // our term so it steps down instead of disrupting us forever.
                self.send(new_msg(m.from, MessageType::MsgAppResp));
            } else if t == MessageType::MsgPreVote {
                let mut r = new_msg(m.from, MessageType::MsgPreVoteResp);
                r.term = self.term;
                r.reject = true;
                self.send(r);
            }
            return Ok(());
        }

        match t {
            MessageType::MsgHup => {
                let ct = if self.cfg.pre_vote {
                    CampaignType::PreElection
                } else {
                    CampaignType::Election
                };
                self.hup(ct);
                Ok(())
            }
            MessageType::MsgVote | MessageType::MsgPreVote => {
                self.handle_vote_request(m);
                Ok(())
            }
            _ => match self.state {
                StateRole::Leader => self.step_leader(m),
                StateRole::Candidate | StateRole::PreCandidate => self.step_candidate(m),
                StateRole::Follower => self.step_follower(m),
            },
        }
    }

    fn handle_vote_request(&mut self, m: Message) {
        let t = m.msg_type();
        let can_vote = self.vote == m.from
            || (self.vote == NONE && self.leader_id == NONE)
            || (t == MessageType::MsgPreVote && m.term > self.term);
        let log_ok = self.cfg.mutation == Some(SafetyMutation::VoteWithoutLogCheck)
            || self.log.is_up_to_date(m.index, m.log_term);
        let mut resp = new_msg(m.from, vote_resp_type(t));
        if can_vote && log_ok {
            info!(
                group = self.group_id,
                id = self.id,
                term = self.term,
                candidate = m.from,
                msg_term = m.term,
                kind = ?t,
                "granting vote"
            );
            // The response carries the candidate's term so that a pre-vote
            // response is not discarded as stale.
            resp.term = m.term;
            self.send(resp);
            if t == MessageType::MsgVote {
                self.election_elapsed_ticks = 0;
                self.vote = m.from;
            }
        } else {
            debug!(
                group = self.group_id,
                id = self.id,
                term = self.term,
                candidate = m.from,
                msg_term = m.term,
                kind = ?t,
                "rejecting vote"
            );
            resp.term = self.term;
            resp.reject = true;
            self.send(resp);
        }
    }

    fn step_leader(&mut self, m: Message) -> Result<(), RaftError> {
        match m.msg_type() {
            MessageType::MsgBeat => {
                // Pending reads ride along on every heartbeat, so a round
                // whose messages were lost is retried.
                let ctx = self.read_only.retry_ctx();
                self.bcast_heartbeat(ctx);
                return Ok(());
            }
            MessageType::MsgCheckQuorum => {
                if !self.prs.quorum_active(self.id) {
                    warn!(
                        group = self.group_id,
                        id = self.id,
                        term = self.term,
                        "no quorum heard within an election timeout, stepping down"
                    );
                    let term = self.term;
                    self.become_follower(term, NONE);
                }
                let id = self.id;
                for (pid, pr) in self.prs.progress.iter_mut() {
                    if *pid != id {
                        pr.recent_active = false;
                    }
                }
                return Ok(());
            }
            MessageType::MsgProp => return self.leader_propose(m),
            MessageType::MsgReadIndex => {
                // Even a single voter waits: its commit index may lag what
                // it committed in an earlier term until it commits in this
                // one. A lone voter's round then completes without messages.
                if !self.committed_entry_in_current_term() {
                    // Thesis 6.4: the commit index is only known to be current
                    // once an entry of this term is committed.
                    self.pending_read_index_msgs.push(m);
                    return Ok(());
                }
                self.leader_read_index(m);
                return Ok(());
            }
            MessageType::MsgTransferLeader => {
                self.handle_transfer_leader(m);
                return Ok(());
            }
            _ => {}
        }

        let from = m.from;
        if !self.prs.progress.contains_key(&from) {
            debug!(
                group = self.group_id,
                id = self.id,
                from,
                "message from unknown member"
            );
            return Ok(());
        }
        match m.msg_type() {
            MessageType::MsgAppResp => self.handle_append_response(m),
            MessageType::MsgHeartbeatResp => self.handle_heartbeat_response(m),
            MessageType::MsgSnapStatus => {
                let pr = self.prs.progress.get_mut(&from).expect("checked above");
                if pr.state != ProgressState::Snapshot {
                    return Ok(());
                }
                if m.reject {
                    pr.pending_snapshot = 0;
                }
                pr.become_probe();
                // Wait for a heartbeat response before probing: the snapshot
                // may still be in transit.
                pr.probe_sent = true;
                debug!(
                    group = self.group_id,
                    id = self.id,
                    to = from,
                    failed = m.reject,
                    "snapshot status"
                );
            }
            MessageType::MsgUnreachable => {
                let pr = self.prs.progress.get_mut(&from).expect("checked above");
                if pr.state == ProgressState::Replicate {
                    pr.become_probe();
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn leader_propose(&mut self, mut m: Message) -> Result<(), RaftError> {
        if m.entries.is_empty() {
            return Err(RaftError::EmptyProposal);
        }
        if !self.prs.progress.contains_key(&self.id) {
            return Err(RaftError::NotMember { id: self.id });
        }
        if self.lead_transferee != NONE {
            return Err(RaftError::TransferInProgress {
                transferee: self.lead_transferee,
            });
        }
        let mut conf_index = None;
        for (i, e) in m.entries.iter().enumerate() {
            if e.entry_type() != EntryType::EntryConfChange {
                continue;
            }
            if conf_index.is_some() || self.pending_conf_index > self.log.applied {
                return Err(RaftError::ConfChangePending {
                    pending_index: self.pending_conf_index,
                    applied_index: self.log.applied,
                });
            }
            let cc = ConfChange::decode(e.data.clone()).map_err(|err| {
                RaftError::BadConfChange(format!("undecodable conf change: {err}"))
            })?;
            self.check_conf_change(&cc)?;
            conf_index = Some(i);
        }
        self.append_entry(&mut m.entries)?;
        if let Some(i) = conf_index {
            self.pending_conf_index = m.entries[i].index;
        }
        self.bcast_append();
        Ok(())
    }

    /// Refuses a change that would leave no voter.
    fn check_conf_change(&self, cc: &ConfChange) -> Result<(), RaftError> {
        let removes_voter = match cc.change_type() {
            ConfChangeType::ConfChangeRemoveNode | ConfChangeType::ConfChangeAddLearnerNode => {
                self.prs.is_voter(cc.node_id)
            }
            _ => false,
        };
        if removes_voter && self.prs.voters.len() == 1 {
            return Err(RaftError::BadConfChange(format!(
                "removing voter {} would leave no voter",
                cc.node_id
            )));
        }
        if cc.node_id == NONE {
            return Err(RaftError::BadConfChange("member id 0".to_string()));
        }
        Ok(())
    }

    fn leader_read_index(&mut self, m: Message) {
        let index = self.log.committed;
        if self.cfg.read_only_option == ReadOnlyOption::LeaseBased {
            self.respond_read_index(m, index);
            return;
        }
        let ctx = m
            .entries
            .first()
            .map(|e| e.data.clone())
            .unwrap_or_default();
        if !self.read_only.add_request(index, m, ctx) {
            debug!(
                group = self.group_id,
                id = self.id,
                "duplicate read context ignored"
            );
        }
        // The heartbeat round goes out when the driver next asks for a Ready,
        // so that concurrent requests share it.
    }

    /// Sends one heartbeat round for all reads queued since the last round.
    pub fn flush_read_round(&mut self) {
        if self.state != StateRole::Leader || !self.read_only.unsent {
            return;
        }
        let self_vote = self.prs.is_voter(self.id).then_some(self.id);
        let round = self.read_only.start_round(self_vote);
        if self.prs.quorum() <= 1 && self.prs.is_voter(self.id) {
            self.finish_read_round(round);
            return;
        }
        self.bcast_heartbeat(round_to_ctx(round));
    }

    pub fn has_unsent_read_round(&self) -> bool {
        self.state == StateRole::Leader && self.read_only.unsent
    }

    fn finish_read_round(&mut self, round: u64) {
        for rs in self.read_only.advance(round) {
            self.respond_read_index(rs.req, rs.index);
        }
    }

    fn respond_read_index(&mut self, req: Message, index: u64) {
        let ctx = req
            .entries
            .first()
            .map(|e| e.data.clone())
            .unwrap_or_default();
        if req.from == NONE || req.from == self.id {
            self.read_states.push(ReadState {
                index,
                request_ctx: ctx,
            });
        } else {
            let mut m = new_msg(req.from, MessageType::MsgReadIndexResp);
            m.index = index;
            m.entries = req.entries;
            self.send(m);
        }
    }

    fn release_pending_read_index_msgs(&mut self) {
        let msgs = std::mem::take(&mut self.pending_read_index_msgs);
        for m in msgs {
            self.leader_read_index(m);
        }
    }

    fn handle_append_response(&mut self, m: Message) {
        let from = m.from;
        let last_index = self.log.last_index();
        if m.reject {
            // Fast backtracking (Raft paper 5.3): the follower's hint names
            // the last index where its log may match ours.
            let mut next_probe = m.reject_hint;
            if m.log_term > 0 {
                next_probe = self.log.find_conflict_by_term(m.reject_hint, m.log_term).0;
            }
            let pr = self.prs.progress.get_mut(&from).expect("checked by caller");
            pr.recent_active = true;
            if pr.maybe_decr_to(m.index, next_probe) {
                debug!(
                    group = self.group_id,
                    id = self.id,
                    term = self.term,
                    to = from,
                    rejected = m.index,
                    next = pr.next_idx,
                    "append rejected, backtracking"
                );
                if pr.state == ProgressState::Replicate {
                    pr.become_probe();
                }
                self.send_append(from);
            }
            return;
        }
        let pr = self.prs.progress.get_mut(&from).expect("checked by caller");
        pr.recent_active = true;
        let old_paused = pr.is_paused();
        let updated = pr.maybe_update(m.index);
        if !updated {
            // A probe answered by a member that already has everything: it
            // matches, so replicate again rather than probing once per
            // heartbeat.
            if pr.state == ProgressState::Probe && pr.matched == m.index {
                pr.become_replicate();
                while self.maybe_send_append(from, false) {}
            }
            return;
        }
        match pr.state {
            ProgressState::Probe => pr.become_replicate(),
            ProgressState::Snapshot => {
                if pr.matched >= pr.pending_snapshot {
                    pr.become_probe();
                    pr.become_replicate();
                }
            }
            ProgressState::Replicate => pr.inflights.free_le(m.index),
        }
        if self.maybe_commit() {
            self.on_commit_advanced();
        } else if old_paused {
            self.send_append(from);
        }
        // Pipelining: keep filling the window while there is more to send.
        while self.maybe_send_append(from, false) {}
        if from == self.lead_transferee && self.prs.progress[&from].matched == last_index {
            info!(
                group = self.group_id,
                id = self.id,
                term = self.term,
                to = from,
                "transferee caught up, sending timeout-now"
            );
            self.send_timeout_now(from);
        }
    }

    fn handle_heartbeat_response(&mut self, m: Message) {
        let from = m.from;
        let last_index = self.log.last_index();
        let pr = self.prs.progress.get_mut(&from).expect("checked by caller");
        pr.recent_active = true;
        pr.probe_sent = false;
        if pr.state == ProgressState::Replicate && pr.inflights.full() {
            pr.inflights.free_first_one();
        }
        if pr.matched < last_index {
            self.send_append(from);
        }
        let Some(round) = ctx_to_round(&m.context) else {
            return;
        };
        if !self.prs.is_voter(from) {
            return;
        }
        let acks = self.read_only.recv_ack(from, round);
        if acks >= self.prs.quorum() {
            self.finish_read_round(round);
        }
    }

    fn send_timeout_now(&mut self, to: u64) {
        self.send(new_msg(to, MessageType::MsgTimeoutNow));
        if !self.prs.is_voter(self.id) {
            // Removed, and `to` now holds our whole log: step down so that
            // whoever campaigns next is not outvoted by a stale leader.
            let term = self.term;
            self.become_follower(term, NONE);
        }
    }

    /// A leader no longer in the membership hands leadership to the voter
    /// with the longest matching log (retried on each transfer timeout).
    fn transfer_after_removal(&mut self) {
        let best = self
            .prs
            .voters
            .iter()
            .filter(|id| **id != self.id)
            .max_by_key(|id| {
                (
                    self.prs.progress.get(id).map_or(0, |p| p.matched),
                    u64::MAX - **id,
                )
            })
            .copied();
        match best {
            Some(to) => {
                let mut m = new_msg(NONE, MessageType::MsgTransferLeader);
                m.from = to;
                self.handle_transfer_leader(m);
            }
            None => {
                let term = self.term;
                self.become_follower(term, NONE);
            }
        }
    }

    fn handle_transfer_leader(&mut self, m: Message) {
        let transferee = m.from;
        if !self.prs.progress.contains_key(&transferee) || !self.prs.is_voter(transferee) {
            debug!(
                group = self.group_id,
                id = self.id,
                transferee,
                "transfer target is not a voter"
            );
            return;
        }
        if self.lead_transferee != NONE {
            if self.lead_transferee == transferee {
                return;
            }
            self.abort_leader_transfer();
        }
        if transferee == self.id {
            return;
        }
        info!(
            group = self.group_id,
            id = self.id,
            term = self.term,
            transferee,
            "starting leader transfer"
        );
        self.lead_transferee = transferee;
        self.transfer_elapsed_ticks = 0;
        if self.prs.progress[&transferee].matched == self.log.last_index() {
            self.send_timeout_now(transferee);
        } else {
            self.send_append(transferee);
        }
    }

    fn step_candidate(&mut self, m: Message) -> Result<(), RaftError> {
        let my_resp = if self.state == StateRole::PreCandidate {
            MessageType::MsgPreVoteResp
        } else {
            MessageType::MsgVoteResp
        };
        match m.msg_type() {
            MessageType::MsgProp => {
                return Err(RaftError::NoLeader { term: self.term });
            }
            MessageType::MsgReadIndex => {
                return Err(RaftError::NoLeader { term: self.term });
            }
            MessageType::MsgApp => {
                self.become_follower(m.term, m.from);
                self.handle_append_entries(m);
            }
            MessageType::MsgHeartbeat => {
                self.become_follower(m.term, m.from);
                self.handle_heartbeat(m);
            }
            MessageType::MsgSnap => {
                self.become_follower(m.term, m.from);
                self.handle_snapshot(m);
            }
            t if t == my_resp => {
                let res = self.poll(m.from, t, !m.reject);
                match res {
                    VoteResult::Won => {
                        if self.state == StateRole::PreCandidate {
                            self.campaign(CampaignType::Election);
                        } else {
                            self.become_leader();
                            self.bcast_append();
                        }
                    }
                    VoteResult::Lost => {
                        let term = self.term;
                        self.become_follower(term, NONE);
                    }
                    VoteResult::Pending => {}
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn step_follower(&mut self, mut m: Message) -> Result<(), RaftError> {
        match m.msg_type() {
            MessageType::MsgProp => {
                if self.leader_id == NONE {
                    return Err(RaftError::NoLeader { term: self.term });
                }
                if self.cfg.disable_proposal_forwarding {
                    return Err(RaftError::ForwardingDisabled {
                        leader: self.leader_id,
                    });
                }
                if m.entries.is_empty() {
                    return Err(RaftError::EmptyProposal);
                }
                m.to = self.leader_id;
                m.term = 0;
                self.send(m);
            }
            MessageType::MsgApp => {
                self.election_elapsed_ticks = 0;
                self.leader_id = m.from;
                self.handle_append_entries(m);
            }
            MessageType::MsgHeartbeat => {
                self.election_elapsed_ticks = 0;
                self.leader_id = m.from;
                self.handle_heartbeat(m);
            }
            MessageType::MsgSnap => {
                self.election_elapsed_ticks = 0;
                self.leader_id = m.from;
                self.handle_snapshot(m);
            }
            MessageType::MsgTransferLeader => {
                if self.leader_id == NONE {
                    return Err(RaftError::NoLeader { term: self.term });
                }
                m.to = self.leader_id;
                self.send(m);
            }
            MessageType::MsgTimeoutNow => {
                info!(
                    group = self.group_id,
                    id = self.id,
                    term = self.term,
                    from = m.from,
                    "timeout-now received, campaigning"
                );
                // Thesis 3.10: the transferee skips the pre-vote and
                // campaigns at once; its vote requests override the lease.
                self.hup(CampaignType::Transfer);
            }
            MessageType::MsgReadIndex => {
                if self.leader_id == NONE {
                    return Err(RaftError::NoLeader { term: self.term });
                }
                m.to = self.leader_id;
                m.term = 0;
                self.send(m);
            }
            MessageType::MsgReadIndexResp => {
                let ctx = m
                    .entries
                    .first()
                    .map(|e| e.data.clone())
                    .unwrap_or_default();
                self.read_states.push(ReadState {
                    index: m.index,
                    request_ctx: ctx,
                });
            }
            _ => {}
        }
        Ok(())
    }

    fn handle_append_entries(&mut self, m: Message) {
        let mut resp = new_msg(m.from, MessageType::MsgAppResp);
        if m.index < self.log.committed {
            resp.index = self.log.committed;
            self.send(resp);
            return;
        }
        match self
            .log
            .maybe_append(m.index, m.log_term, m.commit, &m.entries)
        {
            Some(last) => {
                // Sent only once these entries are durable: the response goes
                // with the after-persist messages.
                resp.index = last;
                self.send(resp);
            }
            None => {
                let hint = m.index.min(self.log.last_index());
                let (hint_index, hint_term) = self.log.find_conflict_by_term(hint, m.log_term);
                debug!(
                    group = self.group_id,
                    id = self.id,
                    term = self.term,
                    index = m.index,
                    log_term = m.log_term,
                    hint_index,
                    hint_term,
                    "rejecting append"
                );
                resp.index = m.index;
                resp.reject = true;
                resp.reject_hint = hint_index;
                resp.log_term = hint_term;
                self.send(resp);
            }
        }
    }

    fn handle_heartbeat(&mut self, m: Message) {
        self.log.commit_to(m.commit.min(self.log.last_index()));
        let mut resp = new_msg(m.from, MessageType::MsgHeartbeatResp);
        resp.context = m.context;
        self.send(resp);
    }

    fn handle_snapshot(&mut self, m: Message) {
        let snap = m.snapshot.unwrap_or_default();
        let md = snap.metadata.clone().unwrap_or_default();
        let mut resp = new_msg(m.from, MessageType::MsgAppResp);
        if self.restore(snap) {
            info!(
                group = self.group_id,
                id = self.id,
                term = self.term,
                index = md.index,
                snapshot_term = md.term,
                "restored snapshot"
            );
            resp.index = self.log.last_index();
        } else {
            resp.index = self.log.committed;
        }
        self.send(resp);
    }

    /// Installs a leader's snapshot unless the log already covers it.
    fn restore(&mut self, snap: Snapshot) -> bool {
        let md = snap.metadata.clone().unwrap_or_default();
        if md.index <= self.log.committed {
            return false;
        }
        assert!(
            self.state == StateRole::Follower,
            "raft: member {} in role {:?} asked to restore a snapshot at term {}",
            self.id,
            self.state,
            self.term
        );
        if self.log.match_term(md.index, md.term) {
            // Our log already has the snapshot's last entry: just commit.
            self.log.commit_to(md.index);
            return false;
        }
        let cs = md.conf_state.clone().unwrap_or_default();
        self.log.restore(snap);
        self.prs = ProgressTracker::new(self.cfg.max_inflight_msgs, self.cfg.max_inflight_bytes);
        self.apply_conf_state(&cs);
        true
    }

    // ---- membership --------------------------------------------------------

    fn apply_conf_state(&mut self, cs: &ConfState) {
        let next = self.log.last_index() + 1;
        for id in &cs.voters {
            self.prs.insert(*id, next, false);
        }
        for id in &cs.learners {
            self.prs.insert(*id, next, true);
        }
    }

    /// Applies a committed single-member change (thesis 4.1) and returns the
    /// new membership.
    pub fn apply_conf_change(&mut self, cc: &ConfChange) -> ConfState {
        let id = cc.node_id;
        let next = self.log.last_index() + 1;
        match cc.change_type() {
            ConfChangeType::ConfChangeAddNode => {
                if let Some(pr) = self.prs.progress.get_mut(&id) {
                    pr.is_learner = false;
                    self.prs.learners.remove(&id);
                    self.prs.voters.insert(id);
                } else {
                    self.prs.insert(id, next, false);
                }
            }
            ConfChangeType::ConfChangeAddLearnerNode => {
                if let Some(pr) = self.prs.progress.get_mut(&id) {
                    pr.is_learner = true;
                    self.prs.voters.remove(&id);
                    self.prs.learners.insert(id);
                } else {
                    self.prs.insert(id, next, true);
                }
            }
            ConfChangeType::ConfChangeRemoveNode => self.prs.remove(id),
            ConfChangeType::ConfChangeUpdateNode => {}
        }
        info!(
            group = self.group_id,
            id = self.id,
            term = self.term,
            node = id,
            change = ?cc.change_type(),
            voters = ?self.prs.voters,
            learners = ?self.prs.learners,
            "applied conf change"
        );
        if self.state == StateRole::Leader {
            if !self.prs.is_voter(self.id) {
                // Thesis 4.2.2: a leader removed from the membership steps
                // down once the change is committed. Stepping down at once
                // could strand the rest: a voter that has not yet learned
                // of the commit still counts this member in its quorum, and
                // this member's longer log would refuse it the vote. So the
                // leader hands over by transfer instead, which first catches
                // the successor up.
                // Votes and commits no longer count this member.
                if self.maybe_commit() {
                    self.on_commit_advanced();
                }
                self.transfer_after_removal();
            } else {
                if self.lead_transferee != NONE && !self.prs.is_voter(self.lead_transferee) {
                    self.abort_leader_transfer();
                }
                // A smaller quorum may commit more now.
                if self.maybe_commit() {
                    self.on_commit_advanced();
                } else {
                    self.bcast_append();
                }
            }
        }
        self.prs.conf_state()
    }

    pub fn randomized_election_timeout_ticks(&self) -> u64 {
        self.randomized_election_timeout_ticks
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

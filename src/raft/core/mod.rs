//! The Raft state machine of one member: roles, elections, replication,
//! reads, leader transfer and membership. Driven by `RawNode`.
//!
//! This file holds the `Raft` struct, its construction, role resets, the timers
//! and the dispatch of `step`; the handlers of each concern live in the child
//! modules `election`, `replication`, `read_index`, `transfer` and `membership`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tracing::{debug, info, warn};

use super::config::Config;
use super::log::RaftLog;
use super::progress::{ProgressState, ProgressTracker, VoteResult};
use super::read_only::ReadOnly;
use super::storage::{Storage, StorageError};
use super::{HardState, Message, MessageType, RaftError, ReadState, NONE};

mod election;
mod membership;
mod read_index;
mod replication;
mod transfer;

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
    /// Ticks since this node was made, up to the election timeout (see
    /// `Config::vote_hold_after_start`).
    ticks_since_start: u64,
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
            ticks_since_start: 0,
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

    // ---- time --------------------------------------------------------------

    pub fn tick(&mut self) {
        if self.ticks_since_start < self.cfg.election_timeout_ticks {
            self.ticks_since_start += 1;
        }
        match self.state {
            StateRole::Leader => self.tick_heartbeat(),
            _ => self.tick_election(),
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

    // ---- stepping ----------------------------------------------------------

    pub fn step(&mut self, m: Message) -> Result<(), RaftError> {
        let t = m.msg_type();
        if m.term == 0 {
            // Local message, or a forwarded proposal/read.
        } else if m.term > self.term {
            if matches!(t, MessageType::MsgVote | MessageType::MsgPreVote) {
                let force = m.context.as_ref() == CAMPAIGN_TRANSFER;
                let heard_leader = self.leader_id != NONE
                    && self.election_elapsed_ticks < self.cfg.election_timeout_ticks;
                let just_started = self.cfg.vote_hold_after_start
                    && self.ticks_since_start < self.cfg.election_timeout_ticks;
                let in_lease = self.cfg.check_quorum && (heard_leader || just_started);
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

    pub fn randomized_election_timeout_ticks(&self) -> u64 {
        self.randomized_election_timeout_ticks
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

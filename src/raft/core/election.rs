//! Elections: campaigns with pre-vote (thesis 9.6), votes granted or refused, and
//! the election timer of followers and candidates.

use bytes::Bytes;
use tracing::{debug, info};

use super::{new_msg, CampaignType, Raft, StateRole, CAMPAIGN_TRANSFER};
use crate::raft::config::SafetyMutation;
use crate::raft::progress::VoteResult;
use crate::raft::storage::Storage;
use crate::raft::{Entry, Message, MessageType, NONE};

fn vote_resp_type(t: MessageType) -> MessageType {
    match t {
        MessageType::MsgVote => MessageType::MsgVoteResp,
        MessageType::MsgPreVote => MessageType::MsgPreVoteResp,
        other => panic!("raft: {other:?} is not a vote request"),
    }
}

impl<S: Storage> Raft<S> {
    /// A voter may campaign; so may a member that applied its own removal
    /// (it counts only the remaining voters): the others may not yet know
    /// the removal committed and still need its log to elect anyone. A
    /// learner, or a member that knows no membership yet, never does.
    fn promotable(&self) -> bool {
        let member_or_removed = self.prs.is_voter(self.id)
            || (!self.prs.learners.contains(&self.id) && !self.prs.voters.is_empty());
        member_or_removed && self.log.unstable.snapshot.is_none()
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

    pub(super) fn become_leader(&mut self) {
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

    pub(super) fn hup(&mut self, t: CampaignType) {
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

    pub(super) fn campaign(&mut self, t: CampaignType) {
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

    pub(super) fn poll(&mut self, from: u64, _t: MessageType, granted: bool) -> VoteResult {
        self.prs.record_vote(from, granted);
        self.prs.tally_votes().2
    }

    fn past_election_timeout(&self) -> bool {
        self.election_elapsed_ticks >= self.randomized_election_timeout_ticks
    }

    pub(super) fn tick_election(&mut self) {
        self.election_elapsed_ticks += 1;
        if self.promotable() && self.past_election_timeout() {
            self.election_elapsed_ticks = 0;
            let _ = self.step(new_msg(NONE, MessageType::MsgHup));
        }
    }

    pub(super) fn handle_vote_request(&mut self, m: Message) {
        let t = m.msg_type();
        let can_vote = self.vote == m.from
            || (self.vote == NONE && self.leader_id == NONE)
            || (t == MessageType::MsgPreVote && m.term > self.term);
        let log_ok = self.cfg.mutation() == Some(SafetyMutation::VoteWithoutLogCheck)
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
}

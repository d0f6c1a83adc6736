//! Membership: single-member conf changes checked, applied and awaited (thesis
//! 4.1), and the membership a snapshot or the storage names.

use tracing::info;

use super::{Raft, StateRole};
use crate::raft::storage::Storage;
use crate::raft::{ConfChange, ConfChangeType, ConfState, EntryType, RaftError, NONE};

impl<S: Storage> Raft<S> {
    pub(super) fn has_unapplied_conf_change(&self) -> bool {
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

    /// Refuses a change that would leave no voter.
    pub(super) fn check_conf_change(&self, cc: &ConfChange) -> Result<(), RaftError> {
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

    pub(super) fn apply_conf_state(&mut self, cs: &ConfState) {
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
}

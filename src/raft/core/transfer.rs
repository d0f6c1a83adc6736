//! Leader transfer (thesis 3.10): catching the transferee up, timeout-now, the
//! transfer timeout, and the hand-over of a leader removed from the membership.

use tracing::{debug, info};

use super::{new_msg, Raft};
use crate::raft::storage::Storage;
use crate::raft::{Message, MessageType, NONE};

impl<S: Storage> Raft<S> {
    pub(super) fn abort_leader_transfer(&mut self) {
        self.lead_transferee = NONE;
        self.transfer_elapsed_ticks = 0;
    }

    pub(super) fn send_timeout_now(&mut self, to: u64) {
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
    pub(super) fn transfer_after_removal(&mut self) {
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

    pub(super) fn handle_transfer_leader(&mut self, m: Message) {
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
}

//! Linearizable reads: ReadIndex rounds confirmed by a heartbeat quorum, and lease
//! reads (thesis 6.4).

use tracing::debug;

use super::{new_msg, Raft, StateRole};
use crate::raft::config::ReadOnlyOption;
use crate::raft::read_only::round_to_ctx;
use crate::raft::storage::Storage;
use crate::raft::{Message, MessageType, ReadState, NONE};

impl<S: Storage> Raft<S> {
    pub(super) fn leader_read_index(&mut self, m: Message) {
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

    pub(super) fn finish_read_round(&mut self, round: u64) {
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

    pub(super) fn release_pending_read_index_msgs(&mut self) {
        let msgs = std::mem::take(&mut self.pending_read_index_msgs);
        for m in msgs {
            self.leader_read_index(m);
        }
    }
}

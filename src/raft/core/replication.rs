//! Log replication: appends and snapshots sent by the leader and the answers to
//! them, the commit index, proposals, and a follower's handling of appends,
//! heartbeats and snapshots received.

use bytes::Bytes;
use prost::Message as _;
use tracing::{debug, info};

use super::{new_msg, Raft, StateRole};
use crate::raft::config::SafetyMutation;
use crate::raft::progress::{ProgressState, ProgressTracker};
use crate::raft::read_only::ctx_to_round;
use crate::raft::storage::{entry_size_bytes, Storage, StorageError};
use crate::raft::{ConfChange, Entry, EntryType, Message, MessageType, RaftError, Snapshot, NONE};

impl<S: Storage> Raft<S> {
    fn check_term(&self) -> bool {
        self.cfg.mutation() != Some(SafetyMutation::CommitPreviousTermByCount)
    }

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

    pub(super) fn send_append(&mut self, to: u64) {
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

    pub(super) fn bcast_heartbeat(&mut self, ctx: Bytes) {
        for id in self.peers() {
            self.send_heartbeat(id, ctx.clone());
        }
    }

    /// Appends entries to the leader's log; refuses them if the uncommitted
    /// tail would exceed its limit.
    pub(super) fn append_entry(&mut self, es: &mut [Entry]) -> Result<(), RaftError> {
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

    pub(super) fn maybe_commit(&mut self) -> bool {
        let mci = self.prs.committed_index();
        let check = self.check_term();
        self.log.maybe_commit(mci, self.term, check)
    }

    pub(super) fn committed_entry_in_current_term(&self) -> bool {
        self.log.term_or_zero(self.log.committed) == self.term
    }

    pub(super) fn on_commit_advanced(&mut self) {
        if self.committed_entry_in_current_term() {
            self.release_pending_read_index_msgs();
        }
        self.bcast_append();
    }

    pub(super) fn leader_propose(&mut self, mut m: Message) -> Result<(), RaftError> {
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

    pub(super) fn handle_append_response(&mut self, m: Message) {
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

    pub(super) fn handle_heartbeat_response(&mut self, m: Message) {
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

    pub(super) fn handle_append_entries(&mut self, m: Message) {
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

    pub(super) fn handle_heartbeat(&mut self, m: Message) {
        self.log.commit_to(m.commit.min(self.log.last_index()));
        let mut resp = new_msg(m.from, MessageType::MsgHeartbeatResp);
        resp.context = m.context;
        self.send(resp);
    }

    pub(super) fn handle_snapshot(&mut self, m: Message) {
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
}

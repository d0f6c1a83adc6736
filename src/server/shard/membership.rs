//! Membership of the shard's group: conf changes proposed and applied, and
//! leadership handed to shard 0's leader.

use super::*;

impl Shard {
    /// etcd's MoveLeader for this shard: only its leader hands leadership
    /// over, and only to a voter.
    pub(super) fn transfer_leader(&mut self, to: u64) -> Result<(), ApiError> {
        if let Some(reason) = &self.failed {
            return Err(self.storage_error(reason.clone()));
        }
        let leader = self.node.leader_id();
        if leader != self.member_id {
            return Err(ApiError::NotLeader { leader });
        }
        if !self.node.status().conf_state.voters.contains(&to) {
            return Err(ApiError::BadLeaderTransferee);
        }
        if to == self.member_id {
            return Ok(());
        }
        tracing::info!(
            shard = self.id,
            term = self.node.term(),
            to,
            "moving leadership on request"
        );
        self.give_up_keyspace_lease_for_transfer();
        self.node
            .transfer_leader(to)
            .map_err(|e| self.storage_error(e.to_string()))
    }

    /// With several shards, every shard is led by shard 0's leader (the
    /// keyspace leader, see [`crate::server::revisions`]): a leader of
    /// another shard hands it to shard 0's leader once that member has its
    /// whole log, and tries again every [`LEADERSHIP_HANDOVER_RETRY`] while
    /// it still leads. With one shard the leader stays where elections or
    /// MoveLeader put it, as in etcd.
    pub(super) fn maybe_hand_over_leadership(&mut self) {
        let Some(keyspace) = &self.keyspace else {
            return;
        };
        let to = keyspace.shard0_leader();
        if self.id == 0
            || to == raft::NONE
            || to == self.member_id
            || self.node.leader_id() != self.member_id
            || self
                .handover_tried
                .is_some_and(|t| t.elapsed() < LEADERSHIP_HANDOVER_RETRY)
        {
            return;
        }
        let status = self.node.status();
        if status.lead_transferee != raft::NONE {
            return;
        }
        let last = self.node.last_index();
        let caught_up = status
            .progress
            .iter()
            .any(|p| p.id == to && !p.is_learner && p.matched == last);
        if caught_up {
            tracing::info!(
                shard = self.id,
                term = self.node.term(),
                to,
                "handing leadership to shard 0's leader"
            );
            self.handover_tried = Some(Instant::now());
            self.give_up_keyspace_lease_for_transfer();
            let _ = self.node.transfer_leader(to);
        }
    }

    /// Carries out a membership change of this shard's group if this member
    /// leads it. A change already in effect is answered at once, so a change
    /// retried after a partial failure completes.
    pub(super) fn propose_conf_change(
        &mut self,
        change: raft::ConfChangeType,
        member: cairn_proto::cairnpb::MemberInfo,
        check_only: bool,
        reply: Reply<WriteResult>,
    ) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(self.storage_error(reason.clone())));
            return;
        }
        let leader = self.node.leader_id();
        if leader != self.member_id {
            let _ = reply.send(Err(ApiError::NotLeader { leader }));
            return;
        }
        let status = self.node.status();
        let cs = &status.conf_state;
        let id = member.id;
        let done = match change {
            raft::ConfChangeType::ConfChangeAddNode => cs.voters.contains(&id),
            raft::ConfChangeType::ConfChangeAddLearnerNode => cs.learners.contains(&id),
            raft::ConfChangeType::ConfChangeRemoveNode => {
                !cs.voters.contains(&id) && !cs.learners.contains(&id)
            }
            raft::ConfChangeType::ConfChangeUpdateNode => false,
        };
        if done {
            let _ = reply.send(Ok(WriteResult::Applied {
                revision: self.store.current_revision(),
            }));
            return;
        }
        if change == raft::ConfChangeType::ConfChangeAddNode && cs.learners.contains(&id) {
            // etcd's rule: a learner is promoted only once it has at least 90%
            // of the leader's log, so the new voter does not stall commits.
            let last = self.node.last_index();
            let matched = status
                .progress
                .iter()
                .find(|p| p.id == id)
                .map_or(0, |p| p.matched);
            if (matched as f64) < (last as f64) * 0.9 {
                let _ = reply.send(Err(ApiError::LearnerNotReady));
                return;
            }
        }
        if check_only && self.strict_reconfig {
            // Only on the check before a change: a change that passed it on
            // every shard is then carried out on every shard.
            let members = &self.members;
            let peers = &self.peers;
            let shard = self.id;
            let now = std::time::Instant::now();
            // Connected, and heard from within an election timeout.
            let heard = |m: u64| {
                self.peer_heard
                    .get(&m)
                    .is_some_and(|&at| now.saturating_duration_since(at) <= self.peer_heard_within)
            };
            let group = reconfig_check::Group {
                local: self.member_id,
                voters: &cs.voters,
                learners: &cs.learners,
                started: &|m| members.get(m).is_some_and(|m| !m.name.is_empty()),
                connected_since: &|m| heard(m).then(|| peers.connected_since(shard, m)).flatten(),
                now,
            };
            if let Err(e) = reconfig_check::check(change, id, &group) {
                tracing::warn!(shard = self.id, member = format_args!("{id:x}"), ?change, error = %e, "membership change refused");
                let _ = reply.send(Err(e));
                return;
            }
        }
        if check_only {
            let _ = reply.send(Ok(WriteResult::Applied {
                revision: self.store.current_revision(),
            }));
            return;
        }
        self.next_request_id += 1;
        let context = cairn_proto::cairnpb::ConfChangeContext {
            request_id: self.next_request_id,
            proposer: self.member_id,
            member: Some(member),
        };
        let cc = ConfChange {
            id: self.next_request_id,
            change_type: change as i32,
            node_id: id,
            context: Bytes::from(context.encode_to_vec()),
        };
        self.conf_change_queue.push_back((cc, reply));
        self.propose_queued_conf_changes();
    }

    /// Proposes the queued membership changes Raft will take now: one at a
    /// time, each after the previous one is applied.
    pub(super) fn propose_queued_conf_changes(&mut self) {
        while let Some((cc, reply)) = self.conf_change_queue.pop_front() {
            if reply.is_closed() {
                continue;
            }
            match self.node.propose_conf_change(&cc) {
                Ok(()) => {
                    self.waiters.insert(
                        cc.id,
                        Waiter {
                            since: Instant::now(),
                            reply,
                        },
                    );
                }
                Err(raft::RaftError::ConfChangePending { .. }) => {
                    self.conf_change_queue.push_front((cc, reply));
                    return;
                }
                Err(e) => {
                    let _ = reply.send(Err(match e {
                        raft::RaftError::NoLeader { .. } | raft::RaftError::NotMember { .. } => {
                            ApiError::NotLeader { leader: raft::NONE }
                        }
                        raft::RaftError::TransferInProgress { .. } => ApiError::LeaderChanged,
                        raft::RaftError::UncommittedLimit { .. } => ApiError::TooManyRequests,
                        other => self.storage_error(other.to_string()),
                    }));
                }
            }
        }
    }

    /// What an applied membership change means beyond Raft: the member table,
    /// this shard's links, and the waiting client.
    pub(super) fn applied_conf_change(&mut self, cc: &ConfChange, conf_state: &ConfState) {
        use cairn_proto::cairnpb::ConfChangeContext;
        let ctx = match ConfChangeContext::decode(cc.context.clone()) {
            Ok(ctx) => ctx,
            Err(e) => {
                tracing::warn!(shard = self.id, error = %e, "conf change context does not decode");
                ConfChangeContext::default()
            }
        };
        let id = cc.node_id;
        self.membership_changed(conf_state);
        // Links are per shard; the member table follows shard 0 alone, so
        // every member changes it in the same order (changes go through
        // shard 0 first when adding and last when removing).
        let table_shard = self.id == 0;
        match (raft::ConfChangeType::try_from(cc.change_type), &ctx.member) {
            (Ok(raft::ConfChangeType::ConfChangeRemoveNode), _) => {
                if id != self.member_id {
                    self.peers.disconnect(self.id, id);
                }
                match (table_shard, id == self.member_id) {
                    (false, _) => {}
                    (true, false) => self.members.remove(id),
                    (true, true) => {
                        tracing::warn!(
                            shard = self.id,
                            "this member's removal from the cluster is applied"
                        );
                        self.members.mark_removed()
                    }
                }
            }
            (Ok(_), Some(member)) if member.id == id => {
                if id != self.member_id {
                    self.peers.connect(self.id, id, &member.peer_urls);
                }
                self.members.accept(id);
                if table_shard {
                    let mut member = member.clone();
                    member.is_learner = conf_state.learners.contains(&id);
                    self.members.upsert(&member)
                }
            }
            _ => {}
        }
        // The table's file is written by a thread of its own; no shard's
        // store commits past this entry before the file has it
        // (`Shard::files_behind`).
        if ctx.proposer == self.member_id {
            if let Some(w) = self.waiters.remove(&ctx.request_id) {
                let _ = w.reply.send(Ok(WriteResult::Applied {
                    revision: self.store.current_revision(),
                }));
            }
        }
    }

    /// Follows a change of the shard's voters and learners (applied, or
    /// installed with a snapshot): whether this member is a learner.
    pub(super) fn membership_changed(&mut self, cs: &ConfState) {
        self.is_learner = cs.learners.contains(&self.member_id);
    }
}

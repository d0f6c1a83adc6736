//! The write pipeline: each Ready's messages sent, its records queued in the
//! core's WAL, and what waited for durability finished once they are durable.

use super::*;

/// A Ready whose WAL write is queued but not yet durable. Its committed
/// entries were applied when it was taken; what remains waits for `lsn`.
pub(super) struct InFlightWrite {
    /// Durable once the WAL's durable LSN reaches this: the Ready's own
    /// records, or the last records queued before it when it had none.
    pub(super) lsn: u64,
    pub(super) rd: Ready,
}

pub(super) struct Waiter {
    pub(super) since: Instant,
    pub(super) reply: Reply<WriteResult>,
}

impl Shard {
    pub(super) async fn handle_ready(&mut self, mut rd: Ready) {
        if let Some(ss) = rd.soft_state {
            tracing::info!(
                shard = self.id,
                term = self.node.term(),
                leader = ss.leader_id,
                role = ?ss.role,
                "raft role changed"
            );
            // Proposals this member made may still commit under a new leader;
            // their waiters stay and are answered on apply, or expire.
            self.handover_tried = None;
            if let Some(k) = &self.keyspace {
                if self.id == 0 {
                    k.set_shard0_leader(ss.leader_id);
                }
                // Ready again only once this term's first entry is applied,
                // and leased again once a round of this term is confirmed.
                k.shard_not_ready(self.id);
                k.drop_lease(self.id);
                self.keyspace_ready_at =
                    (ss.role == StateRole::Leader).then(|| self.node.last_index());
                self.lease_round_wanted = ss.role == StateRole::Leader;
            }
            self.lease_role_changed(ss.role == StateRole::Leader);
            self.cross_role_changed(ss.leader_id);
            // A leader change drops ReadIndex rounds in flight; asking again is
            // always safe. A read point is the leader's only: its asker goes
            // to the new leader.
            let confirmed = self.take_confirmed_renewals();
            self.renewals_this_turn.extend(confirmed);
            for round in std::mem::take(&mut self.read_rounds).into_values() {
                self.reads_this_turn.extend(round.reads);
                self.renewals_this_turn.extend(round.renewals);
                for p in round.points {
                    let _ = p.reply.send(Err(ApiError::NotLeader {
                        leader: ss.leader_id,
                    }));
                }
            }
            let known = ss.leader_id != raft::NONE;
            if let Some(m) = &self.metrics {
                m.set_leader(known, ss.leader_id == self.member_id, true);
                m.set_term(self.node.term());
            }
            if let Some(r) = &self.readiness {
                r.set_shard_has_leader(self.id, known);
            }
        }
        for m in std::mem::take(&mut rd.messages) {
            self.send(m);
        }
        let committed = std::mem::take(&mut rd.committed_entries);
        let read_states = std::mem::take(&mut rd.read_states);
        if rd.snapshot.is_some() {
            // A snapshot replaces the store and the log: it is installed with
            // no other write in flight, and durable before anything else.
            if !self.wait_for_writes().await {
                return;
            }
            if !self.persist(&mut rd).await {
                // Nothing of this Ready is durable: none of it may take effect.
                return;
            }
            for m in std::mem::take(&mut rd.persisted_messages) {
                self.send(m);
            }
            self.node.advance_append(rd);
        } else if !self.queue_write(rd).await {
            return;
        }
        // Raft hands out only entries already durable here (async_append).
        // The rest waits for nothing: one step, whose answers to other cores
        // go out together.
        answers::step(|| self.apply_ready(&committed, read_states));
    }

    /// Applies a Ready's committed entries (durable here) and what follows
    /// from them: confirmed reads served, conf changes proposed, progress
    /// published.
    fn apply_ready(&mut self, committed: &[raft::Entry], read_states: Vec<raft::ReadState>) {
        let apply_started = Instant::now();
        self.apply(committed);
        if self.failed.is_some() {
            // Not everything committed was applied: Raft must not be told it
            // was, and no read may be served from this store.
            return;
        }
        if let Some(m) = &self.metrics {
            if !committed.is_empty() && apply_started.elapsed() >= SLOW_APPLY {
                m.slow_apply();
            }
        }
        self.maybe_keyspace_ready();
        for rs in read_states {
            let ctx = read_context_counter(&rs.request_ctx, self.member_id, self.boot_nonce);
            if let Some(round) = self.read_rounds.remove(&ctx) {
                self.round_confirmed(rs.index, round);
            }
        }
        self.node.on_entries_applied(committed);
        if !self.conf_change_queue.is_empty() {
            self.propose_queued_conf_changes();
        }
        self.record_progress();
        self.publish_revision();
        self.serve_confirmed_reads();
        self.serve_confirmed_renewals();
        self.cross_after_apply();
        self.maybe_compact_log();
    }

    /// A leader that has applied its term's first entry (so every entry of
    /// earlier terms) tells the keyspace, with the revision it reached.
    fn maybe_keyspace_ready(&mut self) {
        let (Some(k), Some(at)) = (&self.keyspace, self.keyspace_ready_at) else {
            return;
        };
        if self.store.applied_index() < at
            && !k.mutated(crate::server::revisions::KeyspaceMutation::OpenBeforeApplied)
        {
            return;
        }
        self.keyspace_ready_at = None;
        if self.node.leader_id() == self.member_id {
            self.cross.ready = true;
            k.shard_ready(self.id, self.node.term(), self.store.current_revision());
        }
    }

    /// Publishes the store's revision: for reads over several shards
    /// (`Reached`), and to the member's headers (`Identity::revision`),
    /// written only when this shard moves it up.
    pub(super) fn publish_revision(&self) {
        let revision = self.store.current_revision();
        if let Some(k) = &self.keyspace {
            k.reached.publish(self.id, revision);
        }
        if let Some(member) = &self.revision_out {
            if member.load(std::sync::atomic::Ordering::Relaxed) < revision {
                member.fetch_max(revision, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Exports indexes and sizes, and tells readiness once the shard has caught
    /// up (a leader is known and everything it committed is applied here).
    pub(super) fn record_progress(&mut self) {
        let committed = self.node.committed_index();
        let applied = self.node.applied_index();
        // Written only when it moves: every header on every core reads it.
        if let Some(published) = &self.term_out {
            let term = self.node.term();
            if published.load(std::sync::atomic::Ordering::Relaxed) != term {
                published.store(term, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if let Some(m) = &self.metrics {
            m.set_committed_index(committed);
            m.set_applied_index(applied);
            let pending = self.waiters.len() as i64;
            m.proposals_pending_add(pending - self.pending_reported);
            self.pending_reported = pending;
        }
        if !self.reported_caught_up && self.node.leader_id() != raft::NONE && applied >= committed {
            self.reported_caught_up = true;
            if let Some(r) = &self.readiness {
                r.set_shard_caught_up(self.id, true);
            }
        }
    }

    pub(super) fn send(&mut self, m: raft::Message) {
        let to = m.to;
        if m.msg_type == raft::MessageType::MsgSnap as i32 {
            self.send_snapshot(m);
            return;
        }
        if !self.peers.send(self.id, m) {
            self.node.report_unreachable(to);
        }
    }

    /// The WAL records of a Ready without a snapshot: its entries, and the
    /// hard state when it must be synced (a commit-only change rides along).
    pub(super) fn wal_records(&mut self, rd: &Ready) -> Vec<cairn_wal::Record> {
        let mut records = Vec::with_capacity(rd.entries.len() + 1);
        for e in &rd.entries {
            records.push(entry::to_wal(self.id, e));
        }
        if let Some(hs) = rd.hard_state {
            self.unsynced_hard_state = Some(hs);
        }
        if rd.must_sync || !records.is_empty() {
            if let Some(hs) = self.unsynced_hard_state.take() {
                records.push(cairn_wal::Record::HardState {
                    shard: u64::from(self.id),
                    state: cairn_wal::HardState {
                        term: hs.term,
                        vote: hs.vote,
                        commit: hs.commit,
                    },
                });
            }
        }
        records
    }

    /// Queues the Ready's records in the WAL without waiting for them. The
    /// rest of the Ready (its entries for the in-memory log, the messages that
    /// wait for durability) is finished by [`Shard::complete_writes`] once
    /// the records, and every record queued before them, are durable.
    pub(super) async fn queue_write(&mut self, rd: Ready) -> bool {
        let records = self.wal_records(&rd);
        if !records.is_empty() {
            match self.wal.submit(&records).await {
                Ok(lsn) => self.last_queued_lsn = lsn,
                Err(e) => {
                    // The WAL is poisoned: nothing more can be made durable.
                    // Stop acknowledging anything; the member must be restarted.
                    self.fail(format!("WAL append failed: {e}"));
                    return false;
                }
            }
        }
        self.in_flight.push_back(InFlightWrite {
            lsn: self.last_queued_lsn,
            rd,
        });
        true
    }

    /// Finishes, oldest first, every queued write that is now durable.
    pub(super) fn complete_writes(&mut self) {
        let durable = self.durable.durable_lsn();
        while self.in_flight.front().is_some_and(|w| w.lsn <= durable) {
            let Some(w) = self.in_flight.pop_front() else {
                break;
            };
            if self.failed.is_some() {
                return;
            }
            let mut rd = w.rd;
            self.stage_in_log(&rd);
            for m in std::mem::take(&mut rd.persisted_messages) {
                self.send(m);
            }
            self.node.advance_append(rd);
        }
    }

    /// Why the WAL stopped making writes durable.
    pub(super) fn wal_failure(&self) -> String {
        let cause = match self.wal.poisoned() {
            Some(p) => cairn_wal::AppendError::from(&p),
            None => cairn_wal::AppendError::Closed,
        };
        format!("WAL append failed: {cause}")
    }

    /// Waits until every queued write is durable and finishes them all.
    pub(super) async fn wait_for_writes(&mut self) -> bool {
        if !self.in_flight.is_empty() && !self.durable.wait_for(self.last_queued_lsn).await {
            self.fail(self.wal_failure());
            return false;
        }
        self.complete_writes();
        self.failed.is_none()
    }

    /// Hands a durable Ready's hard state and entries to the in-memory log
    /// Raft reads from.
    pub(super) fn stage_in_log(&mut self, rd: &Ready) {
        let store = self.node.store_mut();
        if let Some(hs) = rd.hard_state {
            store.set_hard_state(hs);
        }
        if !rd.entries.is_empty() {
            // Entries from a peer are slices of the transport's receive buffers;
            // the in-memory log keeps thousands of them, so each gets its own
            // small allocation instead of pinning a whole buffer.
            let owned: Vec<raft::Entry> = rd
                .entries
                .iter()
                .map(|e| raft::Entry {
                    data: Bytes::copy_from_slice(&e.data),
                    ..e.clone()
                })
                .collect();
            store.append(&owned);
        }
    }

    /// Installs the Ready's snapshot and makes it durable in the WAL with the
    /// Ready's entries and hard state, waiting for the flush, then hands them
    /// to the in-memory log Raft reads from. Only for a Ready with a snapshot:
    /// every other Ready is queued with [`Shard::queue_write`].
    pub(super) async fn persist(&mut self, rd: &mut Ready) -> bool {
        if let Some(snapshot) = &rd.snapshot {
            // The log restarts after the snapshot: the install makes the WAL
            // drop whatever it holds past it (the old log's tail).
            if let Err(e) = self.install_snapshot(snapshot).await {
                self.fail(e.to_string());
                return false;
            }
        }
        let records = self.wal_records(rd);
        if !records.is_empty() {
            match self.wal.append(&records).await {
                Ok(lsn) => self.last_queued_lsn = lsn,
                Err(e) => {
                    // The WAL is poisoned: nothing more can be made durable.
                    // Stop acknowledging anything; the member must be restarted.
                    self.fail(format!("WAL append failed: {e}"));
                    return false;
                }
            }
        }
        if let Some(snapshot) = &rd.snapshot {
            if let Err(e) = self.node.store_mut().apply_snapshot(snapshot.clone()) {
                let reason = format!("installing snapshot in the raft log: {e}");
                self.fail(reason);
                return false;
            }
        }
        self.stage_in_log(rd);
        true
    }

    /// A failure of this shard's storage, as clients see it.
    pub(super) fn storage_error(&self, reason: impl Into<String>) -> ApiError {
        ApiError::Storage {
            shard: self.id,
            reason: reason.into(),
        }
    }

    /// Stops the shard taking part in Raft until the member restarts, and
    /// answers everything waiting with the failure. Only the first failure
    /// counts: a shard already failed stays as it is, so a WAL that keeps
    /// refusing is reported once, not on every turn.
    pub(super) fn fail(&mut self, reason: String) {
        if self.failed.is_some() {
            return;
        }
        if let Some(k) = &self.keyspace {
            k.shard_not_ready(self.id);
            k.drop_lease(self.id);
        }
        self.keyspace_ready_at = None;
        self.cross_role_changed(raft::NONE);
        tracing::error!(shard = self.id, reason = %reason, "shard failed; restart the member");
        // Queued writes will never be made durable by this incarnation: the
        // loop must not wait for them (a poisoned WAL answers at once).
        self.in_flight.clear();
        let err = self.storage_error(reason.clone());
        for w in std::mem::take(&mut self.waiters).into_values() {
            let _ = w.reply.send(Err(err.clone()));
        }
        let mut renewals = std::mem::take(&mut self.renewals_this_turn);
        renewals.extend(self.take_confirmed_renewals());
        let mut points = std::mem::take(&mut self.points_this_turn);
        let reads = std::mem::take(&mut self.read_rounds)
            .into_values()
            .flat_map(|r| {
                renewals.extend(r.renewals);
                points.extend(r.points);
                r.reads
            })
            .chain(
                std::mem::take(&mut self.confirmed_reads)
                    .into_values()
                    .flatten(),
            )
            .chain(self.reads_this_turn.drain(..))
            .chain(
                std::mem::take(&mut self.leaderless_reads)
                    .into_iter()
                    .map(|(_, r)| r),
            )
            .collect::<Vec<_>>();
        for r in reads {
            r.fail(err.clone());
        }
        for r in renewals {
            let _ = r.reply.send(Err(err.clone()));
        }
        for p in points {
            let _ = p.reply.send(Err(err.clone()));
        }
        while let Some((_, write)) = self.next_held_write() {
            if let HeldWrite::Local(_, reply) = write {
                let _ = reply.send(Err(err.clone()));
            }
        }
        self.failed = Some(reason);
    }
}

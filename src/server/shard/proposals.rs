//! Client writes becoming Raft proposals, and the writes and reads that wait
//! while no leader takes proposals.

use super::*;

/// A write waiting until a leader takes proposals.
pub(super) enum HeldWrite {
    /// A client's request made to this member.
    Local(shard_request::Request, Reply<WriteResult>),
    /// A proposal another member forwarded here. Raft would drop it (the
    /// proposer is never told, so its client would wait for its timeout); its
    /// client is answered by the proposer, on apply or by its own timeout.
    Forwarded(raft::Message),
}

impl HeldWrite {
    fn bytes(&self) -> usize {
        match self {
            HeldWrite::Local(request, _) => request.encoded_len(),
            HeldWrite::Forwarded(m) => m.entries.iter().map(|e| e.data.len()).sum(),
        }
    }
}

impl Shard {
    /// Whether a proposal made now reaches a leader that appends it: one is
    /// known and is not handing leadership over, and when it is this member
    /// and the keyspace has several shards, this member assigns revisions
    /// and no txn over several shards holds the shard.
    pub(super) fn takes_proposals(&self) -> bool {
        let leader = self.node.leader_id();
        leader != raft::NONE
            && self.node.lead_transferee() == raft::NONE
            && (leader != self.member_id
                || self
                    .keyspace
                    .as_ref()
                    .is_none_or(|k| k.is_open() && !self.cross.is_held()))
    }

    /// The revision a proposal made here now carries: 0 when the store
    /// numbers writes itself (one shard) or another member leads (it stamps
    /// the forwarded proposal); None when this member leads but assigns no
    /// revisions now, and the write must wait.
    pub(super) fn proposal_revision(&self) -> Option<i64> {
        match &self.keyspace {
            Some(k) if self.node.leader_id() == self.member_id => k.next_revision(),
            _ => Some(0),
        }
    }

    /// Gives each write of a proposal forwarded to this leader its revision:
    /// the last one given (0 when none is), which the caller notes once
    /// Raft took the proposal. None when this member assigns no revisions
    /// now: the proposal waits (stamped again when released; the last
    /// stamp is the one read).
    pub(super) fn stamp_forwarded(&mut self, msg: &mut raft::Message) -> Option<i64> {
        let Some(k) = &self.keyspace else {
            return Some(0);
        };
        if self.node.leader_id() != self.member_id {
            // Raft passes it on to the leader, which stamps it.
            return Some(0);
        }
        let mut last = 0;
        for e in &mut msg.entries {
            if e.entry_type != EntryType::EntryNormal as i32 || e.data.is_empty() {
                continue;
            }
            let revision = k.next_revision()?;
            e.data = entry::with_revision(&e.data, revision);
            last = revision;
        }
        Some(last)
    }

    /// Notes a revision this leader gave an entry of the shard: no later
    /// entry of the shard will carry one at or below it.
    pub(super) fn proposed_revision(&mut self, revision: i64) {
        if revision > 0 {
            self.closed_revision = self.closed_revision.max(revision);
            self.closed_at = Instant::now();
        }
    }

    /// The keyspace leader closes the revisions an idle shard will never
    /// use: when the counter has moved past this shard's last entry and
    /// nothing was proposed here for [`KEYSPACE_CLOSE_INTERVAL`], it
    /// proposes an entry saying no later entry carries a revision at or
    /// below the counter. Watches over several shards release another
    /// shard's events only once this one has been applied past them.
    /// False when there is nothing to close until the counter moves.
    pub(super) fn maybe_close_revision(&mut self) -> bool {
        let Some(k) = &self.keyspace else {
            return true;
        };
        if self.node.leader_id() != self.member_id
            || !self.takes_proposals()
            || self.closed_at.elapsed() < KEYSPACE_CLOSE_INTERVAL
        {
            return true;
        }
        let Some(current) = k.current() else {
            return true;
        };
        if current <= self.closed_revision || current <= self.store.current_revision() {
            return false;
        }
        let data = ShardRequest {
            id: 0,
            member: self.member_id,
            request: Some(shard_request::Request::Close(
                cairn_proto::cairnpb::CloseRevision {},
            )),
            revision: current,
        }
        .encode_to_vec();
        if self.node.propose(Bytes::from(data)).is_ok() {
            self.closed_revision = current;
            self.closed_at = Instant::now();
        }
        true
    }

    /// After a close tick found nothing to close: whether the shard may stop
    /// its close ticks until the counter moves (`seen` then wakes it).
    pub(super) fn closes_may_wait(&self, seen: &mut tokio::sync::watch::Receiver<u64>) -> bool {
        let Some(k) = &self.keyspace else {
            return false;
        };
        if self.cross.unproposed_waits() {
            return false;
        }
        k.counter_moved.wait(seen);
        // A second look, after the flag is up (see `counter_moved`).
        k.current()
            .is_some_and(|c| c <= self.closed_revision || c <= self.store.current_revision())
    }

    /// True for requests that may add data, which a NOSPACE alarm refuses.
    pub(super) fn adds_data(request: &shard_request::Request) -> bool {
        matches!(
            request,
            shard_request::Request::Put(_)
                | shard_request::Request::Txn(_)
                | shard_request::Request::LeaseGrant(_)
        )
    }

    pub(super) fn propose(&mut self, request: shard_request::Request, reply: Reply<WriteResult>) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(self.storage_error(reason.clone())));
            return;
        }
        if self.is_learner {
            let _ = reply.send(Err(ApiError::NotSupportedForLearner));
            return;
        }
        if self.nospace_alarm && Self::adds_data(&request) {
            let _ = reply.send(Err(ApiError::NoSpace));
            return;
        }
        if !self.takes_proposals() {
            if let Some(HeldWrite::Local(_, reply)) =
                self.hold_write(HeldWrite::Local(request, reply))
            {
                let _ = reply.send(Err(ApiError::NoLeader));
            }
            return;
        }
        let Some(revision) = self.proposal_revision() else {
            // Keyspace leadership was lost since the check above.
            if let Some(HeldWrite::Local(_, reply)) =
                self.hold_write(HeldWrite::Local(request, reply))
            {
                let _ = reply.send(Err(ApiError::NoLeader));
            }
            return;
        };
        self.next_request_id += 1;
        let id = self.next_request_id;
        let data = Bytes::from(
            ShardRequest {
                id,
                member: self.member_id,
                request: Some(request),
                revision,
            }
            .encode_to_vec(),
        );
        match self.node.propose(data.clone()) {
            Ok(()) => {
                self.proposed_revision(revision);
                self.proposed(id, reply, data)
            }
            // Not noted as proposed: the shard's next close covers the
            // revision it took (see `maybe_close_revision`).
            Err(e) => {
                let _ = reply.send(Err(self.refused(e)));
            }
        }
    }

    /// The proposal `data` with request id `id` was taken: its client is
    /// answered on apply; the entry is kept for txns over several shards.
    pub(super) fn proposed(&mut self, id: u64, reply: Reply<WriteResult>, data: Bytes) {
        self.note_proposed(std::iter::once(data));
        self.waiters.insert(
            id,
            Waiter {
                since: Instant::now(),
                reply,
            },
        );
    }

    /// What a client is told when Raft refused its proposal.
    pub(super) fn refused(&self, e: raft::RaftError) -> ApiError {
        if let Some(m) = &self.metrics {
            m.proposal_failed();
        }
        match e {
            raft::RaftError::NoLeader { .. } | raft::RaftError::NotMember { .. } => {
                ApiError::NoLeader
            }
            raft::RaftError::TransferInProgress { .. } => ApiError::LeaderChanged,
            raft::RaftError::UncommittedLimit { .. } => ApiError::TooManyRequests,
            other => self.storage_error(other.to_string()),
        }
    }

    /// Queues a write until a leader takes proposals; hands it back, refused,
    /// when too many already wait.
    pub(super) fn hold_write(&mut self, write: HeldWrite) -> Option<HeldWrite> {
        let bytes = write.bytes();
        if self.leaderless_writes.len() + self.leaderless_reads.len() >= MAX_LEADERLESS_REQUESTS
            || self.leaderless_write_bytes + bytes > MAX_LEADERLESS_WRITE_BYTES
        {
            return Some(write);
        }
        self.leaderless_write_bytes += bytes;
        self.leaderless_writes.push_back((Instant::now(), write));
        None
    }

    pub(super) fn next_held_write(&mut self) -> Option<(Instant, HeldWrite)> {
        let held = self.leaderless_writes.pop_front()?;
        self.leaderless_write_bytes -= held.1.bytes();
        Some(held)
    }

    /// Sends requests that waited for a leader, once one is known.
    pub(super) fn release_leaderless(&mut self) {
        if self.node.leader_id() == raft::NONE {
            return;
        }
        // Checked before each: a write that finds revisions stopped since
        // (a lapsed lease) is held again, and must not be taken again here.
        while self.takes_proposals() {
            let Some((_, write)) = self.next_held_write() else {
                break;
            };
            match write {
                HeldWrite::Local(request, reply) => self.propose(request, reply),
                HeldWrite::Forwarded(msg) => self.step(msg),
            }
        }
        for (_, read) in std::mem::take(&mut self.leaderless_reads) {
            self.reads_this_turn.push(read);
        }
    }

    /// Answers requests that waited too long: their clients have given up.
    pub(super) fn expire(&mut self) {
        let now = Instant::now();
        while self
            .leaderless_writes
            .front()
            .is_some_and(|(since, _)| now.duration_since(*since) >= LEADERLESS_WAIT)
        {
            if let Some((_, HeldWrite::Local(_, reply))) = self.next_held_write() {
                let _ = reply.send(Err(ApiError::NoLeader));
            }
        }
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.leaderless_reads)
            .into_iter()
            .partition(|(since, _)| now.duration_since(*since) >= LEADERLESS_WAIT);
        self.leaderless_reads = waiting;
        for (_, r) in expired {
            r.fail(ApiError::NoLeader);
        }
        self.waiters
            .retain(|_, w| now.duration_since(w.since) < REQUEST_TIMEOUT && !w.reply.is_closed());
        let expired: Vec<u64> = self
            .read_rounds
            .iter()
            .filter(|(_, r)| now.duration_since(r.since) >= REQUEST_TIMEOUT)
            .map(|(&ctx, _)| ctx)
            .collect();
        for ctx in expired {
            if let Some(round) = self.read_rounds.remove(&ctx) {
                for r in round.reads {
                    r.fail(ApiError::Timeout);
                }
                for r in round.renewals {
                    let _ = r.reply.send(Err(ApiError::Timeout));
                }
                for p in round.points {
                    let _ = p.reply.send(Err(ApiError::Timeout));
                }
            }
        }
    }
}

//! Linearizable reads: ReadIndex rounds, and reads served once the
//! confirmed index is applied. With several shards, a linearizable read is
//! read at a point of the one revision order (docs/KEYSPACE.md, "Consistent
//! reads"): the keyspace leader's shards answer read points here, and each
//! touched shard serves the read at the point's revision once it has applied
//! the point's index. How a range is read from the store, in chunks off a
//! snapshot, is in `ranges`; etcd's read-only txns are read the same way as
//! ranges, not through the log (`txns`); HashKV is read in steps
//! (`hash_kv`).

use super::*;
use crate::server::command::ReadAt;
use cairn_proto::etcdserverpb::{Compare, TxnRequest, TxnResponse};

mod hash_kv;
mod ranges;
mod txns;

use ranges::read_error_to_api;

/// A linearizable read waiting for its ReadIndex round and then for apply.
pub(super) struct PendingRead {
    pub(super) read: Read,
    /// The read point it is read at (several shards); None: at the store's
    /// revision when served.
    pub(super) at: Option<crate::server::command::ReadAt>,
}

/// What a read reads: a range, etcd's read-only txn, or the compares of
/// one over several shards.
pub(super) enum Read {
    Range(RangeRequest, Reply<RangeResponse>),
    Txn(TxnRequest, Reply<TxnResponse>),
    Compares(Vec<Compare>, Reply<Vec<Option<bool>>>),
}

impl PendingRead {
    /// Answers the read with `e`.
    pub(super) fn fail(self, e: ApiError) {
        match self.read {
            Read::Range(_, reply) => {
                let _ = reply.send(Err(e));
            }
            Read::Txn(_, reply) => {
                let _ = reply.send(Err(e));
            }
            Read::Compares(_, reply) => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

/// A read point asked of this leader: answered, once a ReadIndex round
/// started after it arrived confirms the leadership, with the later of the
/// round's index and `last_index`, the log's last index when it arrived.
pub(super) struct PendingPoint {
    pub(super) last_index: u64,
    pub(super) reply: Reply<ShardPoint>,
}

/// Lease keep-alives waiting for the ReadIndex round that proves this member
/// still leads the shard: a leader cut off from the majority must not renew
/// on its own word, since the majority may have elected a leader that expires
/// the lease meanwhile. Answered together: every lease's TTL, in order, or
/// one refusal.
pub(super) struct PendingRenewal {
    pub(super) ids: Vec<i64>,
    pub(super) reply: Reply<Vec<Option<i64>>>,
}

pub(super) struct ReadRound {
    pub(super) since: Instant,
    pub(super) reads: Vec<PendingRead>,
    pub(super) renewals: Vec<PendingRenewal>,
    pub(super) points: Vec<PendingPoint>,
}

/// The counter of a read context this incarnation made, or 0 for any other.
pub(super) fn read_context_counter(ctx: &[u8], member_id: u64, boot_nonce: u64) -> u64 {
    if ctx.len() != 24
        || ctx[0..8] != member_id.to_le_bytes()
        || ctx[8..16] != boot_nonce.to_le_bytes()
    {
        return 0;
    }
    u64::from_le_bytes(ctx[16..24].try_into().expect("8 bytes"))
}

impl Shard {
    pub(super) fn start_read_round(&mut self) {
        // Renewals are for the leader only; one that lost leadership since
        // they arrived answers them now.
        if !self.renewals_this_turn.is_empty() {
            if let Err(e) = self.lease_leader_check() {
                for r in self.renewals_this_turn.drain(..) {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
        if !self.points_this_turn.is_empty() && self.node.leader_id() != self.member_id {
            let leader = self.node.leader_id();
            for p in self.points_this_turn.drain(..) {
                let _ = p.reply.send(Err(ApiError::NotLeader { leader }));
            }
        }
        if self.reads_this_turn.is_empty()
            && self.renewals_this_turn.is_empty()
            && self.points_this_turn.is_empty()
            && !self.lease_round_wanted
        {
            return;
        }
        self.lease_round_wanted = false;
        if self.node.leader_id() == raft::NONE {
            let now = Instant::now();
            for r in self.reads_this_turn.drain(..) {
                if self.leaderless_writes.len() + self.leaderless_reads.len()
                    >= MAX_LEADERLESS_REQUESTS
                {
                    r.fail(ApiError::NoLeader);
                } else {
                    self.leaderless_reads.push((now, r));
                }
            }
            return;
        }
        let reads = std::mem::take(&mut self.reads_this_turn);
        let renewals = std::mem::take(&mut self.renewals_this_turn);
        let points = std::mem::take(&mut self.points_this_turn);
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        // Contexts are unique across members and restarts: a leader ignores a
        // context already pending, and a late answer to an earlier incarnation
        // must never confirm a new read.
        let mut context = Vec::with_capacity(24);
        context.extend_from_slice(&self.member_id.to_le_bytes());
        context.extend_from_slice(&self.boot_nonce.to_le_bytes());
        context.extend_from_slice(&ctx.to_le_bytes());
        match self.node.read_index(Bytes::from(context)) {
            Ok(()) => {
                self.read_rounds.insert(
                    ctx,
                    ReadRound {
                        since: Instant::now(),
                        reads,
                        renewals,
                        points,
                    },
                );
            }
            Err(_) => {
                for r in reads {
                    r.fail(ApiError::NoLeader);
                }
                for r in renewals {
                    let _ = r
                        .reply
                        .send(Err(ApiError::NotLeader { leader: raft::NONE }));
                }
                for p in points {
                    let _ = p
                        .reply
                        .send(Err(ApiError::NotLeader { leader: raft::NONE }));
                }
            }
        }
    }

    pub(super) fn read_error(&self, e: mvcc::ReadError) -> ApiError {
        read_error_to_api(self.id, e)
    }

    /// A ReadIndex round came back: a quorum acknowledged this member as
    /// leader after the round started. Its reads, and its renewals, wait for
    /// the index to be applied; the renewals count from the round's start
    /// (any leader elected later starts every TTL afresh after that).
    pub(super) fn round_confirmed(&mut self, index: u64, round: ReadRound) {
        self.renew_keyspace_lease(round.since);
        if !round.reads.is_empty() {
            self.confirmed_reads
                .entry(index)
                .or_default()
                .extend(round.reads);
        }
        if index <= self.node.applied_index() {
            for r in round.renewals {
                self.renew(r, round.since);
            }
        } else if !round.renewals.is_empty() {
            let since = round.since;
            self.confirmed_renewals
                .entry(index)
                .or_default()
                .extend(round.renewals.into_iter().map(|r| (since, r)));
        }
        for p in round.points {
            let index = index.max(p.last_index);
            let point = match self.node.term_of(index) {
                Some(term) => Ok(ShardPoint { index, term }),
                None => Err(ApiError::LeaderChanged),
            };
            let _ = p.reply.send(point);
        }
    }

    /// A round started at `since` was confirmed: no other member can be
    /// elected for the shard until a follower's election timeout after
    /// that, so the keyspace lease runs to `since + lease_span`.
    fn renew_keyspace_lease(&mut self, since: Instant) {
        let Some(k) = &self.keyspace else {
            return;
        };
        if self.node.leader_id() != self.member_id
            || self.node.lead_transferee() != raft::NONE
            || self.lease_blocked_until.is_some_and(|b| since < b)
        {
            return;
        }
        k.set_lease(self.id, since + self.lease_span);
    }

    /// The keyspace lease is given up while leadership is handed over, and
    /// not renewed by rounds started before the handover could still move
    /// it (see `lease_blocked_until`).
    pub(super) fn give_up_keyspace_lease_for_transfer(&mut self) {
        if let Some(k) = &self.keyspace {
            k.drop_lease(self.id);
            self.lease_blocked_until = Some(Instant::now() + self.lease_transfer_block);
        }
    }

    /// A read point asked of this shard: see [`PendingPoint`]. Only the
    /// leader answers one; the asker goes to the leader otherwise.
    pub(super) fn read_point(&mut self, reply: Reply<ShardPoint>) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(self.storage_error(reason.clone())));
            return;
        }
        let leader = self.node.leader_id();
        if leader != self.member_id {
            let _ = reply.send(Err(match leader {
                raft::NONE => ApiError::NoLeader,
                leader => ApiError::NotLeader { leader },
            }));
            return;
        }
        let Err(reply) = self.hold_read_point(reply) else {
            return;
        };
        self.points_this_turn.push(PendingPoint {
            last_index: self.node.last_index(),
            reply,
        });
    }

    /// A read asked of this shard: a serializable one at once (or, at a cut
    /// this member's shards have reached, once applied there); a
    /// linearizable one after a ReadIndex round, or once the point the
    /// keyspace leader confirmed is applied.
    pub(super) fn read(&mut self, read: Read, serializable: bool, at: Option<ReadAt>) {
        let read = PendingRead { read, at };
        if serializable && at.is_none() {
            self.serve_read(read);
        } else if serializable {
            self.read_at(read);
        } else if self.is_learner {
            read.fail(ApiError::NotSupportedForLearner);
        } else if at.is_some() {
            self.read_at(read);
        } else {
            self.reads_this_turn.push(read);
        }
    }

    /// A read at a point the keyspace leader confirmed: served once this
    /// member has applied the point's index.
    pub(super) fn read_at(&mut self, read: PendingRead) {
        let index = read.at.map_or(0, |at| at.index);
        if index <= self.node.applied_index() {
            self.serve_read(read);
        } else {
            self.confirmed_reads.entry(index).or_default().push(read);
        }
    }

    pub(super) fn serve_confirmed_reads(&mut self) {
        let applied = self.node.applied_index();
        while let Some(entry) = self.confirmed_reads.first_entry() {
            if *entry.key() > applied {
                break;
            }
            for r in entry.remove() {
                self.serve_read(r);
            }
        }
    }

    /// Every confirmed keep-alive still waiting for its index, taken to be
    /// refused or asked again.
    pub(super) fn take_confirmed_renewals(&mut self) -> impl Iterator<Item = PendingRenewal> {
        std::mem::take(&mut self.confirmed_renewals)
            .into_values()
            .flatten()
            .map(|(_, r)| r)
    }

    /// Answers the confirmed keep-alives whose index is applied.
    pub(super) fn serve_confirmed_renewals(&mut self) {
        let applied = self.node.applied_index();
        while let Some(entry) = self.confirmed_renewals.first_entry() {
            if *entry.key() > applied {
                break;
            }
            for (since, r) in entry.remove() {
                self.renew(r, since);
            }
        }
    }

    /// Renews the leases of a confirmed keep-alive from `since`, the start
    /// of the round that confirmed it, and answers it.
    fn renew(&mut self, r: PendingRenewal, since: Instant) {
        let renewed = self.lease_leader_check().map(|()| {
            r.ids
                .iter()
                .map(|&id| self.lease_clock.renew(id, since))
                .collect()
        });
        let _ = r.reply.send(renewed);
    }

    /// Serves a read whose index is applied; one at a point whose entry
    /// here is not the leader's (see [`crate::server::command::ReadAt`])
    /// is refused.
    fn serve_read(&mut self, read: PendingRead) {
        if let Some(at) = read.at {
            if at.term != 0 && self.node.term_of(at.index) != Some(at.term) {
                read.fail(ApiError::LeaderChanged);
                return;
            }
        }
        let point = read.at.map(|at| at.revision);
        match read.read {
            Read::Range(request, reply) => self.serve_range(&request, reply, point),
            Read::Txn(request, reply) => self.serve_txn(&request, reply, point),
            Read::Compares(compares, reply) => self.serve_compares(&compares, reply, point),
        }
    }
}

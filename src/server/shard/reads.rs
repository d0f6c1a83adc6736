//! Linearizable reads: ReadIndex rounds, and reads served once the
//! confirmed index is applied. How a range is read from the store, in chunks
//! off a snapshot, is in `ranges`.

use super::*;

mod ranges;

use ranges::read_error_to_api;

/// A linearizable read waiting for its ReadIndex round and then for apply.
pub(super) struct PendingRead {
    pub(super) request: RangeRequest,
    pub(super) reply: Reply<RangeResponse>,
}

/// A lease keep-alive waiting for the ReadIndex round that proves this member
/// still leads the shard: a leader cut off from the majority must not renew
/// on its own word, since the majority may have elected a leader that expires
/// the lease meanwhile.
pub(super) struct PendingRenewal {
    pub(super) id: i64,
    pub(super) reply: Reply<Option<i64>>,
}

pub(super) struct ReadRound {
    pub(super) since: Instant,
    pub(super) reads: Vec<PendingRead>,
    pub(super) renewals: Vec<PendingRenewal>,
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
        if self.reads_this_turn.is_empty() && self.renewals_this_turn.is_empty() {
            return;
        }
        if self.node.leader_id() == raft::NONE {
            let now = Instant::now();
            for r in self.reads_this_turn.drain(..) {
                if self.leaderless_writes.len() + self.leaderless_reads.len()
                    >= MAX_LEADERLESS_REQUESTS
                {
                    let _ = r.reply.send(Err(ApiError::NoLeader));
                } else {
                    self.leaderless_reads.push((now, r));
                }
            }
            return;
        }
        let reads = std::mem::take(&mut self.reads_this_turn);
        let renewals = std::mem::take(&mut self.renewals_this_turn);
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
                    },
                );
            }
            Err(_) => {
                for r in reads {
                    let _ = r.reply.send(Err(ApiError::NoLeader));
                }
                for r in renewals {
                    let _ = r
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
    /// leader after the round started. Its reads wait for the index to be
    /// applied; its renewals take effect now, counted from the round's start
    /// (any leader elected later starts every TTL afresh after that).
    pub(super) fn round_confirmed(&mut self, index: u64, round: ReadRound) {
        if !round.reads.is_empty() {
            self.confirmed_reads
                .entry(index)
                .or_default()
                .extend(round.reads);
        }
        for r in round.renewals {
            let renewed = self
                .lease_leader_check()
                .map(|()| self.lease_clock.renew(r.id, round.since));
            let _ = r.reply.send(renewed);
        }
    }

    pub(super) fn serve_confirmed_reads(&mut self) {
        let applied = self.node.applied_index();
        while let Some(entry) = self.confirmed_reads.first_entry() {
            if *entry.key() > applied {
                break;
            }
            for r in entry.remove() {
                self.serve_range(&r.request, r.reply);
            }
        }
    }
}

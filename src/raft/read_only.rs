//! Pending ReadIndex requests on the leader (Raft thesis 6.4): each waits for
//! a heartbeat round, started after it arrived, to be acknowledged by a quorum.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

use super::Message;

#[derive(Debug)]
pub(crate) struct ReadIndexStatus {
    pub req: Message,
    /// Commit index when the request arrived: what the reader must wait for.
    pub index: u64,
    /// Round whose acknowledgement confirms this request; 0 while no round
    /// covering it has been sent yet.
    pub round: u64,
}

#[derive(Debug, Default)]
pub(crate) struct ReadOnly {
    pub pending: BTreeMap<Bytes, ReadIndexStatus>,
    pub queue: VecDeque<Bytes>,
    /// Members that acknowledged each round.
    pub acks: BTreeMap<u64, BTreeSet<u64>>,
    pub last_round: u64,
    /// Requests queued since the last round was sent.
    pub unsent: bool,
}

impl ReadOnly {
    /// Queues a request; returns false if its context is already pending.
    pub fn add_request(&mut self, index: u64, req: Message, ctx: Bytes) -> bool {
        if self.pending.contains_key(&ctx) {
            return false;
        }
        self.pending.insert(
            ctx.clone(),
            ReadIndexStatus {
                req,
                index,
                round: 0,
            },
        );
        self.queue.push_back(ctx);
        self.unsent = true;
        true
    }

    /// Starts a round covering every request not yet covered. Batching: all
    /// requests that arrived since the last round share this one.
    /// `self_vote` is this member's id when it is a voter, counted as the
    /// first acknowledgement, or `None` for a leader outside the membership.
    pub fn start_round(&mut self, self_vote: Option<u64>) -> u64 {
        self.last_round += 1;
        let round = self.last_round;
        for ctx in self.queue.iter().rev() {
            let st = self.pending.get_mut(ctx).expect("queued read is pending");
            if st.round != 0 {
                break;
            }
            st.round = round;
        }
        self.acks.insert(round, self_vote.into_iter().collect());
        self.unsent = false;
        round
    }

    /// Records an acknowledgement of `round` by `from`; returns how many
    /// members have acknowledged it.
    pub fn recv_ack(&mut self, from: u64, round: u64) -> usize {
        match self.acks.get_mut(&round) {
            Some(s) => {
                s.insert(from);
                s.len()
            }
            None => 0,
        }
    }

    /// Pops every request confirmed by `round` (a later round confirms the
    /// earlier ones too).
    pub fn advance(&mut self, round: u64) -> Vec<ReadIndexStatus> {
        let mut out = Vec::new();
        while let Some(ctx) = self.queue.front() {
            let r = self.pending[ctx].round;
            if r == 0 || r > round {
                break;
            }
            let ctx = self.queue.pop_front().expect("front exists");
            out.push(self.pending.remove(&ctx).expect("queued read is pending"));
        }
        self.acks.retain(|r, _| *r > round);
        out
    }

    /// Context re-confirming the latest round while reads wait on it;
    /// empty when none wait.
    pub fn retry_ctx(&self) -> Bytes {
        let waiting = self
            .queue
            .front()
            .is_some_and(|ctx| self.pending[ctx].round != 0);
        if waiting && self.acks.contains_key(&self.last_round) {
            round_to_ctx(self.last_round)
        } else {
            Bytes::new()
        }
    }

    pub fn clear(&mut self) {
        self.pending.clear();
        self.queue.clear();
        self.acks.clear();
        self.unsent = false;
    }
}

/// Encodes a round number as heartbeat context.
pub(crate) fn round_to_ctx(round: u64) -> Bytes {
    Bytes::copy_from_slice(&round.to_le_bytes())
}

/// Decodes heartbeat context; anything but 8 bytes is no round.
pub(crate) fn ctx_to_round(ctx: &[u8]) -> Option<u64> {
    let b: [u8; 8] = ctx.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

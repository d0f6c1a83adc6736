//! One simulated member of the keyspace: a Raft node per shard with its
//! disk, and the keyspace state it keeps in memory (the revision counter and
//! a lease per shard).

use std::collections::HashMap;

use bytes::Bytes;

use super::super::member::{PendingWrite, StateMachine};
use super::checker::AppliedCursor;
use super::{Guard, ELECTION_TIMEOUT_TICKS, LEASE_MARGIN_TICKS, TRANSFER_TAINT_TICKS};
use crate::raft::{MemStorage, Message, RawNode, StateRole};

/// A write entry's payload: `w<id> r<revision>`.
pub(super) fn encode_write(id: u64, rev: u64) -> Bytes {
    Bytes::from(format!("w{id} r{rev}"))
}

/// The write id and revision an entry's payload carries; `None` for an
/// entry that is not a write (a no-op).
pub(super) fn decode_write(data: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(data).ok()?;
    let (w, r) = s.split_once(' ')?;
    Some((
        w.strip_prefix('w')?.parse().ok()?,
        r.strip_prefix('r')?.parse().ok()?,
    ))
}

/// The context of a lease round: the shard, the term it was issued in, the
/// tick it was issued at, and a sequence number that keeps contexts unique.
pub(super) fn encode_lease_ctx(shard: usize, term: u64, tick: u64, seq: u64) -> Bytes {
    Bytes::from(format!("lease s{shard} t{term} k{tick} #{seq}"))
}

/// `(shard, term, tick)` of a lease round's context.
pub(super) fn decode_lease_ctx(ctx: &[u8]) -> Option<(usize, u64, u64)> {
    let s = std::str::from_utf8(ctx).ok()?;
    let mut it = s.strip_prefix("lease ")?.split(' ');
    let shard = it.next()?.strip_prefix('s')?.parse().ok()?;
    let term = it.next()?.strip_prefix('t')?.parse().ok()?;
    let tick = it.next()?.strip_prefix('k')?.parse().ok()?;
    Some((shard, term, tick))
}

/// One shard of one member.
pub(super) struct Shard {
    /// `None` while the member is down.
    pub node: Option<RawNode<MemStorage>>,
    /// The durable image while the member is down.
    pub disk: MemStorage,
    /// The Ready whose disk write is in progress.
    pub pending: Option<PendingWrite>,
    /// Membership and applied index (no snapshots: logs are never
    /// compacted).
    pub sm: StateMachine,
    /// Term of the last applied entry: equal to a leader's term once its
    /// no-op is applied.
    pub applied_term: u64,
    pub cursor: AppliedCursor,
    /// `(term, start tick)` of the newest lease round that came back.
    pub lease: Option<(u64, u64)>,
    /// `(term, tick)` at which a leader transfer of this shard was last
    /// seen in progress here.
    pub transfer_seen: Option<(u64, u64)>,
    pub last_lease_round_tick: Option<u64>,
    pub last_transfer_request_tick: Option<u64>,
    /// While set, this shard's Raft ticks are held back until this tick
    /// (a starved timer on the core that runs it), though the shard keeps
    /// handling messages, disk writes and proposals.
    pub ticks_stalled_until: Option<u64>,
    /// Ticks held back by the stall, delivered in a bunch when it ends.
    pub stalled_ticks: u64,
    /// Role and term at the end of the previous step, for the trace.
    pub last_role: (StateRole, u64),
}

impl Shard {
    pub fn new(disk: MemStorage) -> Self {
        Shard {
            node: None,
            disk,
            pending: None,
            sm: StateMachine::default(),
            applied_term: 0,
            cursor: AppliedCursor::default(),
            lease: None,
            transfer_seen: None,
            last_lease_round_tick: None,
            last_transfer_request_tick: None,
            ticks_stalled_until: None,
            stalled_ticks: 0,
            last_role: (StateRole::Follower, 0),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.node
            .as_ref()
            .is_some_and(|n| n.role() == StateRole::Leader)
    }

    /// Leads in its current term and has applied that term's no-op, so
    /// every entry of earlier terms it holds.
    pub fn leads_with_noop_applied(&self) -> bool {
        self.node
            .as_ref()
            .is_some_and(|n| n.role() == StateRole::Leader && self.applied_term == n.term())
    }

    /// Whether the lease of this shard holds at tick `now`.
    pub fn lease_holds(&self, now: u64) -> bool {
        let Some(n) = self.node.as_ref() else {
            return false;
        };
        n.role() == StateRole::Leader
            && n.lead_transferee() == 0
            && self.lease.is_some_and(|(term, start)| {
                term == n.term() && now < start + ELECTION_TIMEOUT_TICKS - LEASE_MARGIN_TICKS
            })
    }

    /// A lease round issued at `start` in `term` came back: a quorum heard
    /// this leader after `start`.
    pub fn lease_round_returned(&mut self, term: u64, start: u64) -> bool {
        let Some(n) = self.node.as_ref() else {
            return false;
        };
        if n.role() != StateRole::Leader || n.term() != term || n.lead_transferee() != 0 {
            return false;
        }
        if self
            .transfer_seen
            .is_some_and(|(t, at)| t == term && start <= at + TRANSFER_TAINT_TICKS)
        {
            return false;
        }
        if self.lease.is_none_or(|(t, s)| t != term || s < start) {
            self.lease = Some((term, start));
        }
        true
    }

    /// Drops the lease if leadership moved or a transfer is in progress.
    pub fn observe_role(&mut self, now: u64) {
        let Some(n) = self.node.as_ref() else {
            self.lease = None;
            return;
        };
        if n.role() != StateRole::Leader {
            self.lease = None;
            return;
        }
        if n.lead_transferee() != 0 {
            self.transfer_seen = Some((n.term(), now));
            self.lease = None;
        }
        if self.lease.is_some_and(|(t, _)| t != n.term()) {
            self.lease = None;
        }
    }
}

/// Why a member refused to give a write a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    Down,
    NotLeaderOfEveryShard,
    NoopNotApplied,
    NoLease,
}

pub(super) struct KsMember {
    pub id: u64,
    pub shards: Vec<Shard>,
    /// The revision counter, in memory only.
    pub counter: u64,
    pub started_at_tick: u64,
    pub restart_at_tick: Option<u64>,
    /// While set, the member is paused until this tick.
    pub paused_until: Option<u64>,
    /// Ticks the member missed while paused, delivered in a bunch when it
    /// resumes.
    pub missed_ticks: u64,
    /// Messages that reached the member while it was paused: `(shard,
    /// message)`.
    pub held: Vec<(usize, Message)>,
    /// Writes this incarnation proposed, by id, awaiting their apply here.
    pub proposed: HashMap<u64, usize>,
    pub incarnation: u64,
    pub lease_seq: u64,
}

impl KsMember {
    pub fn new(id: u64, disks: Vec<MemStorage>) -> Self {
        KsMember {
            id,
            shards: disks.into_iter().map(Shard::new).collect(),
            counter: 0,
            started_at_tick: 0,
            restart_at_tick: None,
            paused_until: None,
            missed_ticks: 0,
            held: Vec::new(),
            proposed: HashMap::new(),
            incarnation: 0,
            lease_seq: 0,
        }
    }

    pub fn is_up(&self) -> bool {
        self.shards[0].node.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.paused_until.is_some()
    }

    /// Up and not paused: able to act.
    pub fn is_running(&self) -> bool {
        self.is_up() && !self.is_paused()
    }

    pub fn leads_shard0(&self) -> bool {
        self.shards[0].is_leader()
    }

    /// Whether this member may hand out a revision at tick `now` under
    /// `guard`.
    pub fn may_assign(&self, guard: Guard, now: u64) -> Result<(), Refusal> {
        if !self.is_running() {
            return Err(Refusal::Down);
        }
        if !self.shards.iter().all(Shard::is_leader) {
            return Err(Refusal::NotLeaderOfEveryShard);
        }
        if !self.shards.iter().all(Shard::leads_with_noop_applied) {
            return Err(Refusal::NoopNotApplied);
        }
        if guard.uses_lease() && !self.shards.iter().all(|s| s.lease_holds(now)) {
            return Err(Refusal::NoLease);
        }
        Ok(())
    }

    /// Takes the next revision: first past everything applied in any shard,
    /// then past everything this member handed out.
    pub fn next_revision(&mut self) -> u64 {
        let applied = self.shards.iter().map(|s| s.cursor.rev).max().unwrap_or(0);
        self.counter = self.counter.max(applied) + 1;
        self.counter
    }

    /// Forgets everything kept in memory, as a crash does.
    pub fn forget_memory(&mut self) {
        self.counter = 0;
        self.paused_until = None;
        self.missed_ticks = 0;
        self.held.clear();
        self.proposed.clear();
        for s in &mut self.shards {
            s.pending = None;
            s.lease = None;
            s.transfer_seen = None;
            s.last_lease_round_tick = None;
            s.last_transfer_request_tick = None;
            s.ticks_stalled_until = None;
            s.stalled_ticks = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        assert_eq!(decode_write(&encode_write(17, 42)), Some((17, 42)));
        assert_eq!(decode_write(b""), None);
        assert_eq!(
            decode_lease_ctx(&encode_lease_ctx(2, 9, 130, 5)),
            Some((2, 9, 130))
        );
        assert_eq!(decode_lease_ctx(b"r12"), None);
    }
}

//! One simulated member of the keyspace: a Raft node per shard with its
//! disk and its store, and the keyspace state it keeps in memory (the
//! revision counter and its opening, a lease per shard, the holds of txns
//! over several shards, the read points waiting for them, and the answers
//! to its own proposals).
//!
//! Each member reads its own monotonic clock, in thousandths of a tick
//! ([`MTICKS_PER_TICK`]), which runs at its own rate (within
//! [`MAX_CLOCK_SKEW_MTICKS`] of the simulation's tick). Its Raft timers tick
//! whenever that clock passes a whole tick, and its leases are measured on
//! it: the rate skew the lease margin is there for.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

use super::super::member::{PendingWrite, StateMachine};
use super::checker::AppliedCursor;
use super::cross::Opening;
use super::kv::{GetResult, Store};
use super::watch::Watcher;
use super::{
    Guard, ELECTION_TIMEOUT_TICKS, LEASE_MARGIN_TICKS, MAX_CLOCK_SKEW_MTICKS, MTICKS_PER_TICK,
    TRANSFER_TAINT_TICKS,
};
use crate::raft::{MemStorage, Message, RawNode, StateRole};

/// First revision of epoch `e` is above `e << EPOCH_SHIFT`, as in
/// `src/server/revisions/mod.rs` (which shifts by 40; the simulator's runs are
/// short).
pub const EPOCH_SHIFT: u32 = 32;

pub fn epoch_start(epoch: u64) -> u64 {
    epoch << EPOCH_SHIFT
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

/// The context of a read point's ReadIndex round: the ask it answers, and
/// a sequence number that keeps contexts unique.
pub(super) fn encode_point_ctx(ask: u64, seq: u64) -> Bytes {
    Bytes::from(format!("point a{ask} #{seq}"))
}

/// The ask a read point round's context answers.
pub(super) fn decode_point_ctx(ctx: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(ctx).ok()?;
    let mut it = s.strip_prefix("point ")?.split(' ');
    it.next()?.strip_prefix('a')?.parse().ok()
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
    /// The replicated store, rebuilt by replaying the log after a restart.
    pub store: Store,
    /// `(term, start)` of the newest lease round that came back; `start` in
    /// the member's clock (mticks).
    pub lease: Option<(u64, u64)>,
    /// `(term, mticks)` at which a leader transfer of this shard was last
    /// seen in progress here.
    pub transfer_seen: Option<(u64, u64)>,
    /// The term in which this shard was last seen led here with its no-op
    /// applied (the keyspace's `Slot::Ready`); `None` once not.
    pub ready_term: Option<u64>,
    /// The txn over several shards holding this shard (`cross/shard.rs`).
    pub holder: Option<Holder>,
    /// Txns waiting to hold it, first come first served.
    pub hold_waiting: VecDeque<u64>,
    /// Read point asks that arrived while held: asked again once the hold
    /// ends.
    pub points_waiting: Vec<u64>,
    /// The largest revision this leader gave an entry of the shard, and the
    /// tick it did: closes only move past it.
    pub closed_revision: u64,
    pub proposed_at_tick: u64,
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
            store: Store::default(),
            lease: None,
            transfer_seen: None,
            ready_term: None,
            holder: None,
            hold_waiting: VecDeque::new(),
            points_waiting: Vec::new(),
            closed_revision: 0,
            proposed_at_tick: 0,
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

    /// Whether the lease of this shard holds at `now` (mticks of this
    /// member's clock).
    pub fn lease_holds(&self, now: u64) -> bool {
        let Some(n) = self.node.as_ref() else {
            return false;
        };
        n.role() == StateRole::Leader
            && n.lead_transferee() == 0
            && self.lease.is_some_and(|(term, start)| {
                term == n.term()
                    && now < start + (ELECTION_TIMEOUT_TICKS - LEASE_MARGIN_TICKS) * MTICKS_PER_TICK
            })
    }

    /// The term this shard is ready in: led here, its no-op applied.
    pub fn ready_now(&self) -> Option<u64> {
        self.leads_with_noop_applied()
            .then(|| self.node.as_ref().map(|n| n.term()))
            .flatten()
    }

    /// Notes a revision this leader gave an entry of the shard at `tick`.
    pub fn proposed_revision(&mut self, revision: u64, tick: u64) {
        if revision > 0 {
            self.closed_revision = self.closed_revision.max(revision);
            self.proposed_at_tick = tick;
        }
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
        if self.transfer_seen.is_some_and(|(t, at)| {
            t == term && start <= at + TRANSFER_TAINT_TICKS * MTICKS_PER_TICK
        }) {
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
    /// Leads every shard, but the counter has not opened (the earlier
    /// leaders' txns are being finished).
    NotOpen,
    /// A txn over several shards holds the write's shard.
    Held,
}

/// A txn holding a shard: every entry proposed before the hold is at or
/// below `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holder {
    pub run: u64,
    pub index: u64,
}

pub(super) struct KsMember {
    pub id: u64,
    pub shards: Vec<Shard>,
    /// The revision counter, in memory only: the last revision handed out.
    pub counter: u64,
    /// Whether the counter is open: every shard ready, and the earlier
    /// leaders' txns finished for this readiness (`cross/opening.rs`).
    pub open: bool,
    /// The opening in progress, waiting for the finishing.
    pub opening: Option<Opening>,
    /// Bumped each time every shard becomes ready here.
    pub ready_gen: u64,
    /// Bumped each time the counter opens here
    /// (`RevisionCounter::times_opened`).
    pub opened: u64,
    /// The monotonic clock, in mticks; runs across crashes (the machine's).
    pub clock_mticks: u64,
    /// How far the clock moves per tick of the simulation.
    pub rate_mticks_per_tick: u64,
    /// Global tick at which this incarnation started, and its clock then.
    pub started_at_tick: u64,
    pub started_at_mticks: u64,
    pub restart_at_tick: Option<u64>,
    /// While set, the member is paused until this tick.
    pub paused_until: Option<u64>,
    /// Raft ticks the member missed while paused, delivered in a bunch when
    /// it resumes.
    pub missed_ticks: u64,
    /// Messages that reached the member while it was paused: `(shard,
    /// message)`.
    pub held: Vec<(usize, Message)>,
    /// Writes this incarnation proposed, by id, awaiting their apply here.
    pub proposed: HashMap<u64, usize>,
    pub incarnation: u64,
    pub lease_seq: u64,
    /// Requests this incarnation proposed (parts, dones): the last number
    /// used, and the answers of those applied here, by number: each part's
    /// gets (one part, or a batch's in the entry's order; none for a done).
    pub req_seq: u64,
    pub answers: BTreeMap<u64, Vec<Vec<GetResult>>>,
    /// A watch over every shard, from revision 0, for this incarnation.
    pub watcher: Watcher,
}

impl KsMember {
    pub fn new(id: u64, disks: Vec<MemStorage>, rate_mticks_per_tick: u64, clock0: u64) -> Self {
        assert!(rate_mticks_per_tick.abs_diff(MTICKS_PER_TICK) <= MAX_CLOCK_SKEW_MTICKS);
        let shards = disks.len();
        KsMember {
            id,
            shards: disks.into_iter().map(Shard::new).collect(),
            counter: 0,
            open: false,
            opening: None,
            ready_gen: 0,
            opened: 0,
            clock_mticks: clock0,
            rate_mticks_per_tick,
            started_at_tick: 0,
            started_at_mticks: clock0,
            restart_at_tick: None,
            paused_until: None,
            missed_ticks: 0,
            held: Vec::new(),
            proposed: HashMap::new(),
            incarnation: 0,
            lease_seq: 0,
            req_seq: 0,
            answers: BTreeMap::new(),
            watcher: Watcher::new(shards),
        }
    }

    /// Moves the clock by one tick of the simulation; answers how many
    /// whole ticks of its own it passed (0, 1 or 2): its Raft ticks.
    pub fn advance_clock(&mut self) -> u64 {
        let before = self.clock_mticks / MTICKS_PER_TICK;
        self.clock_mticks += self.rate_mticks_per_tick;
        self.clock_mticks / MTICKS_PER_TICK - before
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

    /// Whether this member believes it may hand out a revision now under
    /// `guard`: it leads every shard, has applied each no-op, and holds the
    /// leases. The counter must also be open ([`KsMember::assigns`]).
    pub fn may_assign(&self, guard: Guard) -> Result<(), Refusal> {
        if !self.is_running() {
            return Err(Refusal::Down);
        }
        if !self.shards.iter().all(Shard::is_leader) {
            return Err(Refusal::NotLeaderOfEveryShard);
        }
        if !self.shards.iter().all(Shard::leads_with_noop_applied) {
            return Err(Refusal::NoopNotApplied);
        }
        if guard.uses_lease() && !self.shards.iter().all(|s| s.lease_holds(self.clock_mticks)) {
            return Err(Refusal::NoLease);
        }
        Ok(())
    }

    /// `RevisionCounter::is_open`: may assign, and the counter opened.
    pub fn assigns(&self, guard: Guard) -> Result<(), Refusal> {
        self.may_assign(guard)?;
        if !self.open {
            return Err(Refusal::NotOpen);
        }
        Ok(())
    }

    /// Takes the next revision from the open counter.
    pub fn next_revision(&mut self) -> u64 {
        assert!(self.open, "n{}: a revision from a closed counter", self.id);
        self.counter += 1;
        self.counter
    }

    /// The next request number of this incarnation.
    pub fn next_req(&mut self) -> u64 {
        self.req_seq += 1;
        self.req_seq
    }

    /// Forgets everything kept in memory, as a crash does.
    pub fn forget_memory(&mut self) {
        self.counter = 0;
        self.open = false;
        self.opening = None;
        self.paused_until = None;
        self.missed_ticks = 0;
        self.held.clear();
        self.proposed.clear();
        self.req_seq = 0;
        self.answers.clear();
        self.watcher = Watcher::new(self.shards.len());
        for s in &mut self.shards {
            s.pending = None;
            s.lease = None;
            s.transfer_seen = None;
            s.ready_term = None;
            s.holder = None;
            s.hold_waiting.clear();
            s.points_waiting.clear();
            s.closed_revision = 0;
            s.proposed_at_tick = 0;
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
    fn contexts_round_trip() {
        assert_eq!(
            decode_lease_ctx(&encode_lease_ctx(2, 9, 130, 5)),
            Some((2, 9, 130))
        );
        assert_eq!(decode_lease_ctx(b"r12"), None);
        assert_eq!(decode_point_ctx(&encode_point_ctx(7, 3)), Some(7));
        assert_eq!(decode_point_ctx(&encode_lease_ctx(2, 9, 130, 5)), None);
    }
}

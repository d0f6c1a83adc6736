//! The revision counter: one revision order over a member's shards, the
//! keyspace leader's counter. Below the shard drivers, which take each
//! write's revision from it and tell it where their leadership stands; the
//! keyspace layer above (`keyspace/`) reads it for read points and runs the
//! txns over several shards with it. Beside it, what each shard has applied
//! up to ([`reached`]) and the wake-up of shards waiting for the counter to
//! move ([`counter_moved`]).
//!
//! With several shards, every shard of the cluster is led by one member, the
//! keyspace leader: whoever leads shard 0 (docs/KEYSPACE.md). Its shards take
//! each write's revision from one counter shared by its cores, when the write
//! is proposed, and the entry carries it; every member applies the entry at
//! that revision.
//!
//! The counter opens only once this member leads every shard and each shard
//! has applied everything of earlier terms (its current term's first entry).
//! Revisions are numbered by **epoch**: the term in which this member leads
//! shard 0, a number no other keyspace leader ever had. Epoch `e` hands out
//! revisions above `e << EPOCH_SHIFT` (and above the largest revision any
//! shard has applied), so every revision of a later keyspace leader is above
//! every revision of an earlier one, including revisions an earlier leader
//! handed out that no log kept (an entry lost with its leadership, or a read
//! point): a read at such a point stays a consistent cut. Losing any shard's
//! leadership closes the counter; writes then wait, as they wait for an
//! election, until it opens again here or elsewhere.
//!
//! **Leases.** A member's view that it leads every shard may be stale (a
//! partial partition: docs/KEYSPACE.md, "Leader leases"), so the counter
//! also needs a lease on every shard: a shard's leader holds one until one
//! election timeout (less one tick and a drift margin) after the start of
//! the last ReadIndex round a quorum confirmed, during which no other member
//! can be elected for the shard (followers that heard from the leader ignore
//! candidates; one that restarted ignores them for one election timeout,
//! `raft::Config::vote_hold_after_start`). A lapsed lease on any shard
//! stops revisions until the next round confirms it; the leader runs one
//! round per tick. It assumes the members' monotonic clocks run at rates
//! within the drift margin of each other; wall-clock jumps change nothing.
//! The driver simulation's stale-view episodes (`src/sim/driver/stale_view.rs`,
//! `tests/driver_sim.rs`) check the scheme on the real shard drivers, and
//! catch a counter without the leases and a restarted member that votes at
//! once.
//!
//! One [`RevisionCounter`] per member, shared by its cores. The request path reads a
//! few atomics and the monotonic clock; the mutex is taken only when a
//! shard's leadership changes.

pub mod counter_moved;
pub mod reached;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::time::Instant;

/// Revisions of epoch `e` lie in `(e << EPOCH_SHIFT, (e + 1) << EPOCH_SHIFT)`:
/// about 10^12 writes per keyspace leadership (four months at 100,000 a
/// second), and shard 0 terms up to 2^23 before an int64 runs out.
pub const EPOCH_SHIFT: u32 = 40;

/// The largest epoch (shard 0 term) whose revisions fit an int64.
pub const MAX_EPOCH: u64 = (i64::MAX >> EPOCH_SHIFT) as u64 - 1;

/// The first revision of `epoch` is above this (the last of epoch `e` is
/// `epoch_start(e + 1) - 1`, which fits an int64 up to [`MAX_EPOCH`]).
pub fn epoch_start(epoch: u64) -> i64 {
    (epoch.min(MAX_EPOCH + 1) as i64) << EPOCH_SHIFT
}

/// Where each shard's leadership on this member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not led here, or led but earlier terms' entries not yet applied.
    NotReady,
    /// Led here in `term`, with every entry of earlier terms applied; the
    /// shard had applied up to `revision` then.
    Ready { term: u64, revision: i64 },
}

/// The counter's opening, decided once every shard is ready here and
/// waiting for the txns over several shards that an earlier leader left
/// half-proposed to be finished (`keyspace::cross_txn::finish_earlier`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Opening {
    /// Which readiness of every shard this is: a shard losing its own
    /// since makes it stale.
    generation: u64,
    epoch: u64,
    base: i64,
}

#[derive(Debug)]
struct Slots {
    slots: Vec<Slot>,
    generation: u64,
    opening: Option<Opening>,
}

/// A rule of the revision order to switch off, so that tests can show the
/// driver simulation catches what follows. Only a build with the
/// `raft-mutations` feature (test builds) can set one on a counter.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyspaceMutation {
    /// The counter opens once this member leads every shard, before each has
    /// applied the entries of earlier terms, and starts above what they
    /// applied rather than above its epoch (breaks point 3 of
    /// docs/KEYSPACE.md, "Why revisions increase in real time").
    OpenBeforeApplied,
    /// An opening counter does not finish the txns over several shards an
    /// earlier keyspace leader left half-proposed (breaks their atomicity:
    /// docs/KEYSPACE.md, "Transactions over several shards").
    NoFinishing,
    /// The counter assigns revisions without the leases of its shards
    /// (breaks "Leader leases: closing the stale view" of docs/KEYSPACE.md).
    NoLeases,
    /// A restarted member votes at once instead of holding its vote for an
    /// election timeout, so it can help elect a leader while a lease it
    /// backed still runs (the same section's restart rule).
    NoRestartVoteHold,
    /// A txn over several shards joins a batch whose txns name its keys
    /// (breaks the batches' rule in `keyspace::txn_batch`: the compares of
    /// a batch are read together, so a txn must not depend on another's
    /// writes in it).
    JoinIgnoresOverlap,
    /// A watch over several shards sends each shard's events as they arrive
    /// instead of merging them (`keyspace::watch_shards`): an event goes out
    /// before the other shards have sent through its revision (breaks the
    /// one revision order of docs/KEYSPACE.md, "Watches").
    WatchNoMerge,
    /// A watch from now over several shards starts each shard's part of
    /// its merge past the revision that shard answered, not past the
    /// created response's header revision (the highest they answered): a
    /// shard that was behind the others sends events at or below the
    /// header, which a watch from now must never be sent (the bug fixed in
    /// `keyspace::watch_shards`, docs/KEYSPACE.md, "Watches").
    WatchFromNowEarly,
}

/// The keyspace leader's revision counter: what it opens on (each shard's
/// readiness and lease), shard 0's leader, the leases shard 0's leader found
/// expired, and what each shard reached.
#[derive(Debug)]
pub struct RevisionCounter {
    slots: Mutex<Slots>,
    /// Woken when an opening waits for its finishing.
    opening_wanted: tokio::sync::Notify,
    /// Whether this member assigns revisions now.
    open: AtomicBool,
    /// The last revision handed out (or the base it starts above).
    counter: AtomicI64,
    /// The last revision the open epoch may hand out.
    epoch_end: AtomicI64,
    /// Shard 0's leader as this member knows it ([`raft::NONE`] if none):
    /// the member every other shard's leadership moves to.
    ///
    /// [`raft::NONE`]: crate::raft::NONE
    shard0_leader: AtomicU64,
    /// Times the counter opened on this member, for logs and tests.
    opened: AtomicU64,
    /// Each shard's lease: until when (nanoseconds after `clock_base`) no
    /// other member can lead it; 0 for none.
    leases: Vec<AtomicU64>,
    clock_base: Instant,
    /// Leases shard 0's leader found expired, to revoke on every shard.
    expired_leases: Mutex<Vec<i64>>,
    expired_wanted: tokio::sync::Notify,
    /// What each shard of this member has applied up to.
    pub reached: reached::Reached,
    /// Wakes the shards waiting for the counter to move.
    pub counter_moved: counter_moved::CounterMoved,
    /// A rule switched off (see [`KeyspaceMutation`]).
    #[cfg(feature = "raft-mutations")]
    pub mutation: Option<KeyspaceMutation>,
}

impl RevisionCounter {
    pub fn new(shards: usize) -> Self {
        RevisionCounter {
            slots: Mutex::new(Slots {
                slots: vec![Slot::NotReady; shards],
                generation: 0,
                opening: None,
            }),
            opening_wanted: tokio::sync::Notify::new(),
            open: AtomicBool::new(false),
            counter: AtomicI64::new(0),
            epoch_end: AtomicI64::new(0),
            shard0_leader: AtomicU64::new(crate::raft::NONE),
            opened: AtomicU64::new(0),
            leases: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            clock_base: Instant::now(),
            expired_leases: Mutex::new(Vec::new()),
            expired_wanted: tokio::sync::Notify::new(),
            reached: reached::Reached::new(shards),
            counter_moved: counter_moved::CounterMoved::new(shards),
            #[cfg(feature = "raft-mutations")]
            mutation: None,
        }
    }

    /// Whether `m` is switched off on this counter (never, in a build
    /// without the `raft-mutations` feature).
    pub fn mutated(&self, m: KeyspaceMutation) -> bool {
        #[cfg(feature = "raft-mutations")]
        return self.mutation == Some(m);
        #[cfg(not(feature = "raft-mutations"))]
        {
            let _ = m;
            false
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.clock_base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// `shard`'s leader holds its lease until `until`.
    pub fn set_lease(&self, shard: u32, until: Instant) {
        if let Some(l) = self.leases.get(shard as usize) {
            l.store(self.nanos(until).max(1), Ordering::Release);
        }
    }

    /// `shard`'s lease is gone (leadership lost or being handed over).
    pub fn drop_lease(&self, shard: u32) {
        if let Some(l) = self.leases.get(shard as usize) {
            l.store(0, Ordering::Release);
        }
    }

    /// Whether every shard's lease runs past now.
    fn leases_held(&self) -> bool {
        if self.mutated(KeyspaceMutation::NoLeases) {
            return true;
        }
        let now = self.nanos(Instant::now());
        self.leases.iter().all(|l| l.load(Ordering::Acquire) > now)
    }

    /// The next revision for a write proposed now, or None while this member
    /// does not assign revisions (the write waits).
    pub fn next_revision(&self) -> Option<i64> {
        if !self.is_open() {
            return None;
        }
        // Sequentially consistent, as `counter_moved`'s flag (see there).
        let revision = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
        self.counter_moved.moved();
        if revision > self.epoch_end.load(Ordering::Acquire) {
            // The epoch's revisions are used up: writes wait until shard 0
            // changes leader (a new epoch).
            tracing::error!(
                revision,
                "every revision of this keyspace leadership is used; move shard 0's leadership"
            );
            self.open.store(false, Ordering::Release);
            return None;
        }
        Some(revision)
    }

    /// The last revision handed out, while this member assigns revisions:
    /// every write acknowledged so far has a revision at or below it, and
    /// every write proposed later (here or by a later leader) one above it.
    pub fn current(&self) -> Option<i64> {
        if !self.is_open() {
            return None;
        }
        let end = self.epoch_end.load(Ordering::Acquire);
        Some(self.counter.load(Ordering::Acquire).min(end))
    }

    /// Whether this member assigns revisions now: it leads every shard,
    /// has applied what earlier leaders wrote, and holds every shard's lease.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire) && self.leases_held()
    }

    /// `shard` is led here in `term` and has applied every entry of earlier
    /// terms, up to `revision`. Once every shard is, the counter opens after
    /// the txns over several shards an earlier leader left half-proposed are
    /// finished ([`RevisionCounter::opening_wanted`],
    /// [`RevisionCounter::finished`]).
    pub fn shard_ready(&self, shard: u32, term: u64, revision: i64) {
        let mut st = self.slots.lock().expect("keyspace slots");
        let Some(slot) = st.slots.get_mut(shard as usize) else {
            return;
        };
        *slot = Slot::Ready { term, revision };
        let mut base = 0;
        for s in st.slots.iter() {
            match s {
                Slot::Ready { revision, .. } => base = base.max(*revision),
                Slot::NotReady => return,
            }
        }
        let Slot::Ready { term: epoch, .. } = st.slots[0] else {
            return;
        };
        if epoch > MAX_EPOCH {
            tracing::error!(epoch, "shard 0's term is past the last revision epoch");
            return;
        }
        st.generation += 1;
        st.opening = Some(Opening {
            generation: st.generation,
            epoch,
            base,
        });
        self.opening_wanted.notify_one();
    }

    /// Waits until every shard is ready here and the counter waits to open;
    /// answers that opening's generation, for
    /// [`RevisionCounter::finished`].
    pub async fn opening_wanted(&self) -> u64 {
        loop {
            if let Some(o) = self.slots.lock().expect("keyspace slots").opening {
                return o.generation;
            }
            self.opening_wanted.notified().await;
        }
    }

    /// The earlier leaders' txns are finished for opening `generation`:
    /// opens the counter, unless a shard stopped being ready since (false).
    pub fn finished(&self, generation: u64) -> bool {
        let mut st = self.slots.lock().expect("keyspace slots");
        let Some(o) = st.opening.filter(|o| o.generation == generation) else {
            return false;
        };
        st.opening = None;
        // Above every revision of an earlier epoch, and never below what
        // this member handed out before in this epoch.
        let base = if self.mutated(KeyspaceMutation::OpenBeforeApplied) {
            o.base
        } else {
            o.base.max(epoch_start(o.epoch))
        };
        // Sequentially consistent, as `next_revision`'s increment.
        let previous = self.counter.fetch_max(base, Ordering::SeqCst);
        self.epoch_end
            .store(epoch_start(o.epoch + 1) - 1, Ordering::Release);
        self.open.store(true, Ordering::Release);
        self.counter_moved.moved();
        let times = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(
            revision = base.max(previous),
            epoch = o.epoch,
            times,
            "keyspace leader: this member assigns revisions to every shard's writes"
        );
        true
    }

    /// `shard` is no longer led here (or lost its readiness): closes the
    /// counter until every shard is ready again.
    pub fn shard_not_ready(&self, shard: u32) {
        let mut st = self.slots.lock().expect("keyspace slots");
        let Some(slot) = st.slots.get_mut(shard as usize) else {
            return;
        };
        if *slot == Slot::NotReady {
            return;
        }
        *slot = Slot::NotReady;
        st.opening = None;
        if self.open.swap(false, Ordering::AcqRel) {
            tracing::info!(shard, "keyspace leadership lost: writes wait for a leader");
        }
    }

    /// Shard 0's leader found lease `id` expired: it is to be revoked on
    /// every shard at one revision.
    pub fn lease_expired(&self, id: i64) {
        let mut expired = self.expired_leases.lock().expect("expired leases");
        if !expired.contains(&id) {
            expired.push(id);
        }
        self.expired_wanted.notify_one();
    }

    /// Waits for leases found expired, and takes them.
    pub async fn take_expired_leases(&self) -> Vec<i64> {
        loop {
            let taken = std::mem::take(&mut *self.expired_leases.lock().expect("expired leases"));
            if !taken.is_empty() {
                return taken;
            }
            self.expired_wanted.notified().await;
        }
    }

    /// Records shard 0's leader as this member sees it.
    pub fn set_shard0_leader(&self, leader: u64) {
        self.shard0_leader.store(leader, Ordering::Relaxed);
    }

    /// The member every shard's leadership should be on.
    pub fn shard0_leader(&self) -> u64 {
        self.shard0_leader.load(Ordering::Relaxed)
    }

    /// How many times the counter opened on this member.
    pub fn times_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Whether `shard` is led here with every entry of earlier terms
    /// applied (what the counter opens on).
    pub fn is_shard_ready(&self, shard: u32) -> bool {
        let st = self.slots.lock().expect("keyspace slots");
        matches!(st.slots.get(shard as usize), Some(Slot::Ready { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A keyspace of `shards` whose leases run for an hour.
    fn leased(shards: usize) -> RevisionCounter {
        let k = RevisionCounter::new(shards);
        for s in 0..shards as u32 {
            k.set_lease(s, Instant::now() + Duration::from_secs(3600));
        }
        k
    }

    /// `shard` is ready; when that makes every shard ready, the earlier
    /// leaders' txns are finished at once (none here).
    fn ready(k: &RevisionCounter, shard: u32, term: u64, revision: i64) {
        k.shard_ready(shard, term, revision);
        let pending = k.slots.lock().unwrap().opening;
        if let Some(o) = pending {
            assert!(k.finished(o.generation));
        }
    }

    #[test]
    fn opens_only_once_earlier_txns_are_finished_for_the_same_readiness() {
        let k = leased(2);
        k.shard_ready(0, 1, 0);
        k.shard_ready(1, 1, 0);
        assert_eq!(k.next_revision(), None, "waits for the finishing");
        let generation = futures::executor::block_on(k.opening_wanted());
        k.shard_not_ready(1);
        k.shard_ready(1, 2, 0);
        assert!(!k.finished(generation), "shard 1 was ready again since");
        assert_eq!(k.next_revision(), None);
        let generation = futures::executor::block_on(k.opening_wanted());
        assert!(k.finished(generation));
        assert!(k.next_revision().is_some());
        assert!(!k.finished(generation), "once");
    }

    #[test]
    fn no_revision_without_a_lease_on_every_shard() {
        let k = leased(2);
        ready(&k, 0, 1, 0);
        ready(&k, 1, 1, 0);
        assert!(k.next_revision().is_some());
        k.drop_lease(1);
        assert_eq!(k.next_revision(), None);
        assert_eq!(k.current(), None);
        k.set_lease(1, Instant::now() - Duration::from_millis(1));
        assert_eq!(k.next_revision(), None, "a lapsed lease");
        k.set_lease(1, Instant::now() + Duration::from_secs(1));
        assert!(k.next_revision().is_some());
    }

    #[test]
    fn opens_only_when_every_shard_is_ready_and_starts_above_its_epoch_and_every_revision() {
        let k = leased(3);
        assert_eq!(k.next_revision(), None);
        ready(&k, 0, 2, 10);
        ready(&k, 2, 2, 40);
        assert_eq!(k.next_revision(), None, "shard 1 is not ready");
        assert_eq!(k.current(), None);
        ready(&k, 1, 3, 25);
        assert_eq!(k.next_revision(), Some(epoch_start(2) + 1));
        assert_eq!(k.next_revision(), Some(epoch_start(2) + 2));
        assert_eq!(k.current(), Some(epoch_start(2) + 2));
    }

    #[test]
    fn a_later_epoch_is_above_every_revision_of_an_earlier_one() {
        let k = leased(2);
        ready(&k, 0, 1, 5);
        ready(&k, 1, 1, 7);
        let first = k.next_revision().unwrap();
        let point = k.current().unwrap();
        assert_eq!(first, point);
        k.shard_not_ready(1);
        assert_eq!(k.next_revision(), None);
        // Ready again in the same epoch with logs that never got `first`
        // (the entry was lost): the counter still goes on above it.
        ready(&k, 1, 2, 7);
        assert_eq!(k.next_revision(), Some(first + 1));
        assert_eq!(k.times_opened(), 2);
        // Shard 0 changed leader and came back: a new epoch, above any
        // revision or read point of the old one.
        k.shard_not_ready(0);
        ready(&k, 0, 4, 7);
        let next = k.next_revision().unwrap();
        assert_eq!(next, epoch_start(4) + 1);
        assert!(next > point + 1);
    }

    #[test]
    fn a_used_up_epoch_hands_out_nothing_until_a_new_one() {
        let k = leased(1);
        ready(&k, 0, 1, epoch_start(2) - 2);
        assert_eq!(k.next_revision(), Some(epoch_start(2) - 1));
        assert_eq!(k.next_revision(), None);
        assert_eq!(k.current(), None, "closed until shard 0 changes leader");
        k.shard_not_ready(0);
        ready(&k, 0, 2, epoch_start(2) - 1);
        assert_eq!(k.next_revision(), Some(epoch_start(2) + 1));
    }

    #[test]
    fn shards_not_on_this_member_are_ignored_and_huge_terms_never_open() {
        let k = leased(1);
        ready(&k, 5, 1, 1);
        k.shard_not_ready(5);
        assert_eq!(k.next_revision(), None);
        ready(&k, 0, MAX_EPOCH + 1, 3);
        assert_eq!(k.next_revision(), None);
        ready(&k, 0, MAX_EPOCH, 3);
        assert_eq!(k.next_revision(), Some(epoch_start(MAX_EPOCH) + 1));
    }
}

//! One revision order over a member's shards: the keyspace leader's counter.
//!
//! With several shards, every shard of the cluster is led by one member, the
//! keyspace leader: whoever leads shard 0 (docs/KEYSPACE.md). Its shards take
//! each write's revision from one counter shared by its cores, when the write
//! is proposed, and the entry carries it; every member applies the entry at
//! that revision.
//!
//! The counter opens only once this member leads every shard and each shard
//! has applied everything of earlier terms (its current term's first entry);
//! it then starts above the largest revision any shard has applied, so a
//! write proposed now gets a revision above every write committed under an
//! earlier leader. Losing any shard's leadership closes it; writes then wait,
//! as they wait for an election, until it opens again here or elsewhere.
//!
//! One `Keyspace` per member, shared by its cores. The request path reads two
//! atomics; the mutex is taken only when a shard's leadership changes.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Where each shard's leadership on this member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not led here, or led but earlier terms' entries not yet applied.
    NotReady,
    /// Led here in `term`, with every entry of earlier terms applied; the
    /// shard had applied up to `revision` then.
    Ready { term: u64, revision: i64 },
}

pub struct Keyspace {
    slots: Mutex<Vec<Slot>>,
    /// Whether this member assigns revisions now.
    open: AtomicBool,
    /// The last revision handed out (or the base it starts above).
    counter: AtomicI64,
    /// Shard 0's leader as this member knows it ([`raft::NONE`] if none):
    /// the member every other shard's leadership moves to.
    ///
    /// [`raft::NONE`]: crate::raft::NONE
    shard0_leader: AtomicU64,
    /// Times the counter opened on this member, for logs and tests.
    opened: AtomicU64,
}

impl Keyspace {
    pub fn new(shards: usize) -> Self {
        Keyspace {
            slots: Mutex::new(vec![Slot::NotReady; shards]),
            open: AtomicBool::new(false),
            counter: AtomicI64::new(0),
            shard0_leader: AtomicU64::new(crate::raft::NONE),
            opened: AtomicU64::new(0),
        }
    }

    /// The next revision for a write proposed now, or None while this member
    /// does not assign revisions (the write waits).
    pub fn next_revision(&self) -> Option<i64> {
        if !self.open.load(Ordering::Acquire) {
            return None;
        }
        Some(self.counter.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// Whether this member assigns revisions now.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// `shard` is led here in `term` and has applied every entry of earlier
    /// terms, up to `revision`. Opens the counter once every shard is.
    pub fn shard_ready(&self, shard: u32, term: u64, revision: i64) {
        let mut slots = self.slots.lock().expect("keyspace slots");
        let Some(slot) = slots.get_mut(shard as usize) else {
            return;
        };
        *slot = Slot::Ready { term, revision };
        let mut base = 0;
        for s in slots.iter() {
            match s {
                Slot::Ready { revision, .. } => base = base.max(*revision),
                Slot::NotReady => return,
            }
        }
        // Never below what this member handed out before: a revision is
        // used at most once even if an entry carrying it was lost.
        let previous = self.counter.fetch_max(base, Ordering::AcqRel);
        self.open.store(true, Ordering::Release);
        let times = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(
            revision = base.max(previous),
            times,
            "keyspace leader: this member assigns revisions to every shard's writes"
        );
    }

    /// `shard` is no longer led here (or lost its readiness): closes the
    /// counter until every shard is ready again.
    pub fn shard_not_ready(&self, shard: u32) {
        let mut slots = self.slots.lock().expect("keyspace slots");
        let Some(slot) = slots.get_mut(shard as usize) else {
            return;
        };
        if *slot == Slot::NotReady {
            return;
        }
        *slot = Slot::NotReady;
        if self.open.swap(false, Ordering::AcqRel) {
            tracing::info!(shard, "keyspace leadership lost: writes wait for a leader");
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_only_when_every_shard_is_ready_and_starts_above_every_revision() {
        let k = Keyspace::new(3);
        assert_eq!(k.next_revision(), None);
        k.shard_ready(0, 2, 10);
        k.shard_ready(2, 2, 40);
        assert_eq!(k.next_revision(), None, "shard 1 is not ready");
        k.shard_ready(1, 3, 25);
        assert_eq!(k.next_revision(), Some(41));
        assert_eq!(k.next_revision(), Some(42));
    }

    #[test]
    fn closes_when_any_shard_is_lost_and_never_hands_out_a_revision_twice() {
        let k = Keyspace::new(2);
        k.shard_ready(0, 1, 5);
        k.shard_ready(1, 1, 7);
        assert_eq!(k.next_revision(), Some(8));
        assert_eq!(k.next_revision(), Some(9));
        k.shard_not_ready(1);
        assert_eq!(k.next_revision(), None);
        // Ready again with logs that never got 8 and 9 (those entries were
        // lost): the counter still starts above what it handed out.
        k.shard_ready(1, 2, 7);
        assert_eq!(k.next_revision(), Some(10));
        assert_eq!(k.times_opened(), 2);
        // Ready again with a log that went further under another leader.
        k.shard_not_ready(0);
        k.shard_ready(0, 3, 100);
        assert_eq!(k.next_revision(), Some(101));
    }

    #[test]
    fn shards_not_on_this_member_are_ignored() {
        let k = Keyspace::new(1);
        k.shard_ready(5, 1, 1);
        k.shard_not_ready(5);
        assert_eq!(k.next_revision(), None);
        k.shard_ready(0, 1, 3);
        assert_eq!(k.next_revision(), Some(4));
    }
}

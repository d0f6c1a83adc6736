//! The keyspace invariants, kept in registries that outlive any member's
//! crash: who led each shard's terms, what was applied at each
//! `(shard, index)`, which write took each revision, and for each write the
//! newest acknowledged revision when it was invoked.

use std::collections::HashMap;
use std::fmt;

/// Which property a keyspace run broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KsViolationKind {
    /// Two leaders in one term of one shard (Raft paper 5.2).
    ElectionSafety,
    /// Two members applied different entries, or one write at different
    /// revisions, at one `(shard, index)` (5.4.3).
    StateMachineSafety,
    /// Along a shard's applied log, a revision did not exceed the one
    /// before it.
    RevisionOrder,
    /// One revision applied for two different writes.
    DuplicateRevision,
    /// A write invoked after another was acknowledged got a revision no
    /// larger than it.
    RealTimeOrder,
    /// A shard took no acknowledged write within the bound after the
    /// faults stopped.
    Liveness,
    /// The Raft core panicked.
    CorePanic,
}

impl KsViolationKind {
    /// Whether this is a property of the revision order, the ones the guard
    /// is there to keep.
    pub fn is_revision_order(self) -> bool {
        matches!(
            self,
            KsViolationKind::RevisionOrder
                | KsViolationKind::DuplicateRevision
                | KsViolationKind::RealTimeOrder
        )
    }
}

/// The first broken property of a run, where it broke and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KsViolation {
    pub kind: KsViolationKind,
    pub tick: u64,
    pub step: u64,
    pub detail: String,
}

impl fmt::Display for KsViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} at tick {} step {}: {}",
            self.kind, self.tick, self.step, self.detail
        )
    }
}

/// A violation before the step and tick are attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    pub kind: KsViolationKind,
    pub detail: String,
}

pub(super) type Check = Result<(), Found>;

pub(super) fn found(kind: KsViolationKind, detail: String) -> Found {
    Found { kind, detail }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AppliedEntry {
    term: u64,
    digest: u64,
    write: Option<(u64, u64)>,
    first_member: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WriteRecord {
    shard: usize,
    invoked_tick: u64,
    invoked_step: u64,
    /// The largest `(revision, write)` acknowledged before this write was
    /// invoked, with the step of that acknowledgement.
    bound: Option<(u64, u64, u64)>,
    rev: Option<u64>,
    acked_step: Option<u64>,
}

/// What one member has applied of one shard in its current incarnation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct AppliedCursor {
    pub index: u64,
    /// The last revision applied, at `rev_index`.
    pub rev: u64,
    pub rev_index: u64,
}

#[derive(Debug, Default)]
pub(super) struct KsChecker {
    leaders: HashMap<(usize, u64), u64>,
    applied: HashMap<(usize, u64), AppliedEntry>,
    rev_owner: HashMap<u64, (u64, usize, u64)>,
    writes: HashMap<u64, WriteRecord>,
    /// The largest `(revision, write, ack step)` acknowledged so far.
    max_acked: Option<(u64, u64, u64)>,
}

impl KsChecker {
    /// Election safety: `id` leads `term` of `shard`; returns whether this
    /// is news.
    pub fn observe_leader(&mut self, shard: usize, term: u64, id: u64) -> Result<bool, Found> {
        match self.leaders.get(&(shard, term)) {
            Some(&other) if other != id => Err(found(
                KsViolationKind::ElectionSafety,
                format!("members {other} and {id} both lead term {term} of shard {shard}"),
            )),
            Some(_) => Ok(false),
            None => {
                self.leaders.insert((shard, term), id);
                Ok(true)
            }
        }
    }

    /// A client invoked write `id` on `shard`: it must end up ordered after
    /// every write acknowledged so far.
    pub fn invoked(&mut self, id: u64, shard: usize, tick: u64, step: u64) {
        let rec = WriteRecord {
            shard,
            invoked_tick: tick,
            invoked_step: step,
            bound: self.max_acked,
            rev: None,
            acked_step: None,
        };
        let old = self.writes.insert(id, rec);
        assert!(old.is_none(), "write {id} invoked twice");
    }

    /// `member` applied the entry `(shard, index)`; `write` is the write id
    /// and revision it carries, if it is a write. Returns whether this is
    /// the first apply of that write anywhere.
    #[allow(clippy::too_many_arguments)]
    pub fn applied(
        &mut self,
        member: u64,
        shard: usize,
        index: u64,
        term: u64,
        digest: u64,
        write: Option<(u64, u64)>,
        cursor: &mut AppliedCursor,
    ) -> Result<bool, Found> {
        if index != cursor.index + 1 {
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!(
                    "member {member} shard {shard} was handed index {index} to apply after {}",
                    cursor.index
                ),
            ));
        }
        cursor.index = index;
        let e = *self.applied.entry((shard, index)).or_insert(AppliedEntry {
            term,
            digest,
            write,
            first_member: member,
        });
        if e.term != term || e.digest != digest {
            let what = match (e.write, write) {
                (Some((w1, r1)), Some((w2, r2))) if w1 == w2 => {
                    format!("write w{w1} at revision {r1} and at revision {r2}")
                }
                _ => format!("term {} {:?} and term {term} {write:?}", e.term, e.write),
            };
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!(
                    "shard {shard} index {index}: members {} and {member} applied {what}",
                    e.first_member
                ),
            ));
        }
        let Some((w, rev)) = write else {
            return Ok(false);
        };
        if cursor.rev_index > 0 && rev <= cursor.rev {
            return Err(found(
                KsViolationKind::RevisionOrder,
                format!(
                    "member {member} shard {shard}: w{w} at index {index} has revision {rev}, not above revision {} at index {}",
                    cursor.rev, cursor.rev_index
                ),
            ));
        }
        cursor.rev = rev;
        cursor.rev_index = index;
        match self.rev_owner.get(&rev) {
            Some(&(other, s, i)) if other != w => {
                return Err(found(
                    KsViolationKind::DuplicateRevision,
                    format!(
                        "revision {rev} applied for w{other} (shard {s} index {i}) and for w{w} (shard {shard} index {index})"
                    ),
                ));
            }
            Some(_) => return Ok(false),
            None => {
                self.rev_owner.insert(rev, (w, shard, index));
            }
        }
        // The first time this write is applied anywhere.
        let Some(rec) = self.writes.get_mut(&w) else {
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!("shard {shard} index {index} applies w{w}, which no client invoked"),
            ));
        };
        rec.rev = Some(rev);
        let rec = *rec;
        if let Some((r1, w1, ack_step)) = rec.bound {
            if rev <= r1 {
                let w1_shard = self.writes.get(&w1).map_or(usize::MAX, |r| r.shard);
                return Err(found(
                    KsViolationKind::RealTimeOrder,
                    format!(
                        "w{w} (shard {shard}, invoked at tick {} step {}) was applied at revision {rev}, but w{w1} (shard {w1_shard}) was acknowledged at revision {r1} at step {ack_step}, before w{w} was invoked",
                        rec.invoked_tick, rec.invoked_step
                    ),
                ));
            }
        }
        Ok(true)
    }

    /// The proposer of write `id` applied it and answers its client.
    /// Returns whether this is the first acknowledgement.
    pub fn acked(&mut self, id: u64, step: u64) -> bool {
        let Some(rec) = self.writes.get_mut(&id) else {
            return false;
        };
        if rec.acked_step.is_some() {
            return false;
        }
        rec.acked_step = Some(step);
        let rev = rec.rev.expect("an acknowledged write was applied");
        if self.max_acked.is_none_or(|(r, _, _)| rev > r) {
            self.max_acked = Some((rev, id, step));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_write_below_an_acknowledged_one_is_caught() {
        let mut c = KsChecker::default();
        let mut cur0 = AppliedCursor::default();
        let mut cur1 = AppliedCursor::default();
        c.invoked(1, 0, 1, 1);
        c.applied(1, 0, 1, 1, 11, Some((1, 5)), &mut cur0).unwrap();
        assert!(c.acked(1, 2));
        c.invoked(2, 1, 2, 3);
        let f = c
            .applied(1, 1, 1, 1, 22, Some((2, 4)), &mut cur1)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::RealTimeOrder);
    }

    #[test]
    fn revisions_must_increase_along_a_shard() {
        let mut c = KsChecker::default();
        let mut cur = AppliedCursor::default();
        c.invoked(1, 0, 1, 1);
        c.invoked(2, 0, 1, 2);
        c.applied(1, 0, 1, 1, 11, Some((1, 5)), &mut cur).unwrap();
        c.applied(1, 0, 2, 1, 0, None, &mut cur).unwrap();
        let f = c
            .applied(1, 0, 3, 1, 22, Some((2, 5)), &mut cur)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::RevisionOrder);
    }

    #[test]
    fn one_revision_for_two_writes_is_caught() {
        let mut c = KsChecker::default();
        let mut cur0 = AppliedCursor::default();
        let mut cur1 = AppliedCursor::default();
        c.invoked(1, 0, 1, 1);
        c.invoked(2, 1, 1, 2);
        c.applied(1, 0, 1, 1, 11, Some((1, 5)), &mut cur0).unwrap();
        let f = c
            .applied(1, 1, 1, 1, 22, Some((2, 5)), &mut cur1)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::DuplicateRevision);
    }
}

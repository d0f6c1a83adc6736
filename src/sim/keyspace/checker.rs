//! The keyspace invariants, kept in registries that outlive any member's
//! crash: who led each shard's terms, what was applied at each
//! `(shard, index)`, which op took each revision, and for each op the
//! largest point of the revision order acknowledged when it was invoked.
//! The checks that need the whole run (atomicity, the sequential history,
//! watch completeness) are in `history.rs`.

use std::collections::HashMap;
use std::fmt;

use super::kv::{GetResult, Key, Op, Payload, TxnSpec};

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
    /// One revision applied for two different ops.
    DuplicateRevision,
    /// An op invoked after another was acknowledged is ordered before it:
    /// a smaller revision, or a read point below it.
    RealTimeOrder,
    /// A txn over several shards has a part on one shard and not on
    /// another once the run settled, or parts at two revisions.
    Atomicity,
    /// The history ordered by revision is not a legal sequential history: a
    /// read, or a txn's compares or gets, answered other than the state at
    /// its revision, or a txn applied the branch its compares did not
    /// choose.
    Serializability,
    /// A watch released events out of revision order, or not exactly the
    /// keyspace's events.
    WatchOrder,
    /// A shard took no acknowledged write within the bound after the
    /// faults stopped, or the run did not settle.
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

    /// Whether this is a consistency property of the keyspace (the revision
    /// order, atomicity, the sequential history, watches), as opposed to
    /// Raft's own, liveness or a panic.
    pub fn is_consistency(self) -> bool {
        self.is_revision_order()
            || matches!(
                self,
                KsViolationKind::Atomicity
                    | KsViolationKind::Serializability
                    | KsViolationKind::WatchOrder
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AppliedEntry {
    pub term: u64,
    pub digest: u64,
    pub payload: Option<Payload>,
    pub first_member: u64,
}

/// What a client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OpKind {
    /// A single-shard put or delete.
    Write {
        op: Op,
    },
    Txn {
        spec: TxnSpec,
    },
    /// A linearizable read of every key of these shards.
    Read {
        shards: Vec<usize>,
    },
}

/// What a txn's client was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TxnAnswer {
    /// The txn's revision `T` (the header says `T - 1` when it wrote
    /// nothing).
    pub rev: u64,
    pub wrote: bool,
    pub succeeded: bool,
    /// Each get of the chosen branch, in order.
    pub gets: Vec<(Key, GetResult)>,
}

/// What a read's client was told: every key of its shards at `rev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReadAnswer {
    pub rev: u64,
    pub values: Vec<(Key, GetResult)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    Write,
    Txn(TxnAnswer),
    Read(ReadAnswer),
}

/// Where an op sits in the revision order: a write at `(rev, 0)`, a read
/// at `R` (after every write at or below `R`) at `(R, 1)`.
pub(super) type Point = (u64, u8);

#[derive(Debug, Clone)]
pub(super) struct OpRecord {
    pub kind: OpKind,
    pub invoked_tick: u64,
    pub invoked_step: u64,
    /// The largest `(point, op)` acknowledged before this op was invoked,
    /// with the step of that acknowledgement.
    pub bound: Option<(Point, u64, u64)>,
    /// The revision its entries carry, once applied anywhere.
    pub rev: Option<u64>,
    pub acked_step: Option<u64>,
    pub answer: Option<Answer>,
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
    pub applied: HashMap<(usize, u64), AppliedEntry>,
    rev_owner: HashMap<u64, (u64, usize, u64)>,
    pub ops: HashMap<u64, OpRecord>,
    /// The largest `(point, op, ack step)` acknowledged so far.
    max_acked: Option<(Point, u64, u64)>,
}

fn describe_point(p: Point) -> String {
    match p {
        (r, 0) => format!("revision {r}"),
        (r, _) => format!("read point {r}"),
    }
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

    /// A client invoked op `id`: it must end up ordered after every op
    /// acknowledged so far.
    pub fn invoked(&mut self, id: u64, kind: OpKind, tick: u64, step: u64) {
        let rec = OpRecord {
            kind,
            invoked_tick: tick,
            invoked_step: step,
            bound: self.max_acked,
            rev: None,
            acked_step: None,
            answer: None,
        };
        let old = self.ops.insert(id, rec);
        assert!(old.is_none(), "op {id} invoked twice");
    }

    /// Real-time order: op `id`, placed at `point`, against what was
    /// acknowledged before it was invoked.
    fn check_bound(&self, id: u64, point: Point, where_: &str) -> Check {
        let Some(rec) = self.ops.get(&id) else {
            return Ok(());
        };
        let Some((bp, b_op, ack_step)) = rec.bound else {
            return Ok(());
        };
        if point < bp {
            return Err(found(
                KsViolationKind::RealTimeOrder,
                format!(
                    "op {id} ({where_}, invoked at tick {} step {}) is at {}, but op {b_op} was acknowledged at {} at step {ack_step}, before it was invoked",
                    rec.invoked_tick,
                    rec.invoked_step,
                    describe_point(point),
                    describe_point(bp)
                ),
            ));
        }
        Ok(())
    }

    /// `member` applied the entry `(shard, index)` carrying `payload` (none
    /// for a no-op or a conf change). Returns how many of the ops whose
    /// revisions it carries (an entry of a batch's parts carries several)
    /// had theirs applied here first anywhere.
    #[allow(clippy::too_many_arguments)]
    pub fn applied(
        &mut self,
        member: u64,
        shard: usize,
        index: u64,
        term: u64,
        digest: u64,
        payload: Option<&Payload>,
        cursor: &mut AppliedCursor,
    ) -> Result<usize, Found> {
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
        let e = self
            .applied
            .entry((shard, index))
            .or_insert_with(|| AppliedEntry {
                term,
                digest,
                payload: payload.cloned(),
                first_member: member,
            });
        if e.term != term || e.digest != digest {
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!(
                    "shard {shard} index {index}: members {} and {member} applied term {} {:?} and term {term} {payload:?}",
                    e.first_member, e.term, e.payload
                ),
            ));
        }
        let mut firsts = 0;
        for (rev, owner) in payload.map(Payload::stamps).unwrap_or_default() {
            // Within an entry of parts too: each part is at a revision of
            // its own, above the one before it.
            if cursor.rev_index > 0 && rev <= cursor.rev {
                return Err(found(
                    KsViolationKind::RevisionOrder,
                    format!(
                        "member {member} shard {shard}: {payload:?} at index {index} has revision {rev}, not above revision {} at index {}",
                        cursor.rev, cursor.rev_index
                    ),
                ));
            }
            cursor.rev = rev;
            cursor.rev_index = index;
            let Some(w) = owner else {
                continue;
            };
            if self.first_of_revision(w, rev, shard, index)? {
                firsts += 1;
            }
        }
        Ok(firsts)
    }

    /// Op `w` was applied at `rev` on `(shard, index)`: no other op has
    /// the revision, and the first time it is applied anywhere it is
    /// checked against real time. Whether it was the first time.
    fn first_of_revision(
        &mut self,
        w: u64,
        rev: u64,
        shard: usize,
        index: u64,
    ) -> Result<bool, Found> {
        match self.rev_owner.get(&rev) {
            Some(&(other, s, i)) if other != w => {
                return Err(found(
                    KsViolationKind::DuplicateRevision,
                    format!(
                        "revision {rev} applied for op {other} (shard {s} index {i}) and for op {w} (shard {shard} index {index})"
                    ),
                ));
            }
            Some(_) => return Ok(false),
            None => {
                self.rev_owner.insert(rev, (w, shard, index));
            }
        }
        let Some(rec) = self.ops.get_mut(&w) else {
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!("shard {shard} index {index} applies op {w}, which no client invoked"),
            ));
        };
        if let Some(r) = rec.rev {
            if r != rev {
                return Err(found(
                    KsViolationKind::Atomicity,
                    format!("op {w} applied at revision {r} and at revision {rev} (shard {shard} index {index})"),
                ));
            }
        }
        rec.rev = Some(rev);
        self.check_bound(w, (rev, 0), &format!("shard {shard}"))?;
        Ok(true)
    }

    /// Op `id`'s client was answered `answer` at `step`. Returns whether
    /// this is the first acknowledgement.
    pub fn acked(&mut self, id: u64, step: u64, answer: Answer) -> Result<bool, Found> {
        let Some(rec) = self.ops.get(&id) else {
            return Ok(false);
        };
        if rec.acked_step.is_some() {
            return Ok(false);
        }
        let point = match &answer {
            Answer::Write => (rec.rev.expect("an acknowledged write was applied"), 0),
            Answer::Txn(t) if t.wrote => {
                if rec.rev != Some(t.rev) {
                    return Err(found(
                        KsViolationKind::Atomicity,
                        format!(
                            "txn {id} acknowledged at revision {} but applied at {:?}",
                            t.rev, rec.rev
                        ),
                    ));
                }
                (t.rev, 0)
            }
            Answer::Txn(t) => (t.rev - 1, 1),
            Answer::Read(r) => (r.rev, 1),
        };
        self.check_bound(id, point, "acknowledged")?;
        let rec = self.ops.get_mut(&id).expect("checked");
        rec.acked_step = Some(step);
        rec.answer = Some(answer);
        if self.max_acked.is_none_or(|(p, _, _)| point > p) {
            self.max_acked = Some((point, id, step));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(key: Key) -> OpKind {
        OpKind::Write { op: Op::Put(key) }
    }

    fn wr(id: u64, rev: u64) -> Payload {
        Payload::Write {
            id,
            rev,
            op: Op::Put(0),
        }
    }

    #[test]
    fn a_later_write_below_an_acknowledged_one_is_caught() {
        let mut c = KsChecker::default();
        let mut cur0 = AppliedCursor::default();
        let mut cur1 = AppliedCursor::default();
        c.invoked(1, w(0), 1, 1);
        c.applied(1, 0, 1, 1, 11, Some(&wr(1, 5)), &mut cur0)
            .unwrap();
        assert!(c.acked(1, 2, Answer::Write).unwrap());
        c.invoked(2, w(3), 2, 3);
        let f = c
            .applied(1, 1, 1, 1, 22, Some(&wr(2, 4)), &mut cur1)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::RealTimeOrder);
    }

    #[test]
    fn revisions_must_increase_along_a_shard() {
        let mut c = KsChecker::default();
        let mut cur = AppliedCursor::default();
        c.invoked(1, w(0), 1, 1);
        c.invoked(2, w(1), 1, 2);
        c.applied(1, 0, 1, 1, 11, Some(&wr(1, 5)), &mut cur)
            .unwrap();
        c.applied(1, 0, 2, 1, 0, None, &mut cur).unwrap();
        let f = c
            .applied(1, 0, 3, 1, 22, Some(&wr(2, 5)), &mut cur)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::RevisionOrder);
    }

    fn parts(revs: &[(u64, u64)]) -> Payload {
        Payload::Parts {
            by: crate::sim::keyspace::kv::ReqTag {
                member: 1,
                incarnation: 0,
                seq: 1,
            },
            shard: 0,
            parts: revs
                .iter()
                .map(|&(id, rev)| crate::sim::keyspace::kv::PartAt {
                    id,
                    rev,
                    ops: vec![Op::Put(0)],
                    plan: None,
                })
                .collect(),
        }
    }

    fn txn() -> OpKind {
        OpKind::Txn {
            spec: TxnSpec {
                compares: Vec::new(),
                success: vec![Op::Put(0)],
                failure: Vec::new(),
            },
        }
    }

    #[test]
    fn each_part_of_an_entry_of_parts_has_its_own_revision() {
        let mut c = KsChecker::default();
        let mut cur = AppliedCursor::default();
        c.invoked(1, txn(), 1, 1);
        c.invoked(2, txn(), 1, 2);
        let firsts = c
            .applied(1, 0, 1, 1, 11, Some(&parts(&[(1, 5), (2, 6)])), &mut cur)
            .unwrap();
        assert_eq!(firsts, 2);
        assert_eq!(cur.rev, 6);
        let mut cur = AppliedCursor::default();
        let mut c = KsChecker::default();
        c.invoked(1, txn(), 1, 1);
        c.invoked(2, txn(), 1, 2);
        let f = c
            .applied(1, 0, 1, 1, 11, Some(&parts(&[(1, 5), (2, 5)])), &mut cur)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::RevisionOrder);
    }

    #[test]
    fn one_revision_for_two_writes_is_caught() {
        let mut c = KsChecker::default();
        let mut cur0 = AppliedCursor::default();
        let mut cur1 = AppliedCursor::default();
        c.invoked(1, w(0), 1, 1);
        c.invoked(2, w(3), 1, 2);
        c.applied(1, 0, 1, 1, 11, Some(&wr(1, 5)), &mut cur0)
            .unwrap();
        let f = c
            .applied(1, 1, 1, 1, 22, Some(&wr(2, 5)), &mut cur1)
            .unwrap_err();
        assert_eq!(f.kind, KsViolationKind::DuplicateRevision);
    }
}

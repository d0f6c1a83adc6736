//! The invariants the simulator checks, kept as global registries that outlive
//! any member's crash: who led each term, which entry each `(index, term)`
//! names, what was committed and applied at each index, and where each read
//! began.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use bytes::Bytes;

/// Which property a run broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ViolationKind {
    /// Two leaders in one term (Raft paper 5.2).
    ElectionSafety,
    /// One `(index, term)` with two different entries or predecessors (5.3).
    LogMatching,
    /// A leader without an entry committed in an earlier term (5.4).
    LeaderCompleteness,
    /// Two members applied (or committed, or snapshotted) different entries
    /// at one index (5.4.3).
    StateMachineSafety,
    /// A ReadIndex answer missed a write committed before the read began
    /// (thesis 6.4).
    ReadLinearizability,
    /// A message vouched for state that was not yet durable, or the durable
    /// state could not be restarted from.
    PersistenceContract,
    /// No leader, commit and read within the bound after the faults stopped.
    Liveness,
    /// The Raft core panicked (a broken invariant it asserts itself).
    CorePanic,
}

impl ViolationKind {
    /// Whether this is one of the safety properties (not liveness).
    pub fn is_safety(self) -> bool {
        !matches!(self, ViolationKind::Liveness)
    }

    /// Whether this is one of the consensus properties of Raft paper 5.2-5.4,
    /// the ones a switched-off safety rule of the core breaks. A stale read
    /// or a lost liveness says nothing about such a rule.
    pub fn is_consensus_safety(self) -> bool {
        matches!(
            self,
            ViolationKind::ElectionSafety
                | ViolationKind::LogMatching
                | ViolationKind::LeaderCompleteness
                | ViolationKind::StateMachineSafety
        )
    }
}

/// The first broken property of a run, where it broke and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub tick: u64,
    pub step: u64,
    pub detail: String,
}

impl fmt::Display for Violation {
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
pub(crate) struct Found {
    pub kind: ViolationKind,
    pub detail: String,
}

pub(crate) type Check = Result<(), Found>;

pub(crate) fn found(kind: ViolationKind, detail: String) -> Found {
    Found { kind, detail }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoggedEntry {
    digest: u64,
    /// Term of the entry before it; `None` when the logging member could not
    /// tell (compacted).
    prev_term: Option<u64>,
    first_seen_on: u64,
}

/// An index some member considers committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommittedEntry {
    pub term: u64,
    /// Lowest term of a member seen holding this commit: an upper bound of
    /// the term in which it was committed, so leaders of later terms must
    /// hold it.
    pub commit_term: u64,
    first_member: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AppliedEntry {
    term: u64,
    digest: u64,
    /// Hash of the state machine after applying this index.
    chain_hash: u64,
    first_member: u64,
}

/// What had been committed and applied anywhere when a read began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadStart {
    max_commit: u64,
    max_applied: u64,
    member: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Checker {
    leaders: HashMap<u64, u64>,
    logged: HashMap<(u64, u64), LoggedEntry>,
    committed: BTreeMap<u64, CommittedEntry>,
    committed_contiguous: u64,
    applied: HashMap<u64, AppliedEntry>,
    /// Highest commit index any member ever held.
    pub max_commit: u64,
    /// Highest index any member ever applied.
    pub max_applied: u64,
    reads: HashMap<Bytes, ReadStart>,
}

impl Checker {
    /// Election safety: `id` leads `term`; returns whether this is news.
    pub fn observe_leader(&mut self, term: u64, id: u64) -> Result<bool, Found> {
        match self.leaders.get(&term) {
            Some(&other) if other != id => Err(found(
                ViolationKind::ElectionSafety,
                format!("members {other} and {id} are both leader of term {term}"),
            )),
            Some(_) => Ok(false),
            None => {
                self.leaders.insert(term, id);
                Ok(true)
            }
        }
    }

    /// Log matching: the entry `(index, term)` with content `digest` and
    /// predecessor term `prev_term` appears in `member`'s log (or in an
    /// append it sent).
    pub fn log_entry(
        &mut self,
        member: u64,
        index: u64,
        term: u64,
        digest: u64,
        prev_term: Option<u64>,
    ) -> Check {
        let e = self.logged.entry((index, term)).or_insert(LoggedEntry {
            digest,
            prev_term,
            first_seen_on: member,
        });
        if e.digest != digest {
            return Err(found(
                ViolationKind::LogMatching,
                format!(
                    "entry (index {index}, term {term}) has two contents: digest {:#x} first on member {}, {digest:#x} on member {member}",
                    e.digest, e.first_seen_on
                ),
            ));
        }
        match (e.prev_term, prev_term) {
            (Some(a), Some(b)) if a != b => Err(found(
                ViolationKind::LogMatching,
                format!(
                    "entry (index {index}, term {term}) follows term {a} on member {} but term {b} on member {member}",
                    e.first_seen_on
                ),
            )),
            (None, Some(_)) => {
                e.prev_term = prev_term;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `member` (now in `member_term`) holds index `index` of term `term` as
    /// committed.
    pub fn observe_commit(
        &mut self,
        member: u64,
        index: u64,
        term: u64,
        member_term: u64,
    ) -> Check {
        self.max_commit = self.max_commit.max(index);
        match self.committed.get_mut(&index) {
            Some(c) if c.term != term => {
                return Err(found(
                    ViolationKind::StateMachineSafety,
                    format!(
                        "index {index} committed with term {} on member {} but with term {term} on member {member}",
                        c.term, c.first_member
                    ),
                ))
            }
            Some(c) => c.commit_term = c.commit_term.min(member_term),
            None => {
                self.committed.insert(
                    index,
                    CommittedEntry {
                        term,
                        commit_term: member_term,
                        first_member: member,
                    },
                );
            }
        }
        while self
            .committed
            .contains_key(&(self.committed_contiguous + 1))
        {
            self.committed_contiguous += 1;
        }
        Ok(())
    }

    /// A commit index seen without the entries' terms (a restored snapshot).
    pub fn observe_commit_index(&mut self, index: u64) {
        self.max_commit = self.max_commit.max(index);
    }

    /// Highest index up to which every committed entry's term is known.
    pub fn committed_contiguous(&self) -> u64 {
        self.committed_contiguous
    }

    pub fn committed_at(&self, index: u64) -> Option<CommittedEntry> {
        self.committed.get(&index).copied()
    }

    /// State machine safety: `member` applied `(index, term, digest)` and
    /// reached state `chain_hash`.
    pub fn apply(
        &mut self,
        member: u64,
        index: u64,
        term: u64,
        digest: u64,
        chain_hash: u64,
    ) -> Check {
        self.max_applied = self.max_applied.max(index);
        let e = *self.applied.entry(index).or_insert(AppliedEntry {
            term,
            digest,
            chain_hash,
            first_member: member,
        });
        if e.term != term || e.digest != digest {
            return Err(found(
                ViolationKind::StateMachineSafety,
                format!(
                    "index {index}: member {} applied term {} digest {:#x}, member {member} applied term {term} digest {digest:#x}",
                    e.first_member, e.term, e.digest
                ),
            ));
        }
        if e.chain_hash != chain_hash {
            return Err(found(
                ViolationKind::StateMachineSafety,
                format!(
                    "index {index}: state of member {member} ({chain_hash:#x}) differs from member {} ({:#x}) after applying the same entry",
                    e.first_member, e.chain_hash
                ),
            ));
        }
        Ok(())
    }

    /// `member` restored a snapshot at `(index, term)` whose state hashes to
    /// `chain_hash`: it must be the state the appliers of `index` had.
    pub fn snapshot_state(&mut self, member: u64, index: u64, term: u64, chain_hash: u64) -> Check {
        if index == 0 {
            return Ok(());
        }
        self.max_applied = self.max_applied.max(index);
        match self.applied.get(&index) {
            Some(e) if e.term != term || e.chain_hash != chain_hash => Err(found(
                ViolationKind::StateMachineSafety,
                format!(
                    "member {member} restored a snapshot at index {index} term {term} state {chain_hash:#x}, but member {} applied term {} state {:#x} there",
                    e.first_member, e.term, e.chain_hash
                ),
            )),
            Some(_) => Ok(()),
            None => Err(found(
                ViolationKind::StateMachineSafety,
                format!("member {member} restored a snapshot at index {index} that no member applied"),
            )),
        }
    }

    /// A read with context `ctx` begins at `member`.
    pub fn read_started(&mut self, member: u64, ctx: Bytes) {
        self.reads.insert(
            ctx,
            ReadStart {
                max_commit: self.max_commit,
                max_applied: self.max_applied,
                member,
            },
        );
    }

    /// The read was refused at once; it observes nothing.
    pub fn read_refused(&mut self, ctx: &Bytes) {
        self.reads.remove(ctx);
    }

    /// `member` serves the read `ctx` confirmed at `read_index`, from a state
    /// machine that has applied `applied`. Returns whether the context was a
    /// read this run started.
    pub fn read_served(
        &mut self,
        member: u64,
        ctx: &Bytes,
        read_index: u64,
        applied: u64,
    ) -> Result<bool, Found> {
        let Some(start) = self.reads.get(ctx).copied() else {
            return Ok(false);
        };
        let name = String::from_utf8_lossy(ctx);
        if applied < read_index {
            return Err(found(
                ViolationKind::ReadLinearizability,
                format!("read {name} served on member {member} at applied {applied} below its read index {read_index}"),
            ));
        }
        if read_index < start.max_commit {
            return Err(found(
                ViolationKind::ReadLinearizability,
                format!(
                    "read {name} (begun on member {}) got read index {read_index}, but index {} was committed before it began",
                    start.member, start.max_commit
                ),
            ));
        }
        if applied < start.max_applied {
            return Err(found(
                ViolationKind::ReadLinearizability,
                format!(
                    "read {name} served on member {member} from applied index {applied}, missing writes up to {} applied before it began",
                    start.max_applied
                ),
            ));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Raft paper 5.2: election safety.
    #[test]
    fn two_leaders_in_a_term_are_caught() {
        let mut c = Checker::default();
        assert_eq!(c.observe_leader(3, 1), Ok(true));
        assert_eq!(c.observe_leader(3, 1), Ok(false));
        assert_eq!(c.observe_leader(4, 2), Ok(true));
        assert_eq!(
            c.observe_leader(3, 2).unwrap_err().kind,
            ViolationKind::ElectionSafety
        );
    }

    // Raft paper 5.3: log matching, by content and by predecessor.
    #[test]
    fn log_matching_catches_content_and_predecessor() {
        let mut c = Checker::default();
        c.log_entry(1, 5, 2, 0xa, Some(2)).unwrap();
        c.log_entry(2, 5, 2, 0xa, None).unwrap();
        assert_eq!(
            c.log_entry(3, 5, 2, 0xb, Some(2)).unwrap_err().kind,
            ViolationKind::LogMatching
        );
        assert_eq!(
            c.log_entry(3, 5, 2, 0xa, Some(1)).unwrap_err().kind,
            ViolationKind::LogMatching
        );
    }

    // Raft paper 5.4.3: state machine safety.
    #[test]
    fn different_applies_at_an_index_are_caught() {
        let mut c = Checker::default();
        c.apply(1, 1, 1, 0x1, 0x11).unwrap();
        c.apply(2, 1, 1, 0x1, 0x11).unwrap();
        assert!(c.apply(3, 1, 2, 0x2, 0x22).is_err());
        assert!(c.apply(3, 1, 1, 0x1, 0x99).is_err());
        assert!(c.snapshot_state(3, 1, 1, 0x11).is_ok());
        assert!(c.snapshot_state(3, 1, 1, 0x12).is_err());
    }

    // Raft thesis 6.4: a read must cover what was committed before it began.
    #[test]
    fn stale_read_is_caught() {
        let mut c = Checker::default();
        c.observe_commit(1, 1, 1, 1).unwrap();
        c.observe_commit(1, 2, 1, 1).unwrap();
        let ctx = Bytes::from_static(b"r1");
        c.read_started(2, ctx.clone());
        assert_eq!(c.read_served(2, &ctx, 2, 2), Ok(true));
        assert_eq!(
            c.read_served(2, &ctx, 1, 2).unwrap_err().kind,
            ViolationKind::ReadLinearizability
        );
        assert_eq!(
            c.read_served(2, &Bytes::from_static(b"other"), 0, 0),
            Ok(false)
        );
    }

    #[test]
    fn committed_terms_must_agree() {
        let mut c = Checker::default();
        c.observe_commit(1, 1, 1, 1).unwrap();
        c.observe_commit(2, 2, 2, 2).unwrap();
        assert_eq!(c.committed_contiguous(), 2);
        assert!(c.observe_commit(3, 2, 3, 3).is_err());
        assert_eq!(c.committed_at(2).unwrap().term, 2);
    }
}

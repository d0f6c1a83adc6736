//! What a store answers for a txn over several shards before its part is
//! applied here: the txn's compares over this store's keys, and whether this
//! store's ops would be refused (docs/KEYSPACE.md, "Transactions over
//! several shards"). Both read the state as applied so far; the shard driver
//! holds new writes back between these calls and the part's entry, so the
//! part applies on exactly the state they saw.

use super::Store;
use crate::error::{ApplyError, ReadError};
use crate::types::*;

impl Store {
    /// Each compare over the keys of its range held by this store: None
    /// where the store holds none of them, else whether every one satisfies
    /// it. A compare over keys of several stores holds when it holds on
    /// every store holding some; on none, [`crate::compare_absent`] decides.
    pub fn compare_present(&self, compares: &[Compare]) -> Result<Vec<Option<bool>>, ReadError> {
        self.compare_present_at(compares, 0)
    }

    /// [`Store::compare_present`] at `revision` (0: the current one): what
    /// a read-only txn over several shards asks of each at its read point.
    /// Refused as a range at `revision` is (compacted, or a future one).
    pub fn compare_present_at(
        &self,
        compares: &[Compare],
        revision: i64,
    ) -> Result<Vec<Option<bool>>, ReadError> {
        let idx = self.index.borrow();
        let at = self.view(&idx, self.current_rev).check_rev(revision)?;
        let v = self.view(&idx, at);
        compares.iter().map(|c| v.compare_present(c)).collect()
    }

    /// The request errors applying `ops` (a branch of a txn, without its
    /// compares) at a revision above `before` would give, checked before any
    /// op runs as [`Store::apply_at`] does: so that a part of a txn over
    /// several shards is never refused on one shard after another shard's
    /// part applied. A range may name any revision up to `before` (the
    /// txn's reads see the keyspace just before it), not below compaction.
    pub fn check_ops(&self, ops: &[RequestOp], before: i64) -> Result<(), ApplyError> {
        for op in ops {
            match op {
                RequestOp::Put(p) => self.check_put(p)?,
                RequestOp::DeleteRange(d) if d.key.is_empty() => return Err(ApplyError::EmptyKey),
                RequestOp::DeleteRange(_) => {}
                RequestOp::Range(r) if r.key.is_empty() => return Err(ApplyError::EmptyKey),
                RequestOp::Range(r) => {
                    // As `apply_at` checks a txn's ranges: against the
                    // keyspace just before the txn.
                    let idx = self.index.borrow();
                    self.view(&idx, before).check_rev(r.revision)?;
                }
                RequestOp::Txn(t) => {
                    self.check_ops(&t.success, before)?;
                    self.check_ops(&t.failure, before)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::storage::MemStorage;
    use crate::types::*;
    use crate::{compare_absent, Config, ReadError, Store};

    fn store() -> Store {
        Store::open_with(Box::new(MemStorage::new()), "parts-test", Config::default())
            .expect("open")
    }

    fn put(key: &str, value: &str, lease: i64) -> PutRequest {
        PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            ..Default::default()
        }
    }

    fn version_is(key: &str, end: &str, v: i64) -> Compare {
        Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Version(v),
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
        }
    }

    #[test]
    fn compares_answer_for_the_keys_held_here_only() {
        let mut s = store();
        s.apply_at(1, 10, &Op::Put(put("a/1", "x", 0))).unwrap();
        let got = s
            .compare_present(&[
                version_is("a/1", "", 1),
                version_is("a/1", "", 2),
                version_is("b/1", "", 0),
                version_is("a/", "a0", 1),
            ])
            .unwrap();
        assert_eq!(got, vec![Some(true), Some(false), None, Some(true)]);
        // On no store: version 0 holds, a value compare fails.
        assert!(compare_absent(&version_is("b/1", "", 0)));
        assert!(!compare_absent(&Compare {
            target: CompareTarget::Value(Vec::new()),
            ..version_is("b/1", "", 0)
        }));
    }

    #[test]
    fn compares_at_a_revision_see_the_keys_as_they_were_then() {
        let mut s = store();
        s.apply_at(1, 10, &Op::Put(put("a/1", "x", 0))).unwrap();
        s.apply_at(2, 20, &Op::Put(put("a/1", "y", 0))).unwrap();
        s.apply_at(3, 30, &Op::Put(put("a/2", "z", 0))).unwrap();
        let compares = [
            version_is("a/1", "", 1),
            version_is("a/2", "", 1),
            version_is("a/", "a0", 1),
        ];
        let at = |revision| s.compare_present_at(&compares, revision).unwrap();
        assert_eq!(at(10), vec![Some(true), None, Some(true)]);
        assert_eq!(at(20), vec![Some(false), None, Some(false)]);
        assert_eq!(at(30), vec![Some(false), Some(true), Some(false)]);
        assert_eq!(at(0), at(30));
        assert!(matches!(
            s.compare_present_at(&compares, 31),
            Err(ReadError::FutureRevision { .. })
        ));
        s.apply_at(4, 31, &Op::Compact(CompactionRequest { revision: 20 }))
            .unwrap();
        while s.compaction_running() {
            s.compaction_step();
        }
        assert!(matches!(
            s.compare_present_at(&compares, 10),
            Err(ReadError::Compacted { .. })
        ));
        assert_eq!(
            s.compare_present_at(&compares, 20).unwrap(),
            vec![Some(false), None, Some(false)]
        );
    }

    #[test]
    fn ops_are_checked_as_apply_would_refuse_them() {
        let mut s = store();
        s.apply_at(1, 10, &Op::Put(put("a/1", "x", 0))).unwrap();
        assert!(s
            .check_ops(&[RequestOp::Put(put("a/2", "y", 0))], 20)
            .is_ok());
        assert!(matches!(
            s.check_ops(&[RequestOp::Put(put("a/2", "y", 7))], 20),
            Err(ApplyError::LeaseNotFound { id: 7 })
        ));
        let range_at = |revision| {
            RequestOp::Range(RangeRequest {
                key: b"a/1".to_vec(),
                revision,
                ..Default::default()
            })
        };
        assert!(s.check_ops(&[range_at(20)], 20).is_ok());
        assert!(matches!(
            s.check_ops(&[range_at(21)], 20),
            Err(ApplyError::FutureRevision { .. })
        ));
        let nested = RequestOp::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::DeleteRange(DeleteRangeRequest::default())],
            failure: Vec::new(),
        });
        assert!(matches!(
            s.check_ops(&[nested], 20),
            Err(ApplyError::EmptyKey)
        ));
    }

    #[test]
    fn a_parts_ops_take_the_sub_revisions_of_their_places_in_the_txn() {
        let mut s = store();
        let ops = Op::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![
                RequestOp::Put(put("a/1", "x", 0)),
                RequestOp::Put(put("a/2", "y", 0)),
            ],
            failure: Vec::new(),
        });
        s.apply_part_at(1, 10, &ops, &[1 << 32, 3 << 32]).unwrap();
        let subs: Vec<i64> = s
            .events(10, 10)
            .unwrap()
            .iter()
            .map(|e| e.revision.sub)
            .collect();
        assert_eq!(subs, vec![1 << 32, 3 << 32]);
        assert_eq!(s.current_revision(), 10);
        assert!(matches!(
            s.apply_part_at(2, 10, &ops, &[]),
            Err(ApplyError::StaleRevision { .. })
        ));
    }

    use crate::error::ApplyError;
}

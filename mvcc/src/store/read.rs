//! Reads: ranges, single keys, HashKV, events and leases, over everything
//! applied so far.
//!
//! Reads see every applied write, committed or not: records of the open batch
//! are served from memory until the commit moves them into the revision tree.

use std::collections::BTreeSet;
use std::rc::Rc;

use super::Store;
use crate::error::ReadError;
use crate::record::RecordView;
use crate::types::*;

/// The revisions compaction removed that the committed tree still held
/// when a reader began: what it must skip.
#[derive(Debug, Clone, Default)]
pub(crate) struct RemovedRevisions {
    pending: Rc<BTreeSet<Revision>>,
    running: Option<Rc<BTreeSet<Revision>>>,
}

impl RemovedRevisions {
    pub(crate) fn contains(&self, rev: &Revision) -> bool {
        self.pending.contains(rev) || self.running.as_ref().is_some_and(|r| r.contains(rev))
    }
}

impl Store {
    /// Whether compaction removed revision `rev` while the committed
    /// revision tree may still hold it: reads skip it. A commit running in
    /// steps took some such revisions from the pending ones; they stay in
    /// the committed tree until it ends.
    pub(crate) fn removed(&self, rev: &Revision) -> bool {
        self.pending_deletes.contains(rev)
            || self
                .running
                .as_ref()
                .is_some_and(|r| r.deletes.contains(rev))
    }

    /// Every revision [`Store::removed`] names, for a reader that outlives
    /// this state (a snapshot stream, a HashKV): the store's own sets,
    /// shared, which it replaces rather than changes.
    pub(crate) fn removed_revisions(&self) -> RemovedRevisions {
        RemovedRevisions {
            pending: Rc::clone(&self.pending_deletes),
            running: self.running.as_ref().map(|r| Rc::clone(&r.deletes)),
        }
    }

    /// A range with etcd's semantics over everything applied so far.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, ReadError> {
        let idx = self.index.borrow();
        self.view(&idx, self.current_rev).range(req)
    }

    /// etcd's read-only txn (every op of both branches a range), served
    /// without the log: its compares and ranges read the state at
    /// `revision` (0: the current one), and every revision of the answer is
    /// that one, as when such a txn is applied at it. A range's own revision
    /// reads further back, and one past `revision` is a future revision. A
    /// txn with any other op is refused: writes are applied, not read.
    pub fn read_txn(&self, t: &TxnRequest, revision: i64) -> Result<TxnResponse, ReadError> {
        let (at, succeeded) = self.txn_branch(t, revision)?;
        let idx = self.index.borrow();
        let v = self.view(&idx, at);
        let ops = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            if let RequestOp::Range(r) = op {
                responses.push(ResponseOp::Range(v.range(r)?));
            }
        }
        Ok(TxnResponse {
            revision: at,
            succeeded,
            responses,
        })
    }

    /// Which branch a read-only txn takes (true: `success`), its compares
    /// read at `revision` (0: the current one), and the revision they were
    /// read at, which its ranges read at too ([`Store::read_txn`]). The
    /// ranges of that branch are checked first, as etcd checks them before
    /// reading any: the first with no key, or a revision compacted or past
    /// the txn's, refuses the txn. Refused as `read_txn` refuses.
    pub fn txn_branch(&self, t: &TxnRequest, revision: i64) -> Result<(i64, bool), ReadError> {
        let read_only = |ops: &[RequestOp]| ops.iter().all(|op| matches!(op, RequestOp::Range(_)));
        if !read_only(&t.success) || !read_only(&t.failure) {
            return Err(ReadError::NotReadOnly);
        }
        let idx = self.index.borrow();
        let at = self.view(&idx, self.current_rev).check_rev(revision)?;
        let v = self.view(&idx, at);
        let succeeded = v.compares_hold(&t.compare)?;
        for op in if succeeded { &t.success } else { &t.failure } {
            if let RequestOp::Range(r) = op {
                if r.key.is_empty() {
                    return Err(ReadError::EmptyKey);
                }
                v.check_rev(r.revision)?;
            }
        }
        Ok((at, succeeded))
    }

    /// Whether the range of `req` holds more than `n` keys at the revision it
    /// reads at (every key, before limit and filters, as etcd counts them),
    /// looking at no more than `n + 1`: what a reader needs to know whether a
    /// range is short, without counting a long one. Refused as the range is.
    pub fn range_holds_more_than(&self, req: &RangeRequest, n: usize) -> Result<bool, ReadError> {
        if req.key.is_empty() {
            return Err(ReadError::EmptyKey);
        }
        let idx = self.index.borrow();
        let at = self.view(&idx, self.current_rev).check_rev(req.revision)?;
        let end = crate::index::End::from_range_end(&req.range_end);
        let mut seen = 0usize;
        idx.visit(&req.key, &end, at, None, false, |_, _| {
            seen += 1;
            seen <= n
        });
        Ok(seen > n)
    }

    /// The latest value of one key, if it exists.
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, ReadError> {
        let idx = self.index.borrow();
        let v = self.view(&idx, self.current_rev);
        match idx.get(key, self.current_rev) {
            Some(f) => Ok(Some(v.kv(f.modified, false)?)),
            None => Ok(None),
        }
    }

    /// Changes at or after `start_revision`, in revision order, at most `max_events`.
    pub fn events(&self, start_revision: i64, max_events: usize) -> Result<Vec<Event>, ReadError> {
        let compact = self.compact_rev.get();
        if start_revision < compact {
            return Err(ReadError::Compacted {
                revision: start_revision,
                compact_revision: compact,
            });
        }
        let idx = self.index.borrow();
        let v = self.view(&idx, self.current_rev);
        let mut out = Vec::new();
        let mut bad = None;
        v.for_each_record(
            Revision {
                main: start_revision.max(0),
                sub: 0,
            },
            |rev| self.removed(rev),
            |rev, bytes| {
                if out.len() >= max_events {
                    return false;
                }
                match RecordView::parse(bytes) {
                    // A delete at the compaction's revision ends a
                    // generation compaction drops whole: left out whether or
                    // not the compaction's pass over the index has reached
                    // its key yet (`store/compaction.rs`).
                    Ok(r) if rev.main == compact && r.tombstone() => {}
                    Ok(r) => out.push(Event {
                        kind: if r.tombstone() {
                            EventKind::Delete
                        } else {
                            EventKind::Put
                        },
                        kv: r.to_kv(false),
                        revision: rev,
                    }),
                    Err(what) => {
                        bad = Some((rev, what));
                        return false;
                    }
                }
                true
            },
        )?;
        if let Some((rev, _)) = bad {
            return Err(ReadError::MissingRevision {
                file: self.file.to_string(),
                main: rev.main,
                sub: rev.sub,
            });
        }
        Ok(out)
    }

    /// A lease and its attached keys.
    pub fn lease(&self, id: i64) -> Option<Lease> {
        self.leases.get(&id).map(|l| Lease {
            id,
            ttl_secs: l.ttl_secs,
            remaining_ttl_secs: l.remaining_ttl_secs,
            keys: l.keys.iter().cloned().collect(),
        })
    }

    /// Every lease, by id, without their keys.
    pub fn leases(&self) -> Vec<Lease> {
        self.leases
            .iter()
            .map(|(id, l)| Lease {
                id: *id,
                ttl_secs: l.ttl_secs,
                remaining_ttl_secs: l.remaining_ttl_secs,
                keys: Vec::new(),
            })
            .collect()
    }
}

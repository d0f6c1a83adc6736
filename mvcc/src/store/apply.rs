//! Applying writes with etcd's semantics to the in-memory key index and the
//! pending batch: puts, deletes, txns with their checks, compaction and
//! leases.
//!
//! An entry is applied either at the revision after the store's (`apply`,
//! etcd's own rule: the revision moves only when the entry writes) or at the
//! revision it carries (`apply_at`, for a shard of a keyspace whose revisions
//! come from one counter, so a shard's revisions are sparse). Both run the
//! same code: an op reads the state just before its revision and writes at
//! its revision; they differ only in the revision an op that writes nothing
//! leaves the store at and answers with.

use std::rc::Rc;

use super::txn_check::check_txn;
use super::{LeaseState, Store, MAX_REQUEST_BYTES_LIMIT};
use crate::error::{ApplyError, ReadError};
use crate::index::End;
use crate::record::Record;
use crate::types::*;
use crate::view::View;

/// Revision allocator of one write transaction.
struct Tx {
    /// Main revision of every write of the op.
    main: i64,
    sub: i64,
    /// Whether the op has written (its sub revisions may start above 0).
    written: bool,
    /// For a part of a txn over several shards: the sub revision each of
    /// its top-level ops starts at (see `Store::apply_part_at`).
    part_subs: Vec<i64>,
    /// The store's revision once the op is applied if it writes nothing, and
    /// the revision its answers then carry: `main - 1` for `apply`, `main`
    /// for `apply_at`.
    idle_rev: i64,
}

impl Tx {
    fn next(&mut self) -> Revision {
        let r = Revision {
            main: self.main,
            sub: self.sub,
        };
        self.sub += 1;
        self.written = true;
        r
    }
    fn wrote(&self) -> bool {
        self.written
    }
    /// The newest revision the op sees before its first write. Nothing on
    /// this store has a revision between the store's revision and `main`
    /// (`apply_at` requires its revision to be past the store's), so the
    /// state here is the store's state before the op.
    fn before(&self) -> i64 {
        self.main - 1
    }
    /// The revision the op's reads see: its own writes once it has written.
    fn read_rev(&self) -> i64 {
        if self.wrote() {
            self.main
        } else {
            self.before()
        }
    }
    /// The revision the op's answers carry and the store is at afterwards.
    fn result_rev(&self) -> i64 {
        if self.wrote() {
            self.main
        } else {
            self.idle_rev
        }
    }
}

impl Store {
    /// Applies Raft entry `index` carrying `op` at the revision after the
    /// store's: every write of the op gets main revision
    /// `current_revision() + 1`, and the store's revision moves there only if
    /// the op wrote (etcd's rule). Request errors (compacted, key not found,
    /// ...) leave the keyspace unchanged but still advance the applied index;
    /// the entry was applied, its answer is the error.
    pub fn apply(&mut self, index: u64, op: &Op) -> Result<OpResult, ApplyError> {
        self.check_apply(index)?;
        let main = self.current_rev + 1;
        let tx = Tx {
            main,
            sub: 0,
            written: false,
            idle_rev: main - 1,
            part_subs: Vec::new(),
        };
        self.apply_entry(index, tx, op)
    }

    /// Applies Raft entry `index` carrying `op` at `revision`, the revision
    /// the entry carries: every write of the op (puts, deletes, the ops of a
    /// txn, the deletes of a lease revoke) gets main revision `revision`,
    /// with sub revisions in the order of the writes. The op sees the state
    /// before it, as with [`Store::apply`]: its compares, the ranges of a txn
    /// and a compaction may name any revision up to `revision - 1`.
    ///
    /// Afterwards the store's revision ([`Store::current_revision`]) is
    /// `revision` whether or not the op wrote, and whether or not its answer
    /// is a request error: it is the revision this store has reached, and no
    /// entry at or below it remains to be applied here, so reads and
    /// compactions at any revision up to it are valid even where this store
    /// holds no write. Every revision the answer carries is `revision`.
    ///
    /// `revision` must be past the store's revision, else
    /// [`ApplyError::StaleRevision`]: the entry is not applied, the applied
    /// index does not move, and the store stays usable (the caller gave a
    /// wrong revision; nothing was touched).
    pub fn apply_at(&mut self, index: u64, revision: i64, op: &Op) -> Result<OpResult, ApplyError> {
        self.apply_at_subs(index, revision, op, Vec::new())
    }

    /// Applies Raft entry `index` carrying one shard's part of a txn over
    /// several shards at `revision`: `part`, a txn without compares, as
    /// [`Store::apply_at`] applies it, except that the writes of its op `i`
    /// are numbered from sub revision `subs[i]` (ascending: the op's place in
    /// the whole txn), so that the txn's changes on every shard keep the
    /// txn's order. Ops past the end of `subs` go on from the last.
    pub fn apply_part_at(
        &mut self,
        index: u64,
        revision: i64,
        part: &Op,
        subs: &[i64],
    ) -> Result<OpResult, ApplyError> {
        self.apply_at_subs(index, revision, part, subs.to_vec())
    }

    /// Applies Raft entry `index` carrying the parts of several txns over
    /// several shards, each `(revision, part, subs)` as
    /// [`Store::apply_part_at`] applies one, in order (revisions ascending).
    /// The entry is refused whole (the outer error) when the store would
    /// refuse any entry at `index`; otherwise each part's answer, a part
    /// after one that poisoned the store answering [`ApplyError::Poisoned`].
    /// The applied index is `index` unless a part poisoned the store.
    pub fn apply_parts_at(
        &mut self,
        index: u64,
        parts: &[(i64, &Op, &[i64])],
    ) -> Result<Vec<Result<OpResult, ApplyError>>, ApplyError> {
        self.check_apply(index)?;
        let mut answers = Vec::with_capacity(parts.len());
        for &(revision, op, subs) in parts {
            answers.push(if self.poisoned {
                Err(ApplyError::Poisoned {
                    file: self.file.to_string(),
                })
            } else {
                self.apply_checked_at(index, revision, op, subs.to_vec())
            });
        }
        if !self.poisoned {
            self.applied_index = index;
        }
        Ok(answers)
    }

    fn apply_at_subs(
        &mut self,
        index: u64,
        revision: i64,
        op: &Op,
        part_subs: Vec<i64>,
    ) -> Result<OpResult, ApplyError> {
        self.check_apply(index)?;
        self.apply_checked_at(index, revision, op, part_subs)
    }

    /// Applies `op` at `revision` as entry `index`, which `check_apply`
    /// admitted; refused with [`ApplyError::StaleRevision`] (nothing
    /// touched) when the store has reached `revision`.
    fn apply_checked_at(
        &mut self,
        index: u64,
        revision: i64,
        op: &Op,
        part_subs: Vec<i64>,
    ) -> Result<OpResult, ApplyError> {
        if revision <= self.current_rev {
            return Err(ApplyError::StaleRevision {
                file: self.file.to_string(),
                revision,
                current_revision: self.current_rev,
            });
        }
        let tx = Tx {
            main: revision,
            sub: 0,
            written: false,
            idle_rev: revision,
            part_subs,
        };
        self.apply_entry(index, tx, op)
    }

    /// Records entry `index` as applied with nothing to do but close
    /// `revision`: the store reaches it if it is past the store's revision (no
    /// later entry will carry one at or below it; see `apply_at`), and stays
    /// where it is otherwise.
    pub fn close_at(&mut self, index: u64, revision: i64) -> Result<(), ApplyError> {
        self.check_apply(index)?;
        self.applied_index = index;
        self.current_rev = self.current_rev.max(revision);
        Ok(())
    }

    /// Refusals that apply nothing and leave the store as it is.
    fn check_apply(&self, index: u64) -> Result<(), ApplyError> {
        if self.poisoned {
            return Err(ApplyError::Poisoned {
                file: self.file.to_string(),
            });
        }
        if index <= self.applied_index {
            return Err(ApplyError::StaleIndex {
                index,
                applied: self.applied_index,
            });
        }
        if self.pending_bytes >= self.cfg.max_batch_bytes {
            return Err(ApplyError::BatchFull {
                bytes: self.pending_bytes,
            });
        }
        Ok(())
    }

    /// Runs `op` and records entry `index` as applied, with the store at the
    /// op's resulting revision, unless the op failed in a way that poisons
    /// the store. A request error wrote nothing (every check runs before the
    /// first write), so the store is then at `tx.idle_rev`.
    fn apply_entry(&mut self, index: u64, mut tx: Tx, op: &Op) -> Result<OpResult, ApplyError> {
        let r = self.apply_op(&mut tx, op);
        match &r {
            Err(e) if !e.is_request_error() => {
                self.poisoned = true;
                tracing::error!(file = %self.file, index, error = %e, "apply failed; store poisoned");
            }
            _ => {
                let reached = tx.result_rev();
                assert!(
                    reached >= self.current_rev,
                    "{}: revision going back from {} to {reached}",
                    self.file,
                    self.current_rev
                );
                self.applied_index = index;
                self.current_rev = reached;
            }
        }
        r
    }

    /// Records that Raft entry `index` (one that does not touch the keyspace) is applied.
    pub fn set_applied_index(&mut self, index: u64) {
        assert!(
            index >= self.applied_index,
            "{}: applied index going back from {} to {index}",
            self.file,
            self.applied_index
        );
        self.applied_index = index;
    }

    fn apply_op(&mut self, tx: &mut Tx, op: &Op) -> Result<OpResult, ApplyError> {
        let r = match op {
            Op::Put(p) => {
                self.check_put(p)?;
                OpResult::Put(self.do_put(tx, p)?)
            }
            Op::DeleteRange(d) => {
                if d.key.is_empty() {
                    return Err(ApplyError::EmptyKey);
                }
                let mut resp = self.do_delete(tx, d)?;
                resp.revision = tx.result_rev();
                OpResult::DeleteRange(resp)
            }
            Op::Txn(t) => OpResult::Txn(self.do_txn_top(tx, t)?),
            Op::Compact(c) => OpResult::Compact(self.do_compact(tx, c)?),
            Op::LeaseGrant { id, ttl_secs } => {
                if *id == 0 {
                    return Err(ApplyError::LeaseIdZero);
                }
                if self.leases.contains_key(id) {
                    return Err(ApplyError::LeaseExists { id: *id });
                }
                self.leases.insert(
                    *id,
                    LeaseState {
                        ttl_secs: *ttl_secs,
                        ..LeaseState::default()
                    },
                );
                self.lease_dirty.insert(*id);
                OpResult::LeaseGrant {
                    revision: tx.result_rev(),
                }
            }
            Op::LeaseRevoke { id } => {
                let Some(l) = self.leases.get(id) else {
                    return Err(ApplyError::LeaseNotFound { id: *id });
                };
                let keys: Vec<Vec<u8>> = l.keys.iter().cloned().collect();
                let mut deleted = 0;
                for key in keys {
                    let d = DeleteRangeRequest {
                        key,
                        range_end: Vec::new(),
                        prev_kv: false,
                    };
                    deleted += self.do_delete(tx, &d)?.deleted;
                }
                self.leases.remove(id);
                self.lease_dirty.insert(*id);
                OpResult::LeaseRevoke {
                    revision: tx.result_rev(),
                    deleted,
                }
            }
            Op::LeaseCheckpoint {
                id,
                remaining_ttl_secs,
            } => {
                let Some(l) = self.leases.get_mut(id) else {
                    return Err(ApplyError::LeaseNotFound { id: *id });
                };
                l.remaining_ttl_secs = *remaining_ttl_secs;
                self.lease_dirty.insert(*id);
                OpResult::LeaseCheckpoint {
                    revision: tx.result_rev(),
                }
            }
        };
        Ok(r)
    }

    pub(super) fn check_put(&self, p: &PutRequest) -> Result<(), ApplyError> {
        if p.key.is_empty() {
            return Err(ApplyError::EmptyKey);
        }
        let bytes = p.key.len() + p.value.len();
        if bytes > MAX_REQUEST_BYTES_LIMIT {
            return Err(ApplyError::RequestTooLarge {
                bytes,
                max: MAX_REQUEST_BYTES_LIMIT,
            });
        }
        if p.ignore_value && !p.value.is_empty() {
            return Err(ApplyError::ValueProvided);
        }
        if p.ignore_lease && p.lease != 0 {
            return Err(ApplyError::LeaseProvided);
        }
        if (p.ignore_value || p.ignore_lease) && !self.index.borrow().is_live(&p.key) {
            return Err(ApplyError::KeyNotFound);
        }
        if !p.ignore_lease && p.lease != 0 && !self.leases.contains_key(&p.lease) {
            return Err(ApplyError::LeaseNotFound { id: p.lease });
        }
        Ok(())
    }

    fn latest_kv(&self, tx: &Tx, key: &[u8]) -> Result<Option<KeyValue>, ReadError> {
        let at = tx.read_rev();
        let idx = self.index.borrow();
        match idx.get(key, at) {
            Some(f) => Ok(Some(self.view(&idx, at).kv(f.modified, false)?)),
            None => Ok(None),
        }
    }

    fn push_record(&mut self, rec: Record) {
        self.pending_bytes += rec.encoded_len();
        let rec = Rc::new(rec);
        self.capture(&rec);
        self.pending.push(rec);
    }

    fn set_key_lease(&mut self, key: &[u8], lease: i64) {
        if lease == 0 && self.key_lease.is_empty() {
            return;
        }
        let old = self.key_lease.get(key).copied().unwrap_or(0);
        if old == lease {
            return;
        }
        if old != 0 {
            if let Some(l) = self.leases.get_mut(&old) {
                l.keys.remove(key);
            }
            self.key_lease.remove(key);
        }
        if lease != 0 {
            if let Some(l) = self.leases.get_mut(&lease) {
                l.keys.insert(key.to_vec());
            }
            self.key_lease.insert(key.to_vec(), lease);
        }
    }

    fn do_put(&mut self, tx: &mut Tx, p: &PutRequest) -> Result<PutResponse, ApplyError> {
        let prev = if p.prev_kv || p.ignore_value || p.ignore_lease {
            self.latest_kv(tx, &p.key)?
        } else {
            None
        };
        let value = match (&prev, p.ignore_value) {
            (Some(prev), true) => prev.value.clone(),
            _ => p.value.clone(),
        };
        let lease = match (&prev, p.ignore_lease) {
            (Some(prev), true) => prev.lease,
            _ => p.lease,
        };
        let rev = tx.next();
        let (created, version) = self.index.borrow_mut().put(&p.key, rev);
        self.set_key_lease(&p.key, lease);
        self.push_record(Record {
            rev,
            tombstone: false,
            kv: KeyValue {
                key: p.key.clone(),
                create_revision: created.main,
                mod_revision: rev.main,
                version,
                value,
                lease,
            },
        });
        Ok(PutResponse {
            revision: rev.main,
            prev_kv: if p.prev_kv { prev } else { None },
        })
    }

    fn do_delete(
        &mut self,
        tx: &mut Tx,
        d: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, ApplyError> {
        let at = tx.read_rev();
        let end = End::from_range_end(&d.range_end);
        let mut keys = Vec::new();
        self.index
            .borrow()
            .visit(&d.key, &end, at, None, false, |k, f| {
                keys.push((k.to_vec(), f.modified));
                true
            });
        let mut prev_kvs = Vec::new();
        if d.prev_kv {
            let idx = self.index.borrow();
            let v = self.view(&idx, at);
            for (_, rev) in &keys {
                prev_kvs.push(v.kv(*rev, false)?);
            }
        }
        for (key, _) in &keys {
            let rev = tx.next();
            let live = self.index.borrow_mut().tombstone(key, rev);
            assert!(
                live,
                "{}: deleting key that the index listed as live",
                self.file
            );
            self.set_key_lease(key, 0);
            self.push_record(Record {
                rev,
                tombstone: true,
                kv: KeyValue {
                    key: key.clone(),
                    mod_revision: rev.main,
                    ..KeyValue::default()
                },
            });
        }
        Ok(DeleteRangeResponse {
            revision: tx.main,
            deleted: keys.len() as i64,
            prev_kvs,
        })
    }

    /// Compacts at `c.revision`, which may be any revision the op sees,
    /// written here or not: for every key the newest version at or below it
    /// stays, as in etcd.
    fn do_compact(
        &mut self,
        tx: &Tx,
        c: &CompactionRequest,
    ) -> Result<CompactionResponse, ApplyError> {
        let compact = self.compact_rev.get();
        if c.revision <= compact {
            return Err(ApplyError::Compacted {
                revision: c.revision,
                compact_revision: compact,
            });
        }
        if c.revision > tx.before() {
            return Err(ApplyError::FutureRevision {
                revision: c.revision,
                current_revision: tx.before(),
            });
        }
        self.compact_rev.set(c.revision);
        self.start_compaction(c.revision);
        tracing::debug!(file = %self.file, revision = c.revision, "compacted");
        Ok(CompactionResponse {
            revision: tx.result_rev(),
        })
    }

    fn do_txn_top(&mut self, tx: &mut Tx, t: &TxnRequest) -> Result<TxnResponse, ApplyError> {
        check_txn(t)?;
        let mut path = Vec::new();
        {
            let idx = self.index.borrow();
            let v = self.view(&idx, tx.before());
            txn_path(&v, t, &mut path)?;
        }
        let mut pos = 0;
        self.check_txn_path(tx, t, &path, &mut pos)?;
        let mut pos = 0;
        let mut resp = self.do_txn(tx, t, &path, &mut pos)?;
        if tx.wrote() {
            resp.revision = tx.result_rev();
        } else {
            // A txn that wrote nothing answers one revision throughout.
            set_txn_revision(&mut resp, tx.result_rev());
        }
        Ok(resp)
    }

    /// Checks the ops of the chosen branches before any runs, so a txn is
    /// applied whole or not at all.
    fn check_txn_path(
        &self,
        tx: &Tx,
        t: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
    ) -> Result<(), ApplyError> {
        let ok = path[*pos];
        *pos += 1;
        for op in if ok { &t.success } else { &t.failure } {
            match op {
                RequestOp::Put(p) => self.check_put(p)?,
                RequestOp::DeleteRange(d) if d.key.is_empty() => return Err(ApplyError::EmptyKey),
                RequestOp::DeleteRange(_) => {}
                RequestOp::Range(r) => {
                    if r.key.is_empty() {
                        return Err(ApplyError::EmptyKey);
                    }
                    let idx = self.index.borrow();
                    self.view(&idx, tx.before()).check_rev(r.revision)?;
                }
                RequestOp::Txn(nested) => self.check_txn_path(tx, nested, path, pos)?,
            }
        }
        Ok(())
    }

    fn do_txn(
        &mut self,
        tx: &mut Tx,
        t: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
    ) -> Result<TxnResponse, ApplyError> {
        let top = *pos == 0;
        let succeeded = path[*pos];
        *pos += 1;
        let ops = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            if let Some(&sub) = tx.part_subs.get(i).filter(|_| top) {
                tx.sub = tx.sub.max(sub);
            }
            responses.push(match op {
                // As etcd's, each op answers the revision it read or wrote
                // at: one that comes before the txn's first write (a range,
                // a delete of nothing), the revision before the txn's.
                RequestOp::Range(r) => {
                    let at = tx.read_rev();
                    let idx = self.index.borrow();
                    let mut range = self.view(&idx, at).range(r)?;
                    range.revision = at;
                    ResponseOp::Range(range)
                }
                RequestOp::Put(p) => ResponseOp::Put(self.do_put(tx, p)?),
                RequestOp::DeleteRange(d) => {
                    let mut deleted = self.do_delete(tx, d)?;
                    deleted.revision = tx.read_rev();
                    ResponseOp::DeleteRange(deleted)
                }
                RequestOp::Txn(nested) => ResponseOp::Txn(self.do_txn(tx, nested, path, pos)?),
            });
        }
        Ok(TxnResponse {
            revision: tx.read_rev(),
            succeeded,
            responses,
        })
    }
}

fn set_txn_revision(resp: &mut TxnResponse, rev: i64) {
    resp.revision = rev;
    for r in &mut resp.responses {
        match r {
            ResponseOp::Range(x) => x.revision = rev,
            ResponseOp::Put(x) => x.revision = rev,
            ResponseOp::DeleteRange(x) => x.revision = rev,
            ResponseOp::Txn(x) => set_txn_revision(x, rev),
        }
    }
}

/// etcd evaluates every compare on the chosen path against the state before
/// the txn, before running any op.
fn txn_path(v: &View<'_>, t: &TxnRequest, path: &mut Vec<bool>) -> Result<(), ReadError> {
    let ok = v.compares_hold(&t.compare)?;
    path.push(ok);
    for op in if ok { &t.success } else { &t.failure } {
        if let RequestOp::Txn(nested) = op {
            txn_path(v, nested, path)?;
        }
    }
    Ok(())
}

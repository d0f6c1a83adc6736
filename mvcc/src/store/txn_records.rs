//! Pending cross-shard txn records: opaque blobs keyed by the txn's revision,
//! which the shard driver adds and removes as it applies Raft entries. They
//! are changes of the pending batch like any other, so a record put for an
//! entry becomes durable in the same commit as the entry's writes and
//! applied index, or not at all.
//!
//! Back of the envelope: a shard holds 0 to 10 records at once, typically a
//! few hundred bytes each, so the txn tree is one leaf and every record is
//! also kept in memory. The largest record holds a txn of the largest
//! request the API admits (10 MiB), about 2,600 overflow pages; a commit
//! that puts one writes those pages once, and one that removes it frees them.

use std::rc::Rc;

use super::{Store, MAX_REQUEST_BYTES_LIMIT};
use crate::btree::{Mutation, TreeKey};

/// Largest txn record: its length travels as u32 in overflow chains and
/// snapshot chunks, like a revision record's.
pub const MAX_TXN_RECORD_BYTES: usize = MAX_REQUEST_BYTES_LIMIT;
const _: () = assert!(MAX_TXN_RECORD_BYTES < u32::MAX as usize / 2);

/// The txn tree key of record `id`. The tree's order (ids as u64) differs
/// from the ids' order for negative ids; nothing reads the tree in order.
pub(crate) fn txn_key(id: i64) -> TreeKey {
    (id as u64, 0)
}

impl Store {
    /// Inserts or replaces txn record `id`. It joins the pending batch: reads
    /// through [`Store::txn_records`] see it at once, and the next commit
    /// makes it durable together with everything applied before it.
    ///
    /// Panics if `record` is longer than [`MAX_TXN_RECORD_BYTES`]: records
    /// hold requests the API has already bounded far below that.
    pub fn put_txn_record(&mut self, id: i64, record: &[u8]) {
        assert!(
            record.len() <= MAX_TXN_RECORD_BYTES,
            "{}: txn record {id} of {} bytes exceeds {MAX_TXN_RECORD_BYTES}",
            self.file,
            record.len()
        );
        self.pending_bytes += record.len();
        self.txn_records.insert(id, Rc::from(record));
        self.txn_dirty.insert(id);
    }

    /// Removes txn record `id` if there is one; like a put, the removal
    /// joins the pending batch.
    pub fn remove_txn_record(&mut self, id: i64) {
        if self.txn_records.remove(&id).is_some() {
            self.txn_dirty.insert(id);
        }
    }

    /// Every txn record, pending changes included, ascending by id.
    pub fn txn_records(&self) -> Vec<(i64, Vec<u8>)> {
        self.txn_records
            .iter()
            .map(|(id, r)| (*id, r.to_vec()))
            .collect()
    }

    /// The txn tree mutations of the pending batch, sorted by tree key; takes
    /// the dirty set.
    pub(super) fn txn_record_mutations(&mut self) -> Vec<Mutation> {
        let mut muts: Vec<Mutation> = std::mem::take(&mut self.txn_dirty)
            .into_iter()
            .map(|id| (txn_key(id), self.txn_records.get(&id).map(|r| r.to_vec())))
            .collect();
        muts.sort_unstable_by_key(|m| m.0);
        muts
    }
}

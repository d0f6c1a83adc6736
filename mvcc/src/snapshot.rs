//! Read snapshots, ranges streamed in bounded chunks, and the snapshot stream
//! that carries a whole store to another member (and its restore).
//!
//! A snapshot pins the meta it was taken at: its pages stay readable (the
//! writer copies on write and reuses a page only once no snapshot can reach it)
//! and it never blocks the writer.
//!
//! Snapshot stream chunk (integers little-endian):
//! ```text
//! 0   4  magic "CSNP"
//! 4   1  kind: 1 header, 2 records, 3 leases, 5 txn records, 4 end
//! 5   8  sequence number, from 0
//! 13  4  payload length P
//! 17  4  CRC32 of bytes 4..17 and the payload
//! 21  P  payload
//! header:  applied_index u64, current_rev i64 (the revision reached),
//!          compact_rev i64, format u32 (2; 1 is still restored)
//! records: repeated { main i64, sub i64, length u32, encoded record }
//! leases:  repeated { id i64, ttl i64, remaining ttl i64 }
//! txn records (format 2): repeated { id i64, length u32, record }
//! end:     record count u64, lease count u64, txn record count u64
//!          (format 1: no txn record count)
//! ```
//!
//! Chunks come in the order of the kinds above. Format 1 streams, from a
//! member of the previous version, carry no txn records.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;

use crate::btree::{self, Cursor, Mutation};
use crate::error::{IoOp, OpenError, ReadError, SnapshotError, StorageError};
use crate::index::Index;
use crate::page::{get_i64, get_u32, get_u64, Meta, META_FLAG_RESTORING};
use crate::pager::PageSource;
use crate::record::{Record, RecordView};
use crate::storage::{FileStorage, Storage};
use crate::store::txn_records::txn_key;
use crate::store::{Config, Registry, RemovedRevisions, Store};
use crate::types::*;
use crate::view::View;

/// A store just restored from a snapshot stream, on its way to the thread
/// that will own it ([`Store::restore_detached`]).
pub struct Restored(Store);

// SAFETY: a `Store` is `!Send` because its parts share `Rc`, `RefCell` and
// `Cell` values (the page source, the key index, the compact revision, the
// snapshot registry, pending records) with each other and with the snapshots,
// views and change lists it hands out. A `Restored` is made only from the
// store `restore` returns, before any of those was handed out, and gives no
// access to the store until `into_store`: every clone of every count lives
// inside the store, so the whole graph moves to the new thread together and
// no two threads ever touch one count. Its storage is a `FileStorage` (a
// `File` and a path), or the `FaultStorage` around one (adding a control
// path and a name), all `Send`; its sync thread is reached through a channel
// and an `Arc`.
unsafe impl Send for Restored {}

/// The storages a restored store can have are `Send`, as its SAFETY needs.
const _: () = {
    fn send<T: Send>() {}
    let _ = send::<FileStorage>;
    let _ = send::<crate::fault::FaultStorage<FileStorage>>;
};

impl Restored {
    /// The store, on the thread that owns it from now on.
    pub fn into_store(self) -> Store {
        self.0
    }

    pub fn applied_index(&self) -> u64 {
        self.0.applied_index()
    }
}

/// A consistent read view of the store at one revision.
pub struct Snapshot {
    src: Rc<PageSource>,
    rev_root: u64,
    committed_rev: i64,
    pending: Vec<Rc<Record>>,
    pub(crate) index: Rc<RefCell<Index>>,
    pub(crate) compact: Rc<Cell<i64>>,
    pub(crate) revision: i64,
    applied_index: u64,
    txn: u64,
    registry: Registry,
}

impl Clone for Snapshot {
    /// Another reader of the same state, registered as the first is: the
    /// pages it reads stay until both are dropped. It copies the list of
    /// the open batch's records (not the records).
    fn clone(&self) -> Snapshot {
        *self
            .registry
            .borrow_mut()
            .get_mut(&self.txn)
            .expect("snapshot registered") += 1;
        Snapshot {
            src: self.src.clone(),
            rev_root: self.rev_root,
            committed_rev: self.committed_rev,
            pending: self.pending.clone(),
            index: self.index.clone(),
            compact: self.compact.clone(),
            revision: self.revision,
            applied_index: self.applied_index,
            txn: self.txn,
            registry: self.registry.clone(),
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let mut reg = self.registry.borrow_mut();
        let n = reg.get_mut(&self.txn).expect("snapshot registered");
        *n -= 1;
        if *n == 0 {
            reg.remove(&self.txn);
        }
    }
}

impl Store {
    /// A snapshot of everything applied so far. Cheap: it copies only the
    /// records of the open batch.
    pub fn snapshot(&self) -> Snapshot {
        let txn = self.register_snapshot();
        Snapshot {
            src: self.pager.source.clone(),
            rev_root: self.committed.rev_root,
            committed_rev: self.committed.current_rev,
            pending: self.pending.clone(),
            index: self.index.clone(),
            compact: self.compact_rev.clone(),
            revision: self.current_rev,
            applied_index: self.applied_index,
            txn,
            registry: self.snapshots.clone(),
        }
    }

    /// A stream of the whole store as chunks, for a Raft snapshot or a backup.
    pub fn snapshot_stream(&self) -> SnapshotStream {
        let snap = self.snapshot();
        let leases = self
            .leases
            .iter()
            .map(|(id, l)| (*id, l.ttl_secs, l.remaining_ttl_secs))
            .collect();
        let txn_records = self
            .txn_records
            .iter()
            .map(|(id, r)| (*id, Rc::clone(r)))
            .collect();
        SnapshotStream {
            header: (self.applied_index, self.current_rev, self.compact_rev.get()),
            snap,
            skip: self.removed_revisions(),
            leases,
            txn_records,
            chunk_bytes: self.cfg.snapshot_chunk_bytes,
            phase: Phase::Header,
            seq: 0,
            cursor: None,
            tree_done: false,
            pending_pos: 0,
            lease_pos: 0,
            txn_pos: 0,
            records: 0,
        }
    }

    /// Builds a new store in `dir` for `shard` from a snapshot stream.
    pub fn restore(
        dir: &Path,
        shard: u32,
        cfg: Config,
        chunks: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<Store, SnapshotError> {
        let path = Store::file_path(dir, shard);
        let name = path.display().to_string();
        std::fs::create_dir_all(dir)
            .map_err(|e| OpenError::from(StorageError::new(&name, IoOp::Open, 0, e)))?;
        if path.exists() && std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) > 0 {
            return Err(SnapshotError::TargetNotEmpty { file: name });
        }
        let fs = FileStorage::open(&path)
            .map_err(|e| OpenError::from(StorageError::new(&name, IoOp::Open, 0, e)))?;
        crate::store::flock(fs.file().expect("a real file"))
            .map_err(|_| OpenError::Locked { file: name.clone() })?;
        // The restored store's syncs obey the fault control as an opened
        // store's do, from its first one.
        let storage = crate::store::under_faults(fs, &path, &cfg);
        Store::restore_with(storage, &name, cfg, chunks)
    }

    /// [`Store::restore`] on a thread other than the one that will own the
    /// store: building a large store reads, writes and syncs the whole file,
    /// which must not stop the owner's thread.
    pub fn restore_detached(
        dir: &Path,
        shard: u32,
        cfg: Config,
        chunks: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<Restored, SnapshotError> {
        Store::restore(dir, shard, cfg, chunks).map(Restored)
    }

    /// Builds a new store on empty `storage` from a snapshot stream. Until the
    /// last chunk is committed the file is marked as restoring and refuses to open.
    pub fn restore_with(
        storage: Box<dyn Storage>,
        name: &str,
        cfg: Config,
        chunks: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<Store, SnapshotError> {
        let empty = storage
            .is_empty()
            .map_err(|e| OpenError::from(StorageError::new(name, IoOp::Open, 0, e)))?;
        if !empty {
            return Err(SnapshotError::TargetNotEmpty {
                file: name.to_string(),
            });
        }
        let mut store = Store::open_inner(storage, name, cfg, true)?;
        let mut seq = 0u64;
        let mut header = None;
        let mut format = SNAPSHOT_FORMAT;
        let mut records = 0u64;
        let mut leases = 0u64;
        let mut txn_records = 0u64;
        let mut last_rev = (0u64, 0u64);
        let mut last_txn_id: Option<i64> = None;
        let mut finished = false;
        for chunk in chunks {
            if finished {
                return Err(SnapshotError::BadChunk {
                    seq,
                    what: "data after the end chunk".into(),
                });
            }
            let (kind, payload) = parse_chunk(&chunk, seq)?;
            let bad = |what: &str| SnapshotError::BadChunk {
                seq,
                what: what.to_string(),
            };
            match kind {
                KIND_HEADER => {
                    if seq != 0 || payload.len() != 28 {
                        return Err(bad("misplaced or malformed header"));
                    }
                    format = get_u32(payload, 24);
                    if format != SNAPSHOT_FORMAT && format != SNAPSHOT_FORMAT_V1 {
                        return Err(bad("unknown snapshot format"));
                    }
                    header = Some((
                        get_u64(payload, 0),
                        get_i64(payload, 8),
                        get_i64(payload, 16),
                    ));
                }
                KIND_RECORDS | KIND_LEASES => {
                    let Some((_, current_rev, _)) = header else {
                        return Err(bad("data before the header"));
                    };
                    let mut muts: Vec<Mutation> = Vec::new();
                    let mut lease_muts: Vec<Mutation> = Vec::new();
                    let mut p = payload;
                    while !p.is_empty() {
                        if kind == KIND_RECORDS {
                            if p.len() < 20 {
                                return Err(bad("truncated record"));
                            }
                            let key = (get_u64(p, 0), get_u64(p, 8));
                            let len = get_u32(p, 16) as usize;
                            let body =
                                p.get(20..20 + len).ok_or_else(|| bad("truncated record"))?;
                            let rec = RecordView::parse(body).map_err(bad)?;
                            if key <= last_rev
                                || rec.mod_revision() != key.0 as i64
                                || key.0 as i64 > current_rev
                            {
                                return Err(bad("record revisions out of order"));
                            }
                            last_rev = key;
                            muts.push((key, Some(body.to_vec())));
                            records += 1;
                            p = &p[20 + len..];
                        } else {
                            if p.len() < 24 {
                                return Err(bad("truncated lease"));
                            }
                            let mut v = p[8..24].to_vec();
                            v.truncate(16);
                            lease_muts.push(((get_i64(p, 0) as u64, 0), Some(v)));
                            leases += 1;
                            p = &p[24..];
                        }
                    }
                    lease_muts.sort_by_key(|m| m.0);
                    store.write_restored(muts, lease_muts, Vec::new(), None)?;
                }
                KIND_TXN_RECORDS => {
                    if header.is_none() {
                        return Err(bad("data before the header"));
                    }
                    if format == SNAPSHOT_FORMAT_V1 {
                        return Err(bad("txn records in a format 1 stream"));
                    }
                    let mut txn_muts: Vec<Mutation> = Vec::new();
                    let mut p = payload;
                    while !p.is_empty() {
                        if p.len() < TXN_ENTRY_FIXED_BYTES {
                            return Err(bad("truncated txn record"));
                        }
                        let id = get_i64(p, 0);
                        let end = TXN_ENTRY_FIXED_BYTES + get_u32(p, 8) as usize;
                        let body = p
                            .get(TXN_ENTRY_FIXED_BYTES..end)
                            .ok_or_else(|| bad("truncated txn record"))?;
                        if last_txn_id.is_some_and(|last| id <= last) {
                            return Err(bad("txn record ids out of order"));
                        }
                        last_txn_id = Some(id);
                        txn_muts.push((txn_key(id), Some(body.to_vec())));
                        txn_records += 1;
                        p = &p[end..];
                    }
                    // Tree keys order negative ids after positive ones.
                    txn_muts.sort_unstable_by_key(|m| m.0);
                    store.write_restored(Vec::new(), Vec::new(), txn_muts, None)?;
                }
                KIND_END => {
                    let Some(h) = header else {
                        return Err(bad("end before the header"));
                    };
                    let counts_ok = if format == SNAPSHOT_FORMAT_V1 {
                        payload.len() == 16
                    } else {
                        payload.len() == 24 && get_u64(payload, 16) == txn_records
                    };
                    if !counts_ok || get_u64(payload, 0) != records || get_u64(payload, 8) != leases
                    {
                        return Err(bad("counts disagree with the chunks received"));
                    }
                    store.write_restored(Vec::new(), Vec::new(), Vec::new(), Some(h))?;
                    finished = true;
                }
                _ => return Err(bad("unknown chunk kind")),
            }
            seq += 1;
        }
        if !finished {
            return Err(SnapshotError::Incomplete { chunks: seq });
        }
        store.sync()?;
        store.rebuild()?;
        tracing::info!(
            file = name,
            records,
            leases,
            txn_records,
            format,
            applied_index = store.applied_index,
            "restored store from snapshot"
        );
        Ok(store)
    }

    /// Commits restored records; the final call (with the header) clears the
    /// restoring flag.
    fn write_restored(
        &mut self,
        muts: Vec<Mutation>,
        lease_muts: Vec<Mutation>,
        txn_muts: Vec<Mutation>,
        last: Option<(u64, i64, i64)>,
    ) -> Result<(), SnapshotError> {
        let txn = self.committed.txn + 1;
        self.pager.txn = txn;
        let rev_root = btree::apply(&mut self.pager, self.committed.rev_root, muts)
            .map_err(crate::error::CommitError::from)?;
        let lease_root = btree::apply(&mut self.pager, self.committed.lease_root, lease_muts)
            .map_err(crate::error::CommitError::from)?;
        let txn_root = btree::apply(&mut self.pager, self.committed.txn_root, txn_muts)
            .map_err(crate::error::CommitError::from)?;
        let (applied_index, current_rev, compact_rev, flags) = match last {
            Some((a, c, k)) => (a, c, k, 0),
            None => (0, 1, 0, META_FLAG_RESTORING),
        };
        self.applied_index = applied_index;
        self.current_rev = current_rev;
        self.compact_rev.set(compact_rev);
        let meta = Meta {
            txn,
            rev_root,
            lease_root,
            txn_root,
            applied_index,
            current_rev,
            compact_rev,
            flags,
        };
        self.commit_meta(meta)?;
        Ok(())
    }
}

const SNAPSHOT_MAGIC: [u8; 4] = *b"CSNP";
/// The stream format this build writes; format 2 added txn records.
const SNAPSHOT_FORMAT: u32 = 2;
/// The previous stream format, still restored: no txn records.
const SNAPSHOT_FORMAT_V1: u32 = 1;
const KIND_HEADER: u8 = 1;
const KIND_RECORDS: u8 = 2;
const KIND_LEASES: u8 = 3;
const KIND_END: u8 = 4;
const KIND_TXN_RECORDS: u8 = 5;
// A txn record entry: id i64, length u32, then the record.
const TXN_ENTRY_FIXED_BYTES: usize = size_of::<i64>() + size_of::<u32>();
const CHUNK_KIND_OFFSET: usize = SNAPSHOT_MAGIC.len();
const CHUNK_SEQ_OFFSET: usize = CHUNK_KIND_OFFSET + size_of::<u8>();
const CHUNK_LEN_OFFSET: usize = CHUNK_SEQ_OFFSET + size_of::<u64>();
const CHUNK_CRC_OFFSET: usize = CHUNK_LEN_OFFSET + size_of::<u32>();
const CHUNK_HEADER_BYTES: usize = CHUNK_CRC_OFFSET + size_of::<u32>();

fn make_chunk(kind: u8, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(CHUNK_HEADER_BYTES + payload.len());
    b.extend_from_slice(&SNAPSHOT_MAGIC);
    b.push(kind);
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&b[CHUNK_KIND_OFFSET..CHUNK_CRC_OFFSET]);
    h.update(payload);
    b.extend_from_slice(&h.finalize().to_le_bytes());
    b.extend_from_slice(payload);
    b
}

fn parse_chunk(b: &[u8], seq: u64) -> Result<(u8, &[u8]), SnapshotError> {
    let bad = |what: &str| SnapshotError::BadChunk {
        seq,
        what: what.to_string(),
    };
    if b.len() < CHUNK_HEADER_BYTES || b[..4] != SNAPSHOT_MAGIC {
        return Err(bad("bad magic or short chunk"));
    }
    let len = get_u32(b, CHUNK_LEN_OFFSET) as usize;
    if b.len() != CHUNK_HEADER_BYTES + len {
        return Err(bad("length disagrees with the chunk size"));
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&b[CHUNK_KIND_OFFSET..CHUNK_CRC_OFFSET]);
    h.update(&b[CHUNK_HEADER_BYTES..]);
    if h.finalize() != get_u32(b, CHUNK_CRC_OFFSET) {
        return Err(bad("checksum mismatch"));
    }
    if get_u64(b, CHUNK_SEQ_OFFSET) != seq {
        return Err(bad("out of sequence"));
    }
    Ok((b[CHUNK_KIND_OFFSET], &b[CHUNK_HEADER_BYTES..]))
}

enum Phase {
    Header,
    Records,
    Leases,
    TxnRecords,
    End,
    Done,
}

/// The chunks of one snapshot, produced lazily; at most one chunk is in memory.
pub struct SnapshotStream {
    snap: Snapshot,
    header: (u64, i64, i64),
    skip: RemovedRevisions,
    leases: Vec<(i64, i64, i64)>,
    /// Shared with the store, which replaces rather than changes a record.
    txn_records: Vec<(i64, Rc<[u8]>)>,
    chunk_bytes: usize,
    phase: Phase,
    seq: u64,
    cursor: Option<Cursor>,
    tree_done: bool,
    pending_pos: usize,
    lease_pos: usize,
    txn_pos: usize,
    records: u64,
}

impl SnapshotStream {
    pub fn applied_index(&self) -> u64 {
        self.header.0
    }
    pub fn revision(&self) -> i64 {
        self.header.1
    }

    fn next_records(&mut self) -> Result<Option<Vec<u8>>, SnapshotError> {
        let mut payload = Vec::new();
        let src = self.snap.src.clone();
        let push = |payload: &mut Vec<u8>, main: i64, sub: i64, rec: &[u8]| {
            payload.extend_from_slice(&main.to_le_bytes());
            payload.extend_from_slice(&sub.to_le_bytes());
            payload.extend_from_slice(&(rec.len() as u32).to_le_bytes());
            payload.extend_from_slice(rec);
        };
        if !self.tree_done {
            if self.cursor.is_none() {
                self.cursor =
                    Some(Cursor::seek(&src, self.snap.rev_root, (0, 0)).map_err(ReadError::from)?);
            }
            let c = self.cursor.as_mut().expect("cursor set");
            while payload.len() < self.chunk_bytes {
                let Some((k, lv)) = c.next(&src).map_err(ReadError::from)? else {
                    self.tree_done = true;
                    break;
                };
                let rev = Revision {
                    main: k.0 as i64,
                    sub: k.1 as i64,
                };
                if rev.main > self.snap.committed_rev || self.skip.contains(&rev) {
                    continue;
                }
                let v = btree::resolve(&src, lv).map_err(ReadError::from)?;
                push(&mut payload, rev.main, rev.sub, &v);
                self.records += 1;
            }
            if self.tree_done {
                self.cursor = None;
            }
        }
        if self.tree_done {
            while payload.len() < self.chunk_bytes && self.pending_pos < self.snap.pending.len() {
                let r = &self.snap.pending[self.pending_pos];
                self.pending_pos += 1;
                if self.skip.contains(&r.rev) {
                    continue;
                }
                push(&mut payload, r.rev.main, r.rev.sub, &r.encode());
                self.records += 1;
            }
            if self.pending_pos >= self.snap.pending.len() {
                self.phase = Phase::Leases;
            }
        }
        if payload.is_empty() {
            return Ok(None);
        }
        Ok(Some(payload))
    }
}

impl Iterator for SnapshotStream {
    type Item = Result<Vec<u8>, SnapshotError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (kind, payload) = match self.phase {
                Phase::Header => {
                    let mut p = Vec::with_capacity(28);
                    p.extend_from_slice(&self.header.0.to_le_bytes());
                    p.extend_from_slice(&self.header.1.to_le_bytes());
                    p.extend_from_slice(&self.header.2.to_le_bytes());
                    p.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
                    self.phase = Phase::Records;
                    (KIND_HEADER, p)
                }
                Phase::Records => match self.next_records() {
                    Ok(Some(p)) => (KIND_RECORDS, p),
                    Ok(None) => continue,
                    Err(e) => {
                        self.phase = Phase::Done;
                        return Some(Err(e));
                    }
                },
                Phase::Leases => {
                    if self.lease_pos >= self.leases.len() {
                        self.phase = Phase::TxnRecords;
                        continue;
                    }
                    let mut p = Vec::new();
                    while p.len() < self.chunk_bytes && self.lease_pos < self.leases.len() {
                        let (id, ttl, rem) = self.leases[self.lease_pos];
                        p.extend_from_slice(&id.to_le_bytes());
                        p.extend_from_slice(&ttl.to_le_bytes());
                        p.extend_from_slice(&rem.to_le_bytes());
                        self.lease_pos += 1;
                    }
                    (KIND_LEASES, p)
                }
                Phase::TxnRecords => {
                    if self.txn_pos >= self.txn_records.len() {
                        self.phase = Phase::End;
                        continue;
                    }
                    // A record larger than a chunk gets a chunk of its own.
                    let mut p = Vec::new();
                    while p.len() < self.chunk_bytes && self.txn_pos < self.txn_records.len() {
                        let (id, r) = &self.txn_records[self.txn_pos];
                        p.extend_from_slice(&id.to_le_bytes());
                        p.extend_from_slice(&(r.len() as u32).to_le_bytes());
                        p.extend_from_slice(r);
                        self.txn_pos += 1;
                    }
                    (KIND_TXN_RECORDS, p)
                }
                Phase::End => {
                    let mut p = Vec::with_capacity(24);
                    p.extend_from_slice(&self.records.to_le_bytes());
                    p.extend_from_slice(&(self.leases.len() as u64).to_le_bytes());
                    p.extend_from_slice(&(self.txn_records.len() as u64).to_le_bytes());
                    self.phase = Phase::Done;
                    (KIND_END, p)
                }
                Phase::Done => return None,
            };
            let chunk = make_chunk(kind, self.seq, &payload);
            self.seq += 1;
            return Some(Ok(chunk));
        }
    }
}

impl Snapshot {
    /// The revision this snapshot reads at.
    pub fn revision(&self) -> i64 {
        self.revision
    }
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub(crate) fn with_view<R>(&self, f: impl FnOnce(&View<'_>) -> R) -> R {
        let idx = self.index.borrow();
        let v = View {
            src: &self.src,
            rev_root: self.rev_root,
            committed_rev: self.committed_rev,
            pending: &self.pending,
            index: &idx,
            current_rev: self.revision,
            compact_rev: self.compact.get(),
        };
        f(&v)
    }

    /// A range at this snapshot's revision (or an older one).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, ReadError> {
        self.with_view(|v| v.range(req))
    }
}

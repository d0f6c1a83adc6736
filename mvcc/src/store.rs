//! The store: applies writes with etcd's semantics to the in-memory key index
//! and a pending batch, and commits batches to the copy-on-write file.
//!
//! Reads see every applied write, committed or not: records of the open batch
//! are served from memory until the commit moves them into the revision tree.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use crate::btree::{self, Mutation, TreeKey};
use crate::error::{
    ApplyError, CommitError, DefragError, IoOp, OpenError, ReadError, StorageError,
};
use crate::fault::FaultStorage;
use crate::index::{End, Index, KeyHash};
use crate::page::{CorruptPage, Meta, META_FLAG_RESTORING, META_PAGES, PAGE_SIZE_BYTES};
use crate::pager::{PageSource, Pager, SharedStorage};
use crate::record::{Record, RecordView};
use crate::storage::{FileStorage, Storage};
use crate::syncer::MetaWriter;
use crate::types::*;
use crate::view::View;

/// Tuning of one store. Nothing here changes what `apply` does with an
/// entry: every member applies the same committed entry the same way, so a
/// knob that could refuse an entry on one member and not on another (etcd's
/// `--max-request-bytes`, `--max-txn-ops`) belongs to the API, which checks
/// it before proposing.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most record bytes applied but not committed; `apply` refuses more.
    pub max_batch_bytes: usize,
    /// Smallest and largest step by which the file grows.
    pub grow_min_bytes: u64,
    pub grow_max_bytes: u64,
    /// Keys per chunk of a streamed range.
    pub range_chunk_keys: usize,
    /// Payload bytes per chunk of a snapshot stream.
    pub snapshot_chunk_bytes: usize,
    /// Pages one defragment step copies before it commits.
    pub defrag_step_pages: usize,
    /// Sync commits on a background thread where the storage allows it.
    pub background_sync: bool,
    /// Test-only: a control file whose words stall or fail the store's
    /// syncs (`fault.rs`); None in production.
    pub sync_faults: Option<PathBuf>,
}

/// Largest key plus value one put may carry: a bound of the store's format
/// (record lengths travel as u32), not a flag. Being a constant it is the same
/// on every member, so refusing a put above it at apply cannot make members
/// diverge; the API's `--max-request-bytes` (at most 10 MiB) is far below it,
/// so a put that passed the API never reaches it.
pub const MAX_REQUEST_BYTES_LIMIT: usize = 64 * 1024 * 1024;
/// Hard ceiling that `Config::validate` enforces.
pub const MAX_CHUNK_KEYS_LIMIT: usize = 1_000_000;
// A record's length travels as u32 in overflow chains and snapshot chunks.
const _: () = assert!(MAX_REQUEST_BYTES_LIMIT < u32::MAX as usize / 2);

impl Default for Config {
    fn default() -> Config {
        Config {
            max_batch_bytes: 256 * 1024 * 1024,
            grow_min_bytes: 4 * 1024 * 1024,
            grow_max_bytes: 256 * 1024 * 1024,
            range_chunk_keys: 1000,
            snapshot_chunk_bytes: 1024 * 1024,
            defrag_step_pages: 16 * 1024,
            background_sync: true,
            sync_faults: None,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_batch_bytes < MAX_REQUEST_BYTES_LIMIT {
            return Err(format!(
                "max_batch_bytes {} must hold the largest put ({MAX_REQUEST_BYTES_LIMIT} bytes)",
                self.max_batch_bytes
            ));
        }
        if self.grow_min_bytes < PAGE_SIZE_BYTES as u64 || self.grow_max_bytes < self.grow_min_bytes
        {
            return Err("grow_min_bytes must be at least a page and at most grow_max_bytes".into());
        }
        if self.range_chunk_keys == 0 || self.range_chunk_keys > MAX_CHUNK_KEYS_LIMIT {
            return Err(format!(
                "range_chunk_keys not in 1..={MAX_CHUNK_KEYS_LIMIT}"
            ));
        }
        if self.snapshot_chunk_bytes < 4096 || self.snapshot_chunk_bytes > MAX_REQUEST_BYTES_LIMIT {
            return Err("snapshot_chunk_bytes not in 4096..=64 MiB".into());
        }
        if self.defrag_step_pages == 0 {
            return Err("defrag_step_pages must be positive".into());
        }
        Ok(())
    }
}

/// Commit timings and volumes, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    pub commits: u64,
    pub last_commit_us: u64,
    pub max_commit_us: u64,
    pub total_commit_us: u64,
    pub last_sync_us: u64,
    pub pages_written: u64,
    pub bytes_written: u64,
    /// Commits [`Store::commit_unless_busy`] left for later because the
    /// background syncer was behind.
    pub deferred: u64,
}

/// What a defragment did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefragReport {
    pub file_bytes_before: u64,
    pub file_bytes_after: u64,
    pub steps: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct LeaseState {
    pub ttl_secs: i64,
    pub remaining_ttl_secs: i64,
    pub keys: BTreeSet<Vec<u8>>,
}

/// Encoded lease value in the lease tree: ttl i64 LE, remaining ttl i64 LE.
pub(crate) fn encode_lease(l: &LeaseState) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&l.ttl_secs.to_le_bytes());
    v.extend_from_slice(&l.remaining_ttl_secs.to_le_bytes());
    v
}

pub(crate) type Registry = Rc<RefCell<BTreeMap<u64, usize>>>;

/// Revision allocator of one write transaction.
struct Tx {
    main: i64,
    sub: i64,
}

impl Tx {
    fn next(&mut self) -> Revision {
        let r = Revision {
            main: self.main,
            sub: self.sub,
        };
        self.sub += 1;
        r
    }
    fn wrote(&self) -> bool {
        self.sub > 0
    }
}

/// Takes an exclusive, non-blocking flock on `f`.
pub(crate) fn flock(f: &File) -> std::io::Result<()> {
    // SAFETY: flock only reads the fd, which `f` keeps open during the call.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// An exclusive lock on a data directory (its `LOCK` file), held while alive.
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<DirLock, OpenError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StorageError::new(&dir.display().to_string(), IoOp::Open, 0, e))?;
        let path = dir.join("LOCK");
        let name = path.display().to_string();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| StorageError::new(&name, IoOp::Open, 0, e))?;
        flock(&file).map_err(|_| OpenError::Locked { file: name })?;
        Ok(DirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The MVCC store of one shard. Owned by one thread; not `Send`.
pub struct Store {
    pub(crate) cfg: Config,
    pub(crate) file: Rc<str>,
    pub(crate) pager: Pager,
    pub(crate) index: Rc<RefCell<Index>>,
    /// The meta of the last completed commit.
    pub(crate) committed: Meta,
    pub(crate) current_rev: i64,
    pub(crate) compact_rev: Rc<Cell<i64>>,
    pub(crate) applied_index: u64,
    /// Records applied since the last commit, in revision order.
    pub(crate) pending: Vec<Rc<Record>>,
    pub(crate) pending_bytes: usize,
    /// Revisions compaction removed that are still in the revision tree.
    pub(crate) pending_deletes: BTreeSet<Revision>,
    pub(crate) leases: BTreeMap<i64, LeaseState>,
    pub(crate) key_lease: HashMap<Vec<u8>, i64, KeyHash>,
    pub(crate) lease_dirty: BTreeSet<i64>,
    pub(crate) snapshots: Registry,
    pub(crate) poisoned: bool,
    pub(crate) stats: CommitStats,
    pub(crate) shrink_wanted: bool,
    pub(crate) meta_writer: MetaWriter,
}

fn storage_err(
    file: &str,
    op: IoOp,
    offset: u64,
) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |e| StorageError::new(file, op, offset, e)
}

impl Store {
    /// Opens (creating if needed) the store of `shard` in `dir`, locking its file.
    pub fn open(dir: &Path, shard: u32, cfg: Config) -> Result<Store, OpenError> {
        let path = Store::file_path(dir, shard);
        let name = path.display().to_string();
        std::fs::create_dir_all(dir).map_err(storage_err(&name, IoOp::Open, 0))?;
        let fs = FileStorage::open(&path).map_err(storage_err(&name, IoOp::Open, 0))?;
        flock(fs.file().expect("a real file"))
            .map_err(|_| OpenError::Locked { file: name.clone() })?;
        match cfg.sync_faults.clone() {
            Some(control) => {
                let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
                let faulty = FaultStorage::new(fs, control, &file.unwrap_or_default());
                Store::open_with(Box::new(faulty), &name, cfg)
            }
            None => Store::open_with(Box::new(fs), &name, cfg),
        }
    }

    /// The file that holds `shard`'s store in `dir`.
    pub fn file_path(dir: &Path, shard: u32) -> PathBuf {
        dir.join(format!("shard-{shard}.mvcc"))
    }

    /// Opens a store on any storage; `name` names it in errors and logs.
    pub fn open_with(
        storage: Box<dyn Storage>,
        name: &str,
        cfg: Config,
    ) -> Result<Store, OpenError> {
        Store::open_inner(storage, name, cfg, false)
    }

    pub(crate) fn open_inner(
        mut storage: Box<dyn Storage>,
        name: &str,
        cfg: Config,
        restoring: bool,
    ) -> Result<Store, OpenError> {
        cfg.validate().map_err(OpenError::Config)?;
        let started = Instant::now();
        let file: Rc<str> = Rc::from(name);
        let mut len = storage.len().map_err(storage_err(name, IoOp::Open, 0))?;
        if len == 0 {
            let meta_bytes = META_PAGES * PAGE_SIZE_BYTES as u64;
            storage
                .set_len(meta_bytes)
                .map_err(storage_err(name, IoOp::Grow, 0))?;
            for txn in 0..META_PAGES {
                let m = Meta {
                    txn,
                    rev_root: 0,
                    lease_root: 0,
                    applied_index: 0,
                    current_rev: 1,
                    compact_rev: 0,
                    flags: if restoring { META_FLAG_RESTORING } else { 0 },
                };
                let off = txn * PAGE_SIZE_BYTES as u64;
                storage.write_at(&m.encode(txn), off).map_err(storage_err(
                    name,
                    IoOp::Write,
                    off,
                ))?;
            }
            storage
                .sync_data()
                .map_err(storage_err(name, IoOp::Sync, 0))?;
            len = meta_bytes;
        }
        if len < META_PAGES * PAGE_SIZE_BYTES as u64 {
            return Err(OpenError::Truncated {
                file: name.to_string(),
                len_bytes: len,
            });
        }
        let mut metas = Vec::new();
        for slot in 0..META_PAGES {
            let mut b = vec![0u8; PAGE_SIZE_BYTES];
            let off = slot * PAGE_SIZE_BYTES as u64;
            storage
                .read_at(&mut b, off)
                .map_err(storage_err(name, IoOp::Read, off))?;
            metas.push(Meta::decode(&b, slot));
        }
        let (meta, slot) = match (&metas[0], &metas[1]) {
            (Ok(a), Ok(b)) => {
                if a.txn >= b.txn {
                    (*a, 0)
                } else {
                    (*b, 1)
                }
            }
            (Ok(a), Err(e)) => {
                tracing::warn!(file = name, fault = %e, "meta page 1 is bad; using page 0");
                (*a, 0)
            }
            (Err(e), Ok(b)) => {
                tracing::warn!(file = name, fault = %e, "meta page 0 is bad; using page 1");
                (*b, 1)
            }
            (Err(a), Err(b)) => {
                return Err(OpenError::NoValidMeta {
                    file: name.to_string(),
                    first: a.to_string(),
                    second: b.to_string(),
                })
            }
        };
        if meta.flags & META_FLAG_RESTORING != 0 && !restoring {
            return Err(OpenError::IncompleteRestore {
                file: name.to_string(),
            });
        }
        let handle = if cfg.background_sync {
            storage.sync_handle()
        } else {
            None
        };
        let meta_writer = MetaWriter::new(name, slot, &meta, handle);
        let storage: SharedStorage = Rc::new(RefCell::new(storage));
        let source = Rc::new(PageSource::new(&storage, &file, None).map_err(storage_err(
            name,
            IoOp::Map,
            0,
        ))?);
        let file_pages = len / PAGE_SIZE_BYTES as u64;
        let pager = Pager {
            storage,
            file: file.clone(),
            source,
            file_pages,
            high_water: META_PAGES,
            free: BTreeSet::new(),
            pending_free: Default::default(),
            dirty: BTreeMap::new(),
            freed_now: Vec::new(),
            txn: meta.txn + 1,
        };
        let mut store = Store {
            cfg,
            file,
            pager,
            index: Rc::new(RefCell::new(Index::default())),
            committed: meta,
            current_rev: meta.current_rev,
            compact_rev: Rc::new(Cell::new(meta.compact_rev)),
            applied_index: meta.applied_index,
            pending: Vec::new(),
            pending_bytes: 0,
            pending_deletes: BTreeSet::new(),
            leases: BTreeMap::new(),
            key_lease: HashMap::default(),
            lease_dirty: BTreeSet::new(),
            snapshots: Rc::new(RefCell::new(BTreeMap::new())),
            poisoned: false,
            stats: CommitStats::default(),
            shrink_wanted: false,
            meta_writer,
        };
        let records = store.rebuild()?;
        tracing::info!(
            file = name,
            applied_index = meta.applied_index,
            revision = meta.current_rev,
            compact_revision = meta.compact_rev,
            records,
            keys = store.index.borrow().len(),
            leases = store.leases.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opened mvcc store"
        );
        Ok(store)
    }

    /// Rebuilds index, lease table and free pages from the committed trees,
    /// checking every reachable page.
    pub(crate) fn rebuild(&mut self) -> Result<u64, OpenError> {
        let file = self.file.clone();
        let src = self.pager.source.clone();
        let file_pages = self.pager.file_pages;
        let mut reachable = vec![false; file_pages as usize];
        let mut beyond = None;
        let mut mark = |id: u64| match reachable.get_mut(id as usize) {
            Some(slot) => *slot = true,
            None => beyond = Some(id),
        };
        let mut index = Index::default();
        let mut key_lease: HashMap<Vec<u8>, i64, KeyHash> = HashMap::default();
        let mut records = 0u64;
        let mut bad_record: Option<(TreeKey, &'static str)> = None;
        let meta = self.committed;
        btree::walk(&src, meta.rev_root, &mut mark, &mut |k, v| {
            records += 1;
            let rec = match RecordView::parse(v) {
                Ok(r) => r,
                Err(what) => {
                    bad_record.get_or_insert((k, what));
                    return Ok(());
                }
            };
            let rev = Revision {
                main: k.0 as i64,
                sub: k.1 as i64,
            };
            if rec.mod_revision() != rev.main || rev.main > meta.current_rev {
                bad_record.get_or_insert((k, "revision disagrees with its key"));
                return Ok(());
            }
            if rec.tombstone() {
                index.tombstone(rec.key(), rev);
                if !key_lease.is_empty() {
                    key_lease.remove(rec.key());
                }
            } else {
                index.restore(rec.key(), rev, rec.create_revision(), rec.version());
                if rec.lease() != 0 {
                    key_lease.insert(rec.key().to_vec(), rec.lease());
                } else if !key_lease.is_empty() {
                    key_lease.remove(rec.key());
                }
            }
            Ok(())
        })?;
        if let Some((k, what)) = bad_record {
            return Err(OpenError::BadRecord {
                file: file.to_string(),
                main: k.0 as i64,
                sub: k.1 as i64,
                what,
            });
        }
        let mut leases = BTreeMap::new();
        btree::walk(&src, meta.lease_root, &mut mark, &mut |k, v| {
            if v.len() != 16 {
                return Err(CorruptPage {
                    file: file.to_string(),
                    page: 0,
                    fault: crate::page::PageFault::Malformed("lease record length"),
                });
            }
            leases.insert(
                k.0 as i64,
                LeaseState {
                    ttl_secs: crate::page::get_i64(v, 0),
                    remaining_ttl_secs: crate::page::get_i64(v, 8),
                    keys: BTreeSet::new(),
                },
            );
            Ok(())
        })?;
        if let Some(id) = beyond {
            return Err(CorruptPage {
                file: file.to_string(),
                page: id,
                fault: crate::page::PageFault::BeyondEnd,
            }
            .into());
        }
        key_lease.retain(|key, id| match leases.get_mut(id) {
            Some(l) => {
                l.keys.insert(key.clone());
                true
            }
            None => {
                tracing::warn!(file = %file, lease = *id, "key attached to an unknown lease");
                false
            }
        });
        // Compaction removes its revisions in the commit that records it, so this
        // finds nothing unless that invariant was broken; then it repairs it.
        let leftovers = index.compact(meta.compact_rev);
        if !leftovers.is_empty() {
            tracing::warn!(file = %file, count = leftovers.len(), "compacted revisions left in the tree; removing");
        }
        let high_water = reachable
            .iter()
            .rposition(|r| *r)
            .map_or(META_PAGES, |p| (p as u64 + 1).max(META_PAGES));
        self.pager.free = (META_PAGES..high_water)
            .filter(|p| !reachable[*p as usize])
            .collect();
        self.pager.high_water = high_water;
        self.pager.pending_free.clear();
        *self.index.borrow_mut() = index;
        self.pending_deletes = leftovers.into_iter().collect();
        self.leases = leases;
        self.key_lease = key_lease;
        Ok(records)
    }

    // ---- accessors -------------------------------------------------------

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }
    /// The applied index of the last commit handed to `commit` (written, and
    /// durable once `durable_index` reaches it).
    pub fn committed_index(&self) -> u64 {
        self.committed.applied_index
    }
    /// The applied index a restart would find.
    pub fn durable_index(&self) -> u64 {
        self.meta_writer.durable_index()
    }

    /// Waits until every commit so far is durable.
    pub fn sync(&mut self) -> Result<(), CommitError> {
        if let Err(e) = self.meta_writer.wait_durable(self.committed.txn) {
            self.poisoned = true;
            return Err(e.into());
        }
        let oldest = self.oldest_snapshot();
        let durable = self.meta_writer.durable_txn();
        self.pager.release_pending(oldest, durable);
        Ok(())
    }
    pub fn current_revision(&self) -> i64 {
        self.current_rev
    }
    pub fn compact_revision(&self) -> i64 {
        self.compact_rev.get()
    }
    pub fn file_name(&self) -> &str {
        &self.file
    }
    /// Size of the file.
    pub fn size_bytes(&self) -> u64 {
        self.pager.file_pages * PAGE_SIZE_BYTES as u64
    }
    /// Bytes of the file holding live pages (trees, meta, pages readers still see).
    pub fn size_in_use_bytes(&self) -> u64 {
        self.pager.used_pages() * PAGE_SIZE_BYTES as u64
    }
    pub fn commit_stats(&self) -> CommitStats {
        self.stats
    }
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
    /// Bytes of records applied since the last commit.
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes
    }
    pub fn key_count(&self) -> usize {
        self.index.borrow().len()
    }
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub(crate) fn view<'a>(&'a self, index: &'a Index, current_rev: i64) -> View<'a> {
        View {
            src: &self.pager.source,
            rev_root: self.committed.rev_root,
            committed_rev: self.committed.current_rev,
            pending: &self.pending,
            index,
            current_rev,
            compact_rev: self.compact_rev.get(),
        }
    }

    // ---- reads ------------------------------------------------------------

    /// A range with etcd's semantics over everything applied so far.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, ReadError> {
        let idx = self.index.borrow();
        self.view(&idx, self.current_rev).range(req)
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

    /// etcd's HashKV: a CRC32 over every record up to `revision` (0: current)
    /// that compaction has kept, in revision order.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv, ReadError> {
        let idx = self.index.borrow();
        let v = self.view(&idx, self.current_rev);
        let at = v.check_rev(revision)?;
        let mut h = crc32fast::Hasher::new();
        v.for_each_record(
            Revision { main: 0, sub: 0 },
            &self.pending_deletes,
            |rev, bytes| {
                if rev.main > at {
                    return false;
                }
                h.update(&rev.main.to_le_bytes());
                h.update(&rev.sub.to_le_bytes());
                h.update(bytes);
                true
            },
        )?;
        Ok(HashKv {
            hash: h.finalize(),
            compact_revision: self.compact_rev.get(),
            hash_revision: at,
            revision: self.current_rev,
        })
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
            &self.pending_deletes,
            |rev, bytes| {
                if out.len() >= max_events {
                    return false;
                }
                match RecordView::parse(bytes) {
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

    // ---- writes -----------------------------------------------------------

    /// Applies Raft entry `index` carrying `op`. Request errors (compacted, key
    /// not found, ...) leave the keyspace unchanged but still advance the applied
    /// index; the entry was applied, its answer is the error.
    pub fn apply(&mut self, index: u64, op: &Op) -> Result<OpResult, ApplyError> {
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
        let r = self.apply_op(op);
        match &r {
            Err(e) if !e.is_request_error() => {
                self.poisoned = true;
                tracing::error!(file = %self.file, index, error = %e, "apply failed; store poisoned");
            }
            _ => self.applied_index = index,
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

    fn apply_op(&mut self, op: &Op) -> Result<OpResult, ApplyError> {
        let mut tx = Tx {
            main: self.current_rev + 1,
            sub: 0,
        };
        let r = match op {
            Op::Put(p) => {
                self.check_put(p)?;
                let mut resp = self.do_put(&mut tx, p)?;
                resp.revision = tx.main;
                OpResult::Put(resp)
            }
            Op::DeleteRange(d) => {
                if d.key.is_empty() {
                    return Err(ApplyError::EmptyKey);
                }
                let mut resp = self.do_delete(&mut tx, d)?;
                resp.revision = if tx.wrote() {
                    tx.main
                } else {
                    self.current_rev
                };
                OpResult::DeleteRange(resp)
            }
            Op::Txn(t) => OpResult::Txn(self.do_txn_top(&mut tx, t)?),
            Op::Compact(c) => OpResult::Compact(self.do_compact(c)?),
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
                    revision: self.current_rev,
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
                    deleted += self.do_delete(&mut tx, &d)?.deleted;
                }
                self.leases.remove(id);
                self.lease_dirty.insert(*id);
                OpResult::LeaseRevoke {
                    revision: if tx.wrote() {
                        tx.main
                    } else {
                        self.current_rev
                    },
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
                    revision: self.current_rev,
                }
            }
        };
        if tx.wrote() {
            self.current_rev = tx.main;
        }
        Ok(r)
    }

    fn check_put(&self, p: &PutRequest) -> Result<(), ApplyError> {
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

    fn read_rev(&self, tx: &Tx) -> i64 {
        if tx.wrote() {
            tx.main
        } else {
            self.current_rev
        }
    }

    fn latest_kv(&self, tx: &Tx, key: &[u8]) -> Result<Option<KeyValue>, ReadError> {
        let at = self.read_rev(tx);
        let idx = self.index.borrow();
        match idx.get(key, at) {
            Some(f) => Ok(Some(self.view(&idx, at).kv(f.modified, false)?)),
            None => Ok(None),
        }
    }

    fn push_record(&mut self, rec: Record) {
        self.pending_bytes += rec.encoded_len();
        self.pending.push(Rc::new(rec));
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
        let at = self.read_rev(tx);
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

    fn do_compact(&mut self, c: &CompactionRequest) -> Result<CompactionResponse, ApplyError> {
        let compact = self.compact_rev.get();
        if c.revision <= compact {
            return Err(ApplyError::Compacted {
                revision: c.revision,
                compact_revision: compact,
            });
        }
        if c.revision > self.current_rev {
            return Err(ApplyError::FutureRevision {
                revision: c.revision,
                current_revision: self.current_rev,
            });
        }
        let removed = self.index.borrow_mut().compact(c.revision);
        tracing::debug!(file = %self.file, revision = c.revision, removed = removed.len(), "compacted");
        self.pending_deletes.extend(removed);
        self.compact_rev.set(c.revision);
        Ok(CompactionResponse {
            revision: self.current_rev,
        })
    }

    fn do_txn_top(&mut self, tx: &mut Tx, t: &TxnRequest) -> Result<TxnResponse, ApplyError> {
        check_txn(t)?;
        let mut path = Vec::new();
        {
            let idx = self.index.borrow();
            let v = self.view(&idx, self.current_rev);
            txn_path(&v, t, &mut path)?;
        }
        let mut pos = 0;
        self.check_txn_path(t, &path, &mut pos)?;
        let mut pos = 0;
        let mut resp = self.do_txn(tx, t, &path, &mut pos)?;
        let rev = if tx.wrote() {
            tx.main
        } else {
            self.current_rev
        };
        set_txn_revision(&mut resp, rev);
        Ok(resp)
    }

    /// Checks the ops of the chosen branches before any runs, so a txn is
    /// applied whole or not at all.
    fn check_txn_path(
        &self,
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
                    self.view(&idx, self.current_rev).check_rev(r.revision)?;
                }
                RequestOp::Txn(nested) => self.check_txn_path(nested, path, pos)?,
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
        let succeeded = path[*pos];
        *pos += 1;
        let ops = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            responses.push(match op {
                RequestOp::Range(r) => {
                    let at = self.read_rev(tx);
                    let idx = self.index.borrow();
                    ResponseOp::Range(self.view(&idx, at).range(r)?)
                }
                RequestOp::Put(p) => ResponseOp::Put(self.do_put(tx, p)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.do_delete(tx, d)?),
                RequestOp::Txn(nested) => ResponseOp::Txn(self.do_txn(tx, nested, path, pos)?),
            });
        }
        Ok(TxnResponse {
            revision: 0,
            succeeded,
            responses,
        })
    }

    // ---- commit -----------------------------------------------------------

    fn has_changes(&self) -> bool {
        !self.pending.is_empty()
            || !self.pending_deletes.is_empty()
            || !self.lease_dirty.is_empty()
            || self.applied_index != self.committed.applied_index
            || self.current_rev != self.committed.current_rev
            || self.compact_rev.get() != self.committed.compact_rev
    }

    /// Writes everything applied since the last commit to the file: pages, sync,
    /// then the meta page, sync. Returns whether anything was written.
    pub fn commit(&mut self) -> Result<bool, CommitError> {
        if self.poisoned {
            return Err(CommitError::Poisoned {
                file: self.file.to_string(),
            });
        }
        if !self.has_changes() {
            return Ok(false);
        }
        self.commit_with(None, 0)?;
        Ok(true)
    }

    /// Like [`Store::commit`], but when committing now would wait for the
    /// background syncer (its queue full, or the pages this commit needs
    /// freed only once an earlier commit is durable), leaves the changes
    /// pending and answers `Ok(false)`, so a slow disk does not stop the
    /// thread that applies. Reads see pending changes as before. Once the
    /// pending changes reach half of `max_batch_bytes` it commits, waiting
    /// if it must, so memory stays bounded.
    pub fn commit_unless_busy(&mut self) -> Result<bool, CommitError> {
        if !self.poisoned
            && !self.meta_writer.has_failed()
            && self.pending_bytes < self.cfg.max_batch_bytes / 2
            && self.commit_would_wait()
        {
            self.stats.deferred += 1;
            return Ok(false);
        }
        self.commit()
    }

    /// Whether a commit now would wait for the background syncer.
    fn commit_would_wait(&self) -> bool {
        let durable = self.meta_writer.durable_txn();
        self.meta_writer
            .would_wait(self.committed.txn.saturating_sub(durable))
            || self.must_wait_for_free_pages(durable)
    }

    /// Whether this commit may need more pages than are free now while
    /// pages freed by commits still syncing would give them back.
    fn must_wait_for_free_pages(&self, durable: u64) -> bool {
        let need_pages = (self.pending_bytes / (PAGE_SIZE_BYTES / 2)
            + self.pending_deletes.len() / 4
            + self.lease_dirty.len()
            + 16) as u64;
        let available =
            self.pager.free.len() as u64 + (self.pager.file_pages - self.pager.high_water);
        available < need_pages
            && self
                .pager
                .pending_free
                .front()
                .is_some_and(|(t, _)| *t > durable)
    }

    pub(crate) fn oldest_snapshot(&self) -> Option<u64> {
        self.snapshots.borrow().keys().next().copied()
    }

    /// The commit machinery; `relocate` moves pages at or past a limit (defragment).
    pub(crate) fn commit_with(
        &mut self,
        relocate: Option<(u64, usize)>,
        flags: u32,
    ) -> Result<(), CommitError> {
        let started = Instant::now();
        let r = self.commit_inner(relocate, flags);
        let elapsed_us = started.elapsed().as_micros() as u64;
        match r {
            Ok(sync_us) => {
                self.stats.commits += 1;
                self.stats.last_commit_us = elapsed_us;
                self.stats.max_commit_us = self.stats.max_commit_us.max(elapsed_us);
                self.stats.total_commit_us += elapsed_us;
                self.stats.last_sync_us = sync_us;
                Ok(())
            }
            Err(e) => {
                self.poisoned = true;
                tracing::error!(file = %self.file, applied_index = self.applied_index, error = %e, "commit failed; store poisoned until reopened");
                Err(e)
            }
        }
    }

    fn rev_mutations(&mut self) -> Vec<Mutation> {
        let pending = std::mem::take(&mut self.pending);
        let deletes = std::mem::take(&mut self.pending_deletes);
        let mut muts: Vec<Mutation> = Vec::with_capacity(pending.len() + deletes.len());
        let mut di = deletes.iter().peekable();
        for rec in &pending {
            while let Some(d) = di.next_if(|d| **d < rec.rev) {
                muts.push(((d.main as u64, d.sub as u64), None));
            }
            if di.next_if(|d| **d == rec.rev).is_some() {
                // Applied and compacted away inside one batch: never stored.
                continue;
            }
            muts.push((
                (rec.rev.main as u64, rec.rev.sub as u64),
                Some(rec.encode()),
            ));
        }
        for d in di {
            muts.push(((d.main as u64, d.sub as u64), None));
        }
        muts
    }

    fn commit_inner(
        &mut self,
        relocate: Option<(u64, usize)>,
        flags: u32,
    ) -> Result<u64, CommitError> {
        // Pages freed by commits still syncing become reusable once those are
        // durable. When this commit may need more than is free now, wait for
        // that rather than grow the file for good.
        if self.must_wait_for_free_pages(self.meta_writer.durable_txn()) {
            self.meta_writer.wait_durable(self.committed.txn)?;
            let oldest = self.oldest_snapshot();
            let durable = self.meta_writer.durable_txn();
            self.pager.release_pending(oldest, durable);
        }
        let txn = self.committed.txn + 1;
        self.pager.txn = txn;
        let muts = self.rev_mutations();
        let mut rev_root = btree::apply(&mut self.pager, self.committed.rev_root, muts)?;
        let lease_muts: Vec<Mutation> = std::mem::take(&mut self.lease_dirty)
            .into_iter()
            .map(|id| ((id as u64, 0), self.leases.get(&id).map(encode_lease)))
            .collect();
        let mut lease_root = btree::apply(&mut self.pager, self.committed.lease_root, lease_muts)?;
        if let Some((limit, budget)) = relocate {
            let mut budget = budget;
            rev_root = btree::relocate(&mut self.pager, rev_root, limit, &mut budget)?;
            lease_root = btree::relocate(&mut self.pager, lease_root, limit, &mut budget)?;
        }
        let meta = Meta {
            txn,
            rev_root,
            lease_root,
            applied_index: self.applied_index,
            current_rev: self.current_rev,
            compact_rev: self.compact_rev.get(),
            flags,
        };
        self.commit_meta(meta)
    }

    /// Writes the commit the pager built, under `meta`, and retires replaced pages.
    pub(crate) fn commit_meta(&mut self, meta: Meta) -> Result<u64, CommitError> {
        let txn = meta.txn;
        let sync_us = self.write_commit(&meta)?;
        self.committed = meta;
        self.pending_bytes = 0;
        let freed = std::mem::take(&mut self.pager.freed_now);
        self.pager.pending_free.push_back((txn, freed));
        let oldest = self.oldest_snapshot();
        let durable = self.meta_writer.durable_txn();
        self.pager.release_pending(oldest, durable);
        if self.shrink_wanted {
            self.shrink()?;
        }
        Ok(sync_us)
    }

    /// Grows the file if needed, writes the dirty pages, syncs, writes the meta, syncs.
    fn write_commit(&mut self, meta: &Meta) -> Result<u64, CommitError> {
        let file = self.file.clone();
        let need = self.pager.high_water;
        let mut remap = false;
        if need > self.pager.file_pages {
            let cur = self.pager.file_pages;
            // Grow by a sixteenth: few remaps, little overshoot.
            let step_bytes = (cur * PAGE_SIZE_BYTES as u64 / 16)
                .clamp(self.cfg.grow_min_bytes, self.cfg.grow_max_bytes);
            let new_pages = need.max(cur + step_bytes / PAGE_SIZE_BYTES as u64);
            let len = new_pages * PAGE_SIZE_BYTES as u64;
            self.pager
                .storage
                .borrow_mut()
                .set_len(len)
                .map_err(storage_err(&file, IoOp::Grow, len))?;
            self.pager.file_pages = new_pages;
            remap = true;
        }
        let dirty = std::mem::take(&mut self.pager.dirty);
        let pages = dirty.len() as u64;
        self.pager.source.forget(dirty.keys().copied());
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        let mut run_next = 0u64;
        const MAX_RUN_BYTES: usize = 1024 * 1024;
        {
            let mut st = self.pager.storage.borrow_mut();
            let mut flush = |run: &mut Vec<u8>, start: u64| -> Result<(), StorageError> {
                if run.is_empty() {
                    return Ok(());
                }
                let off = start * PAGE_SIZE_BYTES as u64;
                st.write_at(run, off)
                    .map_err(storage_err(&file, IoOp::Write, off))?;
                run.clear();
                Ok(())
            };
            for (id, page) in dirty {
                assert!(
                    id >= META_PAGES && id < self.pager.file_pages,
                    "{file}: dirty page {id} outside the file"
                );
                if id != run_next || run.len() >= MAX_RUN_BYTES {
                    flush(&mut run, run_start)?;
                    run_start = id;
                }
                run.extend_from_slice(&page);
                run_next = id + 1;
            }
            flush(&mut run, run_start)?;
        }
        let sync_us = self.meta_writer.commit(&self.pager.storage, *meta)?;
        let sync_us = self.meta_writer.last_sync_us().unwrap_or(sync_us);
        self.stats.pages_written += pages + 1;
        self.stats.bytes_written += (pages + 1) * PAGE_SIZE_BYTES as u64;
        if remap {
            self.remap()?;
        }
        Ok(sync_us)
    }

    fn remap(&mut self) -> Result<(), CommitError> {
        let src = PageSource::new(&self.pager.storage, &self.file, Some(&self.pager.source))
            .map_err(storage_err(&self.file, IoOp::Map, 0))?;
        self.pager.source = Rc::new(src);
        Ok(())
    }

    /// Cuts free pages off the end of the file. Only pages in the free set go:
    /// no meta and no live snapshot can reach them.
    fn shrink(&mut self) -> Result<(), CommitError> {
        let mut hw = self.pager.high_water;
        while hw > META_PAGES && self.pager.free.contains(&(hw - 1)) {
            hw -= 1;
            self.pager.free.remove(&hw);
        }
        self.pager.high_water = hw;
        if hw < self.pager.file_pages {
            let len = hw * PAGE_SIZE_BYTES as u64;
            let file = self.file.clone();
            let mut st = self.pager.storage.borrow_mut();
            st.set_len(len)
                .map_err(storage_err(&file, IoOp::Shrink, len))?;
            st.sync_data()
                .map_err(storage_err(&file, IoOp::Sync, len))?;
            drop(st);
            self.pager.file_pages = hw;
            self.remap()?;
        }
        if self.pager.pending_free.is_empty() {
            self.shrink_wanted = false;
        }
        Ok(())
    }

    /// Copies live pages from the end of the file into free pages nearer the
    /// start, a bounded step per commit, then cuts the file. Snapshots keep
    /// reading throughout; pages they still see are cut by a later commit.
    pub fn defragment(&mut self) -> Result<DefragReport, DefragError> {
        let mut report = DefragReport {
            file_bytes_before: self.size_bytes(),
            ..DefragReport::default()
        };
        self.commit()?;
        self.sync()?;
        loop {
            let live =
                self.pager.used_pages() - META_PAGES - self.pager.pending_free_pages() as u64;
            let target = META_PAGES + live + live / 64 + 8;
            if self.pager.high_water <= target {
                break;
            }
            let before_hw = self.pager.high_water;
            self.shrink_wanted = true;
            self.commit_with(Some((target, self.cfg.defrag_step_pages)), 0)?;
            self.sync()?;
            report.steps += 1;
            if self.pager.high_water >= before_hw || report.steps > 1024 {
                // Nothing more moved (readers hold the old pages); later commits finish.
                break;
            }
        }
        self.shrink_wanted = true;
        if self.pager.pending_free.is_empty() {
            self.shrink().map_err(DefragError::from)?;
        }
        report.file_bytes_after = self.size_bytes();
        tracing::info!(file = %self.file, before = report.file_bytes_before, after = report.file_bytes_after, steps = report.steps, "defragmented");
        Ok(report)
    }

    pub(crate) fn register_snapshot(&self) -> u64 {
        let txn = self.committed.txn;
        *self.snapshots.borrow_mut().entry(txn).or_insert(0) += 1;
        txn
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
    let mut ok = true;
    for c in &t.compare {
        if !v.compare(c)? {
            ok = false;
            break;
        }
    }
    path.push(ok);
    for op in if ok { &t.success } else { &t.failure } {
        if let RequestOp::Txn(nested) = op {
            txn_path(v, nested, path)?;
        }
    }
    Ok(())
}

fn in_range(k: &[u8], start: &[u8], end: &End) -> bool {
    match end {
        End::Single => k == start,
        End::Open => k >= start,
        End::Before(e) => k >= start && k < e.as_slice(),
    }
}

type Dels = Vec<(Vec<u8>, End)>;

fn intersects(dels: &Dels, k: &[u8]) -> bool {
    dels.iter().any(|(s, e)| in_range(k, s, e))
}

/// etcd's rule: within one path a key is put at most once and never inside a
/// range the same path deletes.
/// No limit on the number of ops here: that is the API's `--max-txn-ops`,
/// checked before proposing, and apply must not depend on a member's flags.
fn check_intervals(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Dels), ApplyError> {
    let mut dels: Dels = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) => Some((d.key.clone(), End::from_range_end(&d.range_end))),
            _ => None,
        })
        .collect();
    let mut puts = HashSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (then_puts, then_dels) = check_intervals(&t.success)?;
        let (else_puts, else_dels) = check_intervals(&t.failure)?;
        for k in &then_puts {
            if puts.contains(k) || intersects(&dels, k) {
                return Err(ApplyError::DuplicateKey);
            }
        }
        for k in &else_puts {
            if (puts.contains(k) && !then_puts.contains(k)) || intersects(&dels, k) {
                return Err(ApplyError::DuplicateKey);
            }
        }
        puts.extend(then_puts);
        puts.extend(else_puts);
        dels.extend(then_dels);
        dels.extend(else_dels);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || intersects(&dels, &p.key) {
            return Err(ApplyError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

fn check_txn(t: &TxnRequest) -> Result<(), ApplyError> {
    check_intervals(&t.success)?;
    check_intervals(&t.failure)?;
    Ok(())
}

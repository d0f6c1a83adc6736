//! The store: its configuration, the data directory's lock, opening a file
//! and rebuilding the in-memory state from its trees, and accessors. Applying
//! writes, reads, commits and defragmenting live in the modules below.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use crate::btree::{self, TreeKey};
use crate::error::{IoOp, OpenError, StorageError};
use crate::fault::FaultStorage;
use crate::index::Index;
use crate::page::{CorruptPage, Meta, META_FLAG_RESTORING, META_PAGES, PAGE_SIZE_BYTES};
use crate::pager::{PageSource, Pager, SharedStorage};
use crate::record::{Record, RecordView};
use crate::storage::{FileStorage, Storage};
use crate::syncer::MetaWriter;
use crate::types::*;
use crate::view::View;

mod apply;
pub(crate) mod changes;
mod commit;
mod compaction;
mod defrag;
pub use defrag::{DefragProgress, DefragRun};
mod parts;
mod read;
pub(crate) use read::RemovedRevisions;
mod steps;
mod txn_check;
pub use steps::Step;
pub(crate) mod txn_records;
pub use txn_records::MAX_TXN_RECORD_BYTES;

/// Each leased key's lease, for detaching a key when it is overwritten or
/// deleted. Clients choose the keys, so they are hashed with std's SipHash
/// under a random key: a hash whose only secret is its starting value can
/// let keys be built that collide whatever that value is (the test below
/// builds such keys), and every put to one of them would scan them all.
pub(crate) type KeyLeases = HashMap<Vec<u8>, i64>;

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
    /// Most records, and about the most page bytes, one step of a commit
    /// takes on ([`Store::commit_step`]); a whole commit takes no steps.
    pub commit_step_records: usize,
    pub commit_step_bytes: usize,
    /// Keys one step of a compaction's pass over the key index compacts
    /// ([`Store::compaction_step`]).
    pub compact_step_keys: usize,
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
            commit_step_records: 64,
            commit_step_bytes: 32 * 1024,
            compact_step_keys: 2048,
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
        if self.commit_step_records == 0 || self.commit_step_bytes == 0 {
            return Err("commit_step_records and commit_step_bytes must be positive".into());
        }
        if self.compact_step_keys == 0 {
            return Err("compact_step_keys must be positive".into());
        }
        Ok(())
    }
}

/// How long a defragment step waiting for the syncer holds the owner's
/// commits back after it last asked.
pub(crate) const DEFRAG_PRIORITY: std::time::Duration = std::time::Duration::from_secs(1);
/// How long after a failed grow ahead the store asks for none.
pub(crate) const GROW_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// background syncer was behind or growing the file.
    pub deferred: u64,
    /// Times the file grew on the syncer, ahead of need.
    pub grown_ahead: u64,
    /// Times a commit grew the file itself: storages without a syncer, or a
    /// commit that could not wait for one.
    pub grown_inline: u64,
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
    /// The revision the store has reached: every record has a main revision
    /// at or below it, and no entry at or below it remains to be applied.
    /// `apply` moves it to each revision it writes, `apply_at` to the
    /// revision of each entry, written or not; reads at 0 read here, reads
    /// and compactions up to it are valid.
    pub(crate) current_rev: i64,
    pub(crate) compact_rev: Rc<Cell<i64>>,
    pub(crate) applied_index: u64,
    /// Records applied since the last commit, in revision order.
    pub(crate) pending: Vec<Rc<Record>>,
    pub(crate) pending_bytes: usize,
    /// Revisions compaction removed that are still in the revision tree.
    /// Shared with the readers that outlive this state (snapshot streams,
    /// HashKVs), never copied for them; changed only when a compaction's
    /// pass ends.
    pub(crate) pending_deletes: Rc<BTreeSet<Revision>>,
    /// A compaction's pass over the key index, while under way: it gathers
    /// the revisions it drops, and adds them to `pending_deletes` when it
    /// ends.
    pub(crate) compaction: Option<compaction::IndexPass>,
    /// The revision of the last compaction whose pass ended, its drops
    /// handed to `pending_deletes`; and the highest such revision a
    /// finished commit took the drops of ([`Store::compacted_out_through`]).
    pub(crate) handed_over_at: i64,
    pub(crate) removed_through: i64,
    pub(crate) leases: BTreeMap<i64, LeaseState>,
    pub(crate) key_lease: KeyLeases,
    pub(crate) lease_dirty: BTreeSet<i64>,
    /// The records of cross-shard txns still open, by id (the txn's
    /// revision), uncommitted puts and removes included; shared with the
    /// snapshot streams taken meanwhile.
    pub(crate) txn_records: BTreeMap<i64, Rc<[u8]>>,
    /// Txn record ids put or removed since the last commit.
    pub(crate) txn_dirty: BTreeSet<i64>,
    pub(crate) snapshots: Registry,
    pub(crate) poisoned: bool,
    pub(crate) stats: CommitStats,
    pub(crate) shrink_wanted: bool,
    /// When a defragment step last found the syncer busy (its queue full,
    /// or pages still syncing): the owner's commits hold back until the
    /// step goes ahead, so that on a slow disk they cannot take every turn
    /// the syncer gives, for at most [`DEFRAG_PRIORITY`] after the step
    /// last asked (a run dropped part-way holds nothing back for long).
    pub(crate) defrag_waiting: Option<Instant>,
    /// When a grow ahead of need last failed: none is asked for again for
    /// [`GROW_RETRY_AFTER`], so a commit short of room grows the file
    /// itself and reports the disk's error.
    pub(crate) grow_failed: Option<Instant>,
    /// Pages the last commit moved below a defragment's limit.
    pub(crate) relocated_pages: usize,
    pub(crate) meta_writer: MetaWriter,
    /// The commit running in steps, if any (`steps.rs`).
    pub(crate) running: Option<Box<steps::Running>>,
    /// Applied records not yet taken by the change consumer, while capturing.
    /// While capturing: the revision the store had when the window began
    /// (capture turned on, or the last take), and the changes since.
    pub(crate) captured: Option<(i64, Vec<changes::Change>)>,
}

fn storage_err(
    file: &str,
    op: IoOp,
    offset: u64,
) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |e| StorageError::new(file, op, offset, e)
}

/// The store file at `path`, behind the fault control when `cfg` names one.
pub(crate) fn under_faults(fs: FileStorage, path: &Path, cfg: &Config) -> Box<dyn Storage> {
    match cfg.sync_faults.clone() {
        Some(control) => {
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
            Box::new(FaultStorage::new(fs, control, &file.unwrap_or_default()))
        }
        None => Box::new(fs),
    }
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
        let storage = under_faults(fs, &path, &cfg);
        Store::open_with(storage, &name, cfg)
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
                    txn_root: 0,
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
            pending_deletes: Rc::default(),
            compaction: None,
            handed_over_at: meta.compact_rev,
            removed_through: meta.compact_rev,
            leases: BTreeMap::new(),
            key_lease: KeyLeases::default(),
            lease_dirty: BTreeSet::new(),
            txn_records: BTreeMap::new(),
            txn_dirty: BTreeSet::new(),
            snapshots: Rc::new(RefCell::new(BTreeMap::new())),
            poisoned: false,
            stats: CommitStats::default(),
            shrink_wanted: false,
            defrag_waiting: None,
            grow_failed: None,
            relocated_pages: 0,
            meta_writer,
            running: None,
            captured: None,
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
            txn_records = store.txn_records.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opened mvcc store"
        );
        Ok(store)
    }

    /// Rebuilds index, lease table, txn records and free pages from the
    /// committed trees, checking every reachable page. Every tree must be
    /// walked: a page none of them reaches is free and will be reused.
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
        let mut key_lease = KeyLeases::default();
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
        let mut txn_records = BTreeMap::new();
        btree::walk(&src, meta.txn_root, &mut mark, &mut |k, v| {
            if k.1 != 0 {
                return Err(CorruptPage {
                    file: file.to_string(),
                    page: 0,
                    fault: crate::page::PageFault::Malformed("txn record key"),
                });
            }
            txn_records.insert(k.0 as i64, Rc::from(v));
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
        // A compaction's pass over the index goes on in steps after the
        // commit that records its revision (`store/compaction.rs`): a store
        // closed (or a snapshot taken) before the pass ended still holds
        // revisions it drops. The pass is taken whole here.
        let leftovers = index.compact(meta.compact_rev);
        if !leftovers.is_empty() {
            tracing::info!(file = %file, count = leftovers.len(), "compacted revisions left in the tree; removing");
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
        self.pending_deletes = Rc::new(leftovers.into_iter().collect());
        self.compaction = None;
        self.handed_over_at = meta.compact_rev;
        self.removed_through = meta.compact_rev;
        self.leases = leases;
        self.key_lease = key_lease;
        self.txn_records = txn_records;
        self.txn_dirty.clear();
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

    /// Closes a store that is being thrown away (replaced by a snapshot's):
    /// unlike dropping it, does not wait for its sync thread to finish the
    /// syncs it has queued; the thread finishes them and closes the file on
    /// its own. What the store holds need not be durable after this.
    pub fn discard(mut self) {
        self.meta_writer.detach();
    }

    /// The revision the store has reached: the newest revision a read or a
    /// compaction may name, the one a read at revision 0 sees, and the one
    /// read answers report. With [`Store::apply`] alone it is the revision
    /// of the last write (etcd's current revision); with
    /// [`Store::apply_at`] it is the revision of the last applied entry,
    /// which may have written nothing here.
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
    /// Bytes of records applied and txn records put since the last commit.
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

    pub(crate) fn register_snapshot(&self) -> u64 {
        let txn = self.committed.txn;
        *self.snapshots.borrow_mut().entry(txn).or_insert(0) += 1;
        txn
    }
}

#[cfg(test)]
mod tests {
    use super::KeyLeases;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    /// Keys of `pairs` 16-byte blocks, one for each way of flipping, in each
    /// block, bit 63 of its first 8-byte word and bit 22 of its second: under
    /// a multiply-xor hash seeded only by its start value, all of them
    /// collide, whatever the seed.
    fn colliding_under_multiply_xor(pairs: usize) -> Vec<Vec<u8>> {
        (0..1u32 << pairs)
            .map(|n| {
                let mut key: Vec<u8> = (0..16 * pairs)
                    .map(|i| (i as u8).wrapping_mul(37))
                    .collect();
                for p in 0..pairs {
                    if n & (1 << p) != 0 {
                        key[16 * p + 7] ^= 0x80;
                        key[16 * p + 10] ^= 0x40;
                    }
                }
                key
            })
            .collect()
    }

    #[test]
    fn leased_keys_chosen_to_collide_spread_over_the_map() {
        let keys = colliding_under_multiply_xor(12);
        for _ in 0..4 {
            let map = KeyLeases::default();
            let hashes: Vec<u64> = keys.iter().map(|k| map.hasher().hash_one(k)).collect();
            let distinct: HashSet<u64> = hashes.iter().copied().collect();
            assert_eq!(distinct.len(), keys.len(), "full 64-bit hashes collide");
            // The buckets of a 4,096-slot table (the low bits) and the tags
            // (the top 7 bits): about evenly filled.
            let mut buckets = vec![0u32; 4096];
            let mut tags = vec![0u32; 128];
            for h in &hashes {
                buckets[(h & 4095) as usize] += 1;
                tags[(h >> 57) as usize] += 1;
            }
            let fullest = buckets.iter().max().copied().unwrap_or(0);
            assert!(fullest <= 12, "{fullest} keys in one bucket of 4,096");
            let (least, most) = (tags.iter().min().unwrap(), tags.iter().max().unwrap());
            assert!(
                *least >= 4 && *most <= 72,
                "tags from {least} to {most} keys"
            );
        }
    }
}

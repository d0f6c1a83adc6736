//! The log itself: its state, open, group-commit appends and release;
//! forming batches, flushing them, the shard index, reads, recovery, spares
//! and the backend choice live in the modules below.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::info;

use crate::buf::AlignedBuf;
use crate::config::Config;
use crate::error::{AppendError, OpenError, Poison};
use crate::record::{Entry, HardState, Lsn, Record, ShardId};
use crate::storage::{Storage, StorageFile};

mod backend;
mod batch;
mod flush;
mod index;
mod pacing;
mod read;
mod recover;
mod spares;
use backend::lock_dir;
pub use backend::{select_storage, LOCK_FILE_NAME};
use flush::flusher;
use recover::recover;
use spares::maintenance;

/// File name of segment `seq` whose first record has LSN `first_lsn`:
/// `{seq:016x}-{first_lsn:016x}.wal`, so a directory listing sorts in log order.
pub fn segment_name(seq: u64, first_lsn: Lsn) -> String {
    format!("{seq:016x}-{first_lsn:016x}.wal")
}

pub(crate) fn parse_segment_name(name: &str) -> Option<(u64, Lsn)> {
    let stem = name.strip_suffix(".wal")?;
    let (a, b) = stem.split_once('-')?;
    if a.len() != 16 || b.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

fn spare_name(id: u64) -> String {
    format!("spare-{id:016x}.tmp")
}

fn parse_spare_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("spare-")?.strip_suffix(".tmp")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

/// What recovery found for one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveredShard {
    /// The last hard state written, if any.
    pub hard_state: Option<HardState>,
    /// Live entries in index order: truncated suffixes removed.
    pub entries: Vec<Entry>,
}

/// What `open` found on disk.
#[derive(Debug, Default)]
pub struct Recovered {
    pub shards: BTreeMap<ShardId, RecoveredShard>,
    /// LSN of the last record recovered (0: empty log).
    pub last_lsn: Lsn,
    /// Where a torn tail was cut, if one was: (file, offset, reason).
    pub torn_tail: Option<(PathBuf, u64, String)>,
}

/// Counters and histograms of the flush path, for a metrics layer.
#[derive(Debug, Clone)]
pub struct WalMetrics {
    pub appends: u64,
    pub records: u64,
    pub flushes: u64,
    pub bytes_written: u64,
    pub segments_started: u64,
    pub segments_recycled: u64,
    /// Segment starts that found no spare ready and waited for one.
    pub spare_waits: u64,
    /// Bytes of zeros written to prepare spares.
    pub zero_fill_bytes: u64,
    /// Of those, bytes written because the log was about to need the spare
    /// (kept ahead of a busy log, or needed at once); the rest went out
    /// while the log was idle.
    pub zero_fill_busy_bytes: u64,
    /// Duration of each flush, write submitted to data durable, in microseconds.
    pub flush_latency_us: Histogram<u64>,
    /// Appends completed per flush.
    pub batch_appends: Histogram<u64>,
    /// Bytes written per flush.
    pub batch_bytes: Histogram<u64>,
}

impl WalMetrics {
    fn new() -> WalMetrics {
        let h = |max| Histogram::new_with_bounds(1, max, 3).expect("histogram bounds are valid");
        WalMetrics {
            appends: 0,
            records: 0,
            flushes: 0,
            bytes_written: 0,
            segments_started: 0,
            segments_recycled: 0,
            spare_waits: 0,
            zero_fill_bytes: 0,
            zero_fill_busy_bytes: 0,
            flush_latency_us: h(60_000_000),
            batch_appends: h(1 << 24),
            batch_bytes: h(1 << 32),
        }
    }
}

/// A callback run after every durable flush (metrics layers hook in here).
pub type FlushObserver = Box<dyn FnMut(&FlushEvent)>;

/// Reported to the flush observer after each durable flush.
#[derive(Debug, Clone, Copy)]
pub struct FlushEvent {
    pub appends: u32,
    pub records: u32,
    pub bytes: usize,
    pub latency: Duration,
    pub durable_lsn: Lsn,
}

#[derive(Clone)]
struct Durable {
    lsn: Lsn,
    poison: Option<Rc<Poison>>,
}

#[derive(Clone)]
struct EntryMeta {
    index: u64,
    term: u64,
    lsn: Lsn,
    seq: u64,
    offset: u64,
    len: u32,
    data: Option<Bytes>,
}

#[derive(Default)]
struct ShardLog {
    hard_state: Option<HardState>,
    entries: VecDeque<EntryMeta>,
    released: u64,
}

impl ShardLog {
    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|e| e.index)
    }
}

struct SegMeta {
    name: String,
    file: Option<Rc<dyn StorageFile>>,
    /// Highest live entry index per shard in this segment.
    max_index: HashMap<ShardId, u64>,
    sealed: bool,
}

struct Batch {
    seq: u64,
    start: u64,
    buf: AlignedBuf,
    /// Index in `buf` of the batch record (after the header block on a
    /// segment's first batch).
    rec_at: usize,
    last_lsn: Lsn,
    /// Set on the first batch of a segment: the name it gets.
    new_segment: Option<String>,
    seal: bool,
    closed: bool,
    appends: u32,
    records: u32,
}

struct Cursor {
    seq: u64,
    /// Next free byte of segment `seq`.
    offset: u64,
    /// Whether segment `seq` has its header and hard states queued.
    started: bool,
}

struct State {
    next_lsn: Lsn,
    durable_lsn: Lsn,
    cursor: Cursor,
    batches: VecDeque<Batch>,
    segments: BTreeMap<u64, SegMeta>,
    shards: HashMap<ShardId, ShardLog>,
    cache_fifo: VecDeque<(ShardId, u64, Lsn)>,
    cache_bytes: usize,
    /// Spares zero-filled and synced: ready to become the next segment.
    spares: VecDeque<String>,
    /// Spares whose bytes are not known to be zero (recycled segments, spares
    /// found at open); zero-filled before they join `spares`, so the space
    /// past the end of the log always reads as zeros (see FORMAT.md).
    dirty_spares: VecDeque<String>,
    next_spare_id: u64,
    spare_error: Option<io::Error>,
    /// Segments started in memory whose first batch has not yet taken a
    /// spare: they claim the ready spares before any later segment.
    segments_awaiting_spare: u64,
    /// Bytes of the spare being zero-filled still to write (None: no
    /// zero-fill under way, or only its closing sync).
    zero_fill_left_bytes: Option<u64>,
    /// Whether a batch is being written and synced.
    flush_in_flight: bool,
    /// When the last flush ended (or the log opened): idleness for zero-filling.
    last_flush_end: Instant,
    to_recycle: VecDeque<String>,
    poison: Option<Rc<Poison>>,
    closed: bool,
    metrics: WalMetrics,
    buf_pool: Vec<AlignedBuf>,
}

const BUF_POOL_MAX: usize = 4;
const INITIAL_BATCH_CAPACITY_BYTES: usize = 64 << 10;

struct Inner {
    cfg: Config,
    storage: Rc<dyn Storage>,
    st: RefCell<State>,
    durable_tx: watch::Sender<Durable>,
    flush_wake: Notify,
    space_wake: Notify,
    spare_ready: Notify,
    maint_wake: Notify,
    /// Wakes a paced zero-fill when it falls due (see `pacing`).
    zero_wake: Notify,
    observer: RefCell<Option<FlushObserver>>,
    /// Held while the log is open so no second opener writes the same directory.
    _lock: Option<std::fs::File>,
}

/// One core's write-ahead log. Not `Send`: it lives on its core's `LocalSet`
/// (its flush and maintenance tasks are spawned there at open).
pub struct Wal {
    inner: Rc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Wal {
    /// Opens (or creates) the WAL in `cfg.dir` with the configured backend and
    /// recovers its contents. Must be called inside a `LocalSet`.
    pub async fn open(cfg: Config) -> Result<(Wal, Recovered), OpenError> {
        cfg.validate()?;
        let lock = lock_dir(&cfg.dir)?;
        let mut storage = select_storage(&cfg)?;
        if let Some(control) = &cfg.disk_faults {
            let name = cfg.dir.file_name().unwrap_or_default().to_string_lossy();
            storage = std::rc::Rc::new(crate::fault::FaultStorage::new(
                storage,
                control.clone(),
                &name,
            ));
        }
        Wal::open_inner(cfg, storage, Some(lock)).await
    }

    /// Opens over a given storage (tests, the tuning lab).
    /// Takes no directory lock: the caller owns the storage.
    pub async fn open_with_storage(
        cfg: Config,
        storage: Rc<dyn Storage>,
    ) -> Result<(Wal, Recovered), OpenError> {
        Wal::open_inner(cfg, storage, None).await
    }

    async fn open_inner(
        cfg: Config,
        storage: Rc<dyn Storage>,
        lock: Option<std::fs::File>,
    ) -> Result<(Wal, Recovered), OpenError> {
        cfg.validate()?;
        let (state, recovered) = recover(&cfg, storage.as_ref()).await?;
        info!(
            backend = %storage.describe(),
            dir = %cfg.dir.display(),
            last_lsn = recovered.last_lsn,
            shards = recovered.shards.len(),
            segments = state.segments.len(),
            "wal opened"
        );
        let durable = state.durable_lsn;
        let (durable_tx, _) = watch::channel(Durable {
            lsn: durable,
            poison: None,
        });
        let inner = Rc::new(Inner {
            cfg,
            storage,
            st: RefCell::new(state),
            durable_tx,
            flush_wake: Notify::new(),
            space_wake: Notify::new(),
            spare_ready: Notify::new(),
            maint_wake: Notify::new(),
            zero_wake: Notify::new(),
            observer: RefCell::new(None),
            _lock: lock,
        });
        let tasks = vec![
            tokio::task::spawn_local(flusher(inner.clone())),
            tokio::task::spawn_local(maintenance(inner.clone())),
        ];
        Ok((Wal { inner, tasks }, recovered))
    }

    /// Appends `records` and resolves once all of them are durable, with the
    /// LSN of the last one. Concurrent appends share flushes (group commit).
    pub async fn append(&self, records: &[Record]) -> Result<Lsn, AppendError> {
        let target = self.submit(records).await?;
        let mut rx = self.inner.durable_tx.subscribe();
        let d = rx
            .wait_for(|d| d.lsn >= target || d.poison.is_some())
            .await
            .map(|d| d.clone())
            .map_err(|_| AppendError::Closed)?;
        if d.lsn >= target {
            Ok(target)
        } else {
            let p = d.poison.expect("woken without durability means poisoned");
            Err(AppendError::from(p.as_ref()))
        }
    }

    /// Queues `records` for the next flush and returns the LSN of the last
    /// one without waiting for it to be durable: it is durable once
    /// [`Wal::durable_lsn`] (or a [`DurableWatch`]) reaches it. Records become
    /// durable in the order they were submitted. Waits only while the queue
    /// is full.
    pub async fn submit(&self, records: &[Record]) -> Result<Lsn, AppendError> {
        let inner = &self.inner;
        for r in records {
            if r.payload_len() > inner.cfg.max_record_payload_bytes {
                return Err(AppendError::RecordTooLarge {
                    shard: r.shard(),
                    bytes: r.payload_len(),
                    max_bytes: inner.cfg.max_record_payload_bytes,
                });
            }
        }
        loop {
            {
                let st = inner.st.borrow();
                if let Some(p) = &st.poison {
                    return Err(AppendError::from(p.as_ref()));
                }
                if st.closed {
                    return Err(AppendError::Closed);
                }
                if st.queued_bytes() < inner.cfg.max_queued_bytes {
                    break;
                }
            }
            inner.space_wake.notified().await;
        }
        let target = {
            let mut st = inner.st.borrow_mut();
            let new_shards = records
                .iter()
                .map(|r| r.shard())
                .filter(|s| !st.shards.contains_key(s))
                .collect::<std::collections::BTreeSet<_>>();
            if st.shards.len() + new_shards.len() > inner.cfg.max_shards {
                let shard = *new_shards.iter().next().expect("a new shard");
                return Err(AppendError::TooManyShards {
                    shard,
                    max_shards: inner.cfg.max_shards,
                });
            }
            for r in records {
                st.push_record(&inner.cfg, r);
            }
            st.metrics.appends += 1;
            st.metrics.records += records.len() as u64;
            if let Some(b) = st.batches.back_mut() {
                b.appends += 1;
            }
            st.next_lsn - 1
        };
        inner.flush_wake.notify_one();
        Ok(target)
    }

    /// LSN of the last durable record.
    pub fn durable_lsn(&self) -> Lsn {
        self.inner.st.borrow().durable_lsn
    }

    /// LSN of the last appended record (durable or not).
    pub fn last_lsn(&self) -> Lsn {
        self.inner.st.borrow().next_lsn - 1
    }

    /// A watch of the durable LSN, for tasks that wait on durability without appending.
    pub fn durable_watch(&self) -> DurableWatch {
        DurableWatch {
            rx: self.inner.durable_tx.subscribe(),
        }
    }

    /// Why the log refuses appends, if it does.
    pub fn poisoned(&self) -> Option<Poison> {
        self.inner.st.borrow().poison.as_deref().cloned()
    }

    /// First and last index of `shard`'s retained entries, if it has any.
    pub fn index_range(&self, shard: ShardId) -> Option<(u64, u64)> {
        let st = self.inner.st.borrow();
        let log = st.shards.get(&shard)?;
        Some((log.entries.front()?.index, log.entries.back()?.index))
    }

    /// The last hard state appended for `shard`.
    pub fn hard_state(&self, shard: ShardId) -> Option<HardState> {
        self.inner.st.borrow().shards.get(&shard)?.hard_state
    }

    /// Says `shard` no longer needs entries up to `index` (applied and
    /// snapshotted). Segments every shard has moved past are recycled.
    pub fn release(&self, shard: ShardId, index: u64) {
        let mut st = self.inner.st.borrow_mut();
        let Some(log) = st.shards.get_mut(&shard) else {
            return;
        };
        if index <= log.released {
            return;
        }
        log.released = index;
        let mut freed = 0usize;
        while log.entries.front().is_some_and(|e| e.index <= index) {
            let e = log.entries.pop_front().expect("front exists");
            freed += e.data.map_or(0, |d| d.len());
        }
        st.cache_bytes -= freed;
        if st.collect_releasable() > 0 {
            self.inner.maint_wake.notify_one();
        }
    }

    /// A copy of the flush metrics.
    pub fn metrics(&self) -> WalMetrics {
        self.inner.st.borrow().metrics.clone()
    }

    /// Calls `observer` after every durable flush (replacing any previous one).
    pub fn set_flush_observer(&self, observer: FlushObserver) {
        *self.inner.observer.borrow_mut() = Some(observer);
    }

    /// Human description of the backend in use.
    pub fn backend(&self) -> String {
        self.inner.storage.describe()
    }

    /// Segment file names in log order (for operators and tests).
    pub fn segment_names(&self) -> Vec<String> {
        self.inner
            .st
            .borrow()
            .segments
            .values()
            .map(|s| s.name.clone())
            .collect()
    }

    /// Spare segment names ready for use.
    pub fn spare_names(&self) -> Vec<String> {
        self.inner.st.borrow().spares.iter().cloned().collect()
    }

    /// Waits until background work (recycling, zero-filling spares) is idle.
    /// Spares are zero-filled at full speed once no flush has run for a
    /// moment, so this returns soon after appends stop.
    pub async fn settle(&self) {
        loop {
            {
                let st = self.inner.st.borrow();
                let idle = st.to_recycle.is_empty()
                    && (st.dirty_spares.is_empty()
                        || st.spare_error.is_some()
                        || st.poison.is_some())
                    && (st.spares.len() >= self.inner.cfg.spare_segments
                        || st.spare_error.is_some()
                        || st.poison.is_some());
                if idle && st.batches.is_empty() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Flushes what is queued and stops the background tasks.
    pub async fn close(mut self) {
        self.inner.st.borrow_mut().closed = true;
        self.inner.flush_wake.notify_one();
        self.inner.maint_wake.notify_one();
        self.inner.zero_wake.notify_one();
        self.inner.spare_ready.notify_one();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.inner.st.borrow_mut().closed = true;
        self.inner.flush_wake.notify_one();
        self.inner.maint_wake.notify_one();
        self.inner.zero_wake.notify_one();
        self.inner.spare_ready.notify_one();
    }
}

/// Follows the durable LSN.
pub struct DurableWatch {
    rx: watch::Receiver<Durable>,
}

impl DurableWatch {
    pub fn durable_lsn(&self) -> Lsn {
        self.rx.borrow().lsn
    }
    /// Resolves when `lsn` is durable; `false` if the log was poisoned first.
    pub async fn wait_for(&mut self, lsn: Lsn) -> bool {
        match self
            .rx
            .wait_for(|d| d.lsn >= lsn || d.poison.is_some())
            .await
        {
            Ok(d) => d.lsn >= lsn,
            Err(_) => false,
        }
    }
}

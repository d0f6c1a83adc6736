//! The log itself: group commit, segments and release; reads, recovery,
//! spares and the backend choice live in the modules below.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, error, info};

use crate::buf::{AlignedBuf, BLOCK_BYTES};
use crate::config::Config;
use crate::error::{AppendError, OpenError, Poison};
use crate::record::{
    self, Entry, HardState, Lsn, Record, SegmentHeader, ShardId, BATCH_RECORD_BYTES,
    SEGMENT_DATA_OFFSET,
};
use crate::storage::{Storage, StorageFile};

mod backend;
mod read;
mod recover;
mod spares;
use backend::lock_dir;
pub use backend::{select_storage, LOCK_FILE_NAME};
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
            storage = std::rc::Rc::new(crate::fault::FaultStorage::new(storage, control.clone()));
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

impl State {
    fn queued_bytes(&self) -> usize {
        self.batches.iter().map(|b| b.buf.len()).sum()
    }

    fn take_buf(&mut self) -> AlignedBuf {
        self.buf_pool
            .pop()
            .unwrap_or_else(|| AlignedBuf::with_capacity(INITIAL_BATCH_CAPACITY_BYTES))
    }

    fn open_batch(&mut self) -> &mut Batch {
        let open = self
            .batches
            .back()
            .is_some_and(|b| !b.closed && b.seq == self.cursor.seq);
        if !open {
            let mut buf = self.take_buf();
            let start = self.cursor.offset;
            // A segment's first batch starts with the header block; its batch
            // record follows that (see `start_segment`).
            let rec_at = if self.cursor.offset as usize >= SEGMENT_DATA_OFFSET {
                let at = record::reserve_batch_record(&mut buf);
                self.cursor.offset += BATCH_RECORD_BYTES as u64;
                at
            } else {
                SEGMENT_DATA_OFFSET
            };
            self.batches.push_back(Batch {
                seq: self.cursor.seq,
                start,
                buf,
                rec_at,
                last_lsn: 0,
                new_segment: None,
                seal: false,
                closed: false,
                appends: 0,
                records: 0,
            });
        }
        self.batches.back_mut().expect("batch just ensured")
    }

    /// Closes the open batch: pads it to a block boundary and fills in its
    /// batch record.
    fn close_open_batch(&mut self) {
        if let Some(b) = self.batches.back_mut().filter(|b| !b.closed) {
            record::finish_batch(&mut b.buf, b.seq, b.start as usize, b.rec_at);
            b.closed = true;
            self.cursor.offset = b.start + b.buf.len() as u64;
        }
    }

    fn start_segment(&mut self, cfg: &Config) {
        debug_assert!(!self.cursor.started);
        self.close_open_batch();
        let seq = self.cursor.seq;
        let first_lsn = self.next_lsn;
        let name = segment_name(seq, first_lsn);
        self.cursor.offset = 0;
        let b = self.open_batch();
        b.new_segment = Some(name.clone());
        SegmentHeader {
            seq,
            first_lsn,
            segment_size_bytes: cfg.segment_size_bytes,
        }
        .encode(&mut b.buf);
        let rec_at = record::reserve_batch_record(&mut b.buf);
        debug_assert_eq!(rec_at, b.rec_at);
        self.cursor.offset = (SEGMENT_DATA_OFFSET + BATCH_RECORD_BYTES) as u64;
        self.cursor.started = true;
        self.segments.insert(
            seq,
            SegMeta {
                name,
                file: None,
                max_index: HashMap::new(),
                sealed: false,
            },
        );
        self.metrics.segments_started += 1;
        // Every segment restates each shard's hard state, so releasing older
        // segments never loses the latest one.
        let mut states: Vec<(ShardId, HardState)> = self
            .shards
            .iter()
            .filter_map(|(s, l)| l.hard_state.map(|h| (*s, h)))
            .collect();
        states.sort_unstable_by_key(|(s, _)| *s);
        for (shard, state) in states {
            let rec = Record::HardState { shard, state };
            let b = self.batches.back_mut().expect("segment batch open");
            record::encode(&mut b.buf, seq, &rec);
            b.records += 1;
            b.last_lsn = self.next_lsn;
            self.cursor.offset += rec.encoded_len() as u64;
            self.next_lsn += 1;
        }
    }

    fn seal_segment(&mut self) {
        let seq = self.cursor.seq;
        let b = self.open_batch();
        record::encode_seal(&mut b.buf, seq);
        record::finish_batch(&mut b.buf, seq, b.start as usize, b.rec_at);
        b.seal = true;
        b.closed = true;
        self.cursor = Cursor {
            seq: seq + 1,
            offset: 0,
            started: false,
        };
    }

    /// Encodes `rec` into the open batch and updates the in-memory index.
    fn push_record(&mut self, cfg: &Config, rec: &Record) -> Lsn {
        let size = rec.encoded_len();
        let seg_size = cfg.segment_size_bytes as usize;
        loop {
            if !self.cursor.started {
                self.start_segment(cfg);
            }
            self.open_batch();
            let off = self.cursor.offset as usize;
            if off + size + cfg.seal_reserve_bytes() > seg_size {
                assert!(
                    off as u64 > cfg.segment_overhead_bytes(),
                    "record of {size} bytes does not fit an empty segment of {seg_size} bytes"
                );
                self.seal_segment();
                continue;
            }
            let full = self.batches.back().is_some_and(|b| {
                !b.closed && b.buf.len() + size + cfg.pad_reserve_bytes() > cfg.max_batch_bytes
            });
            if full {
                self.close_open_batch();
                continue;
            }
            break;
        }
        let seq = self.cursor.seq;
        let offset = self.cursor.offset;
        let lsn = self.next_lsn;
        let b = self.open_batch();
        debug_assert_eq!(b.start + b.buf.len() as u64, offset);
        record::encode(&mut b.buf, seq, rec);
        b.records += 1;
        b.last_lsn = lsn;
        self.cursor.offset += size as u64;
        self.next_lsn += 1;
        self.apply(rec, lsn, seq, offset, size as u32, true);
        lsn
    }

    /// Applies a record to the shard index (appends and recovery alike).
    fn apply(&mut self, rec: &Record, lsn: Lsn, seq: u64, offset: u64, len: u32, cache: bool) {
        match rec {
            Record::Entry {
                shard,
                index,
                term,
                data,
            } => {
                let log = self.shards.entry(*shard).or_default();
                match log.last_index() {
                    Some(last) if *index <= last => self.truncate(*shard, *index),
                    Some(last) if *index > last + 1 => self.truncate(*shard, 0),
                    _ => {}
                }
                let log = self.shards.get_mut(shard).expect("shard exists");
                let data = cache.then(|| data.clone());
                if let Some(d) = &data {
                    self.cache_bytes += d.len();
                    self.cache_fifo.push_back((*shard, *index, lsn));
                }
                log.entries.push_back(EntryMeta {
                    index: *index,
                    term: *term,
                    lsn,
                    seq,
                    offset,
                    len,
                    data,
                });
                let seg = self
                    .segments
                    .get_mut(&seq)
                    .expect("segment of a new record exists");
                let m = seg.max_index.entry(*shard).or_insert(0);
                *m = (*m).max(*index);
            }
            Record::HardState { shard, state } => {
                self.shards.entry(*shard).or_default().hard_state = Some(*state);
            }
            Record::Truncate { shard, index } => {
                self.shards.entry(*shard).or_default();
                self.truncate(*shard, *index);
            }
        }
    }

    /// Drops `shard`'s entries at and above `index`.
    fn truncate(&mut self, shard: ShardId, index: u64) {
        let log = self.shards.get_mut(&shard).expect("shard exists");
        let mut freed = 0;
        while log.entries.back().is_some_and(|e| e.index >= index) {
            let e = log.entries.pop_back().expect("back exists");
            freed += e.data.map_or(0, |d| d.len());
        }
        self.cache_bytes -= freed;
        // Entries past the cut no longer hold their segments.
        let cap = index.saturating_sub(1);
        for seg in self.segments.values_mut() {
            if let Some(m) = seg.max_index.get_mut(&shard) {
                *m = (*m).min(cap);
            }
        }
    }

    fn evict_cache(&mut self, budget: usize) {
        while self.cache_bytes > budget {
            let Some(&(shard, index, lsn)) = self.cache_fifo.front() else {
                break;
            };
            if lsn > self.durable_lsn {
                break;
            }
            self.cache_fifo.pop_front();
            let Some(log) = self.shards.get_mut(&shard) else {
                continue;
            };
            let Some(first) = log.entries.front().map(|e| e.index) else {
                continue;
            };
            if index < first {
                continue;
            }
            if let Some(e) = log.entries.get_mut((index - first) as usize) {
                if e.lsn == lsn {
                    if let Some(d) = e.data.take() {
                        self.cache_bytes -= d.len();
                    }
                }
            }
        }
    }

    /// Moves sealed segments that no shard needs any more to the recycle queue.
    fn collect_releasable(&mut self) -> usize {
        let mut n = 0;
        while let Some((&seq, seg)) = self.segments.first_key_value() {
            let needed = seg
                .max_index
                .iter()
                .any(|(s, &max)| self.shards.get(s).is_some_and(|l| l.released < max));
            if !seg.sealed || needed {
                break;
            }
            let seg = self.segments.remove(&seq).expect("first segment exists");
            debug!(segment = %seg.name, "wal segment released");
            self.to_recycle.push_back(seg.name);
            n += 1;
        }
        n
    }
}

impl Inner {
    fn poison(&self, file: PathBuf, offset: u64, e: &io::Error) {
        let p = Rc::new(Poison {
            file: file.clone(),
            offset,
            errno: e.raw_os_error(),
            message: e.to_string(),
        });
        error!(file = %file.display(), offset, error = %e, "wal write failed; refusing appends until reopened");
        {
            let mut st = self.st.borrow_mut();
            if st.poison.is_none() {
                st.poison = Some(p.clone());
            }
            st.batches.clear();
        }
        self.durable_tx.send_modify(|d| {
            if d.poison.is_none() {
                d.poison = Some(p);
            }
        });
        self.space_wake.notify_waiters();
    }

    /// The file a batch goes to, turning a spare into the segment on its first batch.
    async fn batch_file(&self, batch: &Batch) -> Result<Rc<dyn StorageFile>, (PathBuf, io::Error)> {
        let Some(name) = &batch.new_segment else {
            let st = self.st.borrow();
            let seg = st
                .segments
                .get(&batch.seq)
                .expect("segment of a queued batch");
            return Ok(seg.file.clone().expect("segment opened by its first batch"));
        };
        let path = self.storage.path_of(name);
        let spare = loop {
            {
                let mut st = self.st.borrow_mut();
                if let Some(s) = st.spares.pop_front() {
                    break s;
                }
                if let Some(e) = st.spare_error.take() {
                    return Err((path, e));
                }
                if st.poison.is_some() {
                    return Err((path, io::Error::other("wal poisoned")));
                }
            }
            self.maint_wake.notify_one();
            debug!(segment = %name, "wal flush waits for a spare segment");
            self.spare_ready.notified().await;
        };
        self.maint_wake.notify_one();
        self.storage
            .rename(&spare, name)
            .map_err(|e| (path.clone(), e))?;
        // The name must be durable before acknowledged records depend on it.
        self.storage
            .sync_dir()
            .await
            .map_err(|e| (path.clone(), e))?;
        let file = self
            .storage
            .open(name, false)
            .map_err(|e| (path.clone(), e))?;
        // The header is made durable on its own before any record: a tail
        // segment with valid records behind a bad header is then damage, never
        // a torn first write.
        let mut header = AlignedBuf::with_capacity(SEGMENT_DATA_OFFSET);
        header.extend_from_slice(&batch.buf[..SEGMENT_DATA_OFFSET]);
        let (_, r) = file.write_durable(0, header).await;
        r.map_err(|e| (path.clone(), e))?;
        self.st
            .borrow_mut()
            .segments
            .get_mut(&batch.seq)
            .expect("segment of a queued batch")
            .file = Some(file.clone());
        info!(segment = %name, "wal segment started");
        Ok(file)
    }
}

async fn flusher(inner: Rc<Inner>) {
    loop {
        let batch = {
            let mut st = inner.st.borrow_mut();
            if st.poison.is_some() {
                return;
            }
            if st.batches.is_empty() {
                if st.closed {
                    return;
                }
                None
            } else {
                if st.batches.len() == 1 {
                    st.close_open_batch();
                }
                st.batches.pop_front()
            }
        };
        let Some(batch) = batch else {
            inner.flush_wake.notified().await;
            continue;
        };
        debug_assert!(batch.closed && batch.buf.len() % BLOCK_BYTES == 0);
        let file = match inner.batch_file(&batch).await {
            Ok(f) => f,
            Err((path, e)) => {
                inner.poison(path, 0, &e);
                return;
            }
        };
        let bytes = batch.buf.len();
        let t0 = Instant::now();
        let (buf, res) = file.write_durable(batch.start, batch.buf).await;
        let latency = t0.elapsed();
        if let Err(e) = res {
            let name = inner
                .st
                .borrow()
                .segments
                .get(&batch.seq)
                .map(|s| s.name.clone());
            let path = inner.storage.path_of(&name.unwrap_or_default());
            inner.poison(path, batch.start, &e);
            return;
        }
        let event = {
            let mut st = inner.st.borrow_mut();
            if st.buf_pool.len() < BUF_POOL_MAX && buf.capacity() <= inner.cfg.max_batch_bytes * 2 {
                let mut buf = buf;
                buf.clear();
                st.buf_pool.push(buf);
            }
            st.durable_lsn = st.durable_lsn.max(batch.last_lsn);
            let m = &mut st.metrics;
            m.flushes += 1;
            m.bytes_written += bytes as u64;
            m.flush_latency_us
                .saturating_record(latency.as_micros() as u64);
            m.batch_appends.saturating_record(batch.appends as u64);
            m.batch_bytes.saturating_record(bytes as u64);
            if batch.seal {
                if let Some(seg) = st.segments.get_mut(&batch.seq) {
                    seg.sealed = true;
                }
                if st.collect_releasable() > 0 {
                    inner.maint_wake.notify_one();
                }
            }
            st.evict_cache(inner.cfg.tail_cache_bytes);
            FlushEvent {
                appends: batch.appends,
                records: batch.records,
                bytes,
                latency,
                durable_lsn: st.durable_lsn,
            }
        };
        let lsn = event.durable_lsn;
        inner.durable_tx.send_modify(|d| d.lsn = lsn);
        inner.space_wake.notify_waiters();
        if let Some(obs) = inner.observer.borrow_mut().as_mut() {
            obs(&event);
        }
    }
}

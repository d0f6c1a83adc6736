//! The commit syncer: makes written commits durable off the applying thread.
//!
//! A commit's pages are written by the applying thread; then, in order, the
//! data must be synced, the meta page written to the slot that does not hold
//! the newest durable meta, and synced again. The syncer does those three steps
//! on its own thread. When commits queue up behind a slow sync, it syncs once
//! for all of them and writes only the newest meta (group commit). Pages a
//! commit frees are reused only after that commit is durable.
//!
//! The syncer also grows the file ahead of need ([`MetaWriter::grow_ahead`]):
//! reserving blocks can wait on the file system's journal as a sync does, so
//! the applying thread asks for room before it runs out and takes the new
//! length up at a later commit ([`MetaWriter::take_grown`]). One grow is in
//! flight at most. Room past the last commit's pages is free to an open, so
//! a crash at any point of a grow loses nothing.
//!
//! Storages without a sync handle (the in-memory test backends) run the same
//! steps inline, in [`MetaWriter::commit_inline`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{IoOp, StorageError};
use crate::page::{Meta, PAGE_SIZE_BYTES};
use crate::pager::SharedStorage;
use crate::storage::SyncHandle;

/// Most commits written but not yet durable; a further commit waits.
pub(crate) const MAX_INFLIGHT_COMMITS: usize = 16;

/// What the applying thread hands the syncer.
enum Job {
    /// Make the pages written so far durable under this meta.
    Commit(Meta),
    /// Grow the file to this many bytes.
    Grow(u64),
}

/// How a grow ahead ended: the file's new length, or why it could not grow.
pub(crate) type Grown = Result<u64, std::io::Error>;

#[derive(Default)]
struct Shared {
    /// Txn of the newest durable meta.
    durable_txn: AtomicU64,
    /// Applied index recorded by that meta.
    durable_index: AtomicU64,
    last_sync_us: AtomicU64,
    syncs: AtomicU64,
    failure: Mutex<Option<(IoOp, u64, std::io::Error)>>,
    /// The end of the grow in flight, once the syncer is done with it.
    grown: Mutex<Option<Grown>>,
    wake: Condvar,
    lock: Mutex<()>,
}

/// Writes meta pages, alternating slots.
pub(crate) struct MetaWriter {
    /// Slot holding the newest durable meta.
    pub slot: u64,
    mode: Mode,
    file: String,
}

enum Mode {
    Inline {
        durable_txn: u64,
        durable_index: u64,
    },
    Thread {
        tx: Option<SyncSender<Job>>,
        shared: Arc<Shared>,
        join: Option<JoinHandle<()>>,
        /// A grow was handed over and its end not yet taken up.
        growing: bool,
    },
}

impl MetaWriter {
    pub(crate) fn new(
        file: &str,
        slot: u64,
        meta: &Meta,
        handle: Option<Box<dyn SyncHandle>>,
    ) -> MetaWriter {
        let mode = match handle {
            None => Mode::Inline {
                durable_txn: meta.txn,
                durable_index: meta.applied_index,
            },
            Some(h) => {
                let shared = Arc::new(Shared::default());
                shared.durable_txn.store(meta.txn, Ordering::Release);
                shared
                    .durable_index
                    .store(meta.applied_index, Ordering::Release);
                // One slot more than the commits in flight, for the one grow.
                let (tx, rx) = sync_channel(MAX_INFLIGHT_COMMITS + 1);
                let sh = shared.clone();
                let join = std::thread::Builder::new()
                    .name("mvcc-sync".into())
                    .spawn(move || {
                        yield_on_wake();
                        run(h, rx, sh, slot)
                    })
                    .expect("spawn the mvcc sync thread");
                Mode::Thread {
                    tx: Some(tx),
                    shared,
                    join: Some(join),
                    growing: false,
                }
            }
        };
        MetaWriter {
            slot,
            mode,
            file: file.to_string(),
        }
    }

    pub(crate) fn durable_txn(&self) -> u64 {
        match &self.mode {
            Mode::Inline { durable_txn, .. } => *durable_txn,
            Mode::Thread { shared, .. } => shared.durable_txn.load(Ordering::Acquire),
        }
    }

    pub(crate) fn durable_index(&self) -> u64 {
        match &self.mode {
            Mode::Inline { durable_index, .. } => *durable_index,
            Mode::Thread { shared, .. } => shared.durable_index.load(Ordering::Acquire),
        }
    }

    pub(crate) fn last_sync_us(&self) -> Option<u64> {
        match &self.mode {
            Mode::Inline { .. } => None,
            Mode::Thread { shared, .. } => Some(shared.last_sync_us.load(Ordering::Relaxed)),
        }
    }

    /// Whether the background syncer has failed (the store is poisoned).
    pub(crate) fn has_failed(&self) -> bool {
        match &self.mode {
            Mode::Inline { .. } => false,
            Mode::Thread { shared, .. } => {
                shared.failure.lock().expect("sync failure lock").is_some()
            }
        }
    }

    /// Whether handing over one more commit, with `in_flight` commits not yet
    /// durable, could wait for the syncer's queue.
    pub(crate) fn would_wait(&self, in_flight: u64) -> bool {
        matches!(self.mode, Mode::Thread { .. }) && in_flight >= MAX_INFLIGHT_COMMITS as u64
    }

    fn failure(&self) -> Option<StorageError> {
        let Mode::Thread { shared, .. } = &self.mode else {
            return None;
        };
        let f = shared.failure.lock().expect("sync failure lock");
        f.as_ref().map(|(op, off, e)| {
            StorageError::new(
                &self.file,
                *op,
                *off,
                std::io::Error::new(e.kind(), e.to_string()),
            )
        })
    }

    /// Makes the written pages and then `meta` durable: inline, or by handing
    /// the meta to the syncer. Returns the inline sync time.
    pub(crate) fn commit(
        &mut self,
        storage: &SharedStorage,
        meta: Meta,
    ) -> Result<u64, StorageError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        match &mut self.mode {
            Mode::Inline {
                durable_txn,
                durable_index,
            } => {
                let started = Instant::now();
                let mut st = storage.borrow_mut();
                st.sync_data()
                    .map_err(|e| StorageError::new(&self.file, IoOp::Sync, 0, e))?;
                let slot = 1 - self.slot;
                let off = slot * PAGE_SIZE_BYTES as u64;
                st.write_at(&meta.encode(slot), off)
                    .map_err(|e| StorageError::new(&self.file, IoOp::Write, off, e))?;
                st.sync_data()
                    .map_err(|e| StorageError::new(&self.file, IoOp::Sync, off, e))?;
                self.slot = slot;
                *durable_txn = meta.txn;
                *durable_index = meta.applied_index;
                Ok(started.elapsed().as_micros() as u64)
            }
            Mode::Thread { tx, .. } => {
                let sender = tx.as_ref().expect("syncer running");
                if sender.send(Job::Commit(meta)).is_err() {
                    return Err(self.failure().unwrap_or_else(|| {
                        StorageError::new(
                            &self.file,
                            IoOp::Sync,
                            0,
                            std::io::Error::other("sync thread stopped"),
                        )
                    }));
                }
                Ok(0)
            }
        }
    }

    /// Waits until every handed-over commit is durable.
    pub(crate) fn wait_durable(&self, txn: u64) -> Result<(), StorageError> {
        if let Mode::Thread { shared, .. } = &self.mode {
            let durable = || shared.durable_txn.load(Ordering::Acquire) >= txn;
            while !durable() {
                if let Some(e) = self.failure() {
                    return Err(e);
                }
                shared.wait_until(durable);
            }
        }
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Growing the file ahead of need, on the syncer.
impl MetaWriter {
    /// Whether a grow is in flight: handed over, its end not yet taken up.
    /// A syncer that failed grows nothing more: no grow is in flight then.
    pub(crate) fn growing(&self) -> bool {
        matches!(self.mode, Mode::Thread { growing: true, .. }) && !self.has_failed()
    }

    /// Asks the syncer to grow the file to `len` bytes. False when there is
    /// no syncer (storages without a sync handle grow inline), a grow is
    /// already in flight, or the syncer's queue is full.
    pub(crate) fn grow_ahead(&mut self, len: u64) -> bool {
        let Mode::Thread {
            tx: Some(tx),
            growing,
            ..
        } = &mut self.mode
        else {
            return false;
        };
        if *growing {
            return false;
        }
        *growing = tx.try_send(Job::Grow(len)).is_ok();
        *growing
    }

    /// The end of the grow in flight, if the syncer is done with it.
    pub(crate) fn take_grown(&mut self) -> Option<Grown> {
        let Mode::Thread {
            shared, growing, ..
        } = &mut self.mode
        else {
            return None;
        };
        if !*growing {
            return None;
        }
        let grown = shared.grown.lock().expect("grow lock").take();
        *growing = grown.is_none();
        grown
    }

    /// Waits for the end of the grow in flight; None when none is in flight
    /// or the syncer stopped first (its failure says why).
    pub(crate) fn wait_grown(&mut self) -> Option<Grown> {
        while self.growing() {
            if let Some(g) = self.take_grown() {
                return Some(g);
            }
            if let Mode::Thread { shared, .. } = &self.mode {
                shared.wait_until(|| shared.grown.lock().expect("grow lock").is_some());
            }
        }
        None
    }
}

impl MetaWriter {
    /// Lets the sync thread finish its queue on its own: dropping this writer
    /// then does not wait for it.
    pub(crate) fn detach(&mut self) {
        if let Mode::Thread { join, .. } = &mut self.mode {
            drop(join.take());
        }
    }
}

impl Drop for MetaWriter {
    fn drop(&mut self) {
        if let Mode::Thread { tx, join, .. } = &mut self.mode {
            drop(tx.take());
            if let Some(j) = join.take() {
                if j.join().is_err() {
                    tracing::error!(file = %self.file, "mvcc sync thread panicked");
                }
            }
        }
    }
}

impl Shared {
    /// Wakes the threads waiting for a commit to be durable or a grow to end.
    fn wake_waiters(&self) {
        let _g = self.lock.lock().expect("sync wait lock");
        self.wake.notify_all();
    }

    /// Waits until `done` holds or the syncer wakes its waiters, at most
    /// 50 ms, so that a failure recorded meanwhile is seen.
    fn wait_until(&self, done: impl Fn() -> bool) {
        let g = self.lock.lock().expect("sync wait lock");
        if !done() {
            drop(
                self.wake
                    .wait_timeout(g, std::time::Duration::from_millis(50))
                    .expect("sync wait"),
            );
        }
    }
}

/// Puts the calling thread under SCHED_BATCH: woken, it waits for the
/// running thread's turn to end instead of preempting it. The syncer is woken
/// by each commit the applying thread hands it, usually on the applying
/// thread's CPU; preempting there, it would hold the thread that serves
/// requests for as long as the kernel takes to start writing the commit's
/// pages back (about 190 µs at the median on a 2-vCPU VM, against 7 µs under
/// SCHED_BATCH; BENCHMARKS.md). The sync is not urgent: the WAL has the
/// commit's entries. Where the policy cannot be set, the thread runs as it is.
fn yield_on_wake() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param`, a valid sched_param living
    // across the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the mvcc sync thread keeps its scheduling policy");
    }
}

fn run(mut h: Box<dyn SyncHandle>, rx: Receiver<Job>, shared: Arc<Shared>, mut slot: u64) {
    while let Ok(first) = rx.recv() {
        let (mut meta, mut grow) = (None, None);
        // Group commit: one sync covers every commit written so far.
        for job in std::iter::once(first).chain(rx.try_iter()) {
            match job {
                Job::Commit(newer) => meta = Some(newer),
                Job::Grow(len) => grow = Some(len),
            }
        }
        // The grow first: room the applying thread is short of unblocks it
        // sooner than the sync does.
        if let Some(len) = grow {
            let r = h.grow_to(len).map(|()| len);
            if let Err(e) = &r {
                tracing::warn!(len, error = %e, "growing the store file ahead failed; a commit that needs the room grows it itself");
            }
            *shared.grown.lock().expect("grow lock") = Some(r);
            shared.wake_waiters();
        }
        let Some(meta) = meta else {
            continue;
        };
        let started = Instant::now();
        let next = 1 - slot;
        let off = next * PAGE_SIZE_BYTES as u64;
        let r = h
            .sync_data()
            .map_err(|e| (IoOp::Sync, 0, e))
            .and_then(|_| {
                h.write_at(&meta.encode(next), off)
                    .map_err(|e| (IoOp::Write, off, e))
            })
            .and_then(|_| h.sync_data().map_err(|e| (IoOp::Sync, off, e)));
        if let Err(f) = r {
            tracing::error!(txn = meta.txn, error = %f.2, "mvcc commit sync failed; store poisoned");
            *shared.failure.lock().expect("sync failure lock") = Some(f);
            shared.wake_waiters();
            return;
        }
        slot = next;
        shared
            .last_sync_us
            .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        shared.syncs.fetch_add(1, Ordering::Relaxed);
        shared
            .durable_index
            .store(meta.applied_index, Ordering::Release);
        shared.durable_txn.store(meta.txn, Ordering::Release);
        shared.wake_waiters();
    }
}

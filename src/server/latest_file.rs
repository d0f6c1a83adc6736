//! A small file rewritten whole after each change, the newest change winning:
//! `auth.state` and `member.toml`. A change takes effect in memory when a
//! shard applies it; the file is written and synced after, by a thread of
//! its own ([`WriterThread::Own`]), and the shards hold back their store's
//! commits while the file is behind ([`LatestFile::unwritten`]). A crash
//! before the write finds the store's applied index behind the change, so
//! the WAL replays it and the file is written again.
//!
//! Every write carries the whole file as of one change, numbered in the
//! order of the changes; a write numbered at or below what the file holds
//! is skipped, so a queued write never lays an older state over a newer one
//! written meanwhile on another thread ([`LatestFile::write_now`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Which thread writes the file after a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterThread {
    /// A thread of its own: the daemon, whose callers are cores.
    Own,
    /// The caller's, before it goes on: the driver simulation, all on one
    /// thread under a paused clock, where a thread it cannot see would make
    /// a seed's store commits (held back until the file is written) fall
    /// differently from one run to the next.
    Caller,
}

/// Writes one file's contents of type `T`.
type WriteFn<T> = Box<dyn Fn(&T) -> std::io::Result<()> + Send + Sync>;

/// The file and the thread that writes it.
pub struct LatestFile<T> {
    shared: Arc<Shared<T>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    writes_on: WriterThread,
}

struct Shared<T> {
    /// The file's name, for errors and the writer thread's name.
    name: &'static str,
    write: WriteFn<T>,
    queue: Mutex<Queue<T>>,
    wake: Condvar,
    /// Held while the file is written: one write at a time, each only of a
    /// change newer than the file's.
    writing: Mutex<()>,
    /// The number of the newest change queued or written now.
    wanted: AtomicU64,
    /// The number of the change the file holds.
    written: AtomicU64,
    /// A write failed (the queue's `failure` says why): read by the shards'
    /// commits without taking a lock.
    failed: AtomicBool,
}

struct Queue<T> {
    next: Option<(u64, T)>,
    stop: bool,
    failure: Option<String>,
}

impl<T: Send + 'static> LatestFile<T> {
    /// The file `name`, which holds change `written`, written by `write`.
    pub fn new(
        name: &'static str,
        written: u64,
        writes_on: WriterThread,
        write: impl Fn(&T) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> LatestFile<T> {
        LatestFile {
            shared: Arc::new(Shared {
                name,
                write: Box::new(write),
                queue: Mutex::new(Queue {
                    next: None,
                    stop: false,
                    failure: None,
                }),
                wake: Condvar::new(),
                writing: Mutex::new(()),
                wanted: AtomicU64::new(written),
                written: AtomicU64::new(written),
                failed: AtomicBool::new(false),
            }),
            thread: Mutex::new(None),
            writes_on,
        }
    }

    /// Hands change `seq` to the writer (replacing one it has not started
    /// on), starting its thread with the first one; with
    /// [`WriterThread::Caller`], writes it before returning. Never fails:
    /// a failure shows in [`Self::unwritten`], and later changes are not
    /// written (the file stays behind the log).
    pub fn queue(&self, seq: u64, value: T) {
        let s = &self.shared;
        s.wanted.fetch_max(seq, Ordering::AcqRel);
        if self.writes_on == WriterThread::Caller {
            if !s.failed.load(Ordering::Acquire) {
                s.write_or_fail(seq, &value);
            }
            return;
        }
        let mut q = lock(&s.queue);
        if q.next.as_ref().is_some_and(|(queued, _)| *queued > seq) {
            return;
        }
        q.next = Some((seq, value));
        let mut thread = lock(&self.thread);
        if thread.is_none() && q.failure.is_none() {
            let shared = s.clone();
            match std::thread::Builder::new()
                .name(s.name.into())
                .spawn(move || shared.run())
            {
                Ok(t) => *thread = Some(t),
                Err(e) => {
                    q.failure = Some(format!("starting the {} writer: {e}", s.name));
                    s.failed.store(true, Ordering::Release);
                }
            }
        }
        drop(q);
        s.wake.notify_one();
    }

    /// Writes change `seq` on this thread (a snapshot's install, off the
    /// core, which must find it durable before it goes on).
    pub fn write_now(&self, seq: u64, value: &T) -> std::io::Result<()> {
        self.shared.wanted.fetch_max(seq, Ordering::AcqRel);
        self.shared.write(seq, value)
    }

    /// Whether a change is not yet in the file (the store must not commit
    /// past it), or why the file could not be written.
    pub fn unwritten(&self) -> Result<bool, String> {
        let s = &self.shared;
        if s.failed.load(Ordering::Acquire) {
            if let Some(f) = &lock(&s.queue).failure {
                return Err(f.clone());
            }
        }
        Ok(s.written.load(Ordering::Acquire) < s.wanted.load(Ordering::Acquire))
    }
}

impl<T> std::fmt::Debug for LatestFile<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatestFile")
            .field("name", &self.shared.name)
            .field("wanted", &self.shared.wanted.load(Ordering::Relaxed))
            .field("written", &self.shared.written.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> Drop for LatestFile<T> {
    /// Writes what is queued before the member goes: a removal recorded
    /// just before a stop must reach the file.
    fn drop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = lock(&self.thread).take() {
            if t.join().is_err() {
                tracing::error!(file = self.shared.name, "the file's writer panicked");
            }
        }
    }
}

impl<T> Shared<T> {
    fn run(&self) {
        loop {
            let (seq, value) = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(next) = q.next.take() {
                        break next;
                    }
                    if q.stop {
                        return;
                    }
                    q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            if !self.write_or_fail(seq, &value) {
                return;
            }
        }
    }

    /// Writes change `seq`; on failure records why and answers false.
    fn write_or_fail(&self, seq: u64, value: &T) -> bool {
        match self.write(seq, value) {
            Ok(()) => true,
            Err(e) => {
                let reason = format!("writing {}: {e}", self.name);
                tracing::error!(error = %reason, "file not kept");
                lock(&self.queue).failure = Some(reason);
                self.failed.store(true, Ordering::Release);
                false
            }
        }
    }

    fn write(&self, seq: u64, value: &T) -> std::io::Result<()> {
        let _writing = lock(&self.writing);
        if seq <= self.written.load(Ordering::Acquire) {
            return Ok(());
        }
        (self.write)(value)?;
        self.written.store(seq, Ordering::Release);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    const NAME: &str = "test.state";

    /// A file holding one line: a change's number and its text.
    fn file_in(dir: &Path, writes_on: WriterThread) -> LatestFile<(u64, String)> {
        let dir: PathBuf = dir.to_path_buf();
        LatestFile::new(NAME, 0, writes_on, move |(n, text): &(u64, String)| {
            crate::durable_file::write_checked(&dir, NAME, format!("{n} {text}").as_bytes())
        })
    }

    fn read(dir: &Path) -> String {
        let body = crate::durable_file::read_checked(&dir.join(NAME))
            .unwrap()
            .unwrap();
        String::from_utf8(body).unwrap()
    }

    /// Waits, bounded by the writer's progress, until nothing is unwritten.
    fn until_written<T: Send + 'static>(f: &LatestFile<T>) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while f.unwritten()? {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }

    #[test]
    fn queued_changes_reach_the_file_newest_last() {
        let dir = tempfile::tempdir().unwrap();
        let f = file_in(dir.path(), WriterThread::Own);
        assert_eq!(f.unwritten(), Ok(false));
        for i in 1..=50u64 {
            f.queue(i, (i, format!("v{i}")));
        }
        assert_eq!(f.shared.wanted.load(Ordering::Acquire), 50);
        until_written(&f).unwrap();
        assert_eq!(read(dir.path()), "50 v50");
    }

    #[test]
    fn an_older_change_never_lays_itself_over_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let f = file_in(dir.path(), WriterThread::Own);
        f.write_now(20, &(20, "new".into())).unwrap();
        f.queue(7, (7, "old".into()));
        until_written(&f).unwrap();
        // Dropping the file waits for its thread to finish what it took.
        drop(f);
        assert_eq!(read(dir.path()), "20 new");
    }

    #[test]
    fn a_write_that_fails_is_reported_not_dropped_and_the_queuer_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let f = file_in(&dir.path().join("gone"), WriterThread::Own);
        // The queuer (a core) returns at once; the failure comes later.
        f.queue(4, (4, "a".into()));
        let err = until_written(&f).expect_err("a write into a missing directory succeeded");
        assert!(err.contains(NAME), "{err}");
        // Later changes are refused too: the file stays behind the log.
        f.queue(5, (5, "b".into()));
        assert_eq!(f.unwritten(), Err(err));
    }

    #[test]
    fn dropping_the_file_writes_what_is_queued() {
        let dir = tempfile::tempdir().unwrap();
        let f = file_in(dir.path(), WriterThread::Own);
        f.queue(1, (1, "removed".into()));
        drop(f);
        assert_eq!(read(dir.path()), "1 removed");
    }

    #[test]
    fn on_the_callers_thread_a_change_is_written_before_queue_returns() {
        let dir = tempfile::tempdir().unwrap();
        let f = file_in(dir.path(), WriterThread::Caller);
        f.queue(1, (1, "now".into()));
        assert_eq!(f.unwritten(), Ok(false));
        assert_eq!(read(dir.path()), "1 now");
        assert!(lock(&f.thread).is_none(), "a thread was started");
        let gone = file_in(&dir.path().join("gone"), WriterThread::Caller);
        gone.queue(1, (1, "x".into()));
        assert!(gone.unwritten().unwrap_err().contains(NAME));
    }
}

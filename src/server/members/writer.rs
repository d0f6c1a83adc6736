//! `member.toml` written off the core. A membership change takes effect in
//! the table when a shard applies it; the file is written and synced by a
//! thread of its own, and shard 0 holds back its store's commits until the
//! file has caught up ([`FileWriter::unwritten`]). A crash before the file
//! is written finds shard 0's applied index behind the change, so the WAL
//! replays it and the table is written again.
//!
//! Every write carries the whole file as of one change, numbered in the
//! order the changes were made; a write older than what the file holds is
//! skipped, so a queued write never lays an older table over a newer one
//! written meanwhile on another thread ([`FileWriter::write_now`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::{MemberFile, MEMBER_FILE};

/// Which thread writes `member.toml` after a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileWriterThread {
    /// A thread of its own: the daemon, whose callers are cores.
    Own,
    /// The caller's, before it goes on: the driver simulation, all on one
    /// thread under a paused clock, where a thread it cannot see would make
    /// a seed's store commits (held back until the file is written) fall
    /// differently from one run to the next.
    Caller,
}

/// The member's file and the thread that writes it.
pub(super) struct FileWriter {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    writes_on: FileWriterThread,
}

struct Shared {
    dir: PathBuf,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Held while the file is written: one write at a time, each only of a
    /// change newer than the file's.
    writing: Mutex<()>,
    /// The number of the newest change queued or written now.
    wanted: AtomicU64,
    /// The number of the change the file holds.
    written: AtomicU64,
    /// A write failed (the queue's `failure` says why): read by every
    /// shard's commits without taking a lock.
    failed: AtomicBool,
}

#[derive(Default)]
struct Queue {
    next: Option<(u64, MemberFile)>,
    stop: bool,
    failure: Option<String>,
}

impl FileWriter {
    /// The file in `dir`, which holds what it holds (change 0).
    pub(super) fn new(dir: &Path, writes_on: FileWriterThread) -> FileWriter {
        FileWriter {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
                writing: Mutex::new(()),
                wanted: AtomicU64::new(0),
                written: AtomicU64::new(0),
                failed: AtomicBool::new(false),
            }),
            thread: Mutex::new(None),
            writes_on,
        }
    }

    /// Hands change `seq`'s file to the writer thread (replacing one it has
    /// not started on), starting the thread with the first one.
    pub(super) fn queue(&self, seq: u64, file: MemberFile) {
        let s = &self.shared;
        s.wanted.fetch_max(seq, Ordering::AcqRel);
        if self.writes_on == FileWriterThread::Caller {
            if lock(&s.queue).failure.is_none() {
                s.write_or_fail(seq, &file);
            }
            return;
        }
        let mut q = lock(&s.queue);
        if q.next.as_ref().is_some_and(|(queued, _)| *queued > seq) {
            return;
        }
        q.next = Some((seq, file));
        let mut thread = lock(&self.thread);
        if thread.is_none() && q.failure.is_none() {
            let shared = s.clone();
            match std::thread::Builder::new()
                .name("member-file".into())
                .spawn(move || shared.run())
            {
                Ok(t) => *thread = Some(t),
                Err(e) => {
                    q.failure = Some(format!("starting the {MEMBER_FILE} writer: {e}"));
                    s.failed.store(true, Ordering::Release);
                }
            }
        }
        drop(q);
        s.wake.notify_one();
    }

    /// Writes change `seq`'s file on this thread (a snapshot's install, off
    /// the core, which must find it durable before it goes on).
    pub(super) fn write_now(&self, seq: u64, file: &MemberFile) -> std::io::Result<()> {
        self.shared.wanted.fetch_max(seq, Ordering::AcqRel);
        self.shared.write(seq, file)
    }

    /// Whether a change is not yet in the file (shard 0's store must not
    /// commit past it), or why the file could not be written.
    pub(super) fn unwritten(&self) -> Result<bool, String> {
        let s = &self.shared;
        if s.failed.load(Ordering::Acquire) {
            if let Some(f) = &lock(&s.queue).failure {
                return Err(f.clone());
            }
        }
        Ok(s.written.load(Ordering::Acquire) < s.wanted.load(Ordering::Acquire))
    }
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("dir", &self.shared.dir)
            .field("wanted", &self.shared.wanted.load(Ordering::Relaxed))
            .field("written", &self.shared.written.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for FileWriter {
    /// Writes what is queued before the member goes: a removal recorded
    /// just before a stop must reach the file.
    fn drop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = lock(&self.thread).take() {
            if t.join().is_err() {
                tracing::error!("the {MEMBER_FILE} writer panicked");
            }
        }
    }
}

impl Shared {
    fn run(&self) {
        loop {
            let (seq, file) = {
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
            if !self.write_or_fail(seq, &file) {
                return;
            }
        }
    }

    /// Writes change `seq`'s file; on failure records why (see
    /// [`FileWriter::unwritten`]) and answers false.
    fn write_or_fail(&self, seq: u64, file: &MemberFile) -> bool {
        match self.write(seq, file) {
            Ok(()) => true,
            Err(e) => {
                let reason = format!("writing {MEMBER_FILE}: {e}");
                tracing::error!(error = %reason, "member table not kept");
                lock(&self.queue).failure = Some(reason);
                self.failed.store(true, Ordering::Release);
                false
            }
        }
    }

    fn write(&self, seq: u64, file: &MemberFile) -> std::io::Result<()> {
        let _writing = lock(&self.writing);
        if seq <= self.written.load(Ordering::Acquire) {
            return Ok(());
        }
        file.write(&self.dir)?;
        self.written.store(seq, Ordering::Release);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests_support {
    use super::*;

    pub(super) fn file(members: &[u64]) -> MemberFile {
        MemberFile {
            layout_version: super::super::LAYOUT_VERSION,
            name: "a".into(),
            member_id: 1,
            cluster_id: 2,
            shards: 1,
            routing_version: 1,
            wal_lanes: 1,
            removed: false,
            bootstrap_voters: vec![1],
            members: members
                .iter()
                .map(|id| super::super::Member {
                    id: *id,
                    name: format!("m{id}"),
                    peer_urls: vec![format!("http://127.0.0.1:{}", 2380 + id)],
                    client_urls: Vec::new(),
                    is_learner: false,
                })
                .collect(),
        }
    }

    pub(super) fn ids(dir: &Path) -> Vec<u64> {
        let f = MemberFile::load(dir).unwrap().unwrap();
        f.members.iter().map(|m| m.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

    /// Waits, bounded by the writer's progress, until nothing is unwritten.
    fn until_written(w: &FileWriter) -> Result<(), String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while w.unwritten()? {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Ok(())
    }

    #[test]
    fn a_queued_change_is_unwritten_until_the_thread_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let w = FileWriter::new(dir.path(), FileWriterThread::Own);
        assert_eq!(w.unwritten(), Ok(false));
        w.queue(1, file(&[1]));
        w.queue(2, file(&[1, 2]));
        until_written(&w).unwrap();
        assert_eq!(ids(dir.path()), vec![1, 2]);
    }

    #[test]
    fn an_older_change_never_lays_itself_over_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let w = FileWriter::new(dir.path(), FileWriterThread::Own);
        w.write_now(5, &file(&[1, 2, 3])).unwrap();
        w.queue(4, file(&[1]));
        until_written(&w).unwrap();
        assert_eq!(ids(dir.path()), vec![1, 2, 3]);
        w.queue(6, file(&[1, 3]));
        until_written(&w).unwrap();
        assert_eq!(ids(dir.path()), vec![1, 3]);
    }

    #[test]
    fn a_write_that_fails_is_reported_not_dropped_and_the_queuer_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let w = FileWriter::new(&gone, FileWriterThread::Own);
        // The queuer (a core) returns at once; the failure comes later.
        w.queue(1, file(&[1]));
        let err = until_written(&w).expect_err("a write into a missing directory succeeded");
        assert!(err.contains(MEMBER_FILE), "{err}");
        assert_eq!(w.unwritten(), Err(err));
    }

    #[test]
    fn dropping_the_writer_writes_what_is_queued() {
        let dir = tempfile::tempdir().unwrap();
        let w = FileWriter::new(dir.path(), FileWriterThread::Own);
        let mut f = file(&[1, 2]);
        f.removed = true;
        w.queue(1, f);
        drop(w);
        assert!(MemberFile::load(dir.path()).unwrap().unwrap().removed);
    }
}

#[cfg(test)]
mod caller_tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn on_the_callers_thread_a_change_is_written_before_queue_returns() {
        let dir = tempfile::tempdir().unwrap();
        let w = FileWriter::new(dir.path(), FileWriterThread::Caller);
        w.queue(1, file(&[1, 2]));
        assert_eq!(w.unwritten(), Ok(false));
        assert_eq!(ids(dir.path()), vec![1, 2]);
        assert!(lock(&w.thread).is_none(), "a thread was started");
        let gone = FileWriter::new(&dir.path().join("gone"), FileWriterThread::Caller);
        gone.queue(1, file(&[1]));
        assert!(gone.unwritten().unwrap_err().contains(MEMBER_FILE));
    }
}

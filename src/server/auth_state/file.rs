//! `auth.state` written off the core. An auth change takes effect when shard 0
//! applies it; its file is written and synced by a thread of its own, and the
//! shard holds back its store's commits until the file has caught up
//! ([`StateFile::unwritten`]). A crash before the file is written finds the
//! store's applied index behind the change, so the WAL replays the change.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use cairn_proto::cairnpb::AuthState;
use prost::Message as _;

use super::AUTH_FILE;

/// The auth state's file and the thread that writes it.
pub(super) struct StateFile {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Held while the file is written: the writer thread and a snapshot's
    /// install write one at a time, each only a state newer than the file's.
    writing: Mutex<()>,
    /// The applied index of the newest state queued or installed.
    wanted: AtomicU64,
    /// The applied index of the state in the file.
    written: AtomicU64,
}

#[derive(Default)]
struct Queue {
    next: Option<AuthState>,
    /// The writer thread was started (with the first state queued).
    started: bool,
    stop: bool,
    failure: Option<String>,
}

impl StateFile {
    /// The file in `dir`, whose state has `applied_index`.
    pub(super) fn new(dir: &Path, applied_index: u64) -> StateFile {
        StateFile {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
                writing: Mutex::new(()),
                wanted: AtomicU64::new(applied_index),
                written: AtomicU64::new(applied_index),
            }),
        }
    }

    /// Hands `state` to the writer thread (replacing a state it has not
    /// started on), starting the thread with the first one.
    pub(super) fn queue(&self, state: AuthState) {
        let s = &self.shared;
        s.wanted.fetch_max(state.applied_index, Ordering::AcqRel);
        let mut q = lock(&s.queue);
        q.next = Some(state);
        if !q.started && q.failure.is_none() {
            q.started = true;
            let shared = s.clone();
            if let Err(e) = std::thread::Builder::new()
                .name("auth-state".into())
                .spawn(move || shared.run())
            {
                q.failure = Some(format!("starting the {AUTH_FILE} writer: {e}"));
            }
        }
        drop(q);
        s.wake.notify_one();
    }

    /// Writes `state` on this thread (a snapshot's install, off the core).
    pub(super) fn write_now(&self, state: &AuthState) -> std::io::Result<()> {
        let s = &self.shared;
        s.wanted.fetch_max(state.applied_index, Ordering::AcqRel);
        s.write(state)
    }

    /// Whether a change applied is not yet in the file (the store must not
    /// commit past it), or why the file could not be written.
    pub(super) fn unwritten(&self) -> Result<bool, String> {
        let s = &self.shared;
        if let Some(f) = &lock(&s.queue).failure {
            return Err(f.clone());
        }
        Ok(s.written.load(Ordering::Acquire) < s.wanted.load(Ordering::Acquire))
    }
}

impl Drop for StateFile {
    fn drop(&mut self) {
        lock(&self.shared.queue).stop = true;
        self.shared.wake.notify_one();
    }
}

impl Shared {
    fn run(&self) {
        loop {
            let state = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(state) = q.next.take() {
                        break state;
                    }
                    if q.stop {
                        return;
                    }
                    q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            if let Err(e) = self.write(&state) {
                let reason = format!("writing {AUTH_FILE}: {e}");
                tracing::error!(error = %reason, "auth state not kept");
                lock(&self.queue).failure = Some(reason);
                return;
            }
        }
    }

    fn write(&self, state: &AuthState) -> std::io::Result<()> {
        let _writing = lock(&self.writing);
        if state.applied_index <= self.written.load(Ordering::Acquire) {
            return Ok(());
        }
        crate::durable_file::write_checked(&self.dir, AUTH_FILE, &state.encode_to_vec())?;
        self.written.store(state.applied_index, Ordering::Release);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(index: u64, users: &[&str]) -> AuthState {
        AuthState {
            applied_index: index,
            users: users
                .iter()
                .map(|u| cairn_proto::authpb::User {
                    name: u.as_bytes().to_vec().into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn read(dir: &Path) -> AuthState {
        let body = crate::durable_file::read_checked(&dir.join(AUTH_FILE))
            .unwrap()
            .unwrap();
        AuthState::decode(body.as_slice()).unwrap()
    }

    fn until_written(f: &StateFile) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while f.unwritten().unwrap() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn queued_states_reach_the_file_newest_last() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path(), 0);
        assert!(!f.unwritten().unwrap());
        for i in 1..=50u64 {
            f.queue(state(i, &["a", "b"][..(i as usize % 2 + 1)]));
        }
        assert_eq!(f.shared.wanted.load(Ordering::Acquire), 50);
        until_written(&f);
        let got = read(dir.path());
        assert_eq!((got.applied_index, got.users.len()), (50, 1));
    }

    #[test]
    fn an_installed_newer_state_is_not_overwritten_by_an_older_queued_one() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path(), 3);
        f.write_now(&state(20, &["new"])).unwrap();
        f.queue(state(7, &["old"]));
        until_written(&f);
        // The queued state may still be in the writer's hands: stop it and
        // wait for the thread to finish what it took.
        let shared = f.shared.clone();
        drop(f);
        while Arc::strong_count(&shared) > 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let got = read(dir.path());
        assert_eq!(got.applied_index, 20);
        assert_eq!(&got.users[0].name[..], b"new");
    }

    #[test]
    fn a_write_that_fails_is_reported_and_holds_the_store_back() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let f = StateFile::new(&gone, 0);
        f.queue(state(4, &["a"]));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let reason = loop {
            match f.unwritten() {
                Err(reason) => break reason,
                Ok(unwritten) => assert!(unwritten, "a write into a missing directory succeeded"),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the failure never showed"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        assert!(reason.contains(AUTH_FILE), "{reason}");
        // Later states are refused too: the file stays behind the log.
        f.queue(state(5, &["b"]));
        assert!(f.unwritten().is_err());
    }
}

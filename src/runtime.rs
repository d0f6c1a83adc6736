//! Thread-per-core: one pinned OS thread per core, each running its own
//! single-threaded tokio runtime with a `LocalSet`, so per-core state can be `Rc`
//! and `RefCell` and never crosses a thread.
//!
//! Other cores reach a core's state only by message: each core has a mailbox of
//! closures to run on it, and a closure that cannot be delivered (the core is gone)
//! is handed back to the sender.

use std::cell::OnceCell;
use std::future::Future;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::idle_poll::{self, IdlePoll};

use tokio::sync::mpsc;

/// Work sent to a core: runs on the core's thread, inside its `LocalSet`, so it may
/// `tokio::task::spawn_local`.
pub type CoreJob = Box<dyn FnOnce() + Send + 'static>;

/// Upper bound on jobs queued for one core before senders wait; keeps a burst of
/// cross-core requests from growing memory without bound.
pub const CORE_MAILBOX_JOBS: usize = 65_536;

/// A cheap, cloneable way to reach one core from any thread.
#[derive(Clone)]
pub struct CoreHandle {
    id: usize,
    mailbox: mpsc::Sender<CoreJob>,
}

impl std::fmt::Debug for CoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreHandle").field("id", &self.id).finish()
    }
}

/// The core has stopped; the job that could not be delivered comes back.
pub struct CoreGone(pub CoreJob);

impl std::fmt::Debug for CoreGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoreGone")
    }
}

impl CoreHandle {
    pub fn id(&self) -> usize {
        self.id
    }

    /// Queues `job` to run on this core, waiting for room in its mailbox.
    pub async fn send(&self, job: CoreJob) -> Result<(), CoreGone> {
        self.mailbox.send(job).await.map_err(|e| CoreGone(e.0))
    }

    /// Queues `job` to run on this core if its mailbox has room now; else
    /// (full, or the core gone) the job comes back.
    pub fn try_send(&self, job: CoreJob) -> Result<(), CoreGone> {
        self.mailbox.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job) => {
                CoreGone(job)
            }
        })
    }
}

/// The running cores of this process.
pub struct Cores {
    handles: Vec<CoreHandle>,
    threads: Vec<JoinHandle<()>>,
}

/// What a core's main future is given.
pub struct CoreContext {
    pub id: usize,
    /// Handles of every core, this one included, indexed by core id.
    pub cores: Vec<CoreHandle>,
    /// The CPU this core's thread is pinned to, if it is.
    pub cpu: Option<usize>,
}

/// Pins the calling thread to `cpu`. Failure (a cpuset that excludes it, a
/// container without the permission) is logged and otherwise ignored: pinning is an
/// optimisation, not a correctness requirement. Returns whether the thread is pinned.
fn pin_to_cpu(cpu: usize) -> bool {
    // SAFETY: cpu_set_t is a plain bitmask, valid when zeroed; CPU_SET writes
    // within it for cpu < CPU_SETSIZE (checked), and sched_setaffinity(0, ...)
    // reads exactly size_of::<cpu_set_t>() bytes from the set we own.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        tracing::warn!(
            cpu,
            error = %std::io::Error::last_os_error(),
            "could not pin core thread; running unpinned"
        );
    }
    rc == 0
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: as in pin_to_cpu; sched_getaffinity fills the set we own, and
    // CPU_ISSET reads within it for i < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&i| libc::CPU_ISSET(i, &set))
            .collect()
    }
}

thread_local! {
    /// The id of the core this thread runs, and every core's handle; unset on
    /// other threads.
    static THIS_CORE: OnceCell<(usize, Vec<CoreHandle>)> = const { OnceCell::new() };
    /// This core thread's idle poller, set once after its runtime is built (the
    /// runtime's park hooks, given before the poller can exist, find it here).
    static IDLE_POLL: OnceCell<IdlePoll> = const { OnceCell::new() };
}

/// Runs `f` on the calling core thread's idle poller, if it has one.
fn with_idle_poll(f: impl FnOnce(&IdlePoll)) {
    IDLE_POLL.with(|p| {
        if let Some(p) = p.get() {
            f(p);
        }
    });
}

/// The id of the core the calling thread runs, if it is a core thread.
pub fn this_core() -> Option<usize> {
    THIS_CORE.with(|c| c.get().map(|(id, _)| *id))
}

/// Queues `job` on core `to` without waiting, from a core thread (see
/// [`CoreHandle::try_send`]); the job comes back when `to` is no core of
/// this process, its mailbox is full or it has stopped.
pub fn try_send_to_core(to: usize, job: CoreJob) -> Result<(), CoreGone> {
    THIS_CORE.with(|c| match c.get().and_then(|(_, cores)| cores.get(to)) {
        Some(core) => core.try_send(job),
        None => Err(CoreGone(job)),
    })
}

/// Calls `observer` after each idle poll of the calling core thread, with whether
/// the poll caught work before its window ran out and how long it polled. Returns whether this core
/// polls before it sleeps (see [`idle_poll`]); if not, `observer` is dropped.
pub fn observe_idle_polls(observer: idle_poll::PollObserver) -> bool {
    IDLE_POLL.with(|p| p.get().map(|p| p.observe(observer)).is_some())
}

impl Cores {
    /// Starts `count` core threads. Each pins itself when `pin_from` is given
    /// (core i to the `pin_from + i`-th of the CPUs the process may use, counted
    /// modulo their number), builds a
    /// current-thread runtime (polling for up to `idle_poll` before it sleeps, see
    /// [`crate::idle_poll`]) and `LocalSet`, starts serving its mailbox, and runs
    /// `main(ctx)` to completion; the thread ends when `main` returns.
    pub fn start<M, Fut>(
        count: usize,
        pin_from: Option<usize>,
        idle_poll: Duration,
        main: M,
    ) -> std::io::Result<Cores>
    where
        M: Fn(CoreContext) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        assert!(count >= 1, "at least one core");
        let cpus = allowed_cpus();
        let mut receivers = Vec::with_capacity(count);
        let mut handles = Vec::with_capacity(count);
        for id in 0..count {
            let (tx, rx) = mpsc::channel(CORE_MAILBOX_JOBS);
            handles.push(CoreHandle { id, mailbox: tx });
            receivers.push(rx);
        }
        let mut threads = Vec::with_capacity(count);
        for (id, mut mailbox) in receivers.into_iter().enumerate() {
            let mut ctx = CoreContext {
                id,
                cores: handles.clone(),
                cpu: None,
            };
            let main = main.clone();
            let cpu = pin_from
                .filter(|_| !cpus.is_empty())
                .map(|first| cpus[(first + id) % cpus.len()]);
            let thread = std::thread::Builder::new()
                .name(format!("cairn-core-{id}"))
                .spawn(move || {
                    ctx.cpu = cpu.filter(|&cpu| pin_to_cpu(cpu));
                    THIS_CORE.with(|c| {
                        let _ = c.set((id, ctx.cores.clone()));
                    });
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .on_thread_park(|| with_idle_poll(IdlePoll::before_park))
                        .on_thread_unpark(|| with_idle_poll(IdlePoll::after_unpark))
                        .build()
                        .expect("build core runtime");
                    if let Some(poll) = idle_poll::watch_runtime(&rt, idle_poll) {
                        IDLE_POLL.with(|p| {
                            let _ = p.set(poll);
                        });
                    }
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        tokio::task::spawn_local(async move {
                            while let Some(job) = mailbox.recv().await {
                                job();
                            }
                        });
                        main(ctx).await;
                    });
                })?;
            threads.push(thread);
        }
        Ok(Cores { handles, threads })
    }

    pub fn handles(&self) -> &[CoreHandle] {
        &self.handles
    }

    /// Waits for every core's main future to finish.
    pub fn join(self) {
        drop(self.handles);
        for t in self.threads {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use tokio::sync::oneshot;

    /// The name of the thread `core` runs on, asked through its mailbox.
    async fn thread_name_of(core: &CoreHandle) -> Option<String> {
        let (tx, rx) = oneshot::channel();
        let job: CoreJob = Box::new(move || {
            let _ = tx.send(std::thread::current().name().map(str::to_string));
        });
        core.send(job).await.ok()?;
        rx.await.ok().flatten()
    }

    #[test]
    fn each_core_runs_on_its_own_thread_and_answers_calls() {
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let done_rx = std::sync::Arc::new(std::sync::Mutex::new(done_rx));
        let (asked_tx, asked_rx) = std::sync::mpsc::channel::<Option<String>>();
        let cores = Cores::start(2, None, Duration::ZERO, move |ctx| {
            let done_rx = done_rx.clone();
            let asked_tx = asked_tx.clone();
            async move {
                // Per-core state that is not Send lives here.
                let counter = Rc::new(Cell::new(0u32));
                let _ = counter;
                if ctx.id == 0 {
                    // Ask core 1 for its thread name from core 0 (core 1
                    // runs until the test says stop, after this answer).
                    let name = thread_name_of(&ctx.cores[1]).await;
                    asked_tx.send(name).unwrap();
                }
                // Park until the test says stop.
                let rx = done_rx.clone();
                tokio::task::spawn_blocking(move || {
                    let _ = rx.lock().unwrap().recv();
                })
                .await
                .unwrap();
            }
        })
        .unwrap();
        let h = cores.handles()[0].clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let name = rt.block_on(thread_name_of(&h));
        assert_eq!(name.as_deref(), Some("cairn-core-0"));
        let asked = asked_rx.recv().unwrap();
        assert_eq!(asked.as_deref(), Some("cairn-core-1"));
        done_tx.send(()).unwrap();
        done_tx.send(()).unwrap();
        cores.join();
    }

    #[test]
    fn a_core_polls_through_short_waits_and_counts_its_polls() {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        let (polls, hits) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let polled_us = Arc::new(AtomicU64::new(0));
        let seen = (polls.clone(), hits.clone(), polled_us.clone());
        let cores = Cores::start(1, None, Duration::from_millis(20), move |_ctx| {
            let (polls, hits, polled_us) = seen.clone();
            async move {
                let polling = observe_idle_polls(Box::new(move |hit, polled| {
                    polls.fetch_add(1, Ordering::Relaxed);
                    polled_us.fetch_add(polled.as_micros() as u64, Ordering::Relaxed);
                    if hit {
                        hits.fetch_add(1, Ordering::Relaxed);
                    }
                }));
                assert!(polling, "the core found its runtime's epoll");
                // Another thread answers each ping after about 0.2 ms: waits
                // well inside the window, so the window grows and polls catch
                // the answers.
                let (near, far) = tokio::net::UnixStream::pair().unwrap();
                let far = far.into_std().unwrap();
                far.set_nonblocking(false).unwrap();
                let echo = std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut far = far;
                    let mut byte = [0u8; 1];
                    while far.read_exact(&mut byte).is_ok() {
                        std::thread::sleep(Duration::from_micros(200));
                        if far.write_all(&byte).is_err() {
                            break;
                        }
                    }
                });
                let mut near = near;
                for _ in 0..50 {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    near.write_all(b"p").await.unwrap();
                    let mut byte = [0u8; 1];
                    near.read_exact(&mut byte).await.unwrap();
                }
                drop(near);
                echo.join().unwrap();
            }
        })
        .unwrap();
        cores.join();
        let (polls, hits) = (polls.load(Ordering::Relaxed), hits.load(Ordering::Relaxed));
        assert!(hits > 0, "polls {polls}, hits {hits}");
        // Each poll is timed, and none outlasts the 20 ms window by more than
        // one check (a yield that ran another thread is not counted).
        let polled_us = polled_us.load(Ordering::Relaxed);
        assert!(polled_us > 0, "polls {polls} took no time");
        assert!(
            polled_us <= polls * 21_000,
            "{polls} polls took {polled_us} µs, more than their windows"
        );
    }

    #[test]
    fn a_core_without_idle_polling_sleeps_as_before() {
        let cores = Cores::start(1, None, Duration::ZERO, |_ctx| async {
            // Registering an observer on a core that does not poll is a no-op.
            assert!(!observe_idle_polls(Box::new(|_, _| panic!(
                "no polls without a window"
            ))));
            tokio::time::sleep(Duration::from_millis(5)).await;
        })
        .unwrap();
        cores.join();
    }
}

//! Work a shard hands to the blocking pool so that its core goes on with the
//! other shards: a log compaction's snapshot metadata write, and the steps of
//! a snapshot install (building the received store, swapping directories).
//!
//! The jobs are counted. A process that dies takes its threads with it, but a
//! shard driver stopped from outside (the simulator aborts its task to crash
//! a member) leaves its jobs running on the pool: whoever reopens the shard's
//! directory first waits for [`OffCoreJobs::in_flight`] to reach zero, so a
//! swap of the old incarnation never races the recovery of the new one. A
//! job that finished is then as if the crash came just after it. A job's
//! result leaves the count only once it is dropped or taken: an install's
//! store that nobody waits for any more still holds its file's lock.
//!
//! Under simulation ([`OffCoreJobs::simulated`]) a job is a task of the
//! simulation's own thread instead: it waits a seeded stretch of simulated
//! time, as a job on the pool takes a while, then runs. The driver goes on
//! meanwhile, as it does in the daemon, and a seed replays exactly: a thread
//! of the pool would finish when the machine lets it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::{JoinError, JoinHandle};

/// The shard's jobs off its core (on the blocking pool, or under simulation
/// on the simulation's thread), counted while they run. Clones share the
/// count.
#[derive(Clone, Debug, Default)]
pub struct OffCoreJobs {
    count: Arc<AtomicUsize>,
    /// Under simulation: how long each job takes, drawn from a seeded
    /// generator.
    simulated: Option<Arc<SimulatedJobs>>,
}

/// The seeded durations of simulated jobs.
#[derive(Debug)]
struct SimulatedJobs {
    rng: Mutex<SmallRng>,
    longest: Duration,
}

/// Takes a job off the count when dropped: with the job's result (see
/// [`Finished`]), or with the job itself if it never ran (a runtime shutting
/// down) or panicked.
struct Running(Arc<AtomicUsize>);

/// A job's result and its place in the count. Fields drop in declaration
/// order: the result first, then the count, whoever drops it (the waiter
/// that takes the result, or the runtime when nobody waits).
struct Finished<T> {
    result: T,
    /// Held only for its drop.
    _running: Running,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A job off the core; resolves to its result as a `JoinHandle` does. The job's count travels with its result: when nobody waits, the
/// runtime drops the result first, then the count.
pub struct OffCoreJob<T>(JoinHandle<Finished<T>>);

impl<T> Future for OffCoreJob<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.map(|f| f.result))
    }
}

impl OffCoreJobs {
    /// Jobs that run on the simulation's thread (inside a `LocalSet`), each
    /// after a wait of up to `longest`, drawn from `seed`.
    pub(crate) fn simulated(seed: u64, longest: Duration) -> OffCoreJobs {
        OffCoreJobs {
            count: Arc::default(),
            simulated: Some(Arc::new(SimulatedJobs {
                rng: Mutex::new(SmallRng::seed_from_u64(seed)),
                longest,
            })),
        }
    }

    /// Runs `job` on the blocking pool (under simulation: as a task of the
    /// simulation's thread, after its seeded wait).
    pub(super) fn spawn<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> OffCoreJob<T> {
        self.count.fetch_add(1, Ordering::AcqRel);
        let running = Running(self.count.clone());
        let finish = move || Finished {
            result: job(),
            _running: running,
        };
        match &self.simulated {
            None => OffCoreJob(tokio::task::spawn_blocking(finish)),
            Some(sim) => {
                let wait = {
                    let mut rng = sim.rng.lock().unwrap_or_else(|e| e.into_inner());
                    rng.gen_range(Duration::ZERO..=sim.longest)
                };
                OffCoreJob(tokio::task::spawn_local(async move {
                    tokio::time::sleep(wait).await;
                    finish()
                }))
            }
        }
    }

    /// Jobs started and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_is_counted_until_it_ends_even_when_nobody_waits_for_it() {
        let jobs = OffCoreJobs::default();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let handle = jobs.spawn(move || go_rx.recv().is_ok());
        assert_eq!(jobs.in_flight(), 1);
        // The waiter goes away, as when a driver task is aborted.
        drop(handle);
        assert_eq!(jobs.clone().in_flight(), 1);
        go_tx.send(()).unwrap();
        while jobs.in_flight() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let finished = jobs.spawn(|| 7).await.unwrap();
        assert_eq!(finished, 7);
        assert_eq!(jobs.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_simulated_job_waits_runs_on_this_thread_and_drops_its_result_first() {
        struct Lock(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Lock {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let longest = std::time::Duration::from_millis(10);
                let jobs = OffCoreJobs::simulated(7, longest);
                let thread = std::thread::current().id();
                let began = tokio::time::Instant::now();
                let ran_on = jobs.spawn(std::thread::current).await.unwrap().id();
                assert_eq!(
                    ran_on, thread,
                    "a simulated job runs on the simulation's thread"
                );
                assert!(began.elapsed() <= longest);
                assert_eq!(jobs.in_flight(), 0);
                // Nobody waits for this one, as when a crash aborted its driver:
                // it still runs, and its result goes before its count.
                let held = Arc::new(std::sync::atomic::AtomicBool::new(true));
                let lock = Lock(held.clone());
                drop(jobs.spawn(move || lock));
                assert_eq!(jobs.in_flight(), 1);
                while jobs.in_flight() > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                assert!(
                    !held.load(Ordering::SeqCst),
                    "the count ended before the result was dropped"
                );
            })
            .await;
    }

    #[tokio::test]
    async fn a_result_nobody_takes_is_dropped_before_its_job_leaves_the_count() {
        // The result stands for an installed store, whose drop releases its
        // file's lock: whoever waits for the count to reach zero must find
        // it released.
        struct Lock(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Lock {
            fn drop(&mut self) {
                std::thread::sleep(std::time::Duration::from_millis(20));
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let jobs = OffCoreJobs::default();
        // The waiter goes away before the job ends, and after.
        for wait_first in [false, true] {
            let held = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let lock = Lock(held.clone());
            let job = jobs.spawn(move || lock);
            if wait_first {
                while !job.0.is_finished() {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            drop(job);
            while jobs.in_flight() > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            assert!(
                !held.load(Ordering::SeqCst),
                "the count ended before the result was dropped (waiter gone after the end: \
                 {wait_first})"
            );
        }
    }
}

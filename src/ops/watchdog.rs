//! The liveness watchdog: every core must check in before a keepalive goes out.
//!
//! systemd kills a `WatchdogSec=` service that stops sending `WATCHDOG=1`. A single
//! thread sending keepalives would prove only that this thread runs; a wedged core
//! (a task that never yields, a blocked syscall on its runtime) would go unnoticed
//! while the member silently stops serving that core's shards. So the keeper runs
//! in rounds: each round has a generation number, each core stores the current
//! generation when its runtime gets to run the check-in task, and the keeper sends
//! `WATCHDOG=1` (and opens the next round) only when every core has stored the
//! current generation. A wedged core holds the round open; keepalives stop; systemd
//! restarts the member after `WatchdogSec`. The same rounds feed `/livez`.
//!
//! Timing: with a keepalive period P (half of `WatchdogSec`, as systemd advises) and
//! cores checking in every P/4, a healthy round closes at its first tick, and a core
//! wedged for longer than about 2P is caught within `WatchdogSec`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::notify::{Notifier, Sent};

/// Round length when systemd asks for no watchdog: rounds still run so that
/// `/livez` notices a wedged core.
pub const DEFAULT_KEEPALIVE_PERIOD: Duration = Duration::from_secs(5);
/// Shortest round accepted; shorter would make the check-ins themselves a load.
pub const MIN_KEEPALIVE_PERIOD: Duration = Duration::from_millis(10);
/// Check-ins per round: several, so one late timer does not fail a round.
pub const CHECKINS_PER_PERIOD: u32 = 4;

/// Shared state of the rounds; one per member.
#[derive(Debug)]
pub struct Watchdog {
    generation: AtomicU64,
    /// Generation each core last saw.
    seen: Box<[AtomicU64]>,
    /// Consecutive rounds each core let pass without checking in.
    missed_rounds: Box<[AtomicU32]>,
    period: Duration,
}

/// What one keeper tick found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Every core checked in; the next round is open.
    Complete,
    /// These cores have not checked in during the open round.
    Waiting { cores: Vec<usize> },
}

impl Watchdog {
    /// Rounds of `period` (raised to [`MIN_KEEPALIVE_PERIOD`]) for `core_count` cores.
    pub fn new(core_count: usize, period: Duration) -> Arc<Watchdog> {
        assert!(core_count > 0, "watchdog for zero cores");
        Arc::new(Watchdog {
            generation: AtomicU64::new(1),
            seen: (0..core_count).map(|_| AtomicU64::new(0)).collect(),
            missed_rounds: (0..core_count).map(|_| AtomicU32::new(0)).collect(),
            period: period.max(MIN_KEEPALIVE_PERIOD),
        })
    }

    /// Rounds for systemd's `WATCHDOG_USEC` timeout: half of it, as sd_notify(3)
    /// advises; [`DEFAULT_KEEPALIVE_PERIOD`] when there is no systemd watchdog.
    pub fn for_timeout(core_count: usize, timeout: Option<Duration>) -> Arc<Watchdog> {
        Watchdog::new(
            core_count,
            timeout.map_or(DEFAULT_KEEPALIVE_PERIOD, |t| t / 2),
        )
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// How often each core should call [`Watchdog::check_in`].
    pub fn check_in_period(&self) -> Duration {
        self.period / CHECKINS_PER_PERIOD
    }

    pub fn core_count(&self) -> usize {
        self.seen.len()
    }

    /// Called on core `core`'s own runtime, every [`Watchdog::check_in_period`].
    ///
    /// # Panics
    /// If `core` is not below [`Watchdog::core_count`].
    #[inline]
    pub fn check_in(&self, core: usize) {
        let generation = self.generation.load(Ordering::Acquire);
        self.seen[core].store(generation, Ordering::Release);
    }

    /// Runs forever on core `core`'s runtime: spawn it there (e.g. with
    /// `spawn_local`) so it runs only while that runtime does.
    pub async fn run_check_ins(self: Arc<Self>, core: usize) {
        let mut interval = tokio::time::interval(self.check_in_period());
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            self.check_in(core);
        }
    }

    /// One keeper step: closes the round if every core has checked in.
    pub fn tick(&self) -> Round {
        let generation = self.generation.load(Ordering::Acquire);
        let mut waiting = Vec::new();
        for (core, seen) in self.seen.iter().enumerate() {
            if seen.load(Ordering::Acquire) == generation {
                self.missed_rounds[core].store(0, Ordering::Relaxed);
            } else {
                self.missed_rounds[core].fetch_add(1, Ordering::Relaxed);
                waiting.push(core);
            }
        }
        if waiting.is_empty() {
            self.generation.store(generation + 1, Ordering::Release);
            Round::Complete
        } else {
            Round::Waiting { cores: waiting }
        }
    }

    /// Cores that let at least one whole round pass without checking in; empty
    /// while the member is live. Read by `/livez`.
    pub fn stalled_cores(&self) -> Vec<usize> {
        self.missed_rounds
            .iter()
            .enumerate()
            .filter(|(_, m)| m.load(Ordering::Relaxed) > 0)
            .map(|(core, _)| core)
            .collect()
    }

    /// Starts the keeper thread: a tick every period, `WATCHDOG=1` after each
    /// complete round. The returned handle stops it (on [`Keeper::stop`] or drop).
    pub fn spawn_keeper(self: &Arc<Self>, notifier: Notifier) -> std::io::Result<Keeper> {
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let watchdog = Arc::clone(self);
        let thread = std::thread::Builder::new()
            .name("cairn-watchdog".to_string())
            .spawn(move || watchdog.keeper_loop(&notifier, &stop_rx))?;
        Ok(Keeper {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    fn keeper_loop(&self, notifier: &Notifier, stop: &mpsc::Receiver<()>) {
        let mut was_waiting: Vec<usize> = Vec::new();
        loop {
            match stop.recv_timeout(self.period) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Stop asked, or the handle was dropped.
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            match self.tick() {
                Round::Complete => {
                    if !was_waiting.is_empty() {
                        tracing::info!(cores = ?was_waiting, "watchdog: cores checked in again, keepalives resume");
                        was_waiting.clear();
                    }
                    match notifier.watchdog() {
                        Ok(Sent::Delivered | Sent::Skipped) => {}
                        Err(error) => tracing::warn!(%error, "watchdog keepalive not sent"),
                    }
                }
                Round::Waiting { cores } => {
                    if cores != was_waiting {
                        tracing::error!(
                            cores = ?cores,
                            period_ms = self.period.as_millis() as u64,
                            "watchdog: cores have not checked in; withholding keepalives"
                        );
                        was_waiting = cores;
                    }
                }
            }
        }
    }
}

/// The running keeper thread.
#[derive(Debug)]
pub struct Keeper {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Keeper {
    /// Stops the keeper and waits for its thread; no keepalive is sent after.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            // A send error means the thread already ended; join tells us the rest.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("watchdog keeper thread panicked");
            }
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_closes_only_when_every_core_checked_in() {
        let w = Watchdog::new(3, Duration::from_secs(1));
        w.check_in(0);
        w.check_in(2);
        assert_eq!(w.tick(), Round::Waiting { cores: vec![1] });
        assert_eq!(w.stalled_cores(), vec![1]);
        w.check_in(1);
        // Cores 0 and 2 saw this generation already; the round closes.
        assert_eq!(w.tick(), Round::Complete);
        assert!(w.stalled_cores().is_empty());
        // A new round: nobody has seen it yet.
        assert_eq!(
            w.tick(),
            Round::Waiting {
                cores: vec![0, 1, 2]
            }
        );
    }

    #[test]
    fn period_follows_systemd_timeout() {
        let w = Watchdog::for_timeout(1, Some(Duration::from_secs(30)));
        assert_eq!(w.period(), Duration::from_secs(15));
        assert_eq!(w.check_in_period(), Duration::from_millis(3750));
        let w = Watchdog::for_timeout(1, None);
        assert_eq!(w.period(), DEFAULT_KEEPALIVE_PERIOD);
    }
}

//! The member's life as systemd sees it, in the order systemd expects:
//! `STATUS=` while recovering, `READY=1` once [`Readiness`] says ready, then
//! `WATCHDOG=1` keepalives while every core checks in, and `STOPPING=1` when a
//! clean shutdown begins, after which nothing more is sent.
//!
//! The keeper starts only at `READY=1`: before that, systemd's start timeout is
//! what bounds a stuck start (a long WAL replay asks for more time with
//! [`Lifecycle::extend_start_timeout`]). Without `NOTIFY_SOCKET` every step is
//! still taken and nothing is sent, so the daemon runs the same outside systemd.

use std::sync::Arc;
use std::time::Duration;

use super::notify::{watchdog_timeout_from_env, Notifier, NotifyError};
use super::readiness::Readiness;
use super::watchdog::{Keeper, Watchdog};

/// Drives the systemd notifications of one member.
#[derive(Debug)]
pub struct Lifecycle {
    notifier: Notifier,
    watchdog: Arc<Watchdog>,
    keeper: Option<Keeper>,
    stopping: bool,
}

impl Lifecycle {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`. A malformed
    /// value is logged and treated as absent: a member must not refuse to start
    /// because its supervisor's variables are odd.
    pub fn from_env(core_count: usize) -> Lifecycle {
        let notifier = Notifier::from_env().unwrap_or_else(|error| {
            tracing::warn!(%error, "systemd notifications disabled");
            Notifier::disabled()
        });
        let timeout = watchdog_timeout_from_env().unwrap_or_else(|error| {
            tracing::warn!(%error, "systemd watchdog disabled");
            None
        });
        Lifecycle::new(notifier, Watchdog::for_timeout(core_count, timeout))
    }

    pub fn new(notifier: Notifier, watchdog: Arc<Watchdog>) -> Lifecycle {
        Lifecycle {
            notifier,
            watchdog,
            keeper: None,
            stopping: false,
        }
    }

    /// The check-in rounds: give each core `Arc::clone(lifecycle.watchdog())` and
    /// spawn `Watchdog::run_check_ins(core)` on its runtime; hand it to
    /// `OpsEndpoints::new` for `/livez`.
    pub fn watchdog(&self) -> &Arc<Watchdog> {
        &self.watchdog
    }

    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// `STATUS=...` (e.g. "replaying WAL: shard 3 at index 12000").
    pub fn status(&self, status: &str) {
        log_failure(self.notifier.status(status), "STATUS");
    }

    /// Asks systemd for `extra` more start time; call while recovery is slow.
    pub fn extend_start_timeout(&self, extra: Duration) {
        log_failure(self.notifier.extend_timeout(extra), "EXTEND_TIMEOUT_USEC");
    }

    /// Waits until `readiness` reports ready, then sends `READY=1` and starts the
    /// watchdog keeper. Returns at once if shutdown has begun.
    pub async fn ready_when_ready(&mut self, readiness: &Readiness, status: &str) {
        if self.stopping || self.keeper.is_some() {
            return;
        }
        readiness.wait_ready().await;
        log_failure(self.notifier.ready(status), "READY=1");
        tracing::info!(status, "member ready");
        match self.watchdog.spawn_keeper(self.notifier.clone()) {
            Ok(keeper) => self.keeper = Some(keeper),
            // Without the keeper systemd restarts the member at WatchdogSec; say
            // why loudly rather than pretend.
            Err(error) => tracing::error!(%error, "watchdog keeper thread not started"),
        }
    }

    /// Shutdown begins: stops keepalives, then sends `STOPPING=1`. Idempotent.
    pub fn stopping(&mut self, status: &str) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        if let Some(keeper) = self.keeper.take() {
            keeper.stop();
        }
        log_failure(self.notifier.stopping(status), "STOPPING=1");
    }
}

fn log_failure(sent: Result<super::notify::Sent, NotifyError>, what: &str) {
    if let Err(error) = sent {
        tracing::warn!(%error, notification = what, "systemd notification failed");
    }
}

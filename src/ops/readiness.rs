//! Whether this member is ready to serve, as the daemon reports it.
//!
//! Ready means: every shard has recovered (opened its store and replayed its WAL),
//! every shard's Raft group knows a leader, and the member has caught up with the
//! leaders (applied what was committed when it joined). `/readyz`, `/health` and
//! the systemd `READY=1` notification all read the same [`Readiness`]. Updates are
//! rare (leader changes, the end of recovery), so they are plain atomic stores plus
//! a wake-up of whoever awaits readiness; reads never block writers.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// An alarm that makes `/health` report unhealthy, as etcd's alarms do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alarm {
    /// The backend quota is exhausted; writes are refused.
    NoSpace,
    /// A store failed its consistency check.
    Corrupt,
}

impl Alarm {
    fn bit(self) -> u32 {
        match self {
            Alarm::NoSpace => 1,
            Alarm::Corrupt => 2,
        }
    }

    /// etcd's reason text for `/health`.
    pub fn reason(self) -> &'static str {
        match self {
            Alarm::NoSpace => "ALARM NOSPACE",
            Alarm::Corrupt => "ALARM CORRUPT",
        }
    }

    const ALL: [Alarm; 2] = [Alarm::NoSpace, Alarm::Corrupt];
}

/// The readiness source. The daemon owns the write side; the HTTP layer and the
/// systemd notifier read it.
#[derive(Debug)]
pub struct Readiness {
    recovered: AtomicBool,
    /// Shard ids, sorted; `has_leader[i]` and `caught_up[i]` belong to `shards[i]`.
    shards: Box<[u32]>,
    has_leader: Box<[AtomicBool]>,
    caught_up: Box<[AtomicBool]>,
    alarms: AtomicU32,
    changed: Notify,
}

/// One reading of every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessReport {
    pub recovered: bool,
    /// Every shard has applied what was committed when it (re)joined.
    pub caught_up: bool,
    /// Shards whose Raft group knows no leader, in shard id order.
    pub shards_without_leader: Vec<u32>,
    /// Shards still catching up, in shard id order.
    pub shards_catching_up: Vec<u32>,
    pub alarms: Vec<Alarm>,
}

impl ReadinessReport {
    /// Ready to serve: recovered, a leader for every shard, caught up.
    pub fn is_ready(&self) -> bool {
        self.recovered && self.caught_up && self.shards_without_leader.is_empty()
    }

    /// Healthy in etcd's sense: ready and no alarm raised.
    pub fn is_healthy(&self) -> bool {
        self.is_ready() && self.alarms.is_empty()
    }

    /// etcd's `/health` reason text, empty when healthy.
    pub fn health_reason(&self) -> String {
        let mut reasons: Vec<String> = Vec::new();
        if !self.shards_without_leader.is_empty() {
            reasons.push(format!(
                "RAFT NO LEADER (shards {})",
                join(&self.shards_without_leader)
            ));
        }
        if !self.recovered {
            reasons.push("NOT RECOVERED".to_string());
        }
        if !self.caught_up {
            reasons.push(format!(
                "NOT CAUGHT UP (shards {})",
                join(&self.shards_catching_up)
            ));
        }
        reasons.extend(self.alarms.iter().map(|a| a.reason().to_string()));
        reasons.join("; ")
    }
}

fn join(shards: &[u32]) -> String {
    shards
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Readiness {
    /// A source for the given shards, not ready: nothing recovered, no leaders.
    pub fn new(shards: &[u32]) -> Arc<Readiness> {
        let mut sorted = shards.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let has_leader = sorted.iter().map(|_| AtomicBool::new(false)).collect();
        let caught_up = sorted.iter().map(|_| AtomicBool::new(false)).collect();
        Arc::new(Readiness {
            recovered: AtomicBool::new(false),
            shards: sorted.into_boxed_slice(),
            has_leader,
            caught_up,
            alarms: AtomicU32::new(0),
            changed: Notify::new(),
        })
    }

    pub fn set_recovered(&self, recovered: bool) {
        self.recovered.store(recovered, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Member-wide: marks every shard caught up (or not) at once, for tools
    /// and tests. Shards report with [`Readiness::set_shard_caught_up`], so
    /// that one shard catching up does not vouch for the others.
    pub fn set_caught_up(&self, caught_up: bool) {
        for flag in self.caught_up.iter() {
            flag.store(caught_up, Ordering::Release);
        }
        self.changed.notify_waiters();
    }

    /// # Panics
    /// If `shard` was not declared to [`Readiness::new`].
    pub fn set_shard_caught_up(&self, shard: u32, caught_up: bool) {
        let i = self.slot(shard);
        self.caught_up[i].store(caught_up, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// # Panics
    /// If `shard` was not declared to [`Readiness::new`]: the daemon reports a
    /// shard it does not run.
    pub fn set_shard_has_leader(&self, shard: u32, has_leader: bool) {
        let i = self.slot(shard);
        self.has_leader[i].store(has_leader, Ordering::Release);
        self.changed.notify_waiters();
    }

    fn slot(&self, shard: u32) -> usize {
        let Ok(i) = self.shards.binary_search(&shard) else {
            panic!(
                "readiness: shard {shard} reported, but only shards {} were declared",
                join(&self.shards)
            );
        };
        i
    }

    pub fn set_alarm(&self, alarm: Alarm, raised: bool) {
        if raised {
            self.alarms.fetch_or(alarm.bit(), Ordering::AcqRel);
        } else {
            self.alarms.fetch_and(!alarm.bit(), Ordering::AcqRel);
        }
        self.changed.notify_waiters();
    }

    pub fn report(&self) -> ReadinessReport {
        let alarms = self.alarms.load(Ordering::Acquire);
        let unset = |flags: &[AtomicBool]| -> Vec<u32> {
            self.shards
                .iter()
                .zip(flags.iter())
                .filter(|(_, f)| !f.load(Ordering::Acquire))
                .map(|(s, _)| *s)
                .collect()
        };
        let shards_catching_up = unset(&self.caught_up);
        ReadinessReport {
            recovered: self.recovered.load(Ordering::Acquire),
            caught_up: shards_catching_up.is_empty(),
            shards_without_leader: unset(&self.has_leader),
            shards_catching_up,
            alarms: Alarm::ALL
                .into_iter()
                .filter(|a| alarms & a.bit() != 0)
                .collect(),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.report().is_ready()
    }

    /// Whether every shard's Raft group knows a leader.
    pub fn every_shard_has_leader(&self) -> bool {
        self.has_leader.iter().all(|f| f.load(Ordering::Acquire))
    }

    /// Whether the Raft group of each of `shards` knows a leader (a shard
    /// not declared counts as having none).
    pub fn shards_have_leader(&self, shards: &[u32]) -> bool {
        shards.iter().all(|s| {
            self.shards
                .binary_search(s)
                .is_ok_and(|i| self.has_leader[i].load(Ordering::Acquire))
        })
    }

    /// Resolves once the member is ready (at once if it already is). The daemon
    /// awaits this before sending systemd `READY=1`.
    pub async fn wait_ready(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Register before checking, so a change between check and await is
            // not missed.
            notified.as_mut().enable();
            if self.is_ready() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_every_check() {
        let r = Readiness::new(&[2, 0, 1]);
        assert!(!r.is_ready());
        r.set_recovered(true);
        r.set_caught_up(true);
        r.set_shard_has_leader(0, true);
        r.set_shard_has_leader(2, true);
        let report = r.report();
        assert_eq!(report.shards_without_leader, vec![1]);
        assert!(r.shards_have_leader(&[0, 2]));
        assert!(!r.shards_have_leader(&[0, 1]));
        assert!(!r.shards_have_leader(&[7]), "a shard not declared");
        assert_eq!(report.health_reason(), "RAFT NO LEADER (shards 1)");
        r.set_shard_has_leader(1, true);
        assert!(r.is_ready());
        r.set_alarm(Alarm::NoSpace, true);
        let report = r.report();
        assert!(report.is_ready() && !report.is_healthy());
        assert_eq!(report.health_reason(), "ALARM NOSPACE");
        r.set_alarm(Alarm::NoSpace, false);
        assert!(r.report().is_healthy());
    }

    #[test]
    fn every_shard_must_catch_up() {
        let r = Readiness::new(&[0, 1]);
        r.set_recovered(true);
        r.set_shard_has_leader(0, true);
        r.set_shard_has_leader(1, true);
        r.set_shard_caught_up(1, true);
        let report = r.report();
        assert!(!report.is_ready());
        assert_eq!(report.shards_catching_up, vec![0]);
        assert_eq!(report.health_reason(), "NOT CAUGHT UP (shards 0)");
        r.set_shard_caught_up(0, true);
        assert!(r.is_ready());
        r.set_caught_up(false);
        assert_eq!(r.report().shards_catching_up, vec![0, 1]);
    }

    #[test]
    #[should_panic(expected = "shard 9 reported")]
    fn unknown_shard_is_a_bug() {
        Readiness::new(&[0]).set_shard_has_leader(9, true);
    }

    #[tokio::test]
    async fn wait_ready_wakes_on_the_last_check() {
        let r = Readiness::new(&[0]);
        let waiter = tokio::spawn({
            let r = Arc::clone(&r);
            async move { r.wait_ready().await }
        });
        r.set_recovered(true);
        r.set_caught_up(true);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        r.set_shard_has_leader(0, true);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("wait_ready did not wake")
            .unwrap();
    }
}

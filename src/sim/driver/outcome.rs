//! What a run of the driver simulation reports: its counters, each seed's
//! outcome, and why a run could not start.

use super::DriverViolation;
use crate::sim::SimConfigError;

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverSimStats {
    pub puts_acknowledged: u64,
    pub puts_failed: u64,
    pub reads_served: u64,
    pub reads_failed: u64,
    /// Reads of every client key at one read point (several shards).
    pub reads_over_shards: u64,
    /// Txns of puts (several shards), and those over several shards.
    pub txns_acknowledged: u64,
    pub txns_failed: u64,
    /// Acknowledged txns whose compare chose the failure branch.
    pub txns_compare_failed: u64,
    /// Watches the watch sessions started, and the events they were sent.
    pub watches: u64,
    pub watch_events: u64,
    /// Batches of a shard that stopped at its watch's window.
    pub watch_window_stops: u64,
    /// Leases granted with a key, keep-alives answered, and leases their
    /// client saw gone.
    pub leases: u64,
    pub lease_renewals: u64,
    pub leases_seen_gone: u64,
    /// Keep-alives answered by a renewal that named several leases.
    pub lease_renewals_together: u64,
    pub crashes: u64,
    pub partitions: u64,
    /// Leader transfers a leader started.
    pub transfers: u64,
    /// Times a member's revision counter opened (several shards).
    pub keyspace_openings: u64,
    /// Txns over several shards that joined a batch another led.
    pub txns_batched: u64,
    /// Stale-view episodes begun, and those that reached two members each
    /// believing they lead every shard (several shards).
    pub stale_view_episodes: u64,
    pub stale_views: u64,
    /// Members added as learners, promoted and removed.
    pub membership_changes: u64,
    /// Snapshot streams started, and handed whole to their receiver.
    pub snapshots_started: u64,
    pub snapshots_delivered: u64,
    pub messages_delivered: u64,
    pub messages_dropped: u64,
    /// The Raft term the group ended in: elections it went through.
    pub final_term: u64,
    /// Simulated time from the end of the faults to the liveness goal.
    pub recovery_ms: u64,
    /// The errors clients were answered with, by their text's start.
    pub errors: std::collections::BTreeMap<String, u64>,
}

impl DriverSimStats {
    pub fn add(&mut self, o: &DriverSimStats) {
        self.puts_acknowledged += o.puts_acknowledged;
        self.puts_failed += o.puts_failed;
        self.reads_served += o.reads_served;
        self.reads_failed += o.reads_failed;
        self.txns_acknowledged += o.txns_acknowledged;
        self.txns_failed += o.txns_failed;
        self.reads_over_shards += o.reads_over_shards;
        self.txns_compare_failed += o.txns_compare_failed;
        self.watches += o.watches;
        self.watch_events += o.watch_events;
        self.watch_window_stops += o.watch_window_stops;
        self.leases += o.leases;
        self.lease_renewals += o.lease_renewals;
        self.leases_seen_gone += o.leases_seen_gone;
        self.lease_renewals_together += o.lease_renewals_together;
        self.crashes += o.crashes;
        self.partitions += o.partitions;
        self.transfers += o.transfers;
        self.keyspace_openings += o.keyspace_openings;
        self.txns_batched += o.txns_batched;
        self.stale_view_episodes += o.stale_view_episodes;
        self.stale_views += o.stale_views;
        self.membership_changes += o.membership_changes;
        self.snapshots_started += o.snapshots_started;
        self.snapshots_delivered += o.snapshots_delivered;
        self.messages_delivered += o.messages_delivered;
        self.messages_dropped += o.messages_dropped;
        self.final_term = self.final_term.max(o.final_term);
        self.recovery_ms = self.recovery_ms.max(o.recovery_ms);
        for (e, n) in &o.errors {
            *self.errors.entry(e.clone()).or_default() += n;
        }
    }
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct DriverSimOutcome {
    pub seed: u64,
    pub members: usize,
    pub shards: usize,
    pub stats: DriverSimStats,
    pub violation: Option<DriverViolation>,
    /// A digest of every message the members sent, in order, with when:
    /// two runs of one seed that agree on it took the same course.
    pub wire_digest: u64,
    pub messages_sent: u64,
    /// One line per message sent, when the config asked for a trace.
    pub trace: Vec<String>,
}

impl std::fmt::Display for DriverSimOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.violation {
            None => write!(
                f,
                "seed={} members={} shards={} ok",
                self.seed, self.members, self.shards
            ),
            Some(v) => write!(
                f,
                "seed={} members={} shards={} VIOLATION {v}",
                self.seed, self.members, self.shards
            ),
        }
    }
}

/// Why a driver simulation could not run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverSimError {
    #[error(transparent)]
    Config(#[from] SimConfigError),
    #[error("the driver simulation needs tokio's clock paused (a current-thread runtime started paused)")]
    ClockRuns,
    #[error("setting up the simulated members: {0}")]
    Setup(String),
}

//! The metrics the Cairn daemon exports, with etcd's names where the meaning is the
//! same, so that etcd dashboards and alerts work unchanged.
//!
//! Each figure is kept per core or per shard (Cairn's own `cairn_*` families, with
//! `core` and `shard` labels) and rendered a second time member-wide under etcd's
//! name: summed for counts and sizes, the minimum for `etcd_server_has_leader` (1
//! only when every shard has a leader, the member-level meaning etcd's alerts test).
//! etcd renders `proposals_committed_total` and `proposals_applied_total` as gauges
//! holding the Raft commit and apply index; Cairn keeps that type and meaning,
//! summed over shards.

use std::sync::Arc;
use std::time::Duration;

use super::metrics::{
    Aggregate, CoreCounter, CoreGauge, CoreHistogram, CoreInfo, CoreMetrics, MemberSeries,
    MetricSpec, MetricType, MetricsError, Registry, RegistryBuilder, ShardCounter, ShardGauge,
    ShardHistogram, ShardMetrics, BATCH_SIZE, ETCD_DISK_SECONDS, REQUEST_SECONDS, SHORT_SECONDS,
};

/// Which WAL backend a core's log runs on (`cairn_wal_backend_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalBackendKind {
    IoUring,
    Sync,
}

const WAL_BACKEND_VALUES: &[&str] = &["io_uring", "sync"];

impl WalBackendKind {
    fn index(self) -> usize {
        match self {
            WalBackendKind::IoUring => 0,
            WalBackendKind::Sync => 1,
        }
    }

    pub fn label(self) -> &'static str {
        WAL_BACKEND_VALUES[self.index()]
    }
}

const fn member(
    name: &'static str,
    help: &'static str,
    rendered_as: MetricType,
    aggregate: Aggregate,
) -> MemberSeries {
    MemberSeries {
        name,
        help,
        rendered_as,
        aggregate,
    }
}

#[derive(Debug)]
struct Ids {
    wal_fsync: CoreHistogram,
    wal_flush: CoreHistogram,
    kv_request: CoreHistogram,
    wal_batch_size: CoreHistogram,
    wal_backend: CoreInfo,
    wal_written_bytes: CoreCounter,
    shard_commands: CoreCounter,
    forwarded_commands: CoreCounter,
    idle_polls: CoreCounter,
    idle_poll_hits: CoreCounter,
    idle_poll_time: CoreHistogram,
    auth_failures_limited: CoreCounter,
    watch_merge_held: CoreGauge,
    watch_streams: CoreGauge,
    watchers: CoreGauge,
    has_leader: ShardGauge,
    is_leader: ShardGauge,
    leader_changes: ShardCounter,
    term: ShardGauge,
    committed_index: ShardGauge,
    applied_index: ShardGauge,
    proposals_pending: ShardGauge,
    proposals_failed: ShardCounter,
    slow_applies: ShardCounter,
    apply_turns_capped: ShardCounter,
    cross_holds: ShardCounter,
    cross_held_txns: ShardCounter,
    backend_commit: ShardHistogram,
    store_commit: ShardHistogram,
    backend_commit_step: ShardHistogram,
    compaction_index_step: ShardHistogram,
    proposal: ShardHistogram,
    db_size_bytes: ShardGauge,
    db_size_in_use_bytes: ShardGauge,
}

impl Ids {
    fn register(b: &mut RegistryBuilder) -> Result<Ids, MetricsError> {
        use Aggregate::{Min, Sum};
        use MetricType::{Counter, Gauge, Histogram};
        Ok(Ids {
            wal_fsync: b.core_histogram(
                MetricSpec::new(
                    "cairn_core_wal_fsync_duration_seconds",
                    "Latency of the data syncs of this core's WAL (one per group commit).",
                )
                .with_member(member(
                    "etcd_disk_wal_fsync_duration_seconds",
                    "The latency distributions of fsync called by WAL.",
                    Histogram,
                    Sum,
                )),
                ETCD_DISK_SECONDS,
            )?,
            wal_flush: b.core_histogram(
                MetricSpec::new(
                    "cairn_core_wal_flush_duration_seconds",
                    "Latency of each group flush of this core's WAL, from its write to \
                     durable (the fsync histogram's events, in buckets from 50 µs; a batch's \
                     wait for the flush before it is not included).",
                ),
                REQUEST_SECONDS,
            )?,
            kv_request: b.core_histogram(
                MetricSpec::new(
                    "cairn_core_kv_request_duration_seconds",
                    "Time the KV service took for a unary KV call (Range, Put, DeleteRange, \
                     Txn) this core's gRPC server decoded: from the call on the decoded request \
                     to its answer, before the answer is framed. Calls handed to tonic \
                     (compressed, or under --grpc-server tonic) are not timed.",
                ),
                REQUEST_SECONDS,
            )?,
            wal_batch_size: b.core_histogram(
                MetricSpec::new(
                    "cairn_wal_group_commit_batch_size",
                    "Appends made durable by one group-commit flush of this core's WAL.",
                ),
                BATCH_SIZE,
            )?,
            wal_backend: b.core_info(
                MetricSpec::new(
                    "cairn_wal_backend_info",
                    "WAL I/O backend in use on this core: io_uring, or sync (pwrite + fdatasync).",
                ),
                "backend",
                WAL_BACKEND_VALUES,
            )?,
            wal_written_bytes: b.core_counter(MetricSpec::new(
                "cairn_core_wal_written_bytes_total",
                "Bytes appended to this core's WAL.",
            ))?,
            shard_commands: b.core_counter(MetricSpec::new(
                "cairn_core_shard_commands_total",
                "Commands this core sent to shard drivers: one per request a single shard \
                 serves, one per shard for requests over several, and those a transaction or \
                 watch over several shards sends after its request (holds, releases, \
                 cancels).",
            ))?,
            forwarded_commands: b.core_counter(MetricSpec::new(
                "cairn_core_forwarded_commands_total",
                "Of this core's shard commands, those sent to a shard another core owns.",
            ))?,
            auth_failures_limited: b.core_counter(MetricSpec::new(
                "cairn_auth_failures_limited_total",
                "Authenticate calls refused because the user or the client address failed too often.",
            ))?,
            watch_merge_held: b.core_gauge(MetricSpec::new(
                "cairn_core_watch_merge_held_events",
                "Events that this core's watches over several shards hold until every shard \
                 of the watch has sent as far (at most a window of revisions past what each \
                 watch released; a shard further ahead waits and reads from its store).",
            ))?,
            watch_streams: b.core_gauge(
                MetricSpec::new(
                    "cairn_core_watch_streams",
                    "Watch streams open on this core's client connections.",
                )
                .with_member(member(
                    "etcd_debugging_mvcc_watch_stream_total",
                    "Total number of watch streams.",
                    Gauge,
                    Sum,
                )),
            )?,
            watchers: b.core_gauge(
                MetricSpec::new(
                    "cairn_core_watchers",
                    "Watches live on this core's watch streams (created, not cancelled, not \
                     ended by a compaction).",
                )
                .with_member(member(
                    "etcd_debugging_mvcc_watcher_total",
                    "Total number of watchers.",
                    Gauge,
                    Sum,
                )),
            )?,
            idle_polls: b.core_counter(MetricSpec::new(
                "cairn_core_idle_polls_total",
                "Times this core polled for work before sleeping (--idle-poll-us).",
            ))?,
            idle_poll_hits: b.core_counter(MetricSpec::new(
                "cairn_core_idle_poll_hits_total",
                "Idle polls of this core that found an event ready before their window ran out.",
            ))?,
            idle_poll_time: b.core_histogram(
                MetricSpec::new(
                    "cairn_core_idle_poll_duration_seconds",
                    "Time this core spent in each idle poll: CPU spent waiting for work (its sum \
                     is the polling's share of the process's CPU time).",
                ),
                SHORT_SECONDS,
            )?,
            has_leader: b.shard_gauge(
                MetricSpec::new(
                    "cairn_shard_has_leader",
                    "Whether this shard's Raft group knows a leader: 1 yes, 0 no.",
                )
                .with_member(member(
                    "etcd_server_has_leader",
                    "Whether or not a leader exists. 1 is existence, 0 is not.",
                    Gauge,
                    Min,
                )),
            )?,
            is_leader: b.shard_gauge(MetricSpec::new(
                "cairn_shard_is_leader",
                "Whether this member leads this shard: 1 yes, 0 no.",
            ))?,
            leader_changes: b.shard_counter(
                MetricSpec::new(
                    "cairn_shard_leader_changes_seen_total",
                    "Leader changes seen by this shard.",
                )
                .with_member(member(
                    "etcd_server_leader_changes_seen_total",
                    "The number of leader changes seen.",
                    Counter,
                    Sum,
                )),
            )?,
            term: b.shard_gauge(MetricSpec::new(
                "cairn_shard_raft_term",
                "Current Raft term of this shard.",
            ))?,
            committed_index: b.shard_gauge(
                MetricSpec::new(
                    "cairn_shard_proposals_committed_total",
                    "Raft commit index of this shard.",
                )
                .with_member(member(
                    "etcd_server_proposals_committed_total",
                    "The total number of consensus proposals committed.",
                    Gauge,
                    Sum,
                )),
            )?,
            applied_index: b.shard_gauge(
                MetricSpec::new(
                    "cairn_shard_proposals_applied_total",
                    "Raft index applied to this shard's store.",
                )
                .with_member(member(
                    "etcd_server_proposals_applied_total",
                    "The total number of consensus proposals applied.",
                    Gauge,
                    Sum,
                )),
            )?,
            proposals_pending: b.shard_gauge(
                MetricSpec::new(
                    "cairn_shard_proposals_pending",
                    "Proposals of this shard waiting to commit.",
                )
                .with_member(member(
                    "etcd_server_proposals_pending",
                    "The current number of pending proposals to commit.",
                    Gauge,
                    Sum,
                )),
            )?,
            proposals_failed: b.shard_counter(
                MetricSpec::new(
                    "cairn_shard_proposals_failed_total",
                    "Proposals of this shard that failed.",
                )
                .with_member(member(
                    "etcd_server_proposals_failed_total",
                    "The total number of failed proposals seen.",
                    Counter,
                    Sum,
                )),
            )?,
            slow_applies: b.shard_counter(
                MetricSpec::new(
                    "cairn_shard_slow_apply_total",
                    "Applies of this shard that took longer than the slow-apply threshold.",
                )
                .with_member(member(
                    "etcd_server_slow_apply_total",
                    "The total number of slow apply requests (likely overloaded from slow disk).",
                    Counter,
                    Sum,
                )),
            )?,
            apply_turns_capped: b.shard_counter(MetricSpec::new(
                "cairn_shard_apply_turns_capped_total",
                "Turns of this shard's driver that stopped applying at the per-turn budget \
                 and left the rest of the committed entries for the next turn.",
            ))?,
            cross_holds: b.shard_counter(MetricSpec::new(
                "cairn_shard_cross_txn_holds_total",
                "Holds of this shard (led here) by txns over several shards; a hold \
                 serves one txn or a batch of txns over the same shards and other keys.",
            ))?,
            cross_held_txns: b.shard_counter(MetricSpec::new(
                "cairn_shard_cross_txn_held_txns_total",
                "Txns over several shards the holds of this shard served (divided by \
                 cairn_shard_cross_txn_holds_total: the mean batch).",
            ))?,
            backend_commit: b.shard_histogram(
                MetricSpec::new(
                    "cairn_shard_backend_commit_duration_seconds",
                    "Time each commit of this shard's MVCC store held the core: the sum of \
                     its steps (cairn_shard_backend_commit_step_duration_seconds). Its sync \
                     is the store's syncer's.",
                )
                .with_member(member(
                    "etcd_disk_backend_commit_duration_seconds",
                    "The latency distributions of commit called by backend.",
                    Histogram,
                    Sum,
                )),
                ETCD_DISK_SECONDS,
            )?,
            store_commit: b.shard_histogram(
                MetricSpec::new(
                    "cairn_shard_store_commit_duration_seconds",
                    "Time each commit of this shard's MVCC store held the core: the events \
                     of cairn_shard_backend_commit_duration_seconds in buckets from 50 µs, \
                     where a commit of a few puts falls.",
                ),
                REQUEST_SECONDS,
            )?,
            backend_commit_step: b.shard_histogram(
                MetricSpec::new(
                    "cairn_shard_backend_commit_step_duration_seconds",
                    "Time each step of a commit of this shard's MVCC store held the core. \
                     A commit goes on in steps, between the core's other work.",
                ),
                SHORT_SECONDS,
            )?,
            compaction_index_step: b.shard_histogram(
                MetricSpec::new(
                    "cairn_shard_compaction_index_step_duration_seconds",
                    "Time each step of a compaction's pass over this shard's key index held \
                     the core. The pass goes on in steps, between the core's other work.",
                ),
                SHORT_SECONDS,
            )?,
            proposal: b.shard_histogram(
                MetricSpec::new(
                    "cairn_shard_proposal_duration_seconds",
                    "Time from a proposal on this member to its apply here, for proposals \
                     a request waits for (client writes, parts of txns over several shards): \
                     durable on a quorum, committed, applied. Proposals that fail or expire \
                     are not timed.",
                ),
                REQUEST_SECONDS,
            )?,
            db_size_bytes: b.shard_gauge(
                MetricSpec::new(
                    "cairn_shard_db_total_size_in_bytes",
                    "Size of this shard's store file.",
                )
                .with_member(member(
                    "etcd_mvcc_db_total_size_in_bytes",
                    "Total size of the underlying database physically allocated in bytes.",
                    Gauge,
                    Sum,
                )),
            )?,
            db_size_in_use_bytes: b.shard_gauge(
                MetricSpec::new(
                    "cairn_shard_db_total_size_in_use_in_bytes",
                    "Bytes of this shard's store file in live pages.",
                )
                .with_member(member(
                    "etcd_mvcc_db_total_size_in_use_in_bytes",
                    "Total size of the underlying database logically in use in bytes.",
                    Gauge,
                    Sum,
                )),
            )?,
        })
    }
}

/// Builds the daemon's registry for `core_count` cores and the given placement of
/// shards on cores (`(shard, core)` pairs). Returns the registry (the scrape side,
/// handed to the HTTP layer) and one recorder per core, index = core.
pub fn server_metrics(
    core_count: usize,
    placement: &[(u32, usize)],
) -> Result<(Registry, Vec<CoreRecorder>), MetricsError> {
    let mut builder = RegistryBuilder::new(core_count)?;
    builder.with_process_metrics();
    for &(shard, core) in placement {
        builder.place_shard(shard, core)?;
    }
    let ids = Arc::new(Ids::register(&mut builder)?);
    let registry = builder.build();
    let recorders = (0..core_count)
        .map(|core| CoreRecorder {
            metrics: registry.core(core),
            ids: Arc::clone(&ids),
        })
        .collect();
    Ok((registry, recorders))
}

/// What one core records. Lives on that core's thread.
#[derive(Debug, Clone)]
pub struct CoreRecorder {
    metrics: CoreMetrics,
    ids: Arc<Ids>,
}

impl CoreRecorder {
    pub fn core(&self) -> usize {
        self.metrics.core()
    }

    /// An Authenticate call refused by the failure limiter.
    pub fn auth_failure_limited(&self) {
        self.metrics.counter_add(self.ids.auth_failures_limited, 1);
    }

    /// Events held by this core's watches over several shards went up or
    /// down by `delta`.
    pub fn watch_merge_held(&self, delta: i64) {
        self.metrics.gauge_add(self.ids.watch_merge_held, delta);
    }

    /// A watch stream opened (1) or ended (-1) on this core.
    pub fn watch_streams(&self, delta: i64) {
        self.metrics.gauge_add(self.ids.watch_streams, delta);
    }

    /// Watches live on this core's streams went up or down by `delta`.
    pub fn watchers(&self, delta: i64) {
        self.metrics.gauge_add(self.ids.watchers, delta);
    }

    /// After each WAL data sync (fdatasync, or the completion of an O_DSYNC
    /// write): its latency from submission to completion.
    #[inline]
    pub fn wal_fsync(&self, elapsed: Duration) {
        self.metrics.observe_duration(self.ids.wal_fsync, elapsed);
        self.metrics.observe_duration(self.ids.wal_flush, elapsed);
    }

    /// After each group-commit flush: how many appends and bytes it made durable.
    #[inline]
    pub fn wal_group_commit(&self, appends: u64, written_bytes: u64) {
        self.metrics.observe(self.ids.wal_batch_size, appends);
        self.metrics
            .counter_add(self.ids.wal_written_bytes, written_bytes);
    }

    /// Once the core's WAL has chosen its backend (and again if it falls back).
    pub fn set_wal_backend(&self, backend: WalBackendKind) {
        self.metrics.info_set(self.ids.wal_backend, backend.index());
    }

    /// A unary KV call the KV service answered after `elapsed` (from the
    /// call on the decoded request to its answer, before framing).
    #[inline]
    pub fn kv_request(&self, elapsed: Duration) {
        self.metrics.observe_duration(self.ids.kv_request, elapsed);
    }

    /// A command sent to a shard driver; `forwarded` when another core owns
    /// the shard.
    #[inline]
    pub fn shard_command(&self, forwarded: bool) {
        self.metrics.counter_add(self.ids.shard_commands, 1);
        if forwarded {
            self.metrics.counter_add(self.ids.forwarded_commands, 1);
        }
    }

    /// One idle poll, which found work (`hit`) or ran out its window, after
    /// polling for `polled`.
    #[inline]
    pub fn idle_poll(&self, hit: bool, polled: Duration) {
        self.metrics.counter_add(self.ids.idle_polls, 1);
        self.metrics
            .observe_duration(self.ids.idle_poll_time, polled);
        if hit {
            self.metrics.counter_add(self.ids.idle_poll_hits, 1);
        }
    }

    /// The recorder of a shard owned by this core; `None` if it lives elsewhere.
    pub fn shard(&self, shard: u32) -> Option<ShardRecorder> {
        Some(ShardRecorder {
            metrics: self.metrics.shard(shard)?,
            ids: Arc::clone(&self.ids),
        })
    }

    /// The generic handle, for figures outside this catalogue.
    pub fn metrics(&self) -> &CoreMetrics {
        &self.metrics
    }
}

/// What one shard records. Lives on its owning core's thread.
#[derive(Debug, Clone)]
pub struct ShardRecorder {
    metrics: ShardMetrics,
    ids: Arc<Ids>,
}

impl ShardRecorder {
    pub fn shard(&self) -> u32 {
        self.metrics.shard()
    }

    /// After each Raft `Ready` that carries a soft-state change: whether a leader
    /// is known and whether it is this member. Counts a leader change whenever the
    /// known leader becomes a different, known member (as etcd does).
    pub fn set_leader(&self, leader_known: bool, is_self: bool, leader_changed: bool) {
        self.metrics
            .gauge_set(self.ids.has_leader, i64::from(leader_known));
        self.metrics
            .gauge_set(self.ids.is_leader, i64::from(leader_known && is_self));
        if leader_changed && leader_known {
            self.metrics.counter_add(self.ids.leader_changes, 1);
        }
    }

    pub fn set_term(&self, term: u64) {
        self.metrics.gauge_set(self.ids.term, saturating_i64(term));
    }

    /// The Raft commit index, after each `Ready` whose hard state moved it.
    pub fn set_committed_index(&self, index: u64) {
        self.metrics
            .gauge_set(self.ids.committed_index, saturating_i64(index));
    }

    /// The index applied to the store, after each apply batch.
    pub fn set_applied_index(&self, index: u64) {
        self.metrics
            .gauge_set(self.ids.applied_index, saturating_i64(index));
    }

    /// +1 when a proposal is handed to Raft, -1 when it commits or fails.
    #[inline]
    pub fn proposals_pending_add(&self, delta: i64) {
        self.metrics.gauge_add(self.ids.proposals_pending, delta);
    }

    #[inline]
    pub fn proposal_failed(&self) {
        self.metrics.counter_add(self.ids.proposals_failed, 1);
    }

    /// An apply that exceeded the slow-apply threshold (etcd warns at 100 ms).
    #[inline]
    pub fn slow_apply(&self) {
        self.metrics.counter_add(self.ids.slow_applies, 1);
    }

    /// A turn that stopped applying at its budget (the rest goes on next turn).
    #[inline]
    pub fn apply_turn_capped(&self) {
        self.metrics.counter_add(self.ids.apply_turns_capped, 1);
    }

    /// A hold of the shard by a batch of `txns` txns over several shards.
    #[inline]
    pub fn cross_hold(&self, txns: u64) {
        self.metrics.counter_add(self.ids.cross_holds, 1);
        self.metrics.counter_add(self.ids.cross_held_txns, txns);
    }

    /// A proposal made on this member for a waiting request, applied
    /// `elapsed` after it was proposed.
    #[inline]
    pub fn proposal_applied(&self, elapsed: Duration) {
        self.metrics.observe_duration(self.ids.proposal, elapsed);
    }

    /// After each commit of the shard's MVCC store: its steps' time in all.
    #[inline]
    pub fn backend_commit(&self, elapsed: Duration) {
        self.metrics
            .observe_duration(self.ids.backend_commit, elapsed);
        self.metrics
            .observe_duration(self.ids.store_commit, elapsed);
    }

    /// After each step of a commit of the shard's MVCC store.
    #[inline]
    pub fn backend_commit_step(&self, elapsed: Duration) {
        self.metrics
            .observe_duration(self.ids.backend_commit_step, elapsed);
    }

    /// After each step of a compaction's pass over the shard's key index.
    pub fn compaction_index_step(&self, elapsed: Duration) {
        self.metrics
            .observe_duration(self.ids.compaction_index_step, elapsed);
    }

    /// After each store commit: file size and bytes in live pages.
    pub fn set_db_size(&self, total_bytes: u64, in_use_bytes: u64) {
        self.metrics
            .gauge_set(self.ids.db_size_bytes, saturating_i64(total_bytes));
        self.metrics
            .gauge_set(self.ids.db_size_in_use_bytes, saturating_i64(in_use_bytes));
    }

    /// The generic handle, for figures outside this catalogue.
    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_etcd_family_is_present_with_etcd_type() {
        let (registry, _) = server_metrics(2, &[(0, 0), (1, 1)]).unwrap();
        let text = registry.render();
        for (name, ty) in [
            ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
            ("etcd_disk_backend_commit_duration_seconds", "histogram"),
            ("etcd_server_proposals_committed_total", "gauge"),
            ("etcd_server_proposals_applied_total", "gauge"),
            ("etcd_server_proposals_pending", "gauge"),
            ("etcd_server_proposals_failed_total", "counter"),
            ("etcd_server_leader_changes_seen_total", "counter"),
            ("etcd_server_has_leader", "gauge"),
            ("etcd_server_slow_apply_total", "counter"),
            ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
            ("etcd_mvcc_db_total_size_in_use_in_bytes", "gauge"),
            ("cairn_wal_group_commit_batch_size", "histogram"),
            ("cairn_wal_backend_info", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {ty}\n")),
                "{name} missing or not a {ty}:\n{text}"
            );
        }
    }

    #[test]
    fn leader_change_counts_only_a_known_new_leader() {
        let (registry, cores) = server_metrics(1, &[(7, 0)]).unwrap();
        let shard = cores[0].shard(7).unwrap();
        shard.set_leader(false, false, true);
        shard.set_leader(true, false, true);
        shard.set_leader(true, false, false);
        let text = registry.render();
        assert!(
            text.contains("\netcd_server_leader_changes_seen_total 1\n"),
            "{text}"
        );
        assert!(text.contains("\netcd_server_has_leader 1\n"), "{text}");
        assert!(
            text.contains("cairn_shard_is_leader{core=\"0\",shard=\"7\"} 0\n"),
            "{text}"
        );
    }
}

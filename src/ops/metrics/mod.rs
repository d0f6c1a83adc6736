//! A metrics registry for a thread-per-core daemon: per-core cells written without
//! locks on the hot path, summed or reduced only when `/metrics` is scraped.
//!
//! Back-of-envelope: a scrape every 15 s is rare; a write is frequent (several
//! counter bumps per request, one histogram observation per WAL flush). So the cost
//! is put on the scrape. Each core owns one slab of `AtomicU64` cells, allocated on
//! its own 128-byte aligned cache lines, so no two cores ever write the same line.
//! A write is one relaxed `fetch_add` or `store` on a line only that core touches:
//! a few nanoseconds, against about 100 µs for one durable append and about 10 µs
//! for one request. A histogram observation scans at most
//! [`MAX_HISTOGRAM_BUCKETS`] integer thresholds (etcd's layouts have 14), then does
//! two adds. Nothing on the write path allocates, locks or formats.
//!
//! Relaxed atomics are enough: every cell is an independent monotone counter or a
//! last-value gauge, and a scrape only promises each value as it was at some point
//! during the scrape. A histogram's `_count` is computed from the buckets read, so
//! `le="+Inf"` and `_count` always agree, as Prometheus requires.
//!
//! Every metric is either per core (`core` label) or per shard (`core` and `shard`
//! labels). A metric may also be rendered member-wide under a second name, summed
//! or reduced over all its series: that is how etcd's metric names, which carry no
//! labels, are served next to Cairn's labelled ones.
//!
//! This file holds the limits, the errors and the description of a metric; the
//! registry, the write handles, the cells, histograms and the text rendering live
//! in the child modules `registry`, `handles`, `cells`, `histogram` and `render`.

mod cells;
mod handles;
mod histogram;
mod registry;
mod render;

pub use handles::{
    CoreCounter, CoreGauge, CoreHistogram, CoreInfo, CoreMetrics, ShardCounter, ShardGauge,
    ShardHistogram, ShardMetrics,
};
pub use histogram::{BucketLayout, BATCH_SIZE, ETCD_DISK_SECONDS, REQUEST_SECONDS, SHORT_SECONDS};
pub use registry::{Registry, RegistryBuilder};

/// A metric named `name` with placeholder help, for the unit tests of the
/// registry's modules.
#[cfg(test)]
fn spec(name: &'static str) -> MetricSpec {
    MetricSpec::new(name, "help")
}

/// Most cores one registry describes; the daemon refuses more cores than this anyway.
pub const MAX_CORES: usize = 1024;
/// Most shards one registry describes.
pub const MAX_SHARDS: usize = 65_536;
/// Most metrics one registry holds.
pub const MAX_METRICS: usize = 256;
/// Most finite bucket bounds in one histogram (the `+Inf` bucket comes on top).
pub const MAX_HISTOGRAM_BUCKETS: usize = 64;
/// Nanoseconds per second: duration histograms count in nanoseconds and render
/// in seconds, as Prometheus names (`_seconds`) require.
pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Errors from building a registry. Registration happens once at start, so these
/// name the metric, shard or core at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    #[error("metric name {name:?} is not a valid Prometheus metric name")]
    InvalidName { name: String },
    #[error("metric name {name} is registered twice")]
    DuplicateName { name: String },
    #[error(
        "histogram {name}: {count} bucket bounds given; they must be finite, positive, \
         strictly increasing, and at most {MAX_HISTOGRAM_BUCKETS}"
    )]
    InvalidBuckets { name: String, count: usize },
    #[error("metric {name}: info label {label:?} needs a valid label name and 1 to 255 values")]
    InvalidInfo { name: String, label: String },
    #[error("a registry needs between 1 and {MAX_CORES} cores, {core_count} given")]
    CoreCount { core_count: usize },
    #[error("shard {shard} placed on core {core}, but the registry has {core_count} cores")]
    CoreOutOfRange {
        shard: u32,
        core: usize,
        core_count: usize,
    },
    #[error("shard {shard} placed twice (on core {first} and core {second})")]
    ShardPlacedTwice {
        shard: u32,
        first: usize,
        second: usize,
    },
    #[error("more than {max} {what} registered")]
    TooMany { what: &'static str, max: usize },
}

/// Prometheus type a family is rendered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// How a member-wide series is computed from the per-core or per-shard series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// Sum of every series (counters, sizes, histogram buckets).
    Sum,
    /// Smallest value of any series, 0 when there is none (`has_leader`: 1 only if
    /// every shard has one).
    Min,
}

/// A member-wide rendering of a metric under another name (etcd's).
#[derive(Debug, Clone, Copy)]
pub struct MemberSeries {
    pub name: &'static str,
    pub help: &'static str,
    /// etcd renders some "_total" figures as gauges; keep its type so its
    /// dashboards and recording rules see what they expect.
    pub rendered_as: MetricType,
    pub aggregate: Aggregate,
}

/// Name and help of a metric, and optionally its member-wide rendering.
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    pub name: &'static str,
    pub help: &'static str,
    pub member: Option<MemberSeries>,
}

impl MetricSpec {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        MetricSpec {
            name,
            help,
            member: None,
        }
    }

    pub const fn with_member(mut self, member: MemberSeries) -> Self {
        self.member = Some(member);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Core,
    Shard,
}

#[derive(Debug)]
enum Kind {
    Counter,
    Gauge,
    Histogram {
        layout: BucketLayout,
        thresholds: Box<[u64]>,
    },
    /// An info family: the cell holds 1 + the index of the value in use, 0 for none.
    Info {
        label: &'static str,
        values: &'static [&'static str],
    },
}

impl Kind {
    fn slots(&self) -> usize {
        match self {
            // Finite buckets, the +Inf bucket, then the sum.
            Kind::Histogram { thresholds, .. } => thresholds.len() + 2,
            _ => 1,
        }
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge | Kind::Info { .. } => MetricType::Gauge,
            Kind::Histogram { .. } => MetricType::Histogram,
        }
    }
}

#[derive(Debug)]
struct Desc {
    spec: MetricSpec,
    kind: Kind,
    scope: Scope,
    /// First cell of this metric within a core block or a shard block.
    offset: usize,
}

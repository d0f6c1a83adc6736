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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

const CELLS_PER_LINE: usize = 16;
const CACHE_LINE_BYTES: usize = 128;
const _: () = assert!(CELLS_PER_LINE * std::mem::size_of::<AtomicU64>() == CACHE_LINE_BYTES);
const _: () = assert!(MAX_HISTOGRAM_BUCKETS < CELLS_PER_LINE * 8);

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

/// Bucket layout of a histogram: finite upper bounds in the rendered unit, and how
/// many integer base units one rendered unit holds (observations are integers in
/// base units, so the hot path never touches floating point).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketLayout {
    pub bounds: &'static [f64],
    pub base_units_per_unit: u64,
}

/// etcd's layout for disk latencies (`prometheus.ExponentialBuckets(0.001, 2, 14)`:
/// 1 ms to 8.192 s), used by `etcd_disk_wal_fsync_duration_seconds` and
/// `etcd_disk_backend_commit_duration_seconds`. Observed in nanoseconds.
pub const ETCD_DISK_SECONDS: BucketLayout = BucketLayout {
    bounds: &[
        0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
        8.192,
    ],
    base_units_per_unit: NANOS_PER_SECOND,
};

/// Appends per group-commit flush: powers of two up to 1024, the largest batch a
/// core's WAL is expected to form.
pub const BATCH_SIZE: BucketLayout = BucketLayout {
    bounds: &[
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
    ],
    base_units_per_unit: 1,
};

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

/// Handle of a per-core counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreCounter(usize);
/// Handle of a per-core gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreGauge(usize);
/// Handle of a per-core histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreHistogram {
    desc: usize,
    offset: usize,
}
/// Handle of a per-core info family (one labelled series of value 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreInfo {
    offset: usize,
    value_count: usize,
}
/// Handle of a per-shard counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardCounter(usize);
/// Handle of a per-shard gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGauge(usize);
/// Handle of a per-shard histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHistogram {
    desc: usize,
    offset: usize,
}

/// Collects metric definitions and shard placement, then builds a [`Registry`].
#[derive(Debug)]
pub struct RegistryBuilder {
    core_count: usize,
    shard_core: BTreeMap<u32, usize>,
    descs: Vec<Desc>,
    core_block_slots: usize,
    shard_block_slots: usize,
    process_metrics: bool,
}

impl RegistryBuilder {
    pub fn new(core_count: usize) -> Result<Self, MetricsError> {
        if core_count == 0 || core_count > MAX_CORES {
            return Err(MetricsError::CoreCount { core_count });
        }
        Ok(RegistryBuilder {
            core_count,
            shard_core: BTreeMap::new(),
            descs: Vec::new(),
            core_block_slots: 0,
            shard_block_slots: 0,
            process_metrics: false,
        })
    }

    /// Also render the standard `process_*` families and `cairn_build_info`.
    pub fn with_process_metrics(&mut self) {
        self.process_metrics = true;
    }

    /// Declares that `shard` lives on `core`; its series carry both labels.
    pub fn place_shard(&mut self, shard: u32, core: usize) -> Result<(), MetricsError> {
        if core >= self.core_count {
            return Err(MetricsError::CoreOutOfRange {
                shard,
                core,
                core_count: self.core_count,
            });
        }
        if let Some(&first) = self.shard_core.get(&shard) {
            return Err(MetricsError::ShardPlacedTwice {
                shard,
                first,
                second: core,
            });
        }
        if self.shard_core.len() >= MAX_SHARDS {
            return Err(MetricsError::TooMany {
                what: "shards",
                max: MAX_SHARDS,
            });
        }
        self.shard_core.insert(shard, core);
        Ok(())
    }

    pub fn core_counter(&mut self, spec: MetricSpec) -> Result<CoreCounter, MetricsError> {
        let (_, offset) = self.add(spec, Kind::Counter, Scope::Core)?;
        Ok(CoreCounter(offset))
    }

    pub fn core_gauge(&mut self, spec: MetricSpec) -> Result<CoreGauge, MetricsError> {
        let (_, offset) = self.add(spec, Kind::Gauge, Scope::Core)?;
        Ok(CoreGauge(offset))
    }

    pub fn core_histogram(
        &mut self,
        spec: MetricSpec,
        layout: BucketLayout,
    ) -> Result<CoreHistogram, MetricsError> {
        let kind = histogram_kind(spec.name, layout)?;
        let (desc, offset) = self.add(spec, kind, Scope::Core)?;
        Ok(CoreHistogram { desc, offset })
    }

    /// An info family such as `cairn_wal_backend_info{core="0",backend="io_uring"} 1`:
    /// each core names one of `values`, or none until it has chosen.
    pub fn core_info(
        &mut self,
        spec: MetricSpec,
        label: &'static str,
        values: &'static [&'static str],
    ) -> Result<CoreInfo, MetricsError> {
        if !valid_label_name(label) || values.is_empty() || values.len() > 255 {
            return Err(MetricsError::InvalidInfo {
                name: spec.name.to_string(),
                label: label.to_string(),
            });
        }
        let (_, offset) = self.add(spec, Kind::Info { label, values }, Scope::Core)?;
        Ok(CoreInfo {
            offset,
            value_count: values.len(),
        })
    }

    pub fn shard_counter(&mut self, spec: MetricSpec) -> Result<ShardCounter, MetricsError> {
        let (_, offset) = self.add(spec, Kind::Counter, Scope::Shard)?;
        Ok(ShardCounter(offset))
    }

    pub fn shard_gauge(&mut self, spec: MetricSpec) -> Result<ShardGauge, MetricsError> {
        let (_, offset) = self.add(spec, Kind::Gauge, Scope::Shard)?;
        Ok(ShardGauge(offset))
    }

    pub fn shard_histogram(
        &mut self,
        spec: MetricSpec,
        layout: BucketLayout,
    ) -> Result<ShardHistogram, MetricsError> {
        let kind = histogram_kind(spec.name, layout)?;
        let (desc, offset) = self.add(spec, kind, Scope::Shard)?;
        Ok(ShardHistogram { desc, offset })
    }

    fn add(
        &mut self,
        spec: MetricSpec,
        kind: Kind,
        scope: Scope,
    ) -> Result<(usize, usize), MetricsError> {
        if self.descs.len() >= MAX_METRICS {
            return Err(MetricsError::TooMany {
                what: "metrics",
                max: MAX_METRICS,
            });
        }
        let mut names = vec![spec.name];
        if let Some(member) = spec.member {
            names.push(member.name);
        }
        for name in &names {
            if !valid_metric_name(name) {
                return Err(MetricsError::InvalidName {
                    name: name.to_string(),
                });
            }
            let taken = self
                .descs
                .iter()
                .any(|d| d.spec.name == *name || d.spec.member.is_some_and(|m| m.name == *name));
            if taken || (names.len() == 2 && names[0] == names[1]) {
                return Err(MetricsError::DuplicateName {
                    name: name.to_string(),
                });
            }
        }
        let slots = kind.slots();
        let block = match scope {
            Scope::Core => &mut self.core_block_slots,
            Scope::Shard => &mut self.shard_block_slots,
        };
        let offset = *block;
        *block = offset + slots;
        self.descs.push(Desc {
            spec,
            kind,
            scope,
            offset,
        });
        Ok((self.descs.len() - 1, offset))
    }

    pub fn build(self) -> Registry {
        let mut shards_by_core: Vec<Vec<u32>> = vec![Vec::new(); self.core_count];
        // BTreeMap order: each core's shards come out sorted by shard id.
        for (&shard, &core) in &self.shard_core {
            shards_by_core[core].push(shard);
        }
        let shape = Arc::new(Shape {
            descs: self.descs,
            core_block_slots: self.core_block_slots,
            shard_block_slots: self.shard_block_slots,
            shards_by_core,
            process_metrics: self.process_metrics,
        });
        let slabs = (0..self.core_count)
            .map(|core| {
                let slots = shape.core_block_slots
                    + shape.shard_block_slots * shape.shards_by_core[core].len();
                Arc::new(Slab::new(slots))
            })
            .collect();
        Registry { shape, slabs }
    }
}

fn histogram_kind(name: &str, layout: BucketLayout) -> Result<Kind, MetricsError> {
    let bounds = layout.bounds;
    let increasing = bounds.windows(2).all(|w| w[0] < w[1]);
    let usable = bounds.iter().all(|b| b.is_finite() && *b > 0.0);
    if bounds.is_empty()
        || bounds.len() > MAX_HISTOGRAM_BUCKETS
        || !increasing
        || !usable
        || layout.base_units_per_unit == 0
    {
        return Err(MetricsError::InvalidBuckets {
            name: name.to_string(),
            count: bounds.len(),
        });
    }
    // `le` is inclusive: an observation lands in the first bucket whose threshold
    // (the bound in base units) is at least the observation.
    let thresholds: Box<[u64]> = bounds
        .iter()
        .map(|b| (b * layout.base_units_per_unit as f64).round() as u64)
        .collect();
    if thresholds.windows(2).any(|w| w[0] >= w[1]) {
        return Err(MetricsError::InvalidBuckets {
            name: name.to_string(),
            count: bounds.len(),
        });
    }
    Ok(Kind::Histogram { layout, thresholds })
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

#[derive(Debug)]
struct Shape {
    descs: Vec<Desc>,
    core_block_slots: usize,
    shard_block_slots: usize,
    shards_by_core: Vec<Vec<u32>>,
    process_metrics: bool,
}

#[repr(align(128))]
#[derive(Debug)]
struct CacheLine([AtomicU64; CELLS_PER_LINE]);

const _: () = assert!(std::mem::align_of::<CacheLine>() == CACHE_LINE_BYTES);

/// One core's cells: the core block, then one block per shard the core owns.
#[derive(Debug)]
struct Slab {
    lines: Box<[CacheLine]>,
}

impl Slab {
    fn new(slots: usize) -> Self {
        let lines = slots.div_ceil(CELLS_PER_LINE).max(1);
        Slab {
            lines: (0..lines)
                .map(|_| CacheLine(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    #[inline]
    fn cell(&self, slot: usize) -> &AtomicU64 {
        &self.lines[slot / CELLS_PER_LINE].0[slot % CELLS_PER_LINE]
    }

    #[inline]
    fn add(&self, slot: usize, n: u64) {
        self.cell(slot).fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    fn store(&self, slot: usize, v: u64) {
        self.cell(slot).store(v, Ordering::Relaxed);
    }

    #[inline]
    fn load(&self, slot: usize) -> u64 {
        self.cell(slot).load(Ordering::Relaxed)
    }

    #[inline]
    fn observe(&self, base: usize, thresholds: &[u64], value: u64) {
        let bucket = thresholds
            .iter()
            .position(|&t| value <= t)
            .unwrap_or(thresholds.len());
        self.add(base + bucket, 1);
        self.add(base + thresholds.len() + 1, value);
    }
}

/// The shared, read side of all metrics: rendered at scrape time.
#[derive(Debug, Clone)]
pub struct Registry {
    shape: Arc<Shape>,
    slabs: Vec<Arc<Slab>>,
}

impl Registry {
    pub fn core_count(&self) -> usize {
        self.slabs.len()
    }

    /// The write handle of `core`, to be moved onto that core's thread.
    ///
    /// # Panics
    /// If `core` is not below [`Registry::core_count`]: the daemon asked for a
    /// core it did not declare.
    pub fn core(&self, core: usize) -> CoreMetrics {
        assert!(
            core < self.slabs.len(),
            "metrics handle for core {core} requested, but the registry has {} cores",
            self.slabs.len()
        );
        CoreMetrics {
            shape: Arc::clone(&self.shape),
            slab: Arc::clone(&self.slabs[core]),
            core,
        }
    }

    /// Renders every metric in the Prometheus text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        self.render_into(&mut out);
        out
    }

    pub fn render_into(&self, out: &mut String) {
        // Member-wide (etcd-named) families first: they are what dashboards read.
        for desc in &self.shape.descs {
            if let Some(member) = desc.spec.member {
                self.render_member(out, desc, member);
            }
        }
        for desc in &self.shape.descs {
            self.render_labelled(out, desc);
        }
        if self.shape.process_metrics {
            super::process::render_into(out);
        }
    }

    /// Every (labels, block base) pair of a metric's series, in a stable order.
    fn series(&self, scope: Scope) -> Vec<(usize, Option<u32>, usize)> {
        let mut series = Vec::new();
        for (core, shards) in self.shape.shards_by_core.iter().enumerate() {
            match scope {
                Scope::Core => series.push((core, None, 0)),
                Scope::Shard => {
                    for (slot, &shard) in shards.iter().enumerate() {
                        let base =
                            self.shape.core_block_slots + slot * self.shape.shard_block_slots;
                        series.push((core, Some(shard), base));
                    }
                }
            }
        }
        series
    }

    fn render_labelled(&self, out: &mut String, desc: &Desc) {
        write_header(out, desc.spec.name, desc.spec.help, desc.kind.metric_type());
        for (core, shard, base) in self.series(desc.scope) {
            let slab = &self.slabs[core];
            let at = base + desc.offset;
            let mut labels = vec![("core", core.to_string())];
            if let Some(shard) = shard {
                labels.push(("shard", shard.to_string()));
            }
            match &desc.kind {
                Kind::Counter => write_sample(out, desc.spec.name, &labels, slab.load(at)),
                Kind::Gauge => write_sample(out, desc.spec.name, &labels, slab.load(at) as i64),
                Kind::Info { label, values } => {
                    let chosen = slab.load(at) as usize;
                    if let Some(value) = chosen.checked_sub(1).and_then(|i| values.get(i)) {
                        labels.push((label, (*value).to_string()));
                        write_sample(out, desc.spec.name, &labels, 1);
                    }
                }
                Kind::Histogram { layout, thresholds } => {
                    let counts: Vec<u64> =
                        (0..=thresholds.len()).map(|b| slab.load(at + b)).collect();
                    let sum = slab.load(at + thresholds.len() + 1);
                    write_histogram(out, desc.spec.name, &labels, layout, &counts, sum);
                }
            }
        }
    }

    fn render_member(&self, out: &mut String, desc: &Desc, member: MemberSeries) {
        write_header(out, member.name, member.help, member.rendered_as);
        let series = self.series(desc.scope);
        let cells = |offset: usize| {
            series
                .iter()
                .map(move |&(core, _, base)| self.slabs[core].load(base + desc.offset + offset))
        };
        match &desc.kind {
            Kind::Counter | Kind::Gauge | Kind::Info { .. } => {
                let signed = !matches!(desc.kind, Kind::Counter);
                let value: i128 = match member.aggregate {
                    Aggregate::Sum => cells(0).map(|v| widen(v, signed)).sum(),
                    Aggregate::Min => cells(0).map(|v| widen(v, signed)).min().unwrap_or(0),
                };
                write_sample(out, member.name, &[], value);
            }
            Kind::Histogram { layout, thresholds } => {
                let counts: Vec<u64> = (0..=thresholds.len())
                    .map(|b| cells(b).fold(0u64, u64::wrapping_add))
                    .collect();
                let sum = cells(thresholds.len() + 1).fold(0u64, u64::wrapping_add);
                write_histogram(out, member.name, &[], layout, &counts, sum);
            }
        }
    }
}

fn widen(v: u64, signed: bool) -> i128 {
    if signed {
        i128::from(v as i64)
    } else {
        i128::from(v)
    }
}

fn write_header(out: &mut String, name: &str, help: &str, ty: MetricType) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {}", ty.as_str());
}

fn write_labels(out: &mut String, labels: &[(&str, String)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    let all = labels
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(le.map(|le| ("le", le)));
    for (k, v) in all {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
    }
    out.push('}');
}

fn write_sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, String)],
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    write_labels(out, labels, None);
    let _ = writeln!(out, " {value}");
}

fn write_histogram(
    out: &mut String,
    name: &str,
    labels: &[(&str, String)],
    layout: &BucketLayout,
    counts: &[u64],
    sum_base_units: u64,
) {
    let mut cumulative = 0u64;
    for (i, count) in counts.iter().enumerate() {
        cumulative = cumulative.wrapping_add(*count);
        let le = match layout.bounds.get(i) {
            Some(bound) => format_float(*bound),
            None => "+Inf".to_string(),
        };
        let _ = write!(out, "{name}_bucket");
        write_labels(out, labels, Some(&le));
        let _ = writeln!(out, " {cumulative}");
    }
    let sum = sum_base_units as f64 / layout.base_units_per_unit as f64;
    let _ = write!(out, "{name}_sum");
    write_labels(out, labels, None);
    let _ = writeln!(out, " {}", format_float(sum));
    let _ = write!(out, "{name}_count");
    write_labels(out, labels, None);
    let _ = writeln!(out, " {cumulative}");
}

/// Shortest decimal that reads back as the same f64; Rust's `Display` never uses
/// an exponent, which every Prometheus parser accepts.
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else {
        format!("{v}")
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The write handle of one core. Cheap to clone; clones write the same cells, so
/// keep them on the core's own thread to keep its cache lines local.
#[derive(Debug, Clone)]
pub struct CoreMetrics {
    shape: Arc<Shape>,
    slab: Arc<Slab>,
    core: usize,
}

impl CoreMetrics {
    pub fn core(&self) -> usize {
        self.core
    }

    /// Shards this core owns, in shard id order.
    pub fn shards(&self) -> &[u32] {
        &self.shape.shards_by_core[self.core]
    }

    #[inline]
    pub fn counter_add(&self, id: CoreCounter, n: u64) {
        self.slab.add(id.0, n);
    }

    #[inline]
    pub fn gauge_set(&self, id: CoreGauge, v: i64) {
        self.slab.store(id.0, v as u64);
    }

    #[inline]
    pub fn gauge_add(&self, id: CoreGauge, delta: i64) {
        // Two's complement: adding the u64 image of a negative delta wraps to the
        // right signed result.
        self.slab.add(id.0, delta as u64);
    }

    /// Records one observation in base units (nanoseconds for `_seconds`).
    #[inline]
    pub fn observe(&self, id: CoreHistogram, value_base_units: u64) {
        let thresholds = histogram_thresholds(&self.shape, id.desc);
        self.slab.observe(id.offset, thresholds, value_base_units);
    }

    #[inline]
    pub fn observe_duration(&self, id: CoreHistogram, elapsed: Duration) {
        self.observe(id, duration_nanos(elapsed));
    }

    /// Names value `index` of the info family as this core's, replacing any other.
    ///
    /// # Panics
    /// If `index` is not one of the family's values: a caller bug.
    pub fn info_set(&self, id: CoreInfo, index: usize) {
        assert!(
            index < id.value_count,
            "info value {index} out of range (family has {} values)",
            id.value_count
        );
        self.slab.store(id.offset, index as u64 + 1);
    }

    /// The write handle of `shard`, or `None` if the shard is not on this core.
    pub fn shard(&self, shard: u32) -> Option<ShardMetrics> {
        let slot = self.shards().binary_search(&shard).ok()?;
        Some(ShardMetrics {
            shape: Arc::clone(&self.shape),
            slab: Arc::clone(&self.slab),
            base: self.shape.core_block_slots + slot * self.shape.shard_block_slots,
            core: self.core,
            shard,
        })
    }
}

/// The write handle of one shard, living on its owning core.
#[derive(Debug, Clone)]
pub struct ShardMetrics {
    shape: Arc<Shape>,
    slab: Arc<Slab>,
    base: usize,
    core: usize,
    shard: u32,
}

impl ShardMetrics {
    pub fn core(&self) -> usize {
        self.core
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    #[inline]
    pub fn counter_add(&self, id: ShardCounter, n: u64) {
        self.slab.add(self.base + id.0, n);
    }

    #[inline]
    pub fn gauge_set(&self, id: ShardGauge, v: i64) {
        self.slab.store(self.base + id.0, v as u64);
    }

    #[inline]
    pub fn gauge_add(&self, id: ShardGauge, delta: i64) {
        self.slab.add(self.base + id.0, delta as u64);
    }

    #[inline]
    pub fn gauge_get(&self, id: ShardGauge) -> i64 {
        self.slab.load(self.base + id.0) as i64
    }

    #[inline]
    pub fn observe(&self, id: ShardHistogram, value_base_units: u64) {
        let thresholds = histogram_thresholds(&self.shape, id.desc);
        self.slab
            .observe(self.base + id.offset, thresholds, value_base_units);
    }

    #[inline]
    pub fn observe_duration(&self, id: ShardHistogram, elapsed: Duration) {
        self.observe(id, duration_nanos(elapsed));
    }
}

fn histogram_thresholds(shape: &Shape, desc: usize) -> &[u64] {
    match &shape.descs[desc].kind {
        Kind::Histogram { thresholds, .. } => thresholds,
        other => unreachable!("histogram handle {desc} points at a {other:?}"),
    }
}

fn duration_nanos(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &'static str) -> MetricSpec {
        MetricSpec::new(name, "help")
    }

    #[test]
    fn etcd_disk_layout_is_exponential_from_1ms_by_2_for_14() {
        let expected: Vec<f64> = (0..14).map(|i| 0.001 * 2f64.powi(i)).collect();
        assert_eq!(ETCD_DISK_SECONDS.bounds, expected.as_slice());
        let rendered: Vec<String> = ETCD_DISK_SECONDS
            .bounds
            .iter()
            .map(|b| format_float(*b))
            .collect();
        assert_eq!(rendered.first().map(String::as_str), Some("0.001"));
        assert_eq!(rendered.last().map(String::as_str), Some("8.192"));
    }

    #[test]
    fn observation_on_a_bound_lands_in_that_bucket() {
        let mut b = RegistryBuilder::new(1).unwrap();
        let h = b
            .core_histogram(spec("h_seconds"), ETCD_DISK_SECONDS)
            .unwrap();
        let reg = b.build();
        let core = reg.core(0);
        core.observe_duration(h, Duration::from_millis(1));
        core.observe_duration(h, Duration::from_micros(1001));
        core.observe_duration(h, Duration::from_secs(100));
        let text = reg.render();
        assert!(
            text.contains("h_seconds_bucket{core=\"0\",le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("h_seconds_bucket{core=\"0\",le=\"0.002\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("h_seconds_bucket{core=\"0\",le=\"8.192\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("h_seconds_bucket{core=\"0\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("h_seconds_count{core=\"0\"} 3\n"), "{text}");
        assert!(
            text.contains("h_seconds_sum{core=\"0\"} 100.002001\n"),
            "{text}"
        );
    }

    #[test]
    fn member_series_sum_and_min_over_shards() {
        let mut b = RegistryBuilder::new(2).unwrap();
        b.place_shard(0, 0).unwrap();
        b.place_shard(1, 1).unwrap();
        b.place_shard(2, 1).unwrap();
        let leader = b
            .shard_gauge(spec("s_has_leader").with_member(MemberSeries {
                name: "m_has_leader",
                help: "h",
                rendered_as: MetricType::Gauge,
                aggregate: Aggregate::Min,
            }))
            .unwrap();
        let changes = b
            .shard_counter(spec("s_changes_total").with_member(MemberSeries {
                name: "m_changes_total",
                help: "h",
                rendered_as: MetricType::Counter,
                aggregate: Aggregate::Sum,
            }))
            .unwrap();
        let reg = b.build();
        let shards: Vec<ShardMetrics> = [(0, 0), (1, 1), (1, 2)]
            .iter()
            .map(|&(c, s)| reg.core(c).shard(s).unwrap())
            .collect();
        assert!(reg.core(0).shard(1).is_none(), "shard 1 lives on core 1");
        shards[0].gauge_set(leader, 1);
        shards[1].gauge_set(leader, 1);
        shards[2].counter_add(changes, 3);
        shards[0].counter_add(changes, 1);
        let text = reg.render();
        assert!(text.contains("\nm_has_leader 0\n"), "{text}");
        assert!(text.contains("\nm_changes_total 4\n"), "{text}");
        assert!(
            text.contains("s_changes_total{core=\"1\",shard=\"2\"} 3\n"),
            "{text}"
        );
        shards[2].gauge_set(leader, 1);
        assert!(reg.render().contains("\nm_has_leader 1\n"));
    }

    #[test]
    fn gauges_go_down_as_well_as_up() {
        let mut b = RegistryBuilder::new(1).unwrap();
        let g = b.core_gauge(spec("g")).unwrap();
        let reg = b.build();
        reg.core(0).gauge_add(g, 2);
        reg.core(0).gauge_add(g, -5);
        assert!(reg.render().contains("g{core=\"0\"} -3\n"));
    }

    #[test]
    fn info_renders_only_the_chosen_value() {
        let mut b = RegistryBuilder::new(2).unwrap();
        let info = b
            .core_info(spec("x_info"), "backend", &["io_uring", "sync"])
            .unwrap();
        let reg = b.build();
        reg.core(1).info_set(info, 1);
        let text = reg.render();
        assert!(
            text.contains("x_info{core=\"1\",backend=\"sync\"} 1\n"),
            "{text}"
        );
        assert!(
            !text.contains("x_info{core=\"0\""),
            "core 0 has not chosen: {text}"
        );
    }

    #[test]
    fn bad_definitions_are_refused_with_the_name() {
        let mut b = RegistryBuilder::new(1).unwrap();
        b.core_counter(spec("a_total")).unwrap();
        let dup = b.core_gauge(spec("a_total")).unwrap_err();
        assert!(dup.to_string().contains("a_total"));
        assert!(matches!(
            b.core_counter(spec("9bad")),
            Err(MetricsError::InvalidName { .. })
        ));
        let bad = BucketLayout {
            bounds: &[2.0, 1.0],
            base_units_per_unit: 1,
        };
        assert!(matches!(
            b.core_histogram(spec("h"), bad),
            Err(MetricsError::InvalidBuckets { .. })
        ));
        assert!(matches!(
            b.place_shard(0, 1),
            Err(MetricsError::CoreOutOfRange { .. })
        ));
        b.place_shard(0, 0).unwrap();
        assert!(matches!(
            b.place_shard(0, 0),
            Err(MetricsError::ShardPlacedTwice { .. })
        ));
        assert!(matches!(
            RegistryBuilder::new(0),
            Err(MetricsError::CoreCount { .. })
        ));
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape_help("x\\y\nz"), "x\\\\y\\nz");
    }

    #[test]
    fn cores_write_from_their_own_threads() {
        let mut b = RegistryBuilder::new(4).unwrap();
        let c = b
            .core_counter(spec("w_total").with_member(MemberSeries {
                name: "all_total",
                help: "h",
                rendered_as: MetricType::Counter,
                aggregate: Aggregate::Sum,
            }))
            .unwrap();
        let reg = b.build();
        std::thread::scope(|s| {
            for core in 0..4 {
                let m = reg.core(core);
                s.spawn(move || {
                    for _ in 0..10_000 {
                        m.counter_add(c, 1);
                    }
                });
            }
        });
        assert!(reg.render().contains("\nall_total 40000\n"));
    }
}

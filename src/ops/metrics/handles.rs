//! The write side: the handles that name a metric, and the per-core and per-shard
//! write handles that bump its cells on the hot path.

use std::sync::Arc;
use std::time::Duration;

use super::cells::Slab;
use super::histogram::{duration_nanos, histogram_thresholds};
use super::registry::Shape;

/// Handle of a per-core counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreCounter(pub(super) usize);
/// Handle of a per-core gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreGauge(pub(super) usize);
/// Handle of a per-core histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreHistogram {
    pub(super) desc: usize,
    pub(super) offset: usize,
}
/// Handle of a per-core info family (one labelled series of value 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreInfo {
    pub(super) offset: usize,
    pub(super) value_count: usize,
}
/// Handle of a per-shard counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardCounter(pub(super) usize);
/// Handle of a per-shard gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardGauge(pub(super) usize);
/// Handle of a per-shard histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHistogram {
    pub(super) desc: usize,
    pub(super) offset: usize,
}

/// The write handle of one core. Cheap to clone; clones write the same cells, so
/// keep them on the core's own thread to keep its cache lines local.
#[derive(Debug, Clone)]
pub struct CoreMetrics {
    pub(super) shape: Arc<Shape>,
    pub(super) slab: Arc<Slab>,
    pub(super) core: usize,
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

#[cfg(test)]
mod tests {
    use crate::ops::metrics::{Aggregate, MemberSeries, MetricType, RegistryBuilder};

    use crate::ops::metrics::spec;

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

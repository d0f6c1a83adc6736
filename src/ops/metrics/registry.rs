//! The registry: definitions of metric families and shard placement, checked once
//! at start, and the shared read side built from them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cells::Slab;
use super::handles::{
    CoreCounter, CoreGauge, CoreHistogram, CoreInfo, CoreMetrics, ShardCounter, ShardGauge,
    ShardHistogram,
};
use super::histogram::{histogram_kind, BucketLayout};
use super::{Desc, Kind, MetricSpec, MetricsError, Scope, MAX_CORES, MAX_METRICS, MAX_SHARDS};

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
pub(super) struct Shape {
    pub(super) descs: Vec<Desc>,
    pub(super) core_block_slots: usize,
    pub(super) shard_block_slots: usize,
    pub(super) shards_by_core: Vec<Vec<u32>>,
    pub(super) process_metrics: bool,
}

/// The shared, read side of all metrics: rendered at scrape time.
#[derive(Debug, Clone)]
pub struct Registry {
    pub(super) shape: Arc<Shape>,
    pub(super) slabs: Vec<Arc<Slab>>,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ops::metrics::spec;

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
}

//! Histograms: bucket layouts, their validation into integer thresholds, and the
//! lookup of a histogram's thresholds on the write path.

use std::time::Duration;

use super::registry::Shape;
use super::{Kind, MetricsError, MAX_HISTOGRAM_BUCKETS, NANOS_PER_SECOND};

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

/// Latencies of the write path, finer than etcd's disk layout below 1 ms
/// (where a WAL flush and a request on a fast disk fall): 50 µs to 1 s.
/// Observed in nanoseconds.
pub const REQUEST_SECONDS: BucketLayout = BucketLayout {
    bounds: &[
        0.00005, 0.0001, 0.00015, 0.0002, 0.00025, 0.0003, 0.00035, 0.0004, 0.0005, 0.0006, 0.0007,
        0.0008, 0.001, 0.0012, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
    ],
    base_units_per_unit: NANOS_PER_SECOND,
};

/// Short stretches of a core's time (an idle poll under `--idle-poll-us`, a
/// step of a store commit): 10 µs to 2 ms.
/// Observed in nanoseconds.
pub const SHORT_SECONDS: BucketLayout = BucketLayout {
    bounds: &[
        0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002,
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

pub(super) fn histogram_kind(name: &str, layout: BucketLayout) -> Result<Kind, MetricsError> {
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

pub(super) fn histogram_thresholds(shape: &Shape, desc: usize) -> &[u64] {
    match &shape.descs[desc].kind {
        Kind::Histogram { thresholds, .. } => thresholds,
        other => unreachable!("histogram handle {desc} points at a {other:?}"),
    }
}

pub(super) fn duration_nanos(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::metrics::render::format_float;
    use crate::ops::metrics::RegistryBuilder;

    use crate::ops::metrics::spec;

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
}

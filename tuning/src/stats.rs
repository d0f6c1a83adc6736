//! Latency recording (HdrHistogram, nanoseconds) and its summary.

use crate::model::{LatencySummary, Measurement};
use hdrhistogram::Histogram;
use std::time::Duration;

/// Highest latency the histogram tracks: a minute; slower appends are clamped.
pub const LATENCY_MAX_NS: u64 = 60_000_000_000;
/// Significant figures kept: 3 gives 0.1% resolution.
pub const LATENCY_SIGFIG: u8 = 3;
/// Most points of one CDF plot.
pub const CDF_POINTS_MAX: usize = 400;

/// Latencies of durable appends plus the counts needed for a [`Measurement`].
pub struct Recorder {
    histogram: Histogram<u64>,
    pub syncs: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            histogram: Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGFIG)
                .expect("static histogram bounds are valid"),
            syncs: 0,
        }
    }

    pub fn record(&mut self, latency: Duration) {
        let ns = (latency.as_nanos() as u64).clamp(1, LATENCY_MAX_NS);
        self.histogram
            .record(ns)
            .expect("value clamped into bounds");
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// Adds another recorder's samples (one per writer thread).
    pub fn merge(&mut self, other: &Recorder) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms share bounds");
        self.syncs += other.syncs;
    }

    pub fn summary(&self) -> LatencySummary {
        summarize(&self.histogram)
    }

    pub fn finish(&self, elapsed: Duration, verified: bool) -> Measurement {
        let appends = self.count();
        let secs = elapsed.as_secs_f64().max(1e-9);
        Measurement {
            appends,
            elapsed_secs: secs,
            appends_per_sec: appends as f64 / secs,
            syncs: self.syncs,
            latency: self.summary(),
            cdf: cdf(&self.histogram),
            verified,
            zero_fill_bytes: 0,
        }
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub fn summarize(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    LatencySummary {
        p50_us: us(h.value_at_quantile(0.50)),
        p90_us: us(h.value_at_quantile(0.90)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
        mean_us: h.mean() / 1000.0,
    }
}

/// The latency CDF as at most [`CDF_POINTS_MAX`] points (µs, cumulative fraction),
/// denser in the tail where the interesting part of a latency curve lives.
pub fn cdf(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut points: Vec<(f64, f64)> = h
        .iter_quantiles(4)
        .map(|v| (us(v.value_iterated_to()), v.quantile_iterated_to()))
        .collect();
    if points.len() > CDF_POINTS_MAX {
        let step = points.len().div_ceil(CDF_POINTS_MAX);
        let last = *points.last().expect("non-empty");
        points = points.into_iter().step_by(step).collect();
        points.push(last);
    }
    points.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    points
}

/// The median of `v` (the mean of the middle two for an even count).
/// Panics on an empty `v`: every caller measured at least one round.
pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_orders_percentiles_and_cdf_ends_at_one() {
        let mut r = Recorder::new();
        for i in 1..=10_000u64 {
            r.record(Duration::from_micros(i));
        }
        let s = r.summary();
        assert!((s.p50_us - 5000.0).abs() / 5000.0 < 0.01, "{s:?}");
        assert!(s.p50_us <= s.p90_us && s.p90_us <= s.p99_us && s.p99_us <= s.p999_us);
        assert!(s.p999_us <= s.max_us);
        let c = cdf(&r.histogram);
        assert!(c.len() <= CDF_POINTS_MAX + 1);
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!((c.last().unwrap().1 - 1.0).abs() < 1e-9);
    }
}

//! Measurement: one HdrHistogram of successful-request latencies per requester,
//! merged at the end of a run, plus error counts by gRPC code.
//!
//! Latencies are recorded in microseconds with 3 significant digits (so a
//! percentile is exact to 0.1%), from 1 µs to one hour; longer values saturate at
//! the top rather than being dropped, so a stall can never vanish from the figures.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Highest latency the histogram resolves; longer ones are recorded as this.
pub const MAX_LATENCY_US: u64 = 3_600_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;
/// Longest error message kept as a sample per code.
const ERROR_SAMPLE_BYTES: usize = 200;

/// Samples of one requester (or of a whole run once merged).
#[derive(Debug, Clone)]
pub struct Recorder {
    pub latency_us: Histogram<u64>,
    /// Failed requests by gRPC code name (`Unavailable`, `DeadlineExceeded`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Workload-specific counters (for example compare-and-swap conflicts).
    pub counters: BTreeMap<&'static str, u64>,
    /// The first message seen per error code, so a report says what failed.
    pub error_samples: BTreeMap<String, String>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, SIGNIFICANT_DIGITS)
                .expect("static histogram bounds are valid"),
            errors: BTreeMap::new(),
            counters: BTreeMap::new(),
            error_samples: BTreeMap::new(),
        }
    }

    pub fn record_ok(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us
            .saturating_record(us.clamp(1, MAX_LATENCY_US));
    }

    pub fn record_error(&mut self, status: &tonic::Status) {
        let code = format!("{:?}", status.code());
        if !self.error_samples.contains_key(&code) {
            let mut sample = status.message().to_owned();
            let end = (0..=ERROR_SAMPLE_BYTES.min(sample.len()))
                .rev()
                .find(|&i| sample.is_char_boundary(i))
                .unwrap_or(0);
            sample.truncate(end);
            self.error_samples.insert(code.clone(), sample);
        }
        self.record_error_code(&code);
    }

    pub fn record_error_code(&mut self, code: &str) {
        self.record_errors(code, 1);
    }

    pub fn record_errors(&mut self, code: &str, n: u64) {
        if n > 0 {
            *self.errors.entry(code.to_owned()).or_default() += n;
        }
    }

    pub fn count(&mut self, counter: &'static str) {
        *self.counters.entry(counter).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Recorder) {
        self.latency_us
            .add(&other.latency_us)
            .expect("histograms share bounds, so adding cannot fail");
        for (code, n) in &other.errors {
            *self.errors.entry(code.clone()).or_default() += n;
        }
        for (name, n) in &other.counters {
            *self.counters.entry(name).or_default() += n;
        }
        for (code, sample) in &other.error_samples {
            self.error_samples
                .entry(code.clone())
                .or_insert_with(|| sample.clone());
        }
    }

    /// The latency at quantile `q` of the requests recorded, in ms.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        ms(self.latency_us.value_at_quantile(q))
    }

    pub fn ok_count(&self) -> u64 {
        self.latency_us.len()
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// The figures of one measured run.
#[derive(Debug, Clone)]
pub struct Report {
    pub workload: String,
    /// Which system was measured, when known (`compare` fills it in).
    pub system: Option<String>,
    pub clients: usize,
    pub conns: usize,
    pub target_rate_per_sec: Option<f64>,
    /// Wall time of the measured phase: first send to last response.
    pub elapsed: Duration,
    pub warmup: Duration,
    pub warmup_requests: u64,
    pub recorder: Recorder,
    /// CPU time (user + system) the measured members used over the run,
    /// warm-up included, per request answered, in microseconds; known when
    /// the bench started the members itself (`compare`).
    pub server_cpu_us_per_op: Option<f64>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl Report {
    /// Successful requests.
    pub fn requests(&self) -> u64 {
        self.recorder.ok_count()
    }

    pub fn errors(&self) -> u64 {
        self.recorder.error_count()
    }

    /// Successful requests over the measured wall time.
    pub fn requests_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.requests() as f64 / secs
        } else {
            0.0
        }
    }

    fn quantile_ms(&self, q: f64) -> f64 {
        self.recorder.quantile_ms(q)
    }

    pub fn avg_ms(&self) -> f64 {
        self.recorder.latency_us.mean() / 1000.0
    }
    pub fn p50_ms(&self) -> f64 {
        self.quantile_ms(0.50)
    }
    pub fn p90_ms(&self) -> f64 {
        self.quantile_ms(0.90)
    }
    pub fn p99_ms(&self) -> f64 {
        self.quantile_ms(0.99)
    }
    pub fn p999_ms(&self) -> f64 {
        self.quantile_ms(0.999)
    }
    pub fn p9999_ms(&self) -> f64 {
        self.quantile_ms(0.9999)
    }
    pub fn max_ms(&self) -> f64 {
        ms(self.recorder.latency_us.max())
    }

    pub fn to_json(&self) -> Value {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "workload": self.workload,
            "system": self.system,
            "clients": self.clients,
            "conns": self.conns,
            "target_rate_per_sec": self.target_rate_per_sec,
            "requests": self.requests(),
            "errors": self.errors(),
            "errors_by_code": self.recorder.errors,
            "error_samples": self.recorder.error_samples,
            "counters": self.recorder.counters,
            "elapsed_s": round(self.elapsed.as_secs_f64()),
            "warmup_s": round(self.warmup.as_secs_f64()),
            "warmup_requests_excluded": self.warmup_requests,
            "requests_per_sec": round(self.requests_per_sec()),
            "avg_ms": round(self.avg_ms()),
            "p50_ms": round(self.p50_ms()),
            "p90_ms": round(self.p90_ms()),
            "p99_ms": round(self.p99_ms()),
            "p999_ms": round(self.p999_ms()),
            "p9999_ms": round(self.p9999_ms()),
            "max_ms": round(self.max_ms()),
            "server_cpu_us_per_op": self.server_cpu_us_per_op.map(round),
        })
    }

    /// The human-readable table of one run.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let system = self
            .system
            .as_deref()
            .map(|s| format!(" [{s}]"))
            .unwrap_or_default();
        let mode = match self.target_rate_per_sec {
            Some(r) => format!("fixed rate {r}/s, latency from intended send time"),
            None => "closed loop, latency from send".to_owned(),
        };
        out.push_str(&format!(
            "{}{system}: {} clients over {} conns, {mode}\n",
            self.workload, self.clients, self.conns
        ));
        out.push_str(&format!(
            "warm-up: {:.1} s, {} requests, excluded from all figures\n",
            self.warmup.as_secs_f64(),
            self.warmup_requests
        ));
        let rows = [
            ("requests", format!("{}", self.requests())),
            ("errors", format!("{}", self.errors())),
            ("elapsed", format!("{:.3} s", self.elapsed.as_secs_f64())),
            ("requests/s", format!("{:.1}", self.requests_per_sec())),
            ("avg", format!("{:.3} ms", self.avg_ms())),
            ("p50", format!("{:.3} ms", self.p50_ms())),
            ("p90", format!("{:.3} ms", self.p90_ms())),
            ("p99", format!("{:.3} ms", self.p99_ms())),
            ("p99.9", format!("{:.3} ms", self.p999_ms())),
            ("p99.99", format!("{:.3} ms", self.p9999_ms())),
            ("max", format!("{:.3} ms", self.max_ms())),
        ];
        out.push_str("| measure | value |\n|---|---|\n");
        for (name, value) in rows {
            out.push_str(&format!("| {name} | {value} |\n"));
        }
        for (code, n) in &self.recorder.errors {
            let sample = self
                .recorder
                .error_samples
                .get(code)
                .map(|m| format!(" (first: {m})"))
                .unwrap_or_default();
            out.push_str(&format!("| errors {code} | {n}{sample} |\n"));
        }
        for (name, n) in &self.recorder.counters {
            out.push_str(&format!("| {name} | {n} |\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_rate_follow_the_samples() {
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        for i in 1..=990u64 {
            a.record_ok(Duration::from_micros(i));
        }
        for _ in 0..10 {
            b.record_ok(Duration::from_millis(500));
        }
        b.record_error(&tonic::Status::unavailable("down"));
        a.merge(&b);
        let report = Report {
            workload: "put".into(),
            system: None,
            clients: 2,
            conns: 1,
            target_rate_per_sec: None,
            elapsed: Duration::from_secs(2),
            warmup: Duration::ZERO,
            warmup_requests: 0,
            recorder: a,
            server_cpu_us_per_op: None,
        };
        assert_eq!(report.requests(), 1000);
        assert_eq!(report.errors(), 1);
        assert!((report.requests_per_sec() - 500.0).abs() < 1e-9);
        assert!(
            (report.p50_ms() - 0.5).abs() < 0.01,
            "p50 {}",
            report.p50_ms()
        );
        assert!(report.p99_ms() < 1.0, "p99 {}", report.p99_ms());
        assert!(
            (report.p999_ms() - 500.0).abs() < 1.0,
            "p99.9 {}",
            report.p999_ms()
        );
        let j = report.to_json();
        assert_eq!(j["errors_by_code"]["Unavailable"], 1);
        assert_eq!(j["error_samples"]["Unavailable"], "down");
        assert_eq!(j["requests"], 1000);
    }

    #[test]
    fn overlong_latencies_saturate_instead_of_vanishing() {
        let mut r = Recorder::new();
        r.record_ok(Duration::from_secs(10 * 3600));
        assert_eq!(r.ok_count(), 1);
        assert!(r.latency_us.max() >= MAX_LATENCY_US);
    }
}

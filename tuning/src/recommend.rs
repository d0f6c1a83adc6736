//! From measurements to advice: the fastest setting that is safe on this disk,
//! written as the `[wal]` section of Cairn's config file.

use crate::model::{Engine, Experiment, ExperimentResult, IoMode, Measurement, SyncMode};
use crate::safety::DiskFacts;
use crate::stats::median;
use serde::Serialize;
use std::fmt::Write as _;

/// Fewest appends a measurement needs before its p99 means anything.
pub const SAMPLES_MIN: u64 = 100;
/// A durable append faster than this never reached stable storage: the flush was
/// dropped somewhere (a volatile cache, a hypervisor set to ignore flushes).
pub const DURABLE_APPEND_FLOOR_US: f64 = 5.0;
/// A candidate may not have a p99 worse than this many times the default's: a WAL
/// that is faster on average but stalls more often is not an improvement.
pub const P99_REGRESSION_MAX: f64 = 1.5;
/// A setting must beat the default by this much (appends/s) to be worth changing:
/// shared machines vary by 10-20% between runs, so smaller gains are noise.
pub const GAIN_PERCENT_MIN: f64 = 10.0;

/// Cairn's WAL I/O backends, as named in its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Uring,
    Sync,
}

impl Backend {
    pub fn config_name(self) -> &'static str {
        match self {
            Backend::Uring => "uring",
            Backend::Sync => "sync",
        }
    }
}

/// The part of an experiment that Cairn's `[wal]` config can express. The config
/// file's keys (read by the daemon, `src/config/mod.rs`) are `backend` ("auto", "uring",
/// "sync"), `direct-io` (bool) and `sync-mode` ("fdatasync", "dsync", "linked").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WalSetting {
    pub backend: Backend,
    pub direct_io: bool,
    pub sync_mode: SyncMode,
}

impl WalSetting {
    /// The `sync-mode` value of the config file for this setting.
    pub fn sync_mode_key(&self) -> &'static str {
        config_sync_mode(self.backend, self.sync_mode)
            .expect("a WalSetting only holds modes the WAL offers")
    }
}

/// The config file's `sync-mode` value for a durability mechanism, where Cairn's WAL
/// offers it on that backend: its io_uring backend writes then fdatasyncs, links the
/// two in one submission, or writes with RWF_DSYNC ("dsync"); its sync backend
/// writes then fdatasyncs.
pub fn config_sync_mode(backend: Backend, mode: SyncMode) -> Option<&'static str> {
    match (backend, mode) {
        (_, SyncMode::Fdatasync) => Some("fdatasync"),
        (Backend::Uring, SyncMode::RwfDsync) => Some("dsync"),
        (Backend::Uring, SyncMode::Linked) => Some("linked"),
        _ => None,
    }
}

/// How directly an engine measures what Cairn runs: the whole WAL first, then its
/// backends alone, then the lab's raw loops. Recommendations come from the most
/// direct tier that measured anything safely; outside references never count.
pub fn evidence_tier(engine: Engine) -> Option<u8> {
    match engine {
        Engine::WalUring | Engine::WalSync => Some(0),
        Engine::BackendUring | Engine::BackendSync => Some(1),
        Engine::RawUring | Engine::RawPwrite => Some(2),
        Engine::TokioUring | Engine::Glommio => None,
    }
}

/// The WAL setting an experiment stands for, if Cairn's WAL can run it: one writer
/// appending 4 KiB blocks into zero-filled space at queue depth 1 with the WAL's
/// default flush size, as the WAL writes its segments.
pub fn wal_setting(exp: &Experiment) -> Option<WalSetting> {
    let backend = match exp.engine {
        Engine::WalUring | Engine::BackendUring | Engine::RawUring => Backend::Uring,
        Engine::WalSync | Engine::BackendSync | Engine::RawPwrite => Backend::Sync,
        Engine::TokioUring | Engine::Glommio => return None,
    };
    let base = crate::matrix::base_for(exp.engine);
    let shape_matches = exp.queue_depth == base.queue_depth
        && exp.writers == base.writers
        && exp.prealloc == base.prealloc
        && exp.block_size_bytes == base.block_size_bytes
        && exp.batch_max_bytes == base.batch_max_bytes;
    if !shape_matches {
        return None;
    }
    config_sync_mode(backend, exp.sync_mode)?;
    Some(WalSetting {
        backend,
        direct_io: exp.io_mode == IoMode::Direct,
        sync_mode: exp.sync_mode,
    })
}

/// Cairn's default setting (the daemon's `[wal]` defaults), then what the WAL falls
/// back to where it cannot run: buffered I/O where O_DIRECT is refused, the sync
/// backend where io_uring is unavailable.
pub const DEFAULT_SETTINGS: [WalSetting; 3] = [
    WalSetting {
        backend: Backend::Uring,
        direct_io: true,
        sync_mode: SyncMode::RwfDsync,
    },
    WalSetting {
        backend: Backend::Uring,
        direct_io: false,
        sync_mode: SyncMode::RwfDsync,
    },
    WalSetting {
        backend: Backend::Sync,
        direct_io: false,
        sync_mode: SyncMode::Fdatasync,
    },
];

/// Why a measurement cannot be trusted as durable, if it cannot.
pub fn unsafe_reason(m: &Measurement, facts: &DiskFacts) -> Option<String> {
    if facts.volatile {
        return Some(format!(
            "{} is {}: nothing written there survives a power loss",
            facts.dir, facts.filesystem
        ));
    }
    if !m.verified {
        return Some("bytes read back differ from those written".into());
    }
    if m.appends < SAMPLES_MIN {
        return Some(format!(
            "only {} appends measured (need {SAMPLES_MIN})",
            m.appends
        ));
    }
    if m.latency.p50_us < DURABLE_APPEND_FLOOR_US {
        return Some(format!(
            "p50 {:.1} µs is below {DURABLE_APPEND_FLOOR_US} µs: syncs are not reaching stable storage",
            m.latency.p50_us
        ));
    }
    None
}

/// A recommended setting with the figures that justify it.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    pub setting: WalSetting,
    pub experiment: String,
    pub appends_per_sec: f64,
    pub p99_us: f64,
    pub default_experiment: String,
    pub default_appends_per_sec: f64,
    pub default_p99_us: f64,
    /// (recommended / default - 1) in percent, on appends per second.
    pub gain_percent: f64,
    /// Settings that were faster but set aside, and why.
    pub rejected: Vec<String>,
    /// The re-measurement that confirmed (or overturned) the first pick.
    pub confirmation: Option<Confirmation>,
    /// The `[wal]` section, ready to paste.
    pub toml: String,
}

/// Alternating re-runs of the pick and the default: on a shared, drifting disk one
/// pass of the matrix can crown a setting that merely ran during a quiet second.
#[derive(Debug, Clone, Serialize)]
pub struct Confirmation {
    /// The first pick's label (kept even when the confirmation overturns it).
    pub candidate: String,
    pub candidate_appends_per_sec: Vec<f64>,
    pub default_appends_per_sec: Vec<f64>,
    /// Median of the per-round gains, in percent.
    pub median_gain_percent: f64,
    pub confirmed: bool,
}

/// Rounds of the confirmation: each runs the pick and the default back to back.
pub const CONFIRM_ROUNDS: usize = 3;

/// Applies alternating re-measurements of the pick (`candidate`) and the default
/// (`default`, paired round by round) to a recommendation: the pick stands only if
/// the median per-round gain is still at least [`GAIN_PERCENT_MIN`]; otherwise the
/// default is recommended. Rounds where either side failed are ignored.
pub fn apply_confirmation(
    mut rec: Recommendation,
    default_setting: WalSetting,
    candidate: &[Option<f64>],
    default: &[Option<f64>],
    facts: &DiskFacts,
) -> Recommendation {
    let pairs: Vec<(f64, f64)> = candidate
        .iter()
        .zip(default)
        .filter_map(|(c, d)| Some(((*c)?, (*d)?)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    if pairs.is_empty() {
        rec.rejected
            .push("confirmation rounds could not run; the pick rests on one pass".into());
        return rec;
    }
    let gains: Vec<f64> = pairs.iter().map(|(c, d)| (c / d - 1.0) * 100.0).collect();
    let median_gain_percent = median(gains);
    let confirmed = median_gain_percent >= GAIN_PERCENT_MIN;
    let c_rates: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let d_rates: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    rec.confirmation = Some(Confirmation {
        candidate: rec.experiment.clone(),
        candidate_appends_per_sec: c_rates.clone(),
        default_appends_per_sec: d_rates.clone(),
        median_gain_percent,
        confirmed,
    });
    if confirmed {
        rec.appends_per_sec = median(c_rates);
        rec.default_appends_per_sec = median(d_rates);
        rec.gain_percent = median_gain_percent;
    } else {
        rec.rejected.push(format!(
            "{}: re-measured against the default over {} alternating rounds, median gain {median_gain_percent:+.1}% is under {GAIN_PERCENT_MIN}%",
            rec.experiment,
            pairs.len()
        ));
        rec.setting = default_setting;
        rec.experiment = rec.default_experiment.clone();
        rec.appends_per_sec = rec.default_appends_per_sec;
        rec.p99_us = rec.default_p99_us;
        rec.gain_percent = 0.0;
    }
    rec.toml = render_toml(&rec, facts);
    rec
}

/// Why no setting could be recommended.
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error, Serialize)]
pub enum NoRecommendation {
    #[error("{0}")]
    VolatileDisk(String),
    #[error("no experiment that maps onto Cairn's WAL settings was measured safely")]
    NothingSafe,
}

/// Picks the safe WAL setting with the most appends per second among the most
/// direct evidence available, and compares it with the default measured the same way.
pub fn recommend(
    results: &[ExperimentResult],
    facts: &DiskFacts,
) -> Result<Recommendation, NoRecommendation> {
    if facts.volatile {
        return Err(NoRecommendation::VolatileDisk(format!(
            "{} is on {}: nothing there is durable, so no WAL setting is safe; run cairn-tune on the disk that will hold the WAL",
            facts.dir, facts.filesystem
        )));
    }
    let safe: Vec<(u8, &ExperimentResult, WalSetting, &Measurement)> = results
        .iter()
        .filter_map(|r| {
            let tier = evidence_tier(r.experiment.engine)?;
            let setting = wal_setting(&r.experiment)?;
            let m = r.outcome.measurement()?;
            unsafe_reason(m, facts)
                .is_none()
                .then_some((tier, r, setting, m))
        })
        .collect();
    let tier = safe
        .iter()
        .map(|c| c.0)
        .min()
        .ok_or(NoRecommendation::NothingSafe)?;
    let mut candidates: Vec<_> = safe.into_iter().filter(|c| c.0 == tier).collect();
    candidates.sort_by(|a, b| b.3.appends_per_sec.total_cmp(&a.3.appends_per_sec));
    let baseline = DEFAULT_SETTINGS
        .iter()
        .find_map(|d| candidates.iter().find(|c| c.2 == *d))
        .map(|c| (c.1, c.3));
    let mut rejected = Vec::new();
    let chosen = candidates.iter().find(|(_, r, _, m)| match baseline {
        Some((_, base)) if m.latency.p99_us > base.latency.p99_us * P99_REGRESSION_MAX => {
            rejected.push(format!(
                "{}: {:.0} appends/s but p99 {:.0} µs is over {P99_REGRESSION_MAX}x the default's {:.0} µs",
                r.label, m.appends_per_sec, m.latency.p99_us, base.latency.p99_us
            ));
            false
        }
        _ => true,
    });
    let &(_, mut result, mut setting, mut m) = chosen.ok_or(NoRecommendation::NothingSafe)?;
    let (default_label, default_m) = match baseline {
        Some((r, bm)) => (r.label.clone(), bm),
        None => ("default setting (not measurable here)".to_string(), m),
    };
    if let Some((default_result, default_measurement)) = baseline {
        let gain = (m.appends_per_sec / default_measurement.appends_per_sec - 1.0) * 100.0;
        if gain < GAIN_PERCENT_MIN && result.label != default_result.label {
            rejected.push(format!(
                "{}: {gain:+.1}% over the default is within run-to-run noise ({GAIN_PERCENT_MIN}% needed)",
                result.label
            ));
            let default_setting =
                wal_setting(&default_result.experiment).expect("baseline maps to a setting");
            (result, setting, m) = (default_result, default_setting, default_measurement);
        }
    }
    let gain_percent = (m.appends_per_sec / default_m.appends_per_sec - 1.0) * 100.0;
    let mut rec = Recommendation {
        setting,
        experiment: result.label.clone(),
        appends_per_sec: m.appends_per_sec,
        p99_us: m.latency.p99_us,
        default_experiment: default_label,
        default_appends_per_sec: default_m.appends_per_sec,
        default_p99_us: default_m.latency.p99_us,
        gain_percent,
        rejected,
        confirmation: None,
        toml: String::new(),
    };
    rec.toml = render_toml(&rec, facts);
    Ok(rec)
}

/// The `[wal]` section with comments giving the measured figures.
pub fn render_toml(rec: &Recommendation, facts: &DiskFacts) -> String {
    let mut s = String::new();
    let cache = facts.write_cache.as_deref().unwrap_or("unknown");
    let _ = writeln!(
        s,
        "# cairn-tune: fastest safe WAL setting for {} ({}, device write cache: {cache})",
        facts.dir, facts.filesystem
    );
    let _ = writeln!(
        s,
        "# measured {:.0} appends/s, p99 {:.0} µs ({})",
        rec.appends_per_sec, rec.p99_us, rec.experiment
    );
    let _ = writeln!(
        s,
        "# default  {:.0} appends/s, p99 {:.0} µs ({}): {:+.1}% appends/s",
        rec.default_appends_per_sec, rec.default_p99_us, rec.default_experiment, rec.gain_percent
    );
    if let Some(c) = &rec.confirmation {
        let _ =
            writeln!(
            s,
            "# re-measured over {} alternating rounds against the default: median gain {:+.1}%{}",
            c.candidate_appends_per_sec.len(),
            c.median_gain_percent,
            if c.confirmed { "" } else { " (not enough: the default stays)" }
        );
    }
    let _ = writeln!(s, "[wal]");
    let _ = writeln!(s, "backend = \"{}\"", rec.setting.backend.config_name());
    let _ = writeln!(s, "direct-io = {}", rec.setting.direct_io);
    let _ = writeln!(s, "sync-mode = \"{}\"", rec.setting.sync_mode_key());
    s
}

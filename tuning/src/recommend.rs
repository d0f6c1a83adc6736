//! From measurements to advice: the fastest setting that is safe on this disk,
//! written as the `[wal]` section of Cairn's config file.

use crate::model::{Engine, Experiment, ExperimentResult, IoMode, Measurement, Prealloc, SyncMode};
use crate::safety::DiskFacts;
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

/// The part of an experiment that Cairn's `[wal]` config can express.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WalSetting {
    pub backend: Backend,
    pub direct_io: bool,
    pub sync_mode: SyncMode,
}

/// Durability mechanisms Cairn's WAL offers, per backend.
pub fn wal_sync_modes(backend: Backend) -> &'static [SyncMode] {
    match backend {
        Backend::Uring => &[SyncMode::Fdatasync, SyncMode::RwfDsync, SyncMode::Linked],
        Backend::Sync => &[SyncMode::Fdatasync],
    }
}

/// The WAL setting an experiment stands for, if Cairn's WAL can run it: a 1-writer,
/// queue-depth-1, 4 KiB append into a zero-filled file, as the WAL writes its segments.
pub fn wal_setting(exp: &Experiment) -> Option<WalSetting> {
    let backend = match exp.engine {
        Engine::RawUring => Backend::Uring,
        Engine::RawPwrite => Backend::Sync,
        Engine::TokioUring | Engine::Glommio => return None,
    };
    let shape_matches = exp.queue_depth == 1
        && exp.writers == 1
        && exp.prealloc == Prealloc::ZeroFill
        && exp.block_size_bytes == crate::matrix::DEFAULT_BLOCK_SIZE_BYTES;
    if !shape_matches || !wal_sync_modes(backend).contains(&exp.sync_mode) {
        return None;
    }
    Some(WalSetting {
        backend,
        direct_io: exp.io_mode == IoMode::Direct,
        sync_mode: exp.sync_mode,
    })
}

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
    /// The `[wal]` section, ready to paste.
    pub toml: String,
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

fn find<'a>(results: &'a [ExperimentResult], exp: &Experiment) -> Option<&'a Measurement> {
    results
        .iter()
        .find(|r| r.experiment == *exp)
        .and_then(|r| r.outcome.measurement())
}

/// Picks the safe WAL setting with the most appends per second, compared with the
/// default (or with what the WAL falls back to when the default cannot run here:
/// buffered I/O where O_DIRECT is refused, the sync backend where io_uring is).
pub fn recommend(
    results: &[ExperimentResult],
    facts: &DiskFacts,
    default: &Experiment,
) -> Result<Recommendation, NoRecommendation> {
    if facts.volatile {
        return Err(NoRecommendation::VolatileDisk(format!(
            "{} is on {}: nothing there is durable, so no WAL setting is safe; run cairn-tune on the disk that will hold the WAL",
            facts.dir, facts.filesystem
        )));
    }
    let fallbacks = [
        *default,
        Experiment {
            io_mode: IoMode::Buffered,
            ..*default
        },
        Experiment {
            engine: Engine::RawPwrite,
            io_mode: IoMode::Buffered,
            ..*default
        },
    ];
    let baseline = fallbacks.iter().find_map(|e| {
        find(results, e)
            .filter(|m| unsafe_reason(m, facts).is_none())
            .map(|m| (e, m))
    });
    let mut candidates: Vec<(&ExperimentResult, WalSetting, &Measurement)> = results
        .iter()
        .filter_map(|r| {
            let setting = wal_setting(&r.experiment)?;
            let m = r.outcome.measurement()?;
            unsafe_reason(m, facts).is_none().then_some((r, setting, m))
        })
        .collect();
    candidates.sort_by(|a, b| b.2.appends_per_sec.total_cmp(&a.2.appends_per_sec));
    let mut rejected = Vec::new();
    let chosen = candidates.iter().find(|(r, _, m)| match baseline {
        Some((_, base)) if m.latency.p99_us > base.latency.p99_us * P99_REGRESSION_MAX => {
            rejected.push(format!(
                "{}: {:.0} appends/s but p99 {:.0} µs is over {P99_REGRESSION_MAX}x the default's {:.0} µs",
                r.label, m.appends_per_sec, m.latency.p99_us, base.latency.p99_us
            ));
            false
        }
        _ => true,
    });
    let Some(&(result, setting, m)) = chosen else {
        return Err(NoRecommendation::NothingSafe);
    };
    let (default_label, default_m) = match baseline {
        Some((e, bm)) => (e.label(), bm),
        None => (format!("{} (not measurable here)", default.label()), m),
    };
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
    let _ = writeln!(s, "[wal]");
    let _ = writeln!(s, "backend = \"{}\"", rec.setting.backend.config_name());
    let _ = writeln!(s, "direct_io = {}", rec.setting.direct_io);
    let _ = writeln!(s, "sync_mode = \"{}\"", rec.setting.sync_mode.name());
    s
}

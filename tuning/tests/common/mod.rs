//! Helpers shared by the lab's integration tests: synthetic results and scratch
//! directories on a real (non-tmpfs) disk.

#![allow(dead_code)]

use cairn_tuning::model::{
    Engine, Experiment, ExperimentResult, IoMode, LatencySummary, Measurement, Outcome, SyncMode,
};
use cairn_tuning::safety::DiskFacts;
use std::path::PathBuf;

/// A scratch directory under the target dir (the build's disk, not /tmp, which
/// may be tmpfs in some environments).
pub fn scratch_dir() -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A measurement with the given rate and p99 (others derived), verified.
pub fn measured(appends_per_sec: f64, p99_us: f64) -> Outcome {
    let p50_us = 1e6 / appends_per_sec;
    Outcome::Measured(Measurement {
        appends: 5000,
        elapsed_secs: 5000.0 / appends_per_sec,
        appends_per_sec,
        syncs: 5000,
        latency: LatencySummary {
            p50_us,
            p90_us: p50_us * 1.2,
            p99_us,
            p999_us: p99_us * 2.0,
            max_us: p99_us * 4.0,
            mean_us: p50_us,
        },
        cdf: vec![
            (p50_us * 0.5, 0.0),
            (p50_us, 0.5),
            (p99_us, 0.99),
            (p99_us * 4.0, 1.0),
        ],
        verified: true,
        zero_fill_bytes: 0,
    })
}

pub fn result(exp: Experiment, outcome: Outcome) -> ExperimentResult {
    ExperimentResult {
        label: exp.label(),
        experiment: exp,
        outcome,
    }
}

pub fn wal(io_mode: IoMode, sync_mode: SyncMode) -> Experiment {
    Experiment {
        io_mode,
        sync_mode,
        ..cairn_tuning::matrix::base_for(Engine::WalUring)
    }
}

pub fn disk() -> DiskFacts {
    DiskFacts {
        dir: "/data/cairn".into(),
        filesystem: "ext4".into(),
        free_bytes: 1 << 40,
        write_cache: Some("write back".into()),
        volatile: false,
    }
}

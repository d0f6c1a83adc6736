//! The experiment matrix and the driver that runs it: one experiment at a time, each
//! in its own file, each failure kept to its own row.

use crate::engines::{self, prepare_file, verify, RunLimits};
use crate::error::ExperimentError;
use crate::model::{
    Engine, Experiment, ExperimentResult, IoMode, Measurement, Outcome, Prealloc, SyncMode,
};
use crate::safety::{stop_requested, LabDir};
use std::time::Duration;

/// The block every WAL append is padded to (a 4 KiB page: the O_DIRECT unit).
pub const DEFAULT_BLOCK_SIZE_BYTES: usize = 4096;
/// Block sizes of the block-size sweep.
pub const BLOCK_SIZES_BYTES: [usize; 4] = [512, 16 << 10, 64 << 10, 256 << 10];
pub const BLOCK_SIZES_QUICK_BYTES: [usize; 2] = [16 << 10, 64 << 10];
/// Queue depths of the queue-depth sweep.
pub const QUEUE_DEPTHS: [u32; 7] = [2, 4, 8, 16, 32, 64, 128];
pub const QUEUE_DEPTHS_QUICK: [u32; 3] = [4, 16, 64];

const _: () = assert!(QUEUE_DEPTHS[QUEUE_DEPTHS.len() - 1] <= engines::raw_uring::QUEUE_DEPTH_MAX);
const _: () =
    assert!(BLOCK_SIZES_BYTES[BLOCK_SIZES_BYTES.len() - 1] <= FILE_SIZE_QUICK_BYTES as usize / 64);

/// Measured time of one experiment.
pub const DURATION_FULL: Duration = Duration::from_secs(3);
pub const DURATION_QUICK: Duration = Duration::from_millis(400);
/// Size of each experiment's file (appends stop at its end).
pub const FILE_SIZE_FULL_BYTES: u64 = 256 << 20;
pub const FILE_SIZE_QUICK_BYTES: u64 = 32 << 20;

/// The limits of a full or a `--quick` run.
pub fn limits(quick: bool) -> RunLimits {
    if quick {
        RunLimits {
            duration: DURATION_QUICK,
            file_size_bytes: FILE_SIZE_QUICK_BYTES,
        }
    } else {
        RunLimits {
            duration: DURATION_FULL,
            file_size_bytes: FILE_SIZE_FULL_BYTES,
        }
    }
}

/// What Cairn's WAL does out of the box: io_uring, O_DIRECT, write then fdatasync,
/// zero-filled segments, one 4 KiB block per append. Gains are measured against it.
pub fn default_experiment() -> Experiment {
    Experiment {
        engine: Engine::RawUring,
        io_mode: IoMode::Direct,
        sync_mode: SyncMode::Fdatasync,
        prealloc: Prealloc::ZeroFill,
        block_size_bytes: DEFAULT_BLOCK_SIZE_BYTES,
        queue_depth: 1,
        writers: 1,
        batch_max_appends: 1,
    }
}

/// The experiments of a run. Every engine meets every I/O mode and durability
/// mechanism it can express at the default point; the other dimensions are swept one
/// at a time around that point, so the matrix stays small enough to finish.
pub fn build_matrix(quick: bool) -> Vec<Experiment> {
    let base = default_experiment();
    let mut out = Vec::new();
    let mut push = |e: Experiment| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    // Engines x I/O mode x durability.
    for engine in Engine::ALL {
        for io_mode in [IoMode::Buffered, IoMode::Direct] {
            for &sync_mode in engine.sync_modes() {
                push(Experiment {
                    engine,
                    io_mode,
                    sync_mode,
                    ..base
                });
            }
        }
    }
    // Preallocation.
    for engine in [Engine::RawUring, Engine::RawPwrite] {
        for io_mode in [IoMode::Buffered, IoMode::Direct] {
            for prealloc in Prealloc::ALL {
                push(Experiment {
                    engine,
                    io_mode,
                    prealloc,
                    ..base
                });
            }
        }
    }
    // Block size, with a separate sync and with per-write durability.
    let block_sizes: &[usize] = if quick {
        &BLOCK_SIZES_QUICK_BYTES
    } else {
        &BLOCK_SIZES_BYTES
    };
    for &block_size_bytes in block_sizes {
        for sync_mode in [SyncMode::Fdatasync, SyncMode::RwfDsync] {
            push(Experiment {
                sync_mode,
                block_size_bytes,
                ..base
            });
        }
    }
    // Queue depth: appends in flight from one writer.
    let depths: &[u32] = if quick {
        &QUEUE_DEPTHS_QUICK
    } else {
        &QUEUE_DEPTHS
    };
    for &queue_depth in depths {
        for sync_mode in [SyncMode::Fdatasync, SyncMode::RwfDsync, SyncMode::Linked] {
            push(Experiment {
                sync_mode,
                queue_depth,
                ..base
            });
        }
    }
    out
}

/// Runs one experiment in a fresh file of DIR and removes the file afterwards. Every
/// error (full disk, unsupported mode, I/O failure) becomes this experiment's outcome.
pub fn run_experiment(lab: &LabDir, exp: &Experiment, limits: &RunLimits) -> Outcome {
    if stop_requested() {
        return Outcome::Interrupted;
    }
    let path = lab.file_path("dat");
    let result = (|| -> Result<Measurement, ExperimentError> {
        prepare_file(&path, exp.prealloc, limits.file_size_bytes)?;
        let (mut measurement, appends) = match exp.engine {
            Engine::RawPwrite => engines::raw_pwrite::run(exp, &path, limits)?,
            Engine::RawUring => engines::raw_uring::run(exp, &path, limits)?,
            Engine::TokioUring => engines::tokio_uring_file::run(exp, &path, limits)?,
            Engine::Glommio => engines::glommio_dma::run(exp, &path, limits)?,
        };
        measurement.verified = verify(&path, exp.block_size_bytes, appends)?;
        Ok(measurement)
    })();
    lab.remove(&path);
    match result {
        Ok(m) => {
            tracing::info!(experiment = %exp.label(), appends_per_sec = m.appends_per_sec, p99_us = m.latency.p99_us, "measured");
            Outcome::Measured(m)
        }
        Err(e) => {
            tracing::info!(experiment = %exp.label(), error = %e, "not measured");
            e.into_outcome()
        }
    }
}

/// Runs the experiments in order, calling `progress` after each; stops early (the
/// rest marked interrupted) once Ctrl-C arrives.
pub fn run_matrix(
    lab: &LabDir,
    experiments: &[Experiment],
    limits: &RunLimits,
    mut progress: impl FnMut(usize, &ExperimentResult),
) -> Vec<ExperimentResult> {
    let mut results = Vec::with_capacity(experiments.len());
    for (i, exp) in experiments.iter().enumerate() {
        let outcome = run_experiment(lab, exp, limits);
        let result = ExperimentResult {
            experiment: *exp,
            label: exp.label(),
            outcome,
        };
        progress(i, &result);
        results.push(result);
    }
    results
}

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
pub const FILE_SIZE_FULL_BYTES: u64 = 128 << 20;
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

/// Bytes per append in the group-commit sweep: a small Raft entry, as in the WAL's
/// own benchmark target (64 writers of 256-byte records).
pub const GROUP_COMMIT_BLOCK_SIZE_BYTES: usize = 256;
/// Writer counts of the group-commit sweep.
pub const WRITERS: [u32; 5] = [1, 4, 16, 64, 256];
pub const WRITERS_QUICK: [u32; 3] = [1, 16, 256];
/// Flush size limits (the WAL's `max_batch_bytes`) of the group-commit sweep.
pub const BATCH_SIZES_BYTES: [u64; 3] = [
    16 << 10,
    256 << 10,
    cairn_wal::DEFAULT_MAX_BATCH_BYTES as u64,
];
pub const BATCH_SIZE_SMALL_QUICK_BYTES: u64 = 16 << 10;

const _: () = assert!(WRITERS[WRITERS.len() - 1] <= engines::wal::WRITERS_MAX);
const _: () = assert!(WRITERS_QUICK[WRITERS_QUICK.len() - 1] <= engines::wal::WRITERS_MAX);

/// What Cairn does out of the box (the daemon's `[wal]` defaults): the whole WAL on
/// io_uring, O_DIRECT, one RWF_DSYNC write, zero-filled segments, one 4 KiB block
/// per append, one writer. Gains are measured against it.
pub fn default_experiment() -> Experiment {
    Experiment {
        engine: Engine::WalUring,
        io_mode: IoMode::Direct,
        sync_mode: SyncMode::RwfDsync,
        prealloc: Prealloc::ZeroFill,
        block_size_bytes: DEFAULT_BLOCK_SIZE_BYTES,
        queue_depth: 1,
        writers: 1,
        batch_max_bytes: cairn_wal::DEFAULT_MAX_BATCH_BYTES as u64,
    }
}

/// The default point as run by `engine`: group commit settings only where the
/// engine is the whole WAL, and fdatasync where the engine has no RWF_DSYNC
/// (the sync backend's only mechanism).
pub fn base_for(engine: Engine) -> Experiment {
    let default = default_experiment();
    Experiment {
        engine,
        batch_max_bytes: if engine.is_wal() {
            default.batch_max_bytes
        } else {
            0
        },
        sync_mode: if engine.sync_modes().contains(&default.sync_mode) {
            default.sync_mode
        } else {
            SyncMode::Fdatasync
        },
        ..default
    }
}

/// The experiments of a run. Every engine meets every I/O mode and durability
/// mechanism it can express at the default point; the other dimensions are swept one
/// at a time around that point, so the matrix stays small enough to finish.
pub fn build_matrix(quick: bool) -> Vec<Experiment> {
    let base = base_for(Engine::RawUring);
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
                    io_mode,
                    sync_mode,
                    ..base_for(engine)
                });
            }
        }
    }
    // Preallocation.
    for engine in [Engine::RawUring, Engine::RawPwrite] {
        for io_mode in [IoMode::Buffered, IoMode::Direct] {
            for prealloc in Prealloc::ALL {
                push(Experiment {
                    io_mode,
                    prealloc,
                    ..base_for(engine)
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
    // Group commit: concurrent writers through the whole WAL, and its flush size.
    let wal = base_for(Engine::WalUring);
    let small = Experiment {
        block_size_bytes: GROUP_COMMIT_BLOCK_SIZE_BYTES,
        ..wal
    };
    if quick {
        for &writers in &WRITERS_QUICK {
            push(Experiment { writers, ..small });
        }
        let most = WRITERS_QUICK[WRITERS_QUICK.len() - 1];
        push(Experiment {
            writers: most,
            batch_max_bytes: BATCH_SIZE_SMALL_QUICK_BYTES,
            ..small
        });
        push(Experiment {
            writers: most,
            sync_mode: SyncMode::Linked,
            ..small
        });
        push(Experiment {
            writers: most,
            ..Experiment {
                block_size_bytes: GROUP_COMMIT_BLOCK_SIZE_BYTES,
                ..base_for(Engine::WalSync)
            }
        });
    } else {
        for &writers in &WRITERS {
            for &batch_max_bytes in &BATCH_SIZES_BYTES {
                push(Experiment {
                    writers,
                    batch_max_bytes,
                    ..small
                });
            }
            for sync_mode in [SyncMode::Linked, SyncMode::RwfDsync] {
                push(Experiment {
                    writers,
                    sync_mode,
                    ..small
                });
            }
            push(Experiment {
                writers,
                ..Experiment {
                    block_size_bytes: GROUP_COMMIT_BLOCK_SIZE_BYTES,
                    ..base_for(Engine::WalSync)
                }
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
    let path = lab.file_path(if exp.engine.is_wal() { "wal" } else { "dat" });
    let result = (|| -> Result<Measurement, ExperimentError> {
        if exp.engine.is_wal() {
            // The WAL creates, preallocates and checks its own segments in `path`.
            return engines::wal::run_wal(exp, &path, limits).map(|(m, _)| m);
        }
        prepare_file(&path, exp.prealloc, limits.file_size_bytes)?;
        let (mut measurement, appends) = match exp.engine {
            Engine::WalUring | Engine::WalSync => unreachable!("handled above"),
            Engine::BackendUring | Engine::BackendSync => {
                engines::wal::run_backend(exp, &path, limits)?
            }
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

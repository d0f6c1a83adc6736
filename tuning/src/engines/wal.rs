//! Experiments through Cairn's own WAL crate: the whole log (`Wal::append`, with its
//! framing, CRC and group commit, one task per writer) and its two I/O backends on
//! their own (`StorageFile::write_durable`, exactly the submission the log issues
//! per flush). Nothing here re-implements the WAL: it only drives it and times it.

use super::{open_for_appends, RunLimits};
use crate::buf::{fill_pattern, matches_pattern};
use crate::error::ExperimentError;
use crate::model::{Engine, Experiment, IoMode, Measurement, SyncMode};
use crate::safety::stop_requested;
use crate::stats::Recorder;
use bytes::Bytes;
use cairn_wal::{
    AlignedBuf as WalBuf, AppendError, BackendChoice, Config, DirectIo, OpenError, Record, Storage,
    SyncOptions, SyncStorage, Uring, UringOptions, UringStorage, Wal, DEFAULT_RING_ENTRIES,
};
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

/// Most concurrent writers of one experiment (each writes its own shard).
pub const WRITERS_MAX: u32 = 256;
/// Shards the WAL is opened for: one per writer.
const WAL_SHARDS_MAX: usize = WRITERS_MAX as usize;

/// The WAL's name for a durability mechanism of its io_uring backend.
pub fn uring_sync_mode(mode: SyncMode) -> Option<cairn_wal::SyncMode> {
    match mode {
        SyncMode::Fdatasync => Some(cairn_wal::SyncMode::Fdatasync),
        SyncMode::Linked => Some(cairn_wal::SyncMode::LinkedFdatasync),
        SyncMode::RwfDsync => Some(cairn_wal::SyncMode::RwfDsync),
        SyncMode::Fsync | SyncMode::ODsync => None,
    }
}

/// Payload bytes of a record appended alone whose write is `block_size_bytes`
/// on disk, the WAL's batch framing included.
pub fn payload_bytes(block_size_bytes: usize) -> usize {
    cairn_wal::lone_record_payload_bytes(block_size_bytes)
}

fn unsupported_mode(exp: &Experiment) -> ExperimentError {
    ExperimentError::Unsupported {
        what: format!("{} with {}", exp.engine.name(), exp.sync_mode.name()),
        reason: "cairn-wal does not offer this durability mode on this backend".into(),
    }
}

/// Runs `f` on a fresh thread with a current-thread tokio runtime and a LocalSet,
/// as a Cairn core does (the WAL and its ring are not Send).
fn on_core_thread<F, Fut>(name: &'static str, f: F) -> Result<(Measurement, u64), ExperimentError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(Measurement, u64), ExperimentError>>,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ExperimentError::EngineUnavailable {
                    engine: name,
                    reason: format!("tokio runtime: {e}"),
                })?;
            tokio::task::LocalSet::new().block_on(&runtime, f())
        })
        .map_err(|e| ExperimentError::EngineUnavailable {
            engine: name,
            reason: format!("cannot start its thread: {e}"),
        })?
        .join()
        .map_err(|panic| ExperimentError::EngineUnavailable {
            engine: name,
            reason: super::tokio_uring_file::panic_message(&panic),
        })?
}

fn io_error(op: &'static str, path: &Path, e: std::io::Error, direct: bool) -> ExperimentError {
    if e.kind() == std::io::ErrorKind::Unsupported {
        return ExperimentError::Unsupported {
            what: if direct { "O_DIRECT".into() } else { op.into() },
            reason: e.to_string(),
        };
    }
    if direct {
        ExperimentError::from_mode_io(op, "O_DIRECT", path, 0, e)
    } else {
        ExperimentError::from_io(op, path, 0, e)
    }
}

// ---------------------------------------------------------------------------
// The backends alone.

/// Times `write_durable` of cairn-wal's backend on the prepared file at `path`.
pub fn run_backend(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    if exp.io_mode == IoMode::Direct {
        // The sync backend falls back to buffered I/O where O_DIRECT is refused;
        // an experiment labelled "direct" must not silently measure buffered I/O.
        drop(open_for_appends(path, IoMode::Direct, false)?);
    }
    let (exp, path, limits) = (*exp, path.to_path_buf(), *limits);
    on_core_thread("cairn-tune-backend", move || {
        backend_appends(exp, path, limits)
    })
}

async fn backend_appends(
    exp: Experiment,
    path: PathBuf,
    limits: RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let dir = path
        .parent()
        .expect("experiment file has a directory")
        .to_path_buf();
    let name = path
        .file_name()
        .expect("experiment file has a name")
        .to_string_lossy()
        .into_owned();
    let direct = exp.io_mode == IoMode::Direct;
    let storage: Rc<dyn Storage> = match exp.engine {
        Engine::BackendUring => {
            let sync_mode = uring_sync_mode(exp.sync_mode).ok_or_else(|| unsupported_mode(&exp))?;
            let ring =
                Uring::new(DEFAULT_RING_ENTRIES).map_err(super::raw_uring::uring_unavailable)?;
            let opts = UringOptions {
                direct: if direct { DirectIo::On } else { DirectIo::Off },
                sync_mode,
                ..UringOptions::default()
            };
            Rc::new(
                UringStorage::new(&dir, ring, opts)
                    .map_err(|e| io_error("open dir", &dir, e, false))?,
            )
        }
        Engine::BackendSync => {
            if exp.sync_mode != SyncMode::Fdatasync {
                return Err(unsupported_mode(&exp));
            }
            let opts = SyncOptions {
                direct,
                ..SyncOptions::default()
            };
            Rc::new(SyncStorage::new(&dir, opts).map_err(|e| io_error("open dir", &dir, e, false))?)
        }
        other => panic!("backend experiment given engine {other}"),
    };
    let file = storage
        .open(&name, false)
        .map_err(|e| io_error("open", &path, e, direct))?;
    let bs = exp.block_size_bytes;
    let mut pattern = vec![0u8; bs];
    let mut buf = WalBuf::with_capacity(bs);
    let mut rec = Recorder::new();
    let appends_max = limits.appends_max(&exp);
    let start = Instant::now();
    let mut seq = 0u64;
    while seq < appends_max && start.elapsed() < limits.duration {
        if stop_requested() {
            return Err(ExperimentError::Interrupted);
        }
        fill_pattern(&mut pattern, seq);
        buf.clear();
        buf.extend_from_slice(&pattern);
        let offset = seq * bs as u64;
        let t0 = Instant::now();
        let (returned, res) = file.write_durable(offset, buf).await;
        buf = returned;
        res.map_err(|e| {
            if direct {
                ExperimentError::from_mode_io("write_durable", "O_DIRECT", &path, offset, e)
            } else {
                ExperimentError::from_io("write_durable", &path, offset, e)
            }
        })?;
        rec.record(t0.elapsed());
        rec.syncs += 1;
        seq += 1;
    }
    Ok((rec.finish(start.elapsed(), true), seq))
}

// ---------------------------------------------------------------------------
// The whole WAL.

/// The WAL config of an experiment: its backend settings, segments as large as the
/// experiment's file, one shard per writer, records as large as the block size.
pub fn wal_config(
    exp: &Experiment,
    dir: &Path,
    limits: &RunLimits,
) -> Result<Config, ExperimentError> {
    let mut cfg = Config::new(dir);
    let direct = exp.io_mode == IoMode::Direct;
    cfg.backend = match exp.engine {
        Engine::WalUring => BackendChoice::Uring(UringOptions {
            direct: if direct { DirectIo::On } else { DirectIo::Off },
            sync_mode: uring_sync_mode(exp.sync_mode).ok_or_else(|| unsupported_mode(exp))?,
            ..UringOptions::default()
        }),
        Engine::WalSync if exp.sync_mode == SyncMode::Fdatasync => {
            BackendChoice::Sync(SyncOptions {
                direct,
                ..SyncOptions::default()
            })
        }
        Engine::WalSync => return Err(unsupported_mode(exp)),
        other => panic!("WAL experiment given engine {other}"),
    };
    cfg.segment_size_bytes = limits.file_size_bytes;
    cfg.max_shards = WAL_SHARDS_MAX;
    cfg.max_record_payload_bytes = payload_bytes(exp.block_size_bytes).max(1);
    if exp.batch_max_bytes > 0 {
        cfg.max_batch_bytes = exp.batch_max_bytes as usize;
        cfg.max_queued_bytes = cfg.max_queued_bytes.max(cfg.max_batch_bytes);
    }
    cfg.validate().map_err(|e| ExperimentError::Unsupported {
        what: "this WAL configuration".into(),
        reason: e.to_string(),
    })?;
    Ok(cfg)
}

fn open_error(dir: &Path, direct: bool, e: OpenError) -> ExperimentError {
    match e {
        OpenError::UringUnavailable { reason, .. } => ExperimentError::Unsupported {
            what: "io_uring".into(),
            reason,
        },
        OpenError::Io { path, source } => io_error("wal open", &path, source, direct),
        other => ExperimentError::Io {
            op: "wal open",
            path: dir.to_path_buf(),
            offset: 0,
            source: std::io::Error::other(other.to_string()),
        },
    }
}

fn append_error(dir: &Path, e: AppendError) -> ExperimentError {
    match e {
        AppendError::NoSpace { file, offset } => ExperimentError::NoSpace { path: file, offset },
        other => ExperimentError::Io {
            op: "wal append",
            path: dir.to_path_buf(),
            offset: 0,
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// Runs `exp.writers` concurrent appenders against a fresh WAL in `dir` (which the
/// WAL creates), then reopens the WAL and checks every acknowledged append came back.
pub fn run_wal(
    exp: &Experiment,
    dir: &Path,
    limits: &RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    assert!(
        (1..=WRITERS_MAX).contains(&exp.writers),
        "writers {} outside 1..={WRITERS_MAX}",
        exp.writers
    );
    let cfg = wal_config(exp, dir, limits)?;
    if exp.io_mode == IoMode::Direct {
        // As for the backends: refuse rather than silently measure buffered I/O.
        std::fs::create_dir_all(dir)
            .map_err(|e| ExperimentError::from_io("create dir", dir, 0, e))?;
        let probe = dir.join("o_direct.probe");
        let created = std::fs::File::create(&probe)
            .map_err(|e| ExperimentError::from_io("create", &probe, 0, e));
        let opened = created.and_then(|_| open_for_appends(&probe, IoMode::Direct, false));
        let _ = std::fs::remove_file(&probe);
        drop(opened?);
    }
    let (exp, dir, limits) = (*exp, dir.to_path_buf(), *limits);
    on_core_thread("cairn-tune-wal", move || wal_appends(exp, cfg, dir, limits))
}

/// Appends of one writer: its shard, how many were acknowledged, their latencies.
struct WriterResult {
    shard: u64,
    acknowledged: u64,
    recorder: Recorder,
}

fn entry_data(shard: u64, index: u64, payload: usize) -> Bytes {
    let mut data = vec![0u8; payload];
    fill_pattern(&mut data, (shard << 40) | index);
    Bytes::from(data)
}

async fn wal_appends(
    exp: Experiment,
    cfg: Config,
    dir: PathBuf,
    limits: RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let direct = exp.io_mode == IoMode::Direct;
    let payload = cfg.max_record_payload_bytes;
    let (wal, _) = Wal::open(cfg.clone())
        .await
        .map_err(|e| open_error(&dir, direct, e))?;
    // The first segment's spare is zero-filled before the clock starts, as
    // the other engines' files are. The spare that follows it is zero-filled
    // during the run, paced to the log: that cost is the WAL's own, and is
    // reported beside the figures.
    wal.settle().await;
    let wal = Rc::new(wal);
    let before = wal.metrics();
    let deadline = Instant::now() + limits.duration;
    let bytes_budget = limits.file_size_bytes;
    let written = Rc::new(RefCell::new(0u64));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..exp.writers {
        let wal = wal.clone();
        let dir = dir.clone();
        let written = written.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let shard = u64::from(w) + 1;
            let mut recorder = Recorder::new();
            let mut index = 0u64;
            while Instant::now() < deadline && *written.borrow() < bytes_budget && !stop_requested()
            {
                let record = Record::Entry {
                    shard,
                    index: index + 1,
                    term: 1,
                    data: entry_data(shard, index + 1, payload),
                };
                *written.borrow_mut() += record.encoded_len() as u64;
                let t0 = Instant::now();
                wal.append(std::slice::from_ref(&record))
                    .await
                    .map_err(|e| append_error(&dir, e))?;
                recorder.record(t0.elapsed());
                index += 1;
            }
            Ok::<_, ExperimentError>(WriterResult {
                shard,
                acknowledged: index,
                recorder,
            })
        }));
    }
    let mut writers = Vec::new();
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(w)) => writers.push(w),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(join) => {
                first_error.get_or_insert(ExperimentError::EngineUnavailable {
                    engine: "cairn-wal",
                    reason: format!("writer task failed: {join}"),
                });
            }
        }
    }
    let elapsed = start.elapsed();
    let after = wal.metrics();
    let flushes = after.flushes - before.flushes;
    let zero_fill_bytes = after.zero_fill_bytes - before.zero_fill_bytes;
    let wal = Rc::try_unwrap(wal)
        .unwrap_or_else(|_| panic!("writer tasks are done, the WAL has one owner"));
    wal.close().await;
    if let Some(e) = first_error {
        return Err(e);
    }
    if stop_requested() {
        return Err(ExperimentError::Interrupted);
    }
    let mut total = Recorder::new();
    for w in &writers {
        total.merge(&w.recorder);
    }
    total.syncs = flushes;
    let verified = verify_wal(cfg, &dir, direct, &writers).await?;
    let appends = total.count();
    let mut measurement = total.finish(elapsed, verified);
    measurement.zero_fill_bytes = zero_fill_bytes;
    Ok((measurement, appends))
}

/// Reopens the WAL (running its recovery) and checks that every acknowledged
/// append of every writer is there with its bytes.
async fn verify_wal(
    cfg: Config,
    dir: &Path,
    direct: bool,
    writers: &[WriterResult],
) -> Result<bool, ExperimentError> {
    let (wal, recovered) = Wal::open(cfg)
        .await
        .map_err(|e| open_error(dir, direct, e))?;
    let mut ok = true;
    for w in writers {
        let entries = recovered
            .shards
            .get(&w.shard)
            .map(|s| s.entries.as_slice())
            .unwrap_or(&[]);
        if (entries.len() as u64) < w.acknowledged {
            tracing::error!(
                shard = w.shard,
                acknowledged = w.acknowledged,
                recovered = entries.len(),
                "acknowledged appends missing after reopen"
            );
            ok = false;
            continue;
        }
        for e in entries.iter().take(w.acknowledged as usize) {
            if !matches_pattern(&e.data, (w.shard << 40) | e.index) {
                tracing::error!(
                    shard = w.shard,
                    index = e.index,
                    "entry bytes differ after reopen"
                );
                ok = false;
                break;
            }
        }
    }
    wal.close().await;
    Ok(ok)
}

//! tokio-uring as an outside reference: its File API (write_at, sync_data,
//! sync_all, open flags) on its own runtime thread. It exposes neither RWF flags nor
//! linked submissions, so those modes are not in its part of the matrix.

use super::raw_uring::uring_unavailable;
use super::RunLimits;
use crate::buf::{fill_pattern, AlignedBuf};
use crate::error::ExperimentError;
use crate::model::{Experiment, IoMode, Measurement, SyncMode};
use crate::safety::stop_requested;
use crate::stats::Recorder;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub fn run(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let (exp, path, limits) = (*exp, path.to_path_buf(), *limits);
    std::thread::Builder::new()
        .name("cairn-tune-tokio-uring".into())
        .spawn(move || {
            let runtime =
                tokio_uring::Runtime::new(&tokio_uring::builder()).map_err(uring_unavailable)?;
            runtime.block_on(appends(exp, path, limits))
        })
        .map_err(|e| ExperimentError::EngineUnavailable {
            engine: "tokio-uring",
            reason: format!("cannot start its thread: {e}"),
        })?
        .join()
        .map_err(|panic| ExperimentError::EngineUnavailable {
            engine: "tokio-uring",
            reason: panic_message(&panic),
        })?
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

async fn appends(
    exp: Experiment,
    path: PathBuf,
    limits: RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let mut flags = 0;
    if exp.io_mode == IoMode::Direct {
        flags |= libc::O_DIRECT;
    }
    if exp.sync_mode == SyncMode::ODsync {
        flags |= libc::O_DSYNC;
    }
    let file = tokio_uring::fs::OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(&path)
        .await
        .map_err(|e| ExperimentError::from_mode_io("open", "O_DIRECT", &path, 0, e))?;
    let bs = exp.block_size_bytes;
    let mut buf = AlignedBuf::zeroed(bs);
    let mut rec = Recorder::new();
    let appends_max = limits.appends_max(&exp);
    let start = Instant::now();
    let mut seq = 0u64;
    let mut outcome = Ok(());
    while seq < appends_max && start.elapsed() < limits.duration {
        if stop_requested() {
            outcome = Err(ExperimentError::Interrupted);
            break;
        }
        fill_pattern(buf.as_mut_slice(), seq);
        let offset = seq * bs as u64;
        let t0 = Instant::now();
        let (res, returned) = file.write_at(buf, offset).submit().await;
        buf = returned;
        match res {
            Ok(n) if n == bs => {}
            Ok(n) => {
                outcome = Err(ExperimentError::short_write(
                    "tokio-uring write_at",
                    &path,
                    offset,
                    n as i64,
                ));
                break;
            }
            Err(e) => {
                outcome = Err(ExperimentError::from_mode_io(
                    "tokio-uring write_at",
                    "O_DIRECT",
                    &path,
                    offset,
                    e,
                ));
                break;
            }
        }
        let synced = match exp.sync_mode {
            SyncMode::Fdatasync => file.sync_data().await,
            SyncMode::Fsync => file.sync_all().await,
            _ => Ok(()),
        };
        if let Err(e) = synced {
            outcome = Err(ExperimentError::from_io(
                "tokio-uring sync",
                &path,
                offset,
                e,
            ));
            break;
        }
        rec.record(t0.elapsed());
        rec.syncs += 1;
        seq += 1;
    }
    let elapsed = start.elapsed();
    // Closing through the runtime lets in-flight state drain before the thread ends.
    let _ = file.close().await;
    outcome.map(|()| (rec.finish(elapsed, true), seq))
}

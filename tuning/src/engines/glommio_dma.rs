//! glommio as an outside reference: its DMA file (always O_DIRECT) for direct I/O
//! and its buffered file otherwise, on a glommio executor thread. Its files expose
//! fdatasync and open flags (O_DSYNC), nothing else.

use super::tokio_uring_file::panic_message;
use super::RunLimits;
use crate::buf::fill_pattern;
use crate::error::ExperimentError;
use crate::model::{Experiment, IoMode, Measurement, SyncMode};
use crate::safety::stop_requested;
use crate::stats::Recorder;
use glommio::{GlommioError, LocalExecutorBuilder, Placement};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// I/O memory glommio registers with its ring: enough for the largest block.
pub const GLOMMIO_IO_MEMORY_BYTES: usize = 4 << 20;

pub fn run(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let (exp, path, limits) = (*exp, path.to_path_buf(), *limits);
    let spawned = std::panic::catch_unwind(move || {
        LocalExecutorBuilder::new(Placement::Unbound)
            .name("cairn-tune-glommio")
            .io_memory(GLOMMIO_IO_MEMORY_BYTES)
            .spawn(move || appends(exp, path, limits))
            .map(|handle| handle.join())
    });
    match spawned {
        Err(panic) => Err(unavailable(panic_message(&panic))),
        Ok(Err(e)) => Err(unavailable(format!("executor did not start: {e}"))),
        Ok(Ok(Err(e))) => Err(unavailable(format!("executor failed: {e}"))),
        Ok(Ok(Ok(result))) => result,
    }
}

fn unavailable(reason: String) -> ExperimentError {
    ExperimentError::EngineUnavailable {
        engine: "glommio",
        reason,
    }
}

fn convert(
    op: &'static str,
    path: &Path,
    offset: u64,
    direct: bool,
    e: GlommioError<()>,
) -> ExperimentError {
    let source = match e {
        GlommioError::IoError(source) | GlommioError::EnhancedIoError { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    };
    if direct {
        ExperimentError::from_mode_io(op, "O_DIRECT", path, offset, source)
    } else {
        ExperimentError::from_io(op, path, offset, source)
    }
}

async fn appends(
    exp: Experiment,
    path: PathBuf,
    limits: RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let direct = exp.io_mode == IoMode::Direct;
    let mut options = glommio::io::OpenOptions::new();
    options.write(true);
    if exp.sync_mode == SyncMode::ODsync {
        options.custom_flags(libc::O_DSYNC);
    }
    let bs = exp.block_size_bytes;
    let appends_max = limits.appends_max(&exp);
    let mut rec = Recorder::new();
    let start = Instant::now();
    let mut seq = 0u64;
    let per_append_sync = exp.sync_mode == SyncMode::Fdatasync;
    if direct {
        let file = options
            .dma_open(&path)
            .await
            .map_err(|e| convert("glommio dma_open", &path, 0, true, e))?;
        while seq < appends_max && start.elapsed() < limits.duration {
            if stop_requested() {
                let _ = file.close().await;
                return Err(ExperimentError::Interrupted);
            }
            let offset = seq * bs as u64;
            let mut buf = file.alloc_dma_buffer(bs);
            fill_pattern(buf.as_bytes_mut(), seq);
            let t0 = Instant::now();
            let synced = match full_write(file.write_at(buf, offset).await, bs) {
                Ok(()) if per_append_sync => file.fdatasync().await,
                other => other,
            };
            if let Err(e) = synced {
                let _ = file.close().await;
                return Err(convert(
                    "glommio write_at/fdatasync",
                    &path,
                    offset,
                    true,
                    e,
                ));
            }
            rec.record(t0.elapsed());
            rec.syncs += 1;
            seq += 1;
        }
        let _ = file.close().await;
    } else {
        let file = options
            .buffered_open(&path)
            .await
            .map_err(|e| convert("glommio buffered_open", &path, 0, false, e))?;
        while seq < appends_max && start.elapsed() < limits.duration {
            if stop_requested() {
                let _ = file.close().await;
                return Err(ExperimentError::Interrupted);
            }
            let offset = seq * bs as u64;
            let mut data = vec![0u8; bs];
            fill_pattern(&mut data, seq);
            let t0 = Instant::now();
            let synced = match full_write(file.write_at(data, offset).await, bs) {
                Ok(()) if per_append_sync => file.fdatasync().await,
                other => other,
            };
            if let Err(e) = synced {
                let _ = file.close().await;
                return Err(convert(
                    "glommio write_at/fdatasync",
                    &path,
                    offset,
                    false,
                    e,
                ));
            }
            rec.record(t0.elapsed());
            rec.syncs += 1;
            seq += 1;
        }
        let _ = file.close().await;
    }
    Ok((rec.finish(start.elapsed(), true), seq))
}

/// A write's outcome, with a write shorter than `bs` bytes as an error.
fn full_write(written: glommio::Result<usize, ()>, bs: usize) -> glommio::Result<(), ()> {
    match written {
        Ok(n) if n == bs => Ok(()),
        Ok(n) => Err(GlommioError::IoError(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            format!("short write of {n} bytes"),
        ))),
        Err(e) => Err(e),
    }
}

//! The lab's own blocking engine: one thread, pwrite (or pwritev2 with RWF_DSYNC)
//! and fdatasync/fsync. It is the floor under Cairn's sync backend: no framing, no
//! CRC, no batching.

use super::{open_for_appends, RunLimits};
use crate::buf::{fill_pattern, AlignedBuf};
use crate::error::ExperimentError;
use crate::model::{Experiment, Measurement, SyncMode};
use crate::safety::stop_requested;
use crate::stats::Recorder;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

/// Runs `exp` against the prepared file at `path`; returns the latencies and the
/// number of appends made (for the read-back check).
pub fn run(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    let file = open_for_appends(path, exp.io_mode, exp.sync_mode == SyncMode::ODsync)?;
    let mut buf = AlignedBuf::zeroed(exp.block_size_bytes);
    let mut rec = Recorder::new();
    let appends_max = limits.appends_max(exp);
    let start = Instant::now();
    let mut seq = 0u64;
    while seq < appends_max && start.elapsed() < limits.duration {
        if stop_requested() {
            return Err(ExperimentError::Interrupted);
        }
        fill_pattern(buf.as_mut_slice(), seq);
        let offset = seq * exp.block_size_bytes as u64;
        let t0 = Instant::now();
        durable_write(&file, path, exp, buf.as_slice(), offset)?;
        rec.record(t0.elapsed());
        rec.syncs += 1;
        seq += 1;
    }
    Ok((rec.finish(start.elapsed(), true), seq))
}

/// Writes `data` at `offset` and makes it durable as `exp.sync_mode` says.
pub fn durable_write(
    file: &File,
    path: &Path,
    exp: &Experiment,
    data: &[u8],
    offset: u64,
) -> Result<(), ExperimentError> {
    let mode_err = |op, e| {
        if exp.io_mode == crate::model::IoMode::Direct {
            ExperimentError::from_mode_io(op, "O_DIRECT", path, offset, e)
        } else {
            ExperimentError::from_io(op, path, offset, e)
        }
    };
    match exp.sync_mode {
        SyncMode::Fdatasync | SyncMode::Fsync | SyncMode::ODsync => {
            file.write_all_at(data, offset)
                .map_err(|e| mode_err("pwrite", e))?;
        }
        SyncMode::RwfDsync => {
            let iov = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            // SAFETY: iov points at `data`, which stays borrowed (alive, unmoved)
            // for the whole blocking call; the kernel only reads from it.
            let n = unsafe {
                libc::pwritev2(
                    file.as_raw_fd(),
                    &iov,
                    1,
                    offset as libc::off_t,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    return Err(ExperimentError::Unsupported {
                        what: "RWF_DSYNC".into(),
                        reason: format!("pwritev2 on {} returned EOPNOTSUPP", path.display()),
                    });
                }
                return Err(mode_err("pwritev2(RWF_DSYNC)", e));
            }
            if n as usize != data.len() {
                return Err(ExperimentError::short_write(
                    "pwritev2(RWF_DSYNC)",
                    path,
                    offset,
                    n as i64,
                ));
            }
        }
        SyncMode::Linked => {
            return Err(ExperimentError::Unsupported {
                what: "linked write-then-sync".into(),
                reason: "needs io_uring; the pwrite engine issues one syscall at a time".into(),
            })
        }
    }
    match exp.sync_mode {
        SyncMode::Fdatasync => file
            .sync_data()
            .map_err(|e| ExperimentError::from_io("fdatasync", path, offset, e)),
        SyncMode::Fsync => file
            .sync_all()
            .map_err(|e| ExperimentError::from_io("fsync", path, offset, e)),
        _ => Ok(()),
    }
}

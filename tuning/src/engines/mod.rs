//! The engines that perform durable appends, and what they share: preparing the
//! file, opening it in the experiment's mode, and checking what landed on disk.

pub mod glommio_dma;
pub mod raw_pwrite;
pub mod raw_uring;
pub mod tokio_uring_file;
pub mod wal;

use crate::buf::{matches_pattern, AlignedBuf};
use crate::error::ExperimentError;
use crate::model::{Experiment, IoMode, Prealloc};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// Chunk used to zero-fill a file: large enough to stream, small enough to keep in memory.
pub const ZERO_FILL_CHUNK_BYTES: usize = 1 << 20;
/// Most trailing blocks the read-back check compares (keeps the check quick).
pub const VERIFY_BLOCKS_MAX: u64 = 8192;

/// How long and how far one experiment runs.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// Wall-clock budget of the measured phase.
    pub duration: Duration,
    /// Size of the experiment's file: appends stop at its end (no wrap-around, so
    /// "no preallocation" really is an append that grows the file).
    pub file_size_bytes: u64,
}

impl RunLimits {
    /// How many appends of this experiment fit in the file.
    pub fn appends_max(&self, exp: &Experiment) -> u64 {
        self.file_size_bytes / exp.block_size_bytes as u64
    }
}

/// Creates the experiment file and prepares it as `prealloc` says.
pub fn prepare_file(
    path: &Path,
    prealloc: Prealloc,
    size_bytes: u64,
) -> Result<(), ExperimentError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| ExperimentError::from_io("create", path, 0, e))?;
    match prealloc {
        Prealloc::None => {}
        Prealloc::Fallocate => {
            // SAFETY: fallocate on a file descriptor we own, no memory is passed.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                return Err(ExperimentError::from_io("fallocate", path, 0, e));
            }
        }
        Prealloc::ZeroFill => {
            let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES];
            let mut offset = 0u64;
            while offset < size_bytes {
                let n = (size_bytes - offset).min(ZERO_FILL_CHUNK_BYTES as u64) as usize;
                file.write_all_at(&zeros[..n], offset)
                    .map_err(|e| ExperimentError::from_io("zero-fill", path, offset, e))?;
                offset += n as u64;
            }
        }
    }
    file.sync_all()
        .map_err(|e| ExperimentError::from_io("fsync after preparing", path, 0, e))?;
    Ok(())
}

/// Opens the prepared file for the appends, with O_DIRECT and O_DSYNC as asked.
/// A filesystem refusing O_DIRECT (tmpfs) makes the experiment "unsupported".
pub fn open_for_appends(
    path: &Path,
    io_mode: IoMode,
    o_dsync: bool,
) -> Result<File, ExperimentError> {
    let mut flags = 0;
    if io_mode == IoMode::Direct {
        flags |= libc::O_DIRECT;
    }
    if o_dsync {
        flags |= libc::O_DSYNC;
    }
    OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            if io_mode == IoMode::Direct {
                ExperimentError::from_mode_io("open", "O_DIRECT", path, 0, e)
            } else {
                ExperimentError::from_io("open", path, 0, e)
            }
        })
}

/// Reads back the last appends (at most [`VERIFY_BLOCKS_MAX`]) and checks that each
/// block holds the pattern of the append written there.
pub fn verify(path: &Path, block_size_bytes: usize, appends: u64) -> Result<bool, ExperimentError> {
    verify_ring(path, block_size_bytes, appends, u64::MAX)
}

/// [`verify`] for a file written round and round: append `seq` lies at
/// `seq * block_size_bytes` modulo `ring_bytes`, and only the last lap can be
/// read back.
pub fn verify_ring(
    path: &Path,
    block_size_bytes: usize,
    appends: u64,
    ring_bytes: u64,
) -> Result<bool, ExperimentError> {
    let file =
        File::open(path).map_err(|e| ExperimentError::from_io("open for read-back", path, 0, e))?;
    let mut block = AlignedBuf::zeroed(block_size_bytes);
    let lap = ring_bytes / block_size_bytes as u64;
    let first = appends.saturating_sub(VERIFY_BLOCKS_MAX.min(lap));
    for seq in first..appends {
        let offset = seq * block_size_bytes as u64 % ring_bytes;
        file.read_exact_at(block.as_mut_slice(), offset)
            .map_err(|e| ExperimentError::from_io("read-back", path, offset, e))?;
        if !matches_pattern(block.as_slice(), seq) {
            tracing::error!(path = %path.display(), offset, seq, "read-back mismatch");
            return Ok(false);
        }
    }
    Ok(true)
}

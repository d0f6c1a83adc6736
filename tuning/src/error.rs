//! Errors of one experiment, and how they map onto an [`Outcome`].

use crate::model::Outcome;
use std::io;
use std::path::{Path, PathBuf};

/// Why one experiment did not produce a measurement.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("{what} is not supported here: {reason}")]
    Unsupported { what: String, reason: String },
    #[error("no space left on the device writing {} at offset {offset}", path.display())]
    NoSpace { path: PathBuf, offset: u64 },
    #[error("{op} failed on {} at offset {offset}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("engine {engine} could not run: {reason}")]
    EngineUnavailable {
        engine: &'static str,
        reason: String,
    },
    #[error("interrupted")]
    Interrupted,
}

impl ExperimentError {
    /// A write that wrote only `written` bytes of what it was given.
    pub fn short_write(op: &'static str, path: &Path, offset: u64, written: i64) -> Self {
        ExperimentError::Io {
            op,
            path: path.to_path_buf(),
            offset,
            source: io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write of {written} bytes"),
            ),
        }
    }

    /// Classifies an I/O error: ENOSPC is a full disk, EINVAL/EOPNOTSUPP on a mode
    /// flag is an unsupported mode, anything else an I/O failure.
    pub fn from_io(op: &'static str, path: &Path, offset: u64, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ExperimentError::NoSpace {
                path: path.to_path_buf(),
                offset,
            },
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => ExperimentError::Unsupported {
                what: op.to_string(),
                reason: format!("{} ({})", source, path.display()),
            },
            Some(libc::EINTR) if crate::safety::stop_requested() => ExperimentError::Interrupted,
            _ => ExperimentError::Io {
                op,
                path: path.to_path_buf(),
                offset,
                source,
            },
        }
    }

    /// Like [`ExperimentError::from_io`], for a step that only fails when a mode
    /// flag (O_DIRECT, RWF_DSYNC, ...) is refused: EINVAL means "unsupported here".
    pub fn from_mode_io(
        op: &'static str,
        mode: &str,
        path: &Path,
        offset: u64,
        source: io::Error,
    ) -> Self {
        if source.raw_os_error() == Some(libc::EINVAL) {
            return ExperimentError::Unsupported {
                what: mode.to_string(),
                reason: format!("{op} on {} returned EINVAL", path.display()),
            };
        }
        Self::from_io(op, path, offset, source)
    }

    pub fn into_outcome(self) -> Outcome {
        match self {
            ExperimentError::Unsupported { .. } | ExperimentError::EngineUnavailable { .. } => {
                Outcome::Unsupported {
                    reason: self.to_string(),
                }
            }
            ExperimentError::NoSpace { .. } => Outcome::NoSpace {
                reason: self.to_string(),
            },
            ExperimentError::Interrupted => Outcome::Interrupted,
            ExperimentError::Io { .. } => Outcome::Failed {
                reason: self.to_string(),
            },
        }
    }
}

/// Why the lab refuses to run at all.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("directory {} does not exist", path.display())]
    DirMissing { path: PathBuf },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("directory {} is not writable: {source}", path.display())]
    DirNotWritable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot inspect {}: {source}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing the report {}: {source}", path.display())]
    Report {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("interrupted")]
    Interrupted,
}

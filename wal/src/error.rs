//! Error enums, one per operation family.

use std::io;
use std::path::PathBuf;

use crate::config::ConfigError;
use crate::record::ShardId;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("wal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// Damage before the tail of the log: nothing is dropped, the open stops.
    #[error("wal {file} at offset {offset}: {reason}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("wal segment {expected_seq:016x} is missing: {before} is followed by {after}")]
    MissingSegment {
        expected_seq: u64,
        before: PathBuf,
        after: PathBuf,
    },
    #[error("wal {dir} is locked: another process (or an earlier open in this one) has it open")]
    Locked { dir: PathBuf },
    #[error("wal {dir}: io_uring backend requested but unavailable: {reason}")]
    UringUnavailable { dir: PathBuf, reason: String },
}

/// Why a write or sync failed; once set, the WAL refuses appends until reopened.
#[derive(Debug, Clone)]
pub struct Poison {
    pub file: PathBuf,
    pub offset: u64,
    pub errno: Option<i32>,
    pub message: String,
}

#[derive(Debug, thiserror::Error, Clone)]
#[non_exhaustive]
pub enum AppendError {
    #[error(
        "wal disk full writing {file} at offset {offset}; the log refuses appends until reopened"
    )]
    NoSpace { file: PathBuf, offset: u64 },
    #[error("wal failed writing {file} at offset {offset}: {cause}; the log refuses appends until reopened")]
    Poisoned {
        file: PathBuf,
        offset: u64,
        cause: String,
    },
    #[error("wal record for shard {shard} has a {bytes}-byte payload; the limit is {max_bytes}")]
    RecordTooLarge {
        shard: ShardId,
        bytes: usize,
        max_bytes: usize,
    },
    #[error("wal already holds {max_shards} shards; shard {shard} cannot be added")]
    TooManyShards { shard: ShardId, max_shards: usize },
    #[error("wal is closed")]
    Closed,
}

impl From<&Poison> for AppendError {
    fn from(p: &Poison) -> AppendError {
        if p.errno == Some(libc::ENOSPC) {
            AppendError::NoSpace {
                file: p.file.clone(),
                offset: p.offset,
            }
        } else {
            AppendError::Poisoned {
                file: p.file.clone(),
                offset: p.offset,
                cause: p.message.clone(),
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("shard {shard}: entry {index} was released; the log starts at {first_index}")]
    Compacted {
        shard: ShardId,
        index: u64,
        first_index: u64,
    },
    #[error("shard {shard}: entry {index} is beyond the last index {last_index}")]
    Unavailable {
        shard: ShardId,
        index: u64,
        last_index: u64,
    },
    #[error("wal read of {file} at offset {offset}: {source}")]
    Io {
        file: PathBuf,
        offset: u64,
        source: io::Error,
    },
    #[error("wal {file} at offset {offset}: {reason}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
}

//! Errors, one enum per operation family. Messages for etcd's error conditions
//! are etcd's own, so the server can hand them to clients unchanged.

use std::io;

use crate::page::CorruptPage;

/// etcd's message for a read or compaction below the compaction revision.
pub const COMPACTED_MSG: &str = "mvcc: required revision has been compacted";
/// etcd's message for a read or compaction past the current revision.
pub const FUTURE_REV_MSG: &str = "mvcc: required revision is a future revision";

/// Why an I/O error happened, for messages that say what the store was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Open,
    Lock,
    Read,
    Write,
    Grow,
    Shrink,
    Sync,
    Map,
}

/// An I/O failure on the store file. ENOSPC is told apart as [`StorageError::NoSpace`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    #[error("{file}: no space left on device during {op:?} at offset {offset}")]
    NoSpace { file: String, op: IoOp, offset: u64 },
    #[error("{file}: {op:?} at offset {offset} failed: {source}")]
    Io {
        file: String,
        op: IoOp,
        offset: u64,
        #[source]
        source: io::Error,
    },
}

impl StorageError {
    pub(crate) fn new(file: &str, op: IoOp, offset: u64, source: io::Error) -> StorageError {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            StorageError::NoSpace {
                file: file.to_string(),
                op,
                offset,
            }
        } else {
            StorageError::Io {
                file: file.to_string(),
                op,
                offset,
                source,
            }
        }
    }

    pub fn is_no_space(&self) -> bool {
        matches!(self, StorageError::NoSpace { .. })
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("invalid config: {0}")]
    Config(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{file}: locked by another process (or already open in this one)")]
    Locked { file: String },
    #[error("{file}: both meta pages are bad: page 0: {first}; page 1: {second}")]
    NoValidMeta {
        file: String,
        first: String,
        second: String,
    },
    #[error("{file}: shorter than its two meta pages ({len_bytes} bytes)")]
    Truncated { file: String, len_bytes: u64 },
    #[error(transparent)]
    Corrupt(#[from] CorruptPage),
    #[error("{file}: record {main}.{sub} is malformed: {what}")]
    BadRecord {
        file: String,
        main: i64,
        sub: i64,
        what: &'static str,
    },
    #[error("{file}: an interrupted snapshot restore left this file; restore again")]
    IncompleteRestore { file: String },
}

/// Errors of reads: ranges, hashes, events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("mvcc: required revision has been compacted")]
    Compacted {
        revision: i64,
        compact_revision: i64,
    },
    #[error("mvcc: required revision is a future revision")]
    FutureRevision {
        revision: i64,
        current_revision: i64,
    },
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error(transparent)]
    Corrupt(#[from] CorruptPage),
    #[error("{file}: revision {main}.{sub} is in the key index but not in the revision tree")]
    MissingRevision { file: String, main: i64, sub: i64 },
    #[error("range sorted by {0} cannot be streamed in chunks; use a plain range")]
    NotStreamable(&'static str),
    #[error("a txn with puts, deletes or nested txns is applied, not read")]
    NotReadOnly,
}

/// Errors of applying one write. Request errors (compacted, key not found...)
/// leave the store unchanged and still count the entry as applied; `Poisoned`,
/// `StaleIndex`, `StaleRevision` and `BatchFull` refuse the entry before
/// touching anything; the others poison the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    #[error("mvcc: required revision has been compacted")]
    Compacted {
        revision: i64,
        compact_revision: i64,
    },
    #[error("mvcc: required revision is a future revision")]
    FutureRevision {
        revision: i64,
        current_revision: i64,
    },
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("lease not found")]
    LeaseNotFound { id: i64 },
    #[error("lease already exists")]
    LeaseExists { id: i64 },
    #[error("etcdserver: lease ID must be non-zero")]
    LeaseIdZero,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: request is too large")]
    RequestTooLarge { bytes: usize, max: usize },
    #[error("entry {index} is not after the applied index {applied}")]
    StaleIndex { index: u64, applied: u64 },
    /// `Store::apply_at` was given a revision the store has already reached:
    /// the entry is refused untouched and the store stays usable.
    #[error(
        "{file}: entry revision {revision} is not after the store's revision {current_revision}"
    )]
    StaleRevision {
        file: String,
        revision: i64,
        current_revision: i64,
    },
    #[error("the write batch is full ({bytes} bytes); commit before applying more")]
    BatchFull { bytes: usize },
    #[error("{file}: store is poisoned by an earlier write or sync failure; reopen it")]
    Poisoned { file: String },
    #[error(transparent)]
    Read(ReadError),
}

impl ApplyError {
    /// Whether the error is an answer to the request (the store stays usable).
    pub fn is_request_error(&self) -> bool {
        !matches!(
            self,
            ApplyError::Poisoned { .. }
                | ApplyError::Read(_)
                | ApplyError::BatchFull { .. }
                | ApplyError::StaleIndex { .. }
                | ApplyError::StaleRevision { .. }
        )
    }
}

impl From<ReadError> for ApplyError {
    fn from(e: ReadError) -> ApplyError {
        match e {
            ReadError::Compacted {
                revision,
                compact_revision,
            } => ApplyError::Compacted {
                revision,
                compact_revision,
            },
            ReadError::FutureRevision {
                revision,
                current_revision,
            } => ApplyError::FutureRevision {
                revision,
                current_revision,
            },
            ReadError::EmptyKey => ApplyError::EmptyKey,
            other => ApplyError::Read(other),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    #[error("{file}: store is poisoned by an earlier write or sync failure; reopen it")]
    Poisoned { file: String },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Corrupt(#[from] CorruptPage),
}

impl CommitError {
    pub fn is_no_space(&self) -> bool {
        matches!(self, CommitError::Storage(s) if s.is_no_space())
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("snapshot chunk {seq}: {what}")]
    BadChunk { seq: u64, what: String },
    #[error("snapshot stream ended before its end chunk (after {chunks} chunks)")]
    Incomplete { chunks: u64 },
    #[error("restore target {file} is not empty")]
    TargetNotEmpty { file: String },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Commit(#[from] CommitError),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DefragError {
    #[error(transparent)]
    Commit(#[from] CommitError),
}

/// Any error of the store, for callers that do not tell families apart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Defrag(#[from] DefragError),
}

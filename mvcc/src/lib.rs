//! Cairn's MVCC store: an in-memory key index over a revision-keyed
//! copy-on-write B+tree on mmapped pages, with etcd's semantics.
//!
//! One [`Store`] holds one shard's keyspace in one file. The server applies
//! committed Raft entries with [`Store::apply`] (each write at the revision
//! after the store's, as etcd does) or [`Store::apply_at`] (each entry at the
//! revision it carries, so a shard of a keyspace with one revision counter
//! holds sparse revisions yet reads, compacts and hashes at any revision it
//! has reached), and makes a batch of them durable with [`Store::commit`],
//! which also records the last applied Raft index and the reached revision.
//! Beside its entries the shard driver keeps pending cross-shard txn records
//! ([`Store::put_txn_record`]): changes of the same batch, durable with it.
//! Reads see every applied entry; [`Store::snapshot`] gives a consistent view
//! that never blocks the writer. The store knows nothing of Raft, gRPC or
//! protobufs: its request and response types mirror etcd's.
//!
//! The file format is described in `mvcc/FORMAT.md`.

mod btree;
pub mod error;
pub mod fault;
mod hash_stream;
mod index;
pub mod page;
mod pager;
mod range_stream;
mod record;
mod snapshot;
pub mod storage;
mod store;
mod syncer;
pub mod types;
mod view;

pub use error::{
    ApplyError, CommitError, DefragError, Error, IoOp, OpenError, ReadError, SnapshotError,
    StorageError, COMPACTED_MSG, FUTURE_REV_MSG,
};
pub use hash_stream::HashKvStream;
pub use page::{CorruptPage, PageFault, PAGE_SIZE_BYTES};
pub use range_stream::RangeStream;
pub use snapshot::{Restored, Snapshot, SnapshotStream};
pub use storage::{CrashMode, FileStorage, MemStorage, Storage, SyncHandle};
pub use store::changes::Change;
pub use store::{
    CommitStats, Config, DefragProgress, DefragReport, DefragRun, DirLock, Step, Store,
    MAX_REQUEST_BYTES_LIMIT, MAX_TXN_RECORD_BYTES,
};
pub use types::*;
pub use view::compare_absent;

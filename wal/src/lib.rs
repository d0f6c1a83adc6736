//! Cairn's write-ahead log: one log per core, shared by the shards (Raft
//! groups) on that core, so one data sync makes every shard's appends durable.
//!
//! # Shape
//! - [`Wal::open`] recovers the log (per shard: last hard state and live
//!   entries, see [`Recovered`]) and spawns a flush task and a maintenance task
//!   on the current `LocalSet`. The WAL is `!Send`; it lives on its core.
//! - [`Wal::append`] encodes records into the batch being formed and resolves
//!   once they are durable. While one flush (one write + one data sync) is in
//!   flight, the next batch forms from every concurrent caller: group commit.
//! - [`Wal::entries`] serves a shard's index range from the in-memory tail cache
//!   or from the segments; [`Wal::release`] lets segments go once every shard in
//!   them has moved past (applied and snapshotted); released segments are
//!   recycled as spares.
//! - A failed write or sync poisons the log: later appends fail with
//!   [`AppendError::Poisoned`] (or [`AppendError::NoSpace`] for ENOSPC) until
//!   it is reopened, which re-runs recovery.
//! - [`Wal::metrics`] and [`Wal::set_flush_observer`] expose flush latency and
//!   batch-size histograms and counters.
//!
//! The byte layout, invariants and crash cases are in `wal/FORMAT.md`.
//!
//! ```no_run
//! use bytes::Bytes;
//! use cairn_wal::{Config, HardState, Record, Wal};
//!
//! # async fn core_main() -> Result<(), Box<dyn std::error::Error>> {
//! // Inside the core's current-thread runtime + LocalSet:
//! let (wal, recovered) = Wal::open(Config::new("/var/lib/cairn/wal/core-0")).await?;
//! for (shard, state) in &recovered.shards {
//!     // Rebuild each shard's Raft log from state.hard_state and state.entries.
//!     let _ = (shard, state);
//! }
//! let lsn = wal
//!     .append(&[
//!         Record::Entry { shard: 7, index: 1, term: 1, data: Bytes::from_static(b"put") },
//!         Record::HardState { shard: 7, state: HardState { term: 1, vote: 1, commit: 0 } },
//!     ])
//!     .await?; // resolves once durable
//! assert!(wal.durable_lsn() >= lsn);
//! let entries = wal.entries(7, 1, 2).await?;
//! wal.release(7, 1); // applied and snapshotted through index 1
//! # let _ = entries;
//! wal.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Back of the envelope
//! On the reference VM a 4 KiB O_DIRECT write plus fdatasync costs about
//! 100 µs, so one writer tops out near 10k durable appends/s. A flush of
//! 64 × 256-byte records is ~20 KiB, barely more expensive than one block, so
//! group commit should multiply throughput by roughly the batch size until the
//! CPU (encoding, CRC at ~10 GB/s, task wake-ups of a few µs) becomes the limit.
//!
//! # I/O backends and their knobs
//! All file I/O goes through the [`Storage`] / [`StorageFile`] traits.
//! - [`UringStorage`] on a per-core [`Uring`] (created with [`Uring::new`] or
//!   shared per thread by [`Uring::for_this_core`]). [`UringOptions`] selects:
//!   - `direct`: [`DirectIo::Auto`] (O_DIRECT where the filesystem accepts it),
//!     `On` (fail where refused) or `Off` (buffered);
//!   - `sync_mode`: [`SyncMode::Fdatasync`] (write, then fdatasync: two
//!     submissions), [`SyncMode::LinkedFdatasync`] (write linked to fdatasync in
//!     one submission, the default) or [`SyncMode::RwfDsync`] (one RWF_DSYNC write);
//!   - `ring_entries`: submission-queue depth.
//! - [`SyncStorage`]: pwrite + fdatasync; [`SyncOptions`] chooses the blocking
//!   pool or inline calls, and O_DIRECT.
//! - [`crash::CrashStorage`]: in memory, with live and durable images, crashes
//!   at the N-th sync and injected errors, for tests.
//!
//! [`BackendChoice::Auto`] picks io_uring when the kernel offers and allows it
//! and logs one line naming the backend and the reason. The tuning lab can open
//! a [`UringFile`] directly and time `write_durable` under each mode.

mod buf;
mod config;
pub mod crash;
mod error;
pub mod fault;
mod record;
mod storage;
mod uring;
mod wal;

pub use buf::{AlignedBuf, BLOCK_BYTES};
pub use config::{
    BackendChoice, Config, ConfigError, DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_RECORD_PAYLOAD_BYTES, DEFAULT_SEGMENT_SIZE_BYTES, MIN_SEGMENT_SIZE_BYTES,
};
pub use error::{AppendError, OpenError, Poison, ReadError};
pub use record::{
    lone_record_payload_bytes, Entry, HardState, Lsn, Record, ShardId, RECORD_ALIGN_BYTES,
    RECORD_HEADER_BYTES, SEGMENT_DATA_OFFSET,
};
pub use storage::{IoFuture, Storage, StorageFile, SyncOptions, SyncStorage};
pub use uring::{
    DirectIo, SyncMode, Uring, UringFile, UringOptions, UringStorage, DEFAULT_RING_ENTRIES,
};
pub use wal::{
    segment_name, select_storage, DurableWatch, FlushEvent, FlushObserver, Recovered,
    RecoveredShard, Wal, WalMetrics, LOCK_FILE_NAME,
};

//! WAL settings and their limits.

use std::path::PathBuf;

use crate::buf::BLOCK_BYTES;
use crate::record::{
    encoded_len, map_bytes, BATCH_RECORD_BYTES, HARD_STATE_BYTES, RECORD_HEADER_BYTES,
    SECTOR_BYTES, SEGMENT_DATA_OFFSET,
};
use crate::storage::SyncOptions;
use crate::uring::UringOptions;

pub const DEFAULT_SEGMENT_SIZE_BYTES: u64 = 64 << 20;
/// Smallest segment accepted: header block plus a few data blocks (tests use small ones).
pub const MIN_SEGMENT_SIZE_BYTES: u64 = 16 * BLOCK_BYTES as u64;
/// Largest payload of one record. etcd caps requests at 1.5 MiB; an entry
/// carries a request plus a small envelope.
pub const DEFAULT_MAX_RECORD_PAYLOAD_BYTES: usize = 2 << 20;
/// Largest single flush (one write + one data sync).
pub const DEFAULT_MAX_BATCH_BYTES: usize = 4 << 20;
/// Bytes accepted but not yet durable before appends wait (backpressure).
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 32 << 20;
pub const DEFAULT_TAIL_CACHE_BYTES: usize = 64 << 20;
pub const DEFAULT_SPARE_SEGMENTS: usize = 1;
pub const DEFAULT_MAX_SPARE_SEGMENTS: usize = 4;
pub const DEFAULT_MAX_SHARDS: usize = 1024;
/// Zero-filling writes go out in chunks of this size. Beside a busy log one
/// goes out per chunk of log, and the append whose flush meets it waits for
/// it: with one writer of 4 KiB appends, 256 KiB chunks (one per 64 appends)
/// left its p99 at about 290 µs where 1 MiB chunks gave about 520 µs, and
/// its rate no lower (`wal/BENCHMARKS.md`).
pub const DEFAULT_ZERO_CHUNK_BYTES: usize = 256 << 10;
/// Reads of cold entries are coalesced up to this size per I/O.
pub const MAX_READ_BYTES: usize = 4 << 20;

/// Room a batch of at most `max_batch_bytes` may need to close on a block
/// boundary: the pad's header and zero-sector map, spilling into one more block.
pub(crate) const fn pad_reserve_bytes(max_batch_bytes: usize) -> usize {
    RECORD_HEADER_BYTES + map_bytes(max_batch_bytes / SECTOR_BYTES) + BLOCK_BYTES
}

/// Room a segment must keep after a record: a seal and the pad closing its
/// batch, and one more block, so that recovery can always seal the tail in a
/// batch of its own after the last whole batch.
pub(crate) const fn seal_reserve_bytes(max_batch_bytes: usize) -> usize {
    RECORD_HEADER_BYTES + pad_reserve_bytes(max_batch_bytes) + BLOCK_BYTES
}

const _: () = assert!(
    DEFAULT_MAX_BATCH_BYTES
        >= BATCH_RECORD_BYTES
            + encoded_len(DEFAULT_MAX_RECORD_PAYLOAD_BYTES)
            + pad_reserve_bytes(DEFAULT_MAX_BATCH_BYTES)
);
const _: () = assert!(DEFAULT_SEGMENT_SIZE_BYTES >= MIN_SEGMENT_SIZE_BYTES);
const _: () = assert!(MAX_READ_BYTES >= encoded_len(DEFAULT_MAX_RECORD_PAYLOAD_BYTES));
const _: () = assert!(DEFAULT_ZERO_CHUNK_BYTES.is_multiple_of(BLOCK_BYTES));

/// Which I/O backend the WAL uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring when the kernel offers and allows it, else the sync backend;
    /// one log line says which and why.
    #[default]
    Auto,
    /// Like `Auto`, with the options each backend runs with.
    UringOr(UringOptions, SyncOptions),
    Uring(UringOptions),
    Sync(SyncOptions),
}

#[derive(Debug, Clone)]
pub struct Config {
    pub dir: PathBuf,
    pub backend: BackendChoice,
    pub segment_size_bytes: u64,
    /// Zero-filled segments kept ready ahead of need.
    pub spare_segments: usize,
    /// Released segments kept for reuse; beyond this they are deleted.
    pub max_spare_segments: usize,
    pub max_record_payload_bytes: usize,
    pub max_batch_bytes: usize,
    pub max_queued_bytes: usize,
    /// Recent entry payloads kept in memory for `entries`.
    pub tail_cache_bytes: usize,
    /// Distinct shards one WAL accepts (each costs a hard-state record per segment).
    pub max_shards: usize,
    /// Size of one zero-filling write of a spare. Spares are zero-filled
    /// while the log is idle, or paced to the log's progress when it is busy.
    pub zero_chunk_bytes: usize,
    /// Test-only: writes and syncs obey this control file
    /// ([`crate::fault`]); None for every real use.
    pub disk_faults: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("wal config: {field} = {value}: {why}")]
    Invalid {
        field: &'static str,
        value: u64,
        why: String,
    },
}

impl Config {
    pub fn new(dir: impl Into<PathBuf>) -> Config {
        Config {
            dir: dir.into(),
            backend: BackendChoice::Auto,
            segment_size_bytes: DEFAULT_SEGMENT_SIZE_BYTES,
            spare_segments: DEFAULT_SPARE_SEGMENTS,
            max_spare_segments: DEFAULT_MAX_SPARE_SEGMENTS,
            max_record_payload_bytes: DEFAULT_MAX_RECORD_PAYLOAD_BYTES,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            tail_cache_bytes: DEFAULT_TAIL_CACHE_BYTES,
            max_shards: DEFAULT_MAX_SHARDS,
            zero_chunk_bytes: DEFAULT_ZERO_CHUNK_BYTES,
            disk_faults: None,
        }
    }

    /// Bytes a fresh segment spends before its first appended record:
    /// the header block, a batch record and one hard-state record per shard.
    pub(crate) fn segment_overhead_bytes(&self) -> u64 {
        (SEGMENT_DATA_OFFSET + BATCH_RECORD_BYTES + self.max_shards * encoded_len(HARD_STATE_BYTES))
            as u64
    }

    /// See [`pad_reserve_bytes`].
    pub(crate) fn pad_reserve_bytes(&self) -> usize {
        pad_reserve_bytes(self.max_batch_bytes)
    }

    /// See [`seal_reserve_bytes`].
    pub(crate) fn seal_reserve_bytes(&self) -> usize {
        seal_reserve_bytes(self.max_batch_bytes)
    }

    /// How far a spare's zero-fill keeps ahead of the log once it has to
    /// keep pace (`wal/src/wal/pacing.rs`): a largest flush, which can move
    /// the log that far between two checks, and two zero chunks, the one in
    /// flight and the time of the spare's closing sync.
    pub fn zero_fill_lead_bytes(&self) -> u64 {
        (self.max_batch_bytes + 2 * self.zero_chunk_bytes) as u64
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, value: u64, why: String| Err(ConfigError::Invalid { field, value, why });
        let block = BLOCK_BYTES as u64;
        if self.segment_size_bytes < MIN_SEGMENT_SIZE_BYTES
            || !self.segment_size_bytes.is_multiple_of(block)
        {
            return bad(
                "segment_size_bytes",
                self.segment_size_bytes,
                format!("must be a multiple of {block} and at least {MIN_SEGMENT_SIZE_BYTES}"),
            );
        }
        if self.max_record_payload_bytes == 0
            || self.max_record_payload_bytes > u32::MAX as usize / 2
        {
            return bad(
                "max_record_payload_bytes",
                self.max_record_payload_bytes as u64,
                "must be between 1 and 2^31".into(),
            );
        }
        let record = encoded_len(self.max_record_payload_bytes) as u64;
        // The first batch may close before the record (full), so a second
        // batch record, the record, and the room to seal after it.
        let need = self.segment_overhead_bytes()
            + (self.pad_reserve_bytes() + BATCH_RECORD_BYTES + self.seal_reserve_bytes()) as u64
            + record;
        if self.segment_size_bytes < need {
            return bad(
                "segment_size_bytes",
                self.segment_size_bytes,
                format!(
                    "must hold the header, {} hard states and a largest record: at least {need}",
                    self.max_shards
                ),
            );
        }
        let batch_need = BATCH_RECORD_BYTES + record as usize + self.pad_reserve_bytes();
        if self.max_batch_bytes < batch_need || !self.max_batch_bytes.is_multiple_of(BLOCK_BYTES) {
            return bad(
                "max_batch_bytes",
                self.max_batch_bytes as u64,
                format!(
                    "must be a multiple of {BLOCK_BYTES} holding a batch record, a largest record \
                     and a pad: at least {batch_need}"
                ),
            );
        }
        if self.max_queued_bytes < self.max_batch_bytes {
            return bad(
                "max_queued_bytes",
                self.max_queued_bytes as u64,
                format!(
                    "must be at least max_batch_bytes ({})",
                    self.max_batch_bytes
                ),
            );
        }
        if self.spare_segments == 0 || self.max_spare_segments < self.spare_segments {
            return bad(
                "spare_segments",
                self.spare_segments as u64,
                format!(
                    "must be at least 1 and at most max_spare_segments ({})",
                    self.max_spare_segments
                ),
            );
        }
        if self.max_shards == 0 {
            return bad("max_shards", 0, "must be at least 1".into());
        }
        if self.zero_chunk_bytes == 0
            || !self.zero_chunk_bytes.is_multiple_of(BLOCK_BYTES)
            || self.zero_chunk_bytes as u64 > self.segment_size_bytes
        {
            return bad(
                "zero_chunk_bytes",
                self.zero_chunk_bytes as u64,
                format!("must be a non-zero multiple of {BLOCK_BYTES} no larger than a segment"),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_limits_are_checked() {
        let c = Config::new("/x");
        assert_eq!(c.validate(), Ok(()));
        let mut c2 = c.clone();
        c2.segment_size_bytes = 1 << 20 | 1;
        assert!(c2.validate().is_err());
        let mut c3 = c.clone();
        c3.max_batch_bytes = 4096;
        assert!(c3.validate().is_err());
        let mut c4 = c;
        c4.spare_segments = 0;
        assert!(c4.validate().is_err());
    }
}

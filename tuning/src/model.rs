//! The dimensions of an experiment and the outcome of running one.

use serde::Serialize;
use std::fmt;

/// The I/O engine that performs the durable appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// Cairn's whole WAL (`cairn_wal::Wal::append`: framing, CRC, group commit)
    /// over its io_uring backend.
    WalUring,
    /// Cairn's whole WAL over its plain pwrite + fdatasync backend.
    WalSync,
    /// Cairn's io_uring backend alone (`cairn_wal::UringFile::write_durable`).
    BackendUring,
    /// Cairn's pwrite backend alone (`cairn_wal::SyncStorage` file, `write_durable`).
    BackendSync,
    /// The lab's own io_uring loop on the `io-uring` crate: the floor under the WAL.
    RawUring,
    /// The lab's own pwrite/pwritev2 loop: the floor under the sync backend.
    RawPwrite,
    /// tokio-uring, as an outside reference.
    TokioUring,
    /// glommio's DMA (and buffered) files, as an outside reference.
    Glommio,
}

impl Engine {
    pub const ALL: [Engine; 8] = [
        Engine::WalUring,
        Engine::WalSync,
        Engine::BackendUring,
        Engine::BackendSync,
        Engine::RawUring,
        Engine::RawPwrite,
        Engine::TokioUring,
        Engine::Glommio,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Engine::WalUring => "wal-uring",
            Engine::WalSync => "wal-sync",
            Engine::BackendUring => "backend-uring",
            Engine::BackendSync => "backend-sync",
            Engine::RawUring => "raw-uring",
            Engine::RawPwrite => "raw-pwrite",
            Engine::TokioUring => "tokio-uring",
            Engine::Glommio => "glommio",
        }
    }

    /// Whether the engine is built on io_uring (and so fails where io_uring is disabled).
    pub fn uses_io_uring(self) -> bool {
        !matches!(
            self,
            Engine::RawPwrite | Engine::WalSync | Engine::BackendSync
        )
    }

    /// The durability mechanisms the engine's API can express at all. A mode missing
    /// here is left out of the matrix rather than reported as a failure.
    pub fn sync_modes(self) -> &'static [SyncMode] {
        use SyncMode::*;
        match self {
            // What cairn-wal's io_uring backend offers (its SyncMode) and its
            // sync backend (write + fdatasync only).
            Engine::WalUring | Engine::BackendUring => &[Fdatasync, RwfDsync, Linked],
            Engine::WalSync | Engine::BackendSync => &[Fdatasync],
            Engine::RawUring => &[Fdatasync, Fsync, ODsync, RwfDsync, Linked],
            Engine::RawPwrite => &[Fdatasync, Fsync, ODsync, RwfDsync],
            // tokio-uring has sync_data/sync_all and open flags, but neither RWF
            // flags nor linked submissions.
            Engine::TokioUring => &[Fdatasync, Fsync, ODsync],
            // glommio files expose only fdatasync, plus open flags.
            Engine::Glommio => &[Fdatasync, ODsync],
        }
    }

    /// Whether the engine is Cairn's whole WAL (so writers and batch size apply).
    pub fn is_wal(self) -> bool {
        matches!(self, Engine::WalUring | Engine::WalSync)
    }

    /// Whether more than one write may be in flight at once through this engine's
    /// single writer (the queue-depth dimension).
    pub fn supports_queue_depth(self) -> bool {
        matches!(self, Engine::RawUring)
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether writes go through the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    Buffered,
    Direct,
}

impl IoMode {
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Buffered => "buffered",
            IoMode::Direct => "direct",
        }
    }
}

/// How an append is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// write, then fdatasync.
    Fdatasync,
    /// write, then fsync.
    Fsync,
    /// The file is opened with O_DSYNC: every write returns once durable.
    ODsync,
    /// Each write carries RWF_DSYNC.
    RwfDsync,
    /// One io_uring submission of a write linked to an fdatasync.
    Linked,
}

impl SyncMode {
    pub const ALL: [SyncMode; 5] = [
        SyncMode::Fdatasync,
        SyncMode::Fsync,
        SyncMode::ODsync,
        SyncMode::RwfDsync,
        SyncMode::Linked,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SyncMode::Fdatasync => "fdatasync",
            SyncMode::Fsync => "fsync",
            SyncMode::ODsync => "o_dsync",
            SyncMode::RwfDsync => "rwf_dsync",
            SyncMode::Linked => "linked",
        }
    }

    /// Whether every single write is durable on completion (no separate sync call).
    pub fn durable_per_write(self) -> bool {
        matches!(
            self,
            SyncMode::ODsync | SyncMode::RwfDsync | SyncMode::Linked
        )
    }
}

/// How the file is prepared before the appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Prealloc {
    /// An empty file that grows with each append (a data sync must also log the size).
    None,
    /// fallocate: extents reserved but unwritten, so the first write of each converts it.
    Fallocate,
    /// Written with zeros and synced: appends overwrite allocated, written blocks.
    ZeroFill,
}

impl Prealloc {
    pub const ALL: [Prealloc; 3] = [Prealloc::None, Prealloc::Fallocate, Prealloc::ZeroFill];

    pub fn name(self) -> &'static str {
        match self {
            Prealloc::None => "none",
            Prealloc::Fallocate => "fallocate",
            Prealloc::ZeroFill => "zero-fill",
        }
    }
}

/// One point of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Experiment {
    pub engine: Engine,
    pub io_mode: IoMode,
    pub sync_mode: SyncMode,
    pub prealloc: Prealloc,
    /// Bytes per append (one write).
    pub block_size_bytes: usize,
    /// Writes in flight at once from one writer (raw io_uring only).
    pub queue_depth: u32,
    /// Concurrent appenders (group commit, through Cairn's WAL).
    pub writers: u32,
    /// Most bytes one group-commit flush may carry (the WAL's `max_batch_bytes`);
    /// 0 for engines without group commit.
    pub batch_max_bytes: u64,
}

impl Experiment {
    /// A short, stable label used in tables, plots and file names.
    pub fn label(&self) -> String {
        format!(
            "{} {} {} prealloc={} bs={} qd={} writers={} batch_bytes={}",
            self.engine.name(),
            self.io_mode.name(),
            self.sync_mode.name(),
            self.prealloc.name(),
            self.block_size_bytes,
            self.queue_depth,
            self.writers,
            self.batch_max_bytes
        )
    }
}

/// Latency figures of one experiment, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct LatencySummary {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// What a measured experiment produced.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub appends: u64,
    pub elapsed_secs: f64,
    pub appends_per_sec: f64,
    /// Durability operations issued (syncs, or durable writes): shows batching.
    pub syncs: u64,
    pub latency: LatencySummary,
    /// Points of the latency CDF: (latency in µs, fraction of appends at or below).
    pub cdf: Vec<(f64, f64)>,
    /// Whether the bytes read back after the run matched what was written.
    pub verified: bool,
    /// Zeros written during the measured phase to prepare space ahead of the
    /// appends: the whole WAL's spare segments, zero-filled at the pace of
    /// its log as a log running at this rate must. The other engines write
    /// into one file prepared before the clock starts: 0.
    pub zero_fill_bytes: u64,
}

/// How an experiment ended.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Outcome {
    Measured(Measurement),
    /// The mode cannot run here (O_DIRECT on tmpfs, io_uring disabled, ...).
    Unsupported {
        reason: String,
    },
    /// The disk filled up.
    NoSpace {
        reason: String,
    },
    /// Any other I/O error, reported for this experiment only.
    Failed {
        reason: String,
    },
    /// Ctrl-C arrived.
    Interrupted,
}

impl Outcome {
    pub fn measurement(&self) -> Option<&Measurement> {
        match self {
            Outcome::Measured(m) => Some(m),
            _ => None,
        }
    }

    pub fn status(&self) -> String {
        match self {
            Outcome::Measured(m) if m.verified => "ok".to_string(),
            Outcome::Measured(_) => "UNSAFE: read-back mismatch".to_string(),
            Outcome::Unsupported { reason } => format!("unsupported: {reason}"),
            Outcome::NoSpace { reason } => format!("no space: {reason}"),
            Outcome::Failed { reason } => format!("failed: {reason}"),
            Outcome::Interrupted => "interrupted".to_string(),
        }
    }
}

/// An experiment and its outcome.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentResult {
    pub experiment: Experiment,
    pub label: String,
    pub outcome: Outcome,
}

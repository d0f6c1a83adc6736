//! The WAL flags (`--wal-*`, or the `[wal]` table of the config file) and the
//! settings they give.

use clap::Args;
use serde::Deserialize;

use super::{invalid, ConfigError};

pub const DEFAULT_WAL_SEGMENT_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// WAL settings: `--wal-*` flags, or the `[wal]` table of the config file.
#[derive(Args, Deserialize, Debug, Default, Clone)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WalFlags {
    /// WAL I/O backend: "auto" (io_uring where available), "uring" or "sync".
    #[arg(long = "wal-backend", value_name = "BACKEND")]
    pub backend: Option<String>,

    /// Size of each preallocated WAL segment file in bytes (default 64 MiB).
    #[arg(long = "wal-segment-size-bytes", value_name = "BYTES")]
    pub segment_size_bytes: Option<u64>,

    /// Write the WAL with O_DIRECT where the filesystem allows it (default true).
    #[arg(long = "wal-direct-io", value_name = "BOOL")]
    pub direct_io: Option<bool>,

    /// How an append is made durable: "dsync" (default: one RWF_DSYNC write),
    /// "fdatasync" (write, then fdatasync) or "linked" (write and fdatasync
    /// submitted as one chain). The sync backend always writes, then fdatasyncs.
    #[arg(long = "wal-sync-mode", value_name = "MODE")]
    pub sync_mode: Option<String>,
}

impl WalFlags {
    /// Each setting from `self`, else from `other` (the config file's).
    pub fn merge(self, other: WalFlags) -> WalFlags {
        WalFlags {
            backend: self.backend.or(other.backend),
            segment_size_bytes: self.segment_size_bytes.or(other.segment_size_bytes),
            direct_io: self.direct_io.or(other.direct_io),
            sync_mode: self.sync_mode.or(other.sync_mode),
        }
    }

    /// The settings, with defaults; a value no backend or mode names is
    /// refused naming its flag.
    pub fn settings(&self) -> Result<WalSettings, ConfigError> {
        Ok(WalSettings {
            backend: match self.backend.as_deref().unwrap_or("auto") {
                "auto" => WalBackendChoice::Auto,
                "uring" | "io_uring" => WalBackendChoice::Uring,
                "sync" => WalBackendChoice::Sync,
                other => {
                    return Err(invalid(
                        "wal-backend",
                        format!("{other:?}: expected \"auto\", \"uring\" or \"sync\""),
                    ))
                }
            },
            segment_size_bytes: self
                .segment_size_bytes
                .unwrap_or(DEFAULT_WAL_SEGMENT_SIZE_BYTES),
            direct_io: self.direct_io.unwrap_or(true),
            sync_mode: match self.sync_mode.as_deref().unwrap_or("dsync") {
                "fdatasync" => WalSyncMode::Fdatasync,
                "dsync" => WalSyncMode::Dsync,
                "linked" => WalSyncMode::Linked,
                other => {
                    return Err(invalid(
                        "wal-sync-mode",
                        format!("{other:?}: expected \"fdatasync\", \"dsync\" or \"linked\""),
                    ))
                }
            },
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalBackendChoice {
    Auto,
    Uring,
    Sync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalSyncMode {
    Fdatasync,
    Dsync,
    Linked,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalSettings {
    pub backend: WalBackendChoice,
    pub segment_size_bytes: u64,
    pub direct_io: bool,
    pub sync_mode: WalSyncMode,
}

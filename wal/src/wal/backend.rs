//! Choosing the I/O backend of a log and locking its directory.

use std::io;
use std::rc::Rc;

use tracing::info;

use crate::config::{BackendChoice, Config};
use crate::error::OpenError;
use crate::storage::{Storage, SyncOptions, SyncStorage};
use crate::uring::{Uring, UringOptions, UringStorage};

/// Picks the backend for `cfg`, logging one line with the choice and why.
pub fn select_storage(cfg: &Config) -> Result<Rc<dyn Storage>, OpenError> {
    let io = |source| OpenError::Io {
        path: cfg.dir.clone(),
        source,
    };
    match cfg.backend {
        BackendChoice::Sync(opts) => {
            info!(backend = "sync", reason = "configured", dir = %cfg.dir.display(), "wal I/O backend");
            Ok(Rc::new(SyncStorage::new(&cfg.dir, opts).map_err(io)?))
        }
        BackendChoice::Uring(opts) => {
            let ring = ring_for(&opts).map_err(|e| OpenError::UringUnavailable {
                dir: cfg.dir.clone(),
                reason: uring_reason(&e),
            })?;
            info!(backend = "uring", reason = "configured", dir = %cfg.dir.display(), "wal I/O backend");
            Ok(Rc::new(
                UringStorage::new(&cfg.dir, ring, opts).map_err(io)?,
            ))
        }
        BackendChoice::Auto => open_preferring_uring(cfg, Default::default(), Default::default()),
        BackendChoice::UringOr(uring, sync) => open_preferring_uring(cfg, uring, sync),
    }
}

/// The core's shared ring, or a ring of its own when `opts` asks for another size.
fn ring_for(opts: &UringOptions) -> io::Result<Uring> {
    if opts.ring_entries == crate::uring::DEFAULT_RING_ENTRIES {
        Uring::for_this_core()
    } else {
        Uring::new(opts.ring_entries)
    }
}

/// io_uring with `uring` options when this core can have a ring, else the sync
/// backend with `sync` options; one log line says which and why.
fn open_preferring_uring(
    cfg: &Config,
    uring: UringOptions,
    sync: SyncOptions,
) -> Result<Rc<dyn Storage>, OpenError> {
    let io = |source| OpenError::Io {
        path: cfg.dir.clone(),
        source,
    };
    match ring_for(&uring) {
        Ok(ring) => {
            info!(backend = "uring", reason = "io_uring available", dir = %cfg.dir.display(), "wal I/O backend");
            Ok(Rc::new(
                UringStorage::new(&cfg.dir, ring, uring).map_err(io)?,
            ))
        }
        Err(e) => {
            let reason = uring_reason(&e);
            info!(backend = "sync", reason = %reason, dir = %cfg.dir.display(), "wal I/O backend");
            Ok(Rc::new(SyncStorage::new(&cfg.dir, sync).map_err(io)?))
        }
    }
}

/// Name of the lock file `Wal::open` holds in the WAL directory.
pub const LOCK_FILE_NAME: &str = "LOCK";

pub(super) fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, OpenError> {
    use std::os::fd::AsRawFd;
    let io = |source| OpenError::Io {
        path: dir.join(LOCK_FILE_NAME),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE_NAME))
        .map_err(io)?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(OpenError::Locked {
                dir: dir.to_path_buf(),
            });
        }
        return Err(io(e));
    }
    Ok(f)
}

/// Why io_uring cannot be used, in an operator's words.
fn uring_reason(e: &io::Error) -> String {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .map(|s| s.trim().to_string());
    match e.raw_os_error() {
        Some(libc::ENOSYS) => "kernel has no io_uring (ENOSYS: too old or built without it)".into(),
        Some(libc::EPERM) | Some(libc::EACCES) => match sysctl.as_deref() {
            Some(v @ ("1" | "2")) => {
                format!("io_uring disabled by sysctl kernel.io_uring_disabled={v}")
            }
            _ => {
                format!("io_uring forbidden ({e}): a seccomp profile or security policy blocks it")
            }
        },
        _ => format!("io_uring setup failed: {e}"),
    }
}

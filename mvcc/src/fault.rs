//! A slow or failing store disk on demand, for fault tests of whole members:
//! wraps the store's file and, before each sync (the applying thread's and the
//! background syncer's), reads a control file that says what the disk does:
//!
//! ```text
//! "store-stall <ms> [file]"   each sync waits <ms> first
//! "store-error [file]"        each sync fails with EIO
//! anything else               nothing: the real file's answer
//! ```
//!
//! With a file name (`shard-1.mvcc`), only the store whose file has that
//! name is faulted; without, every store of the member.
//!
//! The words differ from the WAL's (`wal/src/fault.rs`), so one control file
//! can hold a WAL fault or a store fault. Only used when [`crate::Config`]
//! names a control file (the daemon's test-only `--test-disk-faults` flag).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::storage::{Storage, SyncHandle};

/// What the control file asks of the store's syncs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncFault {
    None,
    Stall(Duration),
    Error,
}

impl SyncFault {
    /// Reads the control file for the store in `file` (its file name);
    /// anything unreadable or unknown is no fault.
    pub fn read(path: &Path, file: &str) -> SyncFault {
        std::fs::read_to_string(path).map_or(SyncFault::None, |t| SyncFault::parse(&t, file))
    }

    /// What `text` asks of the store in `file`.
    pub fn parse(text: &str, file: &str) -> SyncFault {
        let mut words = text.split_whitespace();
        let (fault, target) = match words.next() {
            Some("store-stall") => match words.next().map(str::parse::<u64>) {
                Some(Ok(ms)) => (SyncFault::Stall(Duration::from_millis(ms)), words.next()),
                _ => return SyncFault::None,
            },
            Some("store-error") => (SyncFault::Error, words.next()),
            _ => return SyncFault::None,
        };
        match target {
            Some(name) if name != file => SyncFault::None,
            _ => fault,
        }
    }

    /// Waits or fails as the control file says, before a real sync of
    /// `file`. The member's other durable files of a store (its shard's
    /// snapshot metadata, `shard-<n>/raft-snapshot`) go through it too.
    pub fn before_sync(path: &Path, file: &str) -> io::Result<()> {
        match SyncFault::read(path, file) {
            SyncFault::None => Ok(()),
            SyncFault::Stall(d) => {
                std::thread::sleep(d);
                Ok(())
            }
            SyncFault::Error => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

/// The store's storage, with syncs subject to the control file.
pub struct FaultStorage<S> {
    inner: S,
    control: PathBuf,
    /// The store file's name, which a control line may target.
    file: String,
}

impl<S: Storage> FaultStorage<S> {
    pub fn new(inner: S, control: PathBuf, file: &str) -> FaultStorage<S> {
        FaultStorage {
            inner,
            control,
            file: file.to_string(),
        }
    }
}

impl<S: Storage> Storage for FaultStorage<S> {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        SyncFault::before_sync(&self.control, &self.file)?;
        self.inner.sync_data()
    }

    fn file(&self) -> Option<&File> {
        self.inner.file()
    }

    fn sync_handle(&self) -> Option<Box<dyn SyncHandle>> {
        let inner = self.inner.sync_handle()?;
        Some(Box::new(FaultSyncHandle {
            inner,
            control: self.control.clone(),
            file: self.file.clone(),
        }))
    }
}

/// The background syncer's handle, with syncs subject to the control file.
struct FaultSyncHandle {
    inner: Box<dyn SyncHandle>,
    control: PathBuf,
    file: String,
}

impl SyncHandle for FaultSyncHandle {
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        SyncFault::before_sync(&self.control, &self.file)?;
        self.inner.sync_data()
    }

    fn grow_to(&mut self, len: u64) -> io::Result<()> {
        self.inner.grow_to(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    #[test]
    fn the_control_file_words_are_the_stores_own() {
        let f = "shard-0.mvcc";
        assert_eq!(
            SyncFault::parse("store-stall 250\n", f),
            SyncFault::Stall(Duration::from_millis(250))
        );
        assert_eq!(SyncFault::parse("store-error", f), SyncFault::Error);
        // A named store: that one only.
        assert_eq!(
            SyncFault::parse("store-stall 250 shard-0.mvcc", f),
            SyncFault::Stall(Duration::from_millis(250))
        );
        assert_eq!(
            SyncFault::parse("store-error shard-1.mvcc", f),
            SyncFault::None
        );
        // The WAL's words, and garbage, leave the store alone.
        for other in ["", "none", "stall 2000", "error", "full", "store-stall x"] {
            assert_eq!(SyncFault::parse(other, f), SyncFault::None, "{other:?}");
        }
        assert_eq!(
            SyncFault::read(Path::new("/nonexistent/control"), f),
            SyncFault::None
        );
    }

    #[test]
    fn syncs_fail_while_the_file_says_so_and_writes_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("faults");
        let mut s = FaultStorage::new(MemStorage::new(), control.clone(), "shard-0.mvcc");
        s.write_at(b"abc", 0).unwrap();
        s.sync_data().unwrap();
        std::fs::write(&control, "store-error").unwrap();
        s.write_at(b"def", 3).unwrap();
        let e = s.sync_data().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        std::fs::write(&control, "none").unwrap();
        s.sync_data().unwrap();
        let mut buf = [0u8; 6];
        s.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"abcdef");
    }
}

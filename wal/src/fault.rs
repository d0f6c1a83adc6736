//! A slow or failing disk on demand, for fault tests of whole members: wraps
//! the real storage and, before each write and sync, reads a control file
//! that says what the disk does now:
//!
//! ```text
//! (missing, empty or "none")   nothing: the real storage's answer
//! "stall <ms>"                 each write and sync waits <ms> first (or
//!                              until the file says otherwise)
//! "error"                      each write and sync fails with EIO
//! "full"                       each write and sync fails with ENOSPC
//! ```
//!
//! A directory name after the words (`stall 5000 lane-1`, `error lane-0`)
//! limits the fault to the WAL in the directory of that name: a member
//! keeps one WAL per core, so a test can slow one core's disk alone.
//!
//! Only built in when the daemon is started with its test-only
//! `--test-disk-faults` flag; a member without it never reads the file.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::buf::AlignedBuf;
use crate::storage::{IoFuture, Storage, StorageFile};

/// How often a stalled write or sync reads the control file again.
const STALL_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// What the control file asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFault {
    None,
    Stall(Duration),
    Error,
    Full,
}

impl DiskFault {
    /// Reads the control file as the WAL in directory `wal` (its name);
    /// anything unreadable or unknown is no fault.
    pub fn read(path: &Path, wal: &str) -> DiskFault {
        let Ok(text) = std::fs::read_to_string(path) else {
            return DiskFault::None;
        };
        DiskFault::parse(&text, wal)
    }

    pub fn parse(text: &str, wal: &str) -> DiskFault {
        let mut words = text.split_whitespace();
        let (fault, target) = match (words.next(), words.next()) {
            (Some("stall"), Some(ms)) => match ms.parse::<u64>() {
                Ok(ms) => (DiskFault::Stall(Duration::from_millis(ms)), words.next()),
                Err(_) => (DiskFault::None, None),
            },
            (Some("error"), target) => (DiskFault::Error, target),
            (Some("full"), target) => (DiskFault::Full, target),
            _ => (DiskFault::None, None),
        };
        match target {
            Some(name) if name != wal => DiskFault::None,
            _ => fault,
        }
    }

    /// Waits or fails as the fault says, before the real operation.
    async fn before_io(path: &Path, wal: &str) -> io::Result<()> {
        match DiskFault::read(path, wal) {
            DiskFault::None => Ok(()),
            DiskFault::Stall(d) => {
                // The file is read again as the stall goes on: one lifted
                // (or aimed elsewhere) meanwhile ends the wait.
                let until = tokio::time::Instant::now() + d;
                loop {
                    let left = until.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Ok(());
                    }
                    tokio::time::sleep(left.min(STALL_CHECK_INTERVAL)).await;
                    if !matches!(DiskFault::read(path, wal), DiskFault::Stall(_)) {
                        return Ok(());
                    }
                }
            }
            DiskFault::Error => Err(io::Error::from_raw_os_error(libc::EIO)),
            DiskFault::Full => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        }
    }
}

/// The storage, with writes and syncs subject to the control file.
pub struct FaultStorage {
    inner: Rc<dyn Storage>,
    control: Rc<Control>,
}

/// The control file, and the name of the WAL's directory it is read as.
struct Control {
    path: PathBuf,
    wal: String,
}

impl FaultStorage {
    /// `inner` under the control file `control`, as the WAL whose directory
    /// is named `wal`.
    pub fn new(inner: Rc<dyn Storage>, control: PathBuf, wal: &str) -> FaultStorage {
        FaultStorage {
            inner,
            control: Rc::new(Control {
                path: control,
                wal: wal.to_string(),
            }),
        }
    }
}

impl Control {
    async fn before_io(&self) -> io::Result<()> {
        DiskFault::before_io(&self.path, &self.wal).await
    }
}

impl Storage for FaultStorage {
    fn describe(&self) -> String {
        format!(
            "{} with test disk faults from {}",
            self.inner.describe(),
            self.control.path.display()
        )
    }
    fn path_of(&self, name: &str) -> PathBuf {
        self.inner.path_of(name)
    }
    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }
    fn open(&self, name: &str, create: bool) -> io::Result<Rc<dyn StorageFile>> {
        Ok(Rc::new(FaultFile {
            inner: self.inner.open(name, create)?,
            control: self.control.clone(),
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }
    fn sync_dir(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.control.before_io().await?;
            self.inner.sync_dir().await
        })
    }
}

struct FaultFile {
    inner: Rc<dyn StorageFile>,
    control: Rc<Control>,
}

impl StorageFile for FaultFile {
    fn size_bytes(&self) -> io::Result<u64> {
        self.inner.size_bytes()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_at(&self, offset: u64, len: usize) -> IoFuture<'_, io::Result<Vec<u8>>> {
        self.inner.read_at(offset, len)
    }
    fn write_at(&self, offset: u64, buf: AlignedBuf) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        Box::pin(async move {
            if let Err(e) = self.control.before_io().await {
                return (buf, Err(e));
            }
            self.inner.write_at(offset, buf).await
        })
    }
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            self.control.before_io().await?;
            self.inner.sync_data().await
        })
    }
    fn write_durable(
        &self,
        offset: u64,
        buf: AlignedBuf,
    ) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        Box::pin(async move {
            if let Err(e) = self.control.before_io().await {
                return (buf, Err(e));
            }
            self.inner.write_durable(offset, buf).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_file_words() {
        let parse = |text| DiskFault::parse(text, "lane-0");
        assert_eq!(parse(""), DiskFault::None);
        assert_eq!(parse("none\n"), DiskFault::None);
        assert_eq!(
            parse("stall 1500\n"),
            DiskFault::Stall(Duration::from_millis(1500))
        );
        assert_eq!(parse("stall soon"), DiskFault::None);
        assert_eq!(parse("error"), DiskFault::Error);
        assert_eq!(parse("full"), DiskFault::Full);
        assert_eq!(
            DiskFault::read(Path::new("/nonexistent/control"), "lane-0"),
            DiskFault::None
        );
        // Named: that WAL only.
        assert_eq!(
            parse("stall 1500 lane-0"),
            DiskFault::Stall(Duration::from_millis(1500))
        );
        assert_eq!(parse("stall 1500 lane-1"), DiskFault::None);
        assert_eq!(parse("error lane-0"), DiskFault::Error);
        assert_eq!(parse("full lane-1"), DiskFault::None);
        // A store's words are not the WAL's.
        assert_eq!(parse("store-stall 1500 shard-0.mvcc"), DiskFault::None);
    }

    #[tokio::test]
    async fn a_stall_lifted_meanwhile_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("faults");
        std::fs::write(&control, "stall 600000 lane-0").unwrap();
        let stalled = tokio::spawn({
            let control = control.clone();
            async move { DiskFault::before_io(&control, "lane-0").await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!stalled.is_finished(), "the stall holds the write");
        std::fs::write(&control, "none").unwrap();
        // Ten minutes if the stall were not read again: the test's timeout.
        let waited = tokio::time::timeout(Duration::from_secs(60), stalled).await;
        assert!(matches!(waited, Ok(Ok(Ok(())))), "{waited:?}");
    }
}

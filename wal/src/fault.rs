//! A slow or failing disk on demand, for fault tests of whole members: wraps
//! the real storage and, before each write and sync, reads a control file
//! that says what the disk does now:
//!
//! ```text
//! (missing, empty or "none")   nothing: the real storage's answer
//! "stall <ms>"                 each write and sync waits <ms> first
//! "error"                      each write and sync fails with EIO
//! "full"                       each write and sync fails with ENOSPC
//! ```
//!
//! Only built in when the daemon is started with its test-only
//! `--test-disk-faults` flag; a member without it never reads the file.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use crate::buf::AlignedBuf;
use crate::storage::{IoFuture, Storage, StorageFile};

/// What the control file asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFault {
    None,
    Stall(Duration),
    Error,
    Full,
}

impl DiskFault {
    /// Reads the control file; anything unreadable or unknown is no fault.
    pub fn read(path: &Path) -> DiskFault {
        let Ok(text) = std::fs::read_to_string(path) else {
            return DiskFault::None;
        };
        DiskFault::parse(&text)
    }

    pub fn parse(text: &str) -> DiskFault {
        let mut words = text.split_whitespace();
        match (words.next(), words.next().map(str::parse::<u64>)) {
            (Some("stall"), Some(Ok(ms))) => DiskFault::Stall(Duration::from_millis(ms)),
            (Some("error"), _) => DiskFault::Error,
            (Some("full"), _) => DiskFault::Full,
            _ => DiskFault::None,
        }
    }

    /// Waits or fails as the fault says, before the real operation.
    async fn before_io(path: &Path) -> io::Result<()> {
        match DiskFault::read(path) {
            DiskFault::None => Ok(()),
            DiskFault::Stall(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            DiskFault::Error => Err(io::Error::from_raw_os_error(libc::EIO)),
            DiskFault::Full => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        }
    }
}

/// The storage, with writes and syncs subject to the control file.
pub struct FaultStorage {
    inner: Rc<dyn Storage>,
    control: Rc<PathBuf>,
}

impl FaultStorage {
    pub fn new(inner: Rc<dyn Storage>, control: PathBuf) -> FaultStorage {
        FaultStorage {
            inner,
            control: Rc::new(control),
        }
    }
}

impl Storage for FaultStorage {
    fn describe(&self) -> String {
        format!(
            "{} with test disk faults from {}",
            self.inner.describe(),
            self.control.display()
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
            DiskFault::before_io(&self.control).await?;
            self.inner.sync_dir().await
        })
    }
}

struct FaultFile {
    inner: Rc<dyn StorageFile>,
    control: Rc<PathBuf>,
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
            if let Err(e) = DiskFault::before_io(&self.control).await {
                return (buf, Err(e));
            }
            self.inner.write_at(offset, buf).await
        })
    }
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(async move {
            DiskFault::before_io(&self.control).await?;
            self.inner.sync_data().await
        })
    }
    fn write_durable(
        &self,
        offset: u64,
        buf: AlignedBuf,
    ) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        Box::pin(async move {
            if let Err(e) = DiskFault::before_io(&self.control).await {
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
        assert_eq!(DiskFault::parse(""), DiskFault::None);
        assert_eq!(DiskFault::parse("none\n"), DiskFault::None);
        assert_eq!(
            DiskFault::parse("stall 1500\n"),
            DiskFault::Stall(Duration::from_millis(1500))
        );
        assert_eq!(DiskFault::parse("stall soon"), DiskFault::None);
        assert_eq!(DiskFault::parse("error"), DiskFault::Error);
        assert_eq!(DiskFault::parse("full"), DiskFault::Full);
        assert_eq!(
            DiskFault::read(Path::new("/nonexistent/control")),
            DiskFault::None
        );
    }
}

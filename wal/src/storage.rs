//! The narrow I/O seam under the WAL: a directory of files with positioned
//! reads and writes, data sync and a directory sync. Three implementations:
//! [`crate::uring::UringStorage`], [`SyncStorage`] (pwrite + fdatasync) and the
//! fault-injecting [`crate::crash::CrashStorage`] used by tests.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use crate::buf::AlignedBuf;

/// A boxed, non-`Send` future: storage lives on one core.
pub type IoFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// A directory holding WAL files. Metadata operations are rare (segment roll
/// and recycling) and synchronous; only the directory sync is asynchronous.
pub trait Storage {
    /// A short human description: backend and its settings.
    fn describe(&self) -> String;
    /// Full path of `name`, for error messages.
    fn path_of(&self, name: &str) -> PathBuf;
    /// Names of the files in the directory.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens `name`; with `create`, creates it (failing if it exists).
    fn open(&self, name: &str, create: bool) -> io::Result<Rc<dyn StorageFile>>;
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes creations, renames and removals durable.
    fn sync_dir(&self) -> IoFuture<'_, io::Result<()>>;
}

/// One open file. Writes take block-aligned buffers at block-aligned offsets
/// and hand the buffer back when the I/O is over, whatever its outcome.
pub trait StorageFile {
    /// Current file size in bytes.
    fn size_bytes(&self) -> io::Result<u64>;
    /// Sets the file length; new space reads as zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reads exactly `len` bytes at `offset` (any alignment).
    fn read_at(&self, offset: u64, len: usize) -> IoFuture<'_, io::Result<Vec<u8>>>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, offset: u64, buf: AlignedBuf) -> IoFuture<'_, (AlignedBuf, io::Result<()>)>;
    /// Makes the written data durable (fdatasync semantics).
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>>;
    /// Writes `buf` and makes it durable. Backends override this with a single
    /// submission (linked write + fdatasync, or an RWF_DSYNC write).
    fn write_durable(
        &self,
        offset: u64,
        buf: AlignedBuf,
    ) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        Box::pin(async move {
            let (buf, res) = self.write_at(offset, buf).await;
            if let Err(e) = res {
                return (buf, Err(e));
            }
            let res = self.sync_data().await;
            (buf, res)
        })
    }
}

/// Knobs of the pwrite + fdatasync backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncOptions {
    /// Run pwrite/fdatasync on tokio's blocking pool (default) so the core keeps
    /// accepting appends during a sync; `false` runs them inline on the core
    /// thread (lowest single-writer latency, no group commit while syncing).
    pub blocking_pool: bool,
    /// Open segments with O_DIRECT (falls back to buffered where refused).
    pub direct: bool,
}

impl Default for SyncOptions {
    fn default() -> SyncOptions {
        SyncOptions {
            blocking_pool: true,
            direct: false,
        }
    }
}

/// Plain positioned writes and fdatasync through the standard library.
pub struct SyncStorage {
    dir: PathBuf,
    dir_file: Arc<File>,
    opts: SyncOptions,
}

impl SyncStorage {
    pub fn new(dir: &Path, opts: SyncOptions) -> io::Result<SyncStorage> {
        std::fs::create_dir_all(dir)?;
        let dir_file = Arc::new(File::open(dir)?);
        Ok(SyncStorage {
            dir: dir.to_path_buf(),
            dir_file,
            opts,
        })
    }
}

pub(crate) fn open_file(path: &Path, create: bool, direct: bool) -> io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if create {
        o.create_new(true);
    }
    if direct {
        let mut d = o.clone();
        d.custom_flags(libc::O_DIRECT);
        match d.open(path) {
            Ok(f) => return Ok((f, true)),
            // tmpfs and some others refuse O_DIRECT with EINVAL: fall back.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if create {
                    // create_new may have succeeded before the flag was refused.
                    let _ = std::fs::remove_file(path);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok((o.open(path)?, false))
}

pub(crate) fn list_dir(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if let Ok(n) = e.file_name().into_string() {
            names.push(n);
        }
    }
    Ok(names)
}

async fn run_blocking<T: Send + 'static>(pool: bool, f: impl FnOnce() -> T + Send + 'static) -> T {
    if pool {
        match tokio::task::spawn_blocking(f).await {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    } else {
        f()
    }
}

impl Storage for SyncStorage {
    fn describe(&self) -> String {
        format!(
            "sync (pwrite + fdatasync{}{})",
            if self.opts.blocking_pool {
                ", blocking pool"
            } else {
                ", inline"
            },
            if self.opts.direct { ", O_DIRECT" } else { "" }
        )
    }
    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    fn list(&self) -> io::Result<Vec<String>> {
        list_dir(&self.dir)
    }
    fn open(&self, name: &str, create: bool) -> io::Result<Rc<dyn StorageFile>> {
        let (file, _) = open_file(&self.dir.join(name), create, self.opts.direct)?;
        Ok(Rc::new(SyncFile {
            file: Arc::new(file),
            pool: self.opts.blocking_pool,
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.dir.join(name))
    }
    fn sync_dir(&self) -> IoFuture<'_, io::Result<()>> {
        let d = self.dir_file.clone();
        Box::pin(run_blocking(self.opts.blocking_pool, move || d.sync_all()))
    }
}

struct SyncFile {
    file: Arc<File>,
    pool: bool,
}

impl StorageFile for SyncFile {
    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn read_at(&self, offset: u64, len: usize) -> IoFuture<'_, io::Result<Vec<u8>>> {
        let f = self.file.clone();
        Box::pin(run_blocking(self.pool, move || {
            // O_DIRECT needs aligned offset, length and memory: read the covering
            // aligned span, then copy out the slice asked for.
            let start = crate::buf::align_down(offset as usize, crate::buf::BLOCK_BYTES);
            let end = crate::buf::align_up(offset as usize + len, crate::buf::BLOCK_BYTES);
            let mut b = AlignedBuf::with_capacity(end - start);
            b.set_len(end - start);
            let mut done = 0;
            while done < b.len() {
                let n = f.read_at(&mut b[done..], (start + done) as u64)?;
                if n == 0 {
                    break;
                }
                done += n;
            }
            let want_end = offset as usize - start + len;
            if done < want_end {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of {len} bytes at offset {offset} hit end of file"),
                ));
            }
            Ok(b[offset as usize - start..want_end].to_vec())
        }))
    }
    fn write_at(&self, offset: u64, buf: AlignedBuf) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        let f = self.file.clone();
        Box::pin(run_blocking(self.pool, move || {
            let r = f.write_all_at(&buf, offset);
            (buf, r)
        }))
    }
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>> {
        let f = self.file.clone();
        Box::pin(run_blocking(self.pool, move || f.sync_data()))
    }
    fn write_durable(
        &self,
        offset: u64,
        buf: AlignedBuf,
    ) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        // One trip to the blocking pool for both calls.
        let f = self.file.clone();
        Box::pin(run_blocking(self.pool, move || {
            let r = f.write_all_at(&buf, offset).and_then(|()| f.sync_data());
            (buf, r)
        }))
    }
}

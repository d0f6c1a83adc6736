//! The narrow I/O seam: every byte the store reads from or writes to its file
//! passes through [`Storage`], except reads through the memory map of a real file.
//!
//! [`FileStorage`] is the real file. [`MemStorage`] keeps a live and a durable
//! image in memory so tests can crash at any sync point, tear unsynced writes,
//! fail writes or syncs, and run out of space.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Positioned file I/O as the store needs it.
pub trait Storage {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`; a short file is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Grows (reserving the space) or shrinks the file.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Makes every completed write and length change durable.
    fn sync_data(&mut self) -> io::Result<()>;
    /// The real file behind this storage, if any: reads then go through a memory map.
    fn file(&self) -> Option<&File> {
        None
    }
    /// A second handle that another thread may use to write meta pages and
    /// sync, so a commit's syncs leave the applying thread. None: commits sync inline.
    fn sync_handle(&self) -> Option<Box<dyn SyncHandle>> {
        None
    }
}

/// What the background syncer needs of the file.
pub trait SyncHandle: Send {
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn sync_data(&mut self) -> io::Result<()>;
    /// Grows the file to at least `len` bytes, reserving the space; a file
    /// already as long is left alone. Never shrinks.
    fn grow_to(&mut self, len: u64) -> io::Result<()>;
}

impl SyncHandle for File {
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn grow_to(&mut self, len: u64) -> io::Result<()> {
        let cur = self.metadata()?.len();
        if len > cur {
            reserve(self, cur, len)
        } else {
            Ok(())
        }
    }
}

/// Grows `file` from `cur` to `len` bytes. Reserving the blocks makes a full
/// disk fail here, before any page write, and keeps later data syncs free
/// of allocation; a file system without fallocate gets a plain set_len.
fn reserve(file: &File, cur: u64, len: u64) -> io::Result<()> {
    let add = (len - cur) as libc::off_t;
    // SAFETY: posix_fallocate only reads its integer arguments; the fd is
    // owned by `file`, which the caller borrows for the duration of the call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), cur as libc::off_t, add) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// A real file, written with pwrite and grown with fallocate.
pub struct FileStorage {
    file: File,
    path: PathBuf,
}

impl FileStorage {
    /// Opens or creates `path` for reading and writing.
    pub fn open(path: &Path) -> io::Result<FileStorage> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(FileStorage {
            file,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Storage for FileStorage {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let cur = self.len()?;
        if len > cur {
            reserve(&self.file, cur, len)
        } else {
            self.file.set_len(len)
        }
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn file(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn sync_handle(&self) -> Option<Box<dyn SyncHandle>> {
        self.file
            .try_clone()
            .ok()
            .map(|f| Box::new(f) as Box<dyn SyncHandle>)
    }
}

/// How a simulated crash treats writes that were not synced yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced write is lost.
    LoseUnsynced,
    /// Each unsynced write independently is lost, kept, or torn at a 512-byte
    /// sector boundary, chosen by the seed.
    Tear { seed: u64 },
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct MemState {
    live: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Pending>,
    syncs_done: u64,
    crash_at_sync: Option<u64>,
    crashed: bool,
    fail_next_write: bool,
    fail_next_sync: bool,
    space_limit_bytes: Option<u64>,
}

/// An in-memory file with a live image and a durable image. Clones share state,
/// so a test can keep a handle to inspect, fault or crash the store's storage.
#[derive(Clone, Default)]
pub struct MemStorage {
    state: Rc<RefCell<MemState>>,
}

fn apply(img: &mut Vec<u8>, p: &Pending) {
    match p {
        Pending::Write { offset, data } => {
            let end = *offset as usize + data.len();
            if img.len() < end {
                img.resize(end, 0);
            }
            img[*offset as usize..end].copy_from_slice(data);
        }
        Pending::SetLen(len) => img.resize(*len as usize, 0),
    }
}

fn split_mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl MemStorage {
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// A storage whose live and durable images are both `image`.
    pub fn from_image(image: Vec<u8>) -> MemStorage {
        let s = MemStorage::default();
        {
            let mut st = s.state.borrow_mut();
            st.durable = image.clone();
            st.live = image;
        }
        s
    }

    /// The `n`-th sync from now on fails and every later operation fails too,
    /// as if the machine stopped right there.
    pub fn crash_at_sync(&self, n: u64) {
        let mut st = self.state.borrow_mut();
        st.crash_at_sync = Some(st.syncs_done + n);
    }

    pub fn crashed(&self) -> bool {
        self.state.borrow().crashed
    }

    pub fn syncs_done(&self) -> u64 {
        self.state.borrow().syncs_done
    }

    pub fn fail_next_write(&self) {
        self.state.borrow_mut().fail_next_write = true;
    }

    pub fn fail_next_sync(&self) {
        self.state.borrow_mut().fail_next_sync = true;
    }

    /// Writes or growth past this many bytes fail with ENOSPC.
    pub fn set_space_limit(&self, limit_bytes: Option<u64>) {
        self.state.borrow_mut().space_limit_bytes = limit_bytes;
    }

    pub fn live_image(&self) -> Vec<u8> {
        self.state.borrow().live.clone()
    }

    /// Overwrites bytes of both images, as bit rot or a foreign writer would.
    pub fn corrupt(&self, offset: u64, bytes: &[u8]) {
        let mut st = self.state.borrow_mut();
        let p = Pending::Write {
            offset,
            data: bytes.to_vec(),
        };
        apply(&mut st.live, &p);
        apply(&mut st.durable, &p);
    }

    /// The image a restarted machine would find after a crash now.
    pub fn crash_image(&self, mode: CrashMode) -> MemStorage {
        let st = self.state.borrow();
        let mut img = st.durable.clone();
        if let CrashMode::Tear { seed } = mode {
            let mut rng = seed;
            for p in &st.unsynced {
                match split_mix(&mut rng) % 3 {
                    0 => {}
                    1 => apply(&mut img, p),
                    _ => match p {
                        Pending::Write { offset, data } => {
                            let sectors = data.len().div_ceil(512);
                            let keep = (split_mix(&mut rng) % sectors as u64) as usize * 512;
                            let torn = Pending::Write {
                                offset: *offset,
                                data: data[..keep.min(data.len())].to_vec(),
                            };
                            apply(&mut img, &torn);
                        }
                        Pending::SetLen(_) => apply(&mut img, p),
                    },
                }
            }
        }
        MemStorage::from_image(img)
    }

    fn check_alive(st: &MemState) -> io::Result<()> {
        if st.crashed {
            return Err(io::Error::other("simulated machine stop"));
        }
        Ok(())
    }
}

impl Storage for MemStorage {
    fn len(&self) -> io::Result<u64> {
        let st = self.state.borrow();
        MemStorage::check_alive(&st)?;
        Ok(st.live.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.state.borrow();
        MemStorage::check_alive(&st)?;
        let end = offset as usize + buf.len();
        if end > st.live.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&st.live[offset as usize..end]);
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.state.borrow_mut();
        MemStorage::check_alive(&st)?;
        if std::mem::take(&mut st.fail_next_write) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if let Some(limit) = st.space_limit_bytes {
            if offset + buf.len() as u64 > limit.max(st.live.len() as u64) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        let p = Pending::Write {
            offset,
            data: buf.to_vec(),
        };
        apply(&mut st.live, &p);
        st.unsynced.push(p);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut st = self.state.borrow_mut();
        MemStorage::check_alive(&st)?;
        if let Some(limit) = st.space_limit_bytes {
            if len > limit && len > st.live.len() as u64 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
        }
        let p = Pending::SetLen(len);
        apply(&mut st.live, &p);
        st.unsynced.push(p);
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let mut st = self.state.borrow_mut();
        MemStorage::check_alive(&st)?;
        st.syncs_done += 1;
        if st.crash_at_sync == Some(st.syncs_done) {
            st.crashed = true;
            return Err(io::Error::other("simulated machine stop during sync"));
        }
        if std::mem::take(&mut st.fail_next_sync) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let pending = std::mem::take(&mut st.unsynced);
        for p in &pending {
            apply(&mut st.durable, p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_are_lost_in_a_crash_and_synced_ones_kept() {
        let mut s = MemStorage::new();
        s.write_at(b"abcd", 0).unwrap();
        s.sync_data().unwrap();
        s.write_at(b"xy", 1).unwrap();
        let img = s.crash_image(CrashMode::LoseUnsynced);
        let mut b = [0u8; 4];
        img.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"abcd");
        s.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"axyd");
    }

    #[test]
    fn crash_at_sync_stops_everything_after() {
        let mut s = MemStorage::new();
        s.crash_at_sync(2);
        s.write_at(b"a", 0).unwrap();
        s.sync_data().unwrap();
        s.write_at(b"b", 0).unwrap();
        assert!(s.sync_data().is_err());
        assert!(s.write_at(b"c", 0).is_err());
        assert!(s.crashed());
    }
}

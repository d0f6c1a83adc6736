//! An in-memory [`Storage`] that models what survives a power cut, for tests.
//!
//! Every file keeps a *live* image (what reads see) and a *durable* image
//! (what the disk is known to hold). `sync_data` copies live to durable;
//! directory changes (create, rename, remove) become durable at `sync_dir`.
//! The N-th sync can be made to "crash": it fails, and every later operation
//! fails too. [`CrashStorage::after_crash`] then builds the disk as a restart
//! would find it: the durable images plus, optionally, a random subset of the
//! sectors written since their last sync (writes reach the disk in any order).
//! Errors such as ENOSPC can be injected on chosen operations.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;
use std::rc::Rc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::buf::AlignedBuf;
use crate::storage::{IoFuture, Storage, StorageFile};

/// Granularity at which unsynced writes reach the disk in [`CrashStorage::after_crash`].
pub const SECTOR_BYTES: usize = crate::record::SECTOR_BYTES;

/// Operations a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    Write,
    SyncData,
    SyncDir,
    SetLen,
    Create,
}

#[derive(Default, Clone)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    live_names: BTreeMap<String, u64>,
    durable_names: BTreeMap<String, u64>,
    next_inode: u64,
    syncs: u64,
    crash_at_sync: Option<u64>,
    crashed: bool,
    faults: HashMap<FaultOp, (u64, i32)>,
    counts: HashMap<FaultOp, u64>,
}

impl State {
    fn check(&mut self, op: FaultOp) -> io::Result<()> {
        if self.crashed {
            return Err(io::Error::other("simulated crash: the machine is down"));
        }
        let n = self.counts.entry(op).or_insert(0);
        *n += 1;
        if let Some(&(at, errno)) = self.faults.get(&op) {
            if *n >= at {
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        Ok(())
    }

    fn sync_point(&mut self) -> io::Result<bool> {
        self.syncs += 1;
        if Some(self.syncs) == self.crash_at_sync {
            self.crashed = true;
            return Err(io::Error::other(format!(
                "simulated crash at sync {}",
                self.syncs
            )));
        }
        Ok(true)
    }
}

/// The crash-simulating storage. Clones share the same disk.
#[derive(Clone, Default)]
pub struct CrashStorage {
    st: Rc<RefCell<State>>,
}

impl CrashStorage {
    pub fn new() -> CrashStorage {
        CrashStorage::default()
    }

    /// The `n`-th sync (file or directory, counting from 1) crashes.
    pub fn crash_at_sync(&self, n: u64) {
        self.st.borrow_mut().crash_at_sync = Some(n);
    }

    /// From the `nth` call of `op` on (counting from 1), fail with `errno`.
    pub fn inject(&self, op: FaultOp, nth: u64, errno: i32) {
        let mut st = self.st.borrow_mut();
        let done = st.counts.get(&op).copied().unwrap_or(0);
        st.faults.insert(op, (done + nth, errno));
    }

    pub fn clear_faults(&self) {
        self.st.borrow_mut().faults.clear();
    }

    pub fn crashed(&self) -> bool {
        self.st.borrow().crashed
    }

    /// Syncs so far (file and directory).
    pub fn syncs(&self) -> u64 {
        self.st.borrow().syncs
    }

    /// The disk a restart finds: durable names and images; with `torn_seed`,
    /// each sector written since its file's last sync independently made it or not.
    pub fn after_crash(&self, torn_seed: Option<u64>) -> CrashStorage {
        let st = self.st.borrow();
        let mut rng = torn_seed.map(SmallRng::seed_from_u64);
        let mut inodes = HashMap::new();
        for ino in st.durable_names.values() {
            let node = &st.inodes[ino];
            let mut image = node.durable.clone();
            if let Some(rng) = rng.as_mut() {
                if image.len() < node.live.len() {
                    image.resize(node.live.len(), 0);
                }
                for start in (0..node.live.len()).step_by(SECTOR_BYTES) {
                    let end = (start + SECTOR_BYTES).min(node.live.len());
                    if image[start..end] != node.live[start..end] && rng.gen_bool(0.5) {
                        image[start..end].copy_from_slice(&node.live[start..end]);
                    }
                }
            }
            inodes.insert(
                *ino,
                Inode {
                    live: image.clone(),
                    durable: image,
                },
            );
        }
        CrashStorage {
            st: Rc::new(RefCell::new(State {
                inodes,
                live_names: st.durable_names.clone(),
                durable_names: st.durable_names.clone(),
                next_inode: st.next_inode,
                ..State::default()
            })),
        }
    }

    /// The live bytes of `name` (tests inspect and corrupt files with these).
    pub fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        let st = self.st.borrow();
        st.live_names.get(name).map(|i| st.inodes[i].live.clone())
    }

    /// Replaces the contents of `name`, live and durable alike.
    pub fn write_file(&self, name: &str, bytes: &[u8]) {
        let mut st = self.st.borrow_mut();
        let ino = *st.live_names.get(name).expect("file exists");
        let node = st.inodes.get_mut(&ino).expect("inode exists");
        node.live = bytes.to_vec();
        node.durable = bytes.to_vec();
    }

    /// Removes `name`, durably.
    pub fn delete_file(&self, name: &str) {
        let mut st = self.st.borrow_mut();
        st.live_names.remove(name);
        st.durable_names.remove(name);
    }

    pub fn file_names(&self) -> Vec<String> {
        self.st.borrow().live_names.keys().cloned().collect()
    }
}

impl Storage for CrashStorage {
    fn describe(&self) -> String {
        "crash (in-memory, simulated power cuts)".into()
    }
    fn path_of(&self, name: &str) -> PathBuf {
        PathBuf::from("crash:").join(name)
    }
    fn list(&self) -> io::Result<Vec<String>> {
        let st = self.st.borrow();
        if st.crashed {
            return Err(io::Error::other("simulated crash: the machine is down"));
        }
        Ok(st.live_names.keys().cloned().collect())
    }
    fn open(&self, name: &str, create: bool) -> io::Result<Rc<dyn StorageFile>> {
        let mut st = self.st.borrow_mut();
        let ino = if create {
            st.check(FaultOp::Create)?;
            if st.live_names.contains_key(name) {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            st.next_inode += 1;
            let ino = st.next_inode;
            st.inodes.insert(ino, Inode::default());
            st.live_names.insert(name.to_string(), ino);
            ino
        } else {
            *st.live_names
                .get(name)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?
        };
        Ok(Rc::new(CrashFile {
            st: self.st.clone(),
            ino,
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut st = self.st.borrow_mut();
        if st.crashed {
            return Err(io::Error::other("simulated crash: the machine is down"));
        }
        let ino = st
            .live_names
            .remove(from)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        st.live_names.insert(to.to_string(), ino);
        Ok(())
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        let mut st = self.st.borrow_mut();
        if st.crashed {
            return Err(io::Error::other("simulated crash: the machine is down"));
        }
        st.live_names
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }
    fn sync_dir(&self) -> IoFuture<'_, io::Result<()>> {
        let r = (|| {
            let mut st = self.st.borrow_mut();
            st.check(FaultOp::SyncDir)?;
            st.sync_point()?;
            st.durable_names = st.live_names.clone();
            Ok(())
        })();
        Box::pin(async move {
            tokio::task::yield_now().await;
            r
        })
    }
}

struct CrashFile {
    st: Rc<RefCell<State>>,
    ino: u64,
}

impl StorageFile for CrashFile {
    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.st.borrow().inodes[&self.ino].live.len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.st.borrow_mut();
        st.check(FaultOp::SetLen)?;
        let node = st.inodes.get_mut(&self.ino).expect("inode exists");
        // Length changes are treated as durable at once: the WAL only sizes
        // files before it relies on them, and syncs before naming them.
        node.live.resize(len as usize, 0);
        node.durable.resize(len as usize, 0);
        Ok(())
    }
    fn read_at(&self, offset: u64, len: usize) -> IoFuture<'_, io::Result<Vec<u8>>> {
        let r = {
            let st = self.st.borrow();
            let live = &st.inodes[&self.ino].live;
            let (o, e) = (offset as usize, offset as usize + len);
            if st.crashed {
                Err(io::Error::other("simulated crash: the machine is down"))
            } else if e > live.len() {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of {len} bytes at offset {offset} hit end of file"),
                ))
            } else {
                Ok(live[o..e].to_vec())
            }
        };
        Box::pin(async move { r })
    }
    fn write_at(&self, offset: u64, buf: AlignedBuf) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        let r = (|| {
            let mut st = self.st.borrow_mut();
            st.check(FaultOp::Write)?;
            let node = st.inodes.get_mut(&self.ino).expect("inode exists");
            let end = offset as usize + buf.len();
            if node.live.len() < end {
                node.live.resize(end, 0);
            }
            node.live[offset as usize..end].copy_from_slice(&buf);
            Ok(())
        })();
        Box::pin(async move {
            // Yield so concurrent appends queue up as they would behind real I/O.
            tokio::task::yield_now().await;
            (buf, r)
        })
    }
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>> {
        let r = (|| {
            let mut st = self.st.borrow_mut();
            st.check(FaultOp::SyncData)?;
            st.sync_point()?;
            let node = st.inodes.get_mut(&self.ino).expect("inode exists");
            node.durable = node.live.clone();
            Ok(())
        })();
        Box::pin(async move {
            tokio::task::yield_now().await;
            r
        })
    }
}

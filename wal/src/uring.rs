//! The io_uring backend: one ring per core, driven from the core's tokio
//! runtime. The kernel signals completions on an eventfd registered with the
//! ring; a reaper task (spawned on the core's `LocalSet`) waits on that eventfd
//! through `tokio::io::unix::AsyncFd`, drains the completion queue and wakes the
//! futures of the finished operations.
//!
//! Buffers handed to the kernel are owned by the ring until their completion
//! arrives: an operation's future that is dropped early leaves its buffer in the
//! ring's slot table, and the ring does not free it before the completion.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

use io_uring::{opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tracing::{debug, error, warn};

use crate::buf::{align_down, align_up, AlignedBuf, BLOCK_BYTES};
use crate::storage::{list_dir, open_file, IoFuture, Storage, StorageFile};

/// Default submission-queue depth of a core's ring. The WAL keeps at most a
/// few operations in flight (one flush of two entries, one zero-fill chunk,
/// reads), so this leaves ample room for other users of the ring.
pub const DEFAULT_RING_ENTRIES: u32 = 256;

/// How a durable write is submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Write, wait for it, then submit `fdatasync` (two round trips).
    Fdatasync,
    /// Write and `fdatasync` submitted together, linked (IOSQE_IO_LINK) so the
    /// sync starts when the write completes: one submission, one wake-up.
    LinkedFdatasync,
    /// One write with RWF_DSYNC: durable when it completes (FUA on most disks).
    RwfDsync,
}

/// Whether segment files are opened with O_DIRECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectIo {
    /// O_DIRECT where the filesystem accepts it, buffered elsewhere (tmpfs).
    Auto,
    On,
    Off,
}

/// Knobs of the io_uring backend (the tuning lab sweeps these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringOptions {
    pub ring_entries: u32,
    pub direct: DirectIo,
    pub sync_mode: SyncMode,
}

impl Default for UringOptions {
    fn default() -> UringOptions {
        UringOptions {
            ring_entries: DEFAULT_RING_ENTRIES,
            direct: DirectIo::Auto,
            sync_mode: SyncMode::LinkedFdatasync,
        }
    }
}

enum Slot {
    Free,
    Pending {
        waker: Option<Waker>,
        hold: Option<AlignedBuf>,
    },
    Done {
        res: i32,
        hold: Option<AlignedBuf>,
    },
    /// The future went away; the buffer stays until the kernel is done with it.
    Orphan {
        hold: Option<AlignedBuf>,
    },
}

#[derive(Default)]
struct Slots {
    slots: Vec<Slot>,
    free: Vec<usize>,
    in_flight: usize,
}

impl Slots {
    fn alloc(&mut self, hold: Option<AlignedBuf>) -> usize {
        let slot = Slot::Pending { waker: None, hold };
        self.in_flight += 1;
        if let Some(i) = self.free.pop() {
            self.slots[i] = slot;
            i
        } else {
            self.slots.push(slot);
            self.slots.len() - 1
        }
    }

    fn release(&mut self, i: usize) {
        self.slots[i] = Slot::Free;
        self.free.push(i);
    }

    /// Records a completion; returns the waker to call.
    fn complete(&mut self, i: usize, res: i32) -> Option<Waker> {
        let slot = std::mem::replace(&mut self.slots[i], Slot::Free);
        self.in_flight -= 1;
        match slot {
            Slot::Pending { waker, hold } => {
                self.slots[i] = Slot::Done { res, hold };
                waker
            }
            Slot::Orphan { hold } => {
                drop(hold);
                self.free.push(i);
                None
            }
            Slot::Free | Slot::Done { .. } => {
                panic!("io_uring completion for slot {i} that has no operation in flight")
            }
        }
    }
}

struct Shared {
    ring: RefCell<IoUring>,
    slots: RefCell<Slots>,
    efd: AsyncFd<OwnedFd>,
    closing: Cell<bool>,
    /// False once the reaper task is gone (its runtime shut down): the ring
    /// can then no longer deliver completions and must not be handed out.
    reaper_alive: Cell<bool>,
}

impl Shared {
    fn drain(&self) {
        let mut wakers = Vec::new();
        {
            let mut ring = self.ring.borrow_mut();
            let mut slots = self.slots.borrow_mut();
            for cqe in ring.completion() {
                if let Some(w) = slots.complete(cqe.user_data() as usize, cqe.result()) {
                    wakers.push(w);
                }
            }
        }
        for w in wakers {
            w.wake();
        }
    }

    fn clear_eventfd(&self) {
        let mut v = [0u8; 8];
        loop {
            // SAFETY: reading 8 bytes into a local 8-byte array from an fd we own.
            let n = unsafe { libc::read(self.efd.as_raw_fd(), v.as_mut_ptr().cast(), v.len()) };
            if n < 0 {
                break;
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Buffers of operations still in flight may be in use by the kernel:
        // wait for every completion before they are freed with the slots.
        let ring = self.ring.get_mut();
        let slots = self.slots.get_mut();
        while slots.in_flight > 0 {
            if let Err(e) = ring.submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                error!(error = %e, in_flight = slots.in_flight,
                    "io_uring: cannot wait for in-flight operations; leaking their buffers");
                for s in slots.slots.drain(..) {
                    std::mem::forget(s);
                }
                return;
            }
            for cqe in ring.completion() {
                let _ = slots.complete(cqe.user_data() as usize, cqe.result());
            }
        }
    }
}

struct Handle {
    shared: Rc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.closing.set(true);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to our eventfd, waking the reaper.
        unsafe {
            libc::write(
                self.shared.efd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// A core's io_uring instance. Cheap to clone; every clone shares the ring.
/// Must be created inside a tokio `LocalSet` (its reaper task is spawned there).
#[derive(Clone)]
pub struct Uring {
    handle: Rc<Handle>,
}

thread_local! {
    static THIS_CORE: RefCell<Weak<Handle>> = const { RefCell::new(Weak::new()) };
}

impl Uring {
    /// Creates a ring with `entries` submission slots. Fails when the kernel
    /// lacks io_uring or the opcodes the WAL uses, or forbids it (sysctl, seccomp).
    pub fn new(entries: u32) -> io::Result<Uring> {
        let ring = IoUring::new(entries)?;
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Write::CODE, "WRITE"),
            (opcode::Read::CODE, "READ"),
            (opcode::Fsync::CODE, "FSYNC"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("kernel io_uring lacks the {name} opcode"),
                ));
            }
        }
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(efd.as_raw_fd())?;
        let shared = Rc::new(Shared {
            ring: RefCell::new(ring),
            slots: RefCell::new(Slots::default()),
            // SAFETY: `efd` is an OwnedFd moved into the AsyncFd, so the
            // descriptor stays open and unchanged for the AsyncFd's lifetime.
            efd: unsafe { AsyncFd::register_with_interest(efd, tokio::io::Interest::READABLE) }?,
            closing: Cell::new(false),
            reaper_alive: Cell::new(true),
        });
        tokio::task::spawn_local(reap(ReaperGuard(shared.clone())));
        Ok(Uring {
            handle: Rc::new(Handle { shared }),
        })
    }

    /// The ring of the calling thread (one per core), created on first use
    /// with [`DEFAULT_RING_ENTRIES`] and kept while any clone is alive.
    pub fn for_this_core() -> io::Result<Uring> {
        THIS_CORE.with(|c| {
            if let Some(handle) = c.borrow().upgrade() {
                if handle.shared.reaper_alive.get() {
                    return Ok(Uring { handle });
                }
            }
            let u = Uring::new(DEFAULT_RING_ENTRIES)?;
            *c.borrow_mut() = Rc::downgrade(&u.handle);
            Ok(u)
        })
    }

    fn shared(&self) -> &Rc<Shared> {
        &self.handle.shared
    }

    /// Queues `entries` (each with the buffer it points into, if any) as one
    /// unit and submits them. Their `user_data` is assigned here.
    ///
    /// # Safety
    /// Every pointer in an entry must point into the buffer passed with it (or
    /// into memory that outlives the operation); the buffer's heap allocation
    /// does not move when the buffer is moved into the slot table.
    unsafe fn submit(
        &self,
        entries: Vec<(squeue::Entry, Option<AlignedBuf>)>,
    ) -> io::Result<Vec<Op>> {
        let shared = self.shared();
        let mut ring = shared.ring.borrow_mut();
        let room = |ring: &mut IoUring| {
            let sq = ring.submission();
            sq.capacity() - sq.len()
        };
        if room(&mut ring) < entries.len() {
            ring.submit()?;
            if room(&mut ring) < entries.len() {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "io_uring submission queue full",
                ));
            }
        }
        let mut ops = Vec::with_capacity(entries.len());
        {
            let mut slots = shared.slots.borrow_mut();
            let mut sq = ring.submission();
            for (entry, hold) in entries {
                let idx = slots.alloc(hold);
                let entry = entry.user_data(idx as u64);
                // SAFETY: the caller guarantees the entry's memory stays valid
                // until completion; we checked there is room for all entries.
                unsafe { sq.push(&entry) }.expect("submission queue has room");
                ops.push(Op {
                    shared: shared.clone(),
                    idx,
                    finished: false,
                });
            }
        }
        loop {
            match ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // Completion queue overflowing: let the reaper drain it;
                    // the entries stay queued and go with the next submit.
                    debug!("io_uring submit busy; deferring");
                    break;
                }
                Err(e) => {
                    // The entries sit in the queue and will be submitted with
                    // the next call; their slots keep the buffers alive.
                    return Err(e);
                }
            }
        }
        Ok(ops)
    }
}

struct ReaperGuard(Rc<Shared>);

impl Drop for ReaperGuard {
    fn drop(&mut self) {
        self.0.reaper_alive.set(false);
    }
}

/// Takes the guard as an argument so it drops with the task even if the
/// task is never polled.
async fn reap(guard: ReaperGuard) {
    let shared = &guard.0;
    loop {
        shared.drain();
        if shared.closing.get() && shared.slots.borrow().in_flight == 0 {
            return;
        }
        match shared.efd.readable().await {
            Ok(mut guard) => {
                shared.clear_eventfd();
                guard.clear_ready();
            }
            Err(e) => {
                error!(error = %e, "io_uring eventfd failed; completions can no longer be reaped");
                return;
            }
        }
    }
}

/// One submitted operation; resolves to the kernel's result and the buffer.
struct Op {
    shared: Rc<Shared>,
    idx: usize,
    finished: bool,
}

impl Future for Op {
    type Output = (i32, Option<AlignedBuf>);
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let idx = self.idx;
        // The kernel often completes a write inside the submitting call (on
        // the reference VM, a whole O_DIRECT write): reap the queue here
        // rather than park until the eventfd wakes the reaper task, which
        // would cost a wake-up and a task hand-off.
        let pending = matches!(self.shared.slots.borrow().slots[idx], Slot::Pending { .. });
        if pending {
            self.shared.drain();
        }
        let out = {
            let mut slots = self.shared.slots.borrow_mut();
            match &mut slots.slots[idx] {
                Slot::Pending { waker, .. } => {
                    *waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Slot::Done { res, hold } => {
                    let out = (*res, hold.take());
                    slots.release(idx);
                    out
                }
                Slot::Free | Slot::Orphan { .. } => {
                    panic!("io_uring op slot {idx} polled after use")
                }
            }
        };
        self.finished = true;
        Poll::Ready(out)
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut slots = self.shared.slots.borrow_mut();
        match std::mem::replace(&mut slots.slots[self.idx], Slot::Free) {
            Slot::Pending { hold, .. } => slots.slots[self.idx] = Slot::Orphan { hold },
            Slot::Done { hold, .. } => {
                drop(hold);
                slots.release(self.idx);
            }
            other => slots.slots[self.idx] = other,
        }
    }
}

fn result(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// Runs a write of `buf[done..]` at `offset + done` until all is written.
async fn write_all(
    ring: &Uring,
    fd: RawFd,
    offset: u64,
    mut buf: AlignedBuf,
    rw_flags: i32,
) -> (AlignedBuf, io::Result<()>) {
    let mut done = 0usize;
    while done < buf.len() {
        let len = (buf.len() - done) as u32;
        // SAFETY: the pointer is into `buf`'s heap allocation, `done < len`.
        let ptr = unsafe { buf.as_mut_ptr().add(done) };
        let entry = opcode::Write::new(types::Fd(fd), ptr, len)
            .offset(offset + done as u64)
            .rw_flags(rw_flags)
            .build();
        // SAFETY: `ptr` points into `buf`, which moves into the op's slot and
        // stays there until the completion.
        let ops = match unsafe { ring.submit(vec![(entry, Some(buf))]) } {
            Ok(ops) => ops,
            Err(e) => {
                // Submission failed before the kernel saw the entry? The slot
                // keeps the buffer; we cannot get it back, so return a fresh one.
                return (AlignedBuf::with_capacity(0), Err(e));
            }
        };
        let op = ops.into_iter().next().expect("one op");
        let (res, hold) = op.await;
        buf = hold.expect("write op holds its buffer");
        match result(res) {
            Ok(0) => {
                return (
                    buf,
                    Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
                )
            }
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return (buf, Err(e)),
        }
    }
    (buf, Ok(()))
}

async fn fsync(ring: &Uring, fd: RawFd, datasync: bool) -> io::Result<()> {
    let flags = if datasync {
        types::FsyncFlags::DATASYNC
    } else {
        types::FsyncFlags::empty()
    };
    let entry = opcode::Fsync::new(types::Fd(fd)).flags(flags).build();
    // SAFETY: fsync references no memory.
    let ops = unsafe { ring.submit(vec![(entry, None)]) }?;
    let (res, _) = ops.into_iter().next().expect("one op").await;
    result(res).map(|_| ())
}

/// A WAL directory served by a core's ring.
pub struct UringStorage {
    ring: Uring,
    dir: PathBuf,
    dir_file: File,
    opts: UringOptions,
    /// Learned at the first open: whether the filesystem accepts O_DIRECT.
    direct_ok: Cell<Option<bool>>,
}

impl UringStorage {
    pub fn new(dir: &Path, ring: Uring, opts: UringOptions) -> io::Result<UringStorage> {
        std::fs::create_dir_all(dir)?;
        let dir_file = File::open(dir)?;
        Ok(UringStorage {
            ring,
            dir: dir.to_path_buf(),
            dir_file,
            opts,
            direct_ok: Cell::new(None),
        })
    }

    pub fn options(&self) -> UringOptions {
        self.opts
    }
}

impl Storage for UringStorage {
    fn describe(&self) -> String {
        let direct = match (self.opts.direct, self.direct_ok.get()) {
            (DirectIo::Off, _) => "buffered",
            (_, Some(true)) => "O_DIRECT",
            (_, Some(false)) => "buffered (O_DIRECT refused)",
            (_, None) => "O_DIRECT if accepted",
        };
        format!("uring ({direct}, {:?})", self.opts.sync_mode)
    }
    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
    fn list(&self) -> io::Result<Vec<String>> {
        list_dir(&self.dir)
    }
    fn open(&self, name: &str, create: bool) -> io::Result<Rc<dyn StorageFile>> {
        let want_direct = match self.opts.direct {
            DirectIo::Off => false,
            DirectIo::On => true,
            DirectIo::Auto => self.direct_ok.get() != Some(false),
        };
        let path = self.dir.join(name);
        let (file, direct) = open_file(&path, create, want_direct)?;
        if want_direct && !direct {
            if self.opts.direct == DirectIo::On {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{}: filesystem refuses O_DIRECT", path.display()),
                ));
            }
            if self.direct_ok.get().is_none() {
                warn!(dir = %self.dir.display(), "filesystem refuses O_DIRECT; WAL uses buffered I/O");
            }
        }
        if want_direct {
            self.direct_ok.set(Some(direct));
        }
        Ok(Rc::new(UringFile {
            ring: self.ring.clone(),
            file,
            mode: self.opts.sync_mode,
            direct,
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.dir.join(name))
    }
    fn sync_dir(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(fsync(&self.ring, self.dir_file.as_raw_fd(), false))
    }
}

/// A file whose I/O goes through the ring. Public so the tuning lab can drive
/// the exact submissions the WAL uses.
pub struct UringFile {
    ring: Uring,
    file: File,
    mode: SyncMode,
    direct: bool,
}

impl UringFile {
    /// Opens `path` on `ring` outside any WAL (for experiments).
    pub fn open(ring: Uring, path: &Path, direct: bool, mode: SyncMode) -> io::Result<UringFile> {
        let (file, direct) = open_file(path, false, direct)?;
        Ok(UringFile {
            ring,
            file,
            mode,
            direct,
        })
    }

    /// Whether the file was opened with O_DIRECT (the filesystem may refuse it).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn sync_mode(&self) -> SyncMode {
        self.mode
    }

    async fn linked(&self, offset: u64, buf: AlignedBuf) -> (AlignedBuf, io::Result<()>) {
        let fd = self.file.as_raw_fd();
        let mut buf = buf;
        let len = buf.len() as u32;
        let write = opcode::Write::new(types::Fd(fd), buf.as_mut_ptr(), len)
            .offset(offset)
            .build()
            .flags(squeue::Flags::IO_LINK);
        let sync = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        // SAFETY: the write points into `buf`, which its slot owns until the
        // completion; the fsync references no memory.
        let ops = match unsafe { self.ring.submit(vec![(write, Some(buf)), (sync, None)]) } {
            Ok(ops) => ops,
            Err(e) => return (AlignedBuf::with_capacity(0), Err(e)),
        };
        let mut ops = ops.into_iter();
        let (wop, sop) = (ops.next().expect("write op"), ops.next().expect("sync op"));
        let (wres, hold) = wop.await;
        let (sres, _) = sop.await;
        let buf = hold.expect("write op holds its buffer");
        match result(wres) {
            Err(e) => (buf, Err(e)),
            Ok(n) if n == buf.len() => (buf, result(sres).map(|_| ())),
            Ok(n) => {
                // Short write: the linked sync covered only part of it.
                let mut rest = AlignedBuf::with_capacity(buf.len() - n);
                rest.extend_from_slice(&buf[n..]);
                let (_, r) = write_all(&self.ring, fd, offset + n as u64, rest, 0).await;
                if let Err(e) = r {
                    return (buf, Err(e));
                }
                let r = fsync(&self.ring, fd, true).await;
                (buf, r)
            }
        }
    }
}

impl StorageFile for UringFile {
    fn size_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn read_at(&self, offset: u64, len: usize) -> IoFuture<'_, io::Result<Vec<u8>>> {
        Box::pin(async move {
            let start = align_down(offset as usize, BLOCK_BYTES);
            let end = align_up(offset as usize + len, BLOCK_BYTES);
            let mut buf = AlignedBuf::with_capacity(end - start);
            buf.set_len(end - start);
            let mut done = 0usize;
            let fd = self.file.as_raw_fd();
            while done < buf.len() {
                // SAFETY: pointer into `buf`'s allocation, within its length.
                let ptr = unsafe { buf.as_mut_ptr().add(done) };
                let entry = opcode::Read::new(types::Fd(fd), ptr, (buf.len() - done) as u32)
                    .offset((start + done) as u64)
                    .build();
                // SAFETY: `ptr` points into `buf`, owned by the slot until completion.
                let ops = unsafe { self.ring.submit(vec![(entry, Some(buf))]) }?;
                let (res, hold) = ops.into_iter().next().expect("one op").await;
                buf = hold.expect("read op holds its buffer");
                match result(res) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                    Err(e) => return Err(e),
                }
            }
            let from = offset as usize - start;
            if done < from + len {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of {len} bytes at offset {offset} hit end of file"),
                ));
            }
            Ok(buf[from..from + len].to_vec())
        })
    }
    fn write_at(&self, offset: u64, buf: AlignedBuf) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        Box::pin(write_all(&self.ring, self.file.as_raw_fd(), offset, buf, 0))
    }
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>> {
        Box::pin(fsync(&self.ring, self.file.as_raw_fd(), true))
    }
    fn write_durable(
        &self,
        offset: u64,
        buf: AlignedBuf,
    ) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        match self.mode {
            SyncMode::Fdatasync => Box::pin(async move {
                let (buf, r) = write_all(&self.ring, self.file.as_raw_fd(), offset, buf, 0).await;
                if let Err(e) = r {
                    return (buf, Err(e));
                }
                let r = fsync(&self.ring, self.file.as_raw_fd(), true).await;
                (buf, r)
            }),
            SyncMode::LinkedFdatasync => Box::pin(self.linked(offset, buf)),
            SyncMode::RwfDsync => Box::pin(write_all(
                &self.ring,
                self.file.as_raw_fd(),
                offset,
                buf,
                libc::RWF_DSYNC,
            )),
        }
    }
}

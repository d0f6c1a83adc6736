//! The floor of a replicated write when the members' logs share one disk, as
//! they do when a test or benchmark cluster runs its members on one host.
//!
//! One thread per member, each appending to its own file in DIR: 4 KiB
//! O_DIRECT writes carrying RWF_DSYNC, through io_uring as Cairn's WAL does
//! by default (the lab's own ring, one per thread) or through pwritev2, with
//! nothing else around them (no framing, no network, no consensus). The first member
//! leads: it asks the others for append `seq`, makes its own durable, and the
//! write counts once a majority (itself included) has it durable, which is
//! when a Raft leader may commit it. The others make every append asked of
//! them durable: one at a time, or when behind, all they are behind by
//! together, in one RWF_DSYNC write (two where it wraps around the file's
//! end), as a follower appends a batch. Waiting threads poll, yielding the
//! CPU every [`SPINS_PER_YIELD`] checks, as a member's cores do while idle
//! (`--idle-poll-us`).
//!
//! The latency of such a write is the least any replicated store on this disk
//! can give a client writing one key at a time, before it adds a network hop,
//! a request's decoding or an apply; its tail shows what the disk itself does
//! when the members' syncs arrive together.

use crate::buf::{fill_pattern, AlignedBuf};
use crate::engines::{self, open_for_appends, prepare_file, raw_pwrite, raw_uring};
use crate::error::ExperimentError;
use crate::model::{Engine, Experiment, IoMode, LatencySummary, Prealloc, SyncMode};
use crate::safety::{stop_requested, LabDir};
use crate::stats::{median, Recorder};
use io_uring::{opcode, types, IoUring};
use serde::Serialize;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes per append: one page, the size of a small write's WAL flush.
pub const BLOCK_BYTES: usize = 4096;
/// Each member's file, written round and round: small enough to zero-fill in a
/// moment before each round, large enough that the disk sees a log, not one
/// block rewritten.
pub const RING_BYTES: u64 = 32 << 20;
/// Appends in one lap of a member's file.
const LAP_BLOCKS: u64 = RING_BYTES / BLOCK_BYTES as u64;
/// Most members a round may have.
pub const MEMBERS_MAX: usize = 9;
/// Checks of a shared counter between two yields of the CPU while waiting.
pub const SPINS_PER_YIELD: u32 = 64;

/// How each member writes (`--engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReplicaEngine {
    /// Its own io_uring, polled for the completion, as Cairn's WAL by default.
    Uring,
    /// pwritev2, the sync running on the writing thread.
    Pwrite,
}

impl ReplicaEngine {
    /// One member's appends: O_DIRECT, RWF_DSYNC, into zero-filled space,
    /// through the lab's raw engine of that kind.
    pub const fn experiment(self) -> Experiment {
        Experiment {
            engine: match self {
                ReplicaEngine::Uring => Engine::RawUring,
                ReplicaEngine::Pwrite => Engine::RawPwrite,
            },
            io_mode: IoMode::Direct,
            sync_mode: SyncMode::RwfDsync,
            prealloc: Prealloc::ZeroFill,
            block_size_bytes: BLOCK_BYTES,
            queue_depth: 1,
            writers: 1,
            batch_max_bytes: 0,
        }
    }
}

/// One round with a given number of members.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub members: usize,
    /// Writes that reached a majority.
    pub writes: u64,
    pub writes_per_sec: f64,
    /// From the leader asking for an append to a majority having it durable.
    pub latency: LatencySummary,
    /// Whether every member's last appends read back as written.
    pub verified: bool,
    /// Appends each member (the leader first) had made durable when the
    /// round ended.
    pub appended: Vec<u64>,
}

/// Medians over the rounds of one member count.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Medians {
    pub members: usize,
    pub writes_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// What `cairn-tune replicas` measured. Field names are its JSON keys.
#[derive(Debug, Clone, Serialize)]
pub struct Replicas {
    pub dir: String,
    pub engine: Engine,
    pub block_bytes: usize,
    /// Rounds in the order they ran: one member alone, then all of them, and so on.
    pub rounds: Vec<Round>,
    pub alone: Medians,
    pub replicated: Medians,
}

/// Runs `rounds` rounds of `duration` each, alternating one member alone with
/// `members` members, in `lab`.
pub fn run(
    lab: &LabDir,
    engine: ReplicaEngine,
    members: usize,
    duration: Duration,
    rounds: u32,
) -> Result<Replicas, ExperimentError> {
    assert!(
        (1..=MEMBERS_MAX).contains(&members),
        "members {members} outside 1..={MEMBERS_MAX}"
    );
    let kinds: &[usize] = if members == 1 { &[1] } else { &[1, members] };
    let mut all = Vec::new();
    for _ in 0..rounds {
        for &n in kinds {
            all.push(round(lab, engine, n, duration)?);
        }
    }
    let medians = |n: usize| {
        let of =
            |f: fn(&Round) -> f64| median(all.iter().filter(|r| r.members == n).map(f).collect());
        Medians {
            members: n,
            writes_per_sec: of(|r| r.writes_per_sec),
            p50_us: of(|r| r.latency.p50_us),
            p99_us: of(|r| r.latency.p99_us),
            p999_us: of(|r| r.latency.p999_us),
        }
    };
    Ok(Replicas {
        dir: lab.path().display().to_string(),
        engine: engine.experiment().engine,
        block_bytes: BLOCK_BYTES,
        alone: medians(1),
        replicated: medians(members),
        rounds: all,
    })
}

/// What the members' threads share: how far the leader asked, how far each
/// member got, and the first failure.
struct Shared {
    asked: AtomicU64,
    durable: Vec<AtomicU64>,
    done: AtomicBool,
    failure: Mutex<Option<ExperimentError>>,
}

impl Shared {
    fn fail(&self, e: ExperimentError) {
        self.failure.lock().expect("failure lock").get_or_insert(e);
        self.done.store(true, Ordering::Release);
    }

    /// Whether the round is over: it ended, a member failed, or Ctrl-C.
    fn over(&self) -> bool {
        self.done.load(Ordering::Acquire) || stop_requested()
    }
}

/// Ends the round when dropped: however a member's thread ends, a panic
/// included, the others stop waiting for it.
struct EndsRound<'a>(&'a Shared);

impl Drop for EndsRound<'_> {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
    }
}

/// Calls `ready` until it returns true (then true) or `give_up` does (then
/// false), yielding the CPU every [`SPINS_PER_YIELD`] calls.
fn spin_until(mut ready: impl FnMut() -> bool, give_up: impl Fn() -> bool) -> bool {
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        if give_up() {
            return false;
        }
        spins += 1;
        if spins.is_multiple_of(SPINS_PER_YIELD) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn ring_offset(seq: u64) -> u64 {
    seq % LAP_BLOCKS * BLOCK_BYTES as u64
}

/// One round: prepares a file per member, runs them for `duration`, reads the
/// last appends back and removes the files.
pub fn round(
    lab: &LabDir,
    engine: ReplicaEngine,
    members: usize,
    duration: Duration,
) -> Result<Round, ExperimentError> {
    let paths: Vec<PathBuf> = (0..members).map(|_| lab.file_path("replica")).collect();
    let result = round_in(&paths, engine.experiment(), duration);
    for p in &paths {
        lab.remove(p);
    }
    result
}

/// A round of one member for each of `paths`.
fn round_in(
    paths: &[PathBuf],
    exp: Experiment,
    duration: Duration,
) -> Result<Round, ExperimentError> {
    let members = paths.len();
    let mut files = Vec::with_capacity(members);
    for p in paths {
        prepare_file(p, exp.prealloc, RING_BYTES)?;
        files.push(open_for_appends(p, exp.io_mode, false)?);
    }
    let shared = Shared {
        asked: AtomicU64::new(0),
        durable: (0..members).map(|_| AtomicU64::new(0)).collect(),
        done: AtomicBool::new(false),
        failure: Mutex::new(None),
    };
    let (rec, elapsed) = std::thread::scope(|s| {
        for (m, (file, path)) in files.iter().zip(paths).enumerate().skip(1) {
            let shared = &shared;
            s.spawn(move || {
                let _ends = EndsRound(shared);
                if let Err(e) = follow(shared, m, &exp, file, path) {
                    shared.fail(e);
                }
            });
        }
        let _ends = EndsRound(&shared);
        lead(&shared, &exp, &files[0], &paths[0], duration)
    })?;
    if let Some(e) = shared.failure.lock().expect("failure lock").take() {
        return Err(e);
    }
    let appended: Vec<u64> = shared
        .durable
        .iter()
        .map(|d| d.load(Ordering::Acquire))
        .collect();
    let mut verified = true;
    for (path, &n) in paths.iter().zip(&appended) {
        verified &= engines::verify_ring(path, BLOCK_BYTES, n, RING_BYTES)?;
    }
    let m = rec.finish(elapsed, verified);
    Ok(Round {
        members,
        writes: m.appends,
        writes_per_sec: m.appends_per_sec,
        latency: m.latency,
        verified,
        appended,
    })
}

/// The leader's loop: asks for the next append, makes its own durable and
/// waits for a majority. Returns the latencies and how long it ran.
fn lead(
    shared: &Shared,
    exp: &Experiment,
    file: &File,
    path: &Path,
    duration: Duration,
) -> Result<(Recorder, Duration), ExperimentError> {
    let others_needed = shared.durable.len() / 2;
    let mut writer = Writer::new(exp, file, path)?;
    let mut rec = Recorder::new();
    let start = Instant::now();
    let mut seq = 0u64;
    while start.elapsed() < duration && !shared.over() {
        let t0 = Instant::now();
        shared.asked.store(seq + 1, Ordering::Release);
        writer.append(seq, seq + 1)?;
        shared.durable[0].store(seq + 1, Ordering::Release);
        let majority = || {
            let have = shared.durable[1..]
                .iter()
                .filter(|d| d.load(Ordering::Acquire) > seq)
                .count();
            have >= others_needed
        };
        if !spin_until(majority, || shared.over()) {
            break;
        }
        rec.record(t0.elapsed());
        seq += 1;
    }
    if stop_requested() {
        return Err(ExperimentError::Interrupted);
    }
    // A member that failed ended the loop; the caller reports its error.
    Ok((rec, start.elapsed()))
}

/// A follower's loop: makes durable everything the leader asked for, all it
/// is behind by at once.
fn follow(
    shared: &Shared,
    m: usize,
    exp: &Experiment,
    file: &File,
    path: &Path,
) -> Result<(), ExperimentError> {
    let mut writer = Writer::new(exp, file, path)?;
    let mut next = 0u64;
    loop {
        let asked = || shared.asked.load(Ordering::Acquire) > next;
        if !spin_until(asked, || shared.over()) {
            return Ok(());
        }
        let upto = shared.asked.load(Ordering::Acquire);
        writer.append(next, upto)?;
        next = upto;
        shared.durable[m].store(next, Ordering::Release);
    }
}

/// One member's durable appends through the round's engine.
struct Writer<'a> {
    exp: &'a Experiment,
    file: &'a File,
    path: &'a Path,
    /// The member's own ring, when the engine is io_uring; `None` there once
    /// it failed (and was leaked with a write perhaps in flight).
    ring: Option<IoUring>,
    /// The blocks being written; the ring reads them until the write completes.
    buf: AlignedBuf,
}

impl<'a> Writer<'a> {
    fn new(exp: &'a Experiment, file: &'a File, path: &'a Path) -> Result<Self, ExperimentError> {
        let ring = match exp.engine {
            Engine::RawUring => Some(IoUring::new(2).map_err(raw_uring::uring_unavailable)?),
            _ => None,
        };
        Ok(Writer {
            exp,
            file,
            path,
            ring,
            buf: AlignedBuf::zeroed(BLOCK_BYTES),
        })
    }

    /// Makes appends `from..to` durable: written together, one RWF_DSYNC
    /// write for each stretch of the file they cover (two where they wrap
    /// around its end). Appends more than a lap behind `to` are left out:
    /// later ones take their blocks.
    fn append(&mut self, from: u64, to: u64) -> Result<(), ExperimentError> {
        let mut seq = from.max(to.saturating_sub(LAP_BLOCKS));
        while seq < to {
            let blocks = (to - seq).min(LAP_BLOCKS - seq % LAP_BLOCKS);
            self.write_durable(seq, blocks as usize)?;
            seq += blocks;
        }
        Ok(())
    }

    /// Writes appends `first..first + blocks`, contiguous in the file, with
    /// RWF_DSYNC, and returns once they are durable. Through io_uring the
    /// thread polls for the completion as a member's core does.
    fn write_durable(&mut self, first: u64, blocks: usize) -> Result<(), ExperimentError> {
        let offset = ring_offset(first);
        let len = blocks * BLOCK_BYTES;
        if self.buf.len() < len {
            // No write is in flight between calls: the old buffer is free.
            self.buf = AlignedBuf::zeroed(len);
        }
        for (i, block) in self.buf.as_mut_slice()[..len]
            .chunks_exact_mut(BLOCK_BYTES)
            .enumerate()
        {
            fill_pattern(block, first + i as u64);
        }
        if self.exp.engine != Engine::RawUring {
            let data = &self.buf.as_slice()[..len];
            return raw_pwrite::durable_write(self.file, self.path, self.exp, data, offset);
        }
        let Some(ring) = self.ring.as_mut() else {
            return Err(ExperimentError::EngineUnavailable {
                engine: Engine::RawUring.name(),
                reason: "this member's ring failed earlier".into(),
            });
        };
        let write = opcode::Write::new(
            types::Fd(self.file.as_raw_fd()),
            self.buf.as_ptr(),
            len as u32,
        )
        .offset(offset)
        .rw_flags(libc::RWF_DSYNC)
        .build();
        // SAFETY: the write reads `self.buf`, which is neither touched nor
        // freed until the write's completion has been reaped below; if the
        // ring fails, both the ring and the buffer are leaked instead. The
        // ring holds one entry at a time.
        unsafe { ring.submission().push(&write) }.expect("an empty ring has room");
        let submitted = loop {
            match ring.submit() {
                Ok(n) => break Ok(n),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => break Err(e),
            }
        };
        if submitted.as_ref().ok() != Some(&1) {
            // The write may be in flight, or still queued: neither its
            // buffer nor the ring's memory may be freed under it.
            std::mem::forget(self.ring.take());
            let block = AlignedBuf::zeroed(BLOCK_BYTES);
            std::mem::forget(std::mem::replace(&mut self.buf, block));
            let e = submitted
                .err()
                .unwrap_or_else(|| std::io::Error::other("io_uring_enter submitted nothing"));
            return Err(ExperimentError::from_io(
                "io_uring_enter",
                self.path,
                offset,
                e,
            ));
        }
        // The ring is a default one (no DEFER_TASKRUN): the kernel posts the
        // completion through task work that interrupts this thread, and the
        // yields enter the kernel too, so polling the queue sees it.
        let mut result = None;
        spin_until(
            || {
                result = ring.completion().next().map(|c| c.result());
                result.is_some()
            },
            || false,
        );
        match result.expect("polled until a completion came") {
            n if n as usize == len => Ok(()),
            n if n < 0 => Err(raw_uring::op_error(
                self.exp,
                self.path,
                "io_uring write",
                offset,
                n,
            )),
            n => Err(ExperimentError::short_write(
                "io_uring write",
                self.path,
                offset,
                n.into(),
            )),
        }
    }
}

/// The table `cairn-tune replicas` prints.
pub fn render(r: &Replicas) -> String {
    let mut out = format!(
        "replicated writes in {}: each member appends {} B blocks (O_DIRECT, RWF_DSYNC, {}) to its own file there; a write counts once a majority has it durable\n",
        r.dir, r.block_bytes, r.engine
    );
    out.push_str("| round | members | writes/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | read back |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (i, round) in r.rounds.iter().enumerate() {
        let l = &round.latency;
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} |\n",
            i / 2 + 1,
            round.members,
            round.writes_per_sec,
            l.p50_us,
            l.p90_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            if round.verified { "ok" } else { "MISMATCH" }
        ));
    }
    for m in [&r.alone, &r.replicated] {
        out.push_str(&format!(
            "median, {} member(s): {:.0} writes/s, p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs\n",
            m.members, m.writes_per_sec, m.p50_us, m.p99_us, m.p999_us
        ));
    }
    out
}

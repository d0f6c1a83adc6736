//! The lab's own io_uring engine on the `io-uring` crate: one writer keeping up to
//! `queue_depth` appends in flight. It is the floor under Cairn's io_uring backend:
//! the same kernel interface without framing, CRC or group commit.

use super::{open_for_appends, RunLimits};
use crate::buf::{fill_pattern, AlignedBuf};
use crate::error::ExperimentError;
use crate::model::{Experiment, IoMode, Measurement, SyncMode};
use crate::safety::stop_requested;
use crate::stats::Recorder;
use io_uring::{opcode, squeue, types, IoUring};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

/// Most appends one writer keeps in flight (the matrix's largest queue depth).
pub const QUEUE_DEPTH_MAX: u32 = 256;

/// Why io_uring cannot be used here, with the sysctl that usually explains it.
pub fn uring_unavailable(e: std::io::Error) -> ExperimentError {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| format!("; kernel.io_uring_disabled = {}", s.trim()))
        .unwrap_or_default();
    ExperimentError::Unsupported {
        what: "io_uring".into(),
        reason: format!("io_uring_setup failed: {e}{sysctl}"),
    }
}

/// Whether io_uring can be set up in this process at all.
pub fn probe() -> Result<(), ExperimentError> {
    IoUring::new(2).map(drop).map_err(uring_unavailable)
}

struct Slot {
    buf: AlignedBuf,
    seq: u64,
    start: Instant,
}

/// Marks a completion as the sync half of a linked pair.
const SYNC_BIT: u64 = 1;

fn user_data(slot: usize, sync: bool) -> u64 {
    ((slot as u64) << 1) | if sync { SYNC_BIT } else { 0 }
}

pub fn run(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
) -> Result<(Measurement, u64), ExperimentError> {
    assert!(
        (1..=QUEUE_DEPTH_MAX).contains(&exp.queue_depth),
        "queue depth {} outside 1..={QUEUE_DEPTH_MAX}",
        exp.queue_depth
    );
    let file = open_for_appends(path, exp.io_mode, exp.sync_mode == SyncMode::ODsync)?;
    let qd = exp.queue_depth as usize;
    let entries = (2 * qd).next_power_of_two() as u32;
    let mut ring = IoUring::new(entries).map_err(uring_unavailable)?;
    let mut slots: Vec<Slot> = (0..qd)
        .map(|_| Slot {
            buf: AlignedBuf::zeroed(exp.block_size_bytes),
            seq: 0,
            start: Instant::now(),
        })
        .collect();
    let fd = types::Fd(file.as_raw_fd());
    let result = if exp.sync_mode.durable_per_write() {
        run_per_write(exp, path, limits, &mut ring, &mut slots, fd)
    } else {
        run_batched(exp, path, limits, &mut ring, &mut slots, fd)
    };
    match result {
        Ok(r) => Ok(r),
        Err(RingError::Op(e)) => Err(e),
        Err(RingError::Lost(e)) => {
            // The ring may still own buffers we cannot account for: leak them
            // rather than free memory the kernel might write... or read.
            std::mem::forget(slots);
            std::mem::forget(ring);
            Err(e)
        }
    }
}

enum RingError {
    /// An operation failed; every buffer is back in our hands.
    Op(ExperimentError),
    /// The ring itself failed; buffers may still be in flight.
    Lost(ExperimentError),
}

pub(crate) fn op_error(
    exp: &Experiment,
    path: &Path,
    op: &'static str,
    offset: u64,
    res: i32,
) -> ExperimentError {
    let e = std::io::Error::from_raw_os_error(-res);
    if res == -libc::EOPNOTSUPP && exp.sync_mode == SyncMode::RwfDsync {
        return ExperimentError::Unsupported {
            what: "RWF_DSYNC".into(),
            reason: format!("io_uring write on {} returned EOPNOTSUPP", path.display()),
        };
    }
    if exp.io_mode == IoMode::Direct {
        ExperimentError::from_mode_io(op, "O_DIRECT", path, offset, e)
    } else {
        ExperimentError::from_io(op, path, offset, e)
    }
}

fn submit_and_wait(ring: &mut IoUring, want: usize, path: &Path) -> Result<(), RingError> {
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                return Err(RingError::Lost(ExperimentError::from_io(
                    "io_uring_enter",
                    path,
                    0,
                    e,
                )))
            }
        }
    }
}

/// O_DSYNC, RWF_DSYNC and linked write+fdatasync: each append is durable on its own
/// completion, and up to `queue_depth` of them are in flight.
fn run_per_write(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
    ring: &mut IoUring,
    slots: &mut [Slot],
    fd: types::Fd,
) -> Result<(Measurement, u64), RingError> {
    let bs = exp.block_size_bytes;
    let linked = exp.sync_mode == SyncMode::Linked;
    let rw_flags = if exp.sync_mode == SyncMode::RwfDsync {
        libc::RWF_DSYNC
    } else {
        0
    };
    let appends_max = limits.appends_max(exp);
    let mut free: Vec<usize> = (0..slots.len()).rev().collect();
    let mut rec = Recorder::new();
    let mut next_seq = 0u64;
    let mut in_flight = 0usize;
    let mut first_error: Option<ExperimentError> = None;
    let start = Instant::now();
    loop {
        let may_submit =
            first_error.is_none() && !stop_requested() && start.elapsed() < limits.duration;
        while may_submit && next_seq < appends_max {
            let Some(i) = free.pop() else { break };
            let slot = &mut slots[i];
            slot.seq = next_seq;
            fill_pattern(slot.buf.as_mut_slice(), next_seq);
            let offset = next_seq * bs as u64;
            let mut write = opcode::Write::new(fd, slot.buf.as_ptr(), bs as u32)
                .offset(offset)
                .rw_flags(rw_flags)
                .build()
                .user_data(user_data(i, false));
            if linked {
                write = write.flags(squeue::Flags::IO_LINK);
            }
            let sync = opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(user_data(i, true));
            slot.start = Instant::now();
            // SAFETY: the buffer belongs to slot i, which leaves `free` here and
            // returns to it only after this append's final completion is reaped, so
            // the memory stays allocated and untouched while the kernel reads it.
            // The ring has 2 * queue_depth entries and at most queue_depth appends
            // (two entries each) are queued, so the pushes cannot overflow.
            unsafe {
                let mut sq = ring.submission();
                sq.push(&write)
                    .expect("submission queue sized for queue depth");
                if linked {
                    sq.push(&sync)
                        .expect("submission queue sized for queue depth");
                }
            }
            in_flight += 1;
            next_seq += 1;
        }
        if in_flight == 0 {
            break;
        }
        submit_and_wait(ring, 1, path)?;
        let completions: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in completions {
            let i = (ud >> 1) as usize;
            let is_sync = ud & SYNC_BIT != 0;
            let offset = slots[i].seq * bs as u64;
            if !is_sync {
                if res < 0 {
                    first_error
                        .get_or_insert_with(|| op_error(exp, path, "io_uring write", offset, res));
                } else if res as usize != bs {
                    first_error.get_or_insert_with(|| {
                        ExperimentError::short_write("io_uring write", path, offset, res.into())
                    });
                }
                if linked {
                    continue; // the sync completion finishes this append
                }
            } else if res < 0 && res != -libc::ECANCELED {
                first_error
                    .get_or_insert_with(|| op_error(exp, path, "io_uring fdatasync", offset, res));
            }
            rec.record(slots[i].start.elapsed());
            rec.syncs += 1;
            free.push(i);
            in_flight -= 1;
        }
    }
    if let Some(e) = first_error {
        return Err(RingError::Op(e));
    }
    if stop_requested() {
        return Err(RingError::Op(ExperimentError::Interrupted));
    }
    Ok((rec.finish(start.elapsed(), true), next_seq))
}

/// fdatasync/fsync as separate operations: `queue_depth` writes go out together,
/// then one sync makes them all durable; each append's latency runs to that sync.
fn run_batched(
    exp: &Experiment,
    path: &Path,
    limits: &RunLimits,
    ring: &mut IoUring,
    slots: &mut [Slot],
    fd: types::Fd,
) -> Result<(Measurement, u64), RingError> {
    let bs = exp.block_size_bytes;
    let appends_max = limits.appends_max(exp);
    let sync_flags = if exp.sync_mode == SyncMode::Fdatasync {
        types::FsyncFlags::DATASYNC
    } else {
        types::FsyncFlags::empty()
    };
    let mut rec = Recorder::new();
    let mut seq = 0u64;
    let start = Instant::now();
    while seq < appends_max && start.elapsed() < limits.duration {
        if stop_requested() {
            return Err(RingError::Op(ExperimentError::Interrupted));
        }
        let k = (slots.len() as u64).min(appends_max - seq) as usize;
        let batch_start = Instant::now();
        for (j, slot) in slots[..k].iter_mut().enumerate() {
            slot.seq = seq + j as u64;
            fill_pattern(slot.buf.as_mut_slice(), slot.seq);
            let write = opcode::Write::new(fd, slot.buf.as_ptr(), bs as u32)
                .offset(slot.seq * bs as u64)
                .build()
                .user_data(user_data(j, false));
            // SAFETY: slot j's buffer is not touched again until all k write
            // completions of this batch are reaped below; k <= queue_depth fits.
            unsafe {
                ring.submission()
                    .push(&write)
                    .expect("submission queue sized for queue depth");
            }
        }
        let mut error = None;
        let mut reaped = 0;
        while reaped < k {
            submit_and_wait(ring, 1, path)?;
            for c in ring.completion() {
                reaped += 1;
                let j = (c.user_data() >> 1) as usize;
                let offset = slots[j].seq * bs as u64;
                if c.result() < 0 {
                    error.get_or_insert_with(|| {
                        op_error(exp, path, "io_uring write", offset, c.result())
                    });
                } else if c.result() as usize != bs {
                    error.get_or_insert_with(|| {
                        ExperimentError::short_write(
                            "io_uring write",
                            path,
                            offset,
                            c.result().into(),
                        )
                    });
                }
            }
        }
        if let Some(e) = error {
            return Err(RingError::Op(e));
        }
        let sync = opcode::Fsync::new(fd)
            .flags(sync_flags)
            .build()
            .user_data(user_data(0, true));
        // SAFETY: an fsync entry references no memory; one entry fits the ring.
        unsafe {
            ring.submission()
                .push(&sync)
                .expect("submission queue has room");
        }
        let mut done = false;
        while !done {
            submit_and_wait(ring, 1, path)?;
            for c in ring.completion() {
                done = true;
                if c.result() < 0 {
                    return Err(RingError::Op(op_error(
                        exp,
                        path,
                        "io_uring fsync",
                        seq * bs as u64,
                        c.result(),
                    )));
                }
            }
        }
        let latency = batch_start.elapsed();
        for _ in 0..k {
            rec.record(latency);
        }
        rec.syncs += 1;
        seq += k as u64;
    }
    Ok((rec.finish(start.elapsed(), true), seq))
}

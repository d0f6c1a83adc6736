//! The send side: frames queued within the queue's limits, the handle's
//! message sends, and the writer that drains the queue with vectored writes.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::{
    closed_error, CloseReason, Counters, Link, LinkShared, OutFrame, SendError,
    CONTROL_HEADROOM_FRAMES,
};
use crate::frame::{encode_header, FrameKind, HEADER_BYTES};

impl LinkShared {
    pub(super) fn enqueue(
        &self,
        kind: FrameKind,
        flags: u16,
        shard_id: u32,
        first: Bytes,
        rest: Vec<Bytes>,
        control: bool,
    ) -> Result<(), SendError> {
        if self.closed.get() {
            return Err(closed_error(self));
        }
        let payload_bytes = first.len() + rest.iter().map(Bytes::len).sum::<usize>();
        if payload_bytes > self.config.max_frame_payload_bytes as usize {
            return Err(SendError::TooLarge {
                shard_id,
                len_bytes: payload_bytes,
                max_bytes: self.config.max_frame_payload_bytes,
            });
        }
        let wire_bytes = HEADER_BYTES + payload_bytes;
        let mut q = self.queue.borrow_mut();
        let full = if control {
            q.queued_frames >= self.config.send_queue_max_frames + CONTROL_HEADROOM_FRAMES
        } else {
            q.queued_frames >= self.config.send_queue_max_frames
                || q.queued_bytes + wire_bytes > self.config.send_queue_max_bytes
        };
        if full {
            return Err(SendError::QueueFull {
                peer_member: self.peer_member,
                lane: self.lane,
                queued_frames: q.queued_frames,
                queued_bytes: q.queued_bytes,
            });
        }
        let header = if rest.is_empty() {
            encode_header(kind, flags, shard_id, std::slice::from_ref(&first))
        } else {
            let mut parts = Vec::with_capacity(rest.len() + 1);
            parts.push(first.clone());
            parts.extend(rest.iter().cloned());
            encode_header(kind, flags, shard_id, &parts)
        };
        q.frames.push_back(OutFrame {
            header,
            first,
            rest,
            wire_bytes,
        });
        q.queued_frames += 1;
        q.queued_bytes += wire_bytes;
        if q.writer_waiting {
            q.writer_waiting = false;
            self.writer_wake.notify_one();
        }
        Ok(())
    }

    /// Queues a frame, waiting for room; fails only if the link closes, or
    /// (with `epoch`) if the connection of that epoch ends.
    pub(super) async fn enqueue_wait(
        &self,
        kind: FrameKind,
        shard_id: u32,
        first: Bytes,
        rest: Vec<Bytes>,
        epoch: Option<u64>,
    ) -> Result<(), SendError> {
        loop {
            if let Some(e) = epoch {
                if self.epoch.get() != e {
                    return Err(closed_error(self));
                }
            }
            match self.enqueue(kind, 0, shard_id, first.clone(), rest.clone(), false) {
                Err(SendError::QueueFull { .. }) => {
                    tokio::select! {
                        _ = self.space_wake.notified() => {}
                        _ = self.state_wake.notified() => {}
                    }
                }
                other => return other,
            }
        }
    }
}

impl Link {
    /// Queues one message frame. Never waits: a full queue is refused at once.
    pub fn send(&self, shard_id: u32, flags: u16, payload: Bytes) -> Result<(), SendError> {
        self.count_refusal(self.shared.enqueue(
            FrameKind::Message,
            flags,
            shard_id,
            payload,
            Vec::new(),
            false,
        ))
    }

    fn count_refusal(&self, result: Result<(), SendError>) -> Result<(), SendError> {
        if let Err(SendError::QueueFull { .. }) = &result {
            Counters::add(&self.shared.counters.queue_full_drops, 1);
        }
        result
    }

    /// Queues one message frame whose payload is the concatenation of `parts`
    /// (say an encoded message header and the entry data it refers to); the
    /// parts are written as they are, never copied together.
    pub fn send_parts(
        &self,
        shard_id: u32,
        flags: u16,
        mut parts: Vec<Bytes>,
    ) -> Result<(), SendError> {
        let first = if parts.is_empty() {
            Bytes::new()
        } else {
            parts.remove(0)
        };
        self.count_refusal(self.shared.enqueue(
            FrameKind::Message,
            flags,
            shard_id,
            first,
            parts,
            false,
        ))
    }

    /// Queues one message frame, waiting while the queue is full.
    pub async fn send_wait(
        &self,
        shard_id: u32,
        flags: u16,
        payload: Bytes,
    ) -> Result<(), SendError> {
        loop {
            match self.shared.enqueue(
                FrameKind::Message,
                flags,
                shard_id,
                payload.clone(),
                Vec::new(),
                false,
            ) {
                Err(SendError::QueueFull { .. }) => {
                    tokio::select! {
                        _ = self.shared.space_wake.notified() => {}
                        _ = self.shared.state_wake.notified() => {}
                    }
                }
                other => return other,
            }
        }
    }
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    shared: &LinkShared,
    wr: &mut W,
) -> CloseReason {
    let mut batch: VecDeque<OutFrame> = VecDeque::new();
    loop {
        loop {
            if shared.closed.get() {
                return CloseReason::LocalClose;
            }
            let taken = {
                let mut q = shared.queue.borrow_mut();
                if q.frames.is_empty() {
                    q.writer_waiting = true;
                    false
                } else {
                    std::mem::swap(&mut q.frames, &mut batch);
                    true
                }
            };
            if taken {
                break;
            }
            shared.writer_wake.notified().await;
        }
        let batch_bytes: usize = batch.iter().map(|f| f.wire_bytes).sum();
        let result = write_batch(
            wr,
            &batch,
            shared.config.writev_max_slices,
            &shared.counters.writes,
        )
        .await;
        let (written_frames, written_bytes) = match &result {
            Ok(()) => (batch.len(), batch_bytes),
            Err((frames, bytes, _)) => (*frames, *bytes),
        };
        Counters::add(&shared.counters.frames_sent, written_frames as u64);
        Counters::add(&shared.counters.bytes_sent, written_bytes as u64);
        Counters::add(
            &shared.counters.disconnect_drops,
            (batch.len() - written_frames) as u64,
        );
        {
            let mut q = shared.queue.borrow_mut();
            q.queued_frames -= batch.len();
            q.queued_bytes -= batch_bytes;
        }
        batch.clear();
        shared.space_wake.notify_waiters();
        if let Err((_, _, err)) = result {
            return CloseReason::Io(err);
        }
    }
}

/// Writes a batch with vectored writes of up to `max_slices` slices: each
/// frame's header, then its payload parts, straight from their buffers. On
/// error returns how many whole frames and bytes made it.
async fn write_batch<W: AsyncWrite + Unpin>(
    wr: &mut W,
    batch: &VecDeque<OutFrame>,
    max_slices: usize,
    writes: &AtomicU64,
) -> Result<(), (usize, usize, io::Error)> {
    let mut index = 0usize;
    let mut offset = 0usize;
    let mut written_total = 0usize;
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(max_slices.min(2 * batch.len() + 8));
    while index < batch.len() {
        slices.clear();
        let mut skip = offset;
        for frame in batch.range(index..) {
            let segments = std::iter::once(&frame.header[..])
                .chain(std::iter::once(&frame.first[..]))
                .chain(frame.rest.iter().map(|b| &b[..]));
            for segment in segments {
                if skip >= segment.len() {
                    skip -= segment.len();
                    continue;
                }
                if slices.len() == max_slices {
                    break;
                }
                slices.push(IoSlice::new(&segment[skip..]));
                skip = 0;
            }
            if slices.len() == max_slices {
                break;
            }
        }
        Counters::add(writes, 1);
        let mut n = match wr.write_vectored(&slices).await {
            Ok(0) => {
                return Err((
                    index,
                    written_total,
                    io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes"),
                ));
            }
            Ok(n) => n,
            Err(err) => return Err((index, written_total, err)),
        };
        written_total += n;
        while n > 0 {
            let remaining = batch[index].wire_bytes - offset;
            if n >= remaining {
                n -= remaining;
                index += 1;
                offset = 0;
            } else {
                offset += n;
                n = 0;
            }
        }
    }
    // A TLS session may hold the last records until flushed (plain TCP: a no-op).
    wr.flush().await.map_err(|err| (index, written_total, err))
}

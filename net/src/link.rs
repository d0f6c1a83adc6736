//! Links: the per-(peer member, lane) connection with its bounded send queue,
//! vectored writer, zero-copy reader, reconnecting dialer and stream transfers.
//!
//! Everything here lives on one core's single-threaded runtime (`Rc`, `RefCell`,
//! `spawn_local`); only [`Counters`] and [`crate::Accepted`] cross threads.
//!
//! Back of the envelope for one link on this machine class (2 cores, loopback):
//! loopback TCP moves a few GB/s per core pair, CRC32 with carry-less multiply
//! runs at well over 10 GB/s, so at 64 KiB frames the framing cost (one CRC pass
//! on each side, one header per 64 KiB) should stay within a few percent of the
//! raw socket. At 256-byte frames the socket moves only ~280 MB/s at 1 M frames/s,
//! so the cost is per frame: a queue push and a 276-byte CRC on send (~50 ns),
//! two iovecs per frame in a writev of up to 1024, and on receive a header check,
//! a CRC and a refcount increment per frame (~50 ns). That leaves room for the
//! 1 M frames/s target on one core per side.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::config::{Config, ConfigError};
use crate::frame::{encode_header, Frame, FrameDecoder, FrameError, FrameKind, HEADER_BYTES};
use crate::handshake::{apply_socket_options, dial_greeting, Accepted, AcceptedStream};
use crate::stream::{
    self, RxStream, StreamAbortReason, StreamError, StreamReport, StreamSource, TxStream,
};
use crate::tls::{ClientTlsStream, PeerSocket, ServerTlsStream};

/// Control frames (stream acks and verdicts) may exceed the frame count limit
/// by this much, so flow control never deadlocks behind a full data queue.
/// They are produced at most one per socket read, so this bounds them.
pub const CONTROL_HEADROOM_FRAMES: usize = 64;

/// Transport counters for metrics. Shared (`Arc`) so a metrics thread can read
/// them while the core updates them.
#[derive(Debug, Default)]
pub struct Counters {
    pub bytes_sent: AtomicU64,
    pub frames_sent: AtomicU64,
    /// Write system calls; frames_sent / writes is the coalescing factor.
    pub writes: AtomicU64,
    pub bytes_received: AtomicU64,
    pub frames_received: AtomicU64,
    /// Sends refused at once because the queue was full.
    pub queue_full_drops: AtomicU64,
    /// Frames queued but lost when a connection ended mid-write.
    pub disconnect_drops: AtomicU64,
    /// Successful connections after the first one.
    pub reconnects: AtomicU64,
    /// Failed connects and handshakes.
    pub connect_failures: AtomicU64,
    /// Connections closed because the peer sent bytes that are not valid frames.
    pub bad_input_closes: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub bytes_sent: u64,
    pub frames_sent: u64,
    pub writes: u64,
    pub bytes_received: u64,
    pub frames_received: u64,
    pub queue_full_drops: u64,
    pub disconnect_drops: u64,
    pub reconnects: u64,
    pub connect_failures: u64,
    pub bad_input_closes: u64,
}

impl Counters {
    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            bytes_sent: get(&self.bytes_sent),
            frames_sent: get(&self.frames_sent),
            writes: get(&self.writes),
            bytes_received: get(&self.bytes_received),
            frames_received: get(&self.frames_received),
            queue_full_drops: get(&self.queue_full_drops),
            disconnect_drops: get(&self.disconnect_drops),
            reconnects: get(&self.reconnects),
            connect_failures: get(&self.connect_failures),
            bad_input_closes: get(&self.bad_input_closes),
        }
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Why a send was refused. Refusals are immediate: the caller decides whether
/// to drop (Raft tolerates a lost message), retry later or wait.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SendError {
    #[error("send queue to member {peer_member} lane {lane} full: {queued_frames} frames, {queued_bytes} bytes queued")]
    QueueFull {
        peer_member: u64,
        lane: u32,
        queued_frames: usize,
        queued_bytes: usize,
    },
    #[error("link to member {peer_member} lane {lane} is closed")]
    Closed { peer_member: u64, lane: u32 },
    #[error("payload of {len_bytes} bytes for shard {shard_id} exceeds the maximum {max_bytes}")]
    TooLarge {
        shard_id: u32,
        len_bytes: usize,
        max_bytes: u32,
    },
}

/// Why a connection ended; logged once per connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CloseReason {
    #[error("peer closed the connection")]
    PeerClosed,
    #[error(
        "peer closed the connection in the middle of a frame ({buffered_bytes} bytes buffered)"
    )]
    EofMidFrame { buffered_bytes: usize },
    #[error("peer stalled mid-frame for {stall_timeout_ms} ms ({buffered_bytes} bytes buffered)")]
    Stalled {
        stall_timeout_ms: u64,
        buffered_bytes: usize,
    },
    #[error("bad input: {0}")]
    BadInput(#[from] FrameError),
    #[error("protocol violation: {0}")]
    ProtocolViolation(String),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("closed locally")]
    LocalClose,
}

impl CloseReason {
    fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Self::BadInput(_)
                | Self::Stalled { .. }
                | Self::ProtocolViolation(_)
                | Self::EofMidFrame { .. }
        )
    }
}

/// What a link delivers to its consumer, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// An opaque message; `payload` is a slice of the receive buffer.
    Message {
        shard_id: u32,
        flags: u16,
        payload: Bytes,
    },
    /// A stream begins (or begins again: drop what an earlier attempt gave).
    StreamStart {
        stream_id: u64,
        shard_id: u32,
        attempt: u32,
    },
    /// The next bytes of the stream; a slice of the receive buffer.
    StreamChunk {
        stream_id: u64,
        shard_id: u32,
        data: Bytes,
    },
    /// The stream ended and its length and checksum matched.
    StreamEnd {
        stream_id: u64,
        shard_id: u32,
        total_bytes: u64,
    },
    /// The stream attempt failed; the sender may start it again.
    StreamAborted {
        stream_id: u64,
        shard_id: u32,
        reason: StreamAbortReason,
    },
}

/// The receiving end of a link: decoded frames in batches, one per socket read.
#[derive(Debug)]
pub struct InboundReceiver {
    rx: mpsc::Receiver<Vec<Inbound>>,
    current: std::vec::IntoIter<Inbound>,
}

impl InboundReceiver {
    /// Next item, `None` once the link is closed for good and drained.
    pub async fn recv(&mut self) -> Option<Inbound> {
        loop {
            if let Some(item) = self.current.next() {
                return Some(item);
            }
            self.current = self.rx.recv().await?.into_iter();
        }
    }

    /// Everything that arrived in one socket read (or what is left of it).
    pub async fn recv_batch(&mut self) -> Option<Vec<Inbound>> {
        let rest: Vec<Inbound> = self.current.by_ref().collect();
        if !rest.is_empty() {
            return Some(rest);
        }
        self.rx.recv().await
    }
}

struct OutFrame {
    header: [u8; HEADER_BYTES],
    first: Bytes,
    rest: Vec<Bytes>,
    wire_bytes: usize,
}

#[derive(Default)]
struct SendQueue {
    frames: VecDeque<OutFrame>,
    /// Frames and bytes queued or in the writer's hands: both count against
    /// the limits until written.
    queued_frames: usize,
    queued_bytes: usize,
    writer_waiting: bool,
}

struct LinkShared {
    config: Config,
    peer_member: u64,
    lane: u32,
    queue: RefCell<SendQueue>,
    writer_wake: Notify,
    space_wake: Notify,
    /// Connection up/down, close, stream acks and verdicts.
    state_wake: Notify,
    counters: Arc<Counters>,
    /// Bumped whenever a connection starts or ends, so a stream attempt can
    /// tell its connection is gone.
    epoch: Cell<u64>,
    connected: Cell<bool>,
    closed: Cell<bool>,
    peer_addr: Cell<Option<SocketAddr>>,
    tx_stream: RefCell<Option<TxStream>>,
    stream_slot: Semaphore,
    next_stream_id: Cell<u64>,
}

impl LinkShared {
    fn new(config: Config, peer_member: u64, lane: u32) -> Self {
        Self {
            config,
            peer_member,
            lane,
            queue: RefCell::new(SendQueue::default()),
            writer_wake: Notify::new(),
            space_wake: Notify::new(),
            state_wake: Notify::new(),
            counters: Arc::new(Counters::default()),
            epoch: Cell::new(0),
            connected: Cell::new(false),
            closed: Cell::new(false),
            peer_addr: Cell::new(None),
            tx_stream: RefCell::new(None),
            stream_slot: Semaphore::new(1),
            next_stream_id: Cell::new(1),
        }
    }

    fn enqueue(
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
    async fn enqueue_wait(
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

    fn close(&self) {
        self.closed.set(true);
        // Frames not yet handed to the writer go now; the writer accounts for
        // the batch it holds itself.
        let dropped = {
            let mut q = self.queue.borrow_mut();
            let dropped = q.frames.len();
            q.queued_frames -= dropped;
            q.queued_bytes -= q.frames.iter().map(|f| f.wire_bytes).sum::<usize>();
            q.frames.clear();
            dropped
        };
        Counters::add(&self.counters.disconnect_drops, dropped as u64);
        self.writer_wake.notify_one();
        self.space_wake.notify_waiters();
        self.state_wake.notify_waiters();
    }

    fn set_connected(&self, connected: bool, peer_addr: Option<SocketAddr>) {
        self.connected.set(connected);
        if peer_addr.is_some() {
            self.peer_addr.set(peer_addr);
        }
        self.epoch.set(self.epoch.get() + 1);
        self.state_wake.notify_waiters();
    }

    fn on_stream_ack(&self, stream_id: u64, chunks: u64) {
        if let Some(tx) = self.tx_stream.borrow_mut().as_mut() {
            if tx.stream_id == stream_id && chunks > tx.acked_chunks {
                tx.acked_chunks = chunks;
                self.state_wake.notify_waiters();
            }
        }
    }

    fn on_stream_result(&self, stream_id: u64, ok: bool) {
        if let Some(tx) = self.tx_stream.borrow_mut().as_mut() {
            if tx.stream_id == stream_id {
                tx.result = Some(ok);
                self.state_wake.notify_waiters();
            }
        }
    }

    fn log_close(&self, reason: &CloseReason) {
        let peer_addr = self
            .peer_addr
            .get()
            .map(|a| a.to_string())
            .unwrap_or_default();
        if reason.is_bad_input() {
            Counters::add(&self.counters.bad_input_closes, 1);
        }
        match reason {
            CloseReason::LocalClose => tracing::debug!(
                local_member = self.config.member_id,
                peer_member = self.peer_member,
                lane = self.lane,
                %peer_addr,
                %reason,
                "closing peer connection"
            ),
            _ => tracing::warn!(
                local_member = self.config.member_id,
                peer_member = self.peer_member,
                lane = self.lane,
                %peer_addr,
                %reason,
                "closing peer connection"
            ),
        }
    }
}

/// The sending handle of a link to one (peer member, lane). Cheap to clone;
/// `!Send`: it belongs to the core that created it.
#[derive(Clone)]
pub struct Link {
    shared: Rc<LinkShared>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peer_member", &self.shared.peer_member)
            .field("lane", &self.shared.lane)
            .field("connected", &self.shared.connected.get())
            .finish()
    }
}

/// Dropping the last handle closes the link (the connection's task holds the
/// only other reference).
impl Drop for Link {
    fn drop(&mut self) {
        if Rc::strong_count(&self.shared) <= 2 {
            self.shared.close();
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

    /// Whether a connection is established right now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.get()
    }

    /// Whether the link is closed for good.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.get()
    }

    /// Frames queued or being written.
    pub fn queued_frames(&self) -> usize {
        self.shared.queue.borrow().queued_frames
    }

    /// Bytes (headers included) queued or being written.
    pub fn queued_bytes(&self) -> usize {
        self.shared.queue.borrow().queued_bytes
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.shared.counters.clone()
    }

    pub fn peer_member(&self) -> u64 {
        self.shared.peer_member
    }

    pub fn lane(&self) -> u32 {
        self.shared.lane
    }

    /// The peer's address of the current (or last) connection.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.shared.peer_addr.get()
    }

    /// Closes the link for good: the connection ends, queued frames are dropped,
    /// a dialer stops reconnecting.
    pub fn close(&self) {
        self.shared.close();
    }

    /// Waits until the link is connected; errors once it is closed for good.
    pub async fn wait_connected(&self) -> Result<(), SendError> {
        self.wait_connected_epoch().await.map(|_| ())
    }

    async fn wait_connected_epoch(&self) -> Result<u64, SendError> {
        loop {
            if self.shared.closed.get() {
                return Err(closed_error(&self.shared));
            }
            if self.shared.connected.get() {
                return Ok(self.shared.epoch.get());
            }
            self.shared.state_wake.notified().await;
        }
    }

    /// Sends a large transfer as a flow-controlled stream of chunks, starting
    /// over from the first byte on failure (see [`crate::stream`]). One stream
    /// at a time per link; concurrent callers wait their turn. While the peer
    /// is unreachable a dialed link waits for it to come back (attempts are
    /// spent only on connections that fail mid-stream), so wrap the call in a
    /// timeout if the transfer has a deadline.
    pub async fn send_stream(
        &self,
        shard_id: u32,
        source: &mut dyn StreamSource,
    ) -> Result<StreamReport, StreamError> {
        let shared = &self.shared;
        let closed = || StreamError::Closed {
            shard_id,
            peer_member: shared.peer_member,
        };
        let _slot = shared.stream_slot.acquire().await.map_err(|_| closed())?;
        let mut last = StreamAbortReason::ConnectionLost;
        for attempt in 1..=shared.config.stream_max_attempts {
            let epoch = self.wait_connected_epoch().await.map_err(|_| closed())?;
            source.rewind().map_err(|source| StreamError::Source {
                shard_id,
                peer_member: shared.peer_member,
                source,
            })?;
            let stream_id = shared.next_stream_id.get();
            shared.next_stream_id.set(stream_id + 1);
            *shared.tx_stream.borrow_mut() = Some(TxStream {
                stream_id,
                ..TxStream::default()
            });
            let outcome = self
                .stream_attempt(shard_id, stream_id, attempt, epoch, source)
                .await;
            *shared.tx_stream.borrow_mut() = None;
            match outcome {
                Ok(report) => return Ok(report),
                Err(AttemptError::Source(source)) => {
                    return Err(StreamError::Source {
                        shard_id,
                        peer_member: shared.peer_member,
                        source,
                    })
                }
                Err(AttemptError::Aborted(reason)) => {
                    if shared.closed.get() {
                        return Err(closed());
                    }
                    tracing::warn!(
                        local_member = shared.config.member_id,
                        peer_member = shared.peer_member,
                        shard = shard_id,
                        stream_id,
                        attempt,
                        %reason,
                        "stream attempt failed; starting over"
                    );
                    last = reason;
                }
            }
        }
        Err(StreamError::AttemptsExhausted {
            shard_id,
            peer_member: shared.peer_member,
            attempts: shared.config.stream_max_attempts,
            last,
        })
    }

    async fn stream_attempt(
        &self,
        shard_id: u32,
        stream_id: u64,
        attempt: u32,
        epoch: u64,
        source: &mut dyn StreamSource,
    ) -> Result<StreamReport, AttemptError> {
        let shared = &self.shared;
        let lost = |_| AttemptError::Aborted(StreamAbortReason::ConnectionLost);
        let chunk_max_bytes = shared.config.stream_chunk_bytes;
        let window = shared.config.stream_window_chunks as u64;
        let prefix = stream::encode_chunk_prefix(stream_id);
        shared
            .enqueue_wait(
                FrameKind::StreamStart,
                shard_id,
                stream::encode_start(stream_id, attempt),
                Vec::new(),
                Some(epoch),
            )
            .await
            .map_err(lost)?;
        let mut hasher = crc32fast::Hasher::new();
        let mut total_bytes = 0u64;
        let mut chunks = 0u64;
        while let Some(mut data) = source
            .next_chunk(chunk_max_bytes)
            .map_err(AttemptError::Source)?
        {
            while !data.is_empty() {
                let piece = data.split_to(data.len().min(chunk_max_bytes));
                loop {
                    if shared.epoch.get() != epoch || shared.closed.get() {
                        return Err(AttemptError::Aborted(StreamAbortReason::ConnectionLost));
                    }
                    let acked = shared
                        .tx_stream
                        .borrow()
                        .as_ref()
                        .map_or(0, |t| t.acked_chunks);
                    if chunks - acked < window {
                        break;
                    }
                    shared.state_wake.notified().await;
                }
                hasher.update(&piece);
                total_bytes += piece.len() as u64;
                chunks += 1;
                shared
                    .enqueue_wait(
                        FrameKind::StreamChunk,
                        shard_id,
                        prefix.clone(),
                        vec![piece],
                        Some(epoch),
                    )
                    .await
                    .map_err(lost)?;
            }
        }
        let crc = hasher.finalize();
        shared
            .enqueue_wait(
                FrameKind::StreamEnd,
                shard_id,
                stream::encode_end(stream_id, total_bytes, crc),
                Vec::new(),
                Some(epoch),
            )
            .await
            .map_err(lost)?;
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(shared.config.stream_result_timeout_ms);
        loop {
            // The verdict first: it may arrive in the same read as the close.
            let verdict = shared.tx_stream.borrow().as_ref().and_then(|t| t.result);
            if verdict.is_none() && (shared.epoch.get() != epoch || shared.closed.get()) {
                return Err(AttemptError::Aborted(StreamAbortReason::ConnectionLost));
            }
            match verdict {
                Some(true) => {
                    return Ok(StreamReport {
                        stream_id,
                        total_bytes,
                        chunks,
                        attempts: attempt,
                        crc,
                    })
                }
                Some(false) => {
                    return Err(AttemptError::Aborted(StreamAbortReason::ChecksumMismatch))
                }
                None => {}
            }
            if tokio::time::timeout_at(deadline, shared.state_wake.notified())
                .await
                .is_err()
            {
                return Err(AttemptError::Aborted(StreamAbortReason::ResultTimeout));
            }
        }
    }
}

enum AttemptError {
    Source(io::Error),
    Aborted(StreamAbortReason),
}

/// Exponential backoff with a cap and "equal jitter": each delay is uniform in
/// `[d/2, d]` where `d` doubles per failure from `initial_ms` up to `max_ms`,
/// so members that lost each other at once do not redial in lockstep.
#[derive(Debug)]
pub struct Backoff {
    initial_ms: u64,
    max_ms: u64,
    failures: u32,
    rng: SmallRng,
}

/// A connection that lasted this long resets the reconnect backoff.
pub const STABLE_CONNECTION_MS: u64 = 1_000;

/// Doublings after which the delay is certainly at its cap (2^32 x initial).
const BACKOFF_MAX_DOUBLINGS: u32 = 32;

impl Backoff {
    pub fn new(initial_ms: u64, max_ms: u64, seed: u64) -> Self {
        assert!(
            initial_ms > 0 && initial_ms <= max_ms,
            "backoff {initial_ms}..{max_ms} ms"
        );
        Self {
            initial_ms,
            max_ms,
            failures: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay_ms(&mut self) -> u64 {
        let doublings = self.failures.min(BACKOFF_MAX_DOUBLINGS);
        let ceiling = self
            .initial_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_ms);
        self.failures = self.failures.saturating_add(1);
        self.rng.gen_range(ceiling / 2..=ceiling)
    }

    /// Forget past failures (after a successful connection).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

fn closed_error(shared: &LinkShared) -> SendError {
    SendError::Closed {
        peer_member: shared.peer_member,
        lane: shared.lane,
    }
}

/// Where a link dials: an address, or a `host:port` looked up again before
/// every connection attempt (a peer's name may not resolve yet when the link
/// starts, and may resolve elsewhere after the peer moves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerTarget {
    Addr(SocketAddr),
    HostPort(String),
}

impl From<SocketAddr> for PeerTarget {
    fn from(addr: SocketAddr) -> Self {
        PeerTarget::Addr(addr)
    }
}

impl std::fmt::Display for PeerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerTarget::Addr(a) => a.fmt(f),
            PeerTarget::HostPort(h) => f.write_str(h),
        }
    }
}

/// Dials `peer_member` at `target` for `lane` and keeps the link up: reconnects
/// with capped, jittered exponential backoff until [`Link::close`] or until the
/// receiver is dropped. Frames queued while disconnected wait (within the
/// queue limits) for the next connection. A host name is looked up off the
/// core's thread, before every attempt.
///
/// Must be called on a `LocalSet` (the core's runtime): the link is `!Send`.
pub fn dial(
    config: &Config,
    peer_member: u64,
    target: impl Into<PeerTarget>,
    lane: u32,
) -> Result<(Link, InboundReceiver), ConfigError> {
    config.validate()?;
    let shared = Rc::new(LinkShared::new(config.clone(), peer_member, lane));
    let (tx, rx) = mpsc::channel(config.inbound_queue_batches);
    tokio::task::spawn_local(supervise(shared.clone(), target.into(), tx));
    Ok((
        Link { shared },
        InboundReceiver {
            rx,
            current: Vec::new().into_iter(),
        },
    ))
}

/// Why [`serve_accepted`] could not take over a connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "binding the connection from member {peer_member} at {peer_addr} to this runtime: {source}"
    )]
    Io {
        peer_member: u64,
        peer_addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Takes over a connection accepted (and handshaken) on any thread and runs it
/// on this core. The link does not reconnect: when the connection ends it is
/// closed and the receiver ends; the peer dials again.
///
/// Must be called on a `LocalSet` (the core's runtime).
pub fn serve_accepted(
    accepted: Accepted,
    config: &Config,
) -> Result<(Link, InboundReceiver), ServeError> {
    config.validate()?;
    let peer_member = accepted.hello.member_id;
    let peer_addr = accepted.peer_addr;
    let io_err = |source| ServeError::Io {
        peer_member,
        peer_addr,
        source,
    };
    let stream = match accepted.stream {
        AcceptedStream::Plain(s) => Connection::Plain(TcpStream::from_std(s).map_err(io_err)?),
        AcceptedStream::Tls(mut session) => {
            session.get_mut().0.attach().map_err(io_err)?;
            Connection::TlsServer(session)
        }
    };
    let shared = Rc::new(LinkShared::new(
        config.clone(),
        peer_member,
        accepted.hello.lane,
    ));
    let (tx, rx) = mpsc::channel(config.inbound_queue_batches);
    shared.set_connected(true, Some(peer_addr));
    let task_shared = shared.clone();
    tokio::task::spawn_local(async move {
        let reason = run_connection(&task_shared, stream, &tx).await;
        task_shared.log_close(&reason);
        task_shared.set_connected(false, None);
        task_shared.close();
    });
    Ok((
        Link { shared },
        InboundReceiver {
            rx,
            current: Vec::new().into_iter(),
        },
    ))
}

/// One connection's socket: plain TCP, or a TLS session on top of it.
enum Connection {
    Plain(TcpStream),
    TlsClient(Box<ClientTlsStream>),
    TlsServer(Box<ServerTlsStream>),
}

impl Connection {
    fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Connection::Plain(s) => s.peer_addr().ok(),
            Connection::TlsClient(s) => s.get_ref().0.peer_addr().ok(),
            Connection::TlsServer(s) => s.get_ref().0.peer_addr().ok(),
        }
    }
}

async fn connect(shared: &LinkShared, target: &PeerTarget) -> Result<Connection, String> {
    let config = &shared.config;
    // tokio resolves a name on its blocking pool and tries each address.
    let connecting = async {
        match target {
            PeerTarget::Addr(a) => TcpStream::connect(a).await,
            PeerTarget::HostPort(h) => TcpStream::connect(h.as_str()).await,
        }
    };
    let mut stream =
        tokio::time::timeout(Duration::from_millis(config.connect_timeout_ms), connecting)
            .await
            .map_err(|_| format!("connect timed out after {} ms", config.connect_timeout_ms))?
            .map_err(|e| format!("connect: {e}"))?;
    apply_socket_options(&stream, config).map_err(|e| format!("socket options: {e}"))?;
    let peer_addr = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let Some(tls) = &config.tls else {
        dial_greeting(
            &mut stream,
            peer_addr,
            config,
            shared.peer_member,
            shared.lane,
        )
        .await
        .map_err(|e| e.to_string())?;
        return Ok(Connection::Plain(stream));
    };
    let server_name = match target {
        PeerTarget::Addr(a) => rustls::pki_types::ServerName::IpAddress(a.ip().into()),
        PeerTarget::HostPort(h) => crate::tls::server_name_of(h)?,
    };
    let client_config = tls.0.client_config()?;
    let handshake = tokio_rustls::TlsConnector::from(client_config)
        .connect(server_name, PeerSocket::new(stream));
    let mut session = tokio::time::timeout(
        Duration::from_millis(config.handshake_timeout_ms),
        handshake,
    )
    .await
    .map_err(|_| {
        format!(
            "TLS handshake timed out after {} ms",
            config.handshake_timeout_ms
        )
    })?
    .map_err(|e| format!("TLS handshake: {e}"))?;
    session
        .get_mut()
        .1
        .set_buffer_limit(Some(crate::tls::SEND_BUFFER_BYTES));
    dial_greeting(
        &mut session,
        peer_addr,
        config,
        shared.peer_member,
        shared.lane,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(Connection::TlsClient(Box::new(session)))
}

async fn supervise(shared: Rc<LinkShared>, target: PeerTarget, tx: mpsc::Sender<Vec<Inbound>>) {
    let seed =
        rand::random::<u64>() ^ shared.config.member_id.rotate_left(17) ^ u64::from(shared.lane);
    let mut backoff = Backoff::new(
        shared.config.backoff_initial_ms,
        shared.config.backoff_max_ms,
        seed,
    );
    let mut ever_connected = false;
    let mut failing = false;
    while !shared.closed.get() {
        match connect(&shared, &target).await {
            Ok(stream) => {
                let addr = stream.peer_addr();
                if ever_connected {
                    Counters::add(&shared.counters.reconnects, 1);
                }
                ever_connected = true;
                failing = false;
                tracing::info!(
                    local_member = shared.config.member_id,
                    peer_member = shared.peer_member,
                    lane = shared.lane,
                    peer = %target,
                    peer_addr = %addr.map_or_else(String::new, |a| a.to_string()),
                    "connected to peer"
                );
                shared.set_connected(true, addr);
                let connected_at = tokio::time::Instant::now();
                let reason = run_connection(&shared, stream, &tx).await;
                shared.set_connected(false, None);
                shared.log_close(&reason);
                // Only a connection that lasted forgives past failures: a peer
                // that accepts and at once drops us (or sends garbage) is
                // redialed with growing delays, not in a tight loop.
                if connected_at.elapsed() >= Duration::from_millis(STABLE_CONNECTION_MS) {
                    backoff.reset();
                }
                if matches!(reason, CloseReason::LocalClose) {
                    break;
                }
            }
            Err(error) => {
                Counters::add(&shared.counters.connect_failures, 1);
                // One line when a streak of failures begins; the rest at debug
                // so a dead peer does not flood the log.
                if failing {
                    tracing::debug!(local_member = shared.config.member_id, peer_member = shared.peer_member, lane = shared.lane, peer = %target, %error, "peer still unreachable");
                } else {
                    tracing::warn!(local_member = shared.config.member_id, peer_member = shared.peer_member, lane = shared.lane, peer = %target, %error, "peer unreachable; retrying with backoff");
                }
                failing = true;
            }
        }
        let delay_ms = backoff.next_delay_ms();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
            _ = wait_closed(&shared) => {}
        }
    }
    shared.close();
}

async fn wait_closed(shared: &LinkShared) {
    while !shared.closed.get() {
        shared.state_wake.notified().await;
    }
}

async fn run_connection(
    shared: &Rc<LinkShared>,
    stream: Connection,
    tx: &mpsc::Sender<Vec<Inbound>>,
) -> CloseReason {
    match stream {
        Connection::Plain(s) => {
            let (rd, wr) = s.into_split();
            run_halves(shared, rd, wr, tx).await
        }
        Connection::TlsClient(s) => {
            let (rd, wr) = tokio::io::split(s);
            run_halves(shared, rd, wr, tx).await
        }
        Connection::TlsServer(s) => {
            let (rd, wr) = tokio::io::split(s);
            run_halves(shared, rd, wr, tx).await
        }
    }
}

async fn run_halves<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    shared: &Rc<LinkShared>,
    mut rd: R,
    mut wr: W,
    tx: &mpsc::Sender<Vec<Inbound>>,
) -> CloseReason {
    let mut rx_stream: Option<RxStream> = None;
    let reason = {
        let reader = read_loop(shared, &mut rd, tx, &mut rx_stream);
        let writer = write_loop(shared, &mut wr);
        tokio::select! {
            r = reader => r,
            w = writer => w,
        }
    };
    if let Some(rx) = rx_stream.take() {
        let aborted = Inbound::StreamAborted {
            stream_id: rx.stream_id,
            shard_id: rx.shard_id,
            reason: StreamAbortReason::ConnectionLost,
        };
        let _ = tx.send(vec![aborted]).await;
    }
    // Frames the writer had in hand are gone with the connection (counted in
    // disconnect_drops); queued ones wait for the next connection.
    let _ = wr.shutdown().await;
    reason
}

async fn write_loop<W: AsyncWrite + Unpin>(shared: &LinkShared, wr: &mut W) -> CloseReason {
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

async fn read_loop<R: AsyncRead + Unpin>(
    shared: &LinkShared,
    rd: &mut R,
    tx: &mpsc::Sender<Vec<Inbound>>,
    rx_stream: &mut Option<RxStream>,
) -> CloseReason {
    let config = &shared.config;
    let mut decoder = FrameDecoder::new(config.max_frame_payload_bytes, config.read_buffer_bytes);
    let stall = Duration::from_millis(config.stall_timeout_ms);
    loop {
        decoder.prepare_read();
        let buffered_bytes = decoder.buffered_bytes();
        // Reads are capped below the buffer size so the bytes of each read are
        // still in cache when the CRC pass over them runs.
        let mut limited = (&mut *rd).take(config.read_chunk_bytes as u64);
        let read = limited.read_buf(decoder.buffer_mut());
        let n = if buffered_bytes > 0 {
            match tokio::time::timeout(stall, read).await {
                Ok(r) => r,
                Err(_) => {
                    return CloseReason::Stalled {
                        stall_timeout_ms: config.stall_timeout_ms,
                        buffered_bytes,
                    }
                }
            }
        } else {
            read.await
        };
        match n {
            Ok(0) if buffered_bytes > 0 => return CloseReason::EofMidFrame { buffered_bytes },
            Ok(0) => return CloseReason::PeerClosed,
            Ok(n) => Counters::add(&shared.counters.bytes_received, n as u64),
            Err(err) => return CloseReason::Io(err),
        }
        let mut batch = Vec::new();
        let mut failure = None;
        let mut decoded_frames = 0u64;
        loop {
            match decoder.decode() {
                Ok(Some(frame)) => {
                    decoded_frames += 1;
                    if let Err(reason) = handle_frame(shared, frame, &mut batch, rx_stream) {
                        failure = Some(reason);
                        break;
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    failure = Some(CloseReason::BadInput(err));
                    break;
                }
            }
        }
        // One atomic add per read, not per frame.
        Counters::add(&shared.counters.frames_received, decoded_frames);
        let frames = batch.len();
        // Frames that arrived whole before a bad one are still delivered. A
        // dropped receiver means inbound frames are not wanted (a send-only
        // link); they are discarded and the link keeps sending.
        if frames > 0 {
            let _ = tx.send(batch).await;
        }
        if let Some(reason) = failure {
            return reason;
        }
        // Credit only what the consumer has taken in: the send above returned.
        if let Some(rx) = rx_stream.as_mut() {
            if rx.chunks > rx.acked_chunks {
                rx.acked_chunks = rx.chunks;
                // A full control queue only delays the sender until the next ack.
                let _ = shared.enqueue(
                    FrameKind::StreamAck,
                    0,
                    rx.shard_id,
                    stream::encode_ack(rx.stream_id, rx.chunks),
                    Vec::new(),
                    true,
                );
            }
        }
    }
}

fn violation(kind: FrameKind, len: usize) -> CloseReason {
    CloseReason::ProtocolViolation(format!("malformed {kind:?} payload of {len} bytes"))
}

fn handle_frame(
    shared: &LinkShared,
    frame: Frame,
    batch: &mut Vec<Inbound>,
    rx_stream: &mut Option<RxStream>,
) -> Result<(), CloseReason> {
    let Frame {
        kind,
        flags,
        shard_id,
        payload,
    } = frame;
    match kind {
        FrameKind::Message => batch.push(Inbound::Message {
            shard_id,
            flags,
            payload,
        }),
        FrameKind::StreamStart => {
            let (stream_id, attempt) =
                stream::decode_start(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            if let Some(old) = rx_stream.take() {
                batch.push(Inbound::StreamAborted {
                    stream_id: old.stream_id,
                    shard_id: old.shard_id,
                    reason: StreamAbortReason::Superseded,
                });
            }
            *rx_stream = Some(RxStream::new(stream_id, shard_id));
            batch.push(Inbound::StreamStart {
                stream_id,
                shard_id,
                attempt,
            });
        }
        FrameKind::StreamChunk => {
            let (stream_id, data) =
                stream::decode_chunk(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            // Chunks of an attempt that was given up are dropped quietly.
            if let Some(rx) = rx_stream.as_mut().filter(|rx| rx.stream_id == stream_id) {
                rx.hasher.update(&data);
                rx.total_bytes += data.len() as u64;
                rx.chunks += 1;
                batch.push(Inbound::StreamChunk {
                    stream_id,
                    shard_id: rx.shard_id,
                    data,
                });
            }
        }
        FrameKind::StreamEnd => {
            let (stream_id, total_bytes, crc) =
                stream::decode_end(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            let ok = match rx_stream.take() {
                Some(rx) if rx.stream_id == stream_id => {
                    let ok = rx.total_bytes == total_bytes && rx.hasher.finalize() == crc;
                    batch.push(if ok {
                        Inbound::StreamEnd {
                            stream_id,
                            shard_id: rx.shard_id,
                            total_bytes,
                        }
                    } else {
                        Inbound::StreamAborted {
                            stream_id,
                            shard_id: rx.shard_id,
                            reason: StreamAbortReason::ChecksumMismatch,
                        }
                    });
                    ok
                }
                other => {
                    *rx_stream = other;
                    false
                }
            };
            let _ = shared.enqueue(
                FrameKind::StreamResult,
                0,
                shard_id,
                stream::encode_result(stream_id, ok),
                Vec::new(),
                true,
            );
        }
        FrameKind::StreamAck => {
            let (stream_id, chunks) =
                stream::decode_ack(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            shared.on_stream_ack(stream_id, chunks);
        }
        FrameKind::StreamResult => {
            let (stream_id, ok) =
                stream::decode_result(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            shared.on_stream_result(stream_id, ok);
        }
        FrameKind::Hello | FrameKind::HelloAccept | FrameKind::HelloRefuse => {
            return Err(CloseReason::ProtocolViolation(format!(
                "{kind:?} frame after the handshake"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_jitters_and_resets() {
        let mut backoff = Backoff::new(10, 1000, 42);
        let delays: Vec<u64> = (0..12).map(|_| backoff.next_delay_ms()).collect();
        for (i, d) in delays.iter().enumerate() {
            let ceiling = (10u64 << i.min(32)).min(1000);
            assert!(
                *d >= ceiling / 2 && *d <= ceiling,
                "delay {i} = {d}, ceiling {ceiling}"
            );
        }
        assert!(
            delays[11] >= 500,
            "capped delays stay near the cap: {delays:?}"
        );
        backoff.reset();
        assert!(backoff.next_delay_ms() <= 10);
        for _ in 0..100 {
            assert!(backoff.next_delay_ms() <= 1000);
        }
    }

    #[test]
    fn closed_error_names_peer() {
        let shared = LinkShared::new(Config::default(), 7, 3);
        assert_eq!(
            closed_error(&shared).to_string(),
            "link to member 7 lane 3 is closed"
        );
    }
}

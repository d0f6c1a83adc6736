//! Links: the per-(peer member, lane) connection with its bounded send queue,
//! vectored writer, zero-copy reader, reconnecting dialer and stream transfers.
//! This file holds the link's types, shared state and handle; the send side,
//! the receive side, stream transfers, dialing and a connection's run live in
//! the modules below.
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
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::config::Config;
use crate::frame::{FrameError, HEADER_BYTES};
use crate::stream::{StreamAbortReason, TxStream};

mod connection;
mod dial;
mod recv;
mod send;
mod send_stream;
pub use connection::{serve_accepted, ServeError};
pub use dial::{dial, Backoff, PeerTarget, STABLE_CONNECTION_MS};

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
    /// When the current connection was established (`None` while down).
    connected_since: Cell<Option<std::time::Instant>>,
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
            connected_since: Cell::new(None),
            closed: Cell::new(false),
            peer_addr: Cell::new(None),
            tx_stream: RefCell::new(None),
            stream_slot: Semaphore::new(1),
            next_stream_id: Cell::new(1),
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
        if !connected {
            self.connected_since.set(None);
        } else if !self.connected.get() {
            self.connected_since.set(Some(std::time::Instant::now()));
        }
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
    /// Whether a connection is established right now.
    pub fn is_connected(&self) -> bool {
        self.shared.connected.get()
    }

    /// Since when the link has been connected without a break (etcd's
    /// "active since"); `None` while it is not.
    pub fn connected_since(&self) -> Option<std::time::Instant> {
        self.shared.connected_since.get()
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
}

fn closed_error(shared: &LinkShared) -> SendError {
    SendError::Closed {
        peer_member: shared.peer_member,
        lane: shared.lane,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_error_names_peer() {
        let shared = LinkShared::new(Config::default(), 7, 3);
        assert_eq!(
            closed_error(&shared).to_string(),
            "link to member 7 lane 3 is closed"
        );
    }
}

//! One client connection: the HTTP/2 server side of RFC 9113 as gRPC uses it.
//!
//! A connection is one task on its core. Each time it runs it reads every
//! frame that has arrived, starts the calls they complete, polls the unary KV
//! calls it holds itself ([`super::dispatch::kv_call`]), moves the answers
//! that the peer's windows allow into one output buffer and writes that
//! buffer: requests that arrive together are answered with one write.
//!
//! Streaming calls run as tasks of their own ([`super::dispatch::spawn_generic`])
//! and queue their answers in the shared [`Outbox`].
//!
//! Limits: frames of at most 16 KiB, [`Handler::max_streams`] open streams,
//! header blocks of at most [`MAX_HEADER_BLOCK_BYTES`], request windows of
//! [`STREAM_WINDOW`] per stream, at most [`MAX_HELD_BYTES`] of request bodies
//! and open streams' header lists held per connection (a stream that would
//! pass it is reset with ENHANCE_YOUR_CALM), no more reading while
//! [`OUT_HIGH_WATER`] bytes wait to be written (a peer that sends but does
//! not read gets nothing more read from it), at most [`MAX_RESETS`] calls
//! opened and reset by the client within [`RESET_PERIOD`], and at most
//! [`MAX_WINDOW_SETTINGS`] changes of its initial window per connection. A
//! breach of the protocol closes the connection with GOAWAY and the error
//! code the RFC names; a malformed request resets its stream only.
//!
//! A call reset by the client is dropped at once (a unary KV call is
//! aborted, a streaming call's task too); a unary call that panics answers
//! with status Internal and leaves the connection's other calls alone.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::future::LocalBoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::dispatch::{Handler, KvCall};
use super::request::RequestHead;
use super::send::{Out, Outbox};
use super::stream_ids::StreamMap;
use crate::ops::http::HTTP2_PREFACE;
use crate::tls::ClientConnInfo;
use cairn_proto::h2::frame::{self, ErrorCode, Head};
use cairn_proto::h2::hpack;

mod control;
mod requests;

/// Each request stream's receive window.
pub const STREAM_WINDOW: u32 = 1 << 20;
/// The connection's receive window.
pub const CONN_WINDOW: u32 = 16 << 20;
/// Largest header block (HEADERS plus CONTINUATION octets) accepted.
pub const MAX_HEADER_BLOCK_BYTES: usize = 64 * 1024;
/// Most request bytes a connection holds: KV bodies being gathered,
/// streamed bodies not yet taken by their call, and the decoded heads of its
/// open streams (each from a list of up to [`hpack::MAX_DECODED_LIST_BYTES`],
/// counted until the stream ends), so that a client opening many streams
/// with large headers is refused rather than growing the member's memory
/// with every stream. A head counts for the memory it holds
/// ([`crate::grpc::request::RequestHead::held_bytes`]), not for HTTP/2's
/// size of its list, which a list of thousands of tiny fields exceeds
/// several times.
pub const MAX_HELD_BYTES: usize = 64 << 20;
/// Most calls the client may open and reset on one connection within
/// [`RESET_PERIOD`]; more close it (ENHANCE_YOUR_CALM), as each reset call
/// may already have cost a proposal. Calls opened before the period began
/// are not counted: a client that cancels many long-lived streams at once
/// (its watches, say) is not opening calls only to reset them.
pub const MAX_RESETS: u32 = 10_000;
pub const RESET_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);
/// Most SETTINGS frames that change the initial window, per connection:
/// each change touches every open stream, and clients change it a few times
/// at most.
pub const MAX_WINDOW_SETTINGS: u32 = 1000;
/// Reading stops while this many bytes wait to be written.
pub const OUT_HIGH_WATER: usize = 1 << 20;
/// Read buffer: a whole frame of the largest size we allow, several times.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Rounds of reading and writing before the task yields to the core's others.
const ROUNDS_PER_POLL: usize = 16;

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("client connection: {0}")]
    Io(#[from] io::Error),
    #[error("client broke HTTP/2 ({code:?}): {why}")]
    Protocol { code: ErrorCode, why: String },
}

fn protocol(code: ErrorCode, why: impl Into<String>) -> ConnError {
    ConnError::Protocol {
        code,
        why: why.into(),
    }
}

/// The receiving side of a stream.
enum Recv {
    /// A unary KV call's body arriving.
    Unary {
        call: KvCall,
        head: Box<RequestHead>,
        body: BytesMut,
        /// Octets received since the last window update of this stream.
        unacked: u32,
    },
    /// A call served by tonic: its body goes to the call's task.
    /// `in_flight`: octets sent to the task and not yet taken (at most the
    /// stream's window, unless the client ignores it).
    Body {
        data: mpsc::UnboundedSender<Bytes>,
        in_flight: usize,
    },
    /// The request has arrived whole; only the answer is pending.
    Done,
    /// The call was answered before its body ended: the rest is dropped.
    Discard,
}

struct Stream {
    recv: Recv,
    /// The memory the request's decoded head holds, counted in the
    /// connection's held bytes for as long as the stream is open.
    head_bytes: usize,
    /// The task of a call served by tonic.
    task: Option<tokio::task::AbortHandle>,
    /// A unary KV call polled by the connection.
    call: Option<futures::future::AbortHandle>,
}

impl Stream {
    fn new(recv: Recv, head_bytes: usize) -> Stream {
        Stream {
            recv,
            head_bytes,
            task: None,
            call: None,
        }
    }

    /// Request bytes this stream holds: its header list and body.
    fn held(&self) -> usize {
        let body = match &self.recv {
            Recv::Unary { body, .. } => body.len(),
            Recv::Body { in_flight, .. } => *in_flight,
            Recv::Done | Recv::Discard => 0,
        };
        self.head_bytes + body
    }

    fn abort(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some(call) = &self.call {
            call.abort();
        }
    }
}

/// A header block still waiting for CONTINUATION frames.
struct PendingBlock {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

struct Conn<IO> {
    io: IO,
    handler: Rc<Handler>,
    info: ClientConnInfo,
    rbuf: Box<[u8]>,
    rstart: usize,
    rend: usize,
    out: BytesMut,
    outbox: Rc<RefCell<Outbox>>,
    decoder: hpack::Decoder,
    block: hpack::Block,
    streams: StreamMap<Stream>,
    last_stream: u32,
    pending_block: Option<PendingBlock>,
    unary: FuturesUnordered<LocalBoxFuture<'static, (u32, Vec<Out>)>>,
    consumed_tx: mpsc::UnboundedSender<(u32, usize)>,
    consumed_rx: mpsc::UnboundedReceiver<(u32, usize)>,
    /// Connection-level octets received and not yet given back.
    conn_unacked: u32,
    /// Request bytes held by all streams ([`MAX_HELD_BYTES`]).
    held: usize,
    /// Calls opened since `resets_since` (streams from `period_first_stream`
    /// on) and reset by the client.
    resets: u32,
    resets_since: std::time::Instant,
    period_first_stream: u32,
    /// SETTINGS frames that changed the initial window.
    window_settings: u32,
    preface_done: bool,
    settings_seen: bool,
    /// Our GOAWAY went out: no new streams.
    going_away: bool,
    peer_going_away: bool,
    eof: bool,
    shutdown: Option<Pin<Box<dyn Future<Output = ()>>>>,
}

/// Serves one connection until the client closes it, breaks the protocol,
/// or `shutdown` resolves and its open calls have finished.
pub async fn serve<IO>(
    io: IO,
    handler: Rc<Handler>,
    info: ClientConnInfo,
    shutdown: Pin<Box<dyn Future<Output = ()>>>,
) -> Result<(), ConnError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let (consumed_tx, consumed_rx) = mpsc::unbounded_channel();
    let mut conn = Conn {
        io,
        handler,
        info,
        rbuf: vec![0u8; READ_BUFFER_BYTES].into_boxed_slice(),
        rstart: 0,
        rend: 0,
        out: BytesMut::with_capacity(16 * 1024),
        outbox: Rc::new(RefCell::new(Outbox::default())),
        decoder: hpack::Decoder::default(),
        block: hpack::Block::default(),
        streams: StreamMap::default(),
        last_stream: 0,
        pending_block: None,
        unary: FuturesUnordered::new(),
        consumed_tx,
        consumed_rx,
        conn_unacked: 0,
        held: 0,
        resets: 0,
        resets_since: std::time::Instant::now(),
        period_first_stream: 0,
        window_settings: 0,
        preface_done: false,
        settings_seen: false,
        going_away: false,
        peer_going_away: false,
        eof: false,
        shutdown: Some(shutdown),
    };
    let mut settings = vec![
        (frame::SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
        (frame::SETTINGS_ENABLE_PUSH, 0),
        (
            frame::SETTINGS_MAX_HEADER_LIST_SIZE,
            hpack::MAX_DECODED_LIST_BYTES as u32,
        ),
    ];
    // Streams are unlimited until a peer says otherwise (RFC 9113, 6.5.2).
    if let Some(limit) = conn.handler.max_streams {
        settings.push((frame::SETTINGS_MAX_CONCURRENT_STREAMS, limit));
    }
    frame::put_settings(&mut conn.out, &settings);
    frame::put_window_update(&mut conn.out, 0, CONN_WINDOW - frame::DEFAULT_WINDOW);
    let result = std::future::poll_fn(|cx| conn.poll_run(cx)).await;
    // The calls end with the connection, before any wait below.
    for (_, stream) in conn.streams.drain() {
        stream.abort();
    }
    conn.unary = FuturesUnordered::new();
    if let Err(ConnError::Protocol { code, why }) = &result {
        // Best effort: tell the client why, then close. `out` holds whole
        // frames after the unwritten rest of one, so GOAWAY goes after them.
        frame::put_goaway(&mut conn.out, conn.last_stream, *code, why);
    }
    let out = std::mem::take(&mut conn.out);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let _ = tokio::io::AsyncWriteExt::write_all(&mut conn.io, &out).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut conn.io).await;
    })
    .await;
    result
}

/// Longest a closing connection waits to write its last frames (a TLS
/// close included) to a client that may not be reading.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

impl<IO> Drop for Conn<IO> {
    fn drop(&mut self) {
        for stream in self.streams.values() {
            stream.abort();
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Conn<IO> {
    fn poll_run(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        for _ in 0..ROUNDS_PER_POLL {
            let mut progress = false;
            if !self.eof && self.out.len() < OUT_HIGH_WATER {
                let mut buf = ReadBuf::new(&mut self.rbuf[self.rend..]);
                match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) => {
                        let n = buf.filled().len();
                        if n == 0 {
                            self.eof = true;
                        } else {
                            self.rend += n;
                            self.read_frames()?;
                        }
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {}
                }
            }
            while let Poll::Ready(Some((id, pieces))) = self.unary.poll_next_unpin(cx) {
                let mut outbox = self.outbox.borrow_mut();
                for piece in pieces {
                    if !outbox.push(id, piece) {
                        break;
                    }
                }
                progress = true;
            }
            while let Poll::Ready(Some((id, n))) = self.consumed_rx.poll_recv(cx) {
                self.body_consumed(id, n);
            }
            if let Some(shutdown) = &mut self.shutdown {
                if shutdown.as_mut().poll(cx).is_ready() {
                    self.shutdown = None;
                    self.go_away();
                }
            }
            let finished = {
                let mut outbox = self.outbox.borrow_mut();
                outbox.set_conn_waker(cx.waker());
                outbox.fill(&mut self.out, OUT_HIGH_WATER)
            };
            for id in finished {
                self.response_sent(id);
            }
            while !self.out.is_empty() {
                match Pin::new(&mut self.io).poll_write(cx, &self.out) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                    }
                    Poll::Ready(Ok(n)) => {
                        self.out.advance(n);
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => break,
                }
            }
            if self.out.is_empty() {
                if let Poll::Ready(Err(e)) = Pin::new(&mut self.io).poll_flush(cx) {
                    return Poll::Ready(Err(e.into()));
                }
            }
            if self.eof && self.out.is_empty() {
                // HTTP/2 clients never half-close: end of input is the end
                // of the connection (once what is ready has been written);
                // its calls are dropped with it.
                return Poll::Ready(Ok(()));
            }
            if (self.going_away || self.peer_going_away)
                && self.streams.is_empty()
                && self.out.is_empty()
            {
                return Poll::Ready(Ok(()));
            }
            if !progress {
                return Poll::Pending;
            }
        }
        // Busy: let the core's other tasks (its shards' ticks) run.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Handles every whole frame in the read buffer.
    fn read_frames(&mut self) -> Result<(), ConnError> {
        if !self.preface_done {
            let have = self.rend - self.rstart;
            let want = HTTP2_PREFACE.len();
            let n = have.min(want);
            if self.rbuf[self.rstart..self.rstart + n] != HTTP2_PREFACE[..n] {
                return Err(protocol(ErrorCode::Protocol, "not the HTTP/2 preface"));
            }
            if have < want {
                return Ok(());
            }
            self.rstart += want;
            self.preface_done = true;
        }
        // The buffer is taken out while frames borrow it, so handlers get
        // slices of it rather than copies.
        let rbuf = std::mem::take(&mut self.rbuf);
        let result = self.each_frame(&rbuf);
        self.rbuf = rbuf;
        result?;
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
        } else if self.rstart > self.rbuf.len() / 2 || self.rend == self.rbuf.len() {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        Ok(())
    }

    fn each_frame(&mut self, rbuf: &[u8]) -> Result<(), ConnError> {
        loop {
            let available = &rbuf[self.rstart..self.rend];
            let Some(head) = Head::parse(available) else {
                break;
            };
            if head.len > frame::DEFAULT_MAX_FRAME {
                return Err(protocol(
                    ErrorCode::FrameSize,
                    format!("frame of {} octets", head.len),
                ));
            }
            let total = frame::HEADER_LEN + head.len as usize;
            if available.len() < total {
                break;
            }
            let payload = &available[frame::HEADER_LEN..total];
            self.rstart += total;
            self.on_frame(head, payload)?;
        }
        Ok(())
    }

    fn on_frame(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if !self.settings_seen {
            if head.kind != frame::SETTINGS || head.has(frame::FLAG_ACK) {
                return Err(protocol(
                    ErrorCode::Protocol,
                    "the first frame is not SETTINGS",
                ));
            }
            self.settings_seen = true;
        }
        if let Some(pending) = &self.pending_block {
            if head.kind != frame::CONTINUATION || head.stream != pending.stream {
                return Err(protocol(
                    ErrorCode::Protocol,
                    "a header block was interrupted",
                ));
            }
        }
        match head.kind {
            frame::DATA => self.on_data(head, payload),
            frame::HEADERS => self.on_headers(head, payload),
            frame::CONTINUATION => self.on_continuation(head, payload),
            frame::PRIORITY => {
                if head.stream == 0 {
                    return Err(protocol(ErrorCode::Protocol, "PRIORITY on stream 0"));
                }
                if payload.len() != 5 {
                    frame::put_rst_stream(&mut self.out, head.stream, ErrorCode::FrameSize);
                    self.drop_stream(head.stream);
                }
                Ok(())
            }
            frame::RST_STREAM => self.on_rst_stream(head, payload),
            frame::SETTINGS => self.on_settings(head, payload),
            frame::PUSH_PROMISE => Err(protocol(ErrorCode::Protocol, "PUSH_PROMISE from a client")),
            frame::PING => {
                if head.stream != 0 {
                    return Err(protocol(ErrorCode::Protocol, "PING on a stream"));
                }
                let Ok(data) = <&[u8; 8]>::try_from(payload) else {
                    return Err(protocol(ErrorCode::FrameSize, "PING is not 8 octets"));
                };
                if !head.has(frame::FLAG_ACK) {
                    frame::put_ping_ack(&mut self.out, data);
                }
                Ok(())
            }
            frame::GOAWAY => {
                if head.stream != 0 {
                    return Err(protocol(ErrorCode::Protocol, "GOAWAY on a stream"));
                }
                if payload.len() < 8 {
                    return Err(protocol(ErrorCode::FrameSize, "GOAWAY under 8 octets"));
                }
                self.peer_going_away = true;
                Ok(())
            }
            frame::WINDOW_UPDATE => self.on_window_update(head, payload),
            // Unknown frame types are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }
}

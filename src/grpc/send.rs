//! The sending half of a connection: each stream's queued response frames and
//! the flow-control windows that decide when they go out (RFC 9113 §5.2).
//!
//! A response is queued whole or piece by piece ([`Outbox::push`]), by the
//! connection itself for unary calls and by a streaming call's task for the
//! rest; [`Outbox::fill`] moves what the peer's windows allow into the
//! connection's write buffer. A task that has queued more than
//! [`STREAM_HIGH_WATER`] bytes waits ([`Outbox::poll_room`]) until the peer
//! has taken some, so a client that stops reading holds at most that much per
//! stream.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};

use cairn_proto::h2::frame;

use super::stream_ids::StreamMap;

/// Most response bytes a streaming call queues before it waits for the peer.
pub const STREAM_HIGH_WATER: usize = 256 * 1024;

/// One piece of a response, in order.
#[derive(Debug)]
pub enum Out {
    /// An encoded header block (response headers or trailers).
    Headers { block: Bytes, end: bool },
    /// gRPC-framed message bytes.
    Data { bytes: Bytes, end: bool },
}

#[derive(Debug, Default)]
struct SendStream {
    /// What the peer lets this stream send (may go negative after SETTINGS).
    window: i64,
    queue: VecDeque<Out>,
    queued_bytes: usize,
    /// In [`Outbox::ready`] already.
    listed: bool,
    /// In [`Outbox::blocked_on_conn`] already.
    waits_for_conn: bool,
    /// A task waiting for room ([`Outbox::poll_room`]).
    waiter: Option<Waker>,
}

/// Every open stream's pending output and the connection's send window.
#[derive(Debug)]
pub struct Outbox {
    streams: StreamMap<SendStream>,
    /// Streams that may have something to send now.
    ready: VecDeque<u32>,
    /// Streams with data waiting for the connection window.
    blocked_on_conn: Vec<u32>,
    conn_window: i64,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE.
    initial_window: i64,
    /// The peer's SETTINGS_MAX_FRAME_SIZE.
    max_frame: usize,
    /// The connection, to be woken when output is queued.
    conn_waker: Option<Waker>,
}

/// Why a window could not be changed: a flow-control error (RFC 9113 §6.9.1).
#[derive(Debug, PartialEq, Eq)]
pub struct WindowOverflow;

/// What [`Outbox::fill`] finished: streams whose last frame went out.
pub type Finished = Vec<u32>;

impl Default for Outbox {
    fn default() -> Self {
        Outbox {
            streams: StreamMap::default(),
            ready: VecDeque::new(),
            blocked_on_conn: Vec::new(),
            conn_window: i64::from(frame::DEFAULT_WINDOW),
            initial_window: i64::from(frame::DEFAULT_WINDOW),
            max_frame: frame::DEFAULT_MAX_FRAME as usize,
            conn_waker: None,
        }
    }
}

impl Outbox {
    /// Opens the sending side of a new stream.
    pub fn open(&mut self, stream: u32) {
        self.streams.insert(
            stream,
            SendStream {
                window: self.initial_window,
                ..SendStream::default()
            },
        );
    }

    pub fn is_open(&self, stream: u32) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Drops a stream's pending output (reset by the peer, or the connection
    /// refused it); its waiting task is woken to find the stream gone.
    pub fn close(&mut self, stream: u32) {
        if let Some(s) = self.streams.remove(&stream) {
            if let Some(w) = s.waiter {
                w.wake();
            }
        }
    }

    /// Queues the next piece of `stream`'s response. False when the stream
    /// is gone (reset): the caller stops producing.
    pub fn push(&mut self, stream: u32, out: Out) -> bool {
        let Some(s) = self.streams.get_mut(&stream) else {
            return false;
        };
        if let Out::Data { bytes, .. } = &out {
            s.queued_bytes += bytes.len();
        }
        s.queue.push_back(out);
        if !s.listed {
            s.listed = true;
            self.ready.push_back(stream);
        }
        if let Some(w) = self.conn_waker.take() {
            w.wake();
        }
        true
    }

    /// Ready when `stream` has room for more output (or is gone: then the
    /// answer is false).
    pub fn poll_room(&mut self, stream: u32, cx: &mut Context<'_>) -> Poll<bool> {
        match self.streams.get_mut(&stream) {
            None => Poll::Ready(false),
            Some(s) if s.queued_bytes < STREAM_HIGH_WATER => Poll::Ready(true),
            Some(s) => {
                s.waiter = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// The connection's task, woken by [`Outbox::push`].
    pub fn set_conn_waker(&mut self, waker: &Waker) {
        match &self.conn_waker {
            Some(w) if w.will_wake(waker) => {}
            _ => self.conn_waker = Some(waker.clone()),
        }
    }

    /// A WINDOW_UPDATE for the connection (stream 0) or one stream.
    pub fn window_update(&mut self, stream: u32, increment: u32) -> Result<(), WindowOverflow> {
        let inc = i64::from(increment);
        if stream == 0 {
            self.conn_window += inc;
            if self.conn_window > frame::MAX_WINDOW {
                return Err(WindowOverflow);
            }
            for id in std::mem::take(&mut self.blocked_on_conn) {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.waits_for_conn = false;
                }
                self.relist(id);
            }
            return Ok(());
        }
        let Some(s) = self.streams.get_mut(&stream) else {
            // A stream that finished or was reset: allowed and ignored.
            return Ok(());
        };
        s.window += inc;
        if s.window > frame::MAX_WINDOW {
            return Err(WindowOverflow);
        }
        self.relist(stream);
        Ok(())
    }

    /// The peer's new SETTINGS_INITIAL_WINDOW_SIZE changes every open
    /// stream's window by the difference (RFC 9113 §6.9.2). True when it
    /// changed.
    pub fn set_initial_window(&mut self, value: u32) -> Result<bool, WindowOverflow> {
        let value = i64::from(value);
        if value > frame::MAX_WINDOW {
            return Err(WindowOverflow);
        }
        let delta = value - self.initial_window;
        if delta == 0 {
            return Ok(false);
        }
        self.initial_window = value;
        let mut relist = Vec::new();
        for (&id, s) in &mut self.streams {
            s.window += delta;
            if s.window > frame::MAX_WINDOW {
                return Err(WindowOverflow);
            }
            if delta > 0 && !s.queue.is_empty() {
                relist.push(id);
            }
        }
        for id in relist {
            self.relist(id);
        }
        Ok(true)
    }

    pub fn set_max_frame(&mut self, value: u32) {
        self.max_frame = value as usize;
    }

    fn relist(&mut self, stream: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            if !s.listed && !s.queue.is_empty() {
                s.listed = true;
                self.ready.push_back(stream);
            }
        }
    }

    /// Moves queued output into `out` as far as the windows allow, until
    /// `out` holds `limit` bytes. Streams take turns: after each DATA frame
    /// a stream goes to the back of the line, so one large answer does not
    /// hold up the small ones behind it. Returns the streams whose response
    /// ended (their sending side is closed here).
    pub fn fill(&mut self, out: &mut BytesMut, limit: usize) -> Finished {
        let mut finished = Vec::new();
        while out.len() < limit {
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            s.listed = false;
            let mut ended = false;
            let mut blocked = false;
            let mut sent_data = false;
            while out.len() < limit && !sent_data {
                let Some(piece) = s.queue.front_mut() else {
                    break;
                };
                match piece {
                    Out::Headers { block, end } => {
                        frame::put_header_block(out, id, block, *end, self.max_frame);
                        ended = *end;
                        s.queue.pop_front();
                    }
                    Out::Data { bytes, end } => {
                        let allowed = s.window.min(self.conn_window).max(0) as usize;
                        let n = bytes.len().min(allowed).min(self.max_frame);
                        if n == 0 && !bytes.is_empty() {
                            blocked = true;
                            if s.window > 0 && !s.waits_for_conn {
                                s.waits_for_conn = true;
                                self.blocked_on_conn.push(id);
                            }
                            break;
                        }
                        sent_data = true;
                        let last = n == bytes.len();
                        let flags = if last && *end {
                            frame::FLAG_END_STREAM
                        } else {
                            0
                        };
                        frame::put_head(out, n, frame::DATA, flags, id);
                        out.extend_from_slice(&bytes[..n]);
                        s.window -= n as i64;
                        self.conn_window -= n as i64;
                        s.queued_bytes -= n;
                        if last {
                            ended = *end;
                            s.queue.pop_front();
                        } else {
                            let _ = bytes.split_to(n);
                        }
                    }
                }
                if ended {
                    break;
                }
            }
            if ended {
                if let Some(s) = self.streams.remove(&id) {
                    if let Some(w) = s.waiter {
                        w.wake();
                    }
                }
                finished.push(id);
                continue;
            }
            if s.queued_bytes < STREAM_HIGH_WATER {
                if let Some(w) = s.waiter.take() {
                    w.wake();
                }
            }
            if !blocked && !s.queue.is_empty() {
                // Its turn is over (or `out` is full): it goes on later.
                s.listed = true;
                self.ready.push_back(id);
            }
        }
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(out: &[u8]) -> Vec<(u8, u8, u32, usize)> {
        let mut at = 0;
        let mut v = Vec::new();
        while let Some(h) = frame::Head::parse(&out[at..]) {
            v.push((h.kind, h.flags, h.stream, h.len as usize));
            at += frame::HEADER_LEN + h.len as usize;
        }
        v
    }

    fn data(n: usize, end: bool) -> Out {
        Out::Data {
            bytes: Bytes::from(vec![7u8; n]),
            end,
        }
    }

    #[test]
    fn data_waits_for_the_stream_window_and_goes_on_after_an_update() {
        let mut o = Outbox::default();
        o.open(1);
        o.push(
            1,
            Out::Headers {
                block: Bytes::from_static(b"\x88"),
                end: false,
            },
        );
        o.push(1, data(100_000, true));
        let mut out = BytesMut::new();
        assert!(o.fill(&mut out, 1 << 20).is_empty());
        let f = frames(&out);
        assert_eq!(f[0], (frame::HEADERS, frame::FLAG_END_HEADERS, 1, 1));
        let sent: usize = f[1..].iter().map(|x| x.3).sum();
        assert_eq!(sent, 65_535);
        assert!(f[1..].iter().all(|x| x.3 <= 16_384 && x.1 == 0));
        out.clear();
        assert!(
            o.fill(&mut out, 1 << 20).is_empty(),
            "nothing until an update"
        );
        assert!(out.is_empty());
        o.window_update(1, 100_000).unwrap();
        o.window_update(0, 100_000).unwrap();
        assert_eq!(o.fill(&mut out, 1 << 20), vec![1]);
        let f = frames(&out);
        assert_eq!(f.iter().map(|x| x.3).sum::<usize>(), 100_000 - 65_535);
        assert_eq!(f.last().unwrap().1, frame::FLAG_END_STREAM);
        assert!(!o.is_open(1));
    }

    #[test]
    fn the_connection_window_is_shared_and_unblocks_every_stream() {
        let mut o = Outbox::default();
        o.set_initial_window(1 << 20).unwrap();
        for id in [1, 3] {
            o.open(id);
            o.push(id, data(40_000, true));
        }
        let mut out = BytesMut::new();
        assert!(o.fill(&mut out, 1 << 20).is_empty(), "they share 65,535");
        assert_eq!(frames(&out).iter().map(|x| x.3).sum::<usize>(), 65_535);
        out.clear();
        assert!(o.fill(&mut out, 1 << 20).is_empty());
        assert!(out.is_empty(), "both wait for the connection");
        o.window_update(0, 1 << 20).unwrap();
        let mut done = o.fill(&mut out, 1 << 20);
        done.sort();
        assert_eq!(done, vec![1, 3]);
        assert_eq!(
            frames(&out).iter().map(|x| x.3).sum::<usize>(),
            80_000 - 65_535
        );
    }

    #[test]
    fn windows_past_two_to_the_31_are_errors() {
        let mut o = Outbox::default();
        o.open(1);
        assert_eq!(o.window_update(0, 0x7fff_ffff), Err(WindowOverflow));
        let mut o = Outbox::default();
        o.open(1);
        assert_eq!(o.window_update(1, 0x7fff_ffff), Err(WindowOverflow));
        assert_eq!(o.window_update(9, 5), Ok(()), "unknown streams are ignored");
    }

    #[test]
    fn a_task_waits_for_room_and_a_reset_stream_wakes_it() {
        let mut o = Outbox::default();
        o.open(1);
        o.push(1, data(STREAM_HIGH_WATER, false));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(o.poll_room(1, &mut cx), Poll::Pending);
        let mut out = BytesMut::new();
        o.fill(&mut out, 1 << 20);
        assert_eq!(o.poll_room(1, &mut cx), Poll::Ready(true));
        o.close(1);
        assert_eq!(o.poll_room(1, &mut cx), Poll::Ready(false));
        assert!(!o.push(1, data(1, true)));
    }

    #[test]
    fn streams_take_turns_frame_by_frame() {
        let mut o = Outbox::default();
        o.set_initial_window(1 << 20).unwrap();
        o.window_update(0, 1 << 20).unwrap();
        o.open(1);
        o.push(1, data(50_000, true));
        o.open(3);
        o.push(3, data(100, true));
        let mut out = BytesMut::new();
        assert_eq!(o.fill(&mut out, 1 << 20), vec![3, 1]);
        let order: Vec<u32> = frames(&out).iter().map(|f| f.2).collect();
        assert_eq!(order, vec![1, 3, 1, 1, 1], "the small answer goes second");
    }

    #[test]
    fn a_stream_waits_for_the_connection_once() {
        let mut o = Outbox::default();
        o.set_initial_window(1 << 20).unwrap();
        o.open(1);
        o.push(1, data(70_000, true));
        let mut out = BytesMut::new();
        o.fill(&mut out, 1 << 20);
        for _ in 0..1000 {
            o.window_update(1, 1).unwrap();
            o.fill(&mut out, 1 << 20);
        }
        assert_eq!(o.blocked_on_conn.len(), 1);
        o.window_update(0, 10_000).unwrap();
        assert_eq!(o.fill(&mut out, 1 << 20), vec![1]);
    }

    #[test]
    fn a_full_output_buffer_stops_filling_and_resumes() {
        let mut o = Outbox::default();
        o.open(1);
        o.push(1, data(30_000, true));
        let mut out = BytesMut::new();
        assert!(o.fill(&mut out, 100).is_empty());
        assert_eq!(frames(&out).len(), 1);
        out.clear();
        assert_eq!(o.fill(&mut out, 1 << 20), vec![1]);
    }
}

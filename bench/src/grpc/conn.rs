//! One HTTP/2 connection of the load generator's gRPC client, as a state
//! machine without I/O: calls go in ([`Connection::start`]), octets read from
//! the server go in ([`Connection::receive`]), and what to write comes out in
//! [`Connection::out`]. The task in [`super`] moves the octets.
//!
//! It speaks what a unary gRPC call needs, and a call whose answers stream
//! (a watch: its requests go in one body and its side stays open), and
//! refuses the rest: the server's settings are obeyed (initial window, frame
//! size, concurrent streams), the request bodies are sent within the server's
//! windows, streams take turns, header blocks are decoded with the
//! connection's HPACK table (so the table stays in step even for calls given
//! up), and every answer becomes the message or a `tonic::Status` as tonic's
//! client would give it.

use std::collections::{HashMap, VecDeque};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use cairn_proto::h2::frame::{self, put_rst_stream, put_window_update, ErrorCode, Head, PREFACE};
use cairn_proto::h2::hpack;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use super::Method;

/// Every stream's receive window, announced once: a unary answer is a few
/// messages at most ([`MAX_MESSAGE_BYTES`]), so its window is never
/// refilled; a streaming call's is topped up as the connection's.
const STREAM_WINDOW: u32 = (1 << 31) - 1;
/// The connection's receive window is raised to this at once and topped up
/// after every [`WINDOW_REFILL`] octets of DATA.
const CONN_WINDOW: u32 = (1 << 31) - 1;
const WINDOW_REFILL: u32 = 1 << 24;
/// Largest answer message taken, as tonic's client by default; a larger one
/// fails its call with OutOfRange.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// The length prefix of a gRPC message: a compression flag and 4 octets.
pub(super) const MESSAGE_PREFIX: usize = 5;
/// Highest client stream id; past it the connection drains and reconnects.
const MAX_STREAM_ID: u32 = (1 << 31) - 1;

/// A call as the connection receives it.
pub struct Call {
    pub method: Method,
    /// The request as gRPC messages: each the 5-octet prefix, then the
    /// encoding (a unary call has one).
    pub body: Bytes,
    pub reply: Reply,
}

/// Where a call's answer goes.
pub enum Reply {
    /// A unary call: its one message, or its status. The body ends the
    /// request.
    Unary(oneshot::Sender<Result<Bytes, Status>>),
    /// A call whose answers stream: each message as it arrives, then a
    /// status if the call failed (the channel closes at its end). The
    /// request stays open after the body, as a watch's must.
    Messages(mpsc::UnboundedSender<Result<Bytes, Status>>),
}

impl Reply {
    /// Whether whoever waits for the answer has stopped waiting.
    fn is_closed(&self) -> bool {
        match self {
            Reply::Unary(tx) => tx.is_closed(),
            Reply::Messages(tx) => tx.is_closed(),
        }
    }

    /// Whether the request's body ends its side of the stream.
    fn ends_request(&self) -> bool {
        matches!(self, Reply::Unary(_))
    }

    /// Ends the call: a streaming call's channel closes after a failure's
    /// status; its `Ok` carries nothing.
    pub fn finish(self, result: Result<Bytes, Status>) {
        match self {
            Reply::Unary(tx) => {
                let _ = tx.send(result);
            }
            Reply::Messages(tx) => {
                if let Err(status) = result {
                    let _ = tx.send(Err(status));
                }
            }
        }
    }
}

/// A broken connection: every call on it fails, and the next call opens a
/// new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken(pub String);

struct Stream {
    reply: Reply,
    /// Request body octets not yet sent.
    unsent: Bytes,
    /// What the server lets this stream send.
    window: i64,
    /// The answer's HEADERS arrived; the next header block is its trailers.
    headers_seen: bool,
    /// The answer's DATA so far (of a streaming call: the message not yet
    /// whole).
    message: BytesMut,
    /// DATA octets of a streaming call since its window was last topped up.
    unacknowledged: u32,
}

pub struct Connection {
    /// The request header block of each [`Method`].
    blocks: [Bytes; Method::ALL.len()],
    streams: HashMap<u32, Stream>,
    /// Streams with body octets to send, in turn.
    sending: VecDeque<u32>,
    /// Calls waiting under the server's concurrent-stream limit.
    waiting: VecDeque<Call>,
    next_stream: u32,
    max_concurrent: usize,
    peer_initial_window: i64,
    peer_max_frame: usize,
    conn_window: i64,
    /// DATA octets received since the connection's window was last topped up.
    received: u32,
    decoder: hpack::Decoder,
    block: hpack::Block,
    /// A header block still expecting CONTINUATION: stream, END_STREAM, octets.
    partial: Option<(u32, bool, BytesMut)>,
    /// GOAWAY came, or stream ids ran out: no new streams here.
    draining: bool,
    /// Octets to write to the server.
    pub out: BytesMut,
}

impl Connection {
    /// A connection to `authority` (host:port), its preface and settings
    /// already in [`Connection::out`]; `token` is sent with every call.
    pub fn new(authority: &str, token: Option<&str>) -> Connection {
        let blocks = Method::ALL.map(|m| request_block(m.path(), authority, token));
        let mut out = BytesMut::with_capacity(64 * 1024);
        out.put_slice(PREFACE);
        frame::put_settings(
            &mut out,
            &[
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (
                    frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                    hpack::MAX_DECODED_LIST_BYTES as u32,
                ),
            ],
        );
        put_window_update(&mut out, 0, CONN_WINDOW - frame::DEFAULT_WINDOW);
        Connection {
            blocks,
            streams: HashMap::new(),
            sending: VecDeque::new(),
            waiting: VecDeque::new(),
            next_stream: 1,
            max_concurrent: usize::MAX,
            peer_initial_window: i64::from(frame::DEFAULT_WINDOW),
            peer_max_frame: frame::DEFAULT_MAX_FRAME as usize,
            conn_window: i64::from(frame::DEFAULT_WINDOW),
            received: 0,
            decoder: hpack::Decoder::default(),
            block: hpack::Block::default(),
            partial: None,
            draining: false,
            out,
        }
    }

    /// Whether new calls may start here.
    pub fn accepting(&self) -> bool {
        !self.draining
    }

    /// Draining, and no stream left open on it: time for a new connection
    /// (for the calls still waiting too, [`Connection::take_waiting`]).
    pub fn drained(&self) -> bool {
        self.draining && self.streams.is_empty()
    }

    /// The calls that waited for a stream and never got one here.
    pub fn take_waiting(&mut self) -> Vec<Call> {
        self.waiting.drain(..).collect()
    }

    /// Starts `call`, or queues it under the server's stream limit.
    pub fn start(&mut self, call: Call) {
        if self.streams.len() >= self.max_concurrent || !self.waiting.is_empty() {
            self.waiting.push_back(call);
        } else {
            self.open(call);
        }
    }

    fn open(&mut self, call: Call) {
        debug_assert!(!self.draining, "no stream opens on a draining connection");
        let id = self.next_stream;
        self.next_stream += 2;
        if self.next_stream > MAX_STREAM_ID {
            self.draining = true;
        }
        let block = &self.blocks[call.method.index()];
        frame::put_head(
            &mut self.out,
            block.len(),
            frame::HEADERS,
            frame::FLAG_END_HEADERS,
            id,
        );
        self.out.put_slice(block);
        self.streams.insert(
            id,
            Stream {
                reply: call.reply,
                unsent: call.body,
                window: self.peer_initial_window,
                headers_seen: false,
                message: BytesMut::new(),
                unacknowledged: 0,
            },
        );
        self.sending.push_back(id);
        self.send_bodies();
    }

    /// Opens waiting calls while the server's limit allows.
    fn admit_waiting(&mut self) {
        while !self.draining && self.streams.len() < self.max_concurrent {
            let Some(call) = self.waiting.pop_front() else {
                return;
            };
            if !call.reply.is_closed() {
                self.open(call);
            }
        }
    }

    /// Sends request bodies as the windows allow, a frame per stream in turn.
    fn send_bodies(&mut self) {
        loop {
            let mut progressed = false;
            for _ in 0..self.sending.len() {
                let Some(id) = self.sending.pop_front() else {
                    break;
                };
                let Some(s) = self.streams.get_mut(&id) else {
                    continue;
                };
                let n = (s.unsent.len() as i64)
                    .min(s.window)
                    .min(self.conn_window)
                    .min(self.peer_max_frame as i64)
                    .max(0) as usize;
                let ends = s.reply.ends_request();
                if n > 0 || (s.unsent.is_empty() && ends) {
                    let chunk = s.unsent.split_to(n);
                    let end = s.unsent.is_empty() && ends;
                    let flags = if end { frame::FLAG_END_STREAM } else { 0 };
                    frame::put_head(&mut self.out, n, frame::DATA, flags, id);
                    self.out.put_slice(&chunk);
                    s.window -= n as i64;
                    self.conn_window -= n as i64;
                    progressed = true;
                }
                if !s.unsent.is_empty() {
                    self.sending.push_back(id);
                }
            }
            if !progressed || self.sending.is_empty() {
                return;
            }
        }
    }

    /// Ends stream `id` with `result`. A stream whose request side is still
    /// open (its body unsent, or a streaming call's) is reset, unless
    /// `reset_by_peer`.
    fn finish(&mut self, id: u32, result: Result<Bytes, Status>, reset_by_peer: bool) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        let request_open = !s.unsent.is_empty() || !s.reply.ends_request();
        if request_open && !reset_by_peer {
            put_rst_stream(&mut self.out, id, ErrorCode::Cancel);
        }
        s.reply.finish(result);
        self.admit_waiting();
    }

    /// Resets the streams whose callers stopped waiting (timed out).
    pub fn cancel_abandoned(&mut self) {
        let gone: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.reply.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.streams.remove(&id);
            put_rst_stream(&mut self.out, id, ErrorCode::Cancel);
        }
        self.waiting.retain(|c| !c.reply.is_closed());
        self.admit_waiting();
    }

    /// Fails every call open or waiting with `status`.
    pub fn fail_all(&mut self, status: &Status) {
        for (_, s) in self.streams.drain() {
            s.reply.finish(Err(status.clone()));
        }
        for call in self.waiting.drain(..) {
            call.reply.finish(Err(status.clone()));
        }
        self.sending.clear();
    }

    /// Takes every whole frame at the front of `input`.
    pub fn receive(&mut self, input: &mut BytesMut) -> Result<(), Broken> {
        while let Some(head) = Head::parse(input) {
            let len = head.len as usize;
            if len > frame::DEFAULT_MAX_FRAME as usize {
                return Err(broken(format!(
                    "a frame of {len} octets, over the {} this client announced",
                    frame::DEFAULT_MAX_FRAME
                )));
            }
            if input.len() < frame::HEADER_LEN + len {
                input.reserve(frame::HEADER_LEN + len - input.len());
                return Ok(());
            }
            input.advance(frame::HEADER_LEN);
            let payload = input.split_to(len).freeze();
            self.on_frame(head, payload)?;
        }
        Ok(())
    }

    fn on_frame(&mut self, head: Head, payload: Bytes) -> Result<(), Broken> {
        if self.partial.is_some() && head.kind != frame::CONTINUATION {
            return Err(broken("a header block interrupted by another frame"));
        }
        let on_stream = head.stream != 0;
        match head.kind {
            frame::DATA if on_stream => self.on_data(head, payload)?,
            frame::HEADERS if on_stream => {
                let mut fragment = unpad(&head, payload)?;
                if head.has(frame::FLAG_PRIORITY) {
                    if fragment.len() < 5 {
                        return Err(broken("HEADERS too short for its priority"));
                    }
                    fragment.advance(5);
                }
                let end_stream = head.has(frame::FLAG_END_STREAM);
                if head.has(frame::FLAG_END_HEADERS) {
                    self.on_block(head.stream, end_stream, &fragment)?;
                } else {
                    self.partial = Some((head.stream, end_stream, BytesMut::from(&fragment[..])));
                }
            }
            frame::CONTINUATION => {
                let Some((stream, end_stream, mut block)) = self.partial.take() else {
                    return Err(broken("CONTINUATION without a header block"));
                };
                if stream != head.stream {
                    return Err(broken("CONTINUATION on another stream"));
                }
                block.extend_from_slice(&payload);
                if block.len() > hpack::MAX_DECODED_LIST_BYTES {
                    return Err(broken("a header block over the announced list size"));
                }
                if head.has(frame::FLAG_END_HEADERS) {
                    self.on_block(stream, end_stream, &block)?;
                } else {
                    self.partial = Some((stream, end_stream, block));
                }
            }
            frame::RST_STREAM if on_stream => {
                let code = u32_of(&payload, "RST_STREAM")?;
                let status = reset_status(code);
                self.finish(head.stream, Err(status), true);
            }
            frame::SETTINGS if !on_stream => self.on_settings(&head, &payload)?,
            frame::PING if !on_stream => {
                let payload: &[u8; 8] = payload[..]
                    .try_into()
                    .map_err(|_| broken("a PING that is not 8 octets"))?;
                if !head.has(frame::FLAG_ACK) {
                    frame::put_ping_ack(&mut self.out, payload);
                }
            }
            frame::GOAWAY if !on_stream => {
                if payload.len() < 8 {
                    return Err(broken("a GOAWAY under 8 octets"));
                }
                let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                self.draining = true;
                let unanswered: Vec<u32> = self
                    .streams
                    .keys()
                    .copied()
                    .filter(|&id| id > last)
                    .collect();
                for id in unanswered {
                    let status = Status::unavailable(format!(
                        "the server is going away (error code {code:#x}) and did not take the call"
                    ));
                    self.finish(id, Err(status), true);
                }
                let status = Status::unavailable("the server is going away");
                for call in self.waiting.drain(..) {
                    call.reply.finish(Err(status.clone()));
                }
            }
            frame::WINDOW_UPDATE => {
                let increment = u32_of(&payload, "WINDOW_UPDATE")? & 0x7fff_ffff;
                if increment == 0 {
                    return Err(broken("a WINDOW_UPDATE of 0"));
                }
                let window = if on_stream {
                    match self.streams.get_mut(&head.stream) {
                        Some(s) => &mut s.window,
                        None => return Ok(()),
                    }
                } else {
                    &mut self.conn_window
                };
                *window += i64::from(increment);
                if *window > frame::MAX_WINDOW {
                    return Err(broken("a window past 2^31-1"));
                }
                self.send_bodies();
            }
            frame::PUSH_PROMISE => return Err(broken("PUSH_PROMISE though push is off")),
            frame::DATA | frame::HEADERS | frame::RST_STREAM => {
                return Err(broken("a stream frame on stream 0"));
            }
            frame::SETTINGS | frame::PING | frame::GOAWAY => {
                return Err(broken("a connection frame on a stream"));
            }
            // PRIORITY and frame types this client does not know.
            _ => {}
        }
        Ok(())
    }

    fn on_data(&mut self, head: Head, payload: Bytes) -> Result<(), Broken> {
        // Flow control counts the whole payload, padding included.
        self.received += head.len;
        if self.received >= WINDOW_REFILL {
            put_window_update(&mut self.out, 0, self.received);
            self.received = 0;
        }
        let data = unpad(&head, payload)?;
        let Some(s) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        if !s.headers_seen {
            let status = Status::internal("the server sent DATA before HEADERS");
            put_rst_stream(&mut self.out, head.stream, ErrorCode::Protocol);
            self.finish(head.stream, Err(status), true);
            return Ok(());
        }
        s.message.extend_from_slice(&data);
        if let Reply::Messages(tx) = &s.reply {
            s.unacknowledged += head.len;
            if s.unacknowledged >= WINDOW_REFILL {
                put_window_update(&mut self.out, head.stream, s.unacknowledged);
                s.unacknowledged = 0;
            }
            loop {
                match next_message(&mut s.message) {
                    // A reader gone: its stream is reset on the next sweep.
                    Ok(Some(message)) => drop(tx.send(Ok(message))),
                    Ok(None) => break,
                    Err(status) => {
                        put_rst_stream(&mut self.out, head.stream, ErrorCode::Cancel);
                        self.finish(head.stream, Err(status), true);
                        return Ok(());
                    }
                }
            }
        }
        if s.message.len() > MESSAGE_PREFIX + MAX_MESSAGE_BYTES {
            let status = Status::out_of_range(format!(
                "the answer is over {MAX_MESSAGE_BYTES} bytes, the largest this client takes"
            ));
            put_rst_stream(&mut self.out, head.stream, ErrorCode::Cancel);
            self.finish(head.stream, Err(status), true);
        } else if head.has(frame::FLAG_END_STREAM) {
            let status = Status::unknown("the server ended the answer without trailers");
            self.finish(head.stream, Err(status), false);
        }
        Ok(())
    }

    /// A whole header block of `stream`: the answer's headers or trailers.
    fn on_block(&mut self, stream: u32, end_stream: bool, block: &[u8]) -> Result<(), Broken> {
        // Decoded even for a call given up, to keep the table in step.
        self.decoder
            .decode(block, &mut self.block)
            .map_err(|e| broken(format!("a header block: {e}")))?;
        let Some(s) = self.streams.get_mut(&stream) else {
            return Ok(());
        };
        if !s.headers_seen {
            let http = field(&self.block, ":status");
            if http != Some(&b"200"[..]) {
                let status = http_status(http);
                if !end_stream {
                    put_rst_stream(&mut self.out, stream, ErrorCode::Cancel);
                }
                // Ended by the server with the request unsent: finish resets it.
                self.finish(stream, Err(status), !end_stream);
                return Ok(());
            }
            s.headers_seen = true;
            if !end_stream {
                return Ok(());
            }
        } else if !end_stream {
            put_rst_stream(&mut self.out, stream, ErrorCode::Protocol);
            let status = Status::internal("trailers without END_STREAM");
            self.finish(stream, Err(status), true);
            return Ok(());
        }
        let result = match (grpc_status(&self.block), &s.reply) {
            (Ok(()), Reply::Unary(_)) => message_of(&mut s.message),
            (Ok(()), Reply::Messages(_)) if s.message.is_empty() => Ok(Bytes::new()),
            (Ok(()), Reply::Messages(_)) => {
                Err(Status::internal("the answers ended inside a message"))
            }
            (Err(status), _) => Err(status),
        };
        self.finish(stream, result, false);
        Ok(())
    }

    fn on_settings(&mut self, head: &Head, payload: &[u8]) -> Result<(), Broken> {
        if head.has(frame::FLAG_ACK) {
            return if payload.is_empty() {
                Ok(())
            } else {
                Err(broken("a SETTINGS acknowledgement with a payload"))
            };
        }
        if !payload.len().is_multiple_of(6) {
            return Err(broken("SETTINGS not a multiple of 6 octets"));
        }
        for entry in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([entry[0], entry[1]]);
            let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
            match id {
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(value) > frame::MAX_WINDOW {
                        return Err(broken("an initial window past 2^31-1"));
                    }
                    let delta = i64::from(value) - self.peer_initial_window;
                    self.peer_initial_window = i64::from(value);
                    for s in self.streams.values_mut() {
                        s.window += delta;
                        if s.window > frame::MAX_WINDOW {
                            return Err(broken("a stream window past 2^31-1"));
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=frame::MAX_MAX_FRAME).contains(&value) {
                        return Err(broken(format!("a maximum frame size of {value}")));
                    }
                    self.peer_max_frame = value as usize;
                }
                frame::SETTINGS_MAX_CONCURRENT_STREAMS => {
                    self.max_concurrent = value as usize;
                }
                _ => {}
            }
        }
        frame::put_settings_ack(&mut self.out);
        self.send_bodies();
        self.admit_waiting();
        Ok(())
    }
}

fn broken(reason: impl Into<String>) -> Broken {
    Broken(reason.into())
}

/// The header block of a call to `path`: literals, so the server's table is
/// never touched and the block is the same for every call.
fn request_block(path: &str, authority: &str, token: Option<&str>) -> Bytes {
    let fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    let token = token.map(|t| (crate::security::TOKEN_METADATA_KEY, t));
    let block = hpack::Block::literals(fields.into_iter().chain(token));
    let mut out = BytesMut::new();
    hpack::encode_literals(&block, &mut out);
    out.freeze()
}

fn u32_of(payload: &[u8], kind: &str) -> Result<u32, Broken> {
    let b: [u8; 4] = payload
        .try_into()
        .map_err(|_| broken(format!("a {kind} that is not 4 octets")))?;
    Ok(u32::from_be_bytes(b))
}

/// A DATA or HEADERS payload without its padding.
fn unpad(head: &Head, payload: Bytes) -> Result<Bytes, Broken> {
    match frame::unpadded(head, &payload) {
        Ok(data) => Ok(payload.slice(data)),
        Err(frame::PaddingError::NoPadLength) => {
            Err(broken("a padded frame without its pad length"))
        }
        Err(frame::PaddingError::TooLong) => Err(broken("padding longer than its frame")),
    }
}

fn field<'a>(block: &'a hpack::Block, name: &str) -> Option<&'a [u8]> {
    block
        .fields
        .iter()
        .find(|f| f.name == name.as_bytes())
        .map(|f| &f.value[..])
}

/// The status of trailers: Ok for grpc-status 0.
fn grpc_status(block: &hpack::Block) -> Result<(), Status> {
    let Some(raw) = field(block, "grpc-status") else {
        return Err(Status::unknown("the answer has no grpc-status"));
    };
    let code = std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
        .ok_or_else(|| Status::unknown("the answer's grpc-status is not a number"))?;
    if code == 0 {
        return Ok(());
    }
    let message = field(block, "grpc-message")
        .map(percent_decode)
        .unwrap_or_default();
    Err(Status::new(Code::from_i32(code), message))
}

/// The one message of a successful answer.
fn message_of(data: &mut BytesMut) -> Result<Bytes, Status> {
    if data.len() < MESSAGE_PREFIX {
        return Err(Status::internal("the answer carries no message"));
    }
    let len = message_len(data)?;
    if len != data.len() - MESSAGE_PREFIX {
        return Err(Status::internal(format!(
            "the answer's message says {len} bytes but {} arrived",
            data.len() - MESSAGE_PREFIX
        )));
    }
    data.advance(MESSAGE_PREFIX);
    Ok(std::mem::take(data).freeze())
}

/// The length its prefix gives the message at the front of `data` (at
/// least [`MESSAGE_PREFIX`] octets), which must not be compressed.
fn message_len(data: &[u8]) -> Result<usize, Status> {
    if data[0] != 0 {
        return Err(Status::internal(
            "the answer is compressed though no compression was offered",
        ));
    }
    Ok(u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize)
}

/// The message at the front of a streaming call's DATA, taken off it once
/// whole; `None` while only part of it has arrived.
fn next_message(data: &mut BytesMut) -> Result<Option<Bytes>, Status> {
    if data.len() < MESSAGE_PREFIX {
        return Ok(None);
    }
    let len = message_len(data)?;
    if len > MAX_MESSAGE_BYTES {
        return Err(Status::out_of_range(format!(
            "an answer of {len} bytes, over the {MAX_MESSAGE_BYTES} this client takes"
        )));
    }
    if data.len() < MESSAGE_PREFIX + len {
        return Ok(None);
    }
    data.advance(MESSAGE_PREFIX);
    Ok(Some(data.split_to(len).freeze()))
}

/// gRPC's mapping of a non-200 HTTP status (doc/http-grpc-status-mapping.md).
fn http_status(status: Option<&[u8]>) -> Status {
    let text = status.map(String::from_utf8_lossy).unwrap_or_default();
    let code = match &*text {
        "400" => Code::Internal,
        "401" => Code::Unauthenticated,
        "403" => Code::PermissionDenied,
        "404" => Code::Unimplemented,
        "429" | "502" | "503" | "504" => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP status {text} from the server"))
}

/// The status of a call the server reset, as gRPC's clients map the code.
fn reset_status(code: u32) -> Status {
    let grpc = match code {
        0x7 => Code::Unavailable,
        0x8 => Code::Cancelled,
        0xb => Code::ResourceExhausted,
        0xc => Code::PermissionDenied,
        0x0..=0x4 | 0x9 | 0xa => Code::Internal,
        _ => Code::Unknown,
    };
    Status::new(
        grpc,
        format!("stream reset by the server (error code {code:#x})"),
    )
}

/// grpc-message's percent-encoding undone; invalid escapes stay as they are.
fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;

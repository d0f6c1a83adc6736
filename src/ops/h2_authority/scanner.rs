//! The client-to-server half of an HTTP/2 connection, frame by frame: every
//! frame passes unchanged except header blocks that must be rewritten.
//!
//! No I/O here: [`Scanner::scan_in_place`] says how much of freshly read
//! bytes may go to the server as they are (the fast path, no copy), and
//! [`Scanner::feed`] takes the rest, holds an incomplete header block until
//! its last frame arrives, and writes what the server must see.

use bytes::{BufMut, BytesMut};

use cairn_proto::h2::hpack::{self, Block, DecodeError, Decoder};

/// Every frame opens with 9 octets: length (24 bits), type, flags, stream.
pub const FRAME_HEADER_BYTES: usize = 9;
/// The largest frame payload sent to the server: the smallest
/// SETTINGS_MAX_FRAME_SIZE a server may announce (RFC 9113 §4.2), so no need
/// to read the server's SETTINGS.
pub const MAX_FRAME_PAYLOAD_BYTES: usize = 16_384;
/// The most octets of one header block (its frames, headers included) held
/// while waiting for its end. hyper refuses header lists over 16 KiB
/// decoded, so a larger block only ever earns a refusal; past this the
/// connection is passed through untouched (or closed, once rewriting).
pub const MAX_HEADER_BLOCK_BYTES: usize = 64 * 1024;
const _: () = assert!(MAX_HEADER_BLOCK_BYTES >= 2 * (FRAME_HEADER_BYTES + MAX_FRAME_PAYLOAD_BYTES));

pub(super) const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
pub(super) const CONTINUATION: u8 = 0x9;
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;
/// Stream dependency (32 bits) and weight (8) of a HEADERS with PRIORITY.
const PRIORITY_BYTES: usize = 5;

/// The client broke HTTP/2 or HPACK after the connection's blocks started
/// being rewritten: the server's view can no longer follow, so the
/// connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShimError {
    #[error("HPACK: {0}")]
    Hpack(#[from] DecodeError),
    #[error("HTTP/2 framing: {0}")]
    Framing(&'static str),
    #[error("header block longer than {MAX_HEADER_BLOCK_BYTES} bytes")]
    TooLarge,
}

/// Where the scan stands in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At a frame's first octet.
    Boundary,
    /// Inside a frame that passes unchanged: this many octets of it remain.
    Skip(usize),
    /// Scanning stopped: the client broke the protocol before any block was
    /// rewritten, so the server sees exactly what the client sent and
    /// refuses it itself.
    Opaque,
}

/// What [`Scanner::scan_in_place`] decided about a read.
#[derive(Debug, PartialEq, Eq)]
pub enum InPlace {
    /// All of it goes to the server as it is.
    All,
    /// `..pass` goes as it is, then `replacement` (a rewritten header block),
    /// then whatever [`Scanner::feed`] makes of `rest_from..`.
    Split {
        pass: usize,
        replacement: Option<BytesMut>,
        rest_from: usize,
    },
}

/// What the frames at the start of a buffer are.
enum Unit {
    /// The next frame header or header block is not complete yet.
    NeedMore,
    /// A frame other than a header block, of this many octets in all.
    Pass { frame_bytes: usize },
    /// A complete header block of this many octets (its frames), and its
    /// rewrite when the server must see another.
    Block {
        frame_bytes: usize,
        rewritten: Option<BytesMut>,
    },
    /// The client broke the protocol before anything was rewritten.
    GiveUp,
}

/// The HPACK side: the client's dynamic table and the rewriting.
#[derive(Debug, Default)]
struct Rewriter {
    decoder: Decoder,
    /// Scratch, reused: the decoded block.
    block: Block,
    /// Scratch, reused: a block's fragments joined when it spans frames.
    fragment: Vec<u8>,
    /// Set by the first rewrite. From then on the server's dynamic table no
    /// longer mirrors the client's, so every later block is rewritten too.
    rewriting: bool,
}

/// Whether a `:authority` value carries a scheme (`http://host:port`).
fn has_scheme(value: &[u8]) -> bool {
    value.windows(3).any(|w| w == b"://")
}

/// `scheme://host:port/anything` becomes `host:port`, as Go's gRPC server
/// would read it.
fn strip_scheme(value: &[u8]) -> &[u8] {
    let Some(at) = value.windows(3).position(|w| w == b"://") else {
        return value;
    };
    let rest = &value[at + 3..];
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    &rest[..end]
}

fn frame_len(header: &[u8]) -> usize {
    usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2])
}

impl Rewriter {
    fn give_up(&self, why: &'static str) -> Result<Unit, ShimError> {
        if self.rewriting {
            return Err(ShimError::Framing(why));
        }
        tracing::debug!(
            why,
            "client port: HTTP/2 connection passed through unscanned"
        );
        Ok(Unit::GiveUp)
    }

    fn next_unit(&mut self, buf: &[u8]) -> Result<Unit, ShimError> {
        if buf.len() < FRAME_HEADER_BYTES {
            return Ok(Unit::NeedMore);
        }
        match buf[3] {
            HEADERS => self.header_block(buf),
            CONTINUATION => self.give_up("CONTINUATION outside a header block"),
            PUSH_PROMISE => self.give_up("PUSH_PROMISE from a client"),
            _ => Ok(Unit::Pass {
                frame_bytes: FRAME_HEADER_BYTES + frame_len(buf),
            }),
        }
    }

    /// `buf` opens with a HEADERS frame: finds the block's last frame and,
    /// once all of it is in `buf`, decodes it.
    fn header_block(&mut self, buf: &[u8]) -> Result<Unit, ShimError> {
        let stream = &buf[5..FRAME_HEADER_BYTES];
        let mut end = 0;
        let mut frames = 0;
        loop {
            let Some(header) = buf.get(end..end + FRAME_HEADER_BYTES) else {
                return Ok(Unit::NeedMore);
            };
            if frames > 0 && (header[3] != CONTINUATION || &header[5..] != stream) {
                return self.give_up("header block interrupted by another frame");
            }
            end += FRAME_HEADER_BYTES + frame_len(header);
            frames += 1;
            if end > MAX_HEADER_BLOCK_BYTES {
                if self.rewriting {
                    return Err(ShimError::TooLarge);
                }
                return self.give_up("header block too large to hold");
            }
            if buf.len() < end {
                return Ok(Unit::NeedMore);
            }
            if header[4] & END_HEADERS != 0 {
                break;
            }
        }
        self.decode_block(&buf[..end], frames)
    }

    /// `frames`: one HEADERS and its CONTINUATIONs, complete.
    fn decode_block(&mut self, frames: &[u8], count: usize) -> Result<Unit, ShimError> {
        let flags = frames[4];
        let first_end = FRAME_HEADER_BYTES + frame_len(frames);
        let mut payload = &frames[FRAME_HEADER_BYTES..first_end];
        let mut pad = 0;
        if flags & PADDED != 0 {
            let Some((&n, rest)) = payload.split_first() else {
                return self.give_up("PADDED HEADERS without a pad length");
            };
            pad = usize::from(n);
            payload = rest;
        }
        let mut priority: &[u8] = &[];
        if flags & PRIORITY != 0 {
            if payload.len() < PRIORITY_BYTES {
                return self.give_up("HEADERS too short for its priority");
            }
            (priority, payload) = payload.split_at(PRIORITY_BYTES);
        }
        if pad > payload.len() {
            return self.give_up("HEADERS padding longer than its payload");
        }
        payload = &payload[..payload.len() - pad];
        let decoded = if count == 1 {
            self.decoder.decode(payload, &mut self.block)
        } else {
            self.fragment.clear();
            self.fragment.extend_from_slice(payload);
            let mut at = first_end;
            while at < frames.len() {
                let next = at + FRAME_HEADER_BYTES + frame_len(&frames[at..]);
                self.fragment
                    .extend_from_slice(&frames[at + FRAME_HEADER_BYTES..next]);
                at = next;
            }
            self.decoder.decode(&self.fragment, &mut self.block)
        };
        if let Err(error) = decoded {
            if self.rewriting {
                return Err(error.into());
            }
            tracing::debug!(%error, "client port: HPACK error; h2 will refuse the connection");
            return Ok(Unit::GiveUp);
        }
        let needed = self
            .block
            .fields
            .iter()
            .any(|f| f.name.as_ref() == b":authority" && has_scheme(&f.value));
        if !needed && !self.rewriting {
            return Ok(Unit::Block {
                frame_bytes: frames.len(),
                rewritten: None,
            });
        }
        if !self.rewriting {
            tracing::debug!("client port: rewriting a :authority that carries a scheme");
            self.rewriting = true;
        }
        let stream = &frames[5..FRAME_HEADER_BYTES];
        Ok(Unit::Block {
            frame_bytes: frames.len(),
            rewritten: Some(self.encode(flags & END_STREAM, priority, stream)),
        })
    }

    /// The decoded block with its authority fixed, as HEADERS and
    /// CONTINUATION frames no larger than [`MAX_FRAME_PAYLOAD_BYTES`].
    fn encode(&mut self, end_stream: u8, priority: &[u8], stream: &[u8]) -> BytesMut {
        self.block.fields.retain_mut(|f| {
            if f.name.as_ref() == b":authority" && has_scheme(&f.value) {
                let stripped = strip_scheme(&f.value);
                f.value = f.value.slice_ref(stripped);
            }
            // An empty authority is not one; h2 reads a request without it.
            !(f.name.as_ref() == b":authority" && f.value.is_empty())
        });
        let mut fragment = BytesMut::new();
        fragment.extend_from_slice(priority);
        hpack::encode_literals(&self.block, &mut fragment);
        let frames = fragment.len().div_ceil(MAX_FRAME_PAYLOAD_BYTES).max(1);
        let mut out = BytesMut::with_capacity(fragment.len() + frames * FRAME_HEADER_BYTES);
        let mut first = true;
        loop {
            let chunk = fragment.split_to(fragment.len().min(MAX_FRAME_PAYLOAD_BYTES));
            let last = fragment.is_empty();
            let (kind, mut flags) = if first {
                let prio = if priority.is_empty() { 0 } else { PRIORITY };
                (HEADERS, end_stream | prio)
            } else {
                (CONTINUATION, 0)
            };
            if last {
                flags |= END_HEADERS;
            }
            out.put_uint(chunk.len() as u64, 3);
            out.put_u8(kind);
            out.put_u8(flags);
            out.put_slice(stream);
            out.put_slice(&chunk);
            first = false;
            if last {
                return out;
            }
        }
    }
}

/// One connection's client-to-server scan.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    /// Octets read but not yet decided, from a frame's first octet: an
    /// incomplete frame header or header block. Non-empty only at
    /// [`State::Boundary`].
    pending: BytesMut,
    rewriter: Rewriter,
}

impl Scanner {
    /// A scanner whose stream starts with `skip_bytes` octets that are not
    /// frames (the connection preface).
    pub fn new(skip_bytes: usize) -> Self {
        Scanner {
            state: if skip_bytes == 0 {
                State::Boundary
            } else {
                State::Skip(skip_bytes)
            },
            pending: BytesMut::new(),
            rewriter: Rewriter::default(),
        }
    }

    /// Whether octets are held back: then new input must go through
    /// [`Scanner::feed`].
    pub fn is_holding(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Scans fresh input while nothing is held. The fast path: frames that
    /// need no change are only looked at.
    pub fn scan_in_place(&mut self, input: &[u8]) -> Result<InPlace, ShimError> {
        debug_assert!(!self.is_holding());
        let mut at = 0;
        loop {
            match self.state {
                State::Opaque => return Ok(InPlace::All),
                State::Skip(remaining) => {
                    let n = remaining.min(input.len() - at);
                    at += n;
                    self.state = if n == remaining {
                        State::Boundary
                    } else {
                        State::Skip(remaining - n)
                    };
                    if at == input.len() {
                        return Ok(InPlace::All);
                    }
                }
                State::Boundary => {
                    if at == input.len() {
                        return Ok(InPlace::All);
                    }
                    match self.rewriter.next_unit(&input[at..])? {
                        Unit::NeedMore => {
                            return Ok(InPlace::Split {
                                pass: at,
                                replacement: None,
                                rest_from: at,
                            })
                        }
                        Unit::GiveUp => {
                            self.state = State::Opaque;
                            return Ok(InPlace::All);
                        }
                        Unit::Pass { frame_bytes } => self.state = State::Skip(frame_bytes),
                        Unit::Block {
                            frame_bytes,
                            rewritten: None,
                        } => at += frame_bytes,
                        Unit::Block {
                            frame_bytes,
                            rewritten: Some(replacement),
                        } => {
                            return Ok(InPlace::Split {
                                pass: at,
                                replacement: Some(replacement),
                                rest_from: at + frame_bytes,
                            })
                        }
                    }
                }
            }
        }
    }

    /// Takes input and appends to `out` what the server gets in its place,
    /// holding back an incomplete frame header or header block.
    pub fn feed(&mut self, mut input: &[u8], out: &mut BytesMut) -> Result<(), ShimError> {
        loop {
            match self.state {
                State::Opaque => {
                    out.extend_from_slice(&self.pending.split());
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Skip(remaining) => {
                    debug_assert!(self.pending.is_empty());
                    let n = remaining.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if n == remaining {
                        State::Boundary
                    } else {
                        State::Skip(remaining - n)
                    };
                    if input.is_empty() {
                        return Ok(());
                    }
                }
                State::Boundary => {
                    self.pending.extend_from_slice(input);
                    input = &[];
                    match self.rewriter.next_unit(&self.pending)? {
                        Unit::NeedMore => return Ok(()),
                        Unit::GiveUp => self.state = State::Opaque,
                        Unit::Pass { frame_bytes } => {
                            let n = frame_bytes.min(self.pending.len());
                            out.extend_from_slice(&self.pending.split_to(n));
                            if n < frame_bytes {
                                self.state = State::Skip(frame_bytes - n);
                            }
                        }
                        Unit::Block {
                            frame_bytes,
                            rewritten,
                        } => {
                            let frames = self.pending.split_to(frame_bytes);
                            out.extend_from_slice(&rewritten.unwrap_or(frames));
                        }
                    }
                }
            }
        }
    }

    /// The client has closed its side: whatever is held goes to the server as
    /// it is, which then sees the truncated frame.
    pub fn release(&mut self, out: &mut BytesMut) {
        out.extend_from_slice(&self.pending.split());
        self.state = State::Opaque;
    }
}

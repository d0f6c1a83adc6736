//! HTTP/2 frames (RFC 9113 §4 and §6): the 9-byte header, the frame types and
//! flags gRPC's servers and clients read and write, and writers that append
//! whole frames to an output buffer.

use bytes::{BufMut, BytesMut};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Length of every frame header.
pub const HEADER_LEN: usize = 9;
/// The largest frame payload a peer may send before it learns our settings,
/// and the one we announce: SETTINGS_MAX_FRAME_SIZE's initial value.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;
/// The largest value SETTINGS_MAX_FRAME_SIZE may take.
pub const MAX_MAX_FRAME: u32 = (1 << 24) - 1;
/// A flow-control window's initial size before SETTINGS say otherwise.
pub const DEFAULT_WINDOW: u32 = 65_535;
/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const FLAG_END_STREAM: u8 = 0x1;
pub const FLAG_ACK: u8 = 0x1;
pub const FLAG_END_HEADERS: u8 = 0x4;
pub const FLAG_PADDED: u8 = 0x8;
pub const FLAG_PRIORITY: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// HTTP/2 error codes (RFC 9113 §7) Cairn sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    NoError = 0x0,
    Protocol = 0x1,
    Internal = 0x2,
    FlowControl = 0x3,
    StreamClosed = 0x5,
    FrameSize = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    Compression = 0x9,
    EnhanceYourCalm = 0xb,
}

/// A frame's header, as read off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    /// Parses the first [`HEADER_LEN`] bytes of `buf`; `None` when fewer are
    /// there. The reserved bit of the stream id is ignored, as the RFC says.
    pub fn parse(buf: &[u8]) -> Option<Head> {
        let b: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        })
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// Why a PADDED frame's padding cannot be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddingError {
    /// The payload is empty: no pad length octet.
    NoPadLength,
    /// The pad length is past the payload.
    TooLong,
}

/// Where the data of a DATA or HEADERS `payload` lies once its
/// padding is removed (the whole payload when the frame is not PADDED).
pub fn unpadded(head: &Head, payload: &[u8]) -> Result<std::ops::Range<usize>, PaddingError> {
    if !head.has(FLAG_PADDED) {
        return Ok(0..payload.len());
    }
    let Some(&pad) = payload.first() else {
        return Err(PaddingError::NoPadLength);
    };
    let end = (payload.len() - 1)
        .checked_sub(usize::from(pad))
        .ok_or(PaddingError::TooLong)?;
    Ok(1..end + 1)
}

/// Appends a frame header.
pub fn put_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len <= MAX_MAX_FRAME as usize);
    let len = (len as u32).to_be_bytes();
    out.put_slice(&[len[1], len[2], len[3], kind, flags]);
    out.put_u32(stream & 0x7fff_ffff);
}

/// Appends a SETTINGS frame with `(id, value)` pairs.
pub fn put_settings(out: &mut BytesMut, settings: &[(u16, u32)]) {
    put_head(out, settings.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in settings {
        out.put_u16(id);
        out.put_u32(value);
    }
}

pub fn put_settings_ack(out: &mut BytesMut) {
    put_head(out, 0, SETTINGS, FLAG_ACK, 0);
}

pub fn put_ping_ack(out: &mut BytesMut, payload: &[u8; 8]) {
    put_head(out, 8, PING, FLAG_ACK, 0);
    out.put_slice(payload);
}

pub fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.put_u32(increment & 0x7fff_ffff);
}

pub fn put_rst_stream(out: &mut BytesMut, stream: u32, code: ErrorCode) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.put_u32(code as u32);
}

/// Appends a GOAWAY frame; `debug` is cut to 256 bytes.
pub fn put_goaway(out: &mut BytesMut, last_stream: u32, code: ErrorCode, debug: &str) {
    let debug = &debug.as_bytes()[..debug.len().min(256)];
    put_head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.put_u32(last_stream & 0x7fff_ffff);
    out.put_u32(code as u32);
    out.put_slice(debug);
}

/// Appends a header block as HEADERS plus CONTINUATION frames of at most
/// `max_frame` bytes each.
pub fn put_header_block(
    out: &mut BytesMut,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let max_frame = max_frame.max(1);
    let mut chunks = block.chunks(max_frame);
    let first = chunks.next().unwrap_or(&[]);
    let single = block.len() <= max_frame;
    let mut flags = if end_stream { FLAG_END_STREAM } else { 0 };
    if single {
        flags |= FLAG_END_HEADERS;
    }
    put_head(out, first.len(), HEADERS, flags, stream);
    out.put_slice(first);
    let mut rest = chunks.peekable();
    while let Some(chunk) = rest.next() {
        let flags = if rest.peek().is_none() {
            FLAG_END_HEADERS
        } else {
            0
        };
        put_head(out, chunk.len(), CONTINUATION, flags, stream);
        out.put_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_round_trips_and_drops_the_reserved_bit() {
        let mut out = BytesMut::new();
        put_head(&mut out, 70_000, DATA, FLAG_END_STREAM, 7);
        assert_eq!(out.len(), HEADER_LEN);
        let head = Head::parse(&out).unwrap();
        assert_eq!(
            head,
            Head {
                len: 70_000,
                kind: DATA,
                flags: FLAG_END_STREAM,
                stream: 7
            }
        );
        out[5] |= 0x80;
        assert_eq!(Head::parse(&out).unwrap().stream, 7);
        assert_eq!(Head::parse(&out[..8]), None);
    }

    #[test]
    fn a_long_header_block_is_split_into_continuations() {
        let block: Vec<u8> = (0..25u8).collect();
        let mut out = BytesMut::new();
        put_header_block(&mut out, 3, &block, true, 10);
        let mut at = 0;
        let mut frames = Vec::new();
        while let Some(h) = Head::parse(&out[at..]) {
            frames.push((h.kind, h.flags, h.len));
            at += HEADER_LEN + h.len as usize;
        }
        assert_eq!(
            frames,
            vec![
                (HEADERS, FLAG_END_STREAM, 10),
                (CONTINUATION, 0, 10),
                (CONTINUATION, FLAG_END_HEADERS, 5)
            ]
        );
        let mut out = BytesMut::new();
        put_header_block(&mut out, 3, &block, false, 100);
        let h = Head::parse(&out).unwrap();
        assert_eq!((h.kind, h.flags, h.len), (HEADERS, FLAG_END_HEADERS, 25));
    }
}

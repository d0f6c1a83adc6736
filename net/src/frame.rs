//! The frame: a fixed 20-byte header and a payload (layout in `net/FORMAT.md`).
//!
//! Decoding reads into one large [`BytesMut`] and hands each payload on as a
//! [`Bytes`] slice of it, so a payload is never copied between the socket and its
//! consumer. Every length is checked against the configured maximum before a byte
//! of buffer is reserved for it.

use std::mem::size_of;

use bytes::{Bytes, BytesMut};
use thiserror::Error;

/// First bytes of every frame: "CRNF" (Cairn frame).
pub const MAGIC: [u8; 4] = *b"CRNF";
/// Wire version spoken by this build. A peer with another version is refused at
/// the handshake; a frame with another version afterwards closes the connection.
pub const VERSION: u8 = 1;

const MAGIC_OFFSET: usize = 0;
const VERSION_OFFSET: usize = MAGIC_OFFSET + MAGIC.len();
const KIND_OFFSET: usize = VERSION_OFFSET + size_of::<u8>();
const FLAGS_OFFSET: usize = KIND_OFFSET + size_of::<u8>();
const SHARD_OFFSET: usize = FLAGS_OFFSET + size_of::<u16>();
const LEN_OFFSET: usize = SHARD_OFFSET + size_of::<u32>();
const CRC_OFFSET: usize = LEN_OFFSET + size_of::<u32>();
/// Size of the fixed frame header in bytes.
pub const HEADER_BYTES: usize = CRC_OFFSET + size_of::<u32>();

/// Default largest payload accepted or sent: 16 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 16 << 20;
/// Largest value `max_frame_payload_bytes` may be configured to (1 GiB): keeps
/// `HEADER_BYTES + len` far from `u32`/`usize` overflow on every platform.
pub const MAX_PAYLOAD_LIMIT_BYTES: u32 = 1 << 30;
/// Smallest value `max_frame_payload_bytes` may be configured to: a handshake or
/// stream control frame must always fit.
pub const MIN_PAYLOAD_LIMIT_BYTES: u32 = 4096;

/// Retired receive buffers a decoder keeps for reuse.
pub const RECEIVE_POOL_BUFFERS: usize = 2;

const _: () = assert!(HEADER_BYTES == 20);
const _: () = assert!(DEFAULT_MAX_PAYLOAD_BYTES <= MAX_PAYLOAD_LIMIT_BYTES);
const _: () = assert!(MIN_PAYLOAD_LIMIT_BYTES <= DEFAULT_MAX_PAYLOAD_BYTES);
const _: () = assert!((MAX_PAYLOAD_LIMIT_BYTES as usize) < usize::MAX - HEADER_BYTES);

/// What a frame carries. Numbers are on the wire; never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Dialer's greeting: cluster id, its member id, the member it expects, lane.
    Hello = 1,
    /// Acceptor's answer when the greeting is accepted.
    HelloAccept = 2,
    /// Acceptor's answer when it refuses: reason code and text.
    HelloRefuse = 3,
    /// An opaque message (a Raft message, a heartbeat); flags belong to the caller.
    Message = 4,
    /// A large transfer begins (or begins again from its first byte).
    StreamStart = 5,
    /// One chunk of a large transfer.
    StreamChunk = 6,
    /// End marker: total length and CRC32 of the whole stream.
    StreamEnd = 7,
    /// Receiver's credit: how many chunks of a stream it has passed on.
    StreamAck = 8,
    /// Receiver's verdict on a finished stream: checksum matched or not.
    StreamResult = 9,
}

impl FrameKind {
    /// Maps a wire byte to a kind; `None` for a kind this version does not know.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::Hello,
            2 => Self::HelloAccept,
            3 => Self::HelloRefuse,
            4 => Self::Message,
            5 => Self::StreamStart,
            6 => Self::StreamChunk,
            7 => Self::StreamEnd,
            8 => Self::StreamAck,
            9 => Self::StreamResult,
            _ => return None,
        })
    }

    /// Whether the flags field is the caller's (only for messages); every other
    /// kind must carry zero flags.
    fn flags_are_free(self) -> bool {
        self == Self::Message
    }
}

/// Why a byte stream is not a valid sequence of frames. Every variant ends the
/// connection it came from.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The stream does not start with [`MAGIC`]: garbage or another protocol.
    #[error("bad magic {found:02x?} at stream offset {offset}, expected {MAGIC:02x?}")]
    BadMagic { offset: u64, found: Vec<u8> },
    /// The frame speaks another wire version.
    #[error(
        "unsupported wire version {found} at stream offset {offset}, this build speaks {VERSION}"
    )]
    UnsupportedVersion { offset: u64, found: u8 },
    /// The kind byte names no kind this version knows.
    #[error("unknown frame kind {kind} at stream offset {offset}")]
    UnknownKind { offset: u64, kind: u8 },
    /// Flags set on a kind that defines none.
    #[error(
        "flags {flags:#06x} set on {kind:?} frame at stream offset {offset}, which defines none"
    )]
    BadFlags {
        offset: u64,
        kind: FrameKind,
        flags: u16,
    },
    /// The payload length exceeds the configured maximum.
    #[error(
        "payload length {len_bytes} at stream offset {offset} exceeds the maximum {max_bytes}"
    )]
    Oversize {
        offset: u64,
        len_bytes: u32,
        max_bytes: u32,
    },
    /// The CRC32 over header and payload does not match.
    #[error("crc mismatch in {kind:?} frame at stream offset {offset}: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc {
        offset: u64,
        kind: FrameKind,
        stored: u32,
        computed: u32,
    },
}

/// A fixed header, decoded and checked (all but the CRC, which needs the payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub flags: u16,
    pub shard_id: u32,
    pub payload_len_bytes: u32,
    pub crc: u32,
}

/// A decoded frame. `payload` is a slice of the receive buffer it arrived in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub flags: u16,
    pub shard_id: u32,
    pub payload: Bytes,
}

fn read_u16_le(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

fn read_u32_le(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(word)
}

/// Checks that what has arrived so far (possibly less than a header) starts
/// with the magic, so garbage is refused after its first differing byte.
pub fn check_magic_prefix(bytes: &[u8], stream_offset: u64) -> Result<(), FrameError> {
    let n = bytes.len().min(MAGIC.len());
    if bytes[..n] != MAGIC[..n] {
        return Err(FrameError::BadMagic {
            offset: stream_offset,
            found: bytes[..n].to_vec(),
        });
    }
    Ok(())
}

/// Decodes and checks a header: magic, version, kind, flags and the payload
/// length against `max_payload_bytes`. The CRC is left to [`check_crc`].
pub fn decode_header(
    bytes: &[u8; HEADER_BYTES],
    max_payload_bytes: u32,
    stream_offset: u64,
) -> Result<Header, FrameError> {
    check_magic_prefix(bytes, stream_offset)?;
    let version = bytes[VERSION_OFFSET];
    if version != VERSION {
        return Err(FrameError::UnsupportedVersion {
            offset: stream_offset,
            found: version,
        });
    }
    decode_header_any_version(bytes, max_payload_bytes, stream_offset)
}

/// Like [`decode_header`] but accepts any version. The handshake uses it: the
/// header and Hello layouts are frozen across versions so that a peer of another
/// version can still be named in the refusal.
pub fn decode_header_any_version(
    bytes: &[u8; HEADER_BYTES],
    max_payload_bytes: u32,
    stream_offset: u64,
) -> Result<Header, FrameError> {
    check_magic_prefix(bytes, stream_offset)?;
    let kind_byte = bytes[KIND_OFFSET];
    let kind = FrameKind::from_u8(kind_byte).ok_or(FrameError::UnknownKind {
        offset: stream_offset,
        kind: kind_byte,
    })?;
    let flags = read_u16_le(bytes, FLAGS_OFFSET);
    if flags != 0 && !kind.flags_are_free() {
        return Err(FrameError::BadFlags {
            offset: stream_offset,
            kind,
            flags,
        });
    }
    let payload_len_bytes = read_u32_le(bytes, LEN_OFFSET);
    if payload_len_bytes > max_payload_bytes {
        return Err(FrameError::Oversize {
            offset: stream_offset,
            len_bytes: payload_len_bytes,
            max_bytes: max_payload_bytes,
        });
    }
    Ok(Header {
        kind,
        flags,
        shard_id: read_u32_le(bytes, SHARD_OFFSET),
        payload_len_bytes,
        crc: read_u32_le(bytes, CRC_OFFSET),
    })
}

/// Version byte of a header (valid once the magic has been checked).
pub fn header_version(bytes: &[u8; HEADER_BYTES]) -> u8 {
    bytes[VERSION_OFFSET]
}

/// Verifies the CRC of a whole frame (`header ++ payload`).
pub fn check_crc(header: &Header, frame: &[u8], stream_offset: u64) -> Result<(), FrameError> {
    debug_assert_eq!(
        frame.len(),
        HEADER_BYTES + header.payload_len_bytes as usize
    );
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&frame[..CRC_OFFSET]);
    hasher.update(&frame[HEADER_BYTES..]);
    let computed = hasher.finalize();
    if computed != header.crc {
        return Err(FrameError::BadCrc {
            offset: stream_offset,
            kind: header.kind,
            stored: header.crc,
            computed,
        });
    }
    Ok(())
}

/// Builds the header of a frame whose payload is the concatenation of `parts`,
/// CRC included. The payload itself is not copied: the sender writes the header
/// and the parts with one vectored write.
///
/// Panics if the parts add up to more than `u32::MAX` bytes; callers check the
/// configured maximum first, so that would be a broken invariant.
pub fn encode_header(
    kind: FrameKind,
    flags: u16,
    shard_id: u32,
    parts: &[Bytes],
) -> [u8; HEADER_BYTES] {
    assert!(
        flags == 0 || kind.flags_are_free(),
        "flags {flags:#06x} on a {kind:?} frame, which defines none"
    );
    let total: usize = parts.iter().map(Bytes::len).sum();
    let len = u32::try_from(total)
        .unwrap_or_else(|_| panic!("payload of {total} bytes for shard {shard_id} exceeds u32"));
    let mut header = [0u8; HEADER_BYTES];
    header[MAGIC_OFFSET..VERSION_OFFSET].copy_from_slice(&MAGIC);
    header[VERSION_OFFSET] = VERSION;
    header[KIND_OFFSET] = kind as u8;
    header[FLAGS_OFFSET..SHARD_OFFSET].copy_from_slice(&flags.to_le_bytes());
    header[SHARD_OFFSET..LEN_OFFSET].copy_from_slice(&shard_id.to_le_bytes());
    header[LEN_OFFSET..CRC_OFFSET].copy_from_slice(&len.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..CRC_OFFSET]);
    for part in parts {
        hasher.update(part);
    }
    header[CRC_OFFSET..HEADER_BYTES].copy_from_slice(&hasher.finalize().to_le_bytes());
    header
}

/// Encodes a whole frame into one contiguous buffer. For tests, tools and the
/// handshake; the data path never does this.
pub fn encode_frame(kind: FrameKind, flags: u16, shard_id: u32, payload: &[u8]) -> Vec<u8> {
    let payload = Bytes::copy_from_slice(payload);
    let header = encode_header(kind, flags, shard_id, std::slice::from_ref(&payload));
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(&payload);
    out
}

/// Incremental frame decoder over one growing receive buffer.
///
/// Reads go into the spare capacity of [`FrameDecoder::buffer_mut`] (at least
/// `read_buffer_bytes` at a time, so one `read` brings many small frames); each
/// complete frame is split off the front and its payload handed on as a slice.
/// While consumers hold payloads the old allocation stays alive and reads
/// continue in a fresh one; only the bytes of a frame cut by the end of a buffer
/// are moved, once. Memory held by the decoder itself is bounded by
/// `max(read_buffer_bytes, HEADER_BYTES + max_payload_bytes)`.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max_payload_bytes: u32,
    read_buffer_bytes: usize,
    pending: Option<Header>,
    /// Retired receive buffers whose payloads may still be alive; reused once
    /// they are not.
    pool: Vec<BytesMut>,
    /// Whether `buf` was allocated larger than `read_buffer_bytes` (for one
    /// large frame); such a buffer is not pooled.
    buf_oversize: bool,
    /// Stream offset of the first byte in `buf`, for error messages.
    consumed_bytes: u64,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder refusing payloads over `max_payload_bytes`, reading at least
    /// `read_buffer_bytes` at a time.
    pub fn new(max_payload_bytes: u32, read_buffer_bytes: usize) -> Self {
        assert!(
            max_payload_bytes <= MAX_PAYLOAD_LIMIT_BYTES,
            "max payload {max_payload_bytes} over the limit {MAX_PAYLOAD_LIMIT_BYTES}"
        );
        assert!(
            read_buffer_bytes >= HEADER_BYTES,
            "read buffer {read_buffer_bytes} smaller than a header"
        );
        Self {
            buf: BytesMut::with_capacity(read_buffer_bytes),
            max_payload_bytes,
            read_buffer_bytes,
            pending: None,
            pool: Vec::with_capacity(RECEIVE_POOL_BUFFERS),
            buf_oversize: false,
            consumed_bytes: 0,
            failed: None,
        }
    }

    /// Makes room for the next read: at least the rest of a frame whose header
    /// has arrived, and a full `read_buffer_bytes` when little is left.
    /// The length used here has already been checked against the maximum.
    ///
    /// When the current buffer runs low it is reused in place if consumers
    /// have dropped every payload in it; otherwise the bytes of the frame cut
    /// by its end move to a buffer from the pool (or a new one) and the old one
    /// waits in the pool until its payloads are dropped. Reuse matters: a fresh
    /// allocation of this size costs page faults on every first touch.
    pub fn prepare_read(&mut self) {
        let needed = match &self.pending {
            Some(h) => (HEADER_BYTES + h.payload_len_bytes as usize).saturating_sub(self.buf.len()),
            None => HEADER_BYTES.saturating_sub(self.buf.len()),
        };
        let spare = self.buf.capacity() - self.buf.len();
        let low_water = (self.read_buffer_bytes / 8).max(needed);
        if spare >= low_water {
            return;
        }
        let target = self.read_buffer_bytes.max(needed);
        if self.buf.try_reclaim(target) {
            return;
        }
        let pooled = self.pool.iter_mut().position(|b| b.try_reclaim(target));
        let mut next = match pooled {
            Some(i) => self.pool.swap_remove(i),
            None => BytesMut::with_capacity(target),
        };
        next.extend_from_slice(&self.buf);
        let mut old = std::mem::replace(&mut self.buf, next);
        let old_oversize =
            std::mem::replace(&mut self.buf_oversize, target > self.read_buffer_bytes);
        old.clear();
        // Only buffers of the ordinary size are kept, so the pool holds at most
        // RECEIVE_POOL_BUFFERS x read_buffer_bytes.
        if self.pool.len() < RECEIVE_POOL_BUFFERS && !old_oversize {
            self.pool.push(old);
        }
    }

    /// The receive buffer; read into its spare capacity (e.g. `read_buf`).
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Appends bytes by copying (tests and fuzzing; sockets read in place).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames. Non-zero means the peer
    /// is in the middle of a frame.
    pub fn buffered_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Total bytes returned as frames so far.
    pub fn consumed_bytes(&self) -> u64 {
        self.consumed_bytes
    }

    /// Returns the next complete frame, `Ok(None)` when more bytes are needed.
    /// After an error the decoder keeps returning it: the stream cannot be
    /// resynchronised and the connection must close.
    pub fn decode(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = self.decode_inner();
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }

    fn decode_inner(&mut self) -> Result<Option<Frame>, FrameError> {
        let header = match self.pending {
            Some(h) => h,
            None => {
                if self.buf.len() < HEADER_BYTES {
                    check_magic_prefix(&self.buf, self.consumed_bytes)?;
                    return Ok(None);
                }
                let bytes: &[u8; HEADER_BYTES] = self.buf[..HEADER_BYTES]
                    .try_into()
                    .expect("slice of HEADER_BYTES");
                let h = decode_header(bytes, self.max_payload_bytes, self.consumed_bytes)?;
                self.pending = Some(h);
                h
            }
        };
        let frame_bytes = HEADER_BYTES + header.payload_len_bytes as usize;
        if self.buf.len() < frame_bytes {
            return Ok(None);
        }
        check_crc(&header, &self.buf[..frame_bytes], self.consumed_bytes)?;
        let frame = self.buf.split_to(frame_bytes).freeze();
        self.pending = None;
        self.consumed_bytes += frame_bytes as u64;
        Ok(Some(Frame {
            kind: header.kind,
            flags: header.flags,
            shard_id: header.shard_id,
            payload: frame.slice(HEADER_BYTES..),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_little_endian() {
        let frame = encode_frame(FrameKind::Message, 0xbeef, 0x0102_0304, b"abc");
        assert_eq!(&frame[..4], b"CRNF");
        assert_eq!(frame[VERSION_OFFSET], VERSION);
        assert_eq!(frame[KIND_OFFSET], 4);
        assert_eq!(&frame[FLAGS_OFFSET..SHARD_OFFSET], &[0xef, 0xbe]);
        assert_eq!(&frame[SHARD_OFFSET..LEN_OFFSET], &[4, 3, 2, 1]);
        assert_eq!(&frame[LEN_OFFSET..CRC_OFFSET], &[3, 0, 0, 0]);
        let header = decode_header(frame[..HEADER_BYTES].try_into().unwrap(), 16, 0).unwrap();
        assert_eq!(header.payload_len_bytes, 3);
        assert_eq!(header.shard_id, 0x0102_0304);
        check_crc(&header, &frame, 0).unwrap();
    }

    #[test]
    fn multi_part_header_matches_contiguous() {
        let parts = [
            Bytes::from_static(b"he"),
            Bytes::from_static(b""),
            Bytes::from_static(b"llo"),
        ];
        let header = encode_header(FrameKind::Message, 0, 7, &parts);
        let whole = encode_frame(FrameKind::Message, 0, 7, b"hello");
        assert_eq!(&header[..], &whole[..HEADER_BYTES]);
    }
}

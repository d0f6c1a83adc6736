//! Large transfers (Raft snapshots) as a stream of chunk frames.
//!
//! A stream is `StreamStart`, then `StreamChunk`s, then `StreamEnd` carrying the
//! total length and a CRC32 over every chunk byte. The sender keeps at most
//! `stream_window_chunks` chunks unacknowledged, so a multi-gigabyte snapshot
//! never fills the send queue ahead of Raft messages, and the receiver acks only
//! what its consumer has taken in. On any failure (lost connection, checksum
//! mismatch, no verdict in time) the sender starts again from the first byte,
//! up to `stream_max_attempts` times; the receiver sees a new `StreamStart`.

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

/// Bytes before the data in a chunk payload: the stream id (u64, little-endian).
pub const STREAM_CHUNK_PREFIX_BYTES: usize = 8;

const ID_OFFSET: usize = 0;
const START_ATTEMPT_OFFSET: usize = ID_OFFSET + 8;
pub(crate) const START_BYTES: usize = START_ATTEMPT_OFFSET + 4;
const END_TOTAL_OFFSET: usize = ID_OFFSET + 8;
const END_CRC_OFFSET: usize = END_TOTAL_OFFSET + 8;
pub(crate) const END_BYTES: usize = END_CRC_OFFSET + 4;
const ACK_CHUNKS_OFFSET: usize = ID_OFFSET + 8;
pub(crate) const ACK_BYTES: usize = ACK_CHUNKS_OFFSET + 8;
const RESULT_OK_OFFSET: usize = ID_OFFSET + 8;
pub(crate) const RESULT_BYTES: usize = RESULT_OK_OFFSET + 1;

const _: () = assert!(STREAM_CHUNK_PREFIX_BYTES == START_ATTEMPT_OFFSET);

/// Where a stream's bytes come from. `rewind` starts it over from the first
/// byte; it is called before every attempt, the first included.
pub trait StreamSource {
    fn rewind(&mut self) -> io::Result<()>;
    /// The next chunk of at most `max_bytes`; `None` at the end. A longer chunk
    /// is split (without copying) into several frames.
    fn next_chunk(&mut self, max_bytes: usize) -> io::Result<Option<Bytes>>;
}

/// A stream over one `Bytes` (for instance a snapshot file mapped into memory
/// and wrapped with `Bytes::from_owner`): chunks are slices, never copies.
#[derive(Debug, Clone)]
pub struct BytesSource {
    data: Bytes,
    offset_bytes: usize,
}

impl BytesSource {
    pub fn new(data: Bytes) -> Self {
        Self {
            data,
            offset_bytes: 0,
        }
    }
}

impl StreamSource for BytesSource {
    fn rewind(&mut self) -> io::Result<()> {
        self.offset_bytes = 0;
        Ok(())
    }

    fn next_chunk(&mut self, max_bytes: usize) -> io::Result<Option<Bytes>> {
        if self.offset_bytes >= self.data.len() {
            return Ok(None);
        }
        let end = self.data.len().min(self.offset_bytes + max_bytes);
        let chunk = self.data.slice(self.offset_bytes..end);
        self.offset_bytes = end;
        Ok(Some(chunk))
    }
}

/// Why a stream transfer failed for good.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StreamError {
    #[error("stream for shard {shard_id} to member {peer_member}: link closed")]
    Closed { shard_id: u32, peer_member: u64 },
    #[error("stream for shard {shard_id} to member {peer_member}: source failed: {source}")]
    Source {
        shard_id: u32,
        peer_member: u64,
        #[source]
        source: io::Error,
    },
    #[error("stream for shard {shard_id} to member {peer_member} failed {attempts} attempts, last: {last}")]
    AttemptsExhausted {
        shard_id: u32,
        peer_member: u64,
        attempts: u32,
        last: StreamAbortReason,
    },
}

/// Why one attempt of a stream ended without success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum StreamAbortReason {
    #[error("connection lost")]
    ConnectionLost,
    #[error("checksum or length mismatch at the receiver")]
    ChecksumMismatch,
    #[error("a new stream started before this one ended")]
    Superseded,
    #[error("no verdict from the receiver in time")]
    ResultTimeout,
}

/// A finished transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamReport {
    pub stream_id: u64,
    pub total_bytes: u64,
    pub chunks: u64,
    /// Attempts used, 1 when nothing failed.
    pub attempts: u32,
    /// CRC32 of the whole stream, as verified by the receiver.
    pub crc: u32,
}

fn u64_at(p: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(p[offset..offset + 8].try_into().expect("8 bytes"))
}

fn u32_at(p: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(p[offset..offset + 4].try_into().expect("4 bytes"))
}

pub(crate) fn encode_start(stream_id: u64, attempt: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(START_BYTES);
    b.put_u64_le(stream_id);
    b.put_u32_le(attempt);
    b.freeze()
}

pub(crate) fn decode_start(p: &[u8]) -> Option<(u64, u32)> {
    (p.len() == START_BYTES).then(|| (u64_at(p, ID_OFFSET), u32_at(p, START_ATTEMPT_OFFSET)))
}

pub(crate) fn encode_chunk_prefix(stream_id: u64) -> Bytes {
    Bytes::copy_from_slice(&stream_id.to_le_bytes())
}

pub(crate) fn decode_chunk(payload: &Bytes) -> Option<(u64, Bytes)> {
    (payload.len() >= STREAM_CHUNK_PREFIX_BYTES).then(|| {
        (
            u64_at(payload, ID_OFFSET),
            payload.slice(STREAM_CHUNK_PREFIX_BYTES..),
        )
    })
}

pub(crate) fn encode_end(stream_id: u64, total_bytes: u64, crc: u32) -> Bytes {
    let mut b = BytesMut::with_capacity(END_BYTES);
    b.put_u64_le(stream_id);
    b.put_u64_le(total_bytes);
    b.put_u32_le(crc);
    b.freeze()
}

pub(crate) fn decode_end(p: &[u8]) -> Option<(u64, u64, u32)> {
    (p.len() == END_BYTES).then(|| {
        (
            u64_at(p, ID_OFFSET),
            u64_at(p, END_TOTAL_OFFSET),
            u32_at(p, END_CRC_OFFSET),
        )
    })
}

pub(crate) fn encode_ack(stream_id: u64, chunks: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(ACK_BYTES);
    b.put_u64_le(stream_id);
    b.put_u64_le(chunks);
    b.freeze()
}

pub(crate) fn decode_ack(p: &[u8]) -> Option<(u64, u64)> {
    (p.len() == ACK_BYTES).then(|| (u64_at(p, ID_OFFSET), u64_at(p, ACK_CHUNKS_OFFSET)))
}

pub(crate) fn encode_result(stream_id: u64, ok: bool) -> Bytes {
    let mut b = BytesMut::with_capacity(RESULT_BYTES);
    b.put_u64_le(stream_id);
    b.put_u8(u8::from(ok));
    b.freeze()
}

pub(crate) fn decode_result(p: &[u8]) -> Option<(u64, bool)> {
    (p.len() == RESULT_BYTES && p[RESULT_OK_OFFSET] <= 1)
        .then(|| (u64_at(p, ID_OFFSET), p[RESULT_OK_OFFSET] == 1))
}

/// Receiver-side state of the stream in progress on one connection.
#[derive(Debug)]
pub(crate) struct RxStream {
    pub(crate) stream_id: u64,
    pub(crate) shard_id: u32,
    pub(crate) hasher: crc32fast::Hasher,
    pub(crate) total_bytes: u64,
    pub(crate) chunks: u64,
    pub(crate) acked_chunks: u64,
}

impl RxStream {
    pub(crate) fn new(stream_id: u64, shard_id: u32) -> Self {
        Self {
            stream_id,
            shard_id,
            hasher: crc32fast::Hasher::new(),
            total_bytes: 0,
            chunks: 0,
            acked_chunks: 0,
        }
    }
}

/// Sender-side state of the stream in progress on one link.
#[derive(Debug, Default)]
pub(crate) struct TxStream {
    pub(crate) stream_id: u64,
    pub(crate) acked_chunks: u64,
    pub(crate) result: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_payloads_round_trip() {
        assert_eq!(decode_start(&encode_start(7, 3)), Some((7, 3)));
        assert_eq!(
            decode_end(&encode_end(7, 1 << 40, 0xdead_beef)),
            Some((7, 1 << 40, 0xdead_beef))
        );
        assert_eq!(decode_ack(&encode_ack(9, 12)), Some((9, 12)));
        assert_eq!(decode_result(&encode_result(9, true)), Some((9, true)));
        assert_eq!(decode_result(&[0; RESULT_BYTES - 1]), None);
        let mut chunk = BytesMut::new();
        chunk.extend_from_slice(&encode_chunk_prefix(5));
        chunk.extend_from_slice(b"data");
        let (id, data) = decode_chunk(&chunk.freeze()).unwrap();
        assert_eq!((id, &data[..]), (5, &b"data"[..]));
    }

    #[test]
    fn bytes_source_slices_and_rewinds() {
        let data = Bytes::from(vec![1u8; 10]);
        let mut source = BytesSource::new(data.clone());
        let first = source.next_chunk(4).unwrap().unwrap();
        assert_eq!(first.as_ptr(), data.as_ptr());
        assert_eq!(source.next_chunk(4).unwrap().unwrap().len(), 4);
        assert_eq!(source.next_chunk(4).unwrap().unwrap().len(), 2);
        assert!(source.next_chunk(4).unwrap().is_none());
        source.rewind().unwrap();
        assert_eq!(source.next_chunk(100).unwrap().unwrap().len(), 10);
    }
}

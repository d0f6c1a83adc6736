//! Record and segment-header byte layout (see `wal/FORMAT.md`). All integers
//! on disk are little-endian.

use std::mem::size_of;

use bytes::Bytes;

use crate::buf::{align_up, AlignedBuf, BLOCK_BYTES};

/// Identifies a Raft group (shard). Shards on one core share one WAL.
pub type ShardId = u64;
/// Log sequence number: the position of a record in the WAL, counting from 1
/// across all segments. Pad and seal records take no LSN.
pub type Lsn = u64;

// Record header, built offset by offset.
pub(crate) const CRC_OFFSET: usize = 0;
pub(crate) const LEN_OFFSET: usize = CRC_OFFSET + size_of::<u32>();
pub(crate) const KIND_OFFSET: usize = LEN_OFFSET + size_of::<u32>();
pub(crate) const RESERVED_OFFSET: usize = KIND_OFFSET + size_of::<u8>();
pub(crate) const RESERVED_BYTES: usize = 7;
pub(crate) const SHARD_OFFSET: usize = RESERVED_OFFSET + RESERVED_BYTES;
pub(crate) const INDEX_OFFSET: usize = SHARD_OFFSET + size_of::<u64>();
pub(crate) const TERM_OFFSET: usize = INDEX_OFFSET + size_of::<u64>();
/// Size of a record header in bytes.
pub const RECORD_HEADER_BYTES: usize = TERM_OFFSET + size_of::<u64>();
/// Records start at multiples of this many bytes.
pub const RECORD_ALIGN_BYTES: usize = 8;

const _: () = assert!(RECORD_HEADER_BYTES == 40);
const _: () = assert!(RECORD_HEADER_BYTES.is_multiple_of(RECORD_ALIGN_BYTES));
const _: () = assert!(BLOCK_BYTES.is_multiple_of(RECORD_ALIGN_BYTES));

// Hard-state payload.
const HS_TERM_OFFSET: usize = 0;
const HS_VOTE_OFFSET: usize = HS_TERM_OFFSET + size_of::<u64>();
const HS_COMMIT_OFFSET: usize = HS_VOTE_OFFSET + size_of::<u64>();
pub(crate) const HARD_STATE_BYTES: usize = HS_COMMIT_OFFSET + size_of::<u64>();

// Segment header, in the first block of every segment.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"CAIRNWAL";
pub(crate) const FORMAT_VERSION: u32 = 2;
const SEG_MAGIC_OFFSET: usize = 0;
const SEG_VERSION_OFFSET: usize = SEG_MAGIC_OFFSET + SEGMENT_MAGIC.len();
const SEG_FLAGS_OFFSET: usize = SEG_VERSION_OFFSET + size_of::<u32>();
const SEG_SEQ_OFFSET: usize = SEG_FLAGS_OFFSET + size_of::<u32>();
const SEG_FIRST_LSN_OFFSET: usize = SEG_SEQ_OFFSET + size_of::<u64>();
const SEG_SIZE_OFFSET: usize = SEG_FIRST_LSN_OFFSET + size_of::<u64>();
const SEG_CRC_OFFSET: usize = SEG_SIZE_OFFSET + size_of::<u64>();
pub(crate) const SEGMENT_HEADER_BYTES: usize = SEG_CRC_OFFSET + size_of::<u32>();
/// Records of a segment start after its header block.
pub const SEGMENT_DATA_OFFSET: usize = BLOCK_BYTES;
const _: () = assert!(SEGMENT_HEADER_BYTES <= SEGMENT_DATA_OFFSET);

/// The unit a torn write is made of: each sector of an unsynced write reaches
/// the disk whole or not at all (see `wal/FORMAT.md`, crash cases).
pub const SECTOR_BYTES: usize = 512;
const _: () = assert!(BLOCK_BYTES.is_multiple_of(SECTOR_BYTES));

// Batch record payload: where the batch ends, where its closing pad starts,
// and a checksum over everything after the batch record.
const BATCH_LEN_OFFSET: usize = 0;
const BATCH_PAD_OFFSET: usize = BATCH_LEN_OFFSET + size_of::<u64>();
const BATCH_BODY_CRC_OFFSET: usize = BATCH_PAD_OFFSET + size_of::<u64>();
const BATCH_RESERVED_OFFSET: usize = BATCH_BODY_CRC_OFFSET + size_of::<u32>();
const BATCH_PAYLOAD_BYTES: usize = BATCH_RESERVED_OFFSET + size_of::<u32>();
/// Bytes of the record that opens every batch.
pub(crate) const BATCH_RECORD_BYTES: usize = encoded_len(BATCH_PAYLOAD_BYTES);
// The batch record lies within the first sector of its batch, which a torn
// write either leaves whole or leaves unwritten.
const _: () = assert!(BATCH_RECORD_BYTES <= SECTOR_BYTES);
// A lone 3900-byte entry is a batch of one block: batch record, entry, and
// the pad with the map of the block's sectors.
const _: () = assert!(
    BATCH_RECORD_BYTES
        + encoded_len(3900)
        + RECORD_HEADER_BYTES
        + map_bytes(BLOCK_BYTES / SECTOR_BYTES)
        <= BLOCK_BYTES
);
/// The largest payload of a record appended alone whose batch stays within
/// `batch_bytes` (a whole number of blocks): the batch record, the record,
/// and the closing pad with its sector map.
pub const fn lone_record_payload_bytes(batch_bytes: usize) -> usize {
    let overhead =
        BATCH_RECORD_BYTES + 2 * RECORD_HEADER_BYTES + map_bytes(batch_bytes / SECTOR_BYTES);
    let room = batch_bytes.saturating_sub(overhead);
    room - room % RECORD_ALIGN_BYTES
}
// The lone record of a one-block batch is the 3900 bytes asserted above, at least.
const _: () = assert!(lone_record_payload_bytes(BLOCK_BYTES) >= 3900);

/// Sector flags per byte of a pad's zero-sector map; the top bit of every map
/// byte is set, so no map byte (and no sector of a pad) is ever zero.
const MAP_BITS_PER_BYTE: usize = 7;
const MAP_MARK: u8 = 0x80;
/// Filler of a pad after its map: never zero, for the same reason.
const PAD_FILL: u8 = 0xa5;

/// Bytes of the zero-sector map of a batch of `sectors` sectors.
pub(crate) const fn map_bytes(sectors: usize) -> usize {
    sectors.div_ceil(MAP_BITS_PER_BYTE)
}

/// Raft's persistent state of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HardState {
    pub term: u64,
    pub vote: u64,
    pub commit: u64,
}

/// What a caller appends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A Raft log entry of `shard`. Appending an index at or below the shard's
    /// last index replaces that suffix (as if a `Truncate` came first); an index
    /// beyond `last + 1` starts the shard's log afresh there (after a snapshot).
    Entry {
        shard: ShardId,
        index: u64,
        term: u64,
        data: Bytes,
    },
    /// The shard's term, vote and commit index; the last one written wins.
    HardState { shard: ShardId, state: HardState },
    /// Discards the shard's entries with index `>= index` (Raft conflict resolution).
    Truncate { shard: ShardId, index: u64 },
}

impl Record {
    pub fn shard(&self) -> ShardId {
        match self {
            Record::Entry { shard, .. }
            | Record::HardState { shard, .. }
            | Record::Truncate { shard, .. } => *shard,
        }
    }

    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Record::Entry { data, .. } => data.len(),
            Record::HardState { .. } => HARD_STATE_BYTES,
            Record::Truncate { .. } => 0,
        }
    }

    /// Bytes this record occupies in a segment, header and alignment included.
    pub fn encoded_len(&self) -> usize {
        encoded_len(self.payload_len())
    }
}

/// An entry read back from the WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub term: u64,
    pub data: Bytes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Entry = 1,
    HardState = 2,
    Truncate = 3,
    /// Closes a batch at a block boundary; its payload maps the batch's
    /// all-zero sectors.
    Pad = 4,
    /// Last record of a segment: the log continues in the next segment.
    Seal = 5,
    /// Opens a batch: its length and a checksum over the rest of it.
    Batch = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Entry,
            2 => Kind::HardState,
            3 => Kind::Truncate,
            4 => Kind::Pad,
            5 => Kind::Seal,
            6 => Kind::Batch,
            _ => return None,
        })
    }
}

pub(crate) const fn encoded_len(payload_len: usize) -> usize {
    align_up(RECORD_HEADER_BYTES + payload_len, RECORD_ALIGN_BYTES)
}

fn crc(segment_seq: u64, header_tail: &[u8], payload: &[u8]) -> u32 {
    // Seeding with the segment's sequence number makes records left over in a
    // recycled segment fail their check instead of passing for new ones.
    let mut h = crc32fast::Hasher::new();
    h.update(&segment_seq.to_le_bytes());
    h.update(header_tail);
    h.update(payload);
    h.finalize()
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}

/// The header fields of a record other than length and checksum.
struct Fields {
    kind: Kind,
    shard: ShardId,
    index: u64,
    term: u64,
}

impl Fields {
    const fn bare(kind: Kind) -> Fields {
        Fields {
            kind,
            shard: 0,
            index: 0,
            term: 0,
        }
    }
}

fn encode_raw(
    buf: &mut AlignedBuf,
    segment_seq: u64,
    f: Fields,
    payload: &[u8],
    zero_payload_len: usize,
) {
    let start = buf.len();
    let total = encoded_len(payload.len() + zero_payload_len);
    let header = encode_header(segment_seq, f, payload, zero_payload_len);
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    buf.extend_zeros(total - RECORD_HEADER_BYTES - payload.len());
    debug_assert_eq!(buf.len(), start + total);
}

/// The header of a record whose payload is `payload` followed by
/// `zero_payload_len` zero bytes, checksummed for segment `segment_seq`.
fn encode_header(
    segment_seq: u64,
    f: Fields,
    payload: &[u8],
    zero_payload_len: usize,
) -> [u8; RECORD_HEADER_BYTES] {
    let Fields {
        kind,
        shard,
        index,
        term,
    } = f;
    let payload_len = payload.len() + zero_payload_len;
    let len = u32::try_from(payload_len)
        .unwrap_or_else(|_| panic!("record payload of {payload_len} bytes exceeds u32"));
    let mut header = [0u8; RECORD_HEADER_BYTES];
    put_u32(&mut header, LEN_OFFSET, len);
    header[KIND_OFFSET] = kind as u8;
    put_u64(&mut header, SHARD_OFFSET, shard);
    put_u64(&mut header, INDEX_OFFSET, index);
    put_u64(&mut header, TERM_OFFSET, term);
    let mut h = crc32fast::Hasher::new();
    h.update(&segment_seq.to_le_bytes());
    h.update(&header[LEN_OFFSET..]);
    h.update(payload);
    if zero_payload_len > 0 {
        const ZEROS: [u8; BLOCK_BYTES] = [0; BLOCK_BYTES];
        let mut left = zero_payload_len;
        while left > 0 {
            let n = left.min(ZEROS.len());
            h.update(&ZEROS[..n]);
            left -= n;
        }
    }
    put_u32(&mut header, CRC_OFFSET, h.finalize());
    header
}

/// Appends `rec`, checksummed for segment `segment_seq`, to `buf`.
pub(crate) fn encode(buf: &mut AlignedBuf, segment_seq: u64, rec: &Record) {
    match rec {
        Record::Entry {
            shard,
            index,
            term,
            data,
        } => encode_raw(
            buf,
            segment_seq,
            Fields {
                kind: Kind::Entry,
                shard: *shard,
                index: *index,
                term: *term,
            },
            data,
            0,
        ),
        Record::HardState { shard, state } => {
            let mut p = [0u8; HARD_STATE_BYTES];
            put_u64(&mut p, HS_TERM_OFFSET, state.term);
            put_u64(&mut p, HS_VOTE_OFFSET, state.vote);
            put_u64(&mut p, HS_COMMIT_OFFSET, state.commit);
            encode_raw(
                buf,
                segment_seq,
                Fields {
                    shard: *shard,
                    ..Fields::bare(Kind::HardState)
                },
                &p,
                0,
            )
        }
        Record::Truncate { shard, index } => encode_raw(
            buf,
            segment_seq,
            Fields {
                shard: *shard,
                index: *index,
                ..Fields::bare(Kind::Truncate)
            },
            &[],
            0,
        ),
    }
}

/// Reserves room for the batch record at the end of `buf`; it is written by
/// [`finish_batch`] once the batch is complete. Returns its index in `buf`.
pub(crate) fn reserve_batch_record(buf: &mut AlignedBuf) -> usize {
    let at = buf.len();
    buf.extend_zeros(BATCH_RECORD_BYTES);
    at
}

/// Where a batch whose records end at file offset `at` ends (a block
/// boundary), with room for the closing pad and its map; the map's length.
pub(crate) fn batch_end(batch_at: usize, at: usize) -> (usize, usize) {
    let mut end = align_up(at + RECORD_HEADER_BYTES, BLOCK_BYTES);
    loop {
        let map = map_bytes((end - batch_at) / SECTOR_BYTES);
        if at + RECORD_HEADER_BYTES + map <= end {
            return (end, map);
        }
        end += BLOCK_BYTES;
    }
}

/// Appends a seal record: the segment ends with the batch it is in.
pub(crate) fn encode_seal(buf: &mut AlignedBuf, segment_seq: u64) {
    encode_raw(buf, segment_seq, Fields::bare(Kind::Seal), &[], 0);
}

/// Closes the batch in `buf` (which starts at file offset `base`; its batch
/// record is at index `rec_at`): appends the pad up to the batch's block
/// boundary, with the map of sectors that are all zero, then fills in the
/// batch record with the batch length, the pad's place and the checksum of
/// everything after the batch record.
pub(crate) fn finish_batch(buf: &mut AlignedBuf, segment_seq: u64, base: usize, rec_at: usize) {
    let batch_at = base + rec_at;
    let pad_at = base + buf.len();
    debug_assert_eq!(batch_at % BLOCK_BYTES, 0);
    let (end, map_len) = batch_end(batch_at, pad_at);
    let sectors = (end - batch_at) / SECTOR_BYTES;
    let mut payload = vec![PAD_FILL; end - pad_at - RECORD_HEADER_BYTES];
    payload[..map_len].fill(MAP_MARK);
    // Sector 0 holds the batch record; sectors reaching the pad hold pad bytes,
    // none of them zero. Only sectors wholly before the pad can be all zero.
    for i in 1..sectors {
        let s = rec_at + i * SECTOR_BYTES;
        if base + s + SECTOR_BYTES > pad_at {
            break;
        }
        if buf[s..s + SECTOR_BYTES].iter().all(|&x| x == 0) {
            payload[i / MAP_BITS_PER_BYTE] |= 1 << (i % MAP_BITS_PER_BYTE);
        }
    }
    encode_raw(buf, segment_seq, Fields::bare(Kind::Pad), &payload, 0);
    debug_assert_eq!(base + buf.len(), end);
    let body_crc = crc32fast::hash(&buf[rec_at + BATCH_RECORD_BYTES..]);
    let mut p = [0u8; BATCH_PAYLOAD_BYTES];
    put_u64(&mut p, BATCH_LEN_OFFSET, (end - batch_at) as u64);
    put_u64(&mut p, BATCH_PAD_OFFSET, (pad_at - batch_at) as u64);
    put_u32(&mut p, BATCH_BODY_CRC_OFFSET, body_crc);
    // Written in place, into the room `reserve_batch_record` left zeroed: a
    // scratch buffer here would be a 4 KiB aligned allocation per flush, which
    // on the reference VM often costs a page fault (about 5 µs).
    let header = encode_header(segment_seq, Fields::bare(Kind::Batch), &p, 0);
    let rec = &mut buf[rec_at..rec_at + BATCH_RECORD_BYTES];
    debug_assert!(rec.iter().all(|&b| b == 0), "batch record room was written");
    rec[..RECORD_HEADER_BYTES].copy_from_slice(&header);
    rec[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + BATCH_PAYLOAD_BYTES].copy_from_slice(&p);
}

/// What a batch record says about its batch (offsets from the batch record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchInfo {
    pub len: u64,
    pub pad_offset: u64,
    pub body_crc: u32,
}

impl BatchInfo {
    /// Whether the batch at `batch_at` of `bytes` is whole: its checksum matches.
    pub(crate) fn body_intact(&self, bytes: &[u8], batch_at: usize) -> bool {
        let end = batch_at + self.len as usize;
        crc32fast::hash(&bytes[batch_at + BATCH_RECORD_BYTES..end]) == self.body_crc
    }
}

/// Whether sector `i` of a batch was all zero when written, per a pad's map.
pub(crate) fn map_says_zero(map: &[u8], i: usize) -> bool {
    map.get(i / MAP_BITS_PER_BYTE)
        .is_some_and(|b| b & (1 << (i % MAP_BITS_PER_BYTE)) != 0)
}

/// A record decoded from segment bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded {
    Record(Record),
    /// A pad and its payload (the batch's zero-sector map, then filler).
    Pad(Bytes),
    Seal,
    Batch(BatchInfo),
}

/// Why bytes at some offset are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// Fewer bytes left than a header.
    ShortHeader,
    /// Length field runs past the end of the segment.
    LengthBeyondSegment(u64),
    UnknownKind(u8),
    ReservedNotZero,
    BadChecksum {
        stored: u32,
        computed: u32,
    },
    BadHardState(u32),
    BadBatch(u32),
    /// All-zero header: preallocated space never written.
    Zeroed,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Invalid::ShortHeader => write!(f, "truncated record header"),
            Invalid::LengthBeyondSegment(l) => {
                write!(f, "record length {l} runs past the segment end")
            }
            Invalid::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            Invalid::ReservedNotZero => write!(f, "reserved header bytes not zero"),
            Invalid::BadChecksum { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            Invalid::BadHardState(l) => write!(f, "hard state payload of {l} bytes"),
            Invalid::BadBatch(l) => write!(f, "batch record payload of {l} bytes"),
            Invalid::Zeroed => write!(f, "zeroed space"),
        }
    }
}

/// Decodes the record at the start of `bytes` (a suffix of segment `segment_seq`).
/// Returns the record and its encoded length. `payload` slicing uses `bytes_owner`
/// so entry data shares the read buffer instead of copying it.
pub(crate) fn decode(
    segment_seq: u64,
    bytes_owner: &Bytes,
    at: usize,
) -> Result<(Decoded, usize), Invalid> {
    let b = &bytes_owner[at..];
    if b.len() < RECORD_HEADER_BYTES {
        return Err(Invalid::ShortHeader);
    }
    let header = &b[..RECORD_HEADER_BYTES];
    if header.iter().all(|&x| x == 0) {
        return Err(Invalid::Zeroed);
    }
    let len = get_u32(header, LEN_OFFSET) as usize;
    let total = encoded_len(len);
    if total > b.len() {
        return Err(Invalid::LengthBeyondSegment(len as u64));
    }
    let kind_byte = header[KIND_OFFSET];
    let kind = Kind::from_u8(kind_byte).ok_or(Invalid::UnknownKind(kind_byte))?;
    if header[RESERVED_OFFSET..SHARD_OFFSET]
        .iter()
        .any(|&x| x != 0)
    {
        return Err(Invalid::ReservedNotZero);
    }
    let payload = &b[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len];
    let stored = get_u32(header, CRC_OFFSET);
    let computed = crc(segment_seq, &header[LEN_OFFSET..], payload);
    if stored != computed {
        return Err(Invalid::BadChecksum { stored, computed });
    }
    let shard = get_u64(header, SHARD_OFFSET);
    let index = get_u64(header, INDEX_OFFSET);
    let term = get_u64(header, TERM_OFFSET);
    let decoded = match kind {
        Kind::Entry => {
            let start = at + RECORD_HEADER_BYTES;
            Decoded::Record(Record::Entry {
                shard,
                index,
                term,
                data: bytes_owner.slice(start..start + len),
            })
        }
        Kind::HardState => {
            if len != HARD_STATE_BYTES {
                return Err(Invalid::BadHardState(len as u32));
            }
            Decoded::Record(Record::HardState {
                shard,
                state: HardState {
                    term: get_u64(payload, HS_TERM_OFFSET),
                    vote: get_u64(payload, HS_VOTE_OFFSET),
                    commit: get_u64(payload, HS_COMMIT_OFFSET),
                },
            })
        }
        Kind::Truncate => Decoded::Record(Record::Truncate { shard, index }),
        Kind::Pad => {
            let start = at + RECORD_HEADER_BYTES;
            Decoded::Pad(bytes_owner.slice(start..start + len))
        }
        Kind::Seal => Decoded::Seal,
        Kind::Batch => {
            if len != BATCH_PAYLOAD_BYTES {
                return Err(Invalid::BadBatch(len as u32));
            }
            Decoded::Batch(BatchInfo {
                len: get_u64(payload, BATCH_LEN_OFFSET),
                pad_offset: get_u64(payload, BATCH_PAD_OFFSET),
                body_crc: get_u32(payload, BATCH_BODY_CRC_OFFSET),
            })
        }
    };
    Ok((decoded, total))
}

/// The first block of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub seq: u64,
    pub first_lsn: Lsn,
    pub segment_size_bytes: u64,
}

impl SegmentHeader {
    pub(crate) fn encode(&self, buf: &mut AlignedBuf) {
        let start = buf.len();
        let mut h = [0u8; SEGMENT_HEADER_BYTES];
        h[SEG_MAGIC_OFFSET..SEG_VERSION_OFFSET].copy_from_slice(&SEGMENT_MAGIC);
        put_u32(&mut h, SEG_VERSION_OFFSET, FORMAT_VERSION);
        put_u32(&mut h, SEG_FLAGS_OFFSET, 0);
        put_u64(&mut h, SEG_SEQ_OFFSET, self.seq);
        put_u64(&mut h, SEG_FIRST_LSN_OFFSET, self.first_lsn);
        put_u64(&mut h, SEG_SIZE_OFFSET, self.segment_size_bytes);
        let c = crc32fast::hash(&h[..SEG_CRC_OFFSET]);
        put_u32(&mut h, SEG_CRC_OFFSET, c);
        buf.extend_from_slice(&h);
        buf.extend_zeros(SEGMENT_DATA_OFFSET - SEGMENT_HEADER_BYTES);
        debug_assert_eq!(buf.len() - start, SEGMENT_DATA_OFFSET);
    }

    pub(crate) fn decode(b: &[u8]) -> Result<SegmentHeader, String> {
        if b.len() < SEGMENT_HEADER_BYTES {
            return Err("file shorter than a segment header".into());
        }
        if b[SEG_MAGIC_OFFSET..SEG_VERSION_OFFSET] != SEGMENT_MAGIC {
            return Err("bad magic".into());
        }
        let stored = get_u32(b, SEG_CRC_OFFSET);
        let computed = crc32fast::hash(&b[..SEG_CRC_OFFSET]);
        if stored != computed {
            return Err(format!(
                "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        let version = get_u32(b, SEG_VERSION_OFFSET);
        if version != FORMAT_VERSION {
            return Err(format!(
                "WAL format version {version}, but this build reads version {FORMAT_VERSION} only \
                 (see wal/FORMAT.md: a member with an older WAL is restored from a backup or \
                 rejoins the cluster with an empty data directory)"
            ));
        }
        Ok(SegmentHeader {
            seq: get_u64(b, SEG_SEQ_OFFSET),
            first_lsn: get_u64(b, SEG_FIRST_LSN_OFFSET),
            segment_size_bytes: get_u64(b, SEG_SIZE_OFFSET),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(rec: Record) {
        let mut buf = AlignedBuf::with_capacity(64);
        encode(&mut buf, 9, &rec);
        assert_eq!(buf.len(), rec.encoded_len());
        let bytes = Bytes::copy_from_slice(&buf);
        let (d, n) = decode(9, &bytes, 0).expect("decodes");
        assert_eq!(n, buf.len());
        assert_eq!(d, Decoded::Record(rec));
        // The same bytes are not a record of another segment.
        assert!(matches!(
            decode(10, &bytes, 0),
            Err(Invalid::BadChecksum { .. })
        ));
    }

    #[test]
    fn records_round_trip() {
        roundtrip(Record::Entry {
            shard: 3,
            index: 17,
            term: 2,
            data: Bytes::from_static(b"hello"),
        });
        roundtrip(Record::Entry {
            shard: u64::MAX,
            index: u64::MAX,
            term: u64::MAX,
            data: Bytes::new(),
        });
        roundtrip(Record::HardState {
            shard: 1,
            state: HardState {
                term: 5,
                vote: 2,
                commit: 99,
            },
        });
        roundtrip(Record::Truncate {
            shard: 4,
            index: 12,
        });
    }

    #[test]
    fn batches_end_on_block_boundaries_with_their_zero_map() {
        for (base, used) in [
            (0usize, 4096usize),
            (4096, 0),
            (8192, 100),
            (8192, 4000),
            (8192, 5000),
        ] {
            let mut buf = AlignedBuf::with_capacity(64);
            if base == 0 {
                buf.extend_zeros(used);
            }
            let rec_at = reserve_batch_record(&mut buf);
            if base != 0 {
                // A payload with an all-zero sector in it and data around it.
                let mut data = vec![7u8; used];
                if used > 4 * SECTOR_BYTES {
                    data[SECTOR_BYTES..3 * SECTOR_BYTES + 100].fill(0);
                }
                let rec = Record::Entry {
                    shard: 1,
                    index: 1,
                    term: 1,
                    data: Bytes::from(data),
                };
                encode(&mut buf, 3, &rec);
            }
            finish_batch(&mut buf, 3, base, rec_at);
            assert_eq!((base + buf.len()) % BLOCK_BYTES, 0, "{base} {used}");
            let bytes = Bytes::copy_from_slice(&buf);
            let Ok((Decoded::Batch(info), n)) = decode(3, &bytes, rec_at) else {
                panic!("batch record decodes")
            };
            assert_eq!(n, BATCH_RECORD_BYTES);
            assert_eq!(rec_at as u64 + info.len, buf.len() as u64);
            assert!(info.body_intact(&bytes, rec_at));
            let pad_at = rec_at + info.pad_offset as usize;
            let Ok((Decoded::Pad(map), _)) = decode(3, &bytes, pad_at) else {
                panic!("pad decodes")
            };
            for i in 0..info.len as usize / SECTOR_BYTES {
                let s = rec_at + i * SECTOR_BYTES;
                let zero = bytes[s..s + SECTOR_BYTES].iter().all(|&x| x == 0);
                assert_eq!(map_says_zero(&map, i), zero, "{base} {used}: sector {i}");
            }
            let mut damaged = bytes.to_vec();
            damaged[rec_at + BATCH_RECORD_BYTES + 3] ^= 1;
            assert!(!info.body_intact(&damaged, rec_at));
        }
    }

    #[test]
    fn segment_header_round_trip() {
        let h = SegmentHeader {
            seq: 7,
            first_lsn: 1234,
            segment_size_bytes: 1 << 20,
        };
        let mut buf = AlignedBuf::with_capacity(0);
        h.encode(&mut buf);
        assert_eq!(SegmentHeader::decode(&buf), Ok(h));
        // A segment of format version 1 is refused by name, not misread.
        let mut v1 = buf.to_vec();
        put_u32(&mut v1, SEG_VERSION_OFFSET, 1);
        let c = crc32fast::hash(&v1[..SEG_CRC_OFFSET]);
        put_u32(&mut v1, SEG_CRC_OFFSET, c);
        let e = SegmentHeader::decode(&v1).unwrap_err();
        assert!(
            e.contains("format version 1") && e.contains("version 2 only"),
            "{e}"
        );
        buf[20] ^= 1;
        assert!(SegmentHeader::decode(&buf).is_err());
    }
}

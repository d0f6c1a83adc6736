//! Recovery at open: reads every segment, checks it against the format, and
//! tells a torn last batch (cut) from damage to written data (the open
//! fails, naming file and offset). The argument is in `wal/FORMAT.md`,
//! "Reading at open" and "Crash cases".

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use tokio::time::Instant;

use bytes::Bytes;
use tracing::{debug, info, warn};

use super::{
    parse_segment_name, parse_spare_name, spare_name, Cursor, Recovered, SegMeta, State, WalMetrics,
};
use crate::buf::{align_up, AlignedBuf, BLOCK_BYTES};
use crate::config::Config;
use crate::error::OpenError;
use crate::record::{
    self, BatchInfo, Decoded, Entry, Record, SegmentHeader, ShardId, BATCH_RECORD_BYTES,
    RECORD_HEADER_BYTES, SECTOR_BYTES, SEGMENT_DATA_OFFSET,
};
use crate::storage::{Storage, StorageFile};

struct FoundSegment {
    seq: u64,
    first_lsn: u64,
    name: String,
}

/// The last segment when it ends without a seal: sealed at open.
struct OpenTail {
    seq: u64,
    name: String,
    file: Rc<dyn StorageFile>,
    /// The end of the last whole batch: where the log ends.
    end: usize,
    /// Block boundary past the last non-zero byte behind `end`, if any:
    /// bytes of a torn batch, cleared before the seal is written.
    dirty_end: Option<usize>,
}

/// How the scan of one segment ended.
enum SegmentEnd {
    Sealed,
    /// The log ends at `end` (last segment only); `torn` says why the bytes
    /// from `end` on were cut, if any were written.
    Open {
        end: usize,
        torn: Option<String>,
    },
}

/// A record of a whole batch, with its offset and encoded length.
type Scanned = (Record, usize, usize);

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

fn first_nonzero(bytes: &[u8], from: usize) -> Option<usize> {
    bytes
        .get(from..)?
        .iter()
        .position(|&x| x != 0)
        .map(|p| from + p)
}

fn describe(d: &Decoded) -> &'static str {
    match d {
        Decoded::Record(Record::Entry { .. }) => "an entry record",
        Decoded::Record(Record::HardState { .. }) => "a hard-state record",
        Decoded::Record(Record::Truncate { .. }) => "a truncate record",
        Decoded::Pad(_) => "a pad record",
        Decoded::Seal => "a seal record",
        Decoded::Batch(_) => "a batch record",
    }
}

/// A sector of the batch at `at` that reads all zero although the batch
/// wrote data there: the mark of a write that did not complete. Space past
/// the end of the log is zero (spares are zero-filled before use), so a
/// sector a torn write did not reach reads as zeros.
fn unwritten_sector(seq: u64, bytes: &Bytes, at: usize, info: &BatchInfo) -> Option<usize> {
    let end = at + info.len as usize;
    let pad_at = at + info.pad_offset as usize;
    let sectors = (end - at) / SECTOR_BYTES;
    let zero = |i: usize| {
        let s = at + i * SECTOR_BYTES;
        all_zero(&bytes[s..s + SECTOR_BYTES])
    };
    let found = match record::decode(seq, bytes, pad_at) {
        Ok((Decoded::Pad(map), n))
            if pad_at + n == end && map.len() >= record::map_bytes(sectors) =>
        {
            (0..sectors).find(|&i| zero(i) && !record::map_says_zero(&map, i))
        }
        // The pad is not whole. As written it has no zero sector (its map
        // bytes and filler are never zero), so a zero sector over it is one
        // the write did not reach.
        _ => ((pad_at - at) / SECTOR_BYTES..sectors).find(|&i| zero(i)),
    };
    found.map(|i| at + i * SECTOR_BYTES)
}

/// Offset of the first record of the batch at `at` that fails to decode.
fn first_bad_record(seq: u64, bytes: &Bytes, at: usize, info: &BatchInfo) -> usize {
    let pad_at = at + info.pad_offset as usize;
    let mut p = at + BATCH_RECORD_BYTES;
    while p < pad_at {
        match record::decode(seq, bytes, p) {
            Ok((_, n)) => p += n,
            Err(_) => return p,
        }
    }
    if p == pad_at && record::decode(seq, bytes, pad_at).is_ok() {
        at
    } else {
        p.min(pad_at)
    }
}

/// Reads the batches of one segment (of `seq`, whose header is valid). The
/// records of whole batches come back in order; an error is (offset, reason).
fn scan_segment(
    cfg: &Config,
    seq: u64,
    bytes: &Bytes,
    is_last: bool,
) -> Result<(Vec<Scanned>, SegmentEnd), (usize, String)> {
    let len = bytes.len();
    let mut records = Vec::new();
    let mut at = SEGMENT_DATA_OFFSET;
    loop {
        if at + BLOCK_BYTES > len {
            return Err((at, "segment ends without a seal record".into()));
        }
        if all_zero(&bytes[at..at + SECTOR_BYTES]) {
            // No batch starts here, or one whose first sector never reached
            // the disk. Only the last batch of the log can be either.
            if !is_last {
                return Err((
                    at,
                    "sealed segment ends without a seal record (unwritten space)".into(),
                ));
            }
            let window_end = at + cfg.max_batch_bytes;
            return match first_nonzero(bytes, at) {
                None => Ok((records, SegmentEnd::Open { end: at, torn: None })),
                Some(_) => match first_nonzero(bytes, window_end) {
                    None => Ok((
                        records,
                        SegmentEnd::Open {
                            end: at,
                            torn: Some(format!(
                                "the first sector of the batch at offset {at} never reached the disk"
                            )),
                        },
                    )),
                    Some(p) => Err((
                        at,
                        format!(
                            "no batch starts here, yet data lies at offset {p}, more than one \
                             batch ({} bytes) further: written data follows damage",
                            cfg.max_batch_bytes
                        ),
                    )),
                },
            };
        }
        let info = match record::decode(seq, bytes, at) {
            Ok((Decoded::Batch(info), _)) => info,
            Ok((other, _)) => {
                return Err((
                    at,
                    format!("expected a batch record, found {}", describe(&other)),
                ))
            }
            Err(inv) => return Err((at, format!("damaged batch record: {inv}"))),
        };
        let (blen, pad) = (info.len as usize, info.pad_offset as usize);
        if blen == 0
            || !blen.is_multiple_of(BLOCK_BYTES)
            || at + blen > len
            || pad < BATCH_RECORD_BYTES
            || pad + RECORD_HEADER_BYTES > blen
        {
            return Err((
                at,
                format!("batch record says {blen} bytes with its pad at {pad}: impossible here"),
            ));
        }
        if !info.body_intact(bytes, at) {
            if !is_last {
                return Err((
                    first_bad_record(seq, bytes, at, &info),
                    format!("batch at offset {at} ({blen} bytes) in a sealed segment fails its checksum"),
                ));
            }
            if let Some(p) = first_nonzero(bytes, at + blen) {
                return Err((
                    first_bad_record(seq, bytes, at, &info),
                    format!(
                        "batch at offset {at} ({blen} bytes) fails its checksum and data follows \
                         it at offset {p}: a later write completed, so this batch was written \
                         whole (and acknowledged) before it was damaged"
                    ),
                ));
            }
            return match unwritten_sector(seq, bytes, at, &info) {
                Some(s) => Ok((
                    records,
                    SegmentEnd::Open {
                        end: at,
                        torn: Some(format!(
                            "the last batch (offset {at}, {blen} bytes) is incomplete: its \
                             sector at offset {s} never reached the disk"
                        )),
                    },
                )),
                None => Err((
                    first_bad_record(seq, bytes, at, &info),
                    format!(
                        "the last batch (offset {at}, {blen} bytes) fails its checksum although \
                         every sector of it was written: damage to written (possibly \
                         acknowledged) data, not a torn write"
                    ),
                )),
            };
        }
        // A whole batch: its records, then its pad.
        let pad_at = at + pad;
        let mut p = at + BATCH_RECORD_BYTES;
        let mut sealed = false;
        while p < pad_at {
            match record::decode(seq, bytes, p) {
                Ok((Decoded::Record(r), n)) if !sealed => {
                    records.push((r, p, n));
                    p += n;
                }
                Ok((Decoded::Seal, n)) if !sealed => {
                    sealed = true;
                    p += n;
                }
                Ok((other, _)) => {
                    return Err((p, format!("unexpected {} inside a batch", describe(&other))))
                }
                Err(inv) => return Err((p, format!("bad record inside a whole batch: {inv}"))),
            }
        }
        match record::decode(seq, bytes, pad_at) {
            Ok((Decoded::Pad(_), n)) if p == pad_at && pad_at + n == at + blen => {}
            _ => return Err((p.min(pad_at), "batch does not end with its pad".into())),
        }
        at += blen;
        if sealed {
            return Ok((records, SegmentEnd::Sealed));
        }
    }
}

/// Why a last segment's header is bad is "never written" only when nothing
/// behind it was ever written either; otherwise the reason for failing.
fn bad_header_detail(seq: u64, bytes: &Bytes) -> Option<String> {
    let data = first_nonzero(bytes, SEGMENT_DATA_OFFSET)?;
    let batch = (SEGMENT_DATA_OFFSET..bytes.len())
        .step_by(BLOCK_BYTES)
        .find(|&q| matches!(record::decode(seq, bytes, q), Ok((Decoded::Batch(_), _))));
    Some(match batch {
        Some(q) => {
            format!("a batch of this segment lies at offset {q}, so its header had been written")
        }
        None => format!("data lies behind it from offset {data}"),
    })
}

pub(super) async fn recover(
    cfg: &Config,
    storage: &dyn Storage,
) -> Result<(State, Recovered), OpenError> {
    let io_err = |name: &str| {
        let path = storage.path_of(name);
        move |source| OpenError::Io { path, source }
    };
    let names = storage.list().map_err(io_err(""))?;
    let mut found = Vec::new();
    let mut spares = Vec::new();
    let mut max_spare_id = 0;
    for n in names {
        if let Some((seq, first_lsn)) = parse_segment_name(&n) {
            found.push(FoundSegment {
                seq,
                first_lsn,
                name: n,
            });
        } else if let Some(id) = parse_spare_name(&n) {
            max_spare_id = max_spare_id.max(id);
            spares.push(n);
        }
    }
    found.sort_by_key(|f| f.seq);
    for w in found.windows(2) {
        if w[1].seq != w[0].seq + 1 {
            return Err(OpenError::MissingSegment {
                expected_seq: w[0].seq + 1,
                before: storage.path_of(&w[0].name),
                after: storage.path_of(&w[1].name),
            });
        }
    }

    let mut st = State {
        next_lsn: 1,
        durable_lsn: 0,
        cursor: Cursor {
            seq: 1,
            offset: 0,
            started: false,
        },
        batches: VecDeque::new(),
        segments: BTreeMap::new(),
        shards: HashMap::new(),
        cache_fifo: VecDeque::new(),
        cache_bytes: 0,
        spares: VecDeque::new(),
        dirty_spares: VecDeque::new(),
        next_spare_id: max_spare_id,
        spare_error: None,
        segments_awaiting_spare: 0,
        zero_fill_left_bytes: None,
        flush_in_flight: false,
        last_flush_end: Instant::now(),
        to_recycle: VecDeque::new(),
        poison: None,
        closed: false,
        metrics: WalMetrics::new(),
        buf_pool: Vec::new(),
    };
    let mut rec = Recovered::default();
    let mut recovered_entries: BTreeMap<ShardId, Vec<Entry>> = BTreeMap::new();
    let count = found.len();
    let mut expected_lsn: Option<u64> = None;
    let mut empty_tail: Option<String> = None;
    let mut open_tail: Option<OpenTail> = None;

    for (i, f) in found.iter().enumerate() {
        let is_last = i + 1 == count;
        let path = storage.path_of(&f.name);
        let corrupt = |offset: usize, reason: String| OpenError::Corrupt {
            file: path.clone(),
            offset: offset as u64,
            reason,
        };
        let file = storage.open(&f.name, false).map_err(io_err(&f.name))?;
        let len = file.size_bytes().map_err(io_err(&f.name))?;
        let bytes = Bytes::from(
            file.read_at(0, len as usize)
                .await
                .map_err(io_err(&f.name))?,
        );
        let header = SegmentHeader::decode(&bytes).and_then(|h| {
            if h.seq == f.seq && h.first_lsn == f.first_lsn {
                Ok(h)
            } else {
                Err(format!(
                    "header says segment {:016x} first lsn {} but the name says {:016x} / {}",
                    h.seq, h.first_lsn, f.seq, f.first_lsn
                ))
            }
        });
        let header = match header {
            Ok(h) => h,
            Err(why) => match bad_header_detail(f.seq, &bytes) {
                None if is_last => {
                    // Named but its header never became durable, and nothing
                    // behind it was written: the crash came between naming
                    // the segment and its first flush. It holds nothing.
                    info!(segment = %f.name, reason = %why, "wal tail segment was never written; recycling it");
                    empty_tail = Some(f.name.clone());
                    continue;
                }
                None => return Err(corrupt(0, format!("segment header: {why}"))),
                Some(detail) => return Err(corrupt(0, format!("segment header: {why}; {detail}"))),
            },
        };
        if header.segment_size_bytes != len {
            return Err(corrupt(
                0,
                format!(
                    "header says {} bytes but the file has {len}",
                    header.segment_size_bytes
                ),
            ));
        }
        if let Some(exp) = expected_lsn {
            if header.first_lsn != exp {
                return Err(corrupt(
                    0,
                    format!(
                        "first lsn {} but the previous segment ends before lsn {exp}",
                        header.first_lsn
                    ),
                ));
            }
        }
        let (records, end) =
            scan_segment(cfg, f.seq, &bytes, is_last).map_err(|(at, why)| corrupt(at, why))?;
        st.segments.insert(
            f.seq,
            SegMeta {
                name: f.name.clone(),
                file: Some(file.clone()),
                max_index: HashMap::new(),
                sealed: matches!(end, SegmentEnd::Sealed),
            },
        );
        let mut lsn = header.first_lsn;
        for (r, at, n) in &records {
            st.apply(r, lsn, f.seq, *at as u64, *n as u32, false);
            apply_recovered(&mut recovered_entries, &mut rec, r);
            lsn += 1;
        }
        if let SegmentEnd::Open { end, torn } = end {
            if let Some(reason) = torn {
                warn!(segment = %f.name, offset = end, reason = %reason, "wal torn tail cut");
                rec.torn_tail = Some((path.clone(), end as u64, reason));
            }
            let dirty_end = bytes
                .iter()
                .rposition(|&x| x != 0)
                .filter(|&q| q >= end)
                .map(|q| align_up(q + 1, BLOCK_BYTES));
            if end + BLOCK_BYTES > bytes.len() {
                return Err(corrupt(end, "no room left to seal the tail segment".into()));
            }
            open_tail = Some(OpenTail {
                seq: f.seq,
                name: f.name.clone(),
                file,
                end,
                dirty_end,
            });
        }
        expected_lsn = Some(lsn);
        st.next_lsn = lsn;
        st.cursor.seq = f.seq + 1;
    }
    if let Some(name) = empty_tail {
        let spare = {
            st.next_spare_id += 1;
            spare_name(st.next_spare_id)
        };
        storage.rename(&name, &spare).map_err(io_err(&name))?;
        storage.sync_dir().await.map_err(io_err(""))?;
        spares.push(spare);
        if let Some(f) = found.last() {
            st.cursor.seq = f.seq;
            if expected_lsn.is_none() {
                st.next_lsn = f.first_lsn;
            }
        }
    }
    // The previous process's tail is sealed where its whole batches end, so
    // new appends never share a segment with bytes of an unknown state.
    if let Some(t) = open_tail {
        seal_tail(&t).await.map_err(io_err(&t.name))?;
        st.segments.get_mut(&t.seq).expect("tail segment").sealed = true;
        debug!(segment = %t.name, offset = t.end, "wal tail segment sealed at open");
    }
    st.durable_lsn = st.next_lsn - 1;
    rec.last_lsn = st.durable_lsn;
    // Spares found here may hold anything (a recycled segment, a zero fill
    // cut short): they are zero-filled again before use.
    for s in spares {
        let ok = match storage.open(&s, false) {
            Ok(f) => f.size_bytes().ok() == Some(cfg.segment_size_bytes),
            Err(_) => false,
        };
        if ok && st.dirty_spares.len() < cfg.max_spare_segments {
            st.dirty_spares.push_back(s);
            continue;
        }
        storage.remove(&s).map_err(io_err(&s))?;
    }
    for (shard, entries) in recovered_entries {
        rec.shards.entry(shard).or_default().entries = entries;
    }
    for (shard, log) in &st.shards {
        if log.hard_state.is_some() || !log.entries.is_empty() {
            rec.shards.entry(*shard).or_default().hard_state = log.hard_state;
        }
    }
    Ok((st, rec))
}

/// Seals the tail segment at the end of its whole batches: first the bytes
/// of a torn batch behind it are zeroed and synced (so the seal's own batch
/// is written over zeros, as every batch is), then a batch holding only a
/// seal record is written and synced. A crash in between leaves a state the
/// next open reads the same way.
async fn seal_tail(t: &OpenTail) -> std::io::Result<()> {
    if let Some(dirty_end) = t.dirty_end {
        let mut zeros = AlignedBuf::with_capacity(dirty_end - t.end);
        zeros.extend_zeros(dirty_end - t.end);
        let (_, r) = t.file.write_durable(t.end as u64, zeros).await;
        r?;
    }
    let mut buf = AlignedBuf::with_capacity(BLOCK_BYTES);
    let rec_at = record::reserve_batch_record(&mut buf);
    record::encode_seal(&mut buf, t.seq);
    record::finish_batch(&mut buf, t.seq, t.end, rec_at);
    let (_, r) = t.file.write_durable(t.end as u64, buf).await;
    r
}

fn apply_recovered(out: &mut BTreeMap<ShardId, Vec<Entry>>, rec: &mut Recovered, r: &Record) {
    match r {
        Record::Entry {
            shard,
            index,
            term,
            data,
        } => {
            let v = out.entry(*shard).or_default();
            if let Some(last) = v.last().map(|e| e.index) {
                if *index <= last {
                    v.retain(|e| e.index < *index);
                } else if *index > last + 1 {
                    v.clear();
                }
            }
            v.push(Entry {
                index: *index,
                term: *term,
                data: Bytes::copy_from_slice(data),
            });
        }
        Record::HardState { shard, .. } => {
            rec.shards.entry(*shard).or_default();
        }
        Record::Truncate { shard, index } => {
            out.entry(*shard).or_default().retain(|e| e.index < *index);
        }
    }
}

//! Forming batches: records encoded into the open batch, a segment's first
//! batch with its header and restated hard states, and the seal that ends it.

use std::collections::HashMap;

use super::{segment_name, Batch, Cursor, SegMeta, State, INITIAL_BATCH_CAPACITY_BYTES};
use crate::buf::AlignedBuf;
use crate::config::Config;
use crate::record::{
    self, HardState, Lsn, Record, SegmentHeader, ShardId, BATCH_RECORD_BYTES, SEGMENT_DATA_OFFSET,
};

impl State {
    pub(super) fn queued_bytes(&self) -> usize {
        self.batches.iter().map(|b| b.buf.len()).sum()
    }

    fn take_buf(&mut self) -> AlignedBuf {
        self.buf_pool
            .pop()
            .unwrap_or_else(|| AlignedBuf::with_capacity(INITIAL_BATCH_CAPACITY_BYTES))
    }

    fn open_batch(&mut self) -> &mut Batch {
        let open = self
            .batches
            .back()
            .is_some_and(|b| !b.closed && b.seq == self.cursor.seq);
        if !open {
            let mut buf = self.take_buf();
            let start = self.cursor.offset;
            // A segment's first batch starts with the header block; its batch
            // record follows that (see `start_segment`).
            let rec_at = if self.cursor.offset as usize >= SEGMENT_DATA_OFFSET {
                let at = record::reserve_batch_record(&mut buf);
                self.cursor.offset += BATCH_RECORD_BYTES as u64;
                at
            } else {
                SEGMENT_DATA_OFFSET
            };
            self.batches.push_back(Batch {
                seq: self.cursor.seq,
                start,
                buf,
                rec_at,
                last_lsn: 0,
                new_segment: None,
                seal: false,
                closed: false,
                appends: 0,
                records: 0,
            });
        }
        self.batches.back_mut().expect("batch just ensured")
    }

    /// Closes the open batch: pads it to a block boundary and fills in its
    /// batch record.
    pub(super) fn close_open_batch(&mut self) {
        if let Some(b) = self.batches.back_mut().filter(|b| !b.closed) {
            record::finish_batch(&mut b.buf, b.seq, b.start as usize, b.rec_at);
            b.closed = true;
            self.cursor.offset = b.start + b.buf.len() as u64;
        }
    }

    fn start_segment(&mut self, cfg: &Config) {
        debug_assert!(!self.cursor.started);
        self.close_open_batch();
        let seq = self.cursor.seq;
        let first_lsn = self.next_lsn;
        let name = segment_name(seq, first_lsn);
        self.cursor.offset = 0;
        let b = self.open_batch();
        b.new_segment = Some(name.clone());
        SegmentHeader {
            seq,
            first_lsn,
            segment_size_bytes: cfg.segment_size_bytes,
        }
        .encode(&mut b.buf);
        let rec_at = record::reserve_batch_record(&mut b.buf);
        debug_assert_eq!(rec_at, b.rec_at);
        self.cursor.offset = (SEGMENT_DATA_OFFSET + BATCH_RECORD_BYTES) as u64;
        self.cursor.started = true;
        self.segments.insert(
            seq,
            SegMeta {
                name,
                file: None,
                max_index: HashMap::new(),
                sealed: false,
            },
        );
        self.metrics.segments_started += 1;
        self.segments_awaiting_spare += 1;
        // Every segment restates each shard's hard state, so releasing older
        // segments never loses the latest one.
        let mut states: Vec<(ShardId, HardState)> = self
            .shards
            .iter()
            .filter_map(|(s, l)| l.hard_state.map(|h| (*s, h)))
            .collect();
        states.sort_unstable_by_key(|(s, _)| *s);
        for (shard, state) in states {
            let rec = Record::HardState { shard, state };
            let b = self.batches.back_mut().expect("segment batch open");
            record::encode(&mut b.buf, seq, &rec);
            b.records += 1;
            b.last_lsn = self.next_lsn;
            self.cursor.offset += rec.encoded_len() as u64;
            self.next_lsn += 1;
        }
    }

    fn seal_segment(&mut self) {
        let seq = self.cursor.seq;
        let b = self.open_batch();
        record::encode_seal(&mut b.buf, seq);
        record::finish_batch(&mut b.buf, seq, b.start as usize, b.rec_at);
        b.seal = true;
        b.closed = true;
        self.cursor = Cursor {
            seq: seq + 1,
            offset: 0,
            started: false,
        };
    }

    /// Encodes `rec` into the open batch and updates the in-memory index.
    pub(super) fn push_record(&mut self, cfg: &Config, rec: &Record) -> Lsn {
        let size = rec.encoded_len();
        let seg_size = cfg.segment_size_bytes as usize;
        loop {
            if !self.cursor.started {
                self.start_segment(cfg);
            }
            self.open_batch();
            let off = self.cursor.offset as usize;
            if off + size + cfg.seal_reserve_bytes() > seg_size {
                assert!(
                    off as u64 > cfg.segment_overhead_bytes(),
                    "record of {size} bytes does not fit an empty segment of {seg_size} bytes"
                );
                self.seal_segment();
                continue;
            }
            let full = self.batches.back().is_some_and(|b| {
                !b.closed && b.buf.len() + size + cfg.pad_reserve_bytes() > cfg.max_batch_bytes
            });
            if full {
                self.close_open_batch();
                continue;
            }
            break;
        }
        let seq = self.cursor.seq;
        let offset = self.cursor.offset;
        let lsn = self.next_lsn;
        let b = self.open_batch();
        debug_assert_eq!(b.start + b.buf.len() as u64, offset);
        record::encode(&mut b.buf, seq, rec);
        b.records += 1;
        b.last_lsn = lsn;
        self.cursor.offset += size as u64;
        self.next_lsn += 1;
        self.apply(rec, lsn, seq, offset, size as u32, true);
        lsn
    }
}

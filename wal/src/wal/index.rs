//! The in-memory index of each shard's entries: records applied to it
//! (appends and recovery alike), truncation, eviction from the tail cache,
//! and the release of segments no shard needs.

use tracing::debug;

use super::{EntryMeta, State};
use crate::record::{Lsn, Record, ShardId};

impl State {
    /// Applies a record to the shard index (appends and recovery alike).
    pub(super) fn apply(
        &mut self,
        rec: &Record,
        lsn: Lsn,
        seq: u64,
        offset: u64,
        len: u32,
        cache: bool,
    ) {
        match rec {
            Record::Entry {
                shard,
                index,
                term,
                data,
            } => {
                let log = self.shards.entry(*shard).or_default();
                match log.last_index() {
                    Some(last) if *index <= last => self.truncate(*shard, *index),
                    Some(last) if *index > last + 1 => self.truncate(*shard, 0),
                    _ => {}
                }
                let log = self.shards.get_mut(shard).expect("shard exists");
                let data = cache.then(|| data.clone());
                if let Some(d) = &data {
                    self.cache_bytes += d.len();
                    self.cache_fifo.push_back((*shard, *index, lsn));
                }
                log.entries.push_back(EntryMeta {
                    index: *index,
                    term: *term,
                    lsn,
                    seq,
                    offset,
                    len,
                    data,
                });
                let seg = self
                    .segments
                    .get_mut(&seq)
                    .expect("segment of a new record exists");
                let m = seg.max_index.entry(*shard).or_insert(0);
                *m = (*m).max(*index);
            }
            Record::HardState { shard, state } => {
                self.shards.entry(*shard).or_default().hard_state = Some(*state);
            }
            Record::Truncate { shard, index } => {
                self.shards.entry(*shard).or_default();
                self.truncate(*shard, *index);
            }
        }
    }

    /// Drops `shard`'s entries at and above `index`.
    fn truncate(&mut self, shard: ShardId, index: u64) {
        let log = self.shards.get_mut(&shard).expect("shard exists");
        let mut freed = 0;
        while log.entries.back().is_some_and(|e| e.index >= index) {
            let e = log.entries.pop_back().expect("back exists");
            freed += e.data.map_or(0, |d| d.len());
        }
        self.cache_bytes -= freed;
        // Entries past the cut no longer hold their segments.
        let cap = index.saturating_sub(1);
        for seg in self.segments.values_mut() {
            if let Some(m) = seg.max_index.get_mut(&shard) {
                *m = (*m).min(cap);
            }
        }
    }

    pub(super) fn evict_cache(&mut self, budget: usize) {
        while self.cache_bytes > budget {
            let Some(&(shard, index, lsn)) = self.cache_fifo.front() else {
                break;
            };
            if lsn > self.durable_lsn {
                break;
            }
            self.cache_fifo.pop_front();
            let Some(log) = self.shards.get_mut(&shard) else {
                continue;
            };
            let Some(first) = log.entries.front().map(|e| e.index) else {
                continue;
            };
            if index < first {
                continue;
            }
            if let Some(e) = log.entries.get_mut((index - first) as usize) {
                if e.lsn == lsn {
                    if let Some(d) = e.data.take() {
                        self.cache_bytes -= d.len();
                    }
                }
            }
        }
    }

    /// Moves sealed segments that no shard needs any more to the recycle queue.
    pub(super) fn collect_releasable(&mut self) -> usize {
        let mut n = 0;
        while let Some((&seq, seg)) = self.segments.first_key_value() {
            let needed = seg
                .max_index
                .iter()
                .any(|(s, &max)| self.shards.get(s).is_some_and(|l| l.released < max));
            if !seg.sealed || needed {
                break;
            }
            let seg = self.segments.remove(&seq).expect("first segment exists");
            debug!(segment = %seg.name, "wal segment released");
            self.to_recycle.push_back(seg.name);
            n += 1;
        }
        n
    }
}

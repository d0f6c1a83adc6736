//! Reads of a shard's entries: from the tail cache, or from the segments,
//! adjacent cold entries coalesced into one read.

use std::collections::HashMap;

use bytes::Bytes;

use super::{EntryMeta, Wal};
use crate::error::ReadError;
use crate::record::{self, Decoded, Entry, Record, ShardId, RECORD_HEADER_BYTES};

impl Wal {
    /// Entries `lo..hi` of `shard`, from the tail cache or the segments.
    /// Entries not yet durable are served from memory.
    pub async fn entries(&self, shard: ShardId, lo: u64, hi: u64) -> Result<Vec<Entry>, ReadError> {
        self.entries_limited(shard, lo, hi, u64::MAX).await
    }

    /// Like [`Wal::entries`], but stops before the entry that would take the
    /// payload total past `max_bytes`; the first entry is always returned.
    pub async fn entries_limited(
        &self,
        shard: ShardId,
        lo: u64,
        hi: u64,
        max_bytes: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        if lo >= hi {
            return Ok(Vec::new());
        }
        let (metas, files) = {
            let st = self.inner.st.borrow();
            let Some(log) = st.shards.get(&shard).filter(|l| !l.entries.is_empty()) else {
                return Err(ReadError::Unavailable {
                    shard,
                    index: lo,
                    last_index: 0,
                });
            };
            let first = log.entries.front().expect("non-empty").index;
            let last = log.entries.back().expect("non-empty").index;
            if lo < first {
                return Err(ReadError::Compacted {
                    shard,
                    index: lo,
                    first_index: first,
                });
            }
            if hi > last + 1 {
                return Err(ReadError::Unavailable {
                    shard,
                    index: hi - 1,
                    last_index: last,
                });
            }
            let mut total = 0u64;
            let metas: Vec<EntryMeta> = log
                .entries
                .range((lo - first) as usize..(hi - first) as usize)
                .enumerate()
                .take_while(|(i, m)| {
                    // The encoded length bounds the payload from above.
                    let payload = (m.len as usize).saturating_sub(RECORD_HEADER_BYTES) as u64;
                    total = total.saturating_add(payload);
                    *i == 0 || total <= max_bytes
                })
                .map(|(_, m)| m.clone())
                .collect();
            let mut files = HashMap::new();
            for m in metas.iter().filter(|m| m.data.is_none()) {
                if let std::collections::hash_map::Entry::Vacant(v) = files.entry(m.seq) {
                    let seg = st.segments.get(&m.seq).unwrap_or_else(|| {
                        panic!(
                            "shard {shard} entry {} points at released segment {}",
                            m.index, m.seq
                        )
                    });
                    let file = seg.file.clone().unwrap_or_else(|| {
                        panic!(
                            "shard {shard} entry {} evicted before segment {} was written",
                            m.index, m.seq
                        )
                    });
                    v.insert((seg.name.clone(), file));
                }
            }
            (metas, files)
        };
        let mut out = Vec::with_capacity(metas.len());
        let mut i = 0;
        while i < metas.len() {
            if let Some(d) = &metas[i].data {
                out.push(Entry {
                    index: metas[i].index,
                    term: metas[i].term,
                    data: d.clone(),
                });
                i += 1;
                continue;
            }
            // Coalesce a run of cold entries that sit back to back in one segment.
            let start = metas[i].offset;
            let mut j = i + 1;
            let mut end = start + metas[i].len as u64;
            while j < metas.len()
                && metas[j].data.is_none()
                && metas[j].seq == metas[i].seq
                && metas[j].offset >= end
                && metas[j].offset + metas[j].len as u64 - start
                    <= crate::config::MAX_READ_BYTES as u64
            {
                end = metas[j].offset + metas[j].len as u64;
                j += 1;
            }
            let (name, file) = &files[&metas[i].seq];
            let path = self.inner.storage.path_of(name);
            let bytes = file
                .read_at(start, (end - start) as usize)
                .await
                .map_err(|source| ReadError::Io {
                    file: path.clone(),
                    offset: start,
                    source,
                })?;
            let bytes = Bytes::from(bytes);
            for m in &metas[i..j] {
                let at = (m.offset - start) as usize;
                let corrupt = |reason: String| ReadError::Corrupt {
                    file: path.clone(),
                    offset: m.offset,
                    reason,
                };
                match record::decode(m.seq, &bytes, at) {
                    Ok((
                        Decoded::Record(Record::Entry {
                            shard: s,
                            index,
                            term,
                            data,
                        }),
                        _,
                    )) if s == shard && index == m.index && term == m.term => {
                        out.push(Entry { index, term, data })
                    }
                    Ok((other, _)) => {
                        return Err(corrupt(format!(
                            "expected shard {shard} entry {} term {}, found {other:?}",
                            m.index, m.term
                        )))
                    }
                    Err(inv) => return Err(corrupt(inv.to_string())),
                }
            }
            i = j;
        }
        Ok(out)
    }
}

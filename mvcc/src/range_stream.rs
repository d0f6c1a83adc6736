//! Ranges read from a snapshot in bounded chunks, and counted in bounded
//! steps, so that a range over many keys never holds the reading thread for
//! long: the shard's core reads a chunk or counts a step a turn.

use crate::error::ReadError;
use crate::index::{End, Found};
use crate::snapshot::Snapshot;
use crate::types::*;
use crate::view::{effective_sort, passes_filters};

impl Snapshot {
    /// A range produced in chunks of at most `Config::range_chunk_keys` keys, so
    /// that memory stays bounded however many keys match, and counted in steps
    /// ([`RangeStream::count_step`]). Sorting by anything but the key needs the
    /// whole result and is refused.
    pub fn range_stream(
        self,
        req: RangeRequest,
        chunk_keys: usize,
    ) -> Result<RangeStream, ReadError> {
        if req.key.is_empty() {
            return Err(ReadError::EmptyKey);
        }
        // A count reads no key: its order does not matter.
        let sort = if req.count_only {
            None
        } else {
            effective_sort(&req)
        };
        debug_assert_eq!(
            req.streamable(),
            matches!(sort, None | Some((SortTarget::Key, _))),
            "RangeRequest::streamable names the ranges streamed: {req:?}"
        );
        let reverse = match sort {
            None => false,
            Some((SortTarget::Key, true)) => true,
            Some((SortTarget::Key, false)) => false,
            Some((SortTarget::Version, _)) => return Err(ReadError::NotStreamable("version")),
            Some((SortTarget::Create, _)) => {
                return Err(ReadError::NotStreamable("create revision"))
            }
            Some((SortTarget::Mod, _)) => return Err(ReadError::NotStreamable("mod revision")),
            Some((SortTarget::Value, _)) => return Err(ReadError::NotStreamable("value")),
        };
        let at = self.with_view(|v| v.check_rev(req.revision))?;
        let end = End::from_range_end(&req.range_end);
        Ok(RangeStream {
            done: req.count_only,
            snap: self,
            end,
            at,
            reverse,
            cursor: None,
            emitted: 0,
            more: false,
            count: Count::Counting {
                counted: 0,
                after: None,
            },
            chunk_keys: chunk_keys.clamp(1, crate::store::MAX_CHUNK_KEYS_LIMIT),
            req,
        })
    }

    /// Refuses a read at `at` once a compaction has passed it.
    fn check_not_compacted(&self, at: i64) -> Result<(), ReadError> {
        let compact = self.compact.get();
        if at < compact {
            return Err(ReadError::Compacted {
                revision: at,
                compact_revision: compact,
            });
        }
        Ok(())
    }
}

/// A range served chunk by chunk from a snapshot, and counted step by step.
/// `count` and `more` are those etcd would report for the same request.
pub struct RangeStream {
    snap: Snapshot,
    req: RangeRequest,
    end: End,
    at: i64,
    reverse: bool,
    cursor: Option<Vec<u8>>,
    emitted: i64,
    more: bool,
    count: Count,
    chunk_keys: usize,
    done: bool,
}

/// How far the keys of the range have been counted.
enum Count {
    /// `counted` keys up to and including `after` (None: none yet).
    Counting {
        counted: i64,
        after: Option<Vec<u8>>,
    },
    Done(i64),
}

impl RangeStream {
    /// Counts at most `max_keys` (at least one) more keys of the range at the
    /// read revision (every key, before limit and filters, as etcd's
    /// `count`); answers the count once all are counted. The key index keeps
    /// each key's history, so the count is that of the read revision however
    /// many writes came since, and a compaction at or below it prunes only
    /// history the count does not see; one past it refuses the count as it
    /// refuses a chunk.
    pub fn count_step(&mut self, max_keys: usize) -> Result<Option<i64>, ReadError> {
        let (counted, after) = match &mut self.count {
            Count::Done(n) => return Ok(Some(*n)),
            Count::Counting { counted, after } => (counted, after),
        };
        self.snap.check_not_compacted(self.at)?;
        let max_keys = max_keys.max(1);
        let mut seen = 0usize;
        let mut last: Option<Vec<u8>> = None;
        self.snap.index.borrow().visit(
            &self.req.key,
            &self.end,
            self.at,
            after.as_deref(),
            false,
            |k, _| {
                seen += 1;
                if seen == max_keys {
                    // The step stops here: the next resumes after this key.
                    last = Some(k.to_vec());
                    return false;
                }
                true
            },
        );
        *counted += seen as i64;
        if seen == max_keys {
            *after = last;
            return Ok(None);
        }
        let n = *counted;
        self.count = Count::Done(n);
        Ok(Some(n))
    }

    /// Keys in the range at the read revision (before limit and filters),
    /// counting now whatever [`RangeStream::count_step`] has not.
    pub fn count(&mut self) -> Result<i64, ReadError> {
        loop {
            if let Some(n) = self.count_step(usize::MAX)? {
                return Ok(n);
            }
        }
    }
    /// Whether keys beyond `limit` matched; final once `next_chunk` returned None.
    pub fn more(&self) -> bool {
        self.more
    }
    /// The header revision etcd would answer with.
    pub fn revision(&self) -> i64 {
        self.snap.revision
    }

    /// The next chunk of key-values, or None when the range is exhausted.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<KeyValue>>, ReadError> {
        if self.done {
            return Ok(None);
        }
        if let Err(e) = self.snap.check_not_compacted(self.at) {
            self.done = true;
            return Err(e);
        }
        let left = if self.req.limit > 0 {
            (self.req.limit - self.emitted) as usize
        } else {
            usize::MAX
        };
        let want = self.chunk_keys.min(left);
        let mut got: Vec<(Vec<u8>, Found)> = Vec::with_capacity(want + 1);
        let req = &self.req;
        self.snap.index.borrow().visit(
            &req.key,
            &self.end,
            self.at,
            self.cursor.as_deref(),
            self.reverse,
            |k, f| {
                if passes_filters(req, &f) {
                    got.push((k.to_vec(), f));
                }
                got.len() <= want
            },
        );
        if got.len() > want {
            got.truncate(want);
            if want == left {
                self.more = true;
                self.done = true;
            }
        } else {
            self.done = true;
        }
        if got.is_empty() {
            return Ok(None);
        }
        self.cursor = got.last().map(|(k, _)| k.clone());
        self.emitted += got.len() as i64;
        let kvs = self.snap.with_view(|v| {
            got.iter()
                .map(|(_, f)| v.kv(f.modified, self.req.keys_only))
                .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(Some(kvs))
    }
}

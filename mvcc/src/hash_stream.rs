//! etcd's HashKV read in steps from a snapshot, so that hashing a large store
//! does not hold the thread that owns it: a shard's core, shared by every
//! shard on it, runs other work between the steps while the snapshot pins the
//! state being hashed and never blocks the writer.

use std::collections::BTreeSet;

use crate::error::ReadError;
use crate::snapshot::Snapshot;
use crate::store::Store;
use crate::types::{HashKv, Revision};

/// A HashKV under way: a CRC32 over every record up to its revision that
/// compaction had kept when it began, in revision order.
pub struct HashKvStream {
    snap: Snapshot,
    /// Revisions the store had removed (compacted) but not yet freed from
    /// its tree when the stream began.
    skip: BTreeSet<Revision>,
    /// The revision the hash covers up to.
    at: i64,
    compact_revision: i64,
    /// The first record not yet hashed.
    next: Revision,
    hasher: crc32fast::Hasher,
    answer: Option<HashKv>,
}

impl Store {
    /// etcd's HashKV at `revision` (0: the current one), computed in steps
    /// by [`HashKvStream::step`]. Refused as [`Store::hash_kv`] refuses.
    pub fn hash_kv_stream(&self, revision: i64) -> Result<HashKvStream, ReadError> {
        let snap = self.snapshot();
        let at = snap.with_view(|v| v.check_rev(revision))?;
        Ok(HashKvStream {
            snap,
            skip: self.removed_revisions(),
            at,
            compact_revision: self.compact_revision(),
            next: Revision { main: 0, sub: 0 },
            hasher: crc32fast::Hasher::new(),
            answer: None,
        })
    }

    /// etcd's HashKV: a CRC32 over every record up to `revision` (0: current)
    /// that compaction has kept, in revision order. In one go: for a large
    /// store on a shared thread, [`Store::hash_kv_stream`].
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv, ReadError> {
        let mut stream = self.hash_kv_stream(revision)?;
        loop {
            if let Some(answer) = stream.step(usize::MAX)? {
                return Ok(answer);
            }
        }
    }
}

impl HashKvStream {
    /// Hashes at most `max_records` more records. Answers the hash once every
    /// record up to its revision is in (and the same answer on later calls).
    pub fn step(&mut self, max_records: usize) -> Result<Option<HashKv>, ReadError> {
        if let Some(answer) = self.answer {
            return Ok(Some(answer));
        }
        let Self {
            snap,
            skip,
            at,
            next,
            hasher,
            ..
        } = self;
        let mut hashed = 0;
        let mut cut = false;
        snap.with_view(|v| {
            v.for_each_record(
                *next,
                |rev| skip.contains(rev),
                |rev, bytes| {
                    if rev.main > *at {
                        return false;
                    }
                    if hashed == max_records {
                        cut = true;
                        *next = rev;
                        return false;
                    }
                    hasher.update(&rev.main.to_le_bytes());
                    hasher.update(&rev.sub.to_le_bytes());
                    hasher.update(bytes);
                    hashed += 1;
                    true
                },
            )
        })?;
        if cut {
            return Ok(None);
        }
        let answer = HashKv {
            hash: self.hasher.clone().finalize(),
            compact_revision: self.compact_revision,
            hash_revision: self.at,
            revision: self.snap.revision(),
        };
        self.answer = Some(answer);
        Ok(Some(answer))
    }
}

//! etcd's HashKV read in steps from a snapshot, so that hashing a large store
//! does not hold the thread that owns it: a shard's core, shared by every
//! shard on it, runs other work between the steps while the snapshot pins the
//! state being hashed and never blocks the writer.

use crate::error::ReadError;
use crate::snapshot::Snapshot;
use crate::store::{RemovedRevisions, Store};
use crate::types::{HashKv, Revision};

/// A HashKV under way: a CRC32 over every record up to its revision that
/// compaction had kept when it began, in revision order.
pub struct HashKvStream {
    snap: Snapshot,
    /// Revisions the store had removed (compacted) but not yet freed from
    /// its tree when the stream began.
    skip: RemovedRevisions,
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
    /// A compaction's index pass still under way is finished first, at once
    /// (the hash leaves out what compaction dropped): an owner that must not
    /// wait for it starts a HashKV once [`Store::compaction_running`] is false.
    pub fn hash_kv_stream(&mut self, revision: i64) -> Result<HashKvStream, ReadError> {
        self.finish_compaction();
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
    pub fn hash_kv(&mut self, revision: i64) -> Result<HashKv, ReadError> {
        let mut stream = self.hash_kv_stream(revision)?;
        loop {
            if let Some(answer) = stream.step(usize::MAX)? {
                return Ok(answer);
            }
        }
    }
}

impl HashKvStream {
    /// Hashes at most `max_records` (at least one) more records. Answers the
    /// hash once every record up to its revision is in (and the same answer
    /// on later calls). A step that fails hashes nothing: another may be
    /// tried.
    pub fn step(&mut self, max_records: usize) -> Result<Option<HashKv>, ReadError> {
        if let Some(answer) = self.answer {
            return Ok(Some(answer));
        }
        let max_records = max_records.max(1);
        let Self {
            snap,
            skip,
            at,
            next,
            hasher,
            ..
        } = self;
        let before = hasher.clone();
        let mut hashed = 0;
        let mut cut = false;
        let read = snap.with_view(|v| {
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
        });
        if let Err(e) = read {
            *hasher = before;
            return Err(e);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;
    use crate::store::Config;
    use crate::types::{CompactionRequest, DeleteRangeRequest, Op, PutRequest};

    /// The hash as one pass over the store's records computes it, written
    /// out here apart from the stream.
    fn one_pass(store: &Store, revision: i64) -> u32 {
        let idx = store.index.borrow();
        let v = store.view(&idx, store.current_rev);
        let at = v.check_rev(revision).unwrap();
        let mut h = crc32fast::Hasher::new();
        v.for_each_record(
            Revision { main: 0, sub: 0 },
            |rev| store.removed(rev),
            |rev, bytes| {
                if rev.main > at {
                    return false;
                }
                h.update(&rev.main.to_le_bytes());
                h.update(&rev.sub.to_le_bytes());
                h.update(bytes);
                true
            },
        )
        .unwrap();
        h.finalize()
    }

    #[test]
    fn steps_of_any_size_hash_what_one_pass_hashes() {
        let mut store =
            Store::open_with(Box::new(MemStorage::new()), "hash", Config::default()).unwrap();
        let mut index = 0;
        let mut apply = |store: &mut Store, op: Op| {
            index += 1;
            store.apply(index, &op).unwrap();
        };
        for i in 0..300 {
            let put = PutRequest {
                key: format!("k{:03}", i % 120).into_bytes(),
                value: vec![b'v'; i % 40],
                ..PutRequest::default()
            };
            apply(&mut store, Op::Put(put));
            if i % 70 == 0 {
                store.commit().unwrap();
            }
        }
        let compacted = store.current_revision() - 90;
        apply(
            &mut store,
            Op::Compact(CompactionRequest {
                revision: compacted,
            }),
        );
        for i in (0..120).step_by(9) {
            let delete = DeleteRangeRequest {
                key: format!("k{i:03}").into_bytes(),
                ..DeleteRangeRequest::default()
            };
            apply(&mut store, Op::DeleteRange(delete));
        }
        // Some records committed, some in the open batch, some removed by
        // the compaction and not yet freed.
        let current = store.current_revision();
        for revision in [0, compacted, compacted + 30, current - 5] {
            let want = one_pass(&store, revision);
            for per_step in [0, 1, 2, 13, 100, usize::MAX] {
                let mut stream = store.hash_kv_stream(revision).unwrap();
                let mut steps = 0;
                let answer = loop {
                    steps += 1;
                    if let Some(answer) = stream.step(per_step).unwrap() {
                        break answer;
                    }
                    assert!(steps < 10_000, "{per_step} records a step never end");
                };
                assert_eq!(answer.hash, want, "revision {revision}, {per_step} a step");
                assert_eq!(
                    stream.step(per_step).unwrap(),
                    Some(answer),
                    "the same again"
                );
            }
        }
        assert_ne!(one_pass(&store, current), one_pass(&store, current - 5));
    }
}

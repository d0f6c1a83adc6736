//! The storage seam: what Raft reads of the durable log, and an in-memory
//! implementation for tests and the simulator.
//!
//! Raft never writes through this trait. The driver persists what a `Ready`
//! hands it (entries, hard state, snapshot) into its own storage and then calls
//! `advance`; from then on Raft reads those entries back through `Storage`.

use super::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use prost::Message as _;

/// Why a storage read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The entry at `index` was compacted into a snapshot.
    #[error("raft log index {index} is compacted (first available index {first_index})")]
    Compacted { index: u64, first_index: u64 },
    /// The entry at `index` lies past the end of the log.
    #[error("raft log index {index} is unavailable (last index {last_index})")]
    Unavailable { index: u64, last_index: u64 },
    /// A snapshot older than the one held was offered.
    #[error("snapshot at index {index} is older than the held snapshot at {held_index}")]
    SnapshotOutOfDate { index: u64, held_index: u64 },
    /// The snapshot is being built; Raft retries later.
    #[error("snapshot is temporarily unavailable")]
    SnapshotTemporarilyUnavailable,
    /// An I/O or decoding failure of the driver's storage.
    #[error("raft storage failure: {0}")]
    Other(String),
}

/// The state a member restarts from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RaftState {
    pub hard_state: HardState,
    pub conf_state: ConfState,
}

/// Read access to the persisted Raft log.
///
/// Indices: the log holds entries `first_index()..=last_index()`. The entry at
/// `first_index() - 1` is the last one covered by the snapshot; its term must
/// still be answered by `term()`. An empty log has `last_index() ==
/// first_index() - 1`.
pub trait Storage {
    /// Hard state and membership saved last.
    fn initial_state(&self) -> Result<RaftState, StorageError>;
    /// Entries `low..high`, stopping once `max_size_bytes` (encoded size) is
    /// reached but always returning at least one entry if any is asked for.
    fn entries(&self, low: u64, high: u64, max_size_bytes: u64)
        -> Result<Vec<Entry>, StorageError>;
    /// Term of the entry at `index`, for `first_index() - 1 ..= last_index()`.
    fn term(&self, index: u64) -> Result<u64, StorageError>;
    fn first_index(&self) -> Result<u64, StorageError>;
    fn last_index(&self) -> Result<u64, StorageError>;
    /// The latest snapshot. `request_index` is the index the follower needs;
    /// a storage may return `SnapshotTemporarilyUnavailable` while it builds one.
    fn snapshot(&self, request_index: u64) -> Result<Snapshot, StorageError>;
}

/// Encoded size of an entry, as flow control and message limits count it.
pub fn entry_size_bytes(e: &Entry) -> u64 {
    e.encoded_len() as u64
}

/// Keeps entries up to `max_size_bytes`, always at least one.
pub(crate) fn limit_size(entries: &mut Vec<Entry>, max_size_bytes: u64) {
    if entries.len() <= 1 {
        return;
    }
    let mut total = 0u64;
    let mut keep = 0usize;
    for e in entries.iter() {
        total += entry_size_bytes(e);
        if keep > 0 && total > max_size_bytes {
            break;
        }
        keep += 1;
    }
    entries.truncate(keep);
}

/// An in-memory `Storage`, for tests and the simulator. Cloning copies the log,
/// which is how a simulated crash keeps exactly what had been persisted.
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    hard_state: HardState,
    /// Membership as of the applied index the driver restarts from.
    conf_state: ConfState,
    snapshot: Snapshot,
    /// `entries[0]` is a dummy holding the snapshot's index and term.
    entries: Vec<Entry>,
}

impl MemStorage {
    /// An empty log with no members: a member that will learn its
    /// configuration from the cluster (through a snapshot).
    pub fn new() -> Self {
        MemStorage {
            hard_state: HardState::default(),
            conf_state: ConfState::default(),
            snapshot: Snapshot {
                data: Default::default(),
                metadata: Some(SnapshotMetadata::default()),
            },
            entries: vec![Entry::default()],
        }
    }

    /// An empty log whose initial membership is `conf_state`: how every member
    /// of a new cluster starts.
    pub fn new_with_conf_state(conf_state: ConfState) -> Self {
        let mut s = Self::new();
        if let Some(md) = s.snapshot.metadata.as_mut() {
            md.conf_state = Some(conf_state.clone());
        }
        s.conf_state = conf_state;
        s
    }

    /// Records the membership in force at the applied index, which a
    /// restart with `Config::applied_index` resumes from. A driver that
    /// replays from the snapshot on restart need not call it.
    pub fn set_conf_state(&mut self, cs: ConfState) {
        self.conf_state = cs;
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    fn offset(&self) -> u64 {
        self.entries[0].index
    }

    fn last(&self) -> u64 {
        self.offset() + self.entries.len() as u64 - 1
    }

    /// Appends entries, replacing any suffix they overlap (the suffix a new
    /// leader overwrote). Entries already compacted are skipped.
    ///
    /// Panics if the entries leave a gap after the last index: the driver
    /// must hand entries over in order, and a gap would be a broken log.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first_new) = entries.first().map(|e| e.index) else {
            return;
        };
        let first = self.offset() + 1;
        let last_new = first_new + entries.len() as u64 - 1;
        if last_new < first {
            return;
        }
        let entries = if first_new < first {
            &entries[(first - first_new) as usize..]
        } else {
            entries
        };
        let start = entries[0].index;
        assert!(
            start <= self.last() + 1,
            "MemStorage::append leaves a gap: last index {}, first appended {}",
            self.last(),
            start
        );
        self.entries.truncate((start - self.offset()) as usize);
        self.entries.extend_from_slice(entries);
    }

    /// Replaces the log with a snapshot (a follower installing one).
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) -> Result<(), StorageError> {
        let md = snapshot.metadata.clone().unwrap_or_default();
        let held = self.snapshot.metadata.as_ref().map_or(0, |m| m.index);
        if md.index < held {
            return Err(StorageError::SnapshotOutOfDate {
                index: md.index,
                held_index: held,
            });
        }
        self.entries = vec![Entry {
            term: md.term,
            index: md.index,
            ..Default::default()
        }];
        if self.hard_state.commit < md.index {
            self.hard_state.commit = md.index;
        }
        self.conf_state = md.conf_state.clone().unwrap_or_default();
        self.snapshot = snapshot;
        Ok(())
    }

    /// Makes a snapshot at `index` (which must be applied) with the state
    /// machine image `data` and the membership in force at `index`; entries
    /// before it stay until `compact`.
    pub fn create_snapshot(
        &mut self,
        index: u64,
        conf_state: ConfState,
        data: bytes::Bytes,
    ) -> Result<Snapshot, StorageError> {
        let held = self.snapshot.metadata.as_ref().map_or(0, |m| m.index);
        if index <= held {
            return Err(StorageError::SnapshotOutOfDate {
                index,
                held_index: held,
            });
        }
        if index > self.last() {
            return Err(StorageError::Unavailable {
                index,
                last_index: self.last(),
            });
        }
        let term = self.entries[(index - self.offset()) as usize].term;
        self.snapshot = Snapshot {
            data,
            metadata: Some(SnapshotMetadata {
                conf_state: Some(conf_state),
                index,
                term,
            }),
        };
        Ok(self.snapshot.clone())
    }

    /// Drops entries before `compact_index`; the entry at `compact_index`
    /// becomes the dummy that remembers the term. Compact only up to the
    /// held snapshot's index, or lagging members can never catch up.
    pub fn compact(&mut self, compact_index: u64) -> Result<(), StorageError> {
        let offset = self.offset();
        if compact_index <= offset {
            return Err(StorageError::Compacted {
                index: compact_index,
                first_index: offset + 1,
            });
        }
        if compact_index > self.last() {
            return Err(StorageError::Unavailable {
                index: compact_index,
                last_index: self.last(),
            });
        }
        let i = (compact_index - offset) as usize;
        let dummy = Entry {
            term: self.entries[i].term,
            index: self.entries[i].index,
            ..Default::default()
        };
        self.entries.drain(..i);
        self.entries[0] = dummy;
        Ok(())
    }
}

impl Storage for MemStorage {
    fn initial_state(&self) -> Result<RaftState, StorageError> {
        Ok(RaftState {
            hard_state: self.hard_state,
            conf_state: self.conf_state.clone(),
        })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size_bytes: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let offset = self.offset();
        if low <= offset {
            return Err(StorageError::Compacted {
                index: low,
                first_index: offset + 1,
            });
        }
        if high > self.last() + 1 {
            return Err(StorageError::Unavailable {
                index: high - 1,
                last_index: self.last(),
            });
        }
        if low >= high {
            return Ok(Vec::new());
        }
        let mut out = self.entries[(low - offset) as usize..(high - offset) as usize].to_vec();
        limit_size(&mut out, max_size_bytes);
        Ok(out)
    }

    fn term(&self, index: u64) -> Result<u64, StorageError> {
        let offset = self.offset();
        if index < offset {
            return Err(StorageError::Compacted {
                index,
                first_index: offset + 1,
            });
        }
        if index > self.last() {
            return Err(StorageError::Unavailable {
                index,
                last_index: self.last(),
            });
        }
        Ok(self.entries[(index - offset) as usize].term)
    }

    fn first_index(&self) -> Result<u64, StorageError> {
        Ok(self.offset() + 1)
    }

    fn last_index(&self) -> Result<u64, StorageError> {
        Ok(self.last())
    }

    fn snapshot(&self, _request_index: u64) -> Result<Snapshot, StorageError> {
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    #[test]
    fn append_overwrites_conflicting_suffix() {
        let mut s = MemStorage::new();
        s.append(&[ent(1, 1), ent(2, 1), ent(3, 1)]);
        s.append(&[ent(2, 2)]);
        assert_eq!(s.last_index().unwrap(), 2);
        assert_eq!(s.term(2).unwrap(), 2);
    }

    #[test]
    fn compact_keeps_term_of_compacted_index() {
        let mut s = MemStorage::new();
        s.append(&[ent(1, 1), ent(2, 2), ent(3, 3)]);
        s.compact(2).unwrap();
        assert_eq!(s.first_index().unwrap(), 3);
        assert_eq!(s.term(2).unwrap(), 2);
        assert!(matches!(s.term(1), Err(StorageError::Compacted { .. })));
        assert!(matches!(
            s.entries(2, 4, u64::MAX),
            Err(StorageError::Compacted { .. })
        ));
    }

    #[test]
    fn entries_respect_size_limit_but_return_one() {
        let mut s = MemStorage::new();
        let mut e = ent(1, 1);
        e.data = bytes::Bytes::from(vec![0u8; 100]);
        let mut e2 = ent(2, 1);
        e2.data = e.data.clone();
        s.append(&[e, e2]);
        assert_eq!(s.entries(1, 3, 1).unwrap().len(), 1);
        assert_eq!(s.entries(1, 3, u64::MAX).unwrap().len(), 2);
    }
}

//! The Raft log as one member sees it: the durable part behind `Storage`, and
//! the unstable tail (entries and possibly a snapshot) not yet handed back by
//! the driver as persisted.

use super::storage::{limit_size, Storage, StorageError};
use super::{Entry, Snapshot};

fn snap_index(s: &Snapshot) -> u64 {
    s.metadata.as_ref().map_or(0, |m| m.index)
}

fn snap_term(s: &Snapshot) -> u64 {
    s.metadata.as_ref().map_or(0, |m| m.term)
}

/// Entries and snapshot waiting to be persisted.
#[derive(Debug, Default)]
pub(crate) struct Unstable {
    pub snapshot: Option<Snapshot>,
    pub entries: Vec<Entry>,
    /// Index of `entries[0]`.
    pub offset: u64,
    /// Index of the first entry not yet handed to the driver in a `Ready`:
    /// entries from `offset` up to here are being written. Always
    /// `offset <= in_progress <= offset + entries.len()`.
    pub in_progress: u64,
    /// The snapshot has been handed to the driver and is being written.
    pub snapshot_in_progress: bool,
}

impl Unstable {
    fn maybe_first_index(&self) -> Option<u64> {
        self.snapshot.as_ref().map(|s| snap_index(s) + 1)
    }

    fn maybe_last_index(&self) -> Option<u64> {
        if let Some(e) = self.entries.last() {
            return Some(e.index);
        }
        self.snapshot.as_ref().map(snap_index)
    }

    fn maybe_term(&self, i: u64) -> Option<u64> {
        if i < self.offset {
            return self
                .snapshot
                .as_ref()
                .filter(|s| snap_index(s) == i)
                .map(snap_term);
        }
        self.entries.get((i - self.offset) as usize).map(|e| e.term)
    }

    /// The driver persisted entries up to `(i, t)`. Ignored when the tail was
    /// replaced meanwhile (the term no longer matches).
    fn stable_to(&mut self, i: u64, t: u64) {
        if i < self.offset {
            return;
        }
        if self.maybe_term(i) == Some(t) {
            self.entries.drain(..=((i - self.offset) as usize));
            self.offset = i + 1;
            self.in_progress = self.in_progress.max(self.offset);
        }
    }

    fn stable_snap_to(&mut self, i: u64) {
        if self.snapshot.as_ref().is_some_and(|s| snap_index(s) == i) {
            self.snapshot = None;
            self.snapshot_in_progress = false;
        }
    }

    fn restore(&mut self, s: Snapshot) {
        self.offset = snap_index(&s) + 1;
        self.in_progress = self.offset;
        self.entries.clear();
        self.snapshot = Some(s);
        self.snapshot_in_progress = false;
    }

    fn truncate_and_append(&mut self, ents: &[Entry]) {
        let after = ents[0].index;
        if after == self.offset + self.entries.len() as u64 {
            self.entries.extend_from_slice(ents);
        } else if after <= self.offset {
            self.offset = after;
            self.entries = ents.to_vec();
        } else {
            self.entries.truncate((after - self.offset) as usize);
            self.entries.extend_from_slice(ents);
        }
        // Entries replaced while being written must be written again.
        self.in_progress = self.in_progress.min(after).max(self.offset);
    }

    /// Entries not yet handed to the driver.
    pub fn entries_to_persist(&self) -> &[Entry] {
        &self.entries[(self.in_progress - self.offset) as usize..]
    }

    /// The snapshot, unless it is already being written.
    pub fn snapshot_to_persist(&self) -> Option<&Snapshot> {
        self.snapshot
            .as_ref()
            .filter(|_| !self.snapshot_in_progress)
    }

    /// Everything unstable has been handed to the driver.
    pub fn accept_in_progress(&mut self) {
        self.in_progress = self.offset + self.entries.len() as u64;
        self.snapshot_in_progress = self.snapshot.is_some();
    }
}

pub(crate) struct RaftLog<S> {
    pub storage: S,
    pub unstable: Unstable,
    /// Highest index known committed.
    pub committed: u64,
    /// Highest index handed to the driver for applying.
    pub applying: u64,
    /// Highest index the driver reported applied.
    pub applied: u64,
}

impl<S: Storage> RaftLog<S> {
    pub fn new(storage: S) -> Result<Self, StorageError> {
        let first = storage.first_index()?;
        let last = storage.last_index()?;
        Ok(RaftLog {
            storage,
            unstable: Unstable {
                snapshot: None,
                entries: Vec::new(),
                offset: last + 1,
                in_progress: last + 1,
                snapshot_in_progress: false,
            },
            committed: first - 1,
            applying: first - 1,
            applied: first - 1,
        })
    }

    pub fn first_index(&self) -> u64 {
        match self.unstable.maybe_first_index() {
            Some(i) => i,
            None => self
                .storage
                .first_index()
                .unwrap_or_else(|e| panic!("raft storage first_index failed: {e}")),
        }
    }

    pub fn last_index(&self) -> u64 {
        match self.unstable.maybe_last_index() {
            Some(i) => i,
            None => self
                .storage
                .last_index()
                .unwrap_or_else(|e| panic!("raft storage last_index failed: {e}")),
        }
    }

    /// Last index already durable: what this member may count as its own
    /// replica in a quorum.
    pub fn persisted_index(&self) -> u64 {
        if self.unstable.snapshot.is_some() {
            return 0;
        }
        let stored = self
            .storage
            .last_index()
            .unwrap_or_else(|e| panic!("raft storage last_index failed: {e}"));
        stored.min(self.unstable.offset - 1)
    }

    pub fn term(&self, i: u64) -> Result<u64, StorageError> {
        let dummy = self.first_index() - 1;
        if i < dummy {
            return Err(StorageError::Compacted {
                index: i,
                first_index: dummy + 1,
            });
        }
        let last = self.last_index();
        if i > last {
            return Err(StorageError::Unavailable {
                index: i,
                last_index: last,
            });
        }
        if let Some(t) = self.unstable.maybe_term(i) {
            return Ok(t);
        }
        self.storage.term(i)
    }

    /// Term at `i`, or 0 when it is compacted or past the end.
    pub fn term_or_zero(&self, i: u64) -> u64 {
        self.term(i).unwrap_or(0)
    }

    pub fn last_term(&self) -> u64 {
        self.term(self.last_index())
            .unwrap_or_else(|e| panic!("raft log has no term for its last index: {e}"))
    }

    pub fn match_term(&self, i: u64, t: u64) -> bool {
        self.term(i).is_ok_and(|x| x == t)
    }

    /// Raft paper 5.4.1: a candidate's log is at least as up to date as ours.
    pub fn is_up_to_date(&self, last_index: u64, term: u64) -> bool {
        let our_term = self.last_term();
        term > our_term || (term == our_term && last_index >= self.last_index())
    }

    /// Index of the first entry in `ents` that conflicts with the log or is
    /// new; 0 if all of them are already present.
    fn find_conflict(&self, ents: &[Entry]) -> u64 {
        for e in ents {
            if !self.match_term(e.index, e.term) {
                return e.index;
            }
        }
        0
    }

    /// The largest index `<= index` whose term is `<= term`, with its term:
    /// the follower's hint for where the leader's log may match (fast
    /// backtracking). Stops at the first unknown term.
    pub fn find_conflict_by_term(&self, index: u64, term: u64) -> (u64, u64) {
        let mut i = index;
        loop {
            match self.term(i) {
                Ok(t) if t > term && i > 0 => i -= 1,
                Ok(t) => return (i, t),
                Err(_) => return (i, 0),
            }
        }
    }

    /// Appends a leader's entries after `(index, log_term)` if the log matches
    /// there; returns the index of the last new entry.
    pub fn maybe_append(
        &mut self,
        index: u64,
        log_term: u64,
        committed: u64,
        ents: &[Entry],
    ) -> Option<u64> {
        if !self.match_term(index, log_term) {
            return None;
        }
        let last_new = index + ents.len() as u64;
        let ci = self.find_conflict(ents);
        if ci != 0 {
            assert!(
                ci > self.committed,
                "raft: entry {ci} conflicts with committed entry (committed {})",
                self.committed
            );
            let start = (ci - (index + 1)) as usize;
            self.append(&ents[start..]);
        }
        self.commit_to(committed.min(last_new));
        Some(last_new)
    }

    pub fn append(&mut self, ents: &[Entry]) -> u64 {
        if ents.is_empty() {
            return self.last_index();
        }
        let after = ents[0].index - 1;
        assert!(
            after >= self.committed,
            "raft: appending after {after} would overwrite committed {}",
            self.committed
        );
        self.unstable.truncate_and_append(ents);
        self.last_index()
    }

    pub fn commit_to(&mut self, i: u64) {
        if self.committed < i {
            let last = self.last_index();
            assert!(
                i <= last,
                "raft: commit index {i} is beyond the last index {last}"
            );
            self.committed = i;
        }
    }

    /// Commits `max_index` if its entry belongs to `term` (Raft paper 5.4.2),
    /// unless `check_term` is off (the mutation knob).
    pub fn maybe_commit(&mut self, max_index: u64, term: u64, check_term: bool) -> bool {
        if max_index > self.committed && (!check_term || self.term_or_zero(max_index) == term) {
            self.commit_to(max_index);
            return true;
        }
        false
    }

    pub fn applied_to(&mut self, i: u64) {
        if i == 0 || i <= self.applied {
            return;
        }
        assert!(
            i <= self.committed,
            "raft: applied index {i} is beyond committed {}",
            self.committed
        );
        self.applied = i;
        self.applying = self.applying.max(i);
    }

    pub fn stable_to(&mut self, i: u64, t: u64) {
        self.unstable.stable_to(i, t);
    }

    pub fn stable_snap_to(&mut self, i: u64) {
        self.unstable.stable_snap_to(i);
    }

    #[cfg(test)]
    pub fn unstable_entries(&self) -> &[Entry] {
        &self.unstable.entries
    }

    /// Highest committed index that may be handed out for applying: with
    /// `only_durable`, no further than this member's durable log.
    fn applicable_index(&self, only_durable: bool) -> u64 {
        if only_durable {
            self.committed.min(self.persisted_index())
        } else {
            self.committed
        }
    }

    pub fn has_next_committed_entries(&self, only_durable: bool) -> bool {
        self.applicable_index(only_durable) > self.applying && self.unstable.snapshot.is_none()
    }

    pub fn next_committed_entries(&self, max_size_bytes: u64, only_durable: bool) -> Vec<Entry> {
        if !self.has_next_committed_entries(only_durable) {
            return Vec::new();
        }
        let lo = (self.applying + 1).max(self.first_index());
        let hi = self.applicable_index(only_durable) + 1;
        self.slice(lo, hi, max_size_bytes)
            .unwrap_or_else(|e| panic!("raft: committed entries from {lo} unreadable: {e}"))
    }

    /// Entries from `lo` to the end, limited in size.
    pub fn entries(&self, lo: u64, max_size_bytes: u64) -> Result<Vec<Entry>, StorageError> {
        let last = self.last_index();
        if lo > last {
            return Ok(Vec::new());
        }
        self.slice(lo, last + 1, max_size_bytes)
    }

    /// Entries `lo..hi`, limited in size, at least one if any.
    pub fn slice(&self, lo: u64, hi: u64, max_size_bytes: u64) -> Result<Vec<Entry>, StorageError> {
        let first = self.first_index();
        if lo < first {
            return Err(StorageError::Compacted {
                index: lo,
                first_index: first,
            });
        }
        let last = self.last_index();
        if hi > last + 1 {
            return Err(StorageError::Unavailable {
                index: hi - 1,
                last_index: last,
            });
        }
        if lo >= hi {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let off = self.unstable.offset;
        if lo < off {
            let stored = self.storage.entries(lo, hi.min(off), max_size_bytes)?;
            let want = hi.min(off) - lo;
            if (stored.len() as u64) < want {
                return Ok(stored);
            }
            out = stored;
        }
        if hi > off {
            let from = lo.max(off);
            let u = &self.unstable.entries[(from - off) as usize..(hi - off) as usize];
            out.extend_from_slice(u);
        }
        limit_size(&mut out, max_size_bytes);
        Ok(out)
    }

    pub fn snapshot(&self, request_index: u64) -> Result<Snapshot, StorageError> {
        if let Some(s) = &self.unstable.snapshot {
            return Ok(s.clone());
        }
        self.storage.snapshot(request_index)
    }

    /// Replaces the log by a snapshot received from the leader.
    pub fn restore(&mut self, s: Snapshot) {
        let idx = snap_index(&s);
        self.committed = idx;
        self.applying = self.applying.max(idx);
        self.unstable.restore(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::MemStorage;

    fn ent(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    fn log_with(terms: &[u64]) -> RaftLog<MemStorage> {
        let mut s = MemStorage::new();
        let ents: Vec<Entry> = terms
            .iter()
            .enumerate()
            .map(|(i, t)| ent(i as u64 + 1, *t))
            .collect();
        s.append(&ents);
        RaftLog::new(s).unwrap()
    }

    // Raft paper 5.3: a follower deletes a conflicting suffix and appends the leader's entries.
    #[test]
    fn maybe_append_truncates_conflict() {
        let mut l = log_with(&[1, 1, 2]);
        assert_eq!(l.maybe_append(1, 1, 0, &[ent(2, 3), ent(3, 3)]), Some(3));
        assert_eq!(l.term(2).unwrap(), 3);
        assert_eq!(l.last_index(), 3);
        assert_eq!(l.maybe_append(3, 2, 0, &[]), None);
    }

    // Raft paper 5.3 (optimisation at the end of the section): the hint skips whole terms.
    #[test]
    fn find_conflict_by_term_skips_terms() {
        let l = log_with(&[1, 1, 3, 3, 3, 5]);
        assert_eq!(l.find_conflict_by_term(6, 4), (5, 3));
        assert_eq!(l.find_conflict_by_term(6, 2), (2, 1));
        assert_eq!(l.find_conflict_by_term(6, 0), (0, 0));
    }

    // Raft paper 5.4.2: count replicas only for entries of the current term.
    #[test]
    fn maybe_commit_requires_current_term() {
        let mut l = log_with(&[1, 2]);
        assert!(!l.maybe_commit(2, 3, true));
        assert!(l.maybe_commit(2, 2, true));
        assert_eq!(l.committed, 2);
    }

    #[test]
    fn stable_to_ignores_replaced_tail() {
        let mut l = log_with(&[]);
        l.append(&[ent(1, 1), ent(2, 1)]);
        l.append(&[ent(2, 2)]);
        l.stable_to(2, 1);
        assert_eq!(l.unstable_entries().len(), 2);
        l.stable_to(2, 2);
        assert!(l.unstable_entries().is_empty());
    }
}

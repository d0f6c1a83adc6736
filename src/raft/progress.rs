//! The leader's view of each member's log: how far it matches, what to send
//! next, and how much may be in flight (Raft thesis 3.5 and 10.2).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::ConfState;

/// How the leader replicates to one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressState {
    /// The matching index is unknown: one append per heartbeat interval until
    /// the member answers.
    Probe,
    /// The member follows: appends are pipelined up to the in-flight window.
    Replicate,
    /// The member needs a snapshot, which is being sent; no appends meanwhile.
    Snapshot,
}

/// Appends sent but not yet acknowledged, bounded by count and by bytes.
#[derive(Debug, Clone)]
pub struct Inflights {
    /// (last index of the append, its size in bytes)
    queue: VecDeque<(u64, u64)>,
    bytes: u64,
    max_count: usize,
    max_bytes: u64,
}

impl Inflights {
    pub fn new(max_count: usize, max_bytes: u64) -> Self {
        Inflights {
            queue: VecDeque::with_capacity(max_count.min(64)),
            bytes: 0,
            max_count,
            max_bytes,
        }
    }

    pub fn add(&mut self, last_index: u64, size_bytes: u64) {
        assert!(
            !self.full(),
            "raft: in-flight window is full (count {}, bytes {})",
            self.queue.len(),
            self.bytes
        );
        self.queue.push_back((last_index, size_bytes));
        self.bytes += size_bytes;
    }

    /// Frees every append up to and including `index`.
    pub fn free_le(&mut self, index: u64) {
        while let Some(&(i, b)) = self.queue.front() {
            if i > index {
                break;
            }
            self.queue.pop_front();
            self.bytes -= b;
        }
    }

    pub fn free_first_one(&mut self) {
        if let Some((_, b)) = self.queue.pop_front() {
            self.bytes -= b;
        }
    }

    pub fn full(&self) -> bool {
        self.queue.len() >= self.max_count || self.bytes >= self.max_bytes
    }

    pub fn count(&self) -> usize {
        self.queue.len()
    }

    pub fn size_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn reset(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }
}

/// Replication progress of one member, as seen by the leader.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Highest index known to be in the member's durable log.
    pub matched: u64,
    /// Next index to send.
    pub next_idx: u64,
    pub state: ProgressState,
    /// In `Snapshot` state: index of the snapshot being sent.
    pub pending_snapshot: u64,
    /// Heard from since the last check-quorum round.
    pub recent_active: bool,
    /// In `Probe` state: an append was sent and not yet answered.
    pub probe_sent: bool,
    pub inflights: Inflights,
    pub is_learner: bool,
}

impl Progress {
    pub fn new(next_idx: u64, max_inflight_msgs: usize, max_inflight_bytes: u64) -> Self {
        Progress {
            matched: 0,
            next_idx,
            state: ProgressState::Probe,
            pending_snapshot: 0,
            recent_active: false,
            probe_sent: false,
            inflights: Inflights::new(max_inflight_msgs, max_inflight_bytes),
            is_learner: false,
        }
    }

    fn reset_state(&mut self, state: ProgressState) {
        self.probe_sent = false;
        self.pending_snapshot = 0;
        self.state = state;
        self.inflights.reset();
    }

    pub fn become_probe(&mut self) {
        if self.state == ProgressState::Snapshot {
            let pending = self.pending_snapshot;
            self.reset_state(ProgressState::Probe);
            self.next_idx = (self.matched + 1).max(pending + 1);
        } else {
            self.reset_state(ProgressState::Probe);
            self.next_idx = self.matched + 1;
        }
    }

    pub fn become_replicate(&mut self) {
        self.reset_state(ProgressState::Replicate);
        self.next_idx = self.matched + 1;
    }

    pub fn become_snapshot(&mut self, snapshot_index: u64) {
        self.reset_state(ProgressState::Snapshot);
        self.pending_snapshot = snapshot_index;
    }

    /// The member acknowledged `n`; returns whether that was news.
    pub fn maybe_update(&mut self, n: u64) -> bool {
        let mut updated = false;
        if self.matched < n {
            self.matched = n;
            updated = true;
            self.probe_sent = false;
        }
        self.next_idx = self.next_idx.max(n + 1);
        updated
    }

    /// Pipelining: assume the append of entries up to `n` will succeed.
    pub fn optimistic_update(&mut self, n: u64) {
        self.next_idx = n + 1;
    }

    /// The member rejected an append at `rejected`; `match_hint` is where to
    /// probe next. Returns false for a stale rejection.
    pub fn maybe_decr_to(&mut self, rejected: u64, match_hint: u64) -> bool {
        if self.state == ProgressState::Replicate {
            if rejected <= self.matched {
                return false;
            }
            self.next_idx = self.matched + 1;
            return true;
        }
        if self.next_idx == 0 || self.next_idx - 1 != rejected {
            return false;
        }
        self.next_idx = (match_hint + 1).min(rejected).max(self.matched + 1).max(1);
        self.probe_sent = false;
        true
    }

    pub fn is_paused(&self) -> bool {
        match self.state {
            ProgressState::Probe => self.probe_sent,
            ProgressState::Replicate => self.inflights.full(),
            ProgressState::Snapshot => true,
        }
    }
}

/// Outcome of counting votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteResult {
    Pending,
    Won,
    Lost,
}

/// Progress of every member plus the current membership and votes.
#[derive(Debug, Clone)]
pub struct ProgressTracker {
    pub progress: BTreeMap<u64, Progress>,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    pub votes: BTreeMap<u64, bool>,
    pub max_inflight_msgs: usize,
    pub max_inflight_bytes: u64,
}

impl ProgressTracker {
    pub fn new(max_inflight_msgs: usize, max_inflight_bytes: u64) -> Self {
        ProgressTracker {
            progress: BTreeMap::new(),
            voters: BTreeSet::new(),
            learners: BTreeSet::new(),
            votes: BTreeMap::new(),
            max_inflight_msgs,
            max_inflight_bytes,
        }
    }

    pub fn conf_state(&self) -> ConfState {
        ConfState {
            voters: self.voters.iter().copied().collect(),
            learners: self.learners.iter().copied().collect(),
        }
    }

    pub fn is_voter(&self, id: u64) -> bool {
        self.voters.contains(&id)
    }

    pub fn quorum(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// Highest index a quorum of voters has durably (Raft paper 5.3).
    pub fn committed_index(&self) -> u64 {
        if self.voters.is_empty() {
            return 0;
        }
        let mut m: Vec<u64> = self
            .voters
            .iter()
            .map(|id| self.progress.get(id).map_or(0, |p| p.matched))
            .collect();
        m.sort_unstable_by(|a, b| b.cmp(a));
        m[self.quorum() - 1]
    }

    pub fn reset_votes(&mut self) {
        self.votes.clear();
    }

    pub fn record_vote(&mut self, id: u64, granted: bool) {
        self.votes.entry(id).or_insert(granted);
    }

    pub fn tally_votes(&self) -> (usize, usize, VoteResult) {
        let mut granted = 0;
        let mut rejected = 0;
        for id in &self.voters {
            match self.votes.get(id) {
                Some(true) => granted += 1,
                Some(false) => rejected += 1,
                None => {}
            }
        }
        let q = self.quorum();
        let result = if granted >= q {
            VoteResult::Won
        } else if self.voters.len() - rejected < q {
            VoteResult::Lost
        } else {
            VoteResult::Pending
        };
        (granted, rejected, result)
    }

    /// Whether a quorum of voters was heard from recently (check-quorum).
    pub fn quorum_active(&self, self_id: u64) -> bool {
        let active = self
            .voters
            .iter()
            .filter(|id| **id == self_id || self.progress.get(id).is_some_and(|p| p.recent_active))
            .count();
        active >= self.quorum()
    }

    pub fn insert(&mut self, id: u64, next_idx: u64, is_learner: bool) {
        let mut p = Progress::new(next_idx, self.max_inflight_msgs, self.max_inflight_bytes);
        p.is_learner = is_learner;
        self.progress.insert(id, p);
        if is_learner {
            self.learners.insert(id);
        } else {
            self.voters.insert(id);
        }
    }

    pub fn remove(&mut self, id: u64) {
        self.progress.remove(&id);
        self.voters.remove(&id);
        self.learners.remove(&id);
        self.votes.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Raft thesis 10.2.1: the window bounds appends in flight by count and by bytes.
    #[test]
    fn inflights_bound_count_and_bytes() {
        let mut f = Inflights::new(3, 100);
        f.add(1, 10);
        f.add(2, 10);
        assert!(!f.full());
        f.add(3, 10);
        assert!(f.full());
        f.free_le(2);
        assert_eq!(f.count(), 1);
        assert!(!f.full());
        f.add(4, 90);
        assert!(f.full(), "byte bound reached at 100");
        f.free_first_one();
        assert_eq!(f.size_bytes(), 90);
    }

    #[test]
    fn committed_index_is_quorum_match() {
        let mut t = ProgressTracker::new(4, 1 << 20);
        for id in 1..=5 {
            t.insert(id, 1, false);
        }
        for (id, m) in [(1, 5), (2, 4), (3, 3), (4, 2), (5, 1)] {
            t.progress.get_mut(&id).unwrap().matched = m;
        }
        assert_eq!(t.committed_index(), 3);
        t.insert(6, 1, true);
        t.progress.get_mut(&6).unwrap().matched = 10;
        assert_eq!(t.committed_index(), 3, "learners do not count");
    }

    #[test]
    fn probe_decrement_uses_hint() {
        let mut p = Progress::new(10, 4, 1 << 20);
        assert!(p.maybe_decr_to(9, 4));
        assert_eq!(p.next_idx, 5);
        assert!(!p.maybe_decr_to(9, 2), "stale rejection ignored");
    }
}

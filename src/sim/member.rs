//! What the keyspace model's members build on: a Ready whose write is in
//! progress, and a small replicated state machine whose whole state is a
//! hash chain of the applied entries plus the membership it has applied;
//! and the digest of an entry, which the driver simulation's log checks use
//! too.

use std::collections::BTreeSet;

use crate::raft::{ConfChange, ConfChangeType, ConfState, Entry, Ready};

/// FNV-1a over `bytes`, continuing from `h`. Our own tiny hash so that a
/// trace means the same thing on every build.
pub(crate) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// What identifies an entry's content: its type and its payload.
pub(crate) fn entry_digest(e: &Entry) -> u64 {
    let h = fnv1a(FNV_OFFSET, &e.entry_type.to_le_bytes());
    fnv1a(h, &e.data)
}

/// The replicated state: the hash of every entry applied so far, in order,
/// and the membership as of the last applied entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StateMachine {
    pub applied_index: u64,
    pub chain_hash: u64,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    /// Members once removed; like etcd, a removed id never comes back.
    pub removed: BTreeSet<u64>,
}

impl StateMachine {
    pub fn conf_state(&self) -> ConfState {
        ConfState {
            voters: self.voters.iter().copied().collect(),
            learners: self.learners.iter().copied().collect(),
        }
    }

    pub fn is_member(&self, id: u64) -> bool {
        self.voters.contains(&id) || self.learners.contains(&id)
    }

    /// Folds an applied entry into the state.
    pub fn apply(&mut self, e: &Entry) {
        let mut h = fnv1a(self.chain_hash ^ FNV_OFFSET, &e.index.to_le_bytes());
        h = fnv1a(h, &e.term.to_le_bytes());
        h = fnv1a(h, &entry_digest(e).to_le_bytes());
        self.chain_hash = h;
        self.applied_index = e.index;
    }

    /// Whether a committed membership change still makes sense when it is
    /// applied: every member decides the same, since all apply the same
    /// log. A duplicated or stale proposal is skipped, as etcd's server does.
    pub fn conf_change_valid(&self, cc: &ConfChange) -> bool {
        let id = cc.node_id;
        if id == 0 || self.removed.contains(&id) {
            return false;
        }
        match cc.change_type() {
            ConfChangeType::ConfChangeAddNode => !self.voters.contains(&id),
            ConfChangeType::ConfChangeAddLearnerNode => !self.is_member(id),
            ConfChangeType::ConfChangeRemoveNode => {
                self.learners.contains(&id) || (self.voters.contains(&id) && self.voters.len() > 1)
            }
            ConfChangeType::ConfChangeUpdateNode => false,
        }
    }

    pub fn apply_conf_change(&mut self, cc: &ConfChange) {
        let id = cc.node_id;
        match cc.change_type() {
            ConfChangeType::ConfChangeAddNode => {
                self.learners.remove(&id);
                self.voters.insert(id);
            }
            ConfChangeType::ConfChangeAddLearnerNode => {
                self.learners.insert(id);
            }
            ConfChangeType::ConfChangeRemoveNode => {
                self.voters.remove(&id);
                self.learners.remove(&id);
                self.removed.insert(id);
            }
            ConfChangeType::ConfChangeUpdateNode => {}
        }
    }
}

/// A Ready taken from the node whose write has not completed yet.
pub(crate) struct PendingWrite {
    pub rd: Ready,
    pub done_at_tick: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Thesis 4.1: a change is judged against the membership it applies to.
    #[test]
    fn stale_conf_changes_are_refused() {
        let mut sm = StateMachine::default();
        sm.voters.extend([1, 2]);
        let cc = |t: ConfChangeType, id| ConfChange {
            change_type: t as i32,
            node_id: id,
            ..Default::default()
        };
        assert!(sm.conf_change_valid(&cc(ConfChangeType::ConfChangeAddLearnerNode, 3)));
        assert!(!sm.conf_change_valid(&cc(ConfChangeType::ConfChangeAddNode, 2)));
        sm.apply_conf_change(&cc(ConfChangeType::ConfChangeRemoveNode, 2));
        assert!(!sm.conf_change_valid(&cc(ConfChangeType::ConfChangeAddNode, 2)));
        assert!(!sm.conf_change_valid(&cc(ConfChangeType::ConfChangeRemoveNode, 1)));
    }
}

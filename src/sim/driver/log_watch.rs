//! The leaders' logs and commits as the wire shows them, checked at every
//! append or heartbeat a member sends. A leader's appends show `(index,
//! term)` pairs of its log (the entry before the ones sent, and those sent,
//! with their data), and every append or heartbeat carries its commit
//! index. Within its term a leader's log only grows, so a pair it showed
//! earlier in the term still holds when it later says the index is
//! committed. Three properties follow:
//! - Raft paper 5.3 (log matching): an `(index, term)` names one entry,
//!   with one data and one term before it, in every append that shows it;
//! - Raft paper 5.4.3 (state machine safety): an index said committed never
//!   has another term, whoever says so;
//! - Raft paper 5.4.1 (leader completeness): a leader of term `T` shows no
//!   other term at an index committed by the leader of an earlier term.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::raft::{self, MessageType};
use crate::sim::digest::entry_digest;

use super::checks::{violation, DriverViolation, DriverViolationKind as Kind};

/// What the leaders sent said of their logs and commits.
#[derive(Default)]
pub struct LogWatch {
    /// Every entry an append carried: (term of the entry before it, digest
    /// of the entry) by (index, term).
    entries: RefCell<BTreeMap<(u64, u64), (u64, u64)>>,
    /// Pairs each term's leader showed and has not yet said committed: by
    /// term, entry term by index.
    shown: RefCell<BTreeMap<u64, BTreeMap<u64, u64>>>,
    /// Indexes said committed: (entry term, term of the leader that said
    /// so first) by index.
    committed: RefCell<BTreeMap<u64, (u64, u64)>>,
}

impl LogWatch {
    /// Takes in an append or heartbeat a leader sends; errs when it breaks
    /// either property.
    pub fn check(&self, msg: &raft::Message) -> Result<(), DriverViolation> {
        let t = msg.msg_type();
        if t != MessageType::MsgApp && t != MessageType::MsgHeartbeat {
            return Ok(());
        }
        let (leader, term) = (msg.from, msg.term);
        let mut shown_by_term = self.shown.borrow_mut();
        let shown = shown_by_term.entry(term).or_default();
        let mut committed = self.committed.borrow_mut();
        if t == MessageType::MsgApp {
            let mut entries = self.entries.borrow_mut();
            let mut before = msg.log_term;
            for e in &msg.entries {
                let this = (before, entry_digest(e));
                let seen = *entries.entry((e.index, e.term)).or_insert(this);
                if seen != this {
                    return Err(violation(
                        Kind::LogMismatch,
                        format!(
                            "member {leader}, leader of term {term}, sent entry {} of term {} \
                             after term {before} (digest {:#x}); an earlier append had it after \
                             term {} (digest {:#x})",
                            e.index, e.term, this.1, seen.0, seen.1
                        ),
                    ));
                }
                before = e.term;
            }
            let prev = (msg.index > 0).then_some((msg.index, msg.log_term));
            let sent = msg.entries.iter().map(|e| (e.index, e.term));
            for (index, entry_term) in prev.into_iter().chain(sent) {
                if let Some(&(was, by)) = committed.get(&index) {
                    if by < term && was != entry_term {
                        return Err(violation(
                            Kind::LeaderIncomplete,
                            format!(
                                "member {leader}, leader of term {term}, has term {entry_term} \
                                 at index {index}, which the leader of term {by} committed \
                                 with term {was}"
                            ),
                        ));
                    }
                }
                shown.insert(index, entry_term);
            }
        }
        let later = shown.split_off(&(msg.commit + 1));
        let now_committed = std::mem::replace(shown, later);
        for (index, entry_term) in now_committed {
            match committed.get(&index) {
                Some(&(was, by)) if was != entry_term => {
                    return Err(violation(
                        Kind::CommittedChanged,
                        format!(
                            "member {leader}, leader of term {term}, committed index {index} \
                             with term {entry_term}; the leader of term {by} had committed it \
                             with term {was}"
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    committed.insert(index, (entry_term, term));
                }
            }
        }
        Ok(())
    }
}

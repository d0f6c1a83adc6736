//! Steps and their checks: counting and tracing each step, the safety checks
//! run after every step (election safety, commits, leader completeness), and
//! the persistence contract checked on the messages a Ready sends at once.

use rand::Rng;

use super::report::fmt_msg;
use super::Sim;
use crate::raft::{MemStorage, Message, MessageType, StateRole, Storage};
use crate::sim::checker::{found, Check, ViolationKind};

impl Sim {
    pub(super) fn begin_step(&mut self, what: impl FnOnce() -> String) {
        self.stats.steps += 1;
        self.note(what);
    }

    /// The checks run after every step.
    pub(super) fn end_step(&mut self) -> Check {
        for idx in 0..self.members.len() {
            let m = &mut self.members[idx];
            let Some(node) = m.node.as_ref() else {
                continue;
            };
            let id = m.id;
            let role = node.role();
            let term = node.term();
            let changed = (role, term) != m.last_role;
            m.last_role = (role, term);
            if role == StateRole::Leader && self.checker.observe_leader(term, id)? {
                self.stats.leaders_elected += 1;
                if !self.calm && self.rng.gen_range(0..1000) < self.plan.new_leader_crash_per_mille
                {
                    let at = self.tick + self.rng.gen_range(0..=self.plan.max_doom_delay_ticks);
                    let crash = self.rng.gen_range(0..1000) < self.plan.doom_crash_per_mille;
                    self.doomed.push((at, idx, m.incarnation, crash));
                }
            }
            let commit = node.committed_index();
            if commit > m.seen_commit {
                for i in (m.seen_commit + 1)..=commit {
                    if let Some(t) = node.term_of(i) {
                        self.checker.observe_commit(id, i, t, term)?;
                    }
                }
                self.checker.observe_commit_index(commit);
                if role == StateRole::Leader
                    && !self.calm
                    && self.rng.gen_range(0..1000) < self.plan.committed_leader_crash_per_mille
                {
                    let crash = self.rng.gen_range(0..1000) < self.plan.doom_crash_per_mille;
                    self.doomed.push((self.tick, idx, m.incarnation, crash));
                }
                if role == StateRole::Leader && node.term_of(commit).is_some_and(|t| t != term) {
                    self.stats.old_term_commits += 1;
                    if self.trace_on {
                        let line = format!(
                            "[t{} s{}]   n{id} (leader of term {term}) committed {commit} of term {:?}",
                            self.tick,
                            self.stats.steps,
                            node.term_of(commit)
                        );
                        self.trace.push(line);
                    }
                }
                m.seen_commit = commit;
            }
            if role == StateRole::Leader {
                if m.lc_term != term {
                    m.lc_term = term;
                    m.lc_cursor = 0;
                }
                let upto = self.checker.committed_contiguous();
                while m.lc_cursor < upto {
                    let i = m.lc_cursor + 1;
                    let ce = self.checker.committed_at(i).expect("contiguous");
                    if ce.commit_term < term {
                        match node.term_of(i) {
                            Some(t) if t == ce.term => {}
                            None if i <= node.committed_index() => {}
                            other => {
                                return Err(found(
                                    ViolationKind::LeaderCompleteness,
                                    format!(
                                        "member {id}, leader of term {term}, has {} at index {i}, committed with term {} by term {}",
                                        other.map_or("no entry".to_string(), |t| format!("term {t}")),
                                        ce.term,
                                        ce.commit_term
                                    ),
                                ));
                            }
                        }
                    }
                    m.lc_cursor = i;
                }
            }
            if changed && self.trace_on {
                let line = format!(
                    "[t{} s{}]   n{id} is {role:?} in term {term} (commit {commit}, last {})",
                    self.tick,
                    self.stats.steps,
                    node.last_index()
                );
                self.trace.push(line);
            }
        }
        Ok(())
    }
}

/// The persistence contract: a message in `Ready::messages` leaves before
/// the Ready's state is durable, so it may vouch only for what `store`
/// (the durable image) already holds.
pub(super) fn check_immediate(store: &MemStorage, id: u64, m: &Message) -> Check {
    let hs = store.hard_state();
    let t = m.msg_type;
    let bad = if t == MessageType::MsgVote as i32 {
        !(hs.term == m.term && hs.vote == id)
    } else if t == MessageType::MsgVoteResp as i32 && !m.reject {
        !(hs.term == m.term && hs.vote == m.to)
    } else if t == MessageType::MsgAppResp as i32 && !m.reject {
        store.last_index().unwrap_or(0) < m.index && m.index > 0
    } else {
        false
    };
    if bad {
        return Err(found(
            ViolationKind::PersistenceContract,
            format!(
                "member {id} sends {} before it is durable (durable term {} vote {} last index {})",
                fmt_msg(m),
                hs.term,
                hs.vote,
                store.last_index().unwrap_or(0)
            ),
        ));
    }
    Ok(())
}

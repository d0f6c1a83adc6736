//! What a run leaves for its reader: one-line renderings of messages for the
//! trace, and the state of every member when a seed fails.

use super::Sim;
use crate::raft::{Message, MessageType};

fn short_type(t: i32) -> String {
    match MessageType::try_from(t) {
        Ok(t) => format!("{t:?}").trim_start_matches("Msg").to_string(),
        Err(_) => format!("?{t}"),
    }
}

pub(super) fn fmt_msg(m: &Message) -> String {
    let mut s = format!(
        "{} {}->{} t{} i{} lt{} c{}",
        short_type(m.msg_type),
        m.from,
        m.to,
        m.term,
        m.index,
        m.log_term,
        m.commit
    );
    if !m.entries.is_empty() {
        let first = m.entries[0].index;
        let last = m.entries[m.entries.len() - 1].index;
        s.push_str(&format!(" e[{first}..={last}]"));
    }
    if m.reject {
        s.push_str(&format!(" reject(hint {})", m.reject_hint));
    }
    if let Some(md) = m.snapshot.as_ref().and_then(|s| s.metadata.as_ref()) {
        s.push_str(&format!(" snap@{}t{}", md.index, md.term));
    }
    s
}

impl Sim {
    pub(super) fn state_summary(&self) -> String {
        let mut parts = Vec::new();
        for m in &self.members {
            let s = match &m.node {
                None => format!("n{} down", m.id),
                Some(n) => format!(
                    "n{} {:?} t{} lead {} commit {} applied {} last {} voters {:?} learners {:?} (raft: {:?} {:?}){}",
                    m.id,
                    n.role(),
                    n.term(),
                    n.leader_id(),
                    n.committed_index(),
                    m.sm.applied_index,
                    n.last_index(),
                    m.sm.voters,
                    m.sm.learners,
                    n.status().conf_state.voters,
                    n.status().conf_state.learners,
                    if m.pending.is_empty() { "" } else { " (write pending)" }
                ),
            };
            parts.push(s);
        }
        parts.join("; ")
    }

    pub(super) fn dump_state(&mut self) {
        let s = self.state_summary();
        for part in s.split("; ") {
            self.trace.push(format!("[end] {part}"));
        }
        let links = self.net.blocked_links();
        let in_flight = self.net.in_flight();
        self.trace.push(format!(
            "[end] blocked links {links:?}, {in_flight} messages in flight"
        ));
    }
}

//! Messages between members: sending them into the simulated network (with
//! the log-matching check on appends) and delivering them, or losing them
//! to a cut link, a down member or a removed sender.

use super::report::fmt_msg;
use super::Sim;
use crate::raft::{Message, MessageType, SnapshotStatus};
use crate::sim::checker::Check;
use crate::sim::member::entry_digest;
use crate::sim::network::SendFate;

impl Sim {
    pub(super) fn send(&mut self, msg: Message) -> Check {
        let from = msg.from;
        if msg.msg_type == MessageType::MsgApp as i32 && !msg.entries.is_empty() {
            let mut prev = Some(msg.log_term);
            for e in &msg.entries {
                self.checker
                    .log_entry(from, e.index, e.term, entry_digest(e), prev)?;
                prev = Some(e.term);
            }
        }
        let to = msg.to;
        let is_snap = msg.msg_type == MessageType::MsgSnap as i32;
        let line = if self.trace_on {
            fmt_msg(&msg)
        } else {
            String::new()
        };
        let fate = self.net.send(&mut self.rng, self.tick, msg);
        self.note(|| format!("  send {line} -> {fate:?}"));
        match fate {
            SendFate::Queued { .. } => {}
            SendFate::Blocked => {
                self.stats.messages_dropped += 1;
                if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                    node.report_unreachable(to);
                    if is_snap {
                        node.report_snapshot(to, SnapshotStatus::Failure);
                    }
                }
            }
            SendFate::Dropped => {
                self.stats.messages_dropped += 1;
                if is_snap {
                    if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                        node.report_snapshot(to, SnapshotStatus::Failure);
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn deliver(&mut self, msg: Message) -> Check {
        let (from, to) = (msg.from, msg.to);
        let is_snap = msg.msg_type == MessageType::MsgSnap as i32;
        let line = if self.trace_on {
            fmt_msg(&msg)
        } else {
            String::new()
        };
        let to_idx = to as usize - 1;
        // Like etcd's transport, a member refuses traffic from a member its
        // applied membership says was removed, so a removed member that
        // never learnt of its removal cannot disrupt the group.
        let reachable = !self.net.is_blocked(from, to)
            && self
                .members
                .get(to_idx)
                .is_some_and(|m| m.is_up() && !m.sm.removed.contains(&from));
        if !reachable {
            self.begin_step(|| format!("lost {line}"));
            self.stats.messages_dropped += 1;
            if is_snap {
                if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                    node.report_snapshot(to, SnapshotStatus::Failure);
                }
                self.pump(from as usize - 1)?;
            }
            return self.end_step();
        }
        self.begin_step(|| format!("deliver {line}"));
        self.stats.messages_delivered += 1;
        let res = self.members[to_idx].node.as_mut().expect("up").step(msg);
        if let Err(e) = res {
            self.note(|| format!("  n{to} refused: {e}"));
        }
        self.pump(to_idx)?;
        if is_snap {
            if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                node.report_snapshot(to, SnapshotStatus::Finish);
            }
            self.pump(from as usize - 1)?;
        }
        self.end_step()
    }
}

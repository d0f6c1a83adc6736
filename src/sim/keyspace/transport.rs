//! Carrying one shard's messages between members: sending through that
//! shard's simulated network, holding messages for a paused member, and
//! the restart vote hold.

use super::super::network::SendFate;
use super::checker::Check;
use super::world::World;
use super::{ELECTION_TIMEOUT_TICKS, MTICKS_PER_TICK};
use crate::raft::{Message, MessageType};

/// The context a transfer campaign's vote requests carry (the Raft core's
/// `CAMPAIGN_TRANSFER`): they override a follower's lease, and the restart
/// vote hold lets them through as well.
const CAMPAIGN_TRANSFER: &[u8] = b"CampaignTransfer";

/// One line of trace for a message of `shard`.
fn fmt_msg(shard: usize, m: &Message) -> String {
    let t = match MessageType::try_from(m.msg_type) {
        Ok(t) => format!("{t:?}").trim_start_matches("Msg").to_string(),
        Err(_) => format!("?{}", m.msg_type),
    };
    let mut s = format!(
        "s{shard} {t} {}->{} t{} i{} lt{} c{}",
        m.from, m.to, m.term, m.index, m.log_term, m.commit
    );
    if !m.entries.is_empty() {
        let first = m.entries[0].index;
        let last = m.entries[m.entries.len() - 1].index;
        s.push_str(&format!(" e[{first}..={last}]"));
    }
    if m.reject {
        s.push_str(" reject");
    }
    if !m.context.is_empty() {
        s.push_str(" force");
    }
    s
}

impl World {
    /// Hands a message to its shard's network; a cut link is reported to
    /// the sender as unreachable, as a transport would.
    pub fn send(&mut self, shard: usize, msg: Message) {
        let (from, to) = (msg.from, msg.to);
        let line = if self.trace_on {
            fmt_msg(shard, &msg)
        } else {
            String::new()
        };
        let fate = self.nets[shard].send(&mut self.rng, self.tick, msg);
        self.note(|| format!("  send {line} -> {fate:?}"));
        match fate {
            SendFate::Queued { .. } => {}
            SendFate::Blocked => {
                self.stats.messages_dropped += 1;
                if let Some(node) = self.members[from as usize - 1].shards[shard].node.as_mut() {
                    node.report_unreachable(to);
                }
            }
            SendFate::Dropped => self.stats.messages_dropped += 1,
        }
    }

    /// Delivers a due message: lost if the link is cut or the target down,
    /// held while the target is paused, held back by the restart vote hold,
    /// else stepped into the target shard's node.
    pub fn deliver(&mut self, shard: usize, msg: Message) -> Check {
        let (from, to) = (msg.from, msg.to);
        let line = if self.trace_on {
            fmt_msg(shard, &msg)
        } else {
            String::new()
        };
        let to_idx = to as usize - 1;
        let target = &mut self.members[to_idx];
        if self.nets[shard].is_blocked(from, to) || !target.is_up() {
            self.begin_step(|| format!("lost {line}"));
            self.stats.messages_dropped += 1;
            return self.end_step();
        }
        if target.is_paused() {
            // The message waits in the paused process's socket.
            target.held.push((shard, msg));
            return Ok(());
        }
        let is_vote = msg.msg_type == MessageType::MsgVote as i32
            || msg.msg_type == MessageType::MsgPreVote as i32;
        if is_vote
            && self.guard.holds_restart_votes()
            && msg.context.as_ref() != CAMPAIGN_TRANSFER
            && target.clock_mticks
                < target.started_at_mticks + ELECTION_TIMEOUT_TICKS * MTICKS_PER_TICK
        {
            let since = target.started_at_tick;
            self.begin_step(|| format!("hold {line}: n{to} started at t{since}"));
            self.stats.votes_held += 1;
            return self.end_step();
        }
        self.begin_step(|| format!("deliver {line}"));
        self.stats.messages_delivered += 1;
        let res = self.members[to_idx].shards[shard]
            .node
            .as_mut()
            .expect("up")
            .step(msg);
        if let Err(e) = res {
            self.note(|| format!("  n{to} s{shard} refused: {e}"));
        }
        self.pump(to_idx, shard)?;
        self.end_step()
    }
}

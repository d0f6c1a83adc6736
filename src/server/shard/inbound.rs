//! What peers send a shard: Raft messages stepped into its node (a proposal
//! forwarded while no leader takes it is held), and received snapshots,
//! spooled to a file, handed to Raft and held until it applies them.

use super::*;

impl Shard {
    pub(super) fn receive(&mut self, inbound: ShardInbound) {
        match inbound {
            ShardInbound::Raft(m) => self.step(m),
            ShardInbound::Snapshot(spooled) => {
                let (msg, chunks) = spooled.into_parts();
                let index = msg
                    .snapshot
                    .as_ref()
                    .and_then(|s| s.metadata.as_ref())
                    .map_or(0, |m| m.index);
                tracing::info!(
                    shard = self.id,
                    index,
                    bytes = chunks.len_bytes(),
                    file = %chunks.path().display(),
                    "snapshot received"
                );
                let members = cairn_proto::cairnpb::MemberTable::decode(msg.context.clone())
                    .ok()
                    .filter(|t| t.cluster_id == self.members.cluster_id());
                self.step(msg);
                let pending = self.node.pending_snapshot_index();
                // A snapshot Raft does not take is dropped, and its file with it.
                let incoming = IncomingSnapshot { chunks, members };
                if !self.held_snapshot.received(index, incoming, pending) {
                    tracing::info!(
                        shard = self.id,
                        index,
                        ?pending,
                        "snapshot not taken by raft; dropped"
                    );
                }
            }
        }
    }

    pub(super) fn step(&mut self, mut msg: raft::Message) {
        if self.failed.is_some() {
            return;
        }
        if self.strict_reconfig {
            self.peer_heard.insert(msg.from, std::time::Instant::now());
        }
        // The revision the last write of a forwarded proposal took, noted
        // once Raft took it.
        let mut stamped = 0;
        if msg.msg_type == raft::MessageType::MsgProp as i32 {
            let stamp = if self.takes_proposals() {
                self.stamp_forwarded(&mut msg)
            } else {
                None
            };
            let Some(last) = stamp else {
                let from = msg.from;
                if let Some(HeldWrite::Forwarded(_)) = self.hold_write(HeldWrite::Forwarded(msg)) {
                    tracing::warn!(
                        shard = self.id,
                        from,
                        "forwarded proposal dropped: too many waiting for a leader"
                    );
                }
                return;
            };
            stamped = last;
        }
        // A proposal forwarded to this keyspace leader: what it touches
        // matters to txns over several shards.
        let forwarded = (msg.msg_type == raft::MessageType::MsgProp as i32
            && self.node.leader_id() == self.member_id)
            .then(|| {
                msg.entries
                    .iter()
                    .map(|e| e.data.clone())
                    .collect::<Vec<_>>()
            });
        match self.node.step(msg) {
            Ok(()) => {
                self.proposed_revision(stamped);
                if let Some(data) = forwarded {
                    self.note_proposed(data.into_iter());
                }
            }
            Err(e) => {
                tracing::debug!(shard = self.id, error = %e, "raft refused a peer message")
            }
        }
    }
}

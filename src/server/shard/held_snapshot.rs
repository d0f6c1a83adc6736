//! The data of the one received snapshot Raft waits to see installed.
//! Dropping a snapshot's data (refused, replaced or installed) deletes its
//! spool file.

use super::snapshots::IncomingSnapshot;

/// Raft waits for at most one snapshot at a time: the one it took last (a
/// newer one replaces it, an older one or one its log already covers is
/// refused). The shard holds exactly that snapshot's data, from the moment
/// Raft steps its `MsgSnap` until the Ready that installs it, so nothing that
/// arrives in between (refused snapshots, however many) can push it out.
#[derive(Default)]
pub(super) struct HeldSnapshot {
    held: Option<(u64, IncomingSnapshot)>,
}

impl HeldSnapshot {
    /// Records the data of the snapshot at `index`, whose `MsgSnap` Raft has
    /// just stepped; `pending` is the snapshot Raft now waits for. The data is
    /// kept only if Raft took it; returns whether it did.
    pub(super) fn received(
        &mut self,
        index: u64,
        incoming: IncomingSnapshot,
        pending: Option<u64>,
    ) -> bool {
        if pending == Some(index) {
            self.held = Some((index, incoming));
            return true;
        }
        if self.index() != pending {
            self.held = None;
        }
        false
    }

    /// The index of the snapshot whose data is held.
    pub(super) fn index(&self) -> Option<u64> {
        self.held.as_ref().map(|(index, _)| *index)
    }

    /// Hands over the data of the snapshot at `index`, which Raft asks to
    /// install.
    pub(super) fn take(&mut self, index: u64) -> Result<IncomingSnapshot, String> {
        match self.held.take() {
            Some((held, incoming)) if held == index => Ok(incoming),
            held => Err(format!(
                "raft accepted a snapshot at index {index} but the data held is for {:?}",
                held.map(|(held, _)| held)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Messages a follower's Raft steps, in orders a leader can send them,
    //! with the data held checked against the Ready that installs a snapshot,
    //! and the spool files of the snapshots not held deleted.

    use std::path::{Path, PathBuf};

    use super::super::spool::spool_for_test;
    use super::*;
    use crate::raft::{
        self, ConfState, Entry, MemStorage, Message, MessageType, RawNode, Snapshot,
        SnapshotMetadata,
    };
    use bytes::Bytes;
    use prost::Message as _;

    const LEADER: u64 = 1;
    const FOLLOWER: u64 = 3;
    const TERM: u64 = 2;

    fn voters() -> ConfState {
        ConfState {
            voters: vec![1, 2, 3],
            learners: vec![],
        }
    }

    /// A follower configured as a shard configures its Raft.
    fn follower() -> RawNode<MemStorage> {
        let mut cfg = raft::Config::new(FOLLOWER);
        cfg.async_append = true;
        RawNode::new(&cfg, MemStorage::new_with_conf_state(voters())).unwrap()
    }

    fn snapshot_msg(index: u64) -> Message {
        Message {
            msg_type: MessageType::MsgSnap as i32,
            from: LEADER,
            to: FOLLOWER,
            term: TERM,
            snapshot: Some(Snapshot {
                data: Bytes::new(),
                metadata: Some(SnapshotMetadata {
                    conf_state: Some(voters()),
                    index,
                    term: TERM,
                }),
            }),
            ..Default::default()
        }
    }

    /// The leader's entries `after + 1 ..= last`, sent once the follower's
    /// log ends at `after`.
    fn append_msg(after: u64, last: u64) -> Message {
        Message {
            msg_type: MessageType::MsgApp as i32,
            from: LEADER,
            to: FOLLOWER,
            term: TERM,
            index: after,
            log_term: TERM,
            commit: after,
            entries: (after + 1..=last)
                .map(|index| Entry {
                    term: TERM,
                    index,
                    data: Bytes::from(format!("e{index}")),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Spooled data that says which snapshot it belongs to, in a file of
    /// its own in `dir`.
    fn data(dir: &Path, index: u64) -> IncomingSnapshot {
        let msg = snapshot_msg(index).encode_to_vec();
        let chunk = index.to_le_bytes();
        let spooled = spool_for_test(
            dir,
            &format!("{index}-{}", rand::random::<u32>()),
            &[
                &(msg.len() as u32).to_le_bytes(),
                &msg,
                &(chunk.len() as u32).to_le_bytes(),
                &chunk,
            ],
        )
        .unwrap();
        let (_, chunks) = spooled.into_parts();
        IncomingSnapshot {
            chunks,
            members: None,
        }
    }

    /// The spool files in `dir`.
    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    /// Steps a received snapshot into Raft, then offers its data, as the
    /// shard's receive does.
    fn receive(
        dir: &Path,
        node: &mut RawNode<MemStorage>,
        held: &mut HeldSnapshot,
        index: u64,
    ) -> bool {
        let _ = node.step(snapshot_msg(index));
        held.received(index, data(dir, index), node.pending_snapshot_index())
    }

    /// Takes the Ready and the data it asks to install; only the held
    /// snapshot's file is left until then, none after.
    fn install(
        dir: &Path,
        node: &mut RawNode<MemStorage>,
        held: &mut HeldSnapshot,
    ) -> Result<u64, String> {
        let ready = node.ready();
        let md = ready
            .snapshot
            .and_then(|s| s.metadata)
            .expect("the Ready carries a snapshot");
        let incoming = held.take(md.index)?;
        assert_eq!(files(dir), vec![incoming.chunks.path().to_path_buf()]);
        let mut reader = incoming.chunks.reader();
        let chunks: Vec<Vec<u8>> = reader.by_ref().collect();
        assert!(reader.into_error().is_none());
        assert_eq!(chunks, vec![md.index.to_le_bytes().to_vec()]);
        drop(incoming);
        assert_eq!(files(dir), Vec::<PathBuf>::new());
        Ok(md.index)
    }

    #[test]
    fn later_snapshots_raft_refuses_do_not_evict_the_one_it_waits_for() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut node = follower();
        let mut held = HeldSnapshot::default();
        assert!(receive(dir, &mut node, &mut held, 20));
        // Entries past the snapshot arrive before it is persisted; two more
        // snapshots inside them (a retried transfer after the leader compacted
        // further) are covered by the log, so Raft refuses them and keeps
        // waiting for the first.
        node.step(append_msg(20, 24)).unwrap();
        assert!(!receive(dir, &mut node, &mut held, 22));
        assert!(!receive(dir, &mut node, &mut held, 24));
        assert_eq!(node.pending_snapshot_index(), Some(20));
        assert_eq!(install(dir, &mut node, &mut held), Ok(20));
    }

    #[test]
    fn older_snapshots_do_not_evict_the_one_raft_waits_for() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut node = follower();
        let mut held = HeldSnapshot::default();
        assert!(receive(dir, &mut node, &mut held, 20));
        for stale in [12, 15, 20] {
            receive(dir, &mut node, &mut held, stale);
        }
        assert_eq!(install(dir, &mut node, &mut held), Ok(20));
    }

    #[test]
    fn a_newer_snapshot_raft_takes_replaces_the_held_one() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut node = follower();
        let mut held = HeldSnapshot::default();
        assert!(receive(dir, &mut node, &mut held, 20));
        assert!(receive(dir, &mut node, &mut held, 30));
        assert_eq!(held.index(), Some(30));
        assert_eq!(install(dir, &mut node, &mut held), Ok(30));
    }

    #[test]
    fn data_for_another_index_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut held = HeldSnapshot::default();
        assert!(held.received(20, data(dir.path(), 20), Some(20)));
        let err = held.take(30).err().unwrap();
        assert!(
            err.contains("index 30") && err.contains("Some(20)"),
            "{err}"
        );
        assert!(held.take(20).is_err(), "the data was handed over once");
        assert_eq!(files(dir.path()), Vec::<PathBuf>::new());
    }
}

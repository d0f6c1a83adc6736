//! The Raft core through its public API only, driven the way the shard driver
//! drives it: send-now messages before persisting, acknowledgements after,
//! committed entries applied, `advance`, and a restart from a snapshot plus the
//! log. Guards against API changes that would break the daemon's driver loop
//! and against Ready contents that violate the persistence contract.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use cairn::raft::{
    ConfState, Config, EntryType, MemStorage, Message, MessageType, RawNode, StateRole,
};

struct Driver {
    nodes: BTreeMap<u64, RawNode<MemStorage>>,
    applied: BTreeMap<u64, Vec<Bytes>>,
    wire: VecDeque<Message>,
}

fn config(id: u64) -> Config {
    let mut c = Config::new(id);
    c.seed = 42;
    c
}

impl Driver {
    fn new(n: u64) -> Self {
        let cs = ConfState {
            voters: (1..=n).collect(),
            learners: vec![],
        };
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            let store = MemStorage::new_with_conf_state(cs.clone());
            nodes.insert(id, RawNode::new(&config(id), store).unwrap());
        }
        Driver {
            nodes,
            applied: BTreeMap::new(),
            wire: VecDeque::new(),
        }
    }

    fn handle_ready(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        if !node.has_ready() {
            return;
        }
        let rd = node.ready();
        for m in &rd.messages {
            // Acknowledgements and votes never leave before persisting.
            assert!(
                !matches!(
                    m.msg_type(),
                    MessageType::MsgAppResp | MessageType::MsgVote | MessageType::MsgVoteResp
                ),
                "{:?} in send-now messages",
                m.msg_type()
            );
        }
        self.wire.extend(rd.messages.iter().cloned());
        let store = node.store_mut();
        if let Some(s) = &rd.snapshot {
            store.apply_snapshot(s.clone()).unwrap();
        }
        store.append(&rd.entries);
        if let Some(hs) = rd.hard_state {
            store.set_hard_state(hs);
        }
        self.wire.extend(rd.persisted_messages.iter().cloned());
        let out = self.applied.entry(id).or_default();
        for e in &rd.committed_entries {
            if e.entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                out.push(e.data.clone());
            }
        }
        node.advance(rd);
    }

    fn run(&mut self, ticks: usize) {
        for _ in 0..ticks {
            for node in self.nodes.values_mut() {
                node.tick();
            }
            self.settle();
        }
    }

    fn settle(&mut self) {
        loop {
            let ids: Vec<u64> = self.nodes.keys().copied().collect();
            for id in ids {
                self.handle_ready(id);
            }
            let Some(m) = self.wire.pop_front() else {
                if self.nodes.values().all(|n| !n.has_ready()) {
                    return;
                }
                continue;
            };
            if let Some(n) = self.nodes.get_mut(&m.to) {
                // Messages cross the wire encoded, as the transport carries them.
                let bytes = prost::Message::encode_to_vec(&m);
                let decoded: Message = prost::Message::decode(Bytes::from(bytes)).unwrap();
                let _ = n.step(decoded);
            }
        }
    }

    fn leader(&self) -> Option<u64> {
        self.nodes
            .iter()
            .find(|(_, n)| n.role() == StateRole::Leader)
            .map(|(id, _)| *id)
    }
}

// Raft paper 5.2 and 5.3: a cluster elects a leader by timeouts alone and
// replicates proposals made at any member.
#[test]
fn elects_and_replicates_through_public_api() {
    let mut d = Driver::new(3);
    d.run(40);
    let l = d.leader().expect("leader elected");
    let follower = if l == 1 { 2 } else { 1 };
    d.nodes
        .get_mut(&follower)
        .unwrap()
        .propose(Bytes::from_static(b"x"))
        .unwrap();
    d.settle();
    d.nodes
        .get_mut(&l)
        .unwrap()
        .propose(Bytes::from_static(b"y"))
        .unwrap();
    d.settle();
    d.run(2);
    for id in 1..=3 {
        assert_eq!(
            d.applied[&id],
            vec![Bytes::from_static(b"x"), Bytes::from_static(b"y")]
        );
    }
}

// Raft paper 7: a member restarts from a snapshot plus the log after it and
// rejoins with its durable state.
#[test]
fn restart_from_snapshot_and_log_through_public_api() {
    let mut d = Driver::new(3);
    d.run(40);
    let l = d.leader().unwrap();
    for i in 0..5u8 {
        d.nodes
            .get_mut(&l)
            .unwrap()
            .propose(Bytes::from(vec![b'a' + i]))
            .unwrap();
        d.settle();
    }
    let victim = if l == 3 { 2 } else { 3 };
    let node = d.nodes.remove(&victim).unwrap();
    let applied = node.applied_index();
    let cs = node.status().conf_state;
    let term = node.term();
    let mut store = node.store().clone();
    store
        .create_snapshot(applied, cs, Bytes::from_static(b"image"))
        .unwrap();
    store.compact(applied).unwrap();
    let mut c = config(victim);
    c.applied_index = applied;
    let node = RawNode::new(&c, store).unwrap();
    assert_eq!(node.term(), term);
    assert_eq!(node.status().first_index, applied + 1);
    d.nodes.insert(victim, node);
    d.nodes
        .get_mut(&l)
        .unwrap()
        .propose(Bytes::from_static(b"z"))
        .unwrap();
    d.settle();
    d.run(3);
    assert_eq!(
        d.applied[&victim].last().unwrap(),
        &Bytes::from_static(b"z")
    );
    assert_eq!(
        d.nodes[&victim].committed_index(),
        d.nodes[&l].committed_index()
    );
}

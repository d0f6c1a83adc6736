//! A small in-process cluster for scenario tests: every member is a real
//! `RawNode` over `MemStorage`, driven through its `Ready`s, with a
//! controllable network (cut links, dropped message types, held messages).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use prost::Message as _;

use crate::raft::{
    ConfChange, ConfState, Config, Entry, EntryType, MemStorage, Message, MessageType, RawNode,
    ReadState, SnapshotStatus, StateRole, Storage,
};

pub struct Member {
    pub node: RawNode<MemStorage>,
    /// Normal entries applied, in order: (index, data).
    pub applied: Vec<(u64, Bytes)>,
    pub read_states: Vec<ReadState>,
    pub conf_state: ConfState,
    /// Hold the next Ready instead of processing it (a slow disk).
    pub stall_persist: bool,
}

pub struct Network {
    pub members: BTreeMap<u64, Member>,
    /// Links that drop messages: (from, to).
    pub cut: BTreeSet<(u64, u64)>,
    /// Message types dropped everywhere.
    pub drop_types: BTreeSet<i32>,
    /// Messages in flight, delivered by `deliver`.
    pub queue: VecDeque<Message>,
    /// Every message that was sent, for inspection.
    pub sent: Vec<Message>,
    /// Messages that were sent before the sender persisted.
    pub sent_before_persist: Vec<Message>,
    pub configure: fn(&mut Config),
    /// Rewrites messages in flight; returning false drops the message.
    pub mangle: Option<fn(&mut Message) -> bool>,
}

pub fn config(id: u64) -> Config {
    let mut c = Config::new(id);
    c.election_timeout_ticks = 10;
    c.heartbeat_timeout_ticks = 1;
    c.check_quorum = false;
    c.pre_vote = false;
    c.seed = 7;
    c
}

impl Network {
    /// A cluster of voters `1..=n`, with options applied by `f`.
    pub fn new_with(n: u64, f: fn(&mut Config)) -> Self {
        let voters: Vec<u64> = (1..=n).collect();
        let mut net = Network {
            members: BTreeMap::new(),
            cut: BTreeSet::new(),
            drop_types: BTreeSet::new(),
            queue: VecDeque::new(),
            sent: Vec::new(),
            sent_before_persist: Vec::new(),
            configure: f,
            mangle: None,
        };
        for id in 1..=n {
            let cs = ConfState {
                voters: voters.clone(),
                learners: vec![],
            };
            net.add_member(id, MemStorage::new_with_conf_state(cs));
        }
        net
    }

    pub fn new(n: u64) -> Self {
        Self::new_with(n, |_| {})
    }

    pub fn add_member(&mut self, id: u64, storage: MemStorage) {
        let mut c = config(id);
        (self.configure)(&mut c);
        let cs = storage.initial_state().unwrap().conf_state;
        let node = RawNode::new(&c, storage).unwrap();
        self.members.insert(
            id,
            Member {
                node,
                applied: Vec::new(),
                read_states: Vec::new(),
                conf_state: cs,
                stall_persist: false,
            },
        );
    }

    /// Crash and restart `id` from what it persisted; volatile state is lost.
    pub fn restart(&mut self, id: u64) {
        let applied = self.members[&id].node.applied_index();
        self.restart_with_applied(id, applied);
    }

    /// Restart telling Raft the state machine has applied up to `applied`.
    pub fn restart_with_applied(&mut self, id: u64, applied: u64) {
        let m = self.members.remove(&id).unwrap();
        let storage = m.node.store().clone();
        let mut c = config(id);
        (self.configure)(&mut c);
        c.applied_index = applied;
        let node = RawNode::new(&c, storage).unwrap();
        self.members.insert(
            id,
            Member {
                node,
                applied: m.applied,
                read_states: Vec::new(),
                conf_state: m.conf_state,
                stall_persist: false,
            },
        );
    }

    pub fn node(&mut self, id: u64) -> &mut RawNode<MemStorage> {
        &mut self.members.get_mut(&id).unwrap().node
    }

    pub fn isolate(&mut self, id: u64) {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        for o in ids {
            if o != id {
                self.cut.insert((id, o));
                self.cut.insert((o, id));
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
        self.drop_types.clear();
    }

    /// Processes one member's Ready, queueing its messages.
    pub fn process(&mut self, id: u64) -> bool {
        let m = self.members.get_mut(&id).unwrap();
        if m.stall_persist || !m.node.has_ready() {
            return false;
        }
        let mut rd = m.node.ready();
        // Messages that may leave at once go before anything is persisted.
        for msg in rd.messages.drain(..) {
            self.sent_before_persist.push(msg.clone());
            self.sent.push(msg.clone());
            self.queue.push_back(msg);
        }
        let m = self.members.get_mut(&id).unwrap();
        let store = m.node.store_mut();
        if let Some(s) = &rd.snapshot {
            store.apply_snapshot(s.clone()).unwrap();
            m.conf_state = s
                .metadata
                .as_ref()
                .and_then(|md| md.conf_state.clone())
                .unwrap_or_default();
            m.applied = decode_state(&s.data);
        }
        store.append(&rd.entries);
        if let Some(hs) = &rd.hard_state {
            store.set_hard_state(*hs);
        }
        for msg in rd.persisted_messages.drain(..) {
            self.sent.push(msg.clone());
            self.queue.push_back(msg);
        }
        let m = self.members.get_mut(&id).unwrap();
        for e in &rd.committed_entries {
            match e.entry_type() {
                EntryType::EntryNormal => {
                    if !e.data.is_empty() {
                        m.applied.push((e.index, e.data.clone()));
                    }
                }
                EntryType::EntryConfChange => {
                    let cc = ConfChange::decode(e.data.clone()).unwrap();
                    m.conf_state = m.node.apply_conf_change(&cc);
                    let cs = m.conf_state.clone();
                    m.node.store_mut().set_conf_state(cs);
                }
            }
        }
        m.read_states.append(&mut rd.read_states);
        m.node.advance(rd);
        true
    }

    pub fn process_all(&mut self) -> bool {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        let mut any = false;
        for id in ids {
            while self.process(id) {
                any = true;
            }
        }
        any
    }

    fn deliverable(&self, m: &Message) -> bool {
        !self.cut.contains(&(m.from, m.to))
            && !self.drop_types.contains(&m.msg_type)
            && self.members.contains_key(&m.to)
    }

    /// Delivers messages and processes Readys until nothing moves.
    pub fn deliver(&mut self) {
        for _ in 0..100_000 {
            self.process_all();
            let Some(mut msg) = self.queue.pop_front() else {
                if !self.process_all() {
                    return;
                }
                continue;
            };
            if !self.deliverable(&msg) {
                continue;
            }
            if let Some(f) = self.mangle {
                if !f(&mut msg) {
                    continue;
                }
            }
            let to = msg.to;
            let _ = self.node(to).step(msg);
        }
        panic!("network did not quiesce");
    }

    /// Steps one message into its target and then settles the network.
    pub fn send(&mut self, msg: Message) {
        self.queue.push_back(msg);
        self.deliver();
    }

    pub fn tick(&mut self, id: u64) {
        self.node(id).tick();
    }

    pub fn tick_all(&mut self, n: usize) {
        for _ in 0..n {
            let ids: Vec<u64> = self.members.keys().copied().collect();
            for id in ids {
                self.tick(id);
            }
            self.deliver();
        }
    }

    pub fn campaign(&mut self, id: u64) {
        self.node(id).campaign().unwrap();
        self.deliver();
    }

    pub fn propose(&mut self, id: u64, data: &str) -> Result<(), crate::raft::RaftError> {
        let r = self
            .node(id)
            .propose(Bytes::copy_from_slice(data.as_bytes()));
        self.deliver();
        r
    }

    pub fn report_snapshot(&mut self, leader: u64, to: u64, st: SnapshotStatus) {
        self.node(leader).report_snapshot(to, st);
        self.deliver();
    }

    pub fn role(&mut self, id: u64) -> StateRole {
        self.node(id).role()
    }

    pub fn leader(&mut self) -> Option<u64> {
        let ids: Vec<u64> = self.members.keys().copied().collect();
        ids.into_iter()
            .find(|id| self.role(*id) == StateRole::Leader)
    }

    pub fn applied_data(&self, id: u64) -> Vec<String> {
        self.members[&id]
            .applied
            .iter()
            .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
            .collect()
    }

    /// Messages of type `t` sent so far, cleared from the record.
    pub fn take_sent(&mut self, t: MessageType) -> Vec<Message> {
        let (out, rest): (Vec<Message>, Vec<Message>) =
            self.sent.drain(..).partition(|m| m.msg_type() == t);
        self.sent = rest;
        out
    }

    /// Snapshots member `id` at its applied index and compacts its log.
    pub fn compact(&mut self, id: u64) -> u64 {
        let m = self.members.get_mut(&id).unwrap();
        let index = m.node.applied_index();
        let data = encode_state(&m.applied);
        let cs = m.conf_state.clone();
        let st = m.node.store_mut();
        st.create_snapshot(index, cs, data).unwrap();
        st.compact(index).unwrap();
        index
    }

    /// Log entries of member `id` in its storage.
    pub fn entries(&mut self, id: u64) -> Vec<Entry> {
        let n = self.node(id);
        let st = n.store();
        let first = st.first_index().unwrap();
        let last = st.last_index().unwrap();
        st.entries(first, last + 1, u64::MAX).unwrap()
    }
}

/// The harness state machine's image: its applied list, one "index data" per line.
pub fn encode_state(applied: &[(u64, Bytes)]) -> Bytes {
    let mut out = Vec::new();
    for (i, d) in applied {
        out.extend_from_slice(format!("{i} ").as_bytes());
        out.extend_from_slice(d);
        out.push(b'\n');
    }
    Bytes::from(out)
}

pub fn decode_state(data: &[u8]) -> Vec<(u64, Bytes)> {
    data.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let sp = l.iter().position(|b| *b == b' ').unwrap();
            let i: u64 = std::str::from_utf8(&l[..sp]).unwrap().parse().unwrap();
            (i, Bytes::copy_from_slice(&l[sp + 1..]))
        })
        .collect()
}

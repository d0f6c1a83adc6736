//! Pipelined writes (`Config::async_append`): the driver takes the next
//! Ready while earlier writes are in flight. Each Ready hands out only new
//! entries, committed entries are handed out only once durable locally (Raft
//! paper 5.3/5.4: a member applies only what it holds), and a leader counts
//! its own replica only once its write is durable.

use bytes::Bytes;

use super::harness::{config, Network};
use crate::raft::{
    ConfState, Entry, MemStorage, Message, MessageType, RawNode, Ready, StateRole, Storage,
};

fn node(id: u64, voters: &[u64]) -> RawNode<MemStorage> {
    let mut cfg = config(id);
    cfg.async_append = true;
    let storage = MemStorage::new_with_conf_state(ConfState {
        voters: voters.to_vec(),
        learners: Vec::new(),
    });
    RawNode::new(&cfg, storage).unwrap()
}

fn ent(index: u64, term: u64, data: &str) -> Entry {
    Entry {
        index,
        term,
        data: Bytes::from(data.to_string()),
        ..Default::default()
    }
}

fn append_msg(from: u64, term: u64, prev: (u64, u64), entries: Vec<Entry>, commit: u64) -> Message {
    Message {
        msg_type: MessageType::MsgApp as i32,
        from,
        to: 1,
        term,
        index: prev.0,
        log_term: prev.1,
        entries,
        commit,
        ..Default::default()
    }
}

/// The write of `rd` completed: what a driver does once it is durable.
fn complete(n: &mut RawNode<MemStorage>, rd: Ready) {
    n.store_mut().append(&rd.entries);
    if let Some(hs) = rd.hard_state {
        n.store_mut().set_hard_state(hs);
    }
    n.advance_append(rd);
}

fn indexes(ents: &[Entry]) -> Vec<u64> {
    ents.iter().map(|e| e.index).collect()
}

// A follower with a write in flight takes the next Ready: it carries only
// the entries that arrived since, and nothing is handed out for applying
// until the entries are durable here, although the leader says committed.
#[test]
fn follower_applies_only_durable_entries() {
    let mut n = node(1, &[1, 2, 3]);
    n.step(append_msg(
        2,
        1,
        (0, 0),
        vec![ent(1, 1, "a"), ent(2, 1, "b")],
        2,
    ))
    .unwrap();
    let mut rd1 = n.ready();
    assert_eq!(indexes(&rd1.entries), vec![1, 2]);
    assert!(rd1.committed_entries.is_empty(), "not durable yet");
    let acks = std::mem::take(&mut rd1.persisted_messages);
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].msg_type(), MessageType::MsgAppResp);
    assert_eq!(acks[0].index, 2);

    n.step(append_msg(2, 1, (2, 1), vec![ent(3, 1, "c")], 3))
        .unwrap();
    let rd2 = n.ready();
    assert_eq!(indexes(&rd2.entries), vec![3], "only the new entry");
    assert!(rd2.committed_entries.is_empty());
    assert!(!n.has_ready(), "nothing new until a write completes");

    complete(&mut n, rd1);
    let rd3 = n.ready();
    assert!(rd3.entries.is_empty());
    assert_eq!(indexes(&rd3.committed_entries), vec![1, 2]);
    n.on_entries_applied(&rd3.committed_entries);
    complete(&mut n, rd3);

    complete(&mut n, rd2);
    let rd4 = n.ready();
    assert_eq!(indexes(&rd4.committed_entries), vec![3]);
    n.on_entries_applied(&rd4.committed_entries);
    complete(&mut n, rd4);
    assert_eq!(n.applied_index(), 3);
    assert!(!n.has_ready());
}

// Raft paper 5.3: a new leader overwrites a follower's uncommitted tail while
// the follower is still writing it. The replacement is handed out again, and
// the completion of the old write does not count the replacement as durable.
#[test]
fn tail_replaced_while_written_is_written_again() {
    let mut n = node(1, &[1, 2, 3]);
    n.step(append_msg(
        2,
        1,
        (0, 0),
        vec![ent(1, 1, "a"), ent(2, 1, "b")],
        1,
    ))
    .unwrap();
    let rd1 = n.ready();
    assert_eq!(indexes(&rd1.entries), vec![1, 2]);

    n.step(append_msg(3, 2, (1, 1), vec![ent(2, 2, "x")], 1))
        .unwrap();
    let rd2 = n.ready();
    assert_eq!(rd2.entries, vec![ent(2, 2, "x")]);
    assert!(rd2.committed_entries.is_empty());

    complete(&mut n, rd1);
    // Entry 1 is durable and committed; entry 2 of term 1 is not what the log
    // holds any more, so only the replacement's write may make index 2 durable.
    let rd3 = n.ready();
    assert!(rd3.entries.is_empty(), "nothing is handed out twice");
    assert!(
        rd3.committed_entries.iter().all(|e| e.index <= 1),
        "{:?}",
        rd3.committed_entries
    );
    n.on_entries_applied(&rd3.committed_entries);
    complete(&mut n, rd3);

    complete(&mut n, rd2);
    assert_eq!(n.term_of(2), Some(2));
    assert_eq!(n.store().last_index().unwrap(), 2);
    assert_eq!(n.store().term(2).unwrap(), 2);
    assert!(!n.has_ready() || n.ready().entries.is_empty());
}

// Raft paper 5.3: the leader's own replica counts toward a quorum only once
// its write is durable, even with several writes in flight. Raft paper 5.2:
// nothing of a term the leader elected itself in leaves before its term and
// vote are durable, so a crash cannot let it lead that term twice.
#[test]
fn leader_commits_only_its_durable_entries() {
    let mut n = node(1, &[1]);
    n.campaign().unwrap();
    assert_eq!(n.role(), StateRole::Leader);
    let rd1 = n.ready();
    assert_eq!(
        indexes(&rd1.entries),
        vec![1],
        "the empty entry of the term"
    );
    assert!(rd1.must_sync);
    n.propose(Bytes::from_static(b"a")).unwrap();
    assert!(!n.has_ready(), "the new term must be durable first");

    complete(&mut n, rd1);
    assert_eq!(n.committed_index(), 1);
    let rd2 = n.ready();
    assert_eq!(indexes(&rd2.entries), vec![2]);
    assert_eq!(indexes(&rd2.committed_entries), vec![1]);
    n.on_entries_applied(&rd2.committed_entries);

    n.propose(Bytes::from_static(b"b")).unwrap();
    let rd3 = n.ready();
    assert_eq!(
        indexes(&rd3.entries),
        vec![3],
        "taken with rd2 still in flight"
    );
    assert!(rd3.committed_entries.is_empty());
    assert_eq!(n.committed_index(), 1, "entry 2 is not durable yet");

    complete(&mut n, rd2);
    assert_eq!(n.committed_index(), 2);
    let rd4 = n.ready();
    assert_eq!(indexes(&rd4.committed_entries), vec![2]);
    n.on_entries_applied(&rd4.committed_entries);
    complete(&mut n, rd4);

    complete(&mut n, rd3);
    let rd5 = n.ready();
    assert_eq!(indexes(&rd5.committed_entries), vec![3]);
    n.on_entries_applied(&rd5.committed_entries);
    complete(&mut n, rd5);
    assert_eq!(n.applied_index(), 3);
}

// Raft paper 5.3 and 5.4 hold with async_append on: the scenario harness
// (which completes each write before the next Ready) replicates, overwrites
// conflicts and applies the same log everywhere.
#[test]
fn replication_scenarios_hold_with_async_append() {
    let mut net = Network::new_with(3, |c| c.async_append = true);
    net.campaign(1);
    net.isolate(1);
    let _ = net.propose(1, "lost");
    net.heal();
    net.isolate(1);
    net.campaign(2);
    net.propose(2, "kept1").unwrap();
    net.propose(2, "kept2").unwrap();
    net.heal();
    net.tick_all(3);
    for id in 1..=3 {
        assert_eq!(net.applied_data(id), vec!["kept1", "kept2"], "member {id}");
    }
    assert_eq!(net.entries(1), net.entries(2), "log matching");
}

//! Linearizable reads: ReadIndex confirmed by a heartbeat quorum, batching of
//! concurrent requests, forwarding from followers, lease reads, and the wait
//! for a current-term commit.

use bytes::Bytes;

use super::harness::Network;
use crate::raft::{Config, MessageType, ReadOnlyOption, StateRole};

fn read(net: &mut Network, id: u64, ctx: &'static str) {
    net.node(id)
        .read_index(Bytes::from_static(ctx.as_bytes()))
        .unwrap();
    net.deliver();
}

fn states(net: &mut Network, id: u64) -> Vec<(u64, String)> {
    net.members
        .get_mut(&id)
        .unwrap()
        .read_states
        .drain(..)
        .map(|r| {
            (
                r.index,
                String::from_utf8_lossy(&r.request_ctx).into_owned(),
            )
        })
        .collect()
}

fn read_heartbeats(net: &mut Network) -> usize {
    net.take_sent(MessageType::MsgHeartbeat)
        .iter()
        .filter(|m| !m.context.is_empty())
        .count()
}

// Raft thesis 6.4: the leader records its commit index, confirms it is still
// leader with a heartbeat round acknowledged by a quorum, then answers.
#[test]
fn read_index_confirmed_by_heartbeat_quorum() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    let commit = net.node(1).committed_index();
    net.take_sent(MessageType::MsgHeartbeat);
    read(&mut net, 1, "r1");
    assert_eq!(states(&mut net, 1), vec![(commit, "r1".to_string())]);
    assert_eq!(read_heartbeats(&mut net), 2);
}

// Raft thesis 6.4: without a quorum the leader cannot know it is still
// leader, so it does not answer; once the quorum is back it does.
#[test]
fn read_index_waits_for_quorum() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(1);
    read(&mut net, 1, "r1");
    assert!(states(&mut net, 1).is_empty());
    net.heal();
    net.tick(1);
    net.deliver();
    assert_eq!(
        states(&mut net, 1).len(),
        1,
        "the next heartbeat retried the round"
    );
}

// Raft thesis 6.4: a deposed leader that is cut off never answers a read,
// even though a newer leader has committed writes meanwhile.
#[test]
fn deposed_leader_does_not_serve_stale_reads() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(1);
    net.campaign(2);
    net.propose(2, "new").unwrap();
    read(&mut net, 1, "stale");
    for _ in 0..5 {
        net.tick(1);
        net.deliver();
    }
    assert!(states(&mut net, 1).is_empty());
}

// Raft thesis 6.4 (batching): concurrent requests share one heartbeat round.
#[test]
fn concurrent_reads_share_one_heartbeat_round() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.take_sent(MessageType::MsgHeartbeat);
    for ctx in ["a", "b", "c"] {
        net.node(1)
            .read_index(Bytes::from_static(ctx.as_bytes()))
            .unwrap();
    }
    net.deliver();
    let got = states(&mut net, 1);
    assert_eq!(got.len(), 3);
    assert_eq!(
        read_heartbeats(&mut net),
        2,
        "one round: one heartbeat per follower"
    );
}

// Raft thesis 6.4: a follower forwards the request to the leader and serves
// the read once it has applied up to the returned index.
#[test]
fn follower_read_is_forwarded_to_leader() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    let commit = net.node(1).committed_index();
    read(&mut net, 2, "f");
    assert_eq!(states(&mut net, 2), vec![(commit, "f".to_string())]);
    assert!(net.node(2).applied_index() >= commit);
}

// Raft thesis 6.4: a new leader answers reads only after it committed an
// entry of its own term, since only then is its commit index current.
#[test]
fn new_leader_defers_reads_until_current_term_commit() {
    let mut net = Network::new(3);
    net.drop_types.insert(MessageType::MsgApp as i32);
    net.campaign(1);
    assert_eq!(net.role(1), StateRole::Leader);
    read(&mut net, 1, "early");
    assert!(states(&mut net, 1).is_empty());
    net.drop_types.clear();
    net.tick_all(2);
    let got = states(&mut net, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, net.node(1).committed_index());
}

fn lease(c: &mut Config) {
    c.check_quorum = true;
    c.read_only_option = ReadOnlyOption::LeaseBased;
}

// Raft thesis 6.4.1: with a lease (check-quorum on), the leader answers from
// its commit index without a heartbeat round.
#[test]
fn lease_read_answers_without_round() {
    let mut net = Network::new_with(3, lease);
    net.campaign(1);
    net.take_sent(MessageType::MsgHeartbeat);
    read(&mut net, 1, "l");
    assert_eq!(states(&mut net, 1).len(), 1);
    assert_eq!(read_heartbeats(&mut net), 0);
    // Forwarded from a follower, too.
    read(&mut net, 3, "l3");
    assert_eq!(states(&mut net, 3).len(), 1);
}

// Raft thesis 6.4: the wait for a current-term commit holds for a lone voter
// too, whose commit index after a restart may lag what it committed before.
#[test]
fn single_voter_defers_reads_until_current_term_commit() {
    let mut net = Network::new(1);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.restart(1);
    let n = net.node(1);
    n.campaign().unwrap();
    assert_eq!(n.role(), StateRole::Leader);
    n.read_index(Bytes::from_static(b"r")).unwrap();
    let rd = n.ready();
    assert!(
        rd.read_states.is_empty(),
        "answered before committing in its term"
    );
    let noop = rd.entries.last().unwrap().index;
    n.store_mut().append(&rd.entries);
    if let Some(hs) = rd.hard_state {
        n.store_mut().set_hard_state(hs);
    }
    n.advance(rd);
    let rd = n.ready();
    assert_eq!(rd.read_states.len(), 1);
    assert_eq!(rd.read_states[0].index, noop);
}

//! Proposals: forwarding from followers, clear refusals when there is no
//! leader or a transfer runs, and the uncommitted-bytes limit.

use super::harness::Network;
use crate::raft::{Config, RaftError};

// Raft paper 8: clients may contact any member; a follower forwards the
// proposal to the leader it knows.
#[test]
fn follower_forwards_proposal_to_leader() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.propose(2, "via-2").unwrap();
    for id in 1..=3 {
        assert_eq!(net.applied_data(id), vec!["via-2"]);
    }
}

// Raft paper 8: with no leader known, a proposal is refused with an error
// the client can act on (retry later), not silently lost.
#[test]
fn proposal_without_leader_is_refused() {
    let mut net = Network::new(3);
    assert_eq!(net.propose(1, "x"), Err(RaftError::NoLeader { term: 0 }));
    // A candidate has no leader either.
    net.isolate(1);
    net.campaign(1);
    assert_eq!(net.propose(1, "x"), Err(RaftError::NoLeader { term: 1 }));
}

fn no_forwarding(c: &mut Config) {
    c.disable_proposal_forwarding = true;
}

#[test]
fn forwarding_can_be_disabled() {
    let mut net = Network::new_with(3, no_forwarding);
    net.campaign(1);
    assert_eq!(
        net.propose(2, "x"),
        Err(RaftError::ForwardingDisabled { leader: 1 })
    );
}

// Raft thesis 3.10: during a leader transfer the leader stops accepting
// proposals, so the transferee can catch up and take over.
#[test]
fn proposal_during_transfer_is_refused() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    net.propose(1, "a").unwrap();
    net.node(1).transfer_leader(3).unwrap();
    assert_eq!(
        net.propose(1, "b"),
        Err(RaftError::TransferInProgress { transferee: 3 })
    );
}

fn small_uncommitted(c: &mut Config) {
    c.max_uncommitted_entries_size_bytes = 100;
}

// Raft thesis 10.2 (flow control): the leader refuses proposals while too
// many bytes wait for commit, and accepts again once they commit.
#[test]
fn uncommitted_bytes_limit() {
    let mut net = Network::new_with(3, small_uncommitted);
    net.campaign(1);
    net.isolate(1);
    let sixty = "x".repeat(60);
    net.propose(1, &sixty).unwrap();
    assert_eq!(net.node(1).uncommitted_size_bytes(), 60);
    assert_eq!(
        net.propose(1, &sixty),
        Err(RaftError::UncommittedLimit {
            uncommitted_bytes: 60,
            limit_bytes: 100
        })
    );
    net.heal();
    net.tick_all(2);
    assert_eq!(net.node(1).uncommitted_size_bytes(), 0);
    net.propose(1, &sixty).unwrap();
    assert_eq!(net.applied_data(2).len(), 2);
}

// A single entry larger than the limit is still accepted when nothing is
// pending, so big proposals cannot starve.
#[test]
fn oversized_single_proposal_accepted_when_idle() {
    let mut net = Network::new_with(3, small_uncommitted);
    net.campaign(1);
    net.propose(1, &"y".repeat(500)).unwrap();
    assert_eq!(net.applied_data(3).len(), 1);
}

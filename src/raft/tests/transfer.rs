//! Leader transfer: catching the target up, MsgTimeoutNow, voters granting
//! the transfer despite their lease, and the timeout that aborts it.

use super::harness::Network;
use crate::raft::{Config, MessageType, StateRole};

fn with_check_quorum(c: &mut Config) {
    c.check_quorum = true;
    c.pre_vote = true;
}

// Raft thesis 3.10: to an up-to-date target the leader sends MsgTimeoutNow at
// once; the target campaigns and wins; voters in lease grant it.
#[test]
fn transfer_to_up_to_date_follower() {
    let mut net = Network::new_with(3, with_check_quorum);
    net.campaign(1);
    let term = net.node(1).term();
    net.node(1).transfer_leader(2).unwrap();
    net.deliver();
    assert_eq!(net.role(2), StateRole::Leader);
    assert_eq!(net.node(2).term(), term + 1);
    assert_eq!(net.node(1).leader_id(), 2);
}

// Raft thesis 3.10: a lagging target is first caught up, then told to
// campaign.
#[test]
fn transfer_catches_up_lagging_target_first() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    net.propose(1, "a").unwrap();
    net.propose(1, "b").unwrap();
    net.node(1).transfer_leader(3).unwrap();
    net.deliver();
    assert_eq!(
        net.role(1),
        StateRole::Leader,
        "3 is unreachable: no transfer yet"
    );
    assert!(net.take_sent(MessageType::MsgTimeoutNow).is_empty());
    net.heal();
    net.tick(1);
    net.deliver();
    assert_eq!(net.role(3), StateRole::Leader);
    assert_eq!(net.applied_data(3), vec!["a", "b"]);
}

// Raft thesis 3.10: a transfer that does not complete within the timeout is
// aborted and the leader accepts proposals again.
#[test]
fn transfer_times_out() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    net.propose(1, "a").unwrap();
    net.node(1).transfer_leader(3).unwrap();
    assert!(net.propose(1, "b").is_err());
    for _ in 0..10 {
        net.tick(1);
        net.tick(2);
        net.deliver();
    }
    assert_eq!(net.node(1).status().lead_transferee, 0);
    net.propose(1, "c").unwrap();
    assert_eq!(net.role(1), StateRole::Leader);
}

// A transfer request made at a follower is forwarded to the leader.
#[test]
fn transfer_request_on_follower_is_forwarded() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.node(3).transfer_leader(3).unwrap();
    net.deliver();
    assert_eq!(net.role(3), StateRole::Leader);
}

// Transfers to oneself or to a non-member do nothing.
#[test]
fn transfer_to_self_or_stranger_is_ignored() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.node(1).transfer_leader(1).unwrap();
    net.node(1).transfer_leader(9).unwrap();
    net.deliver();
    assert_eq!(net.role(1), StateRole::Leader);
    assert_eq!(net.node(1).status().lead_transferee, 0);
    net.propose(1, "ok").unwrap();
}

//! Log replication: commit by majority, log matching, conflicts overwritten,
//! progress states, flow control, fast backtracking, commit rules, and the
//! durable-only acknowledgement.

use super::harness::Network;
use crate::raft::{MessageType, StateRole};

// Raft paper 5.3: an entry replicated on a majority is committed and applied
// on every member.
#[test]
fn proposal_commits_and_applies_everywhere() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.propose(1, "b").unwrap();
    for id in 1..=3 {
        assert_eq!(net.applied_data(id), vec!["a", "b"], "member {id}");
    }
}

// Raft paper 5.3: with a minority down, the majority still commits; the
// minority catches up when it returns.
#[test]
fn minority_down_majority_commits_then_catch_up() {
    let mut net = Network::new(5);
    net.campaign(1);
    net.isolate(4);
    net.isolate(5);
    net.propose(1, "a").unwrap();
    assert_eq!(net.applied_data(1), vec!["a"]);
    assert!(net.applied_data(4).is_empty());
    net.heal();
    net.tick_all(2);
    assert_eq!(net.applied_data(4), vec!["a"]);
    assert_eq!(net.applied_data(5), vec!["a"]);
    assert_eq!(net.role(1), StateRole::Leader);
}

// Raft paper 5.3: a follower's conflicting suffix is replaced by the leader's.
#[test]
fn conflicting_entries_are_overwritten() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(1);
    // Uncommitted entries only on the old leader.
    let _ = net.propose(1, "lost1");
    let _ = net.propose(1, "lost2");
    net.heal();
    net.isolate(1);
    net.campaign(2);
    net.propose(2, "kept").unwrap();
    net.heal();
    net.tick_all(3);
    for id in 1..=3 {
        assert_eq!(net.applied_data(id), vec!["kept"], "member {id}");
    }
    let e1 = net.entries(1);
    let e2 = net.entries(2);
    assert_eq!(e1, e2, "log matching");
    let _ = MessageType::MsgApp;
}

//! Membership: learners that replicate without voting, promotion, adding and
//! removing members one at a time, the one-pending-change rule, and a leader
//! that removes itself.

use super::harness::Network;
use crate::raft::{ConfChange, ConfChangeType, MemStorage, MessageType, RaftError, StateRole};

fn change(t: ConfChangeType, id: u64) -> ConfChange {
    ConfChange {
        change_type: t as i32,
        node_id: id,
        ..Default::default()
    }
}

fn propose_change(net: &mut Network, at: u64, t: ConfChangeType, id: u64) -> Result<(), RaftError> {
    let r = net.node(at).propose_conf_change(&change(t, id));
    net.deliver();
    r
}

/// Cluster of voters 1..=3 with member 4 added as a learner.
fn with_learner() -> Network {
    let mut net = Network::new(3);
    net.campaign(1);
    net.add_member(4, MemStorage::new());
    propose_change(&mut net, 1, ConfChangeType::ConfChangeAddLearnerNode, 4).unwrap();
    net.propose(1, "a").unwrap();
    net
}

// Raft thesis 4.2.1: a new member joins as a non-voting learner and catches up
// by replication, without counting toward any quorum.
#[test]
fn learner_replicates_without_voting() {
    let mut net = with_learner();
    assert_eq!(net.applied_data(4), vec!["a"]);
    let cs = net.node(1).status().conf_state;
    assert_eq!(cs.voters, vec![1, 2, 3]);
    assert_eq!(cs.learners, vec![4]);
    assert_eq!(net.members[&4].conf_state.learners, vec![4]);
    // Learners do not count: with 2 and 3 gone, nothing commits.
    net.isolate(2);
    net.isolate(3);
    net.cut.remove(&(2, 3));
    let before = net.node(1).committed_index();
    net.propose(1, "b").unwrap();
    assert_eq!(net.node(1).committed_index(), before);
}

// Raft thesis 4.2.1: a learner never campaigns.
#[test]
fn learner_does_not_campaign() {
    let mut net = with_learner();
    net.isolate(4);
    let term = net.node(4).term();
    for _ in 0..100 {
        net.tick(4);
        net.deliver();
    }
    assert_eq!(net.node(4).term(), term);
    assert_eq!(net.role(4), StateRole::Follower);
}

// Raft thesis 4.2.1: once caught up, the learner is promoted to voter and
// then counts in the quorum.
#[test]
fn learner_promotion() {
    let mut net = with_learner();
    propose_change(&mut net, 1, ConfChangeType::ConfChangeAddNode, 4).unwrap();
    assert_eq!(net.node(1).status().conf_state.voters, vec![1, 2, 3, 4]);
    // With 4 voters the quorum is 3: 1, 2 and 4 suffice without 3.
    net.isolate(3);
    net.propose(1, "b").unwrap();
    assert_eq!(net.applied_data(4), vec!["a", "b"]);
}

// Raft thesis 4.1: one change at a time; a new change is refused while the
// previous one is not yet applied.
#[test]
fn second_change_refused_while_first_pending() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(1);
    propose_change(&mut net, 1, ConfChangeType::ConfChangeAddLearnerNode, 4).unwrap();
    let r = propose_change(&mut net, 1, ConfChangeType::ConfChangeAddLearnerNode, 5);
    assert!(
        matches!(r, Err(RaftError::ConfChangePending { .. })),
        "{r:?}"
    );
    net.heal();
    net.tick_all(2);
    propose_change(&mut net, 1, ConfChangeType::ConfChangeAddLearnerNode, 5).unwrap();
    assert_eq!(net.node(1).status().conf_state.learners, vec![4, 5]);
}

// Raft thesis 4.1: adding a voter directly, then removing another; the
// cluster commits with the new majority.
#[test]
fn add_and_remove_voters_one_at_a_time() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.add_member(4, MemStorage::new());
    propose_change(&mut net, 1, ConfChangeType::ConfChangeAddNode, 4).unwrap();
    net.tick_all(2);
    propose_change(&mut net, 1, ConfChangeType::ConfChangeRemoveNode, 3).unwrap();
    assert_eq!(net.node(1).status().conf_state.voters, vec![1, 2, 4]);
    net.isolate(3);
    net.isolate(2);
    net.cut.remove(&(2, 4));
    net.cut.remove(&(4, 2));
    net.cut.remove(&(1, 2));
    net.cut.remove(&(2, 1));
    net.propose(1, "after").unwrap();
    assert_eq!(net.applied_data(4), vec!["after"]);
}

// Raft thesis 4.2.2: a leader that removes itself steps down once the
// change is committed; it hands over by transfer to a caught-up voter, so
// the rest have a leader at once.
#[test]
fn removed_leader_steps_down() {
    let mut net = Network::new(3);
    net.campaign(1);
    propose_change(&mut net, 1, ConfChangeType::ConfChangeRemoveNode, 1).unwrap();
    assert_ne!(net.role(1), StateRole::Leader);
    assert_eq!(net.take_sent(MessageType::MsgTimeoutNow).len(), 1);
    assert_eq!(net.role(2), StateRole::Leader);
    assert_eq!(
        net.propose(1, "x"),
        Err(RaftError::NoLeader {
            term: net.node(1).term()
        })
    );
    net.isolate(1);
    for _ in 0..40 {
        net.tick(2);
        net.tick(3);
        net.deliver();
    }
    let l = net.leader().unwrap();
    assert!(l == 2 || l == 3);
    assert_eq!(net.node(l).status().conf_state.voters, vec![2, 3]);
    net.propose(l, "y").unwrap();
}

// A change that would leave no voter is refused.
#[test]
fn removing_last_voter_refused() {
    let mut net = Network::new(1);
    net.campaign(1);
    let r = propose_change(&mut net, 1, ConfChangeType::ConfChangeRemoveNode, 1);
    assert!(matches!(r, Err(RaftError::BadConfChange(_))), "{r:?}");
}

// Raft thesis 4.1: a member does not campaign while a committed conf change
// is not yet applied, since its view of the voters is about to change.
#[test]
fn no_campaign_with_unapplied_conf_change() {
    let mut net = Network::new(3);
    net.campaign(1);
    // 2 receives and commits entries but never gets to apply them.
    net.members.get_mut(&2).unwrap().stall_persist = true;
    propose_change(&mut net, 1, ConfChangeType::ConfChangeAddLearnerNode, 4).unwrap();
    let st = net.node(2).status();
    assert!(
        st.hard_state.commit > st.applied,
        "2 committed the change (commit {}) but has not applied it ({})",
        st.hard_state.commit,
        st.applied
    );
    let term = net.node(2).term();
    net.node(2).campaign().unwrap();
    assert_eq!(net.node(2).term(), term, "campaign refused");
    assert_eq!(net.role(2), StateRole::Follower);
    // Once applied, it may campaign.
    net.members.get_mut(&2).unwrap().stall_persist = false;
    net.deliver();
    net.node(2).campaign().unwrap();
    assert!(net.node(2).term() > term);
}

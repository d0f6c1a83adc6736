//! Leader election: randomized timeouts, terms, votes, the election
//! restriction, pre-vote, check-quorum and leader stickiness.

use super::harness::{config, Network};
use crate::raft::{ConfState, MemStorage, MessageType, RawNode, StateRole};

// Raft paper 5.2: a follower that hears nothing campaigns after its election
// timeout and wins with a majority of votes.
#[test]
fn follower_times_out_and_wins_election() {
    let mut net = Network::new(3);
    net.tick_all(30);
    let leader = net.leader().expect("a leader is elected");
    let term = net.node(leader).term();
    for id in 1..=3 {
        assert_eq!(net.node(id).leader_id(), leader);
        assert_eq!(net.node(id).term(), term);
    }
}

// Raft paper 5.2: election timeouts are chosen at random from
// [election_timeout, 2 * election_timeout), and differ between members.
#[test]
fn randomized_election_timeout_in_range_and_varied() {
    let mut seen = std::collections::BTreeSet::new();
    for id in 1..=20u64 {
        let mut c = config(id);
        c.seed = id * 31;
        let cs = ConfState {
            voters: vec![id],
            learners: vec![],
        };
        let n = RawNode::new(&c, MemStorage::new_with_conf_state(cs)).unwrap();
        let t = n.randomized_election_timeout_ticks();
        assert!((10..20).contains(&t), "timeout {t} out of range");
        seen.insert(t);
    }
    assert!(seen.len() > 3, "timeouts are not randomized: {seen:?}");
}

// Raft paper 5.2: a single member elects itself.
#[test]
fn single_member_elects_itself_and_commits() {
    let mut net = Network::new(1);
    net.campaign(1);
    assert_eq!(net.role(1), StateRole::Leader);
    net.propose(1, "x").unwrap();
    assert_eq!(net.applied_data(1), vec!["x"]);
}

// Raft paper 5.2: each member votes for at most one candidate per term.
#[test]
fn one_vote_per_term() {
    let mut net = Network::new(3);
    net.drop_types.insert(MessageType::MsgVote as i32);
    net.campaign(1);
    net.campaign(2);
    net.drop_types.clear();
    // Member 3 has not voted yet in term 1, both are candidates at term 1.
    let t1 = net.node(1).term();
    let t2 = net.node(2).term();
    assert_eq!((t1, t2), (1, 1));
    // Deliver 1's request only: 3 votes 1, 1 wins.
    let mut m = crate::raft::Message {
        msg_type: MessageType::MsgVote as i32,
        from: 1,
        to: 3,
        term: 1,
        ..Default::default()
    };
    net.send(m.clone());
    m.from = 2;
    net.send(m);
    let votes: Vec<_> = net
        .take_sent(MessageType::MsgVoteResp)
        .into_iter()
        .filter(|r| r.from == 3)
        .map(|r| (r.to, r.reject))
        .collect();
    assert_eq!(votes, vec![(1, false), (2, true)]);
    assert_eq!(net.role(1), StateRole::Leader);
}

// Raft paper 5.4.1: a voter denies its vote to a candidate whose log is less
// up to date than its own.
#[test]
fn election_restriction_denies_stale_candidate() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    net.propose(1, "a").unwrap();
    net.heal();
    // 3 missed "a"; 2 has it. 3 campaigns at a higher term and loses.
    net.cut.insert((1, 3));
    net.cut.insert((3, 1));
    net.campaign(3);
    assert_ne!(net.role(3), StateRole::Leader);
    let rejects: Vec<_> = net
        .take_sent(MessageType::MsgVoteResp)
        .into_iter()
        .filter(|r| r.to == 3)
        .map(|r| r.reject)
        .collect();
    assert_eq!(rejects, vec![true]);
}

// Raft paper 5.1: a member that sees a higher term steps down to follower.
#[test]
fn higher_term_makes_leader_step_down() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(1);
    net.campaign(2);
    assert_eq!(net.role(2), StateRole::Leader);
    net.heal();
    net.tick_all(1);
    assert_eq!(net.role(1), StateRole::Follower);
    assert_eq!(net.node(1).leader_id(), 2);
}

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

fn with_pre_vote(c: &mut crate::raft::Config) {
    c.pre_vote = true;
}

fn with_check_quorum(c: &mut crate::raft::Config) {
    c.check_quorum = true;
}

fn with_both(c: &mut crate::raft::Config) {
    c.pre_vote = true;
    c.check_quorum = true;
}

// Raft thesis 9.6: with pre-vote, a partitioned member does not raise its
// term, so when it returns it does not depose the leader.
#[test]
fn pre_vote_keeps_partitioned_member_from_disrupting() {
    let mut net = Network::new_with(3, with_pre_vote);
    net.campaign(1);
    let term = net.node(1).term();
    net.isolate(3);
    for _ in 0..100 {
        net.tick(3);
        net.deliver();
    }
    assert_eq!(net.node(3).term(), term, "pre-vote changes no term");
    assert_eq!(net.role(3), StateRole::PreCandidate);
    net.heal();
    net.tick_all(3);
    assert_eq!(net.role(1), StateRole::Leader);
    assert_eq!(net.node(1).term(), term);
    assert_eq!(net.node(3).leader_id(), 1);
}

// Raft thesis 9.6 (the problem pre-vote solves): without it, the returning
// member's higher term forces a needless election.
#[test]
fn without_pre_vote_returning_member_disrupts() {
    let mut net = Network::new(3);
    net.campaign(1);
    let term = net.node(1).term();
    net.isolate(3);
    for _ in 0..100 {
        net.tick(3);
        net.deliver();
    }
    assert!(net.node(3).term() > term);
    net.heal();
    net.tick_all(30);
    assert!(net.node(1).term() > term, "the leader was deposed");
}

// Raft thesis 9.6: a pre-vote is granted only to a candidate whose log is up
// to date, and a pre-candidate that wins then runs a real election.
#[test]
fn pre_vote_then_election() {
    let mut net = Network::new_with(3, with_pre_vote);
    net.campaign(1);
    assert_eq!(net.role(1), StateRole::Leader);
    assert_eq!(net.node(1).term(), 1);
    let pre = net.take_sent(MessageType::MsgPreVote);
    assert_eq!(pre.len(), 2);
    assert!(
        pre.iter().all(|m| m.term == 1),
        "pre-vote asks for the next term"
    );
}

// Raft thesis 6.2: with check-quorum, a leader that hears from no quorum for
// an election timeout steps down.
#[test]
fn check_quorum_leader_steps_down_without_quorum() {
    let mut net = Network::new_with(3, with_check_quorum);
    net.campaign(1);
    net.isolate(1);
    for _ in 0..10 {
        net.tick(1);
        net.deliver();
    }
    assert_eq!(
        net.role(1),
        StateRole::Leader,
        "heard from a quorum in the first window"
    );
    for _ in 0..10 {
        net.tick(1);
        net.deliver();
    }
    assert_eq!(net.role(1), StateRole::Follower);
}

// Raft thesis 6.2: a leader that keeps hearing from a quorum stays leader.
#[test]
fn check_quorum_leader_with_quorum_stays() {
    let mut net = Network::new_with(3, with_check_quorum);
    net.campaign(1);
    net.isolate(3);
    for _ in 0..50 {
        net.tick(1);
        net.tick(2);
        net.deliver();
    }
    assert_eq!(net.role(1), StateRole::Leader);
}

// Raft thesis 4.2.3: a follower that heard from its leader within the
// election timeout ignores vote requests of a disruptive candidate.
#[test]
fn leader_stickiness_ignores_disruptive_candidate() {
    let mut net = Network::new_with(3, with_check_quorum);
    net.campaign(1);
    let term = net.node(1).term();
    net.cut.insert((1, 3));
    net.cut.insert((3, 1));
    net.take_sent(MessageType::MsgVoteResp);
    net.campaign(3);
    assert_eq!(
        net.node(2).term(),
        term,
        "the vote request did not raise 2's term"
    );
    assert!(net
        .take_sent(MessageType::MsgVoteResp)
        .iter()
        .all(|m| m.from != 2));
    assert_eq!(net.node(2).leader_id(), 1);
    assert_eq!(net.role(1), StateRole::Leader);
}

// Raft thesis 4.2.3 and 6.2 together: once the leader is really gone, the
// followers' lease runs out and they elect a new leader.
#[test]
fn followers_elect_new_leader_after_lease_expires() {
    let mut net = Network::new_with(3, with_both);
    net.campaign(1);
    net.isolate(1);
    for _ in 0..40 {
        net.tick(2);
        net.tick(3);
        net.deliver();
    }
    let l = [2, 3]
        .into_iter()
        .find(|id| net.role(*id) == StateRole::Leader);
    assert!(l.is_some(), "2 or 3 became leader");
}

// Raft paper 5.2 and Figure 2: a vote is durable before it is sent, so a
// restarted member does not vote twice in one term.
#[test]
fn vote_is_persisted_before_sent_and_survives_restart() {
    let mut net = Network::new(3);
    net.campaign(1);
    assert!(net
        .sent_before_persist
        .iter()
        .all(|m| m.msg_type() != MessageType::MsgVoteResp && m.msg_type() != MessageType::MsgVote));
    net.restart(2);
    assert_eq!(net.node(2).status().hard_state.vote, 1);
    // A competing candidate in the same term gets no vote from 2.
    let m = crate::raft::Message {
        msg_type: MessageType::MsgVote as i32,
        from: 3,
        to: 2,
        term: 1,
        index: 10,
        log_term: 1,
        ..Default::default()
    };
    net.take_sent(MessageType::MsgVoteResp);
    net.send(m);
    let r = net.take_sent(MessageType::MsgVoteResp);
    assert_eq!(r.len(), 1);
    assert!(r[0].reject);
}

// A member started with the vote hold ignores candidates for one election
// timeout, as if it had heard from a leader just before it stopped; a leader
// transfer's campaign still gets its vote.
#[test]
fn vote_hold_after_start_ignores_candidates_for_one_election_timeout() {
    let mut net = Network::new_with(3, |c| {
        c.check_quorum = true;
        c.vote_hold_after_start = true;
    });
    net.take_sent(MessageType::MsgVoteResp);
    net.campaign(1);
    assert!(
        net.take_sent(MessageType::MsgVoteResp)
            .iter()
            .all(|m| m.from == 1 || m.reject),
        "a member that just started voted"
    );
    assert_ne!(net.role(1), StateRole::Leader);
    // One election timeout later they vote again (2 or 3 may have
    // campaigned on their own meanwhile): a leader is elected.
    for _ in 0..10 {
        net.tick(2);
        net.tick(3);
    }
    net.deliver();
    if net.leader().is_none() {
        net.campaign(1);
    }
    assert!(net.leader().is_some(), "no leader after the hold");
}

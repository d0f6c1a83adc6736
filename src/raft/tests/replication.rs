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

use crate::raft::{Config, ProgressState, SafetyMutation};

fn progress_of(net: &mut Network, leader: u64, id: u64) -> crate::raft::PeerStatus {
    net.node(leader)
        .status()
        .progress
        .into_iter()
        .find(|p| p.id == id)
        .unwrap()
}

// Raft paper 5.3 (nextIndex) and thesis 10.2: a new leader probes each
// follower, switches to replicate once it answers, and falls back to probe
// when the member is unreachable.
#[test]
fn progress_moves_between_probe_and_replicate() {
    let mut net = Network::new(3);
    net.campaign(1);
    assert_eq!(progress_of(&mut net, 1, 2).state, ProgressState::Replicate);
    net.node(1).report_unreachable(2);
    assert_eq!(progress_of(&mut net, 1, 2).state, ProgressState::Probe);
    net.propose(1, "a").unwrap();
    let p = progress_of(&mut net, 1, 2);
    assert_eq!(p.state, ProgressState::Replicate);
    assert_eq!(p.matched, net.node(1).last_index());
}

fn small_window(c: &mut Config) {
    c.max_inflight_msgs = 3;
}

// Raft thesis 10.2.1 (pipelining, flow control): in replicate state the
// leader sends appends without waiting for answers, up to the window of
// messages in flight.
#[test]
fn inflight_window_by_count_bounds_pipelined_appends() {
    let mut net = Network::new_with(3, small_window);
    net.campaign(1);
    net.cut.insert((2, 1));
    net.take_sent(MessageType::MsgApp);
    for i in 0..10 {
        net.propose(1, &format!("p{i}")).unwrap();
    }
    let to2: Vec<_> = net
        .take_sent(MessageType::MsgApp)
        .into_iter()
        .filter(|m| m.to == 2 && !m.entries.is_empty())
        .collect();
    assert_eq!(
        to2.len(),
        3,
        "three appends pipelined, then the window is full"
    );
    assert_eq!(progress_of(&mut net, 1, 2).inflight_msgs, 3);
    // Answers free the window and the rest follows.
    net.heal();
    net.tick_all(3);
    assert_eq!(net.applied_data(2).len(), 10);
}

fn byte_window(c: &mut Config) {
    c.max_inflight_bytes = 250;
}

// Raft thesis 10.2.1: the window is bounded in bytes as well as in count.
#[test]
fn inflight_window_by_bytes() {
    let mut net = Network::new_with(3, byte_window);
    net.campaign(1);
    net.cut.insert((2, 1));
    net.take_sent(MessageType::MsgApp);
    let big = "x".repeat(100);
    for _ in 0..10 {
        net.propose(1, &big).unwrap();
    }
    let to2 = net
        .take_sent(MessageType::MsgApp)
        .into_iter()
        .filter(|m| m.to == 2 && !m.entries.is_empty())
        .count();
    assert_eq!(
        to2, 3,
        "~110 bytes each: the third append reaches 250 bytes"
    );
}

// Raft paper 5.3: while probing, the leader sends one append at a time and
// waits for the answer.
#[test]
fn probe_state_sends_one_append_at_a_time() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.cut.insert((2, 1));
    net.node(1).report_unreachable(2);
    net.take_sent(MessageType::MsgApp);
    for i in 0..5 {
        net.propose(1, &format!("p{i}")).unwrap();
    }
    let to2 = net
        .take_sent(MessageType::MsgApp)
        .into_iter()
        .filter(|m| m.to == 2 && !m.entries.is_empty())
        .count();
    assert_eq!(to2, 1);
}

// Raft paper 5.3 (end of section): with the follower's hint of the
// conflicting term, the leader skips a whole divergent term per round trip
// instead of one entry.
#[test]
fn fast_backtracking_skips_divergent_term() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(1);
    for i in 0..50 {
        let _ = net.propose(1, &format!("old{i}"));
    }
    net.heal();
    net.isolate(1);
    net.campaign(2);
    for i in 0..50 {
        net.propose(2, &format!("new{i}")).unwrap();
    }
    net.heal();
    net.take_sent(MessageType::MsgAppResp);
    net.tick_all(2);
    let rejects = net
        .take_sent(MessageType::MsgAppResp)
        .into_iter()
        .filter(|m| m.from == 1 && m.reject)
        .count();
    assert!(
        rejects <= 2,
        "{rejects} rejections for a 50-entry divergent tail"
    );
    assert_eq!(net.entries(1), net.entries(2));
    assert_eq!(net.applied_data(1).len(), 50);
}

// Raft paper 8 / thesis 3.6.2: a new leader appends an empty entry of its
// term and commits it, which commits everything before it.
#[test]
fn leader_commits_empty_entry_of_its_term() {
    let mut net = Network::new(3);
    net.campaign(1);
    let ents = net.entries(1);
    let last = ents.last().unwrap();
    assert!(last.data.is_empty());
    assert_eq!(last.term, net.node(1).term());
    assert_eq!(net.node(1).committed_index(), last.index);
}

/// Strips the entry at index 3 (the term-2 leader's empty entry) from appends.
fn strip_index_3(m: &mut crate::raft::Message) -> bool {
    if m.msg_type() == MessageType::MsgApp {
        m.entries.retain(|e| e.index < 3);
    }
    true
}

fn tiny_messages(c: &mut Config) {
    c.max_size_per_msg_bytes = 1;
}

fn tiny_messages_mutated(c: &mut Config) {
    c.max_size_per_msg_bytes = 1;
    c.mutation = Some(SafetyMutation::CommitPreviousTermByCount);
}

/// Leader 1 of term 2 holds "a" at index 2 from term 1 and has replicated
/// it, but not its own empty entry at 3, to both followers.
fn previous_term_entry_on_majority(f: fn(&mut Config)) -> Network {
    let mut net = Network::new_with(3, f);
    net.campaign(1);
    net.isolate(1);
    let _ = net.propose(1, "a");
    // 1 crashes with "a" durable and comes back as a follower.
    net.restart(1);
    net.heal();
    net.mangle = Some(strip_index_3);
    net.campaign(1);
    assert_eq!(net.node(1).term(), 2);
    assert_eq!(net.role(1), StateRole::Leader);
    assert_eq!(
        net.node(2).last_index(),
        2,
        "follower has the term-1 entry only"
    );
    net
}

// Raft paper 5.4.2 and Figure 8: a leader never commits an entry of a
// previous term by counting replicas; it commits it only together with an
// entry of its own term.
#[test]
fn previous_term_entry_commits_only_with_current_term_entry() {
    let mut net = previous_term_entry_on_majority(tiny_messages);
    assert_eq!(
        net.node(1).committed_index(),
        1,
        "index 2 is on all members but of term 1"
    );
    net.mangle = None;
    net.tick_all(3);
    assert_eq!(net.node(1).committed_index(), 3);
    assert_eq!(net.applied_data(2), vec!["a"]);
}

// The mutation knob switches the rule off, for the simulator's power check.
#[test]
fn mutation_commits_previous_term_entry_by_count() {
    let mut net = previous_term_entry_on_majority(tiny_messages_mutated);
    assert_eq!(net.node(1).committed_index(), 2);
}

// Raft thesis 10.2.1: the leader sends appends before its own write is
// durable, and may commit once a majority of followers has the entry.
#[test]
fn leader_sends_appends_in_parallel_with_its_write() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.node(1)
        .propose(bytes::Bytes::from_static(b"a"))
        .unwrap();
    let rd = net.node(1).ready();
    assert_eq!(rd.entries.len(), 1, "entry to persist");
    let apps: Vec<_> = rd
        .messages
        .iter()
        .filter(|m| m.msg_type() == MessageType::MsgApp)
        .cloned()
        .collect();
    assert_eq!(apps.len(), 2, "appends may leave before the leader's write");
    let index = rd.entries[0].index;
    for m in apps {
        net.queue.push_back(m);
    }
    net.members.get_mut(&1).unwrap().stall_persist = true;
    net.deliver();
    assert_eq!(
        net.node(1).committed_index(),
        index,
        "two followers are a majority without the leader's own write"
    );
    let m = net.members.get_mut(&1).unwrap();
    m.node.store_mut().append(&rd.entries);
    m.node.advance(rd);
    m.stall_persist = false;
    net.deliver();
    assert_eq!(net.applied_data(1), vec!["a"]);
}

// Raft thesis 10.2.1: the leader counts its own replica only once durable.
#[test]
fn leader_counts_itself_only_when_durable() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    net.node(1)
        .propose(bytes::Bytes::from_static(b"a"))
        .unwrap();
    let rd = net.node(1).ready();
    let index = rd.entries[0].index;
    for m in rd.messages.iter().cloned() {
        net.queue.push_back(m);
    }
    net.members.get_mut(&1).unwrap().stall_persist = true;
    net.deliver();
    assert!(
        net.node(1).committed_index() < index,
        "only one durable copy (member 2)"
    );
    let m = net.members.get_mut(&1).unwrap();
    m.node.store_mut().append(&rd.entries);
    m.node.advance(rd);
    assert_eq!(net.node(1).committed_index(), index);
}

// Raft paper Figure 2 and thesis 10.2.1: a follower acknowledges entries
// only after they are durable: acknowledgements travel with the messages
// sent after persisting, and a follower that cannot persist never acks.
#[test]
fn follower_acknowledges_only_durable_entries() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    assert!(net
        .sent_before_persist
        .iter()
        .all(|m| m.msg_type() != MessageType::MsgAppResp));
    net.members.get_mut(&2).unwrap().stall_persist = true;
    net.members.get_mut(&3).unwrap().stall_persist = true;
    let before = net.node(1).committed_index();
    net.propose(1, "b").unwrap();
    net.tick_all(3);
    assert_eq!(net.node(1).committed_index(), before);
    net.members.get_mut(&2).unwrap().stall_persist = false;
    net.deliver();
    assert!(net.node(1).committed_index() > before);
}

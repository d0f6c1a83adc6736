//! Snapshots: a lagging follower installs one, log compaction, restart from a
//! snapshot plus the log, and a failed snapshot send retried.

use super::harness::Network;
use crate::raft::{MessageType, ProgressState, SnapshotStatus, StateRole};

/// Member 3 cut off while the leader commits ten entries and compacts its
/// log past them; the compaction index.
fn lagging_follower() -> (Network, u64) {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    for i in 0..10 {
        net.propose(1, &format!("v{i}")).unwrap();
    }
    let index = net.compact(1);
    (net, index)
}

// Raft paper 7: when the entries a follower needs are compacted, the leader
// sends its snapshot; the follower replaces its log and catches up.
#[test]
fn lagging_follower_installs_snapshot() {
    let (mut net, index) = lagging_follower();
    assert!(net.node(1).status().first_index > 1);
    net.heal();
    net.tick_all(3);
    let snaps = net.take_sent(MessageType::MsgSnap);
    assert_eq!(snaps.len(), 1);
    assert_eq!(
        snaps[0]
            .snapshot
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .index,
        index
    );
    assert_eq!(net.applied_data(3), net.applied_data(1));
    net.propose(1, "after").unwrap();
    assert_eq!(net.applied_data(3).last().unwrap(), "after");
    let p = net
        .node(1)
        .status()
        .progress
        .into_iter()
        .find(|p| p.id == 3)
        .unwrap();
    assert_eq!(p.state, ProgressState::Replicate);
}

// Raft paper 7: compaction discards entries covered by the snapshot; the
// leader keeps replicating from what remains.
#[test]
fn compaction_keeps_cluster_working() {
    let mut net = Network::new(3);
    net.campaign(1);
    for i in 0..5 {
        net.propose(1, &format!("v{i}")).unwrap();
    }
    for id in 1..=3 {
        net.compact(id);
    }
    let st = net.node(2).status();
    assert_eq!(st.first_index, st.applied + 1);
    net.propose(1, "x").unwrap();
    assert_eq!(net.applied_data(2).len(), 6);
}

// Raft paper 7 and 5.2: a member restarts from its snapshot plus the log
// after it, with its term, vote and commit index.
#[test]
fn restart_from_snapshot_and_log() {
    let mut net = Network::new(3);
    net.campaign(1);
    for i in 0..5 {
        net.propose(1, &format!("v{i}")).unwrap();
    }
    net.compact(2);
    net.propose(1, "tail").unwrap();
    let before = net.node(2).status();
    net.restart(2);
    let after = net.node(2).status();
    assert_eq!(after.hard_state.term, before.hard_state.term);
    assert_eq!(after.hard_state.vote, before.hard_state.vote);
    assert_eq!(after.last_index, before.last_index);
    assert_eq!(after.first_index, before.first_index);
    assert_eq!(after.conf_state, before.conf_state);
    net.tick_all(2);
    net.propose(1, "more").unwrap();
    assert_eq!(net.applied_data(2), net.applied_data(1));
    assert_eq!(
        net.entries(2).last().unwrap().index,
        net.node(1).last_index()
    );
}

// Raft paper 7: a restarted member whose state machine was lost replays the
// log from its snapshot.
#[test]
fn restart_replays_committed_entries_after_snapshot() {
    let mut net = Network::new(1);
    net.campaign(1);
    net.propose(1, "a").unwrap();
    net.compact(1);
    net.propose(1, "b").unwrap();
    net.propose(1, "c").unwrap();
    // Lose the state machine beyond the snapshot and restart replaying.
    let m = net.members.get_mut(&1).unwrap();
    m.applied.retain(|(_, d)| d.as_ref() == b"a");
    net.restart_with_applied(1, 0);
    net.deliver();
    assert_eq!(net.applied_data(1), vec!["a", "b", "c"]);
    assert_eq!(net.role(1), StateRole::Follower);
    net.campaign(1);
    assert_eq!(net.role(1), StateRole::Leader);
}

// A snapshot send the driver reports as failed sends the member back to
// probing; the next heartbeat answer triggers another attempt.
#[test]
fn failed_snapshot_is_retried() {
    let mut net = Network::new(3);
    net.campaign(1);
    net.isolate(3);
    for i in 0..3 {
        net.propose(1, &format!("v{i}")).unwrap();
    }
    net.compact(1);
    net.drop_types.insert(MessageType::MsgSnap as i32);
    net.cut.clear();
    net.tick_all(1);
    let p = net
        .node(1)
        .status()
        .progress
        .into_iter()
        .find(|p| p.id == 3)
        .unwrap();
    assert_eq!(p.state, ProgressState::Snapshot);
    net.report_snapshot(1, 3, SnapshotStatus::Failure);
    let p = net
        .node(1)
        .status()
        .progress
        .into_iter()
        .find(|p| p.id == 3)
        .unwrap();
    assert_eq!(p.state, ProgressState::Probe);
    net.drop_types.clear();
    net.tick_all(3);
    assert_eq!(net.applied_data(3), net.applied_data(1));
}

// Raft paper 7: a follower takes a leader's snapshot as the one it waits to
// see persisted, and keeps waiting for it when an older one arrives; the
// driver holds the data of exactly the snapshot this names.
#[test]
fn the_pending_snapshot_is_the_one_taken() {
    // The snapshot the leader sends once the follower is reachable.
    let (mut net, index) = lagging_follower();
    net.heal();
    net.tick_all(3);
    let snap = net.take_sent(MessageType::MsgSnap).remove(0);
    assert_eq!(net.node(3).pending_snapshot_index(), None, "persisted");

    // The same state again, the snapshot stepped by hand.
    let (mut net, same_index) = lagging_follower();
    assert_eq!(same_index, index);
    assert_eq!(net.node(3).pending_snapshot_index(), None);
    net.node(3).step(snap.clone()).unwrap();
    assert_eq!(net.node(3).pending_snapshot_index(), Some(index));
    // An older snapshot is refused and changes nothing.
    let mut stale = snap;
    stale
        .snapshot
        .as_mut()
        .unwrap()
        .metadata
        .as_mut()
        .unwrap()
        .index = 1;
    let _ = net.node(3).step(stale);
    assert_eq!(net.node(3).pending_snapshot_index(), Some(index));
}

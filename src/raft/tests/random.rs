//! Randomised schedules over the scenario harness: messages delivered out of
//! order, dropped and duplicated, partitions, restarts, compaction, proposals
//! and reads, with Raft's safety properties checked after every step and
//! liveness checked once the faults stop. A fast guard for the core itself;
//! the full simulator lives in `crate::sim`.

use std::collections::BTreeMap;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::harness::Network;
use crate::raft::{Config, StateRole};

fn both(c: &mut Config) {
    c.pre_vote = true;
    c.check_quorum = true;
}

struct Checker {
    leaders: BTreeMap<u64, u64>,
    applied: BTreeMap<u64, Bytes>,
}

impl Checker {
    fn check(&mut self, net: &mut Network, seed: u64, step: usize) {
        let ids: Vec<u64> = net.members.keys().copied().collect();
        for id in &ids {
            if net.role(*id) == StateRole::Leader {
                let term = net.node(*id).term();
                let prev = *self.leaders.entry(term).or_insert(*id);
                assert_eq!(
                    prev, *id,
                    "seed {seed} step {step}: two leaders in term {term}"
                );
            }
            for (i, d) in &net.members[id].applied {
                let prev = self.applied.entry(*i).or_insert_with(|| d.clone());
                assert_eq!(
                    prev, d,
                    "seed {seed} step {step}: member {id} applied a different entry at {i}"
                );
            }
        }
        // Log matching over the committed prefixes.
        for a in &ids {
            for b in &ids {
                if a >= b {
                    continue;
                }
                let ca = net.node(*a).committed_index();
                let cb = net.node(*b).committed_index();
                let hi = ca.min(cb);
                for i in 1..=hi {
                    let (ta, tb) = (net.node(*a).term_of(i), net.node(*b).term_of(i));
                    if let (Some(ta), Some(tb)) = (ta, tb) {
                        assert_eq!(ta, tb, "seed {seed} step {step}: committed index {i} differs between {a} and {b}");
                    }
                }
            }
        }
    }
}

/// A transport tells the sender whether a snapshot got through; the leader
/// otherwise waits for it forever.
fn lost(net: &mut Network, m: &crate::raft::Message) {
    if m.msg_type() == crate::raft::MessageType::MsgSnap {
        net.node(m.from)
            .report_snapshot(m.to, crate::raft::SnapshotStatus::Failure);
    }
}

fn run(seed: u64, n: u64, steps: usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut net = Network::new_with(n, both);
    let mut ck = Checker {
        leaders: BTreeMap::new(),
        applied: BTreeMap::new(),
    };
    let mut next_val = 0u64;
    for step in 0..steps {
        match rng.gen_range(0..100) {
            0..=39 => {
                let id = rng.gen_range(1..=n);
                net.tick(id);
            }
            40..=69 => {
                if !net.queue.is_empty() {
                    let i = rng.gen_range(0..net.queue.len());
                    let m = if rng.gen_bool(0.05) {
                        net.queue[i].clone()
                    } else {
                        net.queue.remove(i).unwrap()
                    };
                    if !net.cut.contains(&(m.from, m.to)) && rng.gen_bool(0.9) {
                        let (from, to) = (m.from, m.to);
                        let snap = m.msg_type() == crate::raft::MessageType::MsgSnap;
                        let _ = net.node(to).step(m);
                        if snap {
                            net.node(from)
                                .report_snapshot(to, crate::raft::SnapshotStatus::Finish);
                        }
                    } else {
                        lost(&mut net, &m);
                    }
                }
            }
            70..=79 => {
                let id = rng.gen_range(1..=n);
                next_val += 1;
                let _ = net
                    .node(id)
                    .propose(Bytes::from(format!("v{next_val}").into_bytes()));
            }
            80..=83 => {
                let id = rng.gen_range(1..=n);
                let _ = net
                    .node(id)
                    .read_index(Bytes::from(format!("r{step}").into_bytes()));
            }
            84..=87 => {
                let a = rng.gen_range(1..=n);
                let b = rng.gen_range(1..=n);
                if a != b {
                    net.cut.insert((a, b));
                    if rng.gen_bool(0.5) {
                        net.cut.insert((b, a));
                    }
                }
            }
            88..=91 => net.cut.clear(),
            92 => {
                let id = rng.gen_range(1..=n);
                net.restart(id);
            }
            93 => {
                // Crash while persisting a Ready: the send-now messages are
                // out, a prefix of the entries reached the disk, nothing else.
                let id = rng.gen_range(1..=n);
                if net.node(id).has_ready() {
                    let rd = net.node(id).ready();
                    net.queue.extend(rd.messages.iter().cloned());
                    let keep = rng.gen_range(0..=rd.entries.len());
                    let st = net.node(id).store_mut();
                    st.append(&rd.entries[..keep]);
                    if keep == rd.entries.len() && rd.snapshot.is_none() {
                        if let Some(hs) = rd.hard_state {
                            st.set_hard_state(hs);
                        }
                    }
                    net.restart(id);
                }
            }
            94..=95 => {
                let id = rng.gen_range(1..=n);
                if net.node(id).applied_index() > net.node(id).status().first_index {
                    net.compact(id);
                }
            }
            96..=97 => {
                let id = rng.gen_range(1..=n);
                let to = rng.gen_range(1..=n);
                let _ = net.node(id).transfer_leader(to);
            }
            _ => {
                // Drop a third of the queue.
                let mut keep = std::collections::VecDeque::new();
                while let Some(m) = net.queue.pop_front() {
                    if !rng.gen_bool(0.33) {
                        keep.push_back(m);
                    } else {
                        lost(&mut net, &m);
                    }
                }
                net.queue = keep;
            }
        }
        net.process_all();
        ck.check(&mut net, seed, step);
    }
    // Liveness: with faults gone the cluster elects a leader and commits
    // within a bounded number of ticks (a transfer in progress may delay
    // proposals by its timeout).
    net.heal();
    let mut proposed = false;
    for _ in 0..200 {
        net.tick_all(1);
        if let Some(l) = net.leader() {
            if net.propose(l, "final").is_ok() {
                proposed = true;
                break;
            }
        }
    }
    assert!(
        proposed,
        "seed {seed}: no leader accepted a proposal after faults stopped"
    );
    net.tick_all(5);
    if std::env::var("RAFT_RANDOM_VERBOSE").is_ok() {
        for id in 1..=n {
            eprintln!("{:?} queue {}", net.node(id).status(), net.queue.len());
        }
    }
    for id in 1..=n {
        assert_eq!(
            net.applied_data(id).last().map(String::as_str),
            Some("final"),
            "seed {seed}: member {id} did not apply the final write"
        );
    }
    ck.check(&mut net, seed, steps);
    if std::env::var("RAFT_RANDOM_VERBOSE").is_ok() {
        eprintln!(
            "seed {seed}: terms with leaders {}, applied entries {}",
            ck.leaders.len(),
            ck.applied.len()
        );
    }
}

/// Seeds per test; `RAFT_RANDOM_SEEDS=2000` for a longer run.
fn seeds(default: u64) -> u64 {
    std::env::var("RAFT_RANDOM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_schedules_three_members() {
    for seed in 0..seeds(60) {
        run(seed, 3, 3000);
    }
}

#[test]
fn random_schedules_five_members() {
    for seed in 100_000..100_000 + seeds(40) {
        run(seed, 5, 3000);
    }
}

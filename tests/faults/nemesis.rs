//! The nemesis: the fault menu of etcd's robustness tests and Jepsen's etcd
//! analysis, injected into a running [`Bench`] and healed again.
//!
//! Network faults cut directed links in the proxies' table, between members
//! and between clients and members; process faults are kill -9 (restarted at
//! the heal) and SIGSTOP (SIGCONT at the heal); disk faults go through the
//! members' test-only `--test-disk-faults` control file (`wal/src/fault.rs`
//! for the WAL, `mvcc/src/fault.rs` for the stores' syncs), clock jumps
//! through their `--test-clock-file` (`src/server/clock.rs`).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::cluster::Bench;
use super::proxy::Node;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// Members split at random into a minority and a majority, clients
    /// spread over both.
    PartitionHalves,
    /// Shard 0's leader cut off in the minority.
    PartitionLeader,
    /// Two groups that cannot talk, and one member that talks to both.
    Bridge,
    /// One member's bytes go out but none come in, or the reverse.
    OneWay,
    /// Every client cut off from a majority of the members.
    ClientCut,
    /// kill -9 of a member (the leader every other time), restarted at the heal.
    Kill,
    /// SIGSTOP of a member (the leader every other time), SIGCONT at the heal.
    Pause,
    /// kill -9 of every member at once, all restarted at the heal.
    KillAll,
    /// A member's WAL writes and syncs each take 2 s (the leader every
    /// other time).
    DiskStall,
    /// A member's WAL writes and syncs fail (EIO, or ENOSPC every other
    /// time): its shard stops; killed and restarted at the heal.
    DiskError,
    /// A member's store syncs (off the write path) each take 2 s (the
    /// leader every other time).
    StoreStall,
    /// A member's store syncs fail with EIO: its shard stops; killed and
    /// restarted at the heal.
    StoreError,
    /// A member's wall clock jumps forward or back by seconds to a day (the
    /// leader every other time), and every other time the member is also
    /// killed -9 and restarted under the jumped clock; jumped back at the
    /// heal.
    ClockJump,
}

/// Every fault, in the order a run cycles through them.
pub const MENU: [Fault; 13] = [
    Fault::PartitionHalves,
    Fault::PartitionLeader,
    Fault::Bridge,
    Fault::OneWay,
    Fault::ClientCut,
    Fault::Kill,
    Fault::Pause,
    Fault::KillAll,
    Fault::DiskStall,
    Fault::DiskError,
    Fault::StoreStall,
    Fault::StoreError,
    Fault::ClockJump,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::PartitionHalves => "partition-halves",
            Fault::PartitionLeader => "partition-leader",
            Fault::Bridge => "bridge",
            Fault::OneWay => "one-way",
            Fault::ClientCut => "client-cut",
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::KillAll => "kill-all",
            Fault::DiskStall => "disk-stall",
            Fault::DiskError => "disk-error",
            Fault::StoreStall => "store-stall",
            Fault::StoreError => "store-error",
            Fault::ClockJump => "clock-jump",
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        MENU.into_iter().find(|f| f.name() == name)
    }
}

/// What a fault changed, for its heal.
#[derive(Default)]
struct Harm {
    killed: Vec<usize>,
    paused: Vec<usize>,
    /// Members whose disk fault is cleared at the heal.
    disk: Vec<usize>,
    /// Members whose disk failed: restarted at the heal, as an operator
    /// would after replacing the disk.
    disk_failed: Vec<usize>,
    /// Members whose clock is jumped back at the heal.
    clock: Vec<usize>,
}

pub struct Nemesis {
    rng: SmallRng,
    harm: Harm,
    /// Faults injected, by kind.
    pub injected: BTreeMap<Fault, u32>,
    /// One line per injection, for a failing run's message.
    pub log: Vec<String>,
    turns: u64,
}

impl Nemesis {
    pub fn new(rng: SmallRng) -> Nemesis {
        Nemesis {
            rng,
            harm: Harm::default(),
            injected: BTreeMap::new(),
            log: Vec::new(),
            turns: 0,
        }
    }

    /// Cycles through `faults` until `until`: each held for `hold`, then
    /// healed and followed by `quiet` without faults.
    pub async fn run(
        &mut self,
        bench: &mut Bench,
        faults: &[Fault],
        until: Instant,
        hold: Duration,
        quiet: Duration,
    ) {
        let mut order = faults.to_vec();
        while Instant::now() + hold < until {
            if (self.turns as usize).is_multiple_of(order.len()) {
                order.shuffle(&mut self.rng);
            }
            let fault = order[self.turns as usize % order.len()];
            self.turns += 1;
            self.inject(bench, fault).await;
            tokio::time::sleep(hold).await;
            self.heal(bench);
            tokio::time::sleep(quiet).await;
        }
    }

    pub async fn inject(&mut self, bench: &mut Bench, fault: Fault) {
        let members = bench.members();
        let clients: Vec<Node> = (0..bench.clients()).map(|c| bench.client_node(c)).collect();
        // The leader is the target of its own partition, and of every other
        // kill, pause and one-way cut (the first included).
        let turn = self.injected.get(&fault).copied().unwrap_or(0);
        let wants_leader = match fault {
            Fault::PartitionLeader => true,
            Fault::Kill
            | Fault::Pause
            | Fault::OneWay
            | Fault::DiskStall
            | Fault::DiskError
            | Fault::StoreStall
            | Fault::StoreError
            | Fault::ClockJump => turn.is_multiple_of(2),
            _ => false,
        };
        let leader = if wants_leader {
            bench.leader().await
        } else {
            None
        };
        *self.injected.entry(fault).or_default() += 1;
        let mut order: Vec<usize> = (0..members).collect();
        order.shuffle(&mut self.rng);
        // The chosen member first: the leader when asked for and known.
        if let Some(l) = leader {
            order.retain(|&m| m != l);
            order.insert(0, l);
        }
        let what = match fault {
            Fault::PartitionHalves | Fault::PartitionLeader => {
                let (minority, majority) = order.split_at((members - 1) / 2);
                let (a, b) = self.with_clients(minority, majority, &clients);
                bench.net.set_cut(cut_between(&a, &b));
                format!("minority {minority:?} | majority {majority:?}")
            }
            Fault::Bridge => {
                let half = (members - 1) / 2;
                let (a, rest) = order.split_at(half);
                let (b, bridge) = rest.split_at(half);
                let (a, b) = self.with_clients(a, b, &clients);
                bench.net.set_cut(cut_between(&a, &b));
                format!("{a:?} | {b:?}, bridge {bridge:?}")
            }
            Fault::OneWay => {
                let x = order[0];
                let others: Vec<Node> = (0..members).filter(|&m| m != x).chain(clients).collect();
                let outgoing = self.rng.gen_bool(0.5);
                let cut = others
                    .iter()
                    .map(|&o| if outgoing { (x, o) } else { (o, x) })
                    .collect();
                bench.net.set_cut(cut);
                let dir = if outgoing {
                    "sends nothing"
                } else {
                    "hears nothing"
                };
                format!("member {x} {dir}")
            }
            Fault::ClientCut => {
                let mut cut = HashSet::new();
                for &c in &clients {
                    let mut ms: Vec<usize> = (0..members).collect();
                    ms.shuffle(&mut self.rng);
                    for &m in &ms[..members / 2 + 1] {
                        cut.insert((c, m));
                        cut.insert((m, c));
                    }
                }
                bench.net.set_cut(cut);
                "each client cut from a majority".to_string()
            }
            Fault::Kill => {
                let x = order[0];
                bench.cluster.members[x].kill9();
                self.harm.killed.push(x);
                format!("kill -9 member {x}")
            }
            Fault::Pause => {
                let x = order[0];
                bench.cluster.members[x].signal(libc::SIGSTOP);
                self.harm.paused.push(x);
                format!("SIGSTOP member {x}")
            }
            Fault::KillAll => {
                for (x, m) in bench.cluster.members.iter_mut().enumerate() {
                    m.kill9();
                    self.harm.killed.push(x);
                }
                "kill -9 every member".to_string()
            }
            Fault::DiskStall => {
                let x = order[0];
                bench.set_disk_fault(x, "stall 2000");
                self.harm.disk.push(x);
                format!("member {x}'s disk stalls 2 s per write")
            }
            Fault::DiskError => {
                let x = order[0];
                let what = if turn.is_multiple_of(2) {
                    "error"
                } else {
                    "full"
                };
                bench.set_disk_fault(x, what);
                self.harm.disk.push(x);
                self.harm.disk_failed.push(x);
                format!("member {x}'s disk fails ({what})")
            }
            Fault::StoreStall => {
                let x = order[0];
                bench.set_disk_fault(x, "store-stall 2000");
                self.harm.disk.push(x);
                format!("member {x}'s store syncs stall 2 s each")
            }
            Fault::StoreError => {
                let x = order[0];
                bench.set_disk_fault(x, "store-error");
                self.harm.disk.push(x);
                self.harm.disk_failed.push(x);
                format!("member {x}'s store syncs fail (EIO)")
            }
            Fault::ClockJump => {
                let x = order[0];
                let magnitude_ms: i64 = *[5_000, 600_000, 86_400_000]
                    .choose(&mut self.rng)
                    .expect("a magnitude");
                let offset = if self.rng.gen_bool(0.5) {
                    magnitude_ms
                } else {
                    -magnitude_ms
                };
                bench.set_clock_offset(x, offset);
                self.harm.clock.push(x);
                // Every other jump also restarts the member under the
                // jumped clock: what it reads from the clock at start
                // (lease ids, election seeds) comes from the jumped time.
                let restarted = turn % 4 >= 2;
                if restarted {
                    bench.cluster.members[x].kill9();
                    bench.cluster.members[x].restart();
                }
                format!(
                    "member {x}'s clock jumps {offset:+} ms{}",
                    if restarted { ", restarted" } else { "" }
                )
            }
        };
        bench.refresh_pids();
        self.log
            .push(format!("{} (leader {leader:?}): {what}", fault.name()));
    }

    /// Undoes every fault: the network whole, stopped members continued,
    /// killed members restarted.
    pub fn heal(&mut self, bench: &mut Bench) {
        bench.net.heal();
        for x in self.harm.disk.drain(..) {
            bench.set_disk_fault(x, "none");
        }
        for x in self.harm.clock.drain(..) {
            bench.set_clock_offset(x, 0);
        }
        for x in self.harm.disk_failed.drain(..) {
            // A member whose WAL failed keeps its shard stopped until it is
            // restarted (the failure is never retried in place).
            bench.cluster.members[x].kill9();
            self.harm.killed.push(x);
        }
        for x in self.harm.paused.drain(..) {
            bench.cluster.members[x].signal(libc::SIGCONT);
        }
        for x in self.harm.killed.drain(..) {
            if !bench.cluster.members[x].is_running() {
                bench.cluster.members[x].restart();
            }
        }
        bench.refresh_pids();
    }

    /// Spreads the clients over two sides of members (each side gets one
    /// when there are two or more), returning the sides as node sets.
    fn with_clients(
        &mut self,
        a: &[usize],
        b: &[usize],
        clients: &[Node],
    ) -> (Vec<Node>, Vec<Node>) {
        let mut clients = clients.to_vec();
        clients.shuffle(&mut self.rng);
        let (mut a, mut b) = (a.to_vec(), b.to_vec());
        for (i, c) in clients.into_iter().enumerate() {
            if i % 2 == 0 {
                a.push(c)
            } else {
                b.push(c)
            }
        }
        (a, b)
    }
}

/// Both directions of every link between `a` and `b`.
pub fn cut_between(a: &[Node], b: &[Node]) -> HashSet<(Node, Node)> {
    let mut cut = HashSet::new();
    for &x in a {
        for &y in b {
            cut.insert((x, y));
            cut.insert((y, x));
        }
    }
    cut
}

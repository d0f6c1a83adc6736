//! The simulation loop: members, network, workload, faults, and the checks run
//! after every step.
//!
//! Time advances in ticks. Each tick every live member ticks once; then due
//! messages, completed disk writes and the tick's client operations are
//! handled one at a time in random order (a step each) until nothing is due.
//! The first `chaos_ticks` ticks inject faults; then the network heals,
//! crashed members restart, removed ones shut down, and the liveness goal
//! must be met within `LIVENESS_BOUND_TICKS`.
//!
//! The loop and the state it drives are here; each concern of a step is an
//! `impl Sim` block in a file of its own:
//! - `plan.rs`: the fault and workload rates drawn from the seed;
//! - `checks.rs`: step bookkeeping, the checks run after every step and the
//!   persistence contract;
//! - `driver.rs`: each member's driver (start, crash, Readies, disk writes,
//!   applying committed entries, serving reads);
//! - `transport.rs`: sending and delivering messages;
//! - `faults.rs`: crashes, partitions, doomed leaders, and the calm that ends
//!   them;
//! - `workload.rs`: the client operations of a tick;
//! - `liveness.rs`: the probes that must succeed once the faults stop;
//! - `report.rs`: trace lines and the state dump of a failed seed.

mod checks;
mod driver;
mod faults;
mod liveness;
mod plan;
mod report;
mod transport;
mod workload;

use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use prost::Message as _;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use self::liveness::Liveness;
use self::plan::Plan;
use super::checker::{found, Check, Checker, Found, Violation, ViolationKind};
use super::member::Member;
use super::network::Network;
use super::{
    take_panic_report, SimConfig, SimOutcome, SimStats, ELECTION_TIMEOUT_TICKS,
    LIVENESS_BOUND_TICKS, MAX_EVENTS_PER_TICK, SPARE_MEMBERS,
};
use crate::raft::{ConfChange, ConfChangeType, Config, Entry, EntryType, HardState, MemStorage};

struct Sim {
    initial_members: usize,
    rng: SmallRng,
    /// `members[i]` has id `i + 1`; the last `SPARE_MEMBERS` start outside
    /// the group.
    members: Vec<Member>,
    net: Network,
    checker: Checker,
    raft_template: Config,
    plan: Plan,
    tick: u64,
    stats: SimStats,
    trace_on: bool,
    trace: Vec<String>,
    next_write: u64,
    next_read: u64,
    next_conf_change: u64,
    calm: bool,
    live: Liveness,
    /// Leaders to crash or isolate: `(at_tick, member index, incarnation,
    /// crash rather than isolate)`.
    doomed: Vec<(u64, usize, u64, bool)>,
}

pub(crate) fn run(cfg: &SimConfig) -> SimOutcome {
    let mut sim = Sim::new(cfg);
    let res = catch_unwind(AssertUnwindSafe(|| sim.run()));
    let violation = match res {
        Ok(Ok(())) => None,
        Ok(Err(f)) => Some(f),
        Err(payload) => Some(Violation {
            kind: ViolationKind::CorePanic,
            tick: sim.tick,
            step: sim.stats.steps,
            detail: take_panic_report(&*payload),
        }),
    };
    if violation.is_some() && sim.trace_on {
        sim.dump_state();
    }
    SimOutcome {
        seed: cfg.seed,
        members: cfg.members,
        stats: sim.stats,
        violation,
        trace: sim.trace,
    }
}

impl Sim {
    fn new(cfg: &SimConfig) -> Self {
        let mut rng = SmallRng::seed_from_u64(cfg.seed);
        let mut plan = Plan::draw(&mut rng);
        // A quarter of the seeds play the adversary of Raft paper figure 8:
        // one entry per append, a steady stream of proposals, and new
        // leaders that die or are cut off before their entries spread. Logs
        // then diverge across many short terms, which is where committing
        // an old-term entry by counting goes wrong.
        let figure8 = rng.gen_bool(0.25);
        if figure8 {
            plan.max_proposals_per_tick = 3;
            plan.max_reads_per_tick = 0;
            plan.new_leader_crash_per_mille = rng.gen_range(200..=500);
            plan.committed_leader_crash_per_mille = rng.gen_range(50..=300);
            plan.max_doom_delay_ticks = 0;
            plan.doom_crash_per_mille = rng.gen_range(0..=200);
        }
        let mut t = Config::new(1);
        t.election_timeout_ticks = ELECTION_TIMEOUT_TICKS;
        t.heartbeat_timeout_ticks = rng.gen_range(1..=3);
        t.pre_vote = rng.gen_bool(0.75);
        t.check_quorum = rng.gen_bool(0.75);
        t.max_inflight_msgs = *[1usize, 2, 8, 256].choose(&mut rng).expect("non-empty");
        t.max_size_per_msg_bytes = if figure8 {
            1
        } else {
            *[1u64, 64, 1 << 20].choose(&mut rng).expect("non-empty")
        };
        t.max_committed_size_per_ready_bytes =
            *[1u64, 256, 16 << 20].choose(&mut rng).expect("non-empty");
        t.max_uncommitted_entries_size_bytes =
            *[64u64, 1 << 20].choose(&mut rng).expect("non-empty");
        t.leader_transfer_timeout_ticks = ELECTION_TIMEOUT_TICKS;
        #[cfg(feature = "raft-mutations")]
        {
            t.mutation = cfg.mutation;
        }
        t.async_append = cfg.pipelined;
        let mut members = Vec::new();
        for id in 1..=(cfg.members + SPARE_MEMBERS) as u64 {
            let mut disk = MemStorage::new();
            if id as usize <= cfg.members {
                // etcd's bootstrap: the initial membership is the committed
                // prefix of the log, so joiners learn it by replication.
                let ents: Vec<Entry> = (1..=cfg.members as u64)
                    .map(|m| Entry {
                        entry_type: EntryType::EntryConfChange as i32,
                        term: 1,
                        index: m,
                        data: Bytes::from(
                            ConfChange {
                                id: m,
                                change_type: ConfChangeType::ConfChangeAddNode as i32,
                                node_id: m,
                                context: Bytes::new(),
                            }
                            .encode_to_vec(),
                        ),
                    })
                    .collect();
                disk.append(&ents);
                disk.set_hard_state(HardState {
                    term: 1,
                    vote: 0,
                    commit: cfg.members as u64,
                });
            }
            members.push(Member::new(id, disk));
        }
        Sim {
            initial_members: cfg.members,
            rng,
            members,
            net: Network::new(plan.chaos_faults),
            checker: Checker::default(),
            raft_template: t,
            plan,
            tick: 0,
            stats: SimStats::default(),
            trace_on: cfg.trace,
            trace: Vec::new(),
            next_write: 0,
            next_read: 0,
            next_conf_change: 0,
            calm: false,
            live: Liveness::default(),
            doomed: Vec::new(),
        }
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.trace_on {
            let l = line();
            self.trace
                .push(format!("[t{} s{}] {l}", self.tick, self.stats.steps));
        }
    }

    fn violation(&self, f: Found) -> Violation {
        Violation {
            kind: f.kind,
            tick: self.tick,
            step: self.stats.steps,
            detail: f.detail,
        }
    }

    fn run(&mut self) -> Result<(), Violation> {
        let p = self.plan.clone();
        let t = self.raft_template.clone();
        self.note(|| {
            format!(
                "plan {p:?}; raft pre_vote={} check_quorum={} heartbeat={} inflight={} max_msg={}B max_ready={}B max_uncommitted={}B",
                t.pre_vote,
                t.check_quorum,
                t.heartbeat_timeout_ticks,
                t.max_inflight_msgs,
                t.max_size_per_msg_bytes,
                t.max_committed_size_per_ready_bytes,
                t.max_uncommitted_entries_size_bytes
            )
        });
        for idx in 0..self.members.len() {
            self.begin_step(|| format!("start n{}", idx + 1));
            self.start_member(idx).map_err(|f| self.violation(f))?;
            self.end_step().map_err(|f| self.violation(f))?;
        }
        while self.tick < self.plan.chaos_ticks {
            self.tick_round().map_err(|f| self.violation(f))?;
        }
        self.begin_step(|| "faults stop: heal network, restart crashed members".into());
        self.calm_down().map_err(|f| self.violation(f))?;
        self.end_step().map_err(|f| self.violation(f))?;
        loop {
            self.tick_round().map_err(|f| self.violation(f))?;
            if self.live.write_done && self.live.read_done {
                self.stats.recovery_ticks = self.tick - self.live.calm_since_tick;
                let r = self.stats.recovery_ticks;
                self.note(|| format!("liveness met after {r} ticks"));
                return Ok(());
            }
            if self.tick - self.live.calm_since_tick >= LIVENESS_BOUND_TICKS {
                let f = found(
                    ViolationKind::Liveness,
                    format!(
                        "{LIVENESS_BOUND_TICKS} ticks after the faults stopped: write applied everywhere={}, read served={}; {}",
                        self.live.write_done,
                        self.live.read_done,
                        self.state_summary()
                    ),
                );
                return Err(self.violation(f));
            }
        }
    }

    fn tick_round(&mut self) -> Check {
        self.tick += 1;
        self.stats.ticks += 1;
        self.net.advance_to(self.tick);
        if !self.calm {
            self.doom_leaders()?;
            self.inject_faults()?;
        }
        for idx in 0..self.members.len() {
            let m = &self.members[idx];
            if !m.is_up() && m.restart_at_tick.is_some_and(|t| t <= self.tick) {
                self.begin_step(|| format!("restart n{}", idx + 1));
                self.start_member(idx)?;
                self.end_step()?;
            }
        }
        let mut up: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].is_up())
            .collect();
        up.shuffle(&mut self.rng);
        for idx in up {
            self.begin_step(|| format!("tick n{}", idx + 1));
            self.members[idx].node.as_mut().expect("up").tick();
            self.pump(idx)?;
            self.end_step()?;
        }
        let mut ops = self.draw_ops();
        for _ in 0..MAX_EVENTS_PER_TICK {
            self.doom_leaders()?;
            let writes: Vec<usize> = (0..self.members.len())
                .filter(|i| {
                    self.members[*i]
                        .pending
                        .front()
                        .is_some_and(|p| p.done_at_tick <= self.tick)
                })
                .collect();
            let msgs = self.net.due_count();
            let total = msgs + writes.len() + ops.len();
            if total == 0 {
                break;
            }
            let r = self.rng.gen_range(0..total);
            if r < msgs {
                let m = self.net.take_due(&mut self.rng).expect("counted");
                self.deliver(m)?;
            } else if r < msgs + writes.len() {
                let idx = writes[r - msgs];
                // One flush makes every write queued so far durable (group
                // commit): all due writes of the member complete together.
                let due = self.members[idx]
                    .pending
                    .iter()
                    .take_while(|p| p.done_at_tick <= self.tick)
                    .count();
                self.begin_step(|| format!("write done n{} ({due} writes)", idx + 1));
                for _ in 0..due {
                    if self.members[idx].pending.is_empty() {
                        break;
                    }
                    self.complete_write(idx)?;
                }
                self.end_step()?;
            } else {
                let op = ops.swap_remove(r - msgs - writes.len());
                self.client_op(op)?;
            }
        }
        if self.calm {
            self.liveness_round()?;
        }
        Ok(())
    }
}

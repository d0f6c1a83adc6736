//! The simulation loop: members, network, workload, faults, and the checks run
//! after every step.
//!
//! Time advances in ticks. Each tick every live member ticks once; then due
//! messages, completed disk writes and the tick's client operations are
//! handled one at a time in random order (a step each) until nothing is due.
//! The first `chaos_ticks` ticks inject faults; then the network heals,
//! crashed members restart, removed ones shut down, and the liveness goal
//! must be met within `LIVENESS_BOUND_TICKS`.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use prost::Message as _;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::checker::{found, Check, Checker, Found, Violation, ViolationKind};
use super::member::{entry_digest, Member, PendingWrite, StateMachine};
use super::network::{Faults, Network, SendFate};
use super::{
    take_panic_report, SimConfig, SimOutcome, SimStats, ELECTION_TIMEOUT_TICKS,
    LIVENESS_BOUND_TICKS, MAX_CHAOS_TICKS, MAX_DELAY_TICKS, MAX_EVENTS_PER_TICK, MIN_CHAOS_TICKS,
    SPARE_MEMBERS,
};
use crate::raft::{
    ConfChange, ConfChangeType, Config, Entry, EntryType, HardState, MemStorage, Message,
    MessageType, RawNode, SnapshotStatus, StateRole, Storage,
};

/// The fault and workload rates of one seed, drawn from the seed.
#[derive(Debug, Clone)]
struct Plan {
    chaos_ticks: u64,
    chaos_faults: Faults,
    crash_per_mille: u32,
    /// Crashes aimed at the current leader: the adversary of Raft paper
    /// figure 8, where leaders die between replicating and committing.
    leader_crash_per_mille: u32,
    /// Chance that a newly elected leader crashes or is cut off within a few
    /// ticks, before its own entries reach a quorum: how the logs of Raft
    /// paper figure 8 come about.
    new_leader_crash_per_mille: u32,
    /// Chance that a leader crashes or is cut off right after its commit
    /// index advances, before the followers learn of it.
    committed_leader_crash_per_mille: u32,
    /// Latest a doomed leader is struck after it was elected.
    max_doom_delay_ticks: u64,
    /// Share of doomed leaders that crash rather than being cut off (a
    /// crash lets the messages already sent arrive; a cut does not).
    doom_crash_per_mille: u32,
    max_down_ticks: u64,
    partition_per_mille: u32,
    heal_per_mille: u32,
    max_proposals_per_tick: u32,
    max_reads_per_tick: u32,
    transfer_per_mille: u32,
    conf_change_per_mille: u32,
    compact_per_mille: u32,
    /// Share of disk writes that complete only in the next tick.
    late_write_per_mille: u32,
}

impl Plan {
    fn draw(rng: &mut SmallRng) -> Self {
        Plan {
            chaos_ticks: rng.gen_range(MIN_CHAOS_TICKS..=MAX_CHAOS_TICKS),
            chaos_faults: Faults {
                drop_per_mille: rng.gen_range(0..=250),
                duplicate_per_mille: rng.gen_range(0..=100),
                max_delay_ticks: rng.gen_range(0..=MAX_DELAY_TICKS),
            },
            crash_per_mille: rng.gen_range(0..=40),
            leader_crash_per_mille: rng.gen_range(0..=60),
            new_leader_crash_per_mille: rng.gen_range(0..=500),
            committed_leader_crash_per_mille: rng.gen_range(0..=50),
            max_doom_delay_ticks: rng.gen_range(0..=3),
            doom_crash_per_mille: rng.gen_range(0..=1000),
            max_down_ticks: rng.gen_range(1..=5 * ELECTION_TIMEOUT_TICKS),
            partition_per_mille: rng.gen_range(0..=40),
            heal_per_mille: rng.gen_range(20..=200),
            max_proposals_per_tick: rng.gen_range(0..=3),
            max_reads_per_tick: rng.gen_range(0..=2),
            transfer_per_mille: rng.gen_range(0..=30),
            conf_change_per_mille: rng.gen_range(0..=40),
            compact_per_mille: rng.gen_range(0..=100),
            late_write_per_mille: rng.gen_range(0..=300),
        }
    }
}

/// A client operation queued for the current tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Propose,
    Read,
    Transfer,
    ConfChange,
    Compact,
}

/// Progress towards the liveness goal once the faults stopped.
#[derive(Debug, Default)]
struct Liveness {
    calm_since_tick: u64,
    probes: Vec<Bytes>,
    /// Index each probe write was applied at.
    probe_index: HashMap<Bytes, u64>,
    last_probe_tick: Option<u64>,
    write_done: bool,
    last_read_tick: Option<u64>,
    read_done: bool,
}

const PROBE_WRITE_PREFIX: &[u8] = b"probe-w";
const PROBE_READ_PREFIX: &[u8] = b"probe-r";

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

fn short_type(t: i32) -> String {
    match MessageType::try_from(t) {
        Ok(t) => format!("{t:?}").trim_start_matches("Msg").to_string(),
        Err(_) => format!("?{t}"),
    }
}

fn fmt_msg(m: &Message) -> String {
    let mut s = format!(
        "{} {}->{} t{} i{} lt{} c{}",
        short_type(m.msg_type),
        m.from,
        m.to,
        m.term,
        m.index,
        m.log_term,
        m.commit
    );
    if !m.entries.is_empty() {
        let first = m.entries[0].index;
        let last = m.entries[m.entries.len() - 1].index;
        s.push_str(&format!(" e[{first}..={last}]"));
    }
    if m.reject {
        s.push_str(&format!(" reject(hint {})", m.reject_hint));
    }
    if let Some(md) = m.snapshot.as_ref().and_then(|s| s.metadata.as_ref()) {
        s.push_str(&format!(" snap@{}t{}", md.index, md.term));
    }
    s
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

    // ---- steps and checks --------------------------------------------------

    fn begin_step(&mut self, what: impl FnOnce() -> String) {
        self.stats.steps += 1;
        self.note(what);
    }

    /// The checks run after every step.
    fn end_step(&mut self) -> Check {
        for idx in 0..self.members.len() {
            let m = &mut self.members[idx];
            let Some(node) = m.node.as_ref() else {
                continue;
            };
            let id = m.id;
            let role = node.role();
            let term = node.term();
            let changed = (role, term) != m.last_role;
            m.last_role = (role, term);
            if role == StateRole::Leader && self.checker.observe_leader(term, id)? {
                self.stats.leaders_elected += 1;
                if !self.calm && self.rng.gen_range(0..1000) < self.plan.new_leader_crash_per_mille
                {
                    let at = self.tick + self.rng.gen_range(0..=self.plan.max_doom_delay_ticks);
                    let crash = self.rng.gen_range(0..1000) < self.plan.doom_crash_per_mille;
                    self.doomed.push((at, idx, m.incarnation, crash));
                }
            }
            let commit = node.committed_index();
            if commit > m.seen_commit {
                for i in (m.seen_commit + 1)..=commit {
                    if let Some(t) = node.term_of(i) {
                        self.checker.observe_commit(id, i, t, term)?;
                    }
                }
                self.checker.observe_commit_index(commit);
                if role == StateRole::Leader
                    && !self.calm
                    && self.rng.gen_range(0..1000) < self.plan.committed_leader_crash_per_mille
                {
                    let crash = self.rng.gen_range(0..1000) < self.plan.doom_crash_per_mille;
                    self.doomed.push((self.tick, idx, m.incarnation, crash));
                }
                if role == StateRole::Leader && node.term_of(commit).is_some_and(|t| t != term) {
                    self.stats.old_term_commits += 1;
                    if self.trace_on {
                        let line = format!(
                            "[t{} s{}]   n{id} (leader of term {term}) committed {commit} of term {:?}",
                            self.tick,
                            self.stats.steps,
                            node.term_of(commit)
                        );
                        self.trace.push(line);
                    }
                }
                m.seen_commit = commit;
            }
            if role == StateRole::Leader {
                if m.lc_term != term {
                    m.lc_term = term;
                    m.lc_cursor = 0;
                }
                let upto = self.checker.committed_contiguous();
                while m.lc_cursor < upto {
                    let i = m.lc_cursor + 1;
                    let ce = self.checker.committed_at(i).expect("contiguous");
                    if ce.commit_term < term {
                        match node.term_of(i) {
                            Some(t) if t == ce.term => {}
                            None if i <= node.committed_index() => {}
                            other => {
                                return Err(found(
                                    ViolationKind::LeaderCompleteness,
                                    format!(
                                        "member {id}, leader of term {term}, has {} at index {i}, committed with term {} by term {}",
                                        other.map_or("no entry".to_string(), |t| format!("term {t}")),
                                        ce.term,
                                        ce.commit_term
                                    ),
                                ));
                            }
                        }
                    }
                    m.lc_cursor = i;
                }
            }
            if changed && self.trace_on {
                let line = format!(
                    "[t{} s{}]   n{id} is {role:?} in term {term} (commit {commit}, last {})",
                    self.tick,
                    self.stats.steps,
                    node.last_index()
                );
                self.trace.push(line);
            }
        }
        Ok(())
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

    fn draw_ops(&mut self) -> Vec<Op> {
        let p = &self.plan;
        let mut ops = Vec::new();
        for _ in 0..self.rng.gen_range(0..=p.max_proposals_per_tick) {
            ops.push(Op::Propose);
        }
        for _ in 0..self.rng.gen_range(0..=p.max_reads_per_tick) {
            ops.push(Op::Read);
        }
        if self.rng.gen_range(0..1000) < p.compact_per_mille {
            ops.push(Op::Compact);
        }
        if !self.calm {
            if self.rng.gen_range(0..1000) < p.transfer_per_mille {
                ops.push(Op::Transfer);
            }
            if self.rng.gen_range(0..1000) < p.conf_change_per_mille {
                ops.push(Op::ConfChange);
            }
        }
        ops
    }

    // ---- members -----------------------------------------------------------

    fn start_member(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let mut storage = m.disk.clone();
        let snap = storage.snapshot(0).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {}: snapshot unreadable on restart: {e}", m.id),
            )
        })?;
        let md = snap.metadata.clone().unwrap_or_default();
        let sm = StateMachine::decode(&md, &snap.data).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {}: {e}", m.id),
            )
        })?;
        // The state machine restarts from the snapshot and replays the log,
        // so Raft must resume from the membership in force at the snapshot.
        storage.set_conf_state(sm.conf_state());
        let mut cfg = self.raft_template.clone();
        cfg.id = m.id;
        cfg.seed = self.rng.gen();
        cfg.applied_index = md.index;
        let node = RawNode::new(&cfg, storage).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {} cannot restart from its durable state: {e}", m.id),
            )
        })?;
        m.last_role = (node.role(), node.term());
        m.node = Some(node);
        m.sm = sm;
        m.pending.clear();
        m.reads.clear();
        m.seen_commit = 0;
        m.lc_cursor = 0;
        m.lc_term = 0;
        m.restart_at_tick = None;
        m.incarnation += 1;
        self.pump(idx)
    }

    fn crash(&mut self, idx: usize) {
        let down = self.rng.gen_range(1..=self.plan.max_down_ticks);
        let m = &mut self.members[idx];
        let Some(node) = m.node.take() else {
            return;
        };
        // Only what reached MemStorage survives: pending writes are lost.
        m.disk = node.store().clone();
        m.pending.clear();
        m.reads.clear();
        m.restart_at_tick = Some(self.tick + down);
        self.stats.crashes += 1;
    }

    /// Takes a Ready if none is outstanding (pipelined: whenever there is
    /// one): immediate messages leave now, the rest waits for the write.
    /// Pipelined, committed entries are applied at once: Raft hands out only
    /// entries already durable here.
    fn pump(&mut self, idx: usize) -> Check {
        let pipelined = self.raft_template.async_append;
        let late = self.rng.gen_range(0..1000) < self.plan.late_write_per_mille;
        let m = &mut self.members[idx];
        let id = m.id;
        let Some(node) = m.node.as_mut() else {
            return Ok(());
        };
        if (!pipelined && !m.pending.is_empty()) || !node.has_ready() {
            return Ok(());
        }
        let mut rd = node.ready();
        for msg in &rd.messages {
            check_immediate(node.store(), id, msg)?;
        }
        if let Some(first) = rd.entries.first() {
            let mut prev = node.term_of(first.index - 1);
            for e in &rd.entries {
                self.checker
                    .log_entry(id, e.index, e.term, entry_digest(e), prev)?;
                prev = Some(e.term);
            }
        }
        let msgs = std::mem::take(&mut rd.messages);
        let n_entries = rd.entries.len();
        let hs = rd.hard_state;
        let snap = rd
            .snapshot
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map(|md| md.index);
        // Writes finish in order: never before the one queued ahead.
        let done_at_tick =
            (self.tick + u64::from(late)).max(m.pending.back().map_or(0, |p| p.done_at_tick));
        let committed = if pipelined {
            std::mem::take(&mut rd.committed_entries)
        } else {
            Vec::new()
        };
        let mut reads = if pipelined {
            std::mem::take(&mut rd.read_states)
        } else {
            Vec::new()
        };
        m.pending.push_back(PendingWrite { rd, done_at_tick });
        self.stats.max_writes_in_flight =
            self.stats.max_writes_in_flight.max(m.pending.len() as u64);
        self.note(|| {
            format!(
                "  n{id} ready: {n_entries} entries, hs {:?}, snapshot {snap:?}, {} msgs now",
                hs.map(|h| (h.term, h.vote, h.commit)),
                msgs.len()
            )
        });
        for msg in msgs {
            self.send(msg)?;
        }
        if !pipelined {
            return Ok(());
        }
        self.apply_committed(idx, &committed)?;
        let m = &mut self.members[idx];
        m.reads.append(&mut reads);
        if let Some(node) = m.node.as_mut() {
            node.on_entries_applied(&committed);
        }
        self.serve_reads(idx)?;
        self.pump(idx)
    }

    /// Applies committed entries on member `idx`, noting each membership
    /// change it applies.
    fn apply_committed(&mut self, idx: usize, entries: &[Entry]) -> Check {
        let id = self.members[idx].id;
        let m = &mut self.members[idx];
        let mut applied_changes = Vec::new();
        for e in entries {
            if let Some(change) =
                apply_entry(m, &mut self.checker, &mut self.stats, &mut self.live, e)?
            {
                applied_changes.push(change);
            }
        }
        for change in applied_changes {
            self.note(|| format!("  n{id} applied {change}"));
        }
        Ok(())
    }

    /// The disk write of the outstanding Ready completed: persist, apply,
    /// release the messages that waited, advance.
    fn complete_write(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let id = m.id;
        let Some(pw) = m.pending.pop_front() else {
            return Ok(());
        };
        let mut rd = pw.rd;
        let node = m
            .node
            .as_mut()
            .expect("a member with a pending write is up");
        if let Some(snap) = &rd.snapshot {
            node.store_mut().apply_snapshot(snap.clone()).map_err(|e| {
                found(
                    ViolationKind::PersistenceContract,
                    format!("member {id}: snapshot from Ready refused by storage: {e}"),
                )
            })?;
        }
        node.store_mut().append(&rd.entries);
        if let Some(hs) = &rd.hard_state {
            node.store_mut().set_hard_state(*hs);
        }
        if let Some(snap) = &rd.snapshot {
            let md = snap.metadata.clone().unwrap_or_default();
            let sm = StateMachine::decode(&md, &snap.data).map_err(|e| {
                found(
                    ViolationKind::StateMachineSafety,
                    format!("member {id}: {e}"),
                )
            })?;
            if sm.applied_index < m.sm.applied_index {
                return Err(found(
                    ViolationKind::StateMachineSafety,
                    format!(
                        "member {id} restored a snapshot at {} over applied state at {}",
                        sm.applied_index, m.sm.applied_index
                    ),
                ));
            }
            self.checker
                .snapshot_state(id, md.index, md.term, sm.chain_hash)?;
            self.checker.observe_commit_index(md.index);
            m.sm = sm;
            self.stats.snapshots_installed += 1;
        }
        self.apply_committed(idx, &rd.committed_entries)?;
        let m = &mut self.members[idx];
        let persisted = std::mem::take(&mut rd.persisted_messages);
        m.reads.append(&mut rd.read_states);
        m.node.as_mut().expect("up").advance(rd);
        for msg in persisted {
            self.send(msg)?;
        }
        self.serve_reads(idx)?;
        self.pump(idx)
    }

    fn serve_reads(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let applied = m.sm.applied_index;
        let mut waiting = Vec::new();
        for rs in std::mem::take(&mut m.reads) {
            if rs.index > applied {
                waiting.push(rs);
                continue;
            }
            if self
                .checker
                .read_served(m.id, &rs.request_ctx, rs.index, applied)?
            {
                self.stats.reads_served += 1;
                if rs.request_ctx.starts_with(PROBE_READ_PREFIX) && self.calm {
                    self.live.read_done = true;
                }
            }
        }
        m.reads = waiting;
        Ok(())
    }

    // ---- network -----------------------------------------------------------

    fn send(&mut self, msg: Message) -> Check {
        let from = msg.from;
        if msg.msg_type == MessageType::MsgApp as i32 && !msg.entries.is_empty() {
            let mut prev = Some(msg.log_term);
            for e in &msg.entries {
                self.checker
                    .log_entry(from, e.index, e.term, entry_digest(e), prev)?;
                prev = Some(e.term);
            }
        }
        let to = msg.to;
        let is_snap = msg.msg_type == MessageType::MsgSnap as i32;
        let line = if self.trace_on {
            fmt_msg(&msg)
        } else {
            String::new()
        };
        let fate = self.net.send(&mut self.rng, self.tick, msg);
        self.note(|| format!("  send {line} -> {fate:?}"));
        match fate {
            SendFate::Queued { .. } => {}
            SendFate::Blocked => {
                self.stats.messages_dropped += 1;
                if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                    node.report_unreachable(to);
                    if is_snap {
                        node.report_snapshot(to, SnapshotStatus::Failure);
                    }
                }
            }
            SendFate::Dropped => {
                self.stats.messages_dropped += 1;
                if is_snap {
                    if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                        node.report_snapshot(to, SnapshotStatus::Failure);
                    }
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, msg: Message) -> Check {
        let (from, to) = (msg.from, msg.to);
        let is_snap = msg.msg_type == MessageType::MsgSnap as i32;
        let line = if self.trace_on {
            fmt_msg(&msg)
        } else {
            String::new()
        };
        let to_idx = to as usize - 1;
        // Like etcd's transport, a member refuses traffic from a member its
        // applied membership says was removed, so a removed member that
        // never learnt of its removal cannot disrupt the group.
        let reachable = !self.net.is_blocked(from, to)
            && self
                .members
                .get(to_idx)
                .is_some_and(|m| m.is_up() && !m.sm.removed.contains(&from));
        if !reachable {
            self.begin_step(|| format!("lost {line}"));
            self.stats.messages_dropped += 1;
            if is_snap {
                if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                    node.report_snapshot(to, SnapshotStatus::Failure);
                }
                self.pump(from as usize - 1)?;
            }
            return self.end_step();
        }
        self.begin_step(|| format!("deliver {line}"));
        self.stats.messages_delivered += 1;
        let res = self.members[to_idx].node.as_mut().expect("up").step(msg);
        if let Err(e) = res {
            self.note(|| format!("  n{to} refused: {e}"));
        }
        self.pump(to_idx)?;
        if is_snap {
            if let Some(node) = self.members[from as usize - 1].node.as_mut() {
                node.report_snapshot(to, SnapshotStatus::Finish);
            }
            self.pump(from as usize - 1)?;
        }
        self.end_step()
    }

    // ---- faults ------------------------------------------------------------

    fn candidates(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.id).collect()
    }

    /// Crashes or isolates the new leaders whose time has come.
    fn doom_leaders(&mut self) -> Check {
        if self.calm || self.doomed.is_empty() {
            return Ok(());
        }
        let due: Vec<(u64, usize, u64, bool)> = self
            .doomed
            .iter()
            .copied()
            .filter(|d| d.0 <= self.tick)
            .collect();
        self.doomed.retain(|d| d.0 > self.tick);
        for (_, idx, incarnation, crash) in due {
            let m = &self.members[idx];
            if !m.is_up() || m.incarnation != incarnation {
                continue;
            }
            if crash {
                self.begin_step(|| format!("crash new leader n{}", idx + 1));
                self.crash(idx);
            } else {
                let id = m.id;
                let all = self.candidates();
                self.begin_step(|| format!("isolate new leader n{id}"));
                self.stats.partitions += 1;
                self.net.partition_symmetric(&[id], &all);
            }
            self.end_step()?;
        }
        Ok(())
    }

    fn inject_faults(&mut self) -> Check {
        let p = self.plan.clone();
        if self.rng.gen_range(0..1000) < p.crash_per_mille {
            let up: Vec<usize> = (0..self.members.len())
                .filter(|i| self.members[*i].is_up())
                .collect();
            if let Some(&idx) = up.choose(&mut self.rng) {
                self.begin_step(|| format!("crash n{}", idx + 1));
                self.crash(idx);
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.leader_crash_per_mille {
            if let Some(idx) = self.leader() {
                self.begin_step(|| format!("crash leader n{}", idx + 1));
                self.crash(idx);
                self.end_step()?;
            }
        }
        if self.rng.gen_range(0..1000) < p.partition_per_mille {
            let all = self.candidates();
            self.stats.partitions += 1;
            if self.rng.gen_bool(0.5) {
                let k = self.rng.gen_range(1..all.len().max(2));
                let side: Vec<u64> = all.choose_multiple(&mut self.rng, k).copied().collect();
                self.begin_step(|| format!("partition {side:?} | rest"));
                self.net.partition_symmetric(&side, &all);
            } else {
                let links = super::network::random_one_way_links(&mut self.rng, &all);
                self.begin_step(|| format!("one-way cuts {links:?}"));
                self.net.partition_one_way(&links);
            }
            self.end_step()?;
        } else if !self.net.blocked_links().is_empty()
            && self.rng.gen_range(0..1000) < p.heal_per_mille
        {
            self.begin_step(|| "heal partition".into());
            self.net.heal();
            self.end_step()?;
        }
        Ok(())
    }

    /// The faults stop: the network heals and becomes reliable and prompt,
    /// disks keep up, and crashed members restart.
    fn calm_down(&mut self) -> Check {
        self.calm = true;
        self.doomed.clear();
        self.live.calm_since_tick = self.tick;
        self.net.heal();
        self.net.faults = Faults::calm();
        self.plan.late_write_per_mille = 0;
        for idx in 0..self.members.len() {
            if !self.members[idx].is_up() {
                let id = self.members[idx].id;
                self.note(|| format!("  restart n{id}"));
                self.start_member(idx)?;
            }
        }
        Ok(())
    }

    // ---- client operations -------------------------------------------------

    fn random_up(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..self.members.len())
            .filter(|i| self.members[*i].is_up())
            .collect();
        up.choose(&mut self.rng).copied()
    }

    fn leader(&self) -> Option<usize> {
        (0..self.members.len())
            .filter_map(|i| {
                let n = self.members[i].node.as_ref()?;
                (n.role() == StateRole::Leader).then(|| (n.term(), i))
            })
            .max()
            .map(|(_, i)| i)
    }

    fn client_op(&mut self, op: Op) -> Check {
        match op {
            Op::Propose => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                self.next_write += 1;
                let data = Bytes::from(format!("w{}", self.next_write));
                self.propose(idx, data)
            }
            Op::Read => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                self.next_read += 1;
                let ctx = Bytes::from(format!("r{}", self.next_read));
                self.read(idx, ctx)
            }
            Op::Transfer => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                let voters: Vec<u64> = self.members[idx].sm.voters.iter().copied().collect();
                let Some(&to) = voters.choose(&mut self.rng) else {
                    return Ok(());
                };
                self.begin_step(|| format!("n{} transfer leadership to {to}", idx + 1));
                self.stats.transfers_requested += 1;
                let res = self.members[idx]
                    .node
                    .as_mut()
                    .expect("up")
                    .transfer_leader(to);
                if let Err(e) = res {
                    self.note(|| format!("  refused: {e}"));
                }
                self.pump(idx)?;
                self.end_step()
            }
            Op::ConfChange => self.conf_change(),
            Op::Compact => {
                let Some(idx) = self.random_up() else {
                    return Ok(());
                };
                self.begin_step(|| format!("n{} snapshot and compact", idx + 1));
                self.compact(idx)?;
                self.end_step()
            }
        }
    }

    fn propose(&mut self, idx: usize, data: Bytes) -> Check {
        let name = String::from_utf8_lossy(&data).into_owned();
        self.begin_step(|| format!("n{} propose {name}", idx + 1));
        let res = self.members[idx].node.as_mut().expect("up").propose(data);
        if let Err(e) = res {
            self.note(|| format!("  refused: {e}"));
        }
        self.pump(idx)?;
        self.end_step()
    }

    fn read(&mut self, idx: usize, ctx: Bytes) -> Check {
        let name = String::from_utf8_lossy(&ctx).into_owned();
        self.begin_step(|| format!("n{} read {name}", idx + 1));
        let id = self.members[idx].id;
        self.checker.read_started(id, ctx.clone());
        let res = self.members[idx]
            .node
            .as_mut()
            .expect("up")
            .read_index(ctx.clone());
        if let Err(e) = res {
            self.checker.read_refused(&ctx);
            self.note(|| format!("  refused: {e}"));
        }
        self.pump(idx)?;
        self.end_step()
    }

    /// Proposes one membership change that makes sense in the leader's view:
    /// add a spare as learner or voter, promote a learner, or remove a
    /// member. Ids never come back once removed.
    fn conf_change(&mut self) -> Check {
        let Some(lead) = self.leader() else {
            return Ok(());
        };
        let sm = self.members[lead].sm.clone();
        let first_spare = self.initial_members as u64 + 1;
        let fresh: Vec<u64> = (first_spare..first_spare + SPARE_MEMBERS as u64)
            .filter(|id| !sm.is_member(*id) && !sm.removed.contains(id))
            .collect();
        let learners: Vec<u64> = sm.learners.iter().copied().collect();
        let mut removable: Vec<u64> = learners.clone();
        if sm.voters.len() > 1 {
            removable.extend(sm.voters.iter().copied());
        }
        let mut choices: Vec<(ConfChangeType, u64)> = Vec::new();
        if let Some(&id) = fresh.choose(&mut self.rng) {
            let t = if self.rng.gen_bool(0.7) {
                ConfChangeType::ConfChangeAddLearnerNode
            } else {
                ConfChangeType::ConfChangeAddNode
            };
            choices.push((t, id));
        }
        if let Some(&id) = learners.choose(&mut self.rng) {
            choices.push((ConfChangeType::ConfChangeAddNode, id));
        }
        if let Some(&id) = removable.choose(&mut self.rng) {
            choices.push((ConfChangeType::ConfChangeRemoveNode, id));
        }
        let Some(&(t, node_id)) = choices.choose(&mut self.rng) else {
            return Ok(());
        };
        let at = if self.rng.gen_bool(0.7) {
            lead
        } else {
            match self.random_up() {
                Some(i) => i,
                None => lead,
            }
        };
        self.next_conf_change += 1;
        let cc = ConfChange {
            id: self.next_conf_change,
            change_type: t as i32,
            node_id,
            context: Bytes::new(),
        };
        self.begin_step(|| format!("n{} propose conf change {t:?} {node_id}", at + 1));
        let res = self.members[at]
            .node
            .as_mut()
            .expect("up")
            .propose_conf_change(&cc);
        if let Err(e) = res {
            self.note(|| format!("  refused: {e}"));
        }
        self.pump(at)?;
        self.end_step()
    }

    /// The driver snapshots its state machine at the applied index and drops
    /// a random prefix of the log it covers.
    fn compact(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let id = m.id;
        let applied = m.sm.applied_index;
        let conf = m.sm.conf_state();
        let data = m.sm.encode();
        let store = m.node.as_mut().expect("up").store_mut();
        let held = store
            .snapshot(0)
            .ok()
            .and_then(|s| s.metadata)
            .map_or(0, |md| md.index);
        let last = store.last_index().unwrap_or(0);
        if applied == 0 || applied > last {
            return Ok(());
        }
        if applied > held {
            store.create_snapshot(applied, conf, data).map_err(|e| {
                found(
                    ViolationKind::PersistenceContract,
                    format!("member {id}: snapshot at applied index {applied} failed: {e}"),
                )
            })?;
        }
        let first = store.first_index().unwrap_or(1);
        if first > applied {
            return Ok(());
        }
        let to = self.rng.gen_range(first..=applied);
        store.compact(to).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {id}: compaction to {to} failed: {e}"),
            )
        })?;
        self.note(|| format!("  n{id} snapshot at {applied}, log compacted to {to}"));
        Ok(())
    }

    // ---- liveness ----------------------------------------------------------

    fn liveness_round(&mut self) -> Check {
        let Some(lead) = self.leader() else {
            return Ok(());
        };
        if !self.live.write_done {
            let sm = &self.members[lead].sm;
            let members: Vec<u64> = sm
                .voters
                .iter()
                .chain(sm.learners.iter())
                .copied()
                .collect();
            let done = self.live.probes.iter().any(|p| {
                self.live.probe_index.get(p).is_some_and(|&at| {
                    members.iter().all(|id| {
                        let m = &self.members[*id as usize - 1];
                        m.sm.applied_index >= at
                    })
                })
            });
            if done {
                self.live.write_done = true;
                self.note(|| "liveness: probe write applied on every member".into());
            } else if self
                .live
                .last_probe_tick
                .is_none_or(|t| self.tick - t >= ELECTION_TIMEOUT_TICKS)
            {
                self.live.last_probe_tick = Some(self.tick);
                let data = Bytes::from(format!(
                    "{}{}",
                    String::from_utf8_lossy(PROBE_WRITE_PREFIX),
                    self.live.probes.len()
                ));
                self.live.probes.push(data.clone());
                self.propose(lead, data)?;
            }
        }
        if self.live.write_done
            && !self.live.read_done
            && self
                .live
                .last_read_tick
                .is_none_or(|t| self.tick - t >= ELECTION_TIMEOUT_TICKS)
        {
            self.live.last_read_tick = Some(self.tick);
            self.next_read += 1;
            let ctx = Bytes::from(format!(
                "{}{}",
                String::from_utf8_lossy(PROBE_READ_PREFIX),
                self.next_read
            ));
            self.read(lead, ctx)?;
        }
        Ok(())
    }

    // ---- reporting ---------------------------------------------------------

    fn state_summary(&self) -> String {
        let mut parts = Vec::new();
        for m in &self.members {
            let s = match &m.node {
                None => format!("n{} down", m.id),
                Some(n) => format!(
                    "n{} {:?} t{} lead {} commit {} applied {} last {} voters {:?} learners {:?} (raft: {:?} {:?}){}",
                    m.id,
                    n.role(),
                    n.term(),
                    n.leader_id(),
                    n.committed_index(),
                    m.sm.applied_index,
                    n.last_index(),
                    m.sm.voters,
                    m.sm.learners,
                    n.status().conf_state.voters,
                    n.status().conf_state.learners,
                    if m.pending.is_empty() { "" } else { " (write pending)" }
                ),
            };
            parts.push(s);
        }
        parts.join("; ")
    }

    fn dump_state(&mut self) {
        let s = self.state_summary();
        for part in s.split("; ") {
            self.trace.push(format!("[end] {part}"));
        }
        let links = self.net.blocked_links();
        let in_flight = self.net.in_flight();
        self.trace.push(format!(
            "[end] blocked links {links:?}, {in_flight} messages in flight"
        ));
    }
}

/// Applies one committed entry to `m`'s state machine and checks it against
/// every other member's. Returns a description of an applied membership
/// change, for the trace.
fn apply_entry(
    m: &mut Member,
    checker: &mut Checker,
    stats: &mut SimStats,
    live: &mut Liveness,
    e: &Entry,
) -> Result<Option<String>, Found> {
    let id = m.id;
    let mut change = None;
    if e.index != m.sm.applied_index + 1 {
        return Err(found(
            ViolationKind::StateMachineSafety,
            format!(
                "member {id} was handed index {} to apply after applying {}",
                e.index, m.sm.applied_index
            ),
        ));
    }
    if e.entry_type == EntryType::EntryConfChange as i32 {
        let cc = ConfChange::decode(e.data.clone()).map_err(|err| {
            found(
                ViolationKind::StateMachineSafety,
                format!(
                    "member {id}: committed conf change at {} undecodable: {err}",
                    e.index
                ),
            )
        })?;
        let node = m.node.as_mut().expect("applying member is up");
        // The node may have restored a snapshot past this entry while the
        // Ready carrying it was being written; its membership already
        // includes the change, and applying it again would rewind it.
        let behind_snapshot = e.index < node.status().first_index;
        if m.sm.conf_change_valid(&cc) {
            m.sm.apply_conf_change(&cc);
            stats.conf_changes_applied += 1;
            change = Some(format!(
                "{:?} {} at index {} (voters {:?} learners {:?})",
                cc.change_type(),
                cc.node_id,
                e.index,
                m.sm.voters,
                m.sm.learners
            ));
            if !behind_snapshot {
                let cs = node.apply_conf_change(&cc);
                let mut voters = cs.voters.clone();
                voters.sort_unstable();
                let mut learners = cs.learners.clone();
                learners.sort_unstable();
                let want = m.sm.conf_state();
                if voters != want.voters || learners != want.learners {
                    return Err(found(
                        ViolationKind::StateMachineSafety,
                        format!(
                            "member {id} after conf change at {}: raft has voters {voters:?} learners {learners:?}, applied membership is {:?} {:?}",
                            e.index, want.voters, want.learners
                        ),
                    ));
                }
            }
        }
    } else if !e.data.is_empty() {
        stats.writes_applied += 1;
        if e.data.starts_with(PROBE_WRITE_PREFIX) {
            live.probe_index.entry(e.data.clone()).or_insert(e.index);
        }
    }
    m.sm.apply(e);
    checker.apply(id, e.index, e.term, entry_digest(e), m.sm.chain_hash)?;
    Ok(change)
}

/// The persistence contract: a message in `Ready::messages` leaves before
/// the Ready's state is durable, so it may vouch only for what `store`
/// (the durable image) already holds.
fn check_immediate(store: &MemStorage, id: u64, m: &Message) -> Check {
    let hs = store.hard_state();
    let t = m.msg_type;
    let bad = if t == MessageType::MsgVote as i32 {
        !(hs.term == m.term && hs.vote == id)
    } else if t == MessageType::MsgVoteResp as i32 && !m.reject {
        !(hs.term == m.term && hs.vote == m.to)
    } else if t == MessageType::MsgAppResp as i32 && !m.reject {
        store.last_index().unwrap_or(0) < m.index && m.index > 0
    } else {
        false
    };
    if bad {
        return Err(found(
            ViolationKind::PersistenceContract,
            format!(
                "member {id} sends {} before it is durable (durable term {} vote {} last index {})",
                fmt_msg(m),
                hs.term,
                hs.vote,
                store.last_index().unwrap_or(0)
            ),
        ));
    }
    Ok(())
}

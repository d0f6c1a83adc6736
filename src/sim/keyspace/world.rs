//! The keyspace simulation loop: members, one network per shard, the Ready
//! contract of every shard's node, applying, and the checks after every
//! step.
//!
//! Time advances in ticks. Each tick every running member ticks every shard
//! once and does its keyspace duties (lease rounds, pulling shards to shard
//! 0's leader); then due messages, completed disk writes and client attempts
//! are handled one at a time in random order until nothing is due. The first
//! `chaos_ticks` ticks inject faults; then the network heals, members
//! resume and restart, and a write to every shard must be acknowledged
//! within `LIVENESS_BOUND_TICKS`.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use prost::Message as _;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::super::member::{entry_digest, PendingWrite, StateMachine};
use super::super::network::Network;
use super::super::take_panic_report;
use super::adversary::Episode;
use super::checker::{found, Answer, Check, Found, KsChecker, KsViolation, KsViolationKind};
use super::client::ClientWrite;
use super::cross::TxnRun;
use super::faults::{Plan, ShardCut};
use super::kv::Payload;
use super::member::{decode_lease_ctx, decode_point_ctx, KsMember};
use super::reads::{PointAsk, ReadRun};
use super::watch::Watcher;
use super::{
    Bug, KsConfig, KsOutcome, KsStats, ACTOR_STEPS_PER_TICK, ELECTION_TIMEOUT_TICKS,
    LIVENESS_BOUND_TICKS, MAX_CLOCK_SKEW_MTICKS, MAX_EVENTS_PER_TICK, MAX_SHARDS, MTICKS_PER_TICK,
    SETTLE_BOUND_TICKS,
};
use crate::raft::{
    ConfChange, ConfChangeType, Config, Entry, EntryType, HardState, MemStorage, Message, RawNode,
    StateRole,
};

/// Progress towards the liveness goal once the faults stopped.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    pub calm_since_tick: u64,
    /// Per shard: probe writes issued, and whether one was acknowledged.
    pub probes: Vec<Vec<u64>>,
    pub done: Vec<bool>,
    pub last_probe_tick: Option<u64>,
}

/// Something that takes steps of its own among a tick's events.
#[derive(Debug, Clone, Copy)]
enum Actor {
    Run(u64),
    Read(u64),
    Opening(usize),
}

pub(super) struct World {
    pub guard: super::Guard,
    pub protocol: super::Protocol,
    pub bug: Bug,
    pub rng: SmallRng,
    pub plan: Plan,
    pub shard_count: usize,
    /// `members[i]` has id `i + 1`.
    pub members: Vec<KsMember>,
    /// One network per shard.
    pub nets: Vec<Network>,
    /// Messages released by a member that resumed, deliverable now.
    pub released: Vec<(usize, Message)>,
    pub checker: KsChecker,
    pub raft_template: Config,
    pub tick: u64,
    pub stats: KsStats,
    pub trace_on: bool,
    pub trace: Vec<String>,
    pub next_write: u64,
    pub clients: Vec<ClientWrite>,
    pub calm: bool,
    pub live: Liveness,
    /// Members both sides of the current partial partition reach.
    pub pivots: Vec<u64>,
    /// Directed links cut on every shard's network.
    pub base_links: Vec<(u64, u64)>,
    /// Directed links cut on one shard's network only (a stalled
    /// connection of that shard).
    pub shard_links: Vec<Vec<ShardCut>>,
    /// When the partial partition in force ends.
    pub partial_until: Option<u64>,
    pub episode: Option<Episode>,
    /// Txns over several shards in progress, by run id.
    pub runs: BTreeMap<u64, TxnRun>,
    /// Reads over several shards in progress, by id.
    pub reads: BTreeMap<u64, ReadRun>,
    /// Read points asked of shards, by ask id.
    pub point_asks: BTreeMap<u64, PointAsk>,
    /// The last id given to a run, a read or an ask.
    pub next_run: u64,
    /// The watches of members' earlier incarnations, with the member.
    pub closed_watches: Vec<(u64, Watcher)>,
    /// After liveness: no new client ops, until everything is applied
    /// everywhere.
    pub settling: bool,
}

pub(crate) fn run(cfg: &KsConfig) -> KsOutcome {
    let mut w = World::new(cfg);
    let res = catch_unwind(AssertUnwindSafe(|| w.run()));
    let violation = match res {
        Ok(Ok(())) => None,
        Ok(Err(v)) => Some(v),
        Err(payload) => Some(KsViolation {
            kind: KsViolationKind::CorePanic,
            tick: w.tick,
            step: w.stats.steps,
            detail: take_panic_report(&*payload),
        }),
    };
    if violation.is_some() && w.trace_on {
        w.dump_state();
    }
    KsOutcome {
        seed: cfg.seed,
        members: cfg.members,
        shards: w.shard_count,
        guard: cfg.guard,
        protocol: cfg.protocol,
        bug: cfg.bug,
        stats: w.stats,
        violation,
        trace: w.trace,
    }
}

fn bootstrap_log(members: usize) -> MemStorage {
    // etcd's bootstrap: the initial membership is the committed prefix of
    // the log.
    let mut disk = MemStorage::new();
    let ents: Vec<Entry> = (1..=members as u64)
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
        commit: members as u64,
    });
    disk
}

impl World {
    fn new(cfg: &KsConfig) -> Self {
        let mut rng = SmallRng::seed_from_u64(cfg.seed);
        let shard_count = cfg.shards.unwrap_or_else(|| rng.gen_range(2..=MAX_SHARDS));
        let plan = Plan::draw(&mut rng);
        let mut t = Config::new(1);
        t.election_timeout_ticks = ELECTION_TIMEOUT_TICKS;
        t.heartbeat_timeout_ticks = rng.gen_range(1..=3);
        t.pre_vote = rng.gen_bool(0.75);
        // The lease rests on followers ignoring candidates while they hear
        // from a leader, which is check-quorum's rule.
        t.check_quorum = true;
        t.max_inflight_msgs = *[2usize, 8, 256].choose(&mut rng).expect("non-empty");
        t.leader_transfer_timeout_ticks = ELECTION_TIMEOUT_TICKS;
        let members = (1..=cfg.members as u64)
            .map(|id| {
                let skew = plan.clock_skew_mticks;
                let rate = rng.gen_range(MTICKS_PER_TICK - skew..=MTICKS_PER_TICK + skew);
                let clock0 = rng.gen_range(0..1_000 * MTICKS_PER_TICK);
                KsMember::new(
                    id,
                    (0..shard_count)
                        .map(|_| bootstrap_log(cfg.members))
                        .collect(),
                    rate,
                    clock0,
                )
            })
            .collect();
        debug_assert!(plan.clock_skew_mticks <= MAX_CLOCK_SKEW_MTICKS);
        let nets = (0..shard_count)
            .map(|_| Network::new(plan.chaos_faults))
            .collect();
        World {
            guard: cfg.guard,
            protocol: cfg.protocol,
            bug: cfg.bug,
            rng,
            plan,
            shard_count,
            members,
            nets,
            released: Vec::new(),
            checker: KsChecker::default(),
            raft_template: t,
            tick: 0,
            stats: KsStats::default(),
            trace_on: cfg.trace,
            trace: Vec::new(),
            next_write: 0,
            clients: Vec::new(),
            calm: false,
            live: Liveness {
                probes: vec![Vec::new(); shard_count],
                done: vec![false; shard_count],
                ..Default::default()
            },
            pivots: Vec::new(),
            base_links: Vec::new(),
            shard_links: vec![Vec::new(); shard_count],
            partial_until: None,
            episode: None,
            runs: BTreeMap::new(),
            reads: BTreeMap::new(),
            point_asks: BTreeMap::new(),
            next_run: 0,
            closed_watches: Vec::new(),
            settling: false,
        }
    }

    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if self.trace_on {
            let l = line();
            self.trace
                .push(format!("[t{} s{}] {l}", self.tick, self.stats.steps));
        }
    }

    fn violation(&self, f: Found) -> KsViolation {
        KsViolation {
            kind: f.kind,
            tick: self.tick,
            step: self.stats.steps,
            detail: f.detail,
        }
    }

    fn run(&mut self) -> Result<(), KsViolation> {
        let p = self.plan.clone();
        let t = self.raft_template.clone();
        let (shards, guard) = (self.shard_count, self.guard);
        self.note(|| {
            format!(
                "plan {p:?}; {shards} shards, guard {guard:?}; raft pre_vote={} heartbeat={} inflight={}",
                t.pre_vote, t.heartbeat_timeout_ticks, t.max_inflight_msgs
            )
        });
        for idx in 0..self.members.len() {
            self.begin_step(|| format!("start n{}", idx + 1));
            self.start_member(idx).map_err(|f| self.violation(f))?;
            self.end_step().map_err(|f| self.violation(f))?;
        }
        // An episode in progress runs to its end (each phase is bounded).
        while self.tick < self.plan.chaos_ticks || self.episode.is_some() {
            self.tick_round().map_err(|f| self.violation(f))?;
        }
        self.begin_step(|| "faults stop: heal, resume and restart every member".into());
        self.calm_down().map_err(|f| self.violation(f))?;
        self.end_step().map_err(|f| self.violation(f))?;
        loop {
            self.tick_round().map_err(|f| self.violation(f))?;
            if self.live.done.iter().all(|d| *d) {
                self.stats.recovery_ticks = self.tick - self.live.calm_since_tick;
                let r = self.stats.recovery_ticks;
                self.note(|| format!("liveness met after {r} ticks"));
                return self.settle();
            }
            if self.tick - self.live.calm_since_tick >= LIVENESS_BOUND_TICKS {
                let done = self.live.done.clone();
                let f = found(
                    KsViolationKind::Liveness,
                    format!(
                        "{LIVENESS_BOUND_TICKS} ticks after the faults stopped, shards with an acknowledged write: {done:?}; {}",
                        self.state_summary()
                    ),
                );
                return Err(self.violation(f));
            }
        }
    }

    // ---- steps and checks --------------------------------------------------

    pub fn begin_step(&mut self, what: impl FnOnce() -> String) {
        self.stats.steps += 1;
        self.note(what);
    }

    /// The checks run after every step, and the lease bookkeeping that
    /// watches every shard's role.
    pub fn end_step(&mut self) -> Check {
        let believers = self
            .members
            .iter()
            .filter(|m| m.may_assign(super::Guard::NoGuard).is_ok())
            .count();
        if believers > 1 {
            self.stats.dual_leader_steps += 1;
        }
        for idx in 0..self.members.len() {
            self.track_readiness(idx)?;
            for shard in 0..self.shard_count {
                let m = &mut self.members[idx];
                let (id, clock) = (m.id, m.clock_mticks);
                let s = &mut m.shards[shard];
                s.observe_role(clock);
                let Some(node) = s.node.as_ref() else {
                    continue;
                };
                let role = node.role();
                let term = node.term();
                let changed = (role, term) != s.last_role;
                s.last_role = (role, term);
                if role == StateRole::Leader && self.checker.observe_leader(shard, term, id)? {
                    self.stats.leaders_elected += 1;
                }
                if changed && self.trace_on {
                    let line = format!(
                        "[t{} s{}]   n{id} is {role:?} of shard {shard} in term {term} (commit {}, last {})",
                        self.tick,
                        self.stats.steps,
                        node.committed_index(),
                        node.last_index()
                    );
                    self.trace.push(line);
                }
            }
        }
        Ok(())
    }

    fn tick_round(&mut self) -> Check {
        self.tick += 1;
        self.stats.ticks += 1;
        for net in &mut self.nets {
            net.advance_to(self.tick);
        }
        if !self.calm {
            self.inject_faults()?;
        }
        for idx in 0..self.members.len() {
            let m = &self.members[idx];
            if !m.is_up() && m.restart_at_tick.is_some_and(|t| t <= self.tick) {
                self.begin_step(|| format!("restart n{}", idx + 1));
                self.start_member(idx)?;
                self.end_step()?;
            }
            if self.members[idx]
                .paused_until
                .is_some_and(|t| t <= self.tick)
            {
                self.resume(idx)?;
            }
            for shard in 0..self.shard_count {
                let s = &self.members[idx].shards[shard];
                if s.ticks_stalled_until.is_some_and(|t| t <= self.tick) {
                    self.end_tick_stall(idx, shard)?;
                }
            }
        }
        let mut order: Vec<usize> = (0..self.members.len()).collect();
        order.shuffle(&mut self.rng);
        for idx in order {
            let m = &mut self.members[idx];
            // The monotonic clock runs whether the process is up or not.
            let ticks = m.advance_clock();
            if !m.is_up() {
                continue;
            }
            if m.is_paused() {
                m.missed_ticks += ticks;
                continue;
            }
            self.begin_step(|| format!("tick n{} ({ticks} raft ticks)", idx + 1));
            for s in &mut self.members[idx].shards {
                if s.ticks_stalled_until.is_some() {
                    s.stalled_ticks += ticks;
                } else {
                    for _ in 0..ticks {
                        s.node.as_mut().expect("up").tick();
                    }
                }
            }
            self.keyspace_duties(idx)?;
            for shard in 0..self.shard_count {
                self.pump(idx, shard)?;
            }
            self.end_step()?;
        }
        if !self.settling {
            self.draw_writes();
        }
        let mut attempts: Vec<usize> = (0..self.clients.len()).collect();
        let mut actors: Vec<Actor> = Vec::new();
        for _ in 0..ACTOR_STEPS_PER_TICK {
            actors.extend(self.runs.keys().map(|r| Actor::Run(*r)));
            actors.extend(self.reads.keys().map(|r| Actor::Read(*r)));
            actors.extend(
                (0..self.members.len())
                    .filter(|i| self.members[*i].opening.is_some())
                    .map(Actor::Opening),
            );
        }
        for _ in 0..MAX_EVENTS_PER_TICK {
            let msgs: usize = self.nets.iter().map(Network::due_count).sum();
            let released = self.released.len();
            let writes: Vec<(usize, usize)> = self.due_writes();
            let total = msgs + released + writes.len() + attempts.len() + actors.len();
            if total == 0 {
                break;
            }
            let mut r = self.rng.gen_range(0..total);
            if r < msgs {
                for shard in 0..self.shard_count {
                    let n = self.nets[shard].due_count();
                    if r < n {
                        let m = self.nets[shard].take_due(&mut self.rng).expect("counted");
                        self.deliver(shard, m)?;
                        break;
                    }
                    r -= n;
                }
                continue;
            }
            r -= msgs;
            if r < released {
                let (shard, m) = self.released.swap_remove(r);
                self.deliver(shard, m)?;
                continue;
            }
            r -= released;
            if r < writes.len() {
                let (idx, shard) = writes[r];
                self.begin_step(|| format!("write done n{} shard {shard}", idx + 1));
                self.complete_write(idx, shard)?;
                self.end_step()?;
                continue;
            }
            r -= writes.len();
            if r < attempts.len() {
                let c = attempts.swap_remove(r);
                self.client_attempt(c)?;
                continue;
            }
            r -= attempts.len();
            match actors.swap_remove(r) {
                Actor::Run(run) => self.step_run(run)?,
                Actor::Read(read) => self.step_read(read)?,
                Actor::Opening(idx) => self.step_opening(idx)?,
            }
        }
        self.clients.retain(|c| !c.settled);
        if self.calm && !self.settling {
            self.liveness_round();
        }
        Ok(())
    }

    /// After liveness: no new client ops; every op in progress ends, an
    /// open keyspace leader finishes what earlier ones left, and every
    /// member applies every shard's whole log. Then the end-of-run checks.
    fn settle(&mut self) -> Result<(), KsViolation> {
        self.settling = true;
        let since = self.tick;
        self.begin_step(|| "settle: no new client ops".into());
        self.end_step().map_err(|f| self.violation(f))?;
        while !self.settled() {
            if self.tick - since >= SETTLE_BOUND_TICKS {
                let f = found(
                    KsViolationKind::Liveness,
                    format!(
                        "{SETTLE_BOUND_TICKS} ticks after liveness, not settled: {} clients, {} txns, {} reads in progress; {}",
                        self.clients.len(),
                        self.runs.len(),
                        self.reads.len(),
                        self.state_summary()
                    ),
                );
                return Err(self.violation(f));
            }
            self.tick_round().map_err(|f| self.violation(f))?;
        }
        let ticks = self.tick - since;
        self.note(|| format!("settled after {ticks} ticks; checking the history"));
        let applied: Vec<(u64, Vec<u64>)> = self
            .members
            .iter()
            .map(|m| (m.id, m.shards.iter().map(|s| s.sm.applied_index).collect()))
            .collect();
        let mut watches: Vec<(u64, &Watcher)> =
            self.closed_watches.iter().map(|(m, w)| (*m, w)).collect();
        watches.extend(self.members.iter().map(|m| (m.id, &m.watcher)));
        self.stats.watch_events_released += watches
            .iter()
            .map(|(_, w)| w.released.len() as u64)
            .sum::<u64>();
        let res = self.checker.check_end(self.shard_count, &applied, &watches);
        res.map_err(|f| self.violation(f))
    }

    /// Nothing in progress, an open keyspace leader, and every shard's log
    /// committed and applied on every member.
    fn settled(&self) -> bool {
        if !self.clients.is_empty() || !self.runs.is_empty() || !self.reads.is_empty() {
            return false;
        }
        if self
            .members
            .iter()
            .any(|m| !m.is_running() || m.opening.is_some())
        {
            return false;
        }
        let Some(leader) = self.members.iter().find(|m| m.assigns(self.guard).is_ok()) else {
            return false;
        };
        (0..self.shard_count).all(|shard| {
            let n = leader.shards[shard].node.as_ref().expect("running");
            let last = n.last_index();
            n.committed_index() == last
                && self
                    .members
                    .iter()
                    .all(|m| m.shards[shard].sm.applied_index == last)
        })
    }

    fn due_writes(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (idx, m) in self.members.iter().enumerate() {
            if m.is_paused() {
                continue;
            }
            for (shard, s) in m.shards.iter().enumerate() {
                if s.pending
                    .as_ref()
                    .is_some_and(|p| p.done_at_tick <= self.tick)
                {
                    out.push((idx, shard));
                }
            }
        }
        out
    }

    // ---- members -----------------------------------------------------------

    pub fn start_member(&mut self, idx: usize) -> Check {
        let tick = self.tick;
        for shard in 0..self.shard_count {
            let mut cfg = self.raft_template.clone();
            cfg.id = self.members[idx].id;
            cfg.group_id = shard as u64;
            cfg.seed = self.rng.gen();
            cfg.applied_index = 0;
            let s = &mut self.members[idx].shards[shard];
            let mut storage = s.disk.clone();
            // The state machine replays the whole log, so Raft starts from
            // the empty membership and relearns it from the log.
            let sm = StateMachine::default();
            storage.set_conf_state(sm.conf_state());
            let node = RawNode::new(&cfg, storage).map_err(|e| {
                found(
                    KsViolationKind::StateMachineSafety,
                    format!(
                        "member {} shard {shard} cannot restart from its durable state: {e}",
                        cfg.id
                    ),
                )
            })?;
            s.last_role = (node.role(), node.term());
            s.node = Some(node);
            s.sm = sm;
            s.applied_term = 0;
            s.cursor = Default::default();
            s.store = Default::default();
        }
        let m = &mut self.members[idx];
        let old = std::mem::replace(&mut m.watcher, Watcher::new(0));
        if !old.released.is_empty() {
            self.closed_watches.push((m.id, old));
        }
        m.forget_memory();
        m.restart_at_tick = None;
        m.started_at_tick = tick;
        m.started_at_mticks = m.clock_mticks;
        m.incarnation += 1;
        for shard in 0..self.shard_count {
            self.pump(idx, shard)?;
        }
        Ok(())
    }

    pub fn crash(&mut self, idx: usize, down_ticks: u64) {
        let m = &mut self.members[idx];
        if !m.is_up() {
            return;
        }
        for s in &mut m.shards {
            // Only what reached the disk survives: pending writes are lost.
            let node = s.node.take().expect("up");
            s.disk = node.store().clone();
        }
        let old = std::mem::replace(&mut m.watcher, Watcher::new(0));
        if !old.released.is_empty() {
            self.closed_watches.push((m.id, old));
        }
        m.forget_memory();
        m.restart_at_tick = Some(self.tick + down_ticks);
        self.stats.crashes += 1;
    }

    /// A paused or stalled member resumes: its missed ticks arrive in one
    /// bunch, then the messages that waited for it become deliverable.
    pub fn resume(&mut self, idx: usize) -> Check {
        let missed = self.members[idx].missed_ticks;
        self.begin_step(|| format!("resume n{} ({missed} missed ticks at once)", idx + 1));
        let m = &mut self.members[idx];
        m.paused_until = None;
        m.missed_ticks = 0;
        let held = std::mem::take(&mut m.held);
        for _ in 0..missed {
            for shard in 0..self.shard_count {
                if let Some(n) = self.members[idx].shards[shard].node.as_mut() {
                    n.tick();
                }
            }
        }
        self.released.extend(held);
        for shard in 0..self.shard_count {
            self.pump(idx, shard)?;
        }
        self.end_step()
    }

    /// A shard's stalled timer recovers: the ticks it held back arrive in
    /// one bunch.
    pub fn end_tick_stall(&mut self, idx: usize, shard: usize) -> Check {
        let s = &mut self.members[idx].shards[shard];
        let missed = s.stalled_ticks;
        s.ticks_stalled_until = None;
        s.stalled_ticks = 0;
        self.begin_step(|| {
            format!(
                "n{} shard {shard} timer recovers ({missed} held-back ticks at once)",
                idx + 1
            )
        });
        if let Some(n) = self.members[idx].shards[shard].node.as_mut() {
            for _ in 0..missed {
                n.tick();
            }
        }
        self.pump(idx, shard)?;
        self.end_step()
    }

    /// Takes a Ready if none is outstanding: its messages leave now, the
    /// rest waits for the disk write.
    pub fn pump(&mut self, idx: usize, shard: usize) -> Check {
        let late = self.rng.gen_range(0..1000) < self.plan.late_write_per_mille;
        let tick = self.tick;
        let m = &mut self.members[idx];
        if m.is_paused() {
            return Ok(());
        }
        let id = m.id;
        let s = &mut m.shards[shard];
        let Some(node) = s.node.as_mut() else {
            return Ok(());
        };
        if s.pending.is_some() || !node.has_ready() {
            return Ok(());
        }
        let mut rd = node.ready();
        if rd.snapshot.is_some() {
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!("member {id} shard {shard} was handed a snapshot, but no log is compacted"),
            ));
        }
        let msgs = std::mem::take(&mut rd.messages);
        let n_entries = rd.entries.len();
        s.pending = Some(PendingWrite {
            rd,
            done_at_tick: tick + u64::from(late),
        });
        self.note(|| {
            format!(
                "  n{id} s{shard} ready: {n_entries} entries, {} msgs now",
                msgs.len()
            )
        });
        for msg in msgs {
            self.send(shard, msg);
        }
        Ok(())
    }

    /// The disk write of a shard's outstanding Ready completed: persist,
    /// apply, take the lease rounds that came back, release the messages
    /// that waited, advance.
    fn complete_write(&mut self, idx: usize, shard: usize) -> Check {
        let m = &mut self.members[idx];
        let id = m.id;
        let Some(pw) = m.shards[shard].pending.take() else {
            return Ok(());
        };
        let mut rd = pw.rd;
        {
            let node = m.shards[shard].node.as_mut().expect("pending means up");
            node.store_mut().append(&rd.entries);
            if let Some(hs) = &rd.hard_state {
                node.store_mut().set_hard_state(*hs);
            }
        }
        // `advance` learns the applied index from the Ready's committed
        // entries, so they stay in it.
        let committed = rd.committed_entries.clone();
        for e in &committed {
            self.apply_entry(idx, shard, e)?;
        }
        let tick = self.tick;
        let m = &mut self.members[idx];
        let s = &mut m.shards[shard];
        let mut renewed = Vec::new();
        let mut points = Vec::new();
        for rs in std::mem::take(&mut rd.read_states) {
            if let Some((sh, term, start)) = decode_lease_ctx(&rs.request_ctx) {
                if sh == shard && s.lease_round_returned(term, start) {
                    renewed.push(start);
                }
            } else if let Some(ask) = decode_point_ctx(&rs.request_ctx) {
                points.push((ask, rs.index));
            }
        }
        let persisted = std::mem::take(&mut rd.persisted_messages);
        s.node.as_mut().expect("up").advance(rd);
        let clock = m.clock_mticks;
        if let Some(start) = renewed.last() {
            let until =
                start + (ELECTION_TIMEOUT_TICKS - super::LEASE_MARGIN_TICKS) * MTICKS_PER_TICK;
            self.note(|| {
                format!(
                    "  n{id} s{shard} lease from round of {start}m, until {until}m (now {clock}m, t{tick})"
                )
            });
        }
        for (ask, index) in points {
            self.point_round_returned(idx, shard, ask, index);
        }
        for msg in persisted {
            self.send(shard, msg);
        }
        self.pump(idx, shard)
    }

    fn apply_entry(&mut self, idx: usize, shard: usize, e: &Entry) -> Check {
        let step = self.stats.steps;
        let merge = self.bug != Bug::WatchNoMerge;
        let m = &mut self.members[idx];
        let id = m.id;
        let s = &mut m.shards[shard];
        let mut payload = None;
        if e.entry_type == EntryType::EntryConfChange as i32 {
            let cc = ConfChange::decode(e.data.clone()).map_err(|err| {
                found(
                    KsViolationKind::StateMachineSafety,
                    format!(
                        "member {id} shard {shard}: conf change at {} undecodable: {err}",
                        e.index
                    ),
                )
            })?;
            if s.sm.conf_change_valid(&cc) {
                s.sm.apply_conf_change(&cc);
                s.node.as_mut().expect("up").apply_conf_change(&cc);
            }
        } else if !e.data.is_empty() {
            payload = Some(Payload::decode(&e.data).ok_or_else(|| {
                found(
                    KsViolationKind::StateMachineSafety,
                    format!(
                        "member {id} shard {shard}: entry {} is neither a no-op nor a payload: {:?}",
                        e.index,
                        String::from_utf8_lossy(&e.data)
                    ),
                )
            })?);
        }
        s.sm.apply(e);
        s.applied_term = e.term;
        let first = self.checker.applied(
            id,
            shard,
            e.index,
            e.term,
            entry_digest(e),
            payload.as_ref(),
            &mut s.cursor,
        )?;
        let Some(payload) = payload else {
            return Ok(());
        };
        let incarnation = m.incarnation;
        let mine = |by: &super::kv::ReqTag| by.member == id && by.incarnation == incarnation;
        let events = match &payload {
            Payload::Write { id: w, rev, op } => {
                let (_, events) = s.store.apply_ops(*rev, *w, std::slice::from_ref(op));
                if first {
                    self.stats.writes_applied += 1;
                }
                events
            }
            Payload::Part {
                id: x,
                rev,
                by,
                ops,
                plan,
                ..
            } => {
                let (gets, events) = s.store.apply_ops(*rev, *x, ops);
                if let Some(plan) = plan {
                    s.store.records.insert(*rev, plan.clone());
                }
                if mine(by) {
                    m.answers.insert(by.seq, gets);
                }
                if first {
                    self.stats.txns_applied += 1;
                }
                events
            }
            Payload::Done { rev, by } => {
                s.store.records.remove(rev);
                if mine(by) {
                    m.answers.insert(by.seq, Vec::new());
                }
                Vec::new()
            }
            Payload::Close { rev } => {
                s.store.rev = s.store.rev.max(*rev);
                Vec::new()
            }
        };
        if payload.revision().is_some() {
            let through = s.store.rev;
            m.watcher
                .on_apply(shard, through, &events, merge)
                .map_err(|why| {
                    found(
                        KsViolationKind::WatchOrder,
                        format!("member {id}'s watch: {why}"),
                    )
                })?;
        }
        let Payload::Write { id: w, rev, .. } = payload else {
            return Ok(());
        };
        let m = &mut self.members[idx];
        if m.proposed.remove(&w).is_some() && self.checker.acked(w, step, Answer::Write)? {
            self.stats.writes_acked += 1;
            self.note(|| format!("  n{id} acknowledges w{w} (shard {shard}) at revision {rev}"));
            if self.calm {
                for (sh, probes) in self.live.probes.iter().enumerate() {
                    if probes.contains(&w) {
                        self.live.done[sh] = true;
                    }
                }
            }
        }
        Ok(())
    }

    // ---- reporting ---------------------------------------------------------

    pub fn state_summary(&self) -> String {
        let mut parts = Vec::new();
        for m in &self.members {
            if !m.is_up() {
                parts.push(format!("n{} down", m.id));
                continue;
            }
            let mut p = format!(
                "n{}{} counter {}:",
                m.id,
                if m.is_paused() { " paused" } else { "" },
                m.counter
            );
            for (shard, s) in m.shards.iter().enumerate() {
                let n = s.node.as_ref().expect("up");
                p.push_str(&format!(
                    " [s{shard} {:?} t{} lead {} commit {} applied {} rev {} lease {:?}]",
                    n.role(),
                    n.term(),
                    n.leader_id(),
                    n.committed_index(),
                    s.sm.applied_index,
                    s.cursor.rev,
                    s.lease
                ));
            }
            parts.push(p);
        }
        parts.join("; ")
    }

    fn dump_state(&mut self) {
        let s = self.state_summary();
        for part in s.split("; ") {
            self.trace.push(format!("[end] {part}"));
        }
        let (base, per_shard) = (self.base_links.clone(), self.shard_links.clone());
        self.trace.push(format!(
            "[end] links cut on every shard {base:?}, on one shard {per_shard:?}"
        ));
    }

    /// Ids of members that are up and not paused.
    pub fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| self.members[*i].is_running())
            .collect()
    }

    /// Ids of every member, for partitions.
    pub fn ids(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.id).collect()
    }
}

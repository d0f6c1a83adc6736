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
//!
//! Here: the world's state, the run's phases (start, chaos, calm until
//! liveness, settling, the end-of-run checks) and reporting. One tick and
//! the checks after every step are in `tick.rs`, a member's start, crash
//! and resumption in `members.rs`, and every shard's Ready contract and
//! applying in `ready.rs`.

mod members;
mod ready;
mod tick;

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;
use prost::Message as _;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::super::network::Network;
use super::super::take_panic_report;
use super::adversary::Episode;
use super::checker::{found, Found, KsChecker, KsViolation, KsViolationKind};
use super::client::ClientWrite;
use super::cross::TxnRun;
use super::faults::{Plan, ShardCut};
use super::member::KsMember;
use super::reads::{PointAsk, ReadRun};
use super::watch::Watcher;
use super::{
    Bug, KsConfig, KsOutcome, KsStats, ELECTION_TIMEOUT_TICKS, LIVENESS_BOUND_TICKS,
    MAX_CLOCK_SKEW_MTICKS, MAX_SHARDS, MTICKS_PER_TICK, SETTLE_BOUND_TICKS,
};
use crate::raft::{
    ConfChange, ConfChangeType, Config, Entry, EntryType, HardState, MemStorage, Message,
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
    /// For the counters only: the batch of each txn that ran in a batch
    /// of several, and the batches an opening's finishing proposed a part
    /// of.
    pub batch_of: BTreeMap<u64, u64>,
    pub batches_finished: BTreeSet<u64>,
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
            batch_of: BTreeMap::new(),
            batches_finished: BTreeSet::new(),
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

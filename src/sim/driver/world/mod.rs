//! The simulated world around the real shard drivers: one data directory
//! and one power-cut WAL disk per member, a seeded network between them, and
//! starting, crashing and restarting a member's driver.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use cairn_wal::crash::CrashStorage;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::member_file::{Member as FileMember, MemberFile, LAYOUT_VERSION};
use crate::routing::{RoutingTable, ShardId};
use crate::server::command::{Reply, ShardCommand};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::keyspace::Keyspace;
use crate::server::members::{MemberRegistry, WriterThread};
use crate::server::revisions::RevisionCounter;
use crate::server::shard::{OffCoreJobs, Shard, ShardInbound, ShardSetup, TimerFaults};
use crate::server::shard_inbox::CommandInbox;

use super::checks::{driver_stopped, DriverViolation};
use super::disk::SlowDisk;
use super::faults::{LeaderWatch, Plan};
use super::figure8::Figure8;
use super::log_watch::LogWatch;
use super::wire_trace::WireTrace;
use super::DriverSimConfig;

mod lifecycle;
mod links;

use links::SimPeers;

/// The simulated shard's heartbeat tick.
pub const TICK: Duration = Duration::from_millis(10);
/// Election timeout, in ticks.
pub const ELECTION_TICKS: u64 = 10;
/// Longest a message spends on the simulated network.
pub const MAX_DELAY: Duration = Duration::from_millis(5);
/// Messages a member's inbound queue holds; more are dropped, as a full
/// socket buffer would.
const INBOUND_QUEUE: usize = 4_096;
/// Commands a member's command queue holds.
const COMMAND_QUEUE: usize = 1_024;
/// Longest a job the driver hands off the core (a snapshot install's step,
/// a snapshot's metadata write) takes.
const OFF_CORE_JOB_LONGEST: Duration = Duration::from_millis(10);
/// Bytes a simulated snapshot stream hands over per step.
const STREAM_CHUNK_BYTES: usize = 64 << 10;

/// One member: its identity, its disks, and its running driver.
pub struct Member {
    pub id: u64,
    /// The store's directory (a real one: the store is the real store).
    dir: PathBuf,
    /// Each shard's WAL disk as a power cut leaves it, by shard: every
    /// shard runs on a core of its own, as the daemon places them by
    /// default, and each core has its WAL.
    disks: Vec<CrashStorage>,
    /// Each shard's timer, by shard: the simulation stalls it or makes it
    /// campaign (see [`TimerFaults`]). A stall outlives a crash (the core
    /// stays starved until the episode restores it); the ticks missed and a
    /// campaign asked for do not, as a new process has neither.
    timers: Vec<Rc<TimerFaults>>,
    incarnation: u64,
    /// In the group, as far as the membership changes made so far go: a
    /// spare is not yet, a removed member no longer (it never starts again).
    in_group: bool,
    running: Option<Running>,
    /// Being started or stopped: whoever else wants to start or stop it
    /// waits, so two drivers never share its disks.
    busy: bool,
}

struct Running {
    /// The member's tasks: each shard's driver, and with several shards the
    /// keyspace's own (finishing earlier txns at an opening, revoking
    /// expired leases), as the daemon's core 0 runs them.
    tasks: Vec<JoinHandle<()>>,
    /// Each shard's inbound queue, by shard.
    inbound: Vec<mpsc::Sender<ShardInbound>>,
    /// Each shard's command queue, by shard.
    commands: Vec<mpsc::Sender<ShardCommand>>,
    /// The member's router over those queues, with its keyspace when it
    /// runs several shards: what the API layer asks.
    router: Arc<Router>,
    /// The member table its drivers keep, which the API layer reads.
    registry: Arc<MemberRegistry>,
    /// The driver's jobs off its core, which outlive an aborted task.
    jobs: OffCoreJobs,
    _shutdown: watch::Sender<bool>,
}

/// Everything the simulated members share: the seeded choices, the network
/// and the members.
pub struct World {
    cfg: DriverSimConfig,
    rng: RefCell<SmallRng>,
    pub members: RefCell<Vec<Member>>,
    /// Directed links that drop everything sent over them.
    cut: RefCell<BTreeSet<(u64, u64)>>,
    /// Directed links that drop what one shard sends over them (with
    /// several shards: each core's shards have connections of their own).
    shard_cut: RefCell<BTreeSet<(u64, u64, ShardId)>>,
    /// Chance in a thousand that a message is lost.
    pub drop_per_mille: Cell<u32>,
    pub delivered: Cell<u64>,
    pub dropped: Cell<u64>,
    pub crashes: Cell<u64>,
    pub partitions: Cell<u64>,
    /// Leader transfers a leader started.
    pub transfers: Cell<u64>,
    /// Times a member's revision counter opened (several shards): the
    /// keyspace leaderships of the seed.
    pub keyspace_openings: Cell<u64>,
    /// Txns over several shards that joined a batch another led.
    pub txns_batched: Cell<u64>,
    /// Stale-view episodes begun, and those that reached two members each
    /// believing they lead every shard (see [`super::stale_view`]).
    pub stale_view_episodes: Cell<u64>,
    pub stale_views: Cell<u64>,
    /// The clients send no txns for now (see [`super::stale_view`]).
    pub txns_paused: Cell<bool>,
    /// Snapshot streams started, and handed whole to their receiver.
    pub snapshots_started: Cell<u64>,
    pub snapshots_delivered: Cell<u64>,
    next_stream: Cell<u64>,
    /// Entries between log compactions (`--snapshot-count`), drawn per seed:
    /// a member that was down or cut off for long catches up by snapshot.
    snapshot_count: u64,
    /// This seed plays the adversary of Raft paper figure 8: one entry per
    /// append, and leaders struck often right after they are elected or
    /// commit (see [`Plan::draw`]).
    pub figure8: bool,
    /// Half the figure-8 seeds play the scripted adversary of
    /// [`super::figure8`] instead of random faults, with appends of the
    /// usual size.
    pub figure8_script: Option<Rc<Figure8>>,
    /// The faults of this seed, while they last.
    plan: RefCell<Option<Plan>>,
    /// Each shard's leaders and logs as the wire shows them, by shard; the
    /// faults aim at shard 0's leaders (the keyspace leader, with several
    /// shards).
    leaders: Vec<LeaderWatch>,
    logs: Vec<LogWatch>,
    /// The keyspace's partition into the members' shards.
    pub routing: RoutingTable,
    /// The first failure found away from the main task (a restart that
    /// failed, a driver or a task of the simulation that panicked); shared
    /// with the tasks [`World::spawn_checked`] starts.
    failure: Rc<RefCell<Option<DriverViolation>>>,
    /// The seed is over: nothing starts any more.
    over: Cell<bool>,
    /// Every message the members sent, in order, as a digest (and as lines
    /// when the seed is traced): what a replay of the seed must repeat.
    wire: RefCell<WireTrace>,
    _root: tempfile::TempDir,
}

impl World {
    pub fn new(cfg: &DriverSimConfig) -> Result<Rc<World>, String> {
        // Store syncs cost nothing on a memory filesystem.
        let shm = std::path::Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("cairn-driver-sim-");
        let root = if shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .map_err(|e| format!("creating the members' directories: {e}"))?;
        let members = (1..=(cfg.members + crate::sim::SPARE_MEMBERS) as u64)
            .map(|id| Member {
                id,
                dir: root.path().join(format!("member-{id}")),
                disks: (0..cfg.shards).map(|_| CrashStorage::new()).collect(),
                timers: (0..cfg.shards).map(|_| Rc::default()).collect(),
                incarnation: 0,
                in_group: id as usize <= cfg.members,
                running: None,
                busy: false,
            })
            .collect();
        let mut rng = SmallRng::seed_from_u64(cfg.seed);
        // One seed in eight never compacts: its members catch up from the log.
        let snapshot_count = if rng.gen_range(0..8) == 0 {
            u64::MAX
        } else {
            rng.gen_range(4..100)
        };
        // The figure-8 adversaries aim at one group's terms: they run only
        // with one shard (the draws stay, so that a seed of one shard runs
        // as it always did).
        let figure8 = rng.gen_range(0..4) == 0;
        let figure8_script = (figure8 && rng.gen_bool(0.5) && cfg.shards == 1).then(Rc::default);
        let figure8 = figure8 && cfg.shards == 1;
        Ok(Rc::new(World {
            cfg: cfg.clone(),
            rng: RefCell::new(rng),
            members: RefCell::new(members),
            cut: RefCell::new(BTreeSet::new()),
            shard_cut: RefCell::new(BTreeSet::new()),
            drop_per_mille: Cell::new(0),
            delivered: Cell::new(0),
            dropped: Cell::new(0),
            crashes: Cell::new(0),
            partitions: Cell::new(0),
            transfers: Cell::new(0),
            keyspace_openings: Cell::new(0),
            txns_batched: Cell::new(0),
            stale_view_episodes: Cell::new(0),
            stale_views: Cell::new(0),
            txns_paused: Cell::new(false),
            snapshots_started: Cell::new(0),
            snapshots_delivered: Cell::new(0),
            next_stream: Cell::new(1),
            snapshot_count,
            figure8,
            figure8_script,
            plan: RefCell::new(None),
            leaders: (0..cfg.shards).map(|_| LeaderWatch::default()).collect(),
            logs: (0..cfg.shards).map(|_| LogWatch::default()).collect(),
            routing: RoutingTable::new(cfg.shards, 1),
            failure: Rc::default(),
            over: Cell::new(false),
            wire: RefCell::new(WireTrace::new(cfg.trace)),
            _root: root,
        }))
    }

    /// The members of the group.
    pub fn ids(&self) -> Vec<u64> {
        self.members
            .borrow()
            .iter()
            .filter(|m| m.in_group)
            .map(|m| m.id)
            .collect()
    }

    /// The spares never added to the group.
    pub fn spare_ids(&self) -> Vec<u64> {
        self.members
            .borrow()
            .iter()
            .filter(|m| !m.in_group && m.incarnation == 0)
            .map(|m| m.id)
            .collect()
    }

    /// The members the group was created with.
    fn founders(&self) -> Vec<u64> {
        (1..=self.cfg.members as u64).collect()
    }

    /// Starts spare `id` as a new member, once the group has it as a
    /// learner.
    pub async fn join(self: &Rc<Self>, id: u64) -> Result<(), String> {
        let _turn = self.take_turn(id).await;
        self.members.borrow_mut()[index(id)].in_group = true;
        self.start_turn(id).await
    }

    /// Stops member `id` for good, once the group removed it.
    pub async fn leave(&self, id: u64) -> Result<(), String> {
        let _turn = self.take_turn(id).await;
        self.members.borrow_mut()[index(id)].in_group = false;
        self.crash_turn(id).await
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.members.borrow()[index(id)].running.is_some()
    }

    pub fn up_ids(&self) -> Vec<u64> {
        let members = self.members.borrow();
        members
            .iter()
            .filter(|m| m.running.is_some())
            .map(|m| m.id)
            .collect()
    }

    /// A running member picked at random; None when none runs.
    pub fn pick_up(&self) -> Option<u64> {
        let up = self.up_ids();
        (!up.is_empty()).then(|| up[self.gen_range(0..up.len())])
    }

    #[track_caller]
    pub fn gen_range<T, R>(&self, range: R) -> T
    where
        T: rand::distributions::uniform::SampleUniform,
        R: rand::distributions::uniform::SampleRange<T>,
    {
        self.wire.borrow_mut().draw(std::panic::Location::caller());
        self.rng.borrow_mut().gen_range(range)
    }

    #[track_caller]
    pub fn chance(&self, per_mille: u32) -> bool {
        self.gen_range(0..1000) < per_mille
    }

    /// The shards each member runs.
    pub fn shards(&self) -> usize {
        self.cfg.shards
    }

    /// Sends member `id`'s driver of shard 0 a command and waits at most
    /// `wait` (room in its queue included) for the answer.
    pub async fn ask<T: Send + 'static>(
        &self,
        id: u64,
        wait: Duration,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<T, AskError> {
        self.ask_shard(id, 0, wait, make).await
    }

    /// [`Self::ask`] of member `id`'s driver of `shard`.
    pub async fn ask_shard<T: Send + 'static>(
        &self,
        id: u64,
        shard: ShardId,
        wait: Duration,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<T, AskError> {
        let commands = self
            .commands_of(id, shard)
            .ok_or(AskError::NotRunning { id })?;
        let (reply, answer) = crate::server::command::Reply::channel();
        let asked = async {
            commands
                .send(make(reply))
                .await
                .map_err(|_| AskError::Stopped { id })?;
            match answer.await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(error)) => Err(AskError::Refused { id, error }),
                Err(_) => Err(AskError::Stopped { id }),
            }
        };
        tokio::time::timeout(wait, asked)
            .await
            .unwrap_or(Err(AskError::TimedOut { id, wait }))
    }

    /// Member `id`'s timer of `shard`.
    pub fn timer(&self, id: u64, shard: ShardId) -> Rc<TimerFaults> {
        self.members.borrow()[index(id)].timers[shard as usize].clone()
    }

    /// The queue of commands of `id`'s shard 0, while it runs.
    pub fn commands(&self, id: u64) -> Option<mpsc::Sender<ShardCommand>> {
        self.commands_of(id, 0)
    }

    /// The queue of commands of `id`'s `shard`, while it runs.
    pub fn commands_of(&self, id: u64, shard: ShardId) -> Option<mpsc::Sender<ShardCommand>> {
        self.members.borrow()[index(id)]
            .running
            .as_ref()
            .map(|r| r.commands[shard as usize].clone())
    }

    /// The queue of commands of the shard of `key` on `id`, while it runs.
    pub fn commands_for(&self, id: u64, key: &[u8]) -> Option<mpsc::Sender<ShardCommand>> {
        self.commands_of(id, self.routing.shard_for_key(key))
    }

    /// Member `id`'s member table, while it runs.
    pub fn registry(&self, id: u64) -> Option<Arc<MemberRegistry>> {
        self.members.borrow()[index(id)]
            .running
            .as_ref()
            .map(|r| r.registry.clone())
    }

    /// Member `id`'s router, while it runs.
    pub fn router(&self, id: u64) -> Option<Arc<Router>> {
        self.members.borrow()[index(id)]
            .running
            .as_ref()
            .map(|r| r.router.clone())
    }

    /// Faults follow `plan` until [`World::end_chaos`].
    pub fn start_chaos(&self, plan: Plan) {
        *self.plan.borrow_mut() = Some(plan);
    }

    pub fn end_chaos(&self) {
        *self.plan.borrow_mut() = None;
        self.heal();
    }

    pub fn in_chaos(&self) -> bool {
        self.plan.borrow().is_some()
    }

    /// Ends the seed: no member starts again.
    pub fn end(&self) {
        self.over.set(true);
        self.end_chaos();
    }

    pub fn note_failure(&self, v: DriverViolation) {
        self.failure.borrow_mut().get_or_insert(v);
    }

    /// Adds a line to a traced seed's trace.
    pub fn note(&self, what: impl FnOnce() -> String) {
        self.wire.borrow_mut().note(what);
    }

    /// The messages sent so far.
    pub fn wire(&self) -> std::cell::RefMut<'_, WireTrace> {
        self.wire.borrow_mut()
    }

    pub fn take_failure(&self) -> Option<DriverViolation> {
        self.failure.borrow_mut().take()
    }

    /// Spawns a task of the simulation itself (a client's call, a watch
    /// session, a fault: not a member's) whose panic is a violation
    /// ([`TaskPanic`](super::DriverViolationKind::TaskPanic)) instead of
    /// vanishing with its handle, where a client's call would only be
    /// missing from the history and the seed would pass. `what` names the
    /// task for the message. The handle answers None when it panicked.
    pub fn spawn_checked<F>(
        &self,
        what: impl FnOnce() -> String + 'static,
        task: F,
    ) -> JoinHandle<Option<F::Output>>
    where
        F: std::future::Future + 'static,
        F::Output: 'static,
    {
        use futures::FutureExt;
        let failure = self.failure.clone();
        let (seed, members, shards) = (self.cfg.seed, self.cfg.members, self.cfg.shards);
        tokio::task::spawn_local(async move {
            // Unwind safe enough: the violation ends the seed, and nothing
            // the task left half done is checked after it.
            let panicked = match std::panic::AssertUnwindSafe(task).catch_unwind().await {
                Ok(out) => return Some(out),
                Err(payload) => payload,
            };
            let v = super::checks::violation(
                super::DriverViolationKind::TaskPanic,
                format!(
                    "seed {seed} ({members} members, {shards} shards): {} panicked: {}; what \
                     it was doing never reached the checks",
                    what(),
                    super::panic_text(panicked)
                ),
            );
            failure.borrow_mut().get_or_insert(v);
            None
        })
    }

    /// The panic planted in the simulation's own tasks, if any.
    #[cfg(feature = "raft-mutations")]
    pub fn planted_panic(&self) -> Option<super::PlantedPanic> {
        self.cfg.planted_panic
    }

    /// The member seen leading shard 0 last, on the wire.
    pub fn leader_seen(&self) -> Option<u64> {
        self.leaders[0].leader()
    }

    /// Shard 0's newest term seen on the wire, and its leader.
    pub fn newest_leader(&self) -> Option<(u64, u64)> {
        self.leaders[0].newest()
    }

    /// Notes a driver that stopped by itself ([`Self::check_running`]) as a
    /// violation; whether one had.
    pub async fn note_stopped_driver(&self) -> bool {
        match self.check_running().await {
            Ok(()) => false,
            Err(e) => {
                self.note_failure(driver_stopped(e));
                true
            }
        }
    }

    pub async fn check_running(&self) -> Result<(), String> {
        let finished = self
            .members
            .borrow()
            .iter()
            .find(|m| {
                m.running
                    .as_ref()
                    .is_some_and(|r| r.tasks.iter().any(|t| t.is_finished()))
            })
            .map(|m| m.id);
        match finished {
            Some(id) => {
                self.crash(id).await?;
                Err(format!("member {id}'s driver stopped by itself"))
            }
            None => Ok(()),
        }
    }
}

/// Why a member's driver did not answer a command.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AskError {
    #[error("member {id} is not running")]
    NotRunning { id: u64 },
    #[error("member {id} stopped before it answered")]
    Stopped { id: u64 },
    #[error("member {id} did not answer within {wait:?}")]
    TimedOut { id: u64, wait: Duration },
    #[error("member {id}: {error}")]
    Refused { id: u64, error: ApiError },
}

fn index(id: u64) -> usize {
    (id - 1) as usize
}

/// A small-segment WAL, so runs roll over segments.
fn wal_config(dir: PathBuf) -> cairn_wal::Config {
    let mut c = cairn_wal::Config::new(dir);
    c.segment_size_bytes = 256 << 10;
    c.max_record_payload_bytes = 16 << 10;
    c.max_batch_bytes = 64 << 10;
    c.max_queued_bytes = 4 << 20;
    c.max_shards = 4;
    c.zero_chunk_bytes = 64 << 10;
    c.spare_segments = 1;
    c.max_spare_segments = 2;
    c
}

/// The peer URL of simulated member `id` in the member table.
fn peer_url(id: u64) -> String {
    format!("sim://m{id}")
}

/// The simulated member a peer URL names (see [`peer_url`]).
pub fn member_of_url(url: &str) -> Option<u64> {
    url.strip_prefix("sim://m")?.parse().ok()
}

fn member_file(id: u64, founders: &[u64], ids: &[u64], shards: usize) -> MemberFile {
    MemberFile {
        layout_version: LAYOUT_VERSION,
        name: format!("m{id}"),
        member_id: id,
        cluster_id: 1,
        shards: shards as u32,
        routing_version: crate::routing::ROUTING_VERSION,
        wal_lanes: 1,
        removed: false,
        bootstrap_voters: founders.to_vec(),
        members: ids
            .iter()
            .map(|&m| FileMember {
                id: m,
                name: format!("m{m}"),
                peer_urls: vec![peer_url(m)],
                client_urls: Vec::new(),
                is_learner: false,
            })
            .collect(),
    }
}

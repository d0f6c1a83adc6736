//! The shard driver: one task per shard on the core that owns it, carrying out
//! what its Raft node asks (persist to the core's WAL, send to peers, apply to the
//! shard's MVCC store) and serving the shard's client commands.
//!
//! # One turn of the loop
//! 1. Take input: peer messages, client commands, ticks, and the WAL saying
//!    that earlier writes are durable.
//! 2. For every write now durable, oldest first: hand its entries to the
//!    in-memory log, send the messages that had to wait for it (votes, append
//!    acknowledgements), tell Raft (`advance_append`).
//! 3. Pending linearizable reads of this turn become one ReadIndex round.
//! 4. While Raft has a Ready: send the messages that may leave now (the
//!    leader's appends go out while it writes), queue entries and hard state
//!    in the WAL without waiting (one group fsync shared with the core's
//!    other shards; writes become durable in order), apply committed entries
//!    to the store and answer their clients, serve reads whose index is
//!    applied.
//!
//! Writes are pipelined: while one flush is in flight the driver keeps taking
//! acknowledgements, committing, applying and answering, and the next batch
//! queues behind the flush. Raft runs with `async_append`, so it hands out
//! for applying only entries already durable in this member's WAL, and a
//! leader counts its own replica only once its write is durable.
//!
//! A write is acknowledged only after it is committed by a quorum (Raft) and
//! durable in this member's WAL; an append acknowledgement or a vote leaves
//! only once every write queued before it is durable.
//!
//! # Back of the envelope
//! A durable append costs ~0.1 ms on the reference disk and a loopback hop
//! ~30 µs, so a 3-member write is about one fsync on the leader in parallel
//! with one on a follower, plus two hops: ~0.25 ms. Everything that arrives
//! during one turn rides the same fsync, so throughput grows with concurrency
//! until the CPU, not the disk, is the limit.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_mvcc as mvcc;
use cairn_proto::cairnpb::{shard_request, ShardRequest};
use cairn_proto::etcdserverpb::{self as pb, RangeRequest, RangeResponse};
use prost::Message as _;
use tokio::sync::{mpsc, watch};

use super::convert;
use super::entry;
use super::errors::ApiError;
use super::router::{Reply, ShardCommand, ShardHash, ShardStatus, WriteResult, REQUEST_TIMEOUT};
use crate::raft::{
    self, ConfChange, ConfState, EntryType, HardState, MemStorage, RawNode, Ready, Snapshot,
    SnapshotMetadata, StateRole,
};
use crate::routing::ShardId;

/// Inputs drained per turn before Raft's Ready is processed: bounds the time one
/// turn takes, so ticks are not starved by a flood of messages.
pub const MAX_INPUTS_PER_TURN: usize = 1024;

/// Entries kept in memory behind the applied index after a log compaction, so a
/// follower that is a little behind catches up from the log, not by snapshot
/// (etcd keeps 5,000).
pub const CATCH_UP_ENTRIES: u64 = 5_000;

/// How long a request waits for a leader to be elected before it fails with
/// etcd's "no leader": about two election timeouts, so an election in progress
/// costs a client latency, not an error.
pub const LEADERLESS_WAIT: Duration = Duration::from_secs(3);

/// Requests that may wait for a leader at once; more fail at once.
pub const MAX_LEADERLESS_REQUESTS: usize = 16_384;
/// Bytes of proposals that may wait for a leader at once; more fail at once.
pub const MAX_LEADERLESS_WRITE_BYTES: usize = 64 << 20;

/// A write waiting until a leader takes proposals.
enum HeldWrite {
    /// A client's request made to this member.
    Local(shard_request::Request, Reply<WriteResult>),
    /// A proposal another member forwarded here. Raft would drop it (the
    /// proposer is never told, so its client would wait for its timeout); its
    /// client is answered by the proposer, on apply or by its own timeout.
    Forwarded(raft::Message),
}

impl HeldWrite {
    fn bytes(&self) -> usize {
        match self {
            HeldWrite::Local(request, _) => request.encoded_len(),
            HeldWrite::Forwarded(m) => m.entries.iter().map(|e| e.data.len()).sum(),
        }
    }
}

/// How long a member leads a shard it is not preferred for before handing it
/// to the preferred member.
pub const LEADERSHIP_HANDOVER_AFTER: Duration = Duration::from_secs(3);

/// Applied bytes after which the store commits at once rather than on the next
/// tick: bounds the store's uncommitted batch.
pub const STORE_COMMIT_PENDING_BYTES: usize = 16 * 1024 * 1024;

/// Longest time applied entries wait for a store commit; also how much a
/// restart may have to replay from the WAL.
pub const STORE_COMMIT_INTERVAL: Duration = Duration::from_millis(100);

/// How the driver sends Raft messages to the other members of its shard.
pub trait PeerSender {
    /// Queues `msg` for its `to` member. Returns false when it could not be
    /// queued (peer unknown, queue full, link closed): Raft tolerates a lost
    /// message, and the driver reports the peer unreachable.
    fn send(&self, shard: ShardId, msg: raft::Message) -> bool;

    /// The link to `to` for `shard`, for streaming a snapshot.
    fn link(&self, shard: ShardId, to: u64) -> Option<cairn_net::Link>;

    /// Makes sure `shard` has a link to member `to` at `peer_urls` (a new
    /// member, or one whose URLs changed).
    fn connect(&self, shard: ShardId, to: u64, peer_urls: &[String]);

    /// Drops `shard`'s link to a removed member.
    fn disconnect(&self, shard: ShardId, to: u64);
}

/// What the network delivers to a shard.
#[derive(Debug)]
pub enum ShardInbound {
    Raft(raft::Message),
    /// A complete snapshot stream, as the receive buffers' slices: a
    /// length-prefixed `MsgSnap` followed by length-prefixed store chunks
    /// (every length a little-endian u32).
    Snapshot(Vec<Bytes>),
}

/// Splits a received snapshot stream back into the `MsgSnap` and store chunks.
fn decode_snapshot_stream(parts: Vec<Bytes>) -> Result<(raft::Message, Vec<Vec<u8>>), String> {
    let mut all = bytes::BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in parts {
        all.extend_from_slice(&p);
    }
    let all = all.freeze();
    fn take(all: &Bytes, pos: &mut usize, what: &str) -> Result<Bytes, String> {
        if all.len() < *pos + 4 {
            return Err(format!(
                "snapshot stream ends inside the length of the {what}"
            ));
        }
        let len = u32::from_le_bytes(all[*pos..*pos + 4].try_into().expect("4 bytes")) as usize;
        *pos += 4;
        if all.len() < *pos + len {
            return Err(format!(
                "snapshot stream ends inside the {what} ({len} bytes announced)"
            ));
        }
        let b = all.slice(*pos..*pos + len);
        *pos += len;
        Ok(b)
    }
    let mut pos = 0usize;
    let msg = raft::Message::decode(take(&all, &mut pos, "message")?)
        .map_err(|e| format!("snapshot message: {e}"))?;
    let mut chunks = Vec::new();
    while pos < all.len() {
        chunks.push(take(&all, &mut pos, "store chunk")?.to_vec());
    }
    Ok((msg, chunks))
}

/// Everything a shard driver starts from.
pub struct ShardSetup {
    pub shard: ShardId,
    pub member_id: u64,
    /// The voters the log started with at the cluster's creation; ignored
    /// once the log has a snapshot. Every conf change since is in the log
    /// (or behind its snapshot), so the membership rebuilt from them is the
    /// one every other member has at the same index.
    pub initial_voters: Vec<u64>,
    /// Directory of the shard's store and snapshot metadata.
    pub dir: PathBuf,
    pub wal: Rc<cairn_wal::Wal>,
    pub recovered: cairn_wal::RecoveredShard,
    pub peers: Rc<dyn PeerSender>,
    pub commands: mpsc::Receiver<ShardCommand>,
    pub inbound: mpsc::Receiver<ShardInbound>,
    pub tick: Duration,
    pub election_ticks: u64,
    pub quota_backend_bytes: u64,
    pub snapshot_count: u64,
    pub shutdown: watch::Receiver<bool>,
    /// Where the shard records its metrics (None in tests without a registry).
    pub metrics: Option<crate::ops::server_metrics::ShardRecorder>,
    /// Readiness: told when the shard has a leader and has caught up.
    pub readiness: Option<std::sync::Arc<crate::ops::readiness::Readiness>>,
    /// Counts shards of this member that have caught up once; the member is
    /// caught up when all have.
    pub caught_up: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub shard_count: usize,
    /// The member table, updated as membership changes are applied.
    pub members: std::sync::Arc<super::members::MemberRegistry>,
}

/// An apply of one Ready's committed entries slower than this is counted as a
/// slow apply (etcd's warning threshold).
pub const SLOW_APPLY: Duration = Duration::from_millis(100);

/// Why a shard could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardOpenError {
    #[error("shard {shard}: opening its store in {dir}: {source}")]
    Store {
        shard: ShardId,
        dir: PathBuf,
        #[source]
        source: mvcc::OpenError,
    },
    #[error(transparent)]
    Entry(#[from] entry::EntryDecodeError),
    #[error("shard {shard}: {what}")]
    Recovery { shard: ShardId, what: String },
    #[error("shard {shard}: starting raft: {source}")]
    Raft {
        shard: ShardId,
        #[source]
        source: raft::RaftError,
    },
    #[error("shard {shard}: snapshot metadata {path}: {reason}")]
    SnapshotMeta {
        shard: ShardId,
        path: PathBuf,
        reason: String,
    },
}

/// Snapshot metadata of the shard's log: the index and term the log starts
/// after, and the membership then. Kept in `<shard dir>/raft-snapshot`, written
/// atomically (temporary file, sync, rename) whenever the log is compacted or a
/// snapshot installed, since the WAL has no entry at that index to give its term.
fn snapshot_meta_path(dir: &std::path::Path) -> PathBuf {
    dir.join("raft-snapshot")
}

fn read_snapshot_meta(
    shard: ShardId,
    dir: &std::path::Path,
) -> Result<Option<SnapshotMetadata>, ShardOpenError> {
    let path = snapshot_meta_path(dir);
    match std::fs::read(&path) {
        Ok(bytes) => {
            // 4-byte little-endian CRC32 of the rest, then the encoded metadata.
            let bad = |reason: &str| ShardOpenError::SnapshotMeta {
                shard,
                path: path.clone(),
                reason: reason.to_string(),
            };
            if bytes.len() < 4 {
                return Err(bad("shorter than its checksum"));
            }
            let (crc, body) = bytes.split_at(4);
            if u32::from_le_bytes(crc.try_into().expect("4 bytes")) != crc32fast::hash(body) {
                return Err(bad("checksum mismatch"));
            }
            SnapshotMetadata::decode(body)
                .map(Some)
                .map_err(|e| bad(&e.to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ShardOpenError::SnapshotMeta {
            shard,
            path,
            reason: e.to_string(),
        }),
    }
}

pub(crate) fn write_snapshot_meta(
    dir: &std::path::Path,
    md: &SnapshotMetadata,
) -> std::io::Result<()> {
    use std::io::Write;
    let body = md.encode_to_vec();
    let mut bytes = crc32fast::hash(&body).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    let tmp = dir.join("raft-snapshot.tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, snapshot_meta_path(dir))?;
    std::fs::File::open(dir)?.sync_all()
}

/// The counter of a read context this incarnation made, or 0 for any other.
fn read_context_counter(ctx: &[u8], member_id: u64, boot_nonce: u64) -> u64 {
    if ctx.len() != 24
        || ctx[0..8] != member_id.to_le_bytes()
        || ctx[8..16] != boot_nonce.to_le_bytes()
    {
        return 0;
    }
    u64::from_le_bytes(ctx[16..24].try_into().expect("8 bytes"))
}

/// `<shard dir>.<suffix>`: where a snapshot's store is built (`new`) and where
/// the replaced one goes (`old`) while the two are swapped.
fn swap_dir(dir: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    dir.with_file_name(name)
}

/// Completes or undoes a snapshot install a crash interrupted. The swap is two
/// renames (dir -> old, new -> dir): with `dir` gone the new store is complete
/// and takes its place; with `dir` present the swap never started and the
/// partial new store is dropped. A leftover old store is removed.
fn finish_interrupted_swap(dir: &std::path::Path) -> std::io::Result<()> {
    let new_dir = swap_dir(dir, "new");
    let old_dir = swap_dir(dir, "old");
    if !dir.exists() && new_dir.exists() {
        std::fs::rename(&new_dir, dir)?;
    }
    if new_dir.exists() {
        std::fs::remove_dir_all(&new_dir)?;
    }
    if old_dir.exists() {
        std::fs::remove_dir_all(&old_dir)?;
    }
    Ok(())
}

/// Snapshots held at once while Raft decides on them.
const MAX_HELD_SNAPSHOTS: usize = 2;

/// How long a snapshot transfer to a follower may go without sending a chunk
/// (waiting for the follower to be reachable included). Raft is then told it
/// failed, and sends a fresh snapshot when the follower next answers.
pub const SNAPSHOT_SEND_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A snapshot received from a leader, waiting for Raft to accept it.
struct IncomingSnapshot {
    chunks: Vec<Vec<u8>>,
    members: Option<cairn_proto::cairnpb::MemberTable>,
}

/// A snapshot stream read from the store as it is sent: the length-prefixed
/// `MsgSnap`, then each store chunk length-prefixed (the layout
/// [`decode_snapshot_stream`] reads). The store snapshot it reads from never
/// blocks the shard's writes. It cannot start over once read from: a transfer
/// that fails part way fails, and Raft asks for a fresh snapshot.
struct StoreSnapshotSource {
    message: Option<Bytes>,
    stream: mvcc::SnapshotStream,
    /// The data of a chunk whose length prefix went out last.
    pending: Option<Bytes>,
    started: bool,
    bytes: u64,
    /// When the transfer last took a chunk.
    progress: Rc<std::cell::Cell<Instant>>,
}

impl cairn_net::StreamSource for StoreSnapshotSource {
    fn rewind(&mut self) -> std::io::Result<()> {
        if self.started {
            return Err(std::io::Error::other(
                "a store snapshot cannot start over; a fresh one is sent instead",
            ));
        }
        Ok(())
    }

    fn next_chunk(&mut self, _max_bytes: usize) -> std::io::Result<Option<Bytes>> {
        self.started = true;
        self.progress.set(Instant::now());
        if let Some(m) = self.message.take() {
            let mut out = Vec::with_capacity(4 + m.len());
            out.extend_from_slice(&(m.len() as u32).to_le_bytes());
            out.extend_from_slice(&m);
            self.bytes += out.len() as u64;
            return Ok(Some(Bytes::from(out)));
        }
        if let Some(data) = self.pending.take() {
            self.bytes += data.len() as u64;
            return Ok(Some(data));
        }
        match self.stream.next() {
            None => Ok(None),
            Some(Err(e)) => Err(std::io::Error::other(format!(
                "reading the store for a snapshot: {e}"
            ))),
            Some(Ok(chunk)) => {
                self.bytes += 4;
                let prefix = Bytes::copy_from_slice(&(chunk.len() as u32).to_le_bytes());
                self.pending = Some(Bytes::from(chunk));
                Ok(Some(prefix))
            }
        }
    }
}

/// A linearizable read waiting for its ReadIndex round and then for apply.
struct PendingRead {
    request: RangeRequest,
    reply: Reply<RangeResponse>,
}

struct Waiter {
    since: Instant,
    reply: Reply<WriteResult>,
}

struct ReadRound {
    since: Instant,
    reads: Vec<PendingRead>,
}

/// A Ready whose WAL write is queued but not yet durable. Its committed
/// entries were applied when it was taken; what remains waits for `lsn`.
struct InFlightWrite {
    /// Durable once the WAL's durable LSN reaches this: the Ready's own
    /// records, or the last records queued before it when it had none.
    lsn: u64,
    rd: Ready,
}

pub struct Shard {
    id: ShardId,
    member_id: u64,
    node: RawNode<MemStorage>,
    store: mvcc::Store,
    dir: PathBuf,
    wal: Rc<cairn_wal::Wal>,
    peers: Rc<dyn PeerSender>,
    waiters: HashMap<u64, Waiter>,
    next_request_id: u64,
    /// Reads collected this turn, sent as one ReadIndex round.
    reads_this_turn: Vec<PendingRead>,
    /// Writes and reads that arrived while no leader was known or while this
    /// leader hands leadership over: they wait (at most [`LEADERLESS_WAIT`])
    /// instead of failing during a short election or transfer.
    leaderless_writes: std::collections::VecDeque<(Instant, HeldWrite)>,
    /// Bytes in `leaderless_writes`, at most [`MAX_LEADERLESS_WRITE_BYTES`].
    leaderless_write_bytes: usize,
    leaderless_reads: Vec<(Instant, PendingRead)>,
    /// Rounds sent, by context, awaiting their read state.
    read_rounds: HashMap<u64, ReadRound>,
    next_read_ctx: u64,
    /// Confirmed reads by the index that must be applied first.
    confirmed_reads: BTreeMap<u64, Vec<PendingRead>>,
    /// A hard state that changed only in its commit index is not synced on its
    /// own (Raft does not need it durable); it rides with the next append.
    unsynced_hard_state: Option<HardState>,
    /// Follows the WAL's durable LSN.
    durable: cairn_wal::DurableWatch,
    /// Readys whose writes are queued, oldest first.
    in_flight: std::collections::VecDeque<InFlightWrite>,
    /// LSN of the last records this shard queued in the WAL.
    last_queued_lsn: u64,
    snapshot_meta: SnapshotMetadata,
    quota_backend_bytes: u64,
    snapshot_count: u64,
    preferred_leader: u64,
    /// When this member last became leader, for the leadership-spreading check.
    leader_since: Option<Instant>,
    nospace_alarm: bool,
    /// Set once the store or WAL failed: the shard refuses writes until restart.
    failed: Option<String>,
    /// A snapshot received from the leader, waiting for Raft to accept it:
    /// (index, store chunks).
    /// Snapshots received from leaders, by index, waiting for Raft to accept
    /// one: its store chunks and the member table that came with it. Keyed by
    /// index so a snapshot Raft refuses never replaces one it accepted.
    incoming_snapshots: BTreeMap<u64, IncomingSnapshot>,
    /// Outcomes of snapshot transfers to followers, reported to Raft.
    snapshot_reports_tx: mpsc::UnboundedSender<(u64, raft::SnapshotStatus)>,
    snapshot_reports: mpsc::UnboundedReceiver<(u64, raft::SnapshotStatus)>,
    /// Followers a snapshot is being streamed to right now.
    snapshots_in_flight: std::collections::HashSet<u64>,
    store_config: mvcc::Config,
    metrics: Option<crate::ops::server_metrics::ShardRecorder>,
    readiness: Option<std::sync::Arc<crate::ops::readiness::Readiness>>,
    caught_up: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    reported_caught_up: bool,
    shard_count: usize,
    /// The pending-proposals figure last exported, to export changes as deltas.
    pending_reported: i64,
    watchers: super::watch::ShardWatchers,
    /// Random per start: makes read contexts and request ids of this
    /// incarnation distinct from any earlier one's.
    boot_nonce: u64,
    members: std::sync::Arc<super::members::MemberRegistry>,
    /// Membership changes waiting for the previous one to be applied (Raft
    /// takes one at a time).
    conf_change_queue: std::collections::VecDeque<(ConfChange, Reply<WriteResult>)>,
    /// This member is a learner of the shard: it serves serializable reads only.
    is_learner: bool,
    /// Time left of every lease, while this member leads the shard.
    lease_clock: super::lease::LeaseClock,
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shard {
    /// Opens the shard's store, rebuilds its Raft log from the snapshot
    /// metadata and the WAL, and starts its Raft node.
    pub fn open(setup: &mut ShardSetup) -> Result<Shard, ShardOpenError> {
        let shard = setup.shard;
        finish_interrupted_swap(&setup.dir).map_err(|e| ShardOpenError::Recovery {
            shard,
            what: format!(
                "finishing an interrupted snapshot install in {}: {e}",
                setup.dir.display()
            ),
        })?;
        std::fs::create_dir_all(&setup.dir).map_err(|e| ShardOpenError::Recovery {
            shard,
            what: format!("creating {}: {e}", setup.dir.display()),
        })?;
        // Request limits are the API's (checked before proposing): apply
        // must not depend on this member's flags.
        let store_cfg = mvcc::Config::default();
        let (snapshot_reports_tx, snapshot_reports) = mpsc::unbounded_channel();
        let store = mvcc::Store::open(&setup.dir, shard, store_cfg.clone()).map_err(|source| {
            ShardOpenError::Store {
                shard,
                dir: setup.dir.clone(),
                source,
            }
        })?;
        let applied = store.applied_index();

        let meta = read_snapshot_meta(shard, &setup.dir)?;
        let snapshot_meta = meta.unwrap_or_else(|| SnapshotMetadata {
            conf_state: Some(ConfState {
                voters: setup.initial_voters.clone(),
                learners: Vec::new(),
            }),
            index: 0,
            term: 0,
        });
        let conf_state = snapshot_meta.conf_state.clone().unwrap_or_default();
        let mut storage = MemStorage::new_with_conf_state(conf_state);
        if snapshot_meta.index > 0 {
            storage
                .apply_snapshot(Snapshot {
                    data: Bytes::new(),
                    metadata: Some(snapshot_meta.clone()),
                })
                .map_err(|e| ShardOpenError::Recovery {
                    shard,
                    what: format!("installing snapshot metadata: {e}"),
                })?;
        }
        let recovered = std::mem::take(&mut setup.recovered);
        let mut entries = Vec::with_capacity(recovered.entries.len());
        for e in recovered.entries {
            if e.index > snapshot_meta.index {
                entries.push(entry::from_wal(shard, e)?);
            }
        }
        if let Some(first) = entries.first() {
            if first.index != snapshot_meta.index + 1 {
                return Err(ShardOpenError::Recovery {
                    shard,
                    what: format!(
                        "the WAL's entries start at {} but the log is compacted only to {}: \
                         entries in between are missing",
                        first.index, snapshot_meta.index
                    ),
                });
            }
        }
        if applied < snapshot_meta.index {
            return Err(ShardOpenError::Recovery {
                shard,
                what: format!(
                    "the store has applied index {applied} but the log is compacted to {}: \
                     entries in between are gone",
                    snapshot_meta.index
                ),
            });
        }
        let last_index = entries.last().map_or(snapshot_meta.index, |e| e.index);
        if applied > last_index {
            return Err(ShardOpenError::Recovery {
                shard,
                what: format!(
                    "the store has applied index {applied} but the log ends at {last_index}: \
                     the WAL lost entries the store had applied"
                ),
            });
        }
        storage.append(&entries);
        let mut hs = recovered
            .hard_state
            .map(|h| HardState {
                term: h.term,
                vote: h.vote,
                commit: h.commit,
            })
            .unwrap_or_default();
        // Commit-only hard states are not synced on their own; whatever the store
        // applied was committed.
        hs.commit = hs
            .commit
            .max(applied)
            .max(snapshot_meta.index)
            .min(last_index);
        storage.set_hard_state(hs);

        let mut cfg = raft::Config::new(setup.member_id);
        cfg.group_id = u64::from(shard);
        cfg.election_timeout_ticks = setup.election_ticks;
        cfg.heartbeat_timeout_ticks = 1;
        cfg.applied_index = applied.max(snapshot_meta.index);
        cfg.seed = setup.member_id ^ (u64::from(shard) << 32) ^ now_ms();
        cfg.async_append = true;
        let boot_nonce: u64 = rand::random::<u64>() | 1;
        let mut node =
            RawNode::new(&cfg, storage).map_err(|source| ShardOpenError::Raft { shard, source })?;
        // The membership recorded with the log's start misses the changes
        // applied since: those entries are not applied again, so their changes
        // are taken in here (the ones past the applied index are applied as
        // usual once committed).
        for e in &entries {
            if e.index > applied {
                break;
            }
            if e.entry_type == EntryType::EntryConfChange as i32 {
                let cc =
                    ConfChange::decode(e.data.clone()).map_err(|err| ShardOpenError::Recovery {
                        shard,
                        what: format!("conf change entry {} does not decode: {err}", e.index),
                    })?;
                node.apply_conf_change(&cc);
            }
        }
        let conf_state = node.status().conf_state;
        let is_learner = conf_state.learners.contains(&setup.member_id);
        // The member this shard's leadership is handed to when it is healthy,
        // so that leadership (and the write load it brings) spreads over the
        // shard's voters.
        let preferred_leader = super::members::preferred_leader(&conf_state.voters, shard);
        tracing::info!(
            shard,
            applied,
            last_index,
            term = hs.term,
            commit = hs.commit,
            "shard recovered"
        );
        Ok(Shard {
            id: shard,
            member_id: setup.member_id,
            node,
            store,
            dir: setup.dir.clone(),
            wal: setup.wal.clone(),
            peers: setup.peers.clone(),
            waiters: HashMap::new(),
            // Ids stay unique across restarts: a random high half per start.
            next_request_id: (boot_nonce & 0xffff_ffff_0000_0000) | 1,
            reads_this_turn: Vec::new(),
            leaderless_writes: std::collections::VecDeque::new(),
            leaderless_write_bytes: 0,
            leaderless_reads: Vec::new(),
            read_rounds: HashMap::new(),
            next_read_ctx: 1,
            confirmed_reads: BTreeMap::new(),
            unsynced_hard_state: None,
            durable: setup.wal.durable_watch(),
            in_flight: std::collections::VecDeque::new(),
            last_queued_lsn: 0,
            snapshot_meta,
            quota_backend_bytes: setup.quota_backend_bytes,
            snapshot_count: setup.snapshot_count,
            preferred_leader,
            leader_since: None,
            nospace_alarm: false,
            failed: None,
            incoming_snapshots: BTreeMap::new(),
            snapshot_reports_tx,
            snapshot_reports,
            snapshots_in_flight: std::collections::HashSet::new(),
            store_config: store_cfg,
            metrics: setup.metrics.clone(),
            readiness: setup.readiness.clone(),
            caught_up: setup.caught_up.clone(),
            reported_caught_up: false,
            shard_count: setup.shard_count,
            pending_reported: 0,
            watchers: super::watch::ShardWatchers::default(),
            boot_nonce,
            members: setup.members.clone(),
            conf_change_queue: std::collections::VecDeque::new(),
            is_learner,
            lease_clock: super::lease::LeaseClock::new(setup.tick, setup.election_ticks),
        })
    }

    /// Runs the shard until shutdown is signalled.
    pub async fn run(mut self, mut setup: ShardSetup) {
        let mut ticker = tokio::time::interval(setup.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_commit = Instant::now();
        // A store over its quota raises NOSPACE again at restart, before any
        // write can add to it.
        self.check_quota();
        loop {
            let oldest_write = self.in_flight.front().map_or(0, |w| w.lsn);
            tokio::select! {
                biased;
                _ = setup.shutdown.changed() => break,
                durable = self.durable.wait_for(oldest_write), if !self.in_flight.is_empty() => {
                    if !durable {
                        self.fail(self.wal_failure());
                    }
                }
                Some(msg) = setup.inbound.recv() => {
                    self.receive(msg);
                    for _ in 0..MAX_INPUTS_PER_TURN {
                        match setup.inbound.try_recv() {
                            Ok(m) => self.receive(m),
                            Err(_) => break,
                        }
                    }
                }
                Some((to, status)) = self.snapshot_reports.recv() => {
                    self.snapshots_in_flight.remove(&to);
                    self.node.report_snapshot(to, status);
                }
                Some(cmd) = setup.commands.recv() => {
                    self.handle(cmd);
                    for _ in 0..MAX_INPUTS_PER_TURN {
                        match setup.commands.try_recv() {
                            Ok(c) => self.handle(c),
                            Err(_) => break,
                        }
                    }
                }
                _ = ticker.tick() => {
                    if self.failed.is_none() {
                        self.node.tick();
                        self.maybe_hand_over_leadership();
                        self.expire_leases();
                        // Watchers that were behind (full queues) catch up.
                        if !self.watchers.is_empty() {
                            self.watchers.notify(self.id, &self.store);
                        }
                        if last_commit.elapsed() >= STORE_COMMIT_INTERVAL {
                            self.commit_store();
                            last_commit = Instant::now();
                        }
                    }
                    self.expire();
                }
            }
            if self.failed.is_some() {
                // A failed shard takes no further part in Raft: it cannot make
                // anything durable. Clients get the failure as their answer.
                let err = self.storage_error(self.failed.clone().unwrap_or_default());
                for r in self.reads_this_turn.drain(..) {
                    let _ = r.reply.send(Err(err.clone()));
                }
                continue;
            }
            self.complete_writes();
            self.release_leaderless();
            self.start_read_round();
            while self.node.has_ready() && self.failed.is_none() {
                let rd = self.node.ready();
                self.handle_ready(rd).await;
                self.complete_writes();
                // A leader may have just become known.
                self.release_leaderless();
                self.start_read_round();
            }
        }
        if self.failed.is_none() {
            self.commit_store();
        }
        tracing::info!(shard = self.id, "shard stopped");
    }

    /// A leader that is not its shard's preferred leader hands leadership over
    /// once the preferred member is caught up, after holding it for a while
    /// (so a member that just restarted is not handed leadership mid-recovery).
    fn maybe_hand_over_leadership(&mut self) {
        let Some(since) = self.leader_since else {
            return;
        };
        if self.preferred_leader == self.member_id
            || self.preferred_leader == raft::NONE
            || since.elapsed() < LEADERSHIP_HANDOVER_AFTER
        {
            return;
        }
        let status = self.node.status();
        if status.lead_transferee != raft::NONE {
            return;
        }
        let last = self.node.last_index();
        let caught_up = status
            .progress
            .iter()
            .any(|p| p.id == self.preferred_leader && !p.is_learner && p.matched == last);
        if caught_up {
            tracing::info!(
                shard = self.id,
                term = self.node.term(),
                to = self.preferred_leader,
                "handing leadership to the shard's preferred member"
            );
            // Wait another full period before trying again, whatever happens.
            self.leader_since = Some(Instant::now());
            let _ = self.node.transfer_leader(self.preferred_leader);
        }
    }

    fn receive(&mut self, inbound: ShardInbound) {
        match inbound {
            ShardInbound::Raft(m) => self.step(m),
            ShardInbound::Snapshot(parts) => match decode_snapshot_stream(parts) {
                Ok((msg, chunks)) => {
                    let index = msg
                        .snapshot
                        .as_ref()
                        .and_then(|s| s.metadata.as_ref())
                        .map_or(0, |m| m.index);
                    tracing::info!(
                        shard = self.id,
                        index,
                        chunks = chunks.len(),
                        "snapshot received"
                    );
                    let members = cairn_proto::cairnpb::MemberTable::decode(msg.context.clone())
                        .ok()
                        .filter(|t| t.cluster_id == self.members.cluster_id());
                    self.incoming_snapshots
                        .insert(index, IncomingSnapshot { chunks, members });
                    // Raft takes the newest; older ones held are never needed.
                    while self.incoming_snapshots.len() > MAX_HELD_SNAPSHOTS {
                        self.incoming_snapshots.pop_first();
                    }
                    self.step(msg);
                }
                Err(e) => {
                    tracing::warn!(shard = self.id, error = %e, "malformed snapshot stream dropped")
                }
            },
        }
    }

    /// Whether a proposal made now reaches a leader that appends it: one is
    /// known and is not handing leadership over.
    fn takes_proposals(&self) -> bool {
        self.node.leader_id() != raft::NONE && self.node.lead_transferee() == raft::NONE
    }

    fn step(&mut self, msg: raft::Message) {
        if self.failed.is_some() {
            return;
        }
        if msg.msg_type == raft::MessageType::MsgProp as i32 && !self.takes_proposals() {
            let from = msg.from;
            if let Some(HeldWrite::Forwarded(_)) = self.hold_write(HeldWrite::Forwarded(msg)) {
                tracing::warn!(
                    shard = self.id,
                    from,
                    "forwarded proposal dropped: too many waiting for a leader"
                );
            }
            return;
        }
        if let Err(e) = self.node.step(msg) {
            tracing::debug!(shard = self.id, error = %e, "raft refused a peer message");
        }
    }

    fn header(&self, revision: i64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            cluster_id: 0,
            member_id: 0,
            revision,
            raft_term: self.node.term(),
        }
    }

    fn status(&self) -> ShardStatus {
        let conf_state = self.node.status().conf_state;
        ShardStatus {
            shard: self.id,
            leader: self.node.leader_id(),
            term: self.node.term(),
            commit_index: self.node.committed_index(),
            applied_index: self.node.applied_index(),
            revision: self.store.current_revision(),
            compact_revision: self.store.compact_revision(),
            db_size_bytes: self.store.size_bytes(),
            db_size_in_use_bytes: self.store.size_in_use_bytes(),
            is_learner: self.is_learner,
            nospace_alarm: self.nospace_alarm,
            learners: conf_state.learners,
        }
    }

    fn handle(&mut self, cmd: ShardCommand) {
        match cmd {
            ShardCommand::Write { request, reply } => self.propose(request, reply),
            ShardCommand::Range { request, reply } => {
                if request.serializable {
                    let _ = reply.send(self.serve_range(&request));
                } else if self.is_learner {
                    let _ = reply.send(Err(ApiError::NotSupportedForLearner));
                } else {
                    self.reads_this_turn.push(PendingRead { request, reply });
                }
            }
            ShardCommand::Status { reply } => {
                let _ = reply.send(Ok(self.status()));
            }
            ShardCommand::Watch {
                key,
                spec,
                start_revision,
                tx,
                reply,
            } => {
                let current = self.store.current_revision();
                self.watchers.add(key, spec, start_revision, current, tx);
                let _ = reply.send(Ok(current));
                // A watcher starting in the past gets its history now.
                self.watchers.notify(self.id, &self.store);
            }
            ShardCommand::CancelWatch { key, reply } => {
                self.watchers.remove(&key);
                let _ = reply.send(Ok(()));
            }
            ShardCommand::Snapshot { tx, reply } => {
                if let Some(reason) = &self.failed {
                    let _ = reply.send(Err(self.storage_error(reason.clone())));
                    return;
                }
                // A consistent image at the applied index, read as the client
                // takes it; the shard keeps writing meanwhile.
                let stream = self.store.snapshot_stream();
                let _ = reply.send(Ok(stream.applied_index()));
                tokio::task::spawn_local(async move {
                    for chunk in stream {
                        let failed = chunk.is_err();
                        if tx.send(chunk.map_err(|e| e.to_string())).await.is_err() || failed {
                            return;
                        }
                    }
                });
            }
            ShardCommand::Defragment { reply } => {
                let _ = reply.send(self.defragment());
            }
            ShardCommand::WatchProgress { stream, reply } => {
                // Deliver what can go out now, then say how far that got.
                if !self.watchers.is_empty() {
                    self.watchers.notify(self.id, &self.store);
                }
                let current = self.store.current_revision();
                let _ = reply.send(Ok(self.watchers.delivered_through(stream, current)));
            }
            ShardCommand::ConfChange {
                change,
                member,
                check_only,
                reply,
            } => self.propose_conf_change(change, member, check_only, reply),
            ShardCommand::HashKv { revision, reply } => {
                let result = self
                    .store
                    .hash_kv(revision)
                    .map(|h| ShardHash {
                        hash: h.hash,
                        revision: h.hash_revision,
                        compact_revision: h.compact_revision,
                    })
                    .map_err(|e| self.read_error(e));
                let _ = reply.send(result);
            }
            ShardCommand::LeaseRenew { id, reply } => {
                let _ = reply.send(self.lease_renew(id));
            }
            ShardCommand::LeaseQuery { id, keys, reply } => {
                let _ = reply.send(self.lease_query(id, keys));
            }
            ShardCommand::LeaseList { reply } => {
                let ids = self.store.leases().iter().map(|l| l.id).collect();
                let _ = reply.send(Ok(ids));
            }
        }
    }

    /// Lease TTLs are answered by the shard's leader only, once it has applied
    /// every entry of earlier terms (it then knows every grant and revoke).
    fn lease_leader_check(&self) -> Result<(), ApiError> {
        if let Some(reason) = &self.failed {
            return Err(self.storage_error(reason.clone()));
        }
        let leader = self.node.leader_id();
        if leader != self.member_id {
            return Err(ApiError::NotLeader { leader });
        }
        if !self.lease_clock.is_ready(self.store.applied_index()) {
            return Err(ApiError::NotLeader { leader: raft::NONE });
        }
        Ok(())
    }

    fn lease_renew(&mut self, id: i64) -> Result<Option<i64>, ApiError> {
        self.lease_leader_check()?;
        Ok(self.lease_clock.renew(id, Instant::now()))
    }

    fn lease_query(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<Option<super::router::LeaseInfo>, ApiError> {
        self.lease_leader_check()?;
        let Some(remaining) = self.lease_clock.remaining(id, Instant::now()) else {
            return Ok(None);
        };
        Ok(self.store.lease(id).map(|l| super::router::LeaseInfo {
            granted_ttl: l.ttl_secs,
            remaining,
            keys: if keys { l.keys } else { Vec::new() },
        }))
    }

    /// The leader starts every lease's TTL afresh when it takes over, and
    /// forgets them when it steps down.
    fn lease_role_changed(&mut self, leader: bool) {
        if leader {
            let leases = self
                .store
                .leases()
                .into_iter()
                .map(|l| (l.id, l.ttl_secs, l.remaining_ttl_secs));
            self.lease_clock
                .promote(self.node.last_index(), leases, Instant::now());
        } else {
            self.lease_clock.demote();
        }
    }

    /// The leader revokes the leases whose TTL ran out, through Raft: each
    /// member deletes their keys when it applies the revoke.
    fn expire_leases(&mut self) {
        if !self.lease_clock.is_ready(self.store.applied_index())
            || self.node.leader_id() != self.member_id
        {
            return;
        }
        for id in self.lease_clock.due(Instant::now()) {
            // No client waits on it: request id 0.
            let data = ShardRequest {
                id: 0,
                member: self.member_id,
                request: Some(shard_request::Request::LeaseRevoke(
                    pb::LeaseRevokeRequest { id },
                )),
            }
            .encode_to_vec();
            match self.node.propose(Bytes::from(data)) {
                Ok(()) => tracing::debug!(shard = self.id, lease = id, "lease expired; revoking"),
                Err(e) => {
                    tracing::debug!(shard = self.id, lease = id, error = %e, "proposing an expired lease's revoke failed; retried later")
                }
            }
        }
    }

    /// True for requests that may add data, which a NOSPACE alarm refuses.
    fn adds_data(request: &shard_request::Request) -> bool {
        matches!(
            request,
            shard_request::Request::Put(_)
                | shard_request::Request::Txn(_)
                | shard_request::Request::LeaseGrant(_)
        )
    }

    fn propose(&mut self, request: shard_request::Request, reply: Reply<WriteResult>) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(self.storage_error(reason.clone())));
            return;
        }
        if self.is_learner {
            let _ = reply.send(Err(ApiError::NotSupportedForLearner));
            return;
        }
        if self.nospace_alarm && Self::adds_data(&request) {
            let _ = reply.send(Err(ApiError::NoSpace));
            return;
        }
        if !self.takes_proposals() {
            if let Some(HeldWrite::Local(_, reply)) =
                self.hold_write(HeldWrite::Local(request, reply))
            {
                let _ = reply.send(Err(ApiError::NoLeader));
            }
            return;
        }
        self.next_request_id += 1;
        let id = self.next_request_id;
        let data = ShardRequest {
            id,
            member: self.member_id,
            request: Some(request),
        }
        .encode_to_vec();
        match self.node.propose(Bytes::from(data)) {
            Ok(()) => {
                self.waiters.insert(
                    id,
                    Waiter {
                        since: Instant::now(),
                        reply,
                    },
                );
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.proposal_failed();
                }
                let _ = reply.send(Err(match e {
                    raft::RaftError::NoLeader { .. } | raft::RaftError::NotMember { .. } => {
                        ApiError::NoLeader
                    }
                    raft::RaftError::TransferInProgress { .. } => ApiError::LeaderChanged,
                    raft::RaftError::UncommittedLimit { .. } => ApiError::TooManyRequests,
                    other => self.storage_error(other.to_string()),
                }));
            }
        }
    }

    /// Carries out a membership change of this shard's group if this member
    /// leads it. A change already in effect is answered at once, so a change
    /// retried after a partial failure completes.
    fn propose_conf_change(
        &mut self,
        change: raft::ConfChangeType,
        member: cairn_proto::cairnpb::MemberInfo,
        check_only: bool,
        reply: Reply<WriteResult>,
    ) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(self.storage_error(reason.clone())));
            return;
        }
        let leader = self.node.leader_id();
        if leader != self.member_id {
            let _ = reply.send(Err(ApiError::NotLeader { leader }));
            return;
        }
        let status = self.node.status();
        let cs = &status.conf_state;
        let id = member.id;
        let done = match change {
            raft::ConfChangeType::ConfChangeAddNode => cs.voters.contains(&id),
            raft::ConfChangeType::ConfChangeAddLearnerNode => cs.learners.contains(&id),
            raft::ConfChangeType::ConfChangeRemoveNode => {
                !cs.voters.contains(&id) && !cs.learners.contains(&id)
            }
            raft::ConfChangeType::ConfChangeUpdateNode => false,
        };
        if done {
            let _ = reply.send(Ok(WriteResult::Applied {
                revision: self.store.current_revision(),
            }));
            return;
        }
        if change == raft::ConfChangeType::ConfChangeAddNode && cs.learners.contains(&id) {
            // etcd's rule: a learner is promoted only once it has at least 90%
            // of the leader's log, so the new voter does not stall commits.
            let last = self.node.last_index();
            let matched = status
                .progress
                .iter()
                .find(|p| p.id == id)
                .map_or(0, |p| p.matched);
            if (matched as f64) < (last as f64) * 0.9 {
                let _ = reply.send(Err(ApiError::LearnerNotReady));
                return;
            }
        }
        if check_only {
            let _ = reply.send(Ok(WriteResult::Applied {
                revision: self.store.current_revision(),
            }));
            return;
        }
        self.next_request_id += 1;
        let context = cairn_proto::cairnpb::ConfChangeContext {
            request_id: self.next_request_id,
            proposer: self.member_id,
            member: Some(member),
        };
        let cc = ConfChange {
            id: self.next_request_id,
            change_type: change as i32,
            node_id: id,
            context: Bytes::from(context.encode_to_vec()),
        };
        self.conf_change_queue.push_back((cc, reply));
        self.propose_queued_conf_changes();
    }

    /// Proposes the queued membership changes Raft will take now: one at a
    /// time, each after the previous one is applied.
    fn propose_queued_conf_changes(&mut self) {
        while let Some((cc, reply)) = self.conf_change_queue.pop_front() {
            if reply.is_closed() {
                continue;
            }
            match self.node.propose_conf_change(&cc) {
                Ok(()) => {
                    self.waiters.insert(
                        cc.id,
                        Waiter {
                            since: Instant::now(),
                            reply,
                        },
                    );
                }
                Err(raft::RaftError::ConfChangePending { .. }) => {
                    self.conf_change_queue.push_front((cc, reply));
                    return;
                }
                Err(e) => {
                    let _ = reply.send(Err(match e {
                        raft::RaftError::NoLeader { .. } | raft::RaftError::NotMember { .. } => {
                            ApiError::NotLeader { leader: raft::NONE }
                        }
                        raft::RaftError::TransferInProgress { .. } => ApiError::LeaderChanged,
                        raft::RaftError::UncommittedLimit { .. } => ApiError::TooManyRequests,
                        other => self.storage_error(other.to_string()),
                    }));
                }
            }
        }
    }

    /// What an applied membership change means beyond Raft: the member table,
    /// this shard's links, and the waiting client.
    fn applied_conf_change(&mut self, cc: &ConfChange, conf_state: &ConfState) {
        use cairn_proto::cairnpb::ConfChangeContext;
        let ctx = match ConfChangeContext::decode(cc.context.clone()) {
            Ok(ctx) => ctx,
            Err(e) => {
                tracing::warn!(shard = self.id, error = %e, "conf change context does not decode");
                ConfChangeContext::default()
            }
        };
        let id = cc.node_id;
        self.membership_changed(conf_state);
        // Links are per shard; the member table follows shard 0 alone, so
        // every member changes it in the same order (changes go through
        // shard 0 first when adding and last when removing).
        let table_shard = self.id == 0;
        let result = match (raft::ConfChangeType::try_from(cc.change_type), &ctx.member) {
            (Ok(raft::ConfChangeType::ConfChangeRemoveNode), _) => {
                if id != self.member_id {
                    self.peers.disconnect(self.id, id);
                }
                match (table_shard, id == self.member_id) {
                    (false, _) => Ok(()),
                    (true, false) => self.members.remove(id),
                    (true, true) => {
                        tracing::warn!(
                            shard = self.id,
                            "this member's removal from the cluster is applied"
                        );
                        self.members.mark_removed()
                    }
                }
            }
            (Ok(_), Some(member)) if member.id == id => {
                if id != self.member_id {
                    self.peers.connect(self.id, id, &member.peer_urls);
                }
                self.members.accept(id);
                if table_shard {
                    let mut member = member.clone();
                    member.is_learner = conf_state.learners.contains(&id);
                    self.members.upsert(&member)
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        };
        if let Err(e) = result {
            // Like a failed store commit: the change is applied in Raft but
            // not recorded, so nothing more is acknowledged; a restart
            // replays the entry (the store's applied index was not
            // committed past it) and records it.
            self.fail(format!("writing member.toml failed: {e}"));
        }
        if ctx.proposer == self.member_id {
            if let Some(w) = self.waiters.remove(&ctx.request_id) {
                let _ = w.reply.send(Ok(WriteResult::Applied {
                    revision: self.store.current_revision(),
                }));
            }
        }
    }

    /// Queues a write until a leader takes proposals; hands it back, refused,
    /// when too many already wait.
    fn hold_write(&mut self, write: HeldWrite) -> Option<HeldWrite> {
        let bytes = write.bytes();
        if self.leaderless_writes.len() + self.leaderless_reads.len() >= MAX_LEADERLESS_REQUESTS
            || self.leaderless_write_bytes + bytes > MAX_LEADERLESS_WRITE_BYTES
        {
            return Some(write);
        }
        self.leaderless_write_bytes += bytes;
        self.leaderless_writes.push_back((Instant::now(), write));
        None
    }

    fn next_held_write(&mut self) -> Option<(Instant, HeldWrite)> {
        let held = self.leaderless_writes.pop_front()?;
        self.leaderless_write_bytes -= held.1.bytes();
        Some(held)
    }

    /// Follows a change of the shard's voters and learners (applied, or
    /// installed with a snapshot): whether this member is a learner, and the
    /// member leadership keeps spreading to.
    fn membership_changed(&mut self, cs: &ConfState) {
        self.is_learner = cs.learners.contains(&self.member_id);
        let preferred = super::members::preferred_leader(&cs.voters, self.id);
        if preferred != self.preferred_leader {
            self.preferred_leader = preferred;
            self.leader_since = self.leader_since.map(|_| Instant::now());
        }
    }

    /// Sends requests that waited for a leader, once one is known.
    fn release_leaderless(&mut self) {
        if self.node.leader_id() == raft::NONE {
            return;
        }
        if self.takes_proposals() {
            while let Some((_, write)) = self.next_held_write() {
                match write {
                    HeldWrite::Local(request, reply) => self.propose(request, reply),
                    HeldWrite::Forwarded(msg) => self.step(msg),
                }
            }
        }
        for (_, read) in std::mem::take(&mut self.leaderless_reads) {
            self.reads_this_turn.push(read);
        }
    }

    fn start_read_round(&mut self) {
        if self.reads_this_turn.is_empty() {
            return;
        }
        if self.node.leader_id() == raft::NONE {
            let now = Instant::now();
            for r in self.reads_this_turn.drain(..) {
                if self.leaderless_writes.len() + self.leaderless_reads.len()
                    >= MAX_LEADERLESS_REQUESTS
                {
                    let _ = r.reply.send(Err(ApiError::NoLeader));
                } else {
                    self.leaderless_reads.push((now, r));
                }
            }
            return;
        }
        let reads = std::mem::take(&mut self.reads_this_turn);
        let ctx = self.next_read_ctx;
        self.next_read_ctx += 1;
        // Contexts are unique across members and restarts: a leader ignores a
        // context already pending, and a late answer to an earlier incarnation
        // must never confirm a new read.
        let mut context = Vec::with_capacity(24);
        context.extend_from_slice(&self.member_id.to_le_bytes());
        context.extend_from_slice(&self.boot_nonce.to_le_bytes());
        context.extend_from_slice(&ctx.to_le_bytes());
        match self.node.read_index(Bytes::from(context)) {
            Ok(()) => {
                self.read_rounds.insert(
                    ctx,
                    ReadRound {
                        since: Instant::now(),
                        reads,
                    },
                );
            }
            Err(_) => {
                for r in reads {
                    let _ = r.reply.send(Err(ApiError::NoLeader));
                }
            }
        }
    }

    /// Answers requests that waited too long: their clients have given up.
    fn expire(&mut self) {
        let now = Instant::now();
        while self
            .leaderless_writes
            .front()
            .is_some_and(|(since, _)| now.duration_since(*since) >= LEADERLESS_WAIT)
        {
            if let Some((_, HeldWrite::Local(_, reply))) = self.next_held_write() {
                let _ = reply.send(Err(ApiError::NoLeader));
            }
        }
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.leaderless_reads)
            .into_iter()
            .partition(|(since, _)| now.duration_since(*since) >= LEADERLESS_WAIT);
        self.leaderless_reads = waiting;
        for (_, r) in expired {
            let _ = r.reply.send(Err(ApiError::NoLeader));
        }
        self.waiters
            .retain(|_, w| now.duration_since(w.since) < REQUEST_TIMEOUT && !w.reply.is_closed());
        let expired: Vec<u64> = self
            .read_rounds
            .iter()
            .filter(|(_, r)| now.duration_since(r.since) >= REQUEST_TIMEOUT)
            .map(|(&ctx, _)| ctx)
            .collect();
        for ctx in expired {
            if let Some(round) = self.read_rounds.remove(&ctx) {
                for r in round.reads {
                    let _ = r.reply.send(Err(ApiError::Timeout));
                }
            }
        }
    }

    fn read_error(&self, e: mvcc::ReadError) -> ApiError {
        match e {
            mvcc::ReadError::Compacted { .. } => ApiError::Compacted,
            mvcc::ReadError::FutureRevision { .. } => ApiError::FutureRev,
            mvcc::ReadError::EmptyKey => ApiError::EmptyKey,
            other => self.storage_error(other.to_string()),
        }
    }

    fn serve_range(&self, request: &RangeRequest) -> Result<RangeResponse, ApiError> {
        self.store
            .range(&convert::range_from_pb(request))
            .map(|r| convert::range_to_pb(r, self.header(0)))
            .map_err(|e| self.read_error(e))
    }

    fn serve_confirmed_reads(&mut self) {
        let applied = self.node.applied_index();
        while let Some(entry) = self.confirmed_reads.first_entry() {
            if *entry.key() > applied {
                break;
            }
            for r in entry.remove() {
                let _ = r.reply.send(self.serve_range(&r.request));
            }
        }
    }

    async fn handle_ready(&mut self, mut rd: Ready) {
        if let Some(ss) = rd.soft_state {
            tracing::info!(
                shard = self.id,
                term = self.node.term(),
                leader = ss.leader_id,
                role = ?ss.role,
                "raft role changed"
            );
            // Proposals this member made may still commit under a new leader;
            // their waiters stay and are answered on apply, or expire.
            self.leader_since = (ss.role == StateRole::Leader).then(Instant::now);
            self.lease_role_changed(ss.role == StateRole::Leader);
            // A leader change drops ReadIndex rounds in flight; asking again is
            // always safe.
            for (_, round) in self.read_rounds.drain() {
                self.reads_this_turn.extend(round.reads);
            }
            let known = ss.leader_id != raft::NONE;
            if let Some(m) = &self.metrics {
                m.set_leader(known, ss.leader_id == self.member_id, true);
                m.set_term(self.node.term());
            }
            if let Some(r) = &self.readiness {
                r.set_shard_has_leader(self.id, known);
            }
        }
        for m in std::mem::take(&mut rd.messages) {
            self.send(m);
        }
        let committed = std::mem::take(&mut rd.committed_entries);
        let mut read_states = std::mem::take(&mut rd.read_states);
        if rd.snapshot.is_some() {
            // A snapshot replaces the store and the log: it is installed with
            // no other write in flight, and durable before anything else.
            if !self.wait_for_writes().await {
                return;
            }
            if !self.persist(&mut rd).await {
                // Nothing of this Ready is durable: none of it may take effect.
                return;
            }
            for m in std::mem::take(&mut rd.persisted_messages) {
                self.send(m);
            }
            self.node.advance_append(rd);
        } else if !self.queue_write(rd).await {
            return;
        }
        // Raft hands out only entries already durable here (async_append).
        let apply_started = Instant::now();
        self.apply(&committed);
        if self.failed.is_some() {
            // Not everything committed was applied: Raft must not be told it
            // was, and no read may be served from this store.
            return;
        }
        if let Some(m) = &self.metrics {
            if !committed.is_empty() && apply_started.elapsed() >= SLOW_APPLY {
                m.slow_apply();
            }
        }
        for rs in std::mem::take(&mut read_states) {
            let ctx = read_context_counter(&rs.request_ctx, self.member_id, self.boot_nonce);
            if let Some(round) = self.read_rounds.remove(&ctx) {
                self.confirmed_reads
                    .entry(rs.index)
                    .or_default()
                    .extend(round.reads);
            }
        }
        self.node.on_entries_applied(&committed);
        if !self.conf_change_queue.is_empty() {
            self.propose_queued_conf_changes();
        }
        self.record_progress();
        self.serve_confirmed_reads();
        self.maybe_compact_log();
    }

    /// Exports indexes and sizes, and tells readiness once the shard has caught
    /// up (a leader is known and everything it committed is applied here).
    fn record_progress(&mut self) {
        let committed = self.node.committed_index();
        let applied = self.node.applied_index();
        if let Some(m) = &self.metrics {
            m.set_committed_index(committed);
            m.set_applied_index(applied);
            let pending = self.waiters.len() as i64;
            m.proposals_pending_add(pending - self.pending_reported);
            self.pending_reported = pending;
        }
        if !self.reported_caught_up && self.node.leader_id() != raft::NONE && applied >= committed {
            self.reported_caught_up = true;
            let n = self
                .caught_up
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            if n == self.shard_count {
                if let Some(r) = &self.readiness {
                    r.set_caught_up(true);
                }
            }
        }
    }

    fn send(&mut self, m: raft::Message) {
        let to = m.to;
        if m.msg_type == raft::MessageType::MsgSnap as i32 {
            self.send_snapshot(m);
            return;
        }
        if !self.peers.send(self.id, m) {
            self.node.report_unreachable(to);
        }
    }

    /// Streams the store to a follower that is behind the log. The snapshot
    /// Raft asked for covers up to the compaction index; the store has applied
    /// further, so the message is restamped with the store's applied index and
    /// its term: the follower then resumes the log right after what it got.
    fn send_snapshot(&mut self, mut m: raft::Message) {
        let to = m.to;
        if self.snapshots_in_flight.contains(&to) {
            return;
        }
        let Some(link) = self.peers.link(self.id, to) else {
            self.node.report_snapshot(to, raft::SnapshotStatus::Failure);
            return;
        };
        let stream = self.store.snapshot_stream();
        let index = stream.applied_index();
        let Some(term) = self.node.term_of(index) else {
            tracing::warn!(
                shard = self.id,
                index,
                "no term for the store's applied index; snapshot not sent"
            );
            self.node.report_snapshot(to, raft::SnapshotStatus::Failure);
            return;
        };
        // The member table rides along: a member that catches up by snapshot
        // may have missed the changes that added members.
        m.context = Bytes::from(self.members.table().encode_to_vec());
        m.snapshot = Some(Snapshot {
            data: Bytes::new(),
            metadata: Some(SnapshotMetadata {
                conf_state: Some(self.node.status().conf_state),
                index,
                term,
            }),
        });
        tracing::info!(shard = self.id, to, index, "sending snapshot");
        self.snapshots_in_flight.insert(to);
        let reports = self.snapshot_reports_tx.clone();
        let shard = self.id;
        let progress = Rc::new(std::cell::Cell::new(Instant::now()));
        let mut source = StoreSnapshotSource {
            message: Some(Bytes::from(m.encode_to_vec())),
            stream,
            pending: None,
            started: false,
            bytes: 0,
            progress: progress.clone(),
        };
        tokio::task::spawn_local(async move {
            let stalled = async {
                loop {
                    let idle = progress.get().elapsed();
                    if idle >= SNAPSHOT_SEND_IDLE_TIMEOUT {
                        return;
                    }
                    tokio::time::sleep(SNAPSHOT_SEND_IDLE_TIMEOUT - idle).await;
                }
            };
            let sent = tokio::select! {
                r = link.send_stream(shard, &mut source) => Ok(r),
                () = stalled => Err(()),
            };
            let status = match sent {
                Ok(Ok(_)) => {
                    tracing::info!(shard, to, index, bytes = source.bytes, "snapshot sent");
                    raft::SnapshotStatus::Finish
                }
                Ok(Err(e)) => {
                    tracing::warn!(shard, to, error = %e, "snapshot transfer failed");
                    raft::SnapshotStatus::Failure
                }
                Err(_) => {
                    tracing::warn!(
                        shard,
                        to,
                        idle_s = SNAPSHOT_SEND_IDLE_TIMEOUT.as_secs(),
                        "snapshot transfer made no progress; abandoned"
                    );
                    raft::SnapshotStatus::Failure
                }
            };
            let _ = reports.send((to, status));
        });
    }

    /// Replaces the store with the snapshot Raft accepted, crash-safely: the new
    /// store is built beside the old one, then the directories are swapped.
    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), String> {
        let md = snapshot.metadata.clone().unwrap_or_default();
        let Some(incoming) = self.incoming_snapshots.remove(&md.index) else {
            return Err(format!(
                "raft accepted a snapshot at index {} but the data held is for {:?}",
                md.index,
                self.incoming_snapshots.keys().collect::<Vec<_>>()
            ));
        };
        // Older snapshots are behind the one installed now.
        self.incoming_snapshots.retain(|&i, _| i > md.index);
        let IncomingSnapshot { chunks, members } = incoming;
        let new_dir = swap_dir(&self.dir, "new");
        let old_dir = swap_dir(&self.dir, "old");
        let _ = std::fs::remove_dir_all(&new_dir);
        let store = mvcc::Store::restore(&new_dir, self.id, self.store_config.clone(), chunks)
            .map_err(|e| format!("restoring the store from a snapshot: {e}"))?;
        if store.applied_index() != md.index {
            return Err(format!(
                "the snapshot's store has applied index {}, its metadata says {}",
                store.applied_index(),
                md.index
            ));
        }
        write_snapshot_meta(&new_dir, &md)
            .map_err(|e| format!("writing snapshot metadata: {e}"))?;
        let old = std::mem::replace(&mut self.store, store);
        drop(old);
        let swap = || -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&old_dir);
            std::fs::rename(&self.dir, &old_dir)?;
            std::fs::rename(&new_dir, &self.dir)?;
            if let Some(parent) = self.dir.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
            std::fs::remove_dir_all(&old_dir)
        };
        swap().map_err(|e| format!("swapping in the snapshot's store: {e}"))?;
        self.snapshot_meta = md.clone();
        if let (0, Some(table)) = (self.id, members) {
            // The table as of the snapshot's index (see applied_conf_change).
            if let Err(e) = self.members.replace_table(&table) {
                return Err(format!("writing member.toml: {e}"));
            }
        }
        let cs = md.conf_state.clone().unwrap_or_default();
        self.membership_changed(&cs);
        for id in cs.voters.iter().chain(&cs.learners) {
            if *id == self.member_id {
                continue;
            }
            if let Some(m) = self.members.get(*id) {
                self.peers.connect(self.id, *id, &m.peer_urls);
            }
        }
        tracing::info!(
            shard = self.id,
            index = md.index,
            term = md.term,
            "snapshot installed"
        );
        Ok(())
    }

    /// The WAL records of a Ready without a snapshot: its entries, and the
    /// hard state when it must be synced (a commit-only change rides along).
    fn wal_records(&mut self, rd: &Ready) -> Vec<cairn_wal::Record> {
        let mut records = Vec::with_capacity(rd.entries.len() + 1);
        for e in &rd.entries {
            records.push(entry::to_wal(self.id, e));
        }
        if let Some(hs) = rd.hard_state {
            self.unsynced_hard_state = Some(hs);
        }
        if rd.must_sync || !records.is_empty() {
            if let Some(hs) = self.unsynced_hard_state.take() {
                records.push(cairn_wal::Record::HardState {
                    shard: u64::from(self.id),
                    state: cairn_wal::HardState {
                        term: hs.term,
                        vote: hs.vote,
                        commit: hs.commit,
                    },
                });
            }
        }
        records
    }

    /// Queues the Ready's records in the WAL without waiting for them. The
    /// rest of the Ready (its entries for the in-memory log, the messages that
    /// wait for durability) is finished by [`Shard::complete_writes`] once
    /// the records, and every record queued before them, are durable.
    async fn queue_write(&mut self, rd: Ready) -> bool {
        let records = self.wal_records(&rd);
        if !records.is_empty() {
            match self.wal.submit(&records).await {
                Ok(lsn) => self.last_queued_lsn = lsn,
                Err(e) => {
                    // The WAL is poisoned: nothing more can be made durable.
                    // Stop acknowledging anything; the member must be restarted.
                    self.fail(format!("WAL append failed: {e}"));
                    return false;
                }
            }
        }
        self.in_flight.push_back(InFlightWrite {
            lsn: self.last_queued_lsn,
            rd,
        });
        true
    }

    /// Finishes, oldest first, every queued write that is now durable.
    fn complete_writes(&mut self) {
        let durable = self.durable.durable_lsn();
        while self.in_flight.front().is_some_and(|w| w.lsn <= durable) {
            let Some(w) = self.in_flight.pop_front() else {
                break;
            };
            if self.failed.is_some() {
                return;
            }
            let mut rd = w.rd;
            self.stage_in_log(&rd);
            for m in std::mem::take(&mut rd.persisted_messages) {
                self.send(m);
            }
            self.node.advance_append(rd);
        }
    }

    /// Why the WAL stopped making writes durable.
    fn wal_failure(&self) -> String {
        let cause = match self.wal.poisoned() {
            Some(p) => cairn_wal::AppendError::from(&p),
            None => cairn_wal::AppendError::Closed,
        };
        format!("WAL append failed: {cause}")
    }

    /// Waits until every queued write is durable and finishes them all.
    async fn wait_for_writes(&mut self) -> bool {
        if !self.in_flight.is_empty() && !self.durable.wait_for(self.last_queued_lsn).await {
            self.fail(self.wal_failure());
            return false;
        }
        self.complete_writes();
        self.failed.is_none()
    }

    /// Hands a durable Ready's hard state and entries to the in-memory log
    /// Raft reads from.
    fn stage_in_log(&mut self, rd: &Ready) {
        let store = self.node.store_mut();
        if let Some(hs) = rd.hard_state {
            store.set_hard_state(hs);
        }
        if !rd.entries.is_empty() {
            // Entries from a peer are slices of the transport's receive buffers;
            // the in-memory log keeps thousands of them, so each gets its own
            // small allocation instead of pinning a whole buffer.
            let owned: Vec<raft::Entry> = rd
                .entries
                .iter()
                .map(|e| raft::Entry {
                    data: Bytes::copy_from_slice(&e.data),
                    ..e.clone()
                })
                .collect();
            store.append(&owned);
        }
    }

    /// Installs the Ready's snapshot and makes it durable in the WAL with the
    /// Ready's entries and hard state, waiting for the flush, then hands them
    /// to the in-memory log Raft reads from. Only for a Ready with a snapshot:
    /// every other Ready is queued with [`Shard::queue_write`].
    async fn persist(&mut self, rd: &mut Ready) -> bool {
        let mut records = Vec::with_capacity(rd.entries.len() + 2);
        if let Some(snapshot) = &rd.snapshot {
            if let Err(e) = self.install_snapshot(snapshot) {
                self.fail(e);
                return false;
            }
            // The log restarts after the snapshot: whatever the WAL holds past it
            // belongs to the old log.
            let index = snapshot.metadata.as_ref().map_or(0, |m| m.index);
            records.push(cairn_wal::Record::Truncate {
                shard: u64::from(self.id),
                index: index + 1,
            });
        }
        records.extend(self.wal_records(rd));
        if !records.is_empty() {
            match self.wal.append(&records).await {
                Ok(lsn) => self.last_queued_lsn = lsn,
                Err(e) => {
                    // The WAL is poisoned: nothing more can be made durable.
                    // Stop acknowledging anything; the member must be restarted.
                    self.fail(format!("WAL append failed: {e}"));
                    return false;
                }
            }
        }
        if let Some(snapshot) = &rd.snapshot {
            if let Err(e) = self.node.store_mut().apply_snapshot(snapshot.clone()) {
                let reason = format!("installing snapshot in the raft log: {e}");
                self.fail(reason);
                return false;
            }
        }
        self.stage_in_log(rd);
        true
    }

    /// A failure of this shard's storage, as clients see it.
    fn storage_error(&self, reason: impl Into<String>) -> ApiError {
        ApiError::Storage {
            shard: self.id,
            reason: reason.into(),
        }
    }

    fn fail(&mut self, reason: String) {
        tracing::error!(shard = self.id, reason = %reason, "shard failed; restart the member");
        let err = self.storage_error(reason.clone());
        for (_, w) in self.waiters.drain() {
            let _ = w.reply.send(Err(err.clone()));
        }
        let reads = self
            .read_rounds
            .drain()
            .flat_map(|(_, r)| r.reads)
            .chain(
                std::mem::take(&mut self.confirmed_reads)
                    .into_values()
                    .flatten(),
            )
            .chain(self.reads_this_turn.drain(..))
            .chain(
                std::mem::take(&mut self.leaderless_reads)
                    .into_iter()
                    .map(|(_, r)| r),
            )
            .collect::<Vec<_>>();
        for r in reads {
            let _ = r.reply.send(Err(err.clone()));
        }
        while let Some((_, write)) = self.next_held_write() {
            if let HeldWrite::Local(_, reply) = write {
                let _ = reply.send(Err(err.clone()));
            }
        }
        self.failed = Some(reason);
    }

    fn apply(&mut self, entries: &[raft::Entry]) {
        if entries.is_empty() {
            return;
        }
        for e in entries {
            if self.failed.is_some() {
                return;
            }
            match EntryType::try_from(e.entry_type) {
                Ok(EntryType::EntryConfChange) => {
                    match ConfChange::decode(e.data.clone()) {
                        Ok(cc) => {
                            let cs = self.node.apply_conf_change(&cc);
                            self.applied_conf_change(&cc, &cs);
                        }
                        Err(err) => self.fail(format!(
                            "conf change entry {} does not decode: {err}",
                            e.index
                        )),
                    }
                    self.store.set_applied_index(e.index);
                }
                _ => self.apply_normal(e),
            }
        }
        if self.store.pending_bytes() >= STORE_COMMIT_PENDING_BYTES {
            self.commit_store();
        }
        self.check_quota();
        if !self.watchers.is_empty() {
            self.watchers.notify(self.id, &self.store);
        }
    }

    /// Writes what was applied since the last commit to the store file. Off the
    /// write path: the WAL already made every applied entry durable, so a commit
    /// only bounds how much a restart replays.
    fn commit_store(&mut self) {
        let started = Instant::now();
        match self.store.commit() {
            Ok(wrote) => {
                if wrote {
                    if let Some(m) = &self.metrics {
                        m.backend_commit(started.elapsed());
                        m.set_db_size(self.store.size_bytes(), self.store.size_in_use_bytes());
                    }
                    tracing::trace!(
                        shard = self.id,
                        applied = self.store.applied_index(),
                        took_us = started.elapsed().as_micros() as u64,
                        "store committed"
                    );
                }
            }
            Err(e) => self.fail(format!("store commit failed: {e}")),
        }
    }

    fn defragment(&mut self) -> Result<(), ApiError> {
        if let Some(reason) = &self.failed {
            return Err(self.storage_error(reason.clone()));
        }
        let started = Instant::now();
        match self.store.defragment() {
            Ok(report) => {
                tracing::info!(
                    shard = self.id,
                    before_bytes = report.file_bytes_before,
                    after_bytes = report.file_bytes_after,
                    took_ms = started.elapsed().as_millis() as u64,
                    "store defragmented"
                );
                if let Some(m) = &self.metrics {
                    m.set_db_size(self.store.size_bytes(), self.store.size_in_use_bytes());
                }
                Ok(())
            }
            Err(e) => {
                // The store may be part way through moving pages: like a
                // failed commit, nothing more is trusted until restart.
                let reason = format!("defragment failed: {e}");
                self.fail(reason.clone());
                Err(self.storage_error(reason))
            }
        }
    }

    fn check_quota(&mut self) {
        if !self.nospace_alarm && self.store.size_in_use_bytes() > self.quota_backend_bytes {
            tracing::warn!(
                shard = self.id,
                size_bytes = self.store.size_in_use_bytes(),
                quota_bytes = self.quota_backend_bytes,
                "backend quota exceeded: NOSPACE alarm raised; compact, then disarm the alarm"
            );
            self.nospace_alarm = true;
            if let Some(r) = &self.readiness {
                r.set_alarm(crate::ops::readiness::Alarm::NoSpace, true);
            }
        }
    }

    fn apply_normal(&mut self, e: &raft::Entry) {
        if self.store.pending_bytes() >= STORE_COMMIT_PENDING_BYTES {
            self.commit_store();
        }
        if e.data.is_empty() {
            self.store.set_applied_index(e.index);
            return;
        }
        let req = match ShardRequest::decode(e.data.clone()) {
            Ok(r) => r,
            Err(err) => {
                self.fail(format!("entry {} does not decode: {err}", e.index));
                return;
            }
        };
        let mine = req.member == self.member_id;
        let result = match req.request {
            Some(r) => self.apply_request(e.index, r),
            None => {
                self.store.set_applied_index(e.index);
                Ok(WriteResult::Applied {
                    revision: self.store.current_revision(),
                })
            }
        };
        if mine {
            if let Some(w) = self.waiters.remove(&req.id) {
                let _ = w.reply.send(result);
            }
        }
    }

    fn apply_error(&mut self, e: mvcc::ApplyError) -> ApiError {
        match e {
            mvcc::ApplyError::Compacted { .. } => ApiError::Compacted,
            mvcc::ApplyError::FutureRevision { .. } => ApiError::FutureRev,
            mvcc::ApplyError::EmptyKey => ApiError::EmptyKey,
            mvcc::ApplyError::LeaseNotFound { .. } => ApiError::LeaseNotFound,
            mvcc::ApplyError::LeaseExists { .. } => ApiError::LeaseExist,
            mvcc::ApplyError::ValueProvided => ApiError::ValueProvided,
            mvcc::ApplyError::LeaseProvided => ApiError::LeaseProvided,
            mvcc::ApplyError::DuplicateKey => ApiError::DuplicateKey,
            mvcc::ApplyError::RequestTooLarge { .. } => ApiError::RequestTooLarge,
            mvcc::ApplyError::Read(r) => self.read_error(r),
            other if other.is_request_error() => self.storage_error(other.to_string()),
            other => {
                let reason = other.to_string();
                self.fail(reason.clone());
                self.storage_error(reason)
            }
        }
    }

    fn apply_request(
        &mut self,
        index: u64,
        r: shard_request::Request,
    ) -> Result<WriteResult, ApiError> {
        use shard_request::Request as R;
        // The leader's lease clock follows the grants and revokes it applies.
        let lease_change = match &r {
            R::LeaseGrant(g) => Some((g.id, Some(g.ttl))),
            R::LeaseRevoke(g) => Some((g.id, None)),
            _ => None,
        };
        let op = match r {
            R::Put(p) => mvcc::Op::Put(convert::put_from_pb(&p)),
            R::DeleteRange(d) => mvcc::Op::DeleteRange(convert::delete_from_pb(&d)),
            R::Txn(t) => mvcc::Op::Txn(convert::txn_from_pb(&t)),
            R::Compaction(c) => mvcc::Op::Compact(mvcc::CompactionRequest {
                revision: c.revision,
            }),
            R::LeaseGrant(g) => mvcc::Op::LeaseGrant {
                id: g.id,
                ttl_secs: g.ttl,
            },
            R::LeaseRevoke(g) => mvcc::Op::LeaseRevoke { id: g.id },
            R::Alarm(a) => {
                self.store.set_applied_index(index);
                if a.alarm == pb::AlarmType::Nospace as i32 {
                    match pb::alarm_request::AlarmAction::try_from(a.action) {
                        Ok(pb::alarm_request::AlarmAction::Activate) => self.nospace_alarm = true,
                        Ok(pb::alarm_request::AlarmAction::Deactivate) => {
                            self.nospace_alarm = false
                        }
                        _ => {}
                    }
                }
                return Ok(WriteResult::Applied {
                    revision: self.store.current_revision(),
                });
            }
            R::ConfChange(_) => {
                // Conf changes arrive as conf change entries; one inside a
                // normal entry is a proposer bug, recorded and skipped.
                tracing::error!(
                    shard = self.id,
                    index,
                    "conf change inside a normal entry skipped"
                );
                self.store.set_applied_index(index);
                return Err(ApiError::Unsupported("conf change as a normal entry"));
            }
        };
        let applied = self.store.apply(index, &op);
        if let Some((id, ttl)) = lease_change {
            match (ttl, &applied) {
                (Some(ttl), Ok(_)) => self.lease_clock.granted(id, ttl, Instant::now()),
                (Some(_), Err(_)) => {}
                (None, _) => self.lease_clock.revoked(id),
            }
        }
        match applied {
            Ok(result) => {
                let header = self.header(0);
                Ok(match result {
                    mvcc::OpResult::Put(r) => WriteResult::Put(convert::put_to_pb(r, header)),
                    mvcc::OpResult::DeleteRange(r) => {
                        WriteResult::DeleteRange(convert::delete_to_pb(r, header))
                    }
                    mvcc::OpResult::Txn(r) => WriteResult::Txn(convert::txn_to_pb(r, header)),
                    mvcc::OpResult::Compact(r) => WriteResult::Compaction(pb::CompactionResponse {
                        header: Some(self.header(r.revision)),
                    }),
                    mvcc::OpResult::LeaseGrant { revision }
                    | mvcc::OpResult::LeaseRevoke { revision, .. }
                    | mvcc::OpResult::LeaseCheckpoint { revision } => {
                        WriteResult::Applied { revision }
                    }
                })
            }
            // A request error still consumed the entry; the store recorded it
            // applied.
            Err(e) => Err(self.apply_error(e)),
        }
    }

    /// Compacts the in-memory log once enough entries are applied, keeping
    /// [`CATCH_UP_ENTRIES`] for slow followers, and lets the WAL release the
    /// segments the shard no longer needs.
    fn maybe_compact_log(&mut self) {
        let applied = self.node.applied_index();
        // A small --snapshot-count also keeps fewer entries for slow followers.
        let keep = CATCH_UP_ENTRIES.min(self.snapshot_count);
        if applied < self.snapshot_meta.index + self.snapshot_count + keep {
            return;
        }
        let compact_to = applied - keep;
        // The store must have the entries up to compact_to durably applied
        // before the WAL may drop them: its commit finishes in the background,
        // so compaction goes only as far as the store has proven durable, and
        // waits for a later turn otherwise.
        self.commit_store();
        if self.failed.is_some() {
            return;
        }
        let compact_to = compact_to.min(self.store.durable_index());
        if compact_to <= self.snapshot_meta.index {
            return;
        }
        let Some(term) = self.node.term_of(compact_to) else {
            return;
        };
        let md = SnapshotMetadata {
            conf_state: Some(self.node.status().conf_state),
            index: compact_to,
            term,
        };
        if let Err(e) = write_snapshot_meta(&self.dir, &md) {
            tracing::warn!(shard = self.id, error = %e, "writing snapshot metadata failed; log not compacted");
            return;
        }
        let conf_state = md.conf_state.clone().unwrap_or_default();
        if let Err(e) = self
            .node
            .store_mut()
            .create_snapshot(compact_to, conf_state, Bytes::new())
        {
            tracing::warn!(shard = self.id, error = %e, "recording the log snapshot failed; log not compacted");
            return;
        }
        if let Err(e) = self.node.store_mut().compact(compact_to) {
            tracing::warn!(shard = self.id, error = %e, "in-memory log compaction failed");
            return;
        }
        self.snapshot_meta = md;
        self.wal.release(u64::from(self.id), compact_to);
        tracing::debug!(shard = self.id, index = compact_to, "raft log compacted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_net::StreamSource as _;

    fn store_with_keys(dir: &std::path::Path, n: usize) -> mvcc::Store {
        let mut store = mvcc::Store::open(dir, 0, mvcc::Config::default()).unwrap();
        for i in 0..n {
            let put = pb::PutRequest {
                key: Bytes::from(format!("/k/{i:05}")),
                value: Bytes::from(vec![b'v'; 300]),
                ..Default::default()
            };
            store
                .apply(i as u64 + 1, &mvcc::Op::Put(convert::put_from_pb(&put)))
                .unwrap();
        }
        store.commit().unwrap();
        store
    }

    #[test]
    fn a_snapshot_read_as_it_is_sent_restores_the_same_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_keys(&dir.path().join("a"), 3_000);
        let msg = raft::Message {
            msg_type: raft::MessageType::MsgSnap as i32,
            to: 2,
            from: 1,
            term: 3,
            ..Default::default()
        };
        let mut source = StoreSnapshotSource {
            message: Some(Bytes::from(msg.encode_to_vec())),
            stream: store.snapshot_stream(),
            pending: None,
            started: false,
            bytes: 0,
            progress: Rc::new(std::cell::Cell::new(Instant::now())),
        };
        source.rewind().unwrap();
        let mut parts = Vec::new();
        while let Some(b) = source.next_chunk(64 * 1024).unwrap() {
            parts.push(b);
        }
        // Once read from, it cannot start over: the transfer fails instead.
        assert!(source.rewind().is_err());
        assert_eq!(
            source.bytes,
            parts.iter().map(|p| p.len() as u64).sum::<u64>()
        );
        let (got, chunks) = decode_snapshot_stream(parts).unwrap();
        assert_eq!(got, msg);
        let restored =
            mvcc::Store::restore(&dir.path().join("b"), 0, mvcc::Config::default(), chunks)
                .unwrap();
        assert_eq!(restored.applied_index(), 3_000);
        assert_eq!(
            restored.hash_kv(0).unwrap().hash,
            store.hash_kv(0).unwrap().hash
        );
    }

    #[test]
    fn a_truncated_snapshot_stream_is_an_error() {
        let msg = raft::Message::default().encode_to_vec();
        let mut whole = (msg.len() as u32).to_le_bytes().to_vec();
        whole.extend_from_slice(&msg);
        whole.extend_from_slice(&100u32.to_le_bytes());
        whole.extend_from_slice(b"short");
        let err = decode_snapshot_stream(vec![Bytes::from(whole)]).unwrap_err();
        assert!(err.contains("store chunk"), "{err}");
    }
}

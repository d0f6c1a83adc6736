//! What the keyspace layer asks of a shard driver, and what it answers: the
//! contract between the router above and the shards below, so that neither
//! needs the other's code.

use std::time::Duration;

use cairn_proto::cairnpb::{self, shard_request};
use cairn_proto::etcdserverpb as pb;
use cairn_proto::etcdserverpb::{
    CompactionResponse, DeleteRangeResponse, PutResponse, RangeRequest, RangeResponse, TxnRequest,
    TxnResponse,
};
use cairn_proto::mvccpb;
use tokio::sync::mpsc;

use crate::routing::ShardId;
use crate::server::errors::ApiError;

/// How long a client waits for its write to be committed and applied, or for a
/// linearizable read to be confirmed, before it gets etcd's timeout error. etcd's
/// own default is 7 s (5 s plus twice the election timeout); Cairn answers sooner
/// because leader failover takes well under 2 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Most leases one [`ShardCommand::LeaseRenew`] names: a follower's gathered
/// keep-alives for one leader and shard fit (see
/// `crate::server::member::peer_lease`), and the leader renews them all in
/// the turn the ReadIndex round comes back.
pub const MAX_LEASES_PER_RENEW: usize = 4096;

/// Where a linearizable read over several shards is read (docs/KEYSPACE.md,
/// "Consistent reads"): at `revision`, the keyspace leader's counter when the
/// read began, once the shard has applied up to `index`, which the leader's
/// ReadPoint gave after taking `revision`: every entry of the shard with a
/// revision up to it is at or below that index in the leader's log. The
/// entry there may not be committed yet, and a later leader may replace it
/// (and add a txn's part at its old revision after it): the read is served
/// only where the entry applied at `index` has the leader's `term` (the same
/// log up to it), else refused with [`ApiError::LeaderChanged`] and taken at
/// a new point. `index` and `term` 0: no wait, no check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAt {
    pub revision: i64,
    pub index: u64,
    pub term: u64,
}

impl ReadAt {
    /// At `revision` with no index to wait for and no term to check: a cut
    /// this member's shards reached (a serializable read), or a state the
    /// caller holds still.
    pub fn cut(revision: i64) -> ReadAt {
        ReadAt {
            revision,
            index: 0,
            term: 0,
        }
    }

    /// At a read point's `revision`, where a shard's part of it is `p`.
    pub fn point(revision: i64, p: ShardPoint) -> ReadAt {
        ReadAt {
            revision,
            index: p.index,
            term: p.term,
        }
    }
}

/// A shard leader's part of a read point: the index every entry proposed
/// before the point is at or below, and the term of its entry there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPoint {
    pub index: u64,
    pub term: u64,
}

/// What a write returned once applied.
#[derive(Debug, Clone)]
pub enum WriteResult {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compaction(CompactionResponse),
    /// Requests that only change shard-level state (alarms, leases) answer with
    /// the shard revision they were applied at.
    Applied {
        revision: i64,
    },
    /// The parts of several txns over several shards proposed in one entry:
    /// each part's answer, in the entry's order.
    Parts(Vec<Result<WriteResult, ApiError>>),
}

/// A shard's view of itself, for Status and readiness.
#[derive(Debug, Clone, Default)]
pub struct ShardStatus {
    pub shard: ShardId,
    pub leader: u64,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub revision: i64,
    pub compact_revision: i64,
    pub db_size_bytes: u64,
    pub db_size_in_use_bytes: u64,
    pub is_learner: bool,
    /// The shard's learners as this member has applied its membership.
    pub learners: Vec<u64>,
    /// The shard's store passed --quota-backend-bytes: writes that add data are
    /// refused until space is reclaimed and the alarm disarmed.
    pub nospace_alarm: bool,
}

/// What a shard's leader knows of a lease (see `crate::server::api::lease`).
#[derive(Debug, Clone, Default)]
pub struct LeaseInfo {
    /// The TTL the lease was granted with, in seconds.
    pub granted_ttl: i64,
    /// Time left before the leader revokes it.
    pub remaining: Duration,
    /// The shard's keys attached to it (empty unless asked for).
    pub keys: Vec<Vec<u8>>,
}

/// A shard's hash of its keyspace, for HashKV.
#[derive(Debug, Clone, Default)]
pub struct ShardHash {
    pub hash: u32,
    pub revision: i64,
    pub compact_revision: i64,
}

pub use crate::server::reply::Reply;

/// Work for a shard driver.
#[derive(Debug)]
pub enum ShardCommand {
    /// Replicate a write through Raft and answer once it is applied here.
    Write {
        request: shard_request::Request,
        reply: Reply<WriteResult>,
    },
    /// Read; a linearizable read (`serializable` false) first confirms through
    /// ReadIndex that this member has applied every write committed before it,
    /// unless `at` gives the point the keyspace leader already confirmed.
    Range {
        request: RangeRequest,
        at: Option<ReadAt>,
        reply: Reply<RangeResponse>,
    },
    /// etcd's read-only txn (every op of both branches a range, see
    /// [`crate::server::validate::txn_is_read_only`]), read as a range is:
    /// linearizable unless `serializable` (every range serializable), not
    /// through the log.
    ReadTxn {
        request: TxnRequest,
        serializable: bool,
        at: Option<ReadAt>,
        reply: Reply<TxnResponse>,
    },
    /// With several shards, the compares of a read-only txn over several
    /// shards: each over the keys of its range held by this shard (None
    /// where it holds none), read as `ReadTxn` reads (at `at` when given).
    ReadCompares {
        compares: Vec<pb::Compare>,
        serializable: bool,
        at: Option<ReadAt>,
        reply: Reply<Vec<Option<bool>>>,
    },
    /// With several shards: confirms through ReadIndex that this member
    /// leads the shard, and answers the index every entry proposed before the
    /// command arrived is at or below (see [`ReadAt`]).
    ReadPoint {
        reply: Reply<ShardPoint>,
    },
    Status {
        reply: Reply<ShardStatus>,
    },
    HashKv {
        revision: i64,
        reply: Reply<ShardHash>,
    },
    /// Registers a watcher; answers with the shard's current revision.
    Watch {
        key: WatcherKey,
        spec: WatchSpec,
        start_revision: i64,
        tx: mpsc::Sender<WatchBatch>,
        reply: Reply<i64>,
    },
    CancelWatch {
        key: WatcherKey,
        reply: Reply<()>,
    },
    /// Streams the shard's store (its snapshot stream) into `tx`; answers with
    /// the applied index the image is taken at.
    Snapshot {
        tx: mpsc::Sender<Result<Vec<u8>, String>>,
        reply: Reply<u64>,
    },
    /// Shrinks the shard's store file to what its live pages need.
    Defragment {
        reply: Reply<()>,
    },
    /// How far the watchers of one watch stream have been sent their events
    /// (the shard's revision when the stream has none here).
    WatchProgress {
        stream: u64,
        reply: Reply<i64>,
    },
    /// A membership change of this shard's Raft group, which only its leader
    /// carries out: elsewhere it is refused with [`ApiError::NotLeader`]
    /// naming the leader. Answered once applied here.
    ConfChange {
        change: crate::raft::ConfChangeType,
        member: cairn_proto::cairnpb::MemberInfo,
        /// Only check that the change would be carried out now.
        check_only: bool,
        reply: Reply<WriteResult>,
    },
    /// Restarts the TTL of every lease of `ids` (at most
    /// [`MAX_LEASES_PER_RENEW`]), once a ReadIndex round confirms that this
    /// member leads the shard. Only the shard's leader tracks lease TTLs:
    /// elsewhere the whole command is refused with [`ApiError::NotLeader`].
    /// Answers each lease's granted TTL in the order of `ids`, None where
    /// the shard has no such lease (or it expired). A keep-alive served here
    /// names one lease; the keep-alives a follower gathered for this leader
    /// come as one command.
    LeaseRenew {
        ids: Vec<i64>,
        reply: Reply<Vec<Option<i64>>>,
    },
    /// A lease's TTLs (and keys when `keys`), at the shard's leader only.
    LeaseQuery {
        id: i64,
        keys: bool,
        reply: Reply<Option<LeaseInfo>>,
    },
    /// The keys attached to a lease in this member's copy of the shard
    /// (None: no such lease), answered by any member.
    LeaseKeys {
        id: i64,
        reply: Reply<Option<Vec<Vec<u8>>>>,
    },
    /// The ids of the leases in this member's copy of the shard.
    LeaseList {
        reply: Reply<Vec<i64>>,
    },
    /// Hands the shard's leadership to member `to`, if this member leads it
    /// (etcd's MoveLeader); answered once the transfer has started.
    TransferLeader {
        to: u64,
        reply: Reply<()>,
    },
    /// A txn over several shards (docs/KEYSPACE.md, "Transactions over
    /// several shards") holds this shard: until it proposes its part or lets
    /// go, no entry of the shard gets a revision and read points wait.
    /// `txn` is a number the keyspace leader gave the txn. Once held (after
    /// the txns that held it before let go) and the entries proposed before
    /// that touch `keys` (every key range the txn names) are applied,
    /// answered with each compare over this shard's keys (see
    /// `mvcc::Store::compare_present`). Refused where this member does not
    /// take the shard's writes now.
    CrossHold {
        txn: u64,
        /// How many txns the hold serves (a batch, or 1).
        txns: u32,
        compares: Vec<pb::Compare>,
        keys: Vec<(bytes::Bytes, bytes::Bytes)>,
        reply: Reply<CrossHeld>,
    },
    /// Whether the held shard would apply `ops` at `revision` without a
    /// request error.
    CrossCheck {
        txn: u64,
        ops: Vec<pb::RequestOp>,
        revision: i64,
        reply: Reply<()>,
    },
    /// Whether the held shard has lease `id` (for a lease revoke over
    /// several shards, once its hold is answered).
    CrossHasLease {
        txn: u64,
        id: i64,
        reply: Reply<bool>,
    },
    /// Proposes every part the holder has here (one per txn of its batch
    /// that writes this shard, revisions ascending) as one entry, and lets
    /// go of the hold. Answered once applied here: for one part with its
    /// answer, for several with `WriteResult::Parts` (theirs, in order).
    /// `txn` 0: a keyspace leader finishing an earlier leader's txn before
    /// it assigns revisions (one part): proposed only if the shard has not
    /// reached its revision (else answered at once with
    /// `WriteResult::Applied`).
    CrossPropose {
        txn: u64,
        parts: Vec<(i64, cairnpb::CrossTxnPart)>,
        reply: Reply<WriteResult>,
    },
    /// Lets go of the hold of `txn`, or stops waiting for it.
    CrossRelease {
        txn: u64,
    },
    /// Proposes that the shard forget its record of the txn at `revision`;
    /// answered once applied here.
    CrossForget {
        revisions: Vec<i64>,
        reply: Reply<()>,
    },
    /// For a keyspace leader about to assign revisions: the shard's revision
    /// and its records of txns over several shards, once it has applied
    /// every entry of earlier terms here.
    CrossRecords {
        reply: Reply<CrossRecords>,
    },
}

/// What a shard held by a txn over several shards answers.
#[derive(Debug, Clone, Default)]
pub struct CrossHeld {
    /// Each compare over this shard's keys: None where it holds none.
    pub compares: Vec<Option<bool>>,
    /// The NOSPACE alarm is raised: a txn that puts is refused.
    pub no_space: bool,
}

/// A shard's records of txns over several shards, and its revision.
#[derive(Debug, Clone, Default)]
pub struct CrossRecords {
    pub revision: i64,
    /// Each record: the txn's revision and its plan (`cairnpb.CrossTxnPlan`).
    pub records: Vec<(i64, Vec<u8>)>,
}

/// Identifies a watcher on a shard: the stream it belongs to and the number
/// its watch was registered under there (numbers only grow on a stream;
/// `api::watch_stream`).
pub type WatcherKey = (u64, i64);

#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
    /// The watcher also gets a batch with no events whenever the shard's
    /// revision moves: a watch over several shards orders their events by
    /// how far each has sent (`WatchBatch::through`).
    pub progress: bool,
    /// For a watch over several shards: how far the watch stream lets each
    /// shard send ahead of the others (`WatchWindow`). None: as far as the
    /// shard's revision.
    pub window: Option<WatchWindow>,
}

/// How far the shards of a watch over several shards may send it. The watch
/// stream's merge holds an event until every shard has sent through its
/// revision, and publishes here how far it has released; a shard sends no
/// event more than `width` revisions past that. A shard with events past
/// the window moves the watcher to catch-up, as with a full queue, says it
/// has sent through the revision before the first of them, and reads them
/// back from the store once the merge has moved on. A shard that lags (a
/// stalled disk, a snapshot install) thus makes the stream hold at most a
/// window's worth of the other shards' events, not all of them; and since
/// only events are held back, never how far a shard says it has sent,
/// revisions that jump (a new keyspace epoch) move the window at once.
#[derive(Debug, Clone)]
pub struct WatchWindow(std::sync::Arc<WindowState>);

#[derive(Debug)]
struct WindowState {
    released: std::sync::atomic::AtomicI64,
    width: i64,
}

impl WatchWindow {
    /// A window `width` revisions wide past `released`.
    pub fn new(released: i64, width: i64) -> WatchWindow {
        WatchWindow(std::sync::Arc::new(WindowState {
            released: std::sync::atomic::AtomicI64::new(released),
            width,
        }))
    }

    /// The highest revision of an event a shard may send now.
    pub fn limit(&self) -> i64 {
        self.released().saturating_add(self.0.width)
    }

    /// How far the merge has released.
    pub fn released(&self) -> i64 {
        self.0.released.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The merge has released through `released`. The watch stream is the
    /// only writer.
    pub fn set_released(&self, released: i64) {
        self.0
            .released
            .store(released, std::sync::atomic::Ordering::Release);
    }
}

impl WatchSpec {
    /// A watch of every change to the keys `key` and `range_end` name (as
    /// etcd's ranges do), without filters or previous values.
    pub fn every_change(key: &[u8], range_end: &[u8]) -> WatchSpec {
        WatchSpec {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            prev_kv: false,
            no_put: false,
            no_delete: false,
            progress: false,
            window: None,
        }
    }

    /// Whether the watch covers `key`.
    pub fn matches(&self, key: &[u8]) -> bool {
        if self.range_end.is_empty() {
            key == self.key.as_slice()
        } else if self.range_end == b"\0" {
            key >= self.key.as_slice()
        } else {
            key >= self.key.as_slice() && key < self.range_end.as_slice()
        }
    }
}

/// What a shard sends a watch stream.
#[derive(Debug)]
pub struct WatchBatch {
    /// The number its watcher is registered under on its stream (the
    /// second part of its `WatcherKey`), not the client's watch id.
    pub watcher: i64,
    pub shard: ShardId,
    pub revision: i64,
    /// Every event of the watcher up to this revision has been sent, with
    /// this batch or before.
    pub through: i64,
    pub events: Vec<mvccpb::Event>,
    /// Each event's sub revision, for a watch over several shards to order
    /// one txn's events from several shards by the txn's ops.
    pub subs: Vec<i64>,
    /// Set when the watcher's next revision was compacted away: it is cancelled.
    pub compact_revision: Option<i64>,
}

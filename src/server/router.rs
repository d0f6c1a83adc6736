//! How a client request reaches the shard that owns its keys.
//!
//! Every core holds a copy of the router: the routing table and a sender to each
//! shard's driver. Shard drivers live on the core that owns them and keep their
//! state there (`!Send`); the only way in is a [`ShardCommand`] through this
//! channel, answered through a oneshot. Channels are bounded, so a burst of
//! clients waits for room instead of growing memory.

use std::sync::Arc;
use std::time::Duration;

use cairn_proto::cairnpb::shard_request;
use cairn_proto::etcdserverpb::{
    CompactionResponse, DeleteRangeResponse, PutResponse, RangeRequest, RangeResponse, TxnResponse,
};
use tokio::sync::{mpsc, oneshot};

use super::errors::ApiError;
use crate::routing::{RoutingTable, ShardId};

/// Commands queued for one shard before senders wait.
pub const SHARD_QUEUE_COMMANDS: usize = 16_384;

/// How long a client waits for its write to be committed and applied, or for a
/// linearizable read to be confirmed, before it gets etcd's timeout error. etcd's
/// own default is 7 s (5 s plus twice the election timeout); Cairn answers sooner
/// because leader failover takes well under 2 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

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

/// What a shard's leader knows of a lease (see `super::lease`).
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

pub type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// Work for a shard driver.
#[derive(Debug)]
pub enum ShardCommand {
    /// Replicate a write through Raft and answer once it is applied here.
    Write {
        request: shard_request::Request,
        reply: Reply<WriteResult>,
    },
    /// Read; a linearizable read (`serializable` false) first confirms through
    /// ReadIndex that this member has applied every write committed before it.
    Range {
        request: RangeRequest,
        reply: Reply<RangeResponse>,
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
        key: super::watch::WatcherKey,
        spec: super::watch::WatchSpec,
        start_revision: i64,
        tx: mpsc::Sender<super::watch::WatchBatch>,
        reply: Reply<i64>,
    },
    CancelWatch {
        key: super::watch::WatcherKey,
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
    /// Restarts a lease's TTL. Only the shard's leader tracks lease TTLs:
    /// elsewhere it is refused with [`ApiError::NotLeader`]. Answers the
    /// granted TTL, or None when the shard has no such lease (or it expired).
    LeaseRenew {
        id: i64,
        reply: Reply<Option<i64>>,
    },
    /// A lease's TTLs (and keys when `keys`), at the shard's leader only.
    LeaseQuery {
        id: i64,
        keys: bool,
        reply: Reply<Option<LeaseInfo>>,
    },
    /// The ids of the leases in this member's copy of the shard.
    LeaseList {
        reply: Reply<Vec<i64>>,
    },
}

/// The routing table plus a sender to every shard of this member.
#[derive(Debug)]
pub struct Router {
    pub routing: RoutingTable,
    shards: Vec<mpsc::Sender<ShardCommand>>,
}

impl Router {
    pub fn new(routing: RoutingTable, shards: Vec<mpsc::Sender<ShardCommand>>) -> Arc<Router> {
        assert_eq!(routing.shard_count(), shards.len(), "one sender per shard");
        Arc::new(Router { routing, shards })
    }

    /// Sends a command to `shard` and waits for its answer, at most
    /// [`REQUEST_TIMEOUT`].
    pub async fn ask<T>(
        &self,
        shard: ShardId,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<T, ApiError> {
        self.ask_within(shard, REQUEST_TIMEOUT, make).await
    }

    /// [`Self::ask`] with another deadline, for long maintenance work.
    pub async fn ask_within<T>(
        &self,
        shard: ShardId,
        timeout: Duration,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        let sender = &self.shards[shard as usize];
        sender.send(make(tx)).await.map_err(|_| ApiError::Stopped)?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            // The driver dropped the reply: it is shutting down.
            Ok(Err(_)) => Err(ApiError::Stopped),
            Err(_) => Err(ApiError::Timeout),
        }
    }

    pub async fn write(
        &self,
        shard: ShardId,
        request: shard_request::Request,
    ) -> Result<WriteResult, ApiError> {
        self.ask(shard, |reply| ShardCommand::Write { request, reply })
            .await
    }

    pub async fn range(
        &self,
        shard: ShardId,
        request: RangeRequest,
    ) -> Result<RangeResponse, ApiError> {
        self.ask(shard, |reply| ShardCommand::Range { request, reply })
            .await
    }

    pub async fn status(&self, shard: ShardId) -> Result<ShardStatus, ApiError> {
        self.ask(shard, |reply| ShardCommand::Status { reply })
            .await
    }

    /// Every shard's status, asked of all shards at once, in shard order.
    pub async fn all_status(&self) -> Result<Vec<ShardStatus>, ApiError> {
        futures::future::join_all(self.routing.shard_ids().map(|s| self.status(s)))
            .await
            .into_iter()
            .collect()
    }

    pub async fn conf_change(
        &self,
        shard: ShardId,
        change: crate::raft::ConfChangeType,
        member: cairn_proto::cairnpb::MemberInfo,
        check_only: bool,
    ) -> Result<WriteResult, ApiError> {
        self.ask(shard, |reply| ShardCommand::ConfChange {
            change,
            member,
            check_only,
            reply,
        })
        .await
    }

    pub async fn lease_renew(&self, shard: ShardId, id: i64) -> Result<Option<i64>, ApiError> {
        self.ask(shard, |reply| ShardCommand::LeaseRenew { id, reply })
            .await
    }

    pub async fn lease_query(
        &self,
        shard: ShardId,
        id: i64,
        keys: bool,
    ) -> Result<Option<LeaseInfo>, ApiError> {
        self.ask(shard, |reply| ShardCommand::LeaseQuery { id, keys, reply })
            .await
    }

    pub async fn lease_list(&self, shard: ShardId) -> Result<Vec<i64>, ApiError> {
        self.ask(shard, |reply| ShardCommand::LeaseList { reply })
            .await
    }

    pub async fn hash_kv(&self, shard: ShardId, revision: i64) -> Result<ShardHash, ApiError> {
        self.ask(shard, |reply| ShardCommand::HashKv { revision, reply })
            .await
    }
}

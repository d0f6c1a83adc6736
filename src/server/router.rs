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
use cairn_proto::etcdserverpb::{RangeRequest, RangeResponse};
use tokio::sync::{mpsc, oneshot};

use super::command::{
    LeaseInfo, Reply, ShardCommand, ShardHash, ShardStatus, WriteResult, REQUEST_TIMEOUT,
};
use super::errors::ApiError;
use crate::routing::{RoutingTable, ShardId};

/// Commands queued for one shard before senders wait.
pub const SHARD_QUEUE_COMMANDS: usize = 16_384;

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

    pub async fn lease_keys(
        &self,
        shard: ShardId,
        id: i64,
    ) -> Result<Option<Vec<Vec<u8>>>, ApiError> {
        self.ask(shard, |reply| ShardCommand::LeaseKeys { id, reply })
            .await
    }

    pub async fn lease_list(&self, shard: ShardId) -> Result<Vec<i64>, ApiError> {
        self.ask(shard, |reply| ShardCommand::LeaseList { reply })
            .await
    }

    /// Starts handing `shard`'s leadership to member `to`.
    pub async fn transfer_leader(&self, shard: ShardId, to: u64) -> Result<(), ApiError> {
        self.ask(shard, |reply| ShardCommand::TransferLeader { to, reply })
            .await
    }

    pub async fn hash_kv(&self, shard: ShardId, revision: i64) -> Result<ShardHash, ApiError> {
        self.ask(shard, |reply| ShardCommand::HashKv { revision, reply })
            .await
    }
}

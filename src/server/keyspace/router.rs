//! How a client request reaches the shard that owns its keys.
//!
//! Every core holds its own router: the routing table and, for each shard, a
//! sender of the channel from this core to that shard's driver. Shard drivers
//! live on the core that owns them and keep their state there (`!Send`); the
//! only way in is a [`ShardCommand`] through such a channel, answered through a
//! oneshot. There is one channel per (core, shard) pair, so the cores sending
//! to one shard never contend on a shared queue; the driver takes from all of
//! its channels in turn ([`CommandInbox`]). Channels are bounded, so a burst
//! of clients waits for room instead of growing memory.

use std::sync::Arc;
use std::time::Duration;

use cairn_proto::cairnpb::shard_request;
use cairn_proto::etcdserverpb::{Compare, RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use tokio::sync::{mpsc, oneshot};

use crate::ops::server_metrics::CoreRecorder;
use crate::routing::{RoutingTable, ShardId};
use crate::server::command::{
    LeaseInfo, ReadAt, Reply, ShardCommand, ShardHash, ShardPoint, ShardStatus, WriteResult,
    MAX_LEASES_PER_RENEW, REQUEST_TIMEOUT,
};
use crate::server::errors::ApiError;
use crate::server::keyspace::Keyspace;
use crate::server::shard_inbox::CommandInbox;

/// Commands queued from one core for one shard before that core's senders wait.
pub const SHARD_QUEUE_COMMANDS: usize = 16_384;

/// The command channels of a member: `routers[core]` sends from `core` to
/// every shard, and `inboxes[shard]` takes what every core sent to `shard`.
pub struct CommandChannels {
    pub routers: Vec<Arc<Router>>,
    pub inboxes: Vec<CommandInbox>,
}

/// Makes one bounded channel per (core, shard) pair. `recorders[core]`, when
/// given, counts the commands each core's router sends.
pub fn command_channels(
    routing: &RoutingTable,
    cores: usize,
    keyspace: Option<Arc<Keyspace>>,
    recorders: &[CoreRecorder],
) -> CommandChannels {
    let shards = routing.shard_count();
    let mut receivers: Vec<Vec<mpsc::Receiver<ShardCommand>>> =
        (0..shards).map(|_| Vec::with_capacity(cores)).collect();
    let routers = (0..cores.max(1))
        .map(|core| {
            let senders = receivers
                .iter_mut()
                .map(|from_cores| {
                    let (tx, rx) = mpsc::channel(SHARD_QUEUE_COMMANDS);
                    from_cores.push(rx);
                    tx
                })
                .collect();
            Router::build(
                routing.clone(),
                senders,
                keyspace.clone(),
                core,
                recorders.get(core).cloned(),
            )
        })
        .collect();
    CommandChannels {
        routers,
        inboxes: receivers.into_iter().map(CommandInbox::new).collect(),
    }
}

/// The routing table plus a sender to every shard of this member, from one core.
#[derive(Debug)]
pub struct Router {
    pub routing: RoutingTable,
    shards: Vec<mpsc::Sender<ShardCommand>>,
    /// The member's revision counter and what its txns over several shards
    /// share, with several shards.
    pub keyspace: Option<Arc<Keyspace>>,
    /// The core this router sends from, and its metrics.
    core: usize,
    recorder: Option<CoreRecorder>,
}

impl Router {
    /// A router that counts nothing (the simulator's).
    pub fn new(
        routing: RoutingTable,
        shards: Vec<mpsc::Sender<ShardCommand>>,
        keyspace: Option<Arc<Keyspace>>,
    ) -> Arc<Router> {
        Router::build(routing, shards, keyspace, 0, None)
    }

    /// A router sending from `core`, counting its commands in `recorder`.
    fn build(
        routing: RoutingTable,
        shards: Vec<mpsc::Sender<ShardCommand>>,
        keyspace: Option<Arc<Keyspace>>,
        core: usize,
        recorder: Option<CoreRecorder>,
    ) -> Arc<Router> {
        assert_eq!(routing.shard_count(), shards.len(), "one sender per shard");
        Arc::new(Router {
            routing,
            shards,
            keyspace,
            core,
            recorder,
        })
    }

    /// Sends a command to `shard` and waits for its answer, at most
    /// [`REQUEST_TIMEOUT`].
    pub async fn ask<T: Send + 'static>(
        &self,
        shard: ShardId,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<T, ApiError> {
        self.ask_within(shard, REQUEST_TIMEOUT, make).await
    }

    /// [`Self::ask`] with another deadline, for long maintenance work.
    pub async fn ask_within<T: Send + 'static>(
        &self,
        shard: ShardId,
        timeout: Duration,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<T, ApiError> {
        self.queue(shard, make).await?.within(timeout).await
    }

    /// Queues a command for `shard` and returns at once; its answer is
    /// waited for apart ([`Answer::within`]), so that the caller can act
    /// between the two (commands to one shard from one core keep their order).
    pub async fn queue<T: Send + 'static>(
        &self,
        shard: ShardId,
        make: impl FnOnce(Reply<T>) -> ShardCommand,
    ) -> Result<Answer<T>, ApiError> {
        let (tx, rx) = crate::server::command::Reply::channel();
        self.count(shard);
        let sender = &self.shards[shard as usize];
        sender.send(make(tx)).await.map_err(|_| ApiError::Stopped)?;
        Ok(Answer(rx))
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
        self.ask(shard, |reply| ShardCommand::Range {
            request,
            at: None,
            reply,
        })
        .await
    }

    /// A linearizable range at a point the keyspace leader confirmed.
    pub async fn range_at(
        &self,
        shard: ShardId,
        request: RangeRequest,
        at: ReadAt,
    ) -> Result<RangeResponse, ApiError> {
        self.ask(shard, |reply| ShardCommand::Range {
            request,
            at: Some(at),
            reply,
        })
        .await
    }

    /// etcd's read-only txn on one shard, read there as a range is (see
    /// [`ShardCommand::ReadTxn`]): at the store's revision, or at `at`, a
    /// point the keyspace leader confirmed or a cut this member's shards
    /// have reached.
    pub async fn read_txn(
        &self,
        shard: ShardId,
        request: TxnRequest,
        serializable: bool,
        at: Option<ReadAt>,
    ) -> Result<TxnResponse, ApiError> {
        self.ask(shard, |reply| ShardCommand::ReadTxn {
            request,
            serializable,
            at,
            reply,
        })
        .await
    }

    /// The compares of a read-only txn over several shards, over `shard`'s
    /// keys ([`ShardCommand::ReadCompares`]), read as [`Router::read_txn`]
    /// reads.
    pub async fn read_compares(
        &self,
        shard: ShardId,
        compares: Vec<Compare>,
        serializable: bool,
        at: Option<ReadAt>,
    ) -> Result<Vec<Option<bool>>, ApiError> {
        self.ask(shard, |reply| ShardCommand::ReadCompares {
            compares,
            serializable,
            at,
            reply,
        })
        .await
    }

    /// The read point of a linearizable read over `shards`, if this member
    /// is the keyspace leader: its counter now, and for each shard the index
    /// of its last entry proposed by then, each confirmed by a ReadIndex
    /// round started after the counter was read. Otherwise `NotLeader` with
    /// the member that leads the shard asked about (or shard 0).
    pub async fn read_point(&self, shards: &[ShardId]) -> Result<(i64, Vec<ShardPoint>), ApiError> {
        let Some(keyspace) = &self.keyspace else {
            return Err(ApiError::Unsupported("read points with one shard"));
        };
        let counter = &keyspace.counter;
        let opened = counter.times_opened();
        let Some(revision) = counter.current() else {
            return Err(match counter.shard0_leader() {
                crate::raft::NONE => ApiError::NoLeader,
                leader => ApiError::NotLeader { leader },
            });
        };
        let indexes = futures::future::join_all(
            shards
                .iter()
                .map(|&s| self.ask(s, |reply| ShardCommand::ReadPoint { reply })),
        )
        .await;
        let indexes = indexes.into_iter().collect::<Result<_, _>>()?;
        // A shard whose txn hold ended without its part (a refused part, the
        // fence of an opening) may answer before the opening that follows
        // adds the part at a revision below this point: a point that spans
        // a closing of the counter is asked again.
        if counter.current().is_none() || counter.times_opened() != opened {
            return Err(ApiError::LeaderChanged);
        }
        Ok((revision, indexes))
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

    /// Renews one lease at `shard`'s leader: its granted TTL, or None.
    pub async fn lease_renew(&self, shard: ShardId, id: i64) -> Result<Option<i64>, ApiError> {
        Ok(self.lease_renew_many(shard, vec![id]).await?[0])
    }

    /// Renews every lease of `ids` at `shard`'s leader, in one command:
    /// each granted TTL (None where the shard has no such lease) in order,
    /// or the one refusal of them all. Nothing to renew asks nothing.
    pub async fn lease_renew_many(
        &self,
        shard: ShardId,
        ids: Vec<i64>,
    ) -> Result<Vec<Option<i64>>, ApiError> {
        assert!(
            ids.len() <= MAX_LEASES_PER_RENEW,
            "{} leases to renew on shard {shard}, more than {MAX_LEASES_PER_RENEW}",
            ids.len()
        );
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let asked = ids.len();
        let ttls = self
            .ask(shard, |reply| ShardCommand::LeaseRenew { ids, reply })
            .await?;
        assert_eq!(
            ttls.len(),
            asked,
            "shard {shard} answered {} TTLs for {asked} leases",
            ttls.len()
        );
        Ok(ttls)
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

    /// Queues `cmd` for `shard` without waiting for an answer (one that
    /// must arrive: it waits for room in the queue).
    pub async fn tell(&self, shard: ShardId, cmd: ShardCommand) {
        // Fails only when the driver stopped, and with it what the command
        // was for.
        self.count(shard);
        let _ = self.shards[shard as usize].send(cmd).await;
    }

    /// Counts a command for `shard`, and whether it leaves this core.
    fn count(&self, shard: ShardId) {
        if let Some(r) = &self.recorder {
            r.shard_command(self.routing.core_for_shard(shard) != self.core);
        }
    }
}

/// The answer to a command [`Router::queue`] queued.
pub struct Answer<T>(oneshot::Receiver<Result<T, ApiError>>);

impl<T> Answer<T> {
    /// Waits up to `timeout` for the answer.
    pub async fn within(self, timeout: Duration) -> Result<T, ApiError> {
        match tokio::time::timeout(timeout, self.0).await {
            Ok(Ok(result)) => result,
            // The driver dropped the reply: it is shutting down.
            Ok(Err(_)) => Err(ApiError::Stopped),
            Err(_) => Err(ApiError::Timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues a command from `core` that names its sender by `tag`.
    fn send(channels: &CommandChannels, core: usize, tag: i64) {
        let (reply, _) = crate::server::command::Reply::channel();
        channels.routers[core].shards[0]
            .try_send(ShardCommand::LeaseRenew {
                ids: vec![tag],
                reply,
            })
            .expect("room");
    }

    fn tag(cmd: ShardCommand) -> i64 {
        match cmd {
            ShardCommand::LeaseRenew { ids, .. } => ids[0],
            _ => panic!("only renewals were sent"),
        }
    }

    #[tokio::test]
    async fn each_core_has_its_own_channel_to_a_shard_and_the_inbox_takes_them_in_turn() {
        let routing = RoutingTable::new(1, 2);
        let mut channels = command_channels(&routing, 2, None, &[]);
        assert_eq!(channels.routers.len(), 2);
        let mut inbox = channels.inboxes.pop().unwrap();
        // Core 0 queues three, then core 1 one: core 1's does not wait
        // behind all of core 0's.
        for t in [1, 2, 3] {
            send(&channels, 0, t);
        }
        send(&channels, 1, 10);
        let mut order = Vec::new();
        while let Some(cmd) = inbox.try_recv() {
            order.push(tag(cmd));
        }
        assert_eq!(order, [1, 10, 2, 3]);
        // Waiting wakes for a command from either core, and ends once every
        // core's router is gone.
        let waiting = tokio::spawn(async move {
            let first = inbox.recv().await.map(tag);
            (first, inbox.recv().await.is_none())
        });
        tokio::task::yield_now().await;
        send(&channels, 1, 20);
        drop(channels.routers);
        assert_eq!(waiting.await.unwrap(), (Some(20), true));
    }
}

//! The etcd v3 Maintenance service.
//!
//! A member runs several shards; etcd's per-member answers are built from all of
//! them: sizes are summed, Raft indexes are summed (a monotonic measure of
//! progress), the leader and term reported are shard 0's, and HashKV combines the
//! shards' hashes in shard order. With `--shards 1` every figure is exactly etcd's.

use std::sync::Arc;

use cairn_proto::etcdserverpb::maintenance_server::Maintenance;
use cairn_proto::etcdserverpb::{
    alarm_request, AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest,
    DefragmentResponse, DowngradeRequest, DowngradeResponse, HashKvRequest, HashKvResponse,
    HashRequest, HashResponse, MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest,
    SnapshotResponse, StatusRequest, StatusResponse,
};
use futures::future::join_all;
use tonic::{Request, Response, Status};

use crate::server::api::kv::Identity;
use crate::server::backup::BackupEncoder;
use crate::server::command::{ShardCommand, ShardHash, ShardStatus, REQUEST_TIMEOUT};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::members::MemberRegistry;

/// How long defragmenting one shard's store may take before the client is
/// answered with a timeout (the work itself carries on).
pub const DEFRAGMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The etcd API level Cairn serves, reported as the server version: clients use it
/// to decide which RPCs they may call.
pub const ETCD_API_VERSION: &str = "3.4.0";

#[derive(Clone)]
pub struct MaintenanceService {
    pub router: Arc<Router>,
    pub identity: Identity,
    pub members: Arc<MemberRegistry>,
    pub auth: Arc<crate::server::auth::AuthStore>,
}

/// How often MoveLeader looks whether the transfers are done.
const MOVE_LEADER_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl MaintenanceService {
    /// Combines per-shard hashes into one member hash. One shard: its hash as is.
    fn combine(hashes: &[ShardHash]) -> u32 {
        if hashes.len() == 1 {
            return hashes[0].hash;
        }
        let mut h = crc32fast::Hasher::new();
        for s in hashes {
            h.update(&s.hash.to_le_bytes());
        }
        h.finalize()
    }

    async fn all_hashes(&self, revision: i64) -> Result<Vec<ShardHash>, ApiError> {
        join_all(
            self.router
                .routing
                .shard_ids()
                .map(|s| self.router.hash_kv(s, revision)),
        )
        .await
        .into_iter()
        .collect()
    }
}

fn summary_header(
    identity: &Identity,
    statuses: &[ShardStatus],
) -> cairn_proto::etcdserverpb::ResponseHeader {
    let revision = statuses.iter().map(|s| s.revision).max().unwrap_or(0);
    let term = statuses.first().map_or(0, |s| s.term);
    identity.header(revision, term)
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let req = request.into_inner();
        let statuses = self.router.all_status().await?;
        let action = alarm_request::AlarmAction::try_from(req.action)
            .map_err(|_| Status::invalid_argument("etcdserver: unknown alarm action"))?;
        match action {
            alarm_request::AlarmAction::Get => {}
            // Raising an alarm by hand, or disarming one, goes through each
            // shard's log so every member agrees.
            alarm_request::AlarmAction::Activate | alarm_request::AlarmAction::Deactivate => {
                let results = join_all(self.router.routing.shard_ids().map(|s| {
                    self.router
                        .write(s, cairn_proto::cairnpb::shard_request::Request::Alarm(req))
                }))
                .await;
                for r in results {
                    r?;
                }
            }
        }
        let statuses = if action == alarm_request::AlarmAction::Get {
            statuses
        } else {
            self.router.all_status().await?
        };
        let alarms = if statuses.iter().any(|s| s.nospace_alarm) {
            vec![AlarmMember {
                member_id: self.identity.member_id,
                alarm: AlarmType::Nospace as i32,
            }]
        } else {
            Vec::new()
        };
        Ok(Response::new(AlarmResponse {
            header: Some(summary_header(&self.identity, &statuses)),
            alarms,
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let statuses = self.router.all_status().await?;
        let first = statuses.first().cloned().unwrap_or_default();
        let mut errors = Vec::new();
        // As etcd: a member without a leader says so (for some shard here).
        if statuses.iter().any(|s| s.leader == 0) {
            errors.push(ApiError::NoLeader.to_string());
        }
        if statuses.iter().any(|s| s.nospace_alarm) {
            errors.push(
                "memberID:".to_string() + &format!("{:x} alarm:NOSPACE ", self.identity.member_id),
            );
        }
        Ok(Response::new(StatusResponse {
            header: Some(summary_header(&self.identity, &statuses)),
            version: ETCD_API_VERSION.to_string(),
            db_size: statuses.iter().map(|s| s.db_size_bytes as i64).sum(),
            leader: first.leader,
            // One Raft log's indexes, as etcd reports its one log's: shard
            // 0's, whose term the headers carry too.
            raft_index: first.commit_index,
            raft_term: first.term,
            raft_applied_index: first.applied_index,
            errors,
            db_size_in_use: statuses.iter().map(|s| s.db_size_in_use_bytes as i64).sum(),
            is_learner: first.is_learner,
        }))
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        crate::server::auth::require_admin_maintenance(&self.auth, &request)?;
        // The store reuses freed pages online, so this is rarely needed: it
        // gives the disk back. Shard by shard; each shard runs it in steps on
        // its ticks, so its core keeps serving meanwhile.
        for shard in self.router.routing.shard_ids() {
            self.router
                .ask_within(shard, DEFRAGMENT_TIMEOUT, |reply| {
                    ShardCommand::Defragment { reply }
                })
                .await?;
        }
        Ok(Response::new(DefragmentResponse {
            header: Some(self.identity.header_current()),
        }))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        crate::server::auth::require_admin_maintenance(&self.auth, &request)?;
        let hashes = self.all_hashes(0).await?;
        let statuses = self.router.all_status().await?;
        Ok(Response::new(HashResponse {
            header: Some(summary_header(&self.identity, &statuses)),
            hash: Self::combine(&hashes),
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        crate::server::auth::require_admin_maintenance(&self.auth, &request)?;
        let req = request.into_inner();
        let hashes = self.all_hashes(req.revision).await?;
        let statuses = self.router.all_status().await?;
        Ok(Response::new(HashKvResponse {
            header: Some(summary_header(&self.identity, &statuses)),
            hash: Self::combine(&hashes),
            // etcd answers -1 while its store was never compacted.
            compact_revision: hashes
                .iter()
                .map(|h| h.compact_revision)
                .max()
                .filter(|&r| r > 0)
                .unwrap_or(-1),
            hash_revision: hashes.iter().map(|h| h.revision).max().unwrap_or(0),
        }))
    }

    type SnapshotStream = futures::stream::BoxStream<'static, Result<SnapshotResponse, Status>>;

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        crate::server::auth::require_admin_maintenance(&self.auth, &request)?;
        // The file `etcdctl snapshot save` writes: see `backup.rs` for its
        // format and how `--restore-snapshot` builds a cluster from it.
        let (out_tx, out_rx) = tokio::sync::mpsc::channel::<Result<SnapshotResponse, Status>>(4);
        let router = self.router.clone();
        let identity = self.identity.clone();
        let statuses = self.router.all_status().await?;
        let estimate: u64 = statuses.iter().map(|s| s.db_size_in_use_bytes).sum();
        let auth_state = {
            use prost::Message as _;
            self.auth.replica().snapshot().encode_to_vec()
        };
        tokio::spawn(async move {
            let mut enc = BackupEncoder::default();
            let mut sent = 0u64;
            let send = |blob: bytes::Bytes, sent: &mut u64, last: bool| {
                *sent += blob.len() as u64;
                let remaining_bytes = if last {
                    0
                } else {
                    estimate.saturating_sub(*sent).max(1)
                };
                out_tx.send(Ok(SnapshotResponse {
                    header: Some(identity.header_now(0)),
                    remaining_bytes,
                    blob,
                    version: String::new(),
                }))
            };
            let shards = router.routing.shard_count() as u32;
            let header = enc.header(shards, identity.cluster_id, identity.member_id);
            if send(header, &mut sent, false).await.is_err() {
                return;
            }
            for shard in 0..shards {
                let (tx, mut rx) = tokio::sync::mpsc::channel(8);
                let applied = match router
                    .ask(shard, |reply| ShardCommand::Snapshot { tx, reply })
                    .await
                {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = out_tx.send(Err(e.into())).await;
                        return;
                    }
                };
                if send(enc.shard_start(shard, applied), &mut sent, false)
                    .await
                    .is_err()
                {
                    return;
                }
                while let Some(chunk) = rx.recv().await {
                    let blob = match chunk {
                        Ok(c) => enc.chunk(&c),
                        Err(e) => {
                            let _ = out_tx
                                .send(Err(ApiError::Storage { shard, reason: e }.into()))
                                .await;
                            return;
                        }
                    };
                    if send(blob, &mut sent, false).await.is_err() {
                        return;
                    }
                }
                if send(enc.shard_end(), &mut sent, false).await.is_err() {
                    return;
                }
            }
            if send(enc.auth(&auth_state), &mut sent, false).await.is_err() {
                return;
            }
            let _ = send(enc.finish(), &mut sent, true).await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out_rx),
        )))
    }

    /// Moves the leadership of every shard this member leads to the target,
    /// as etcd moves its one group's: a target that is unknown or a learner
    /// is refused, a member that leads nothing is not the leader, and the
    /// answer comes once the target leads them all.
    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        crate::server::auth::require_admin_maintenance(&self.auth, &request)?;
        let target = request.into_inner().target_id;
        if self.members.get(target).is_none_or(|m| m.is_learner) {
            return Err(ApiError::BadLeaderTransferee.into());
        }
        let me = self.identity.member_id;
        let statuses = self.router.all_status().await?;
        let led: Vec<_> = statuses
            .iter()
            .filter(|s| s.leader == me)
            .map(|s| s.shard)
            .collect();
        if led.is_empty() {
            let leader = statuses.first().map_or(0, |s| s.leader);
            return Err(ApiError::NotLeader { leader }.into());
        }
        for r in join_all(led.iter().map(|&s| self.router.transfer_leader(s, target))).await {
            r?;
        }
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let moved = loop {
            let statuses: Vec<ShardStatus> = join_all(led.iter().map(|&s| self.router.status(s)))
                .await
                .into_iter()
                .filter_map(Result::ok)
                .collect();
            if statuses.len() == led.len() && statuses.iter().all(|s| s.leader == target) {
                break statuses;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::LeaderTransferTimeout.into());
            }
            tokio::time::sleep(MOVE_LEADER_POLL).await;
        };
        let revision = moved.iter().map(|s| s.revision).max().unwrap_or(0);
        let term = moved.iter().map(|s| s.term).max().unwrap_or(0);
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.identity.header(revision, term)),
        }))
    }

    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        crate::server::auth::require_admin_maintenance(&self.auth, &request)?;
        Err(ApiError::Unsupported("Downgrade").into())
    }
}

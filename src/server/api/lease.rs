//! The etcd v3 Lease service: LeaseGrant, LeaseRevoke, LeaseKeepAlive,
//! LeaseTimeToLive, LeaseLeases.
//!
//! # A lease over several shards
//! A key belongs to one shard (Raft group), but a lease must be usable with
//! keys on any shard, so a lease lives on every shard, with the same id:
//!
//! - **Grant** is one `LeaseGrant` proposal per shard (same id and TTL). An id
//!   of 0 gets one generated as etcd does (this member's id in the top 16
//!   bits, then a counter started from the clock). The TTL is raised to the
//!   minimum (1.5 election timeouts, rounded up to a second, etcd's rule) and
//!   refused above 9,000,000,000 s with etcd's "too large lease TTL".
//! - **Expiry** is decided by each shard's leader, which alone tracks the time
//!   left of every lease of its shard ([`LeaseClock`]). A member that becomes
//!   leader starts every lease's TTL afresh (plus one election timeout), as an
//!   etcd leader does, so a leader change never shortens a lease. An expired
//!   lease is revoked through Raft (a `LeaseRevoke` proposal on that shard): its
//!   keys are deleted at one revision of the shard, and watchers see the
//!   deletes. Followers never expire anything.
//! - **KeepAlive** renews the lease at every shard's leader: directly for the
//!   shards this member leads, over the peer port's HTTP side
//!   (`POST /cairn/lease-renews`, see `crate::server::member::peer_http`) for the others, on
//!   pooled keep-alive connections, the keep-alives bound for one leader
//!   gathered into one request (`lease_renewals`). Renewals do not go through Raft, as in
//!   etcd (no checkpointing: the TTL restarts on a new leader).
//! - **Revoke** is one `LeaseRevoke` proposal per shard.
//! - **TimeToLive** asks every shard's leader (`POST /cairn/lease-ttl` for the
//!   shards led elsewhere): the time left is the least over the shards, the
//!   keys are those of every shard. **Leases** lists the leases of this
//!   member's copies of the shards.
//!
//! A lease is alive only while every shard has it. A grant or revoke that
//! failed part way (a shard without a leader past the request timeout) leaves
//! it on some shards only; a keep-alive or TimeToLive that finds it so answers
//! that it expired and revokes what is left, and a lease nobody keeps alive is
//! revoked by each shard's leader when its TTL runs out anyway.
//!
//! Puts are not slowed down: the store checks a put's lease as it always did,
//! and only lease requests touch the leader's clock.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::cairnpb::shard_request::Request as ShardReq;
use cairn_proto::etcdserverpb::lease_server::Lease;
use cairn_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use futures::future::join_all;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::routing::ShardId;
use crate::server::api::kv::Identity;
use crate::server::api::lease_renewals::Renewals;
use crate::server::api::require_leader::{self, LeaderLoss};
use crate::server::api::stream_end::{self, Ending};
use crate::server::command::{LeaseInfo, WriteResult, REQUEST_TIMEOUT};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::members::MemberRegistry;
use crate::server::peer_client::{self, Forwarded};
use crate::server::shard::MAX_LEASE_TTL_SECS;

/// How long a lease request waits for a shard's leader (elections included)
/// before it fails with etcd's "no leader".
pub const LEADER_WAIT: Duration = Duration::from_secs(3);

/// How long a lease found on some shards only is looked for on the others
/// before it is taken for dead.
pub const PARTIAL_LEASE_WAIT: Duration = Duration::from_secs(1);

/// How long one forwarded lease request to a peer may take.
pub const PEER_LEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// etcd's minimum lease TTL for the given Raft timing: 1.5 election timeouts
/// (counted in whole heartbeats, as etcd counts them), rounded up to seconds.
pub fn min_lease_ttl_secs(heartbeat_ms: u64, election_ms: u64) -> i64 {
    let heartbeat_ms = heartbeat_ms.max(1);
    let election_ticks = (election_ms / heartbeat_ms).max(2);
    let ms = (3 * election_ticks / 2) * heartbeat_ms;
    ms.div_ceil(1000) as i64
}

/// Lease ids chosen by this member when a client asks for id 0: etcd's
/// scheme, the member id's low 16 bits on top of a 48-bit counter that
/// starts from the clock (milliseconds, shifted by 8), sign bit cleared.
#[derive(Debug)]
pub struct LeaseIds {
    prefix: u64,
    suffix: AtomicU64,
}

impl LeaseIds {
    pub fn new(member_id: u64) -> LeaseIds {
        let now_ms = crate::server::clock::now_ms();
        LeaseIds {
            prefix: (member_id & 0xffff) << 48,
            suffix: AtomicU64::new((now_ms & ((1 << 40) - 1)) << 8),
        }
    }

    pub fn next(&self) -> i64 {
        loop {
            let suffix = self.suffix.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            let id = (self.prefix | (suffix & ((1 << 48) - 1))) & (i64::MAX as u64);
            if id != 0 {
                return id as i64;
            }
        }
    }
}

#[derive(Clone)]
pub struct LeaseService {
    pub router: Arc<Router>,
    pub members: Arc<MemberRegistry>,
    pub identity: Identity,
    /// Smallest TTL granted, in seconds: shorter ones are raised to it.
    pub min_ttl_secs: i64,
    pub ids: Arc<LeaseIds>,
    pub peers: peer_client::PeerClient,
    /// This core's keep-alives forwarded to shard leaders elsewhere.
    pub renewals: Renewals,
    pub auth: Arc<crate::server::auth::AuthStore>,
    /// Ends the keep-alive streams that require a leader when the member
    /// has none.
    pub leader_loss: LeaderLoss,
}

impl LeaseService {
    fn shards(&self) -> Vec<ShardId> {
        self.router.routing.shard_ids().collect()
    }

    /// Runs `local` here or `remote` at the shard's leader; see
    /// [`peer_http::at_shard_leader`].
    async fn at_leader<T, L, LF, R, RF>(&self, local: L, remote: R) -> Result<T, Status>
    where
        L: Fn() -> LF,
        LF: Future<Output = Result<T, ApiError>>,
        R: Fn(String) -> RF,
        RF: Future<Output = Forwarded<T>>,
    {
        peer_client::at_shard_leader(&self.members, LEADER_WAIT, local, remote).await
    }

    /// Posts a lease request for `shard` to the peer at `url`.
    async fn post(&self, url: &str, path: &str, shard: ShardId, body: Bytes) -> Forwarded {
        let cluster_id = self.members.cluster_id();
        self.peers
            .post_for_shard(url, path, cluster_id, shard, body, PEER_LEASE_TIMEOUT)
            .await
    }

    /// Renews the lease at `shard`'s leader: its granted TTL, or None. A
    /// leader elsewhere gets it with the other keep-alives this core
    /// forwards to it ([`Renewals`]).
    async fn renew_at(&self, shard: ShardId, id: i64) -> Result<Option<i64>, Status> {
        self.at_leader(
            || self.router.lease_renew(shard, id),
            |url| async move { self.renewals.renew(&url, shard, id).await },
        )
        .await
    }

    /// The lease as `shard`'s leader knows it.
    async fn query_at(
        &self,
        shard: ShardId,
        id: i64,
        keys: bool,
    ) -> Result<Option<LeaseInfo>, Status> {
        let body = Bytes::from(LeaseTimeToLiveRequest { id, keys }.encode_to_vec());
        self.at_leader(
            || self.router.lease_query(shard, id, keys),
            |url| {
                let body = body.clone();
                async move {
                    self.post(&url, "/cairn/lease-ttl", shard, body)
                        .await
                        .and_decode(|b: Bytes| {
                            LeaseTimeToLiveResponse::decode(b)
                                .map(|r| {
                                    (r.ttl >= 0).then(|| LeaseInfo {
                                        granted_ttl: r.granted_ttl,
                                        remaining: Duration::from_millis(r.ttl as u64),
                                        keys: r.keys.into_iter().map(|k| k.to_vec()).collect(),
                                    })
                                })
                                .map_err(|e| format!("{url}: time-to-live answer: {e}"))
                        })
                }
            },
        )
        .await
    }

    /// Grants the lease on every shard; the highest shard revision. A shard
    /// that already has it is a grant that failed part way and is retried; a
    /// lease on every shard already is a duplicate.
    async fn grant_everywhere(&self, id: i64, ttl: i64) -> Result<i64, ApiError> {
        self.propose_on_every_shard(
            || ShardReq::LeaseGrant(LeaseGrantRequest { ttl, id }),
            ApiError::LeaseExist,
        )
        .await
    }

    /// Revokes the lease on every shard; the highest shard revision. A shard
    /// without it has seen it expire or be revoked already.
    /// With several shards, the keyspace leader revokes it on every shard at
    /// one revision (`cross_txn::revoke_lease`), asked over the peer port
    /// (`POST /cairn/lease-revoke`) from elsewhere.
    async fn revoke_everywhere(&self, id: i64) -> Result<i64, Status> {
        if self.router.keyspace.is_none() {
            return Ok(self
                .propose_on_every_shard(
                    || ShardReq::LeaseRevoke(LeaseRevokeRequest { id }),
                    ApiError::LeaseNotFound,
                )
                .await?);
        }
        let body = Bytes::from(LeaseRevokeRequest { id }.encode_to_vec());
        // Whether the keyspace leader answered from elsewhere: then this
        // member waits until it applied the revoke too.
        let (revision, forwarded) = self
            .at_leader(
                || async {
                    tokio::spawn(crate::server::keyspace::cross_txn::revoke_lease(
                        self.router.clone(),
                        id,
                    ))
                    .await
                    .unwrap_or(Err(ApiError::Stopped))
                    .map(|revision| (revision, false))
                },
                |url| {
                    let body = body.clone();
                    async move {
                        self.post(&url, "/cairn/lease-revoke", 0, body)
                            .await
                            .and_decode(|b: Bytes| {
                                LeaseRevokeResponse::decode(b)
                                    .map(|r| (r.header.map_or(0, |h| h.revision), true))
                                    .map_err(|e| format!("{url}: revoke answer: {e}"))
                            })
                    }
                },
            )
            .await?;
        if let (true, Some(keyspace)) = (forwarded, &self.router.keyspace) {
            // Every shard: the lease was granted on each, so each holder has
            // an entry at the revision (one that no longer held it gets
            // there by a close).
            keyspace
                .counter
                .reached
                .applied_here(&self.shards(), revision, REQUEST_TIMEOUT, "a lease revoke")
                .await;
        }
        Ok(revision)
    }

    /// Proposes `request()` on every shard at once. A shard answering
    /// `already` has nothing to do; when every shard does, that is the answer.
    /// Any other error wins; else the highest shard revision.
    async fn propose_on_every_shard(
        &self,
        request: impl Fn() -> ShardReq,
        already: ApiError,
    ) -> Result<i64, ApiError> {
        let parts = join_all(
            self.shards()
                .into_iter()
                .map(|s| self.router.write(s, request())),
        )
        .await;
        let (mut done, mut revision, mut failed) = (0, 0, None);
        for part in parts {
            match part {
                Ok(WriteResult::Applied { revision: r }) => {
                    done += 1;
                    revision = revision.max(r);
                }
                Err(e) if e == already => {}
                Ok(_) => {
                    failed = Some(ApiError::Unsupported("a lease request answered as a write"))
                }
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if done == 0 {
            return Err(already);
        }
        Ok(revision)
    }

    /// Asks every shard's leader about a lease. Where only some have it, the
    /// others are asked again for a while: a grant or revoke just applied here
    /// may not be applied at every leader yet.
    async fn on_every_shard<T, F, Fut>(&self, ask: F) -> Result<Vec<Option<T>>, Status>
    where
        F: Fn(ShardId) -> Fut,
        Fut: Future<Output = Result<Option<T>, Status>>,
    {
        let shards = self.shards();
        let mut found = Vec::with_capacity(shards.len());
        for part in join_all(shards.iter().map(|&s| ask(s))).await {
            found.push(part?);
        }
        let deadline = Instant::now() + PARTIAL_LEASE_WAIT;
        while found.iter().any(Option::is_some)
            && found.iter().any(Option::is_none)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            for (i, &s) in shards.iter().enumerate() {
                if found[i].is_none() {
                    found[i] = ask(s).await?;
                }
            }
        }
        Ok(found)
    }

    /// A lease some shards no longer have is dead: what is left of it is
    /// revoked in the background.
    fn revoke_remains(&self, id: i64) {
        let this = self.clone();
        tokio::spawn(async move {
            match this.revoke_everywhere(id).await {
                Err(e) if e.code() != tonic::Code::NotFound => {
                    tracing::warn!(lease = id, error = %e, "revoking what was left of a lease failed; its TTL will expire it")
                }
                _ => {
                    tracing::info!(
                        lease = id,
                        "revoked what was left of a partly expired lease"
                    )
                }
            }
        });
    }

    /// Renews the lease on every shard: its granted TTL, 0 when it is gone.
    async fn keep_alive_once(&self, id: i64) -> Result<i64, Status> {
        let ttls = self.on_every_shard(|s| self.renew_at(s, id)).await?;
        if ttls.iter().all(Option::is_some) {
            return Ok(ttls.iter().flatten().copied().max().unwrap_or(0));
        }
        if ttls.iter().any(Option::is_some) {
            self.revoke_remains(id);
        }
        Ok(0)
    }

    fn header(&self, revision: i64) -> Option<cairn_proto::etcdserverpb::ResponseHeader> {
        Some(self.identity.header_now(revision))
    }
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let req = request.into_inner();
        if req.ttl > MAX_LEASE_TTL_SECS {
            return Err(ApiError::LeaseTtlTooLarge.into());
        }
        let ttl = req.ttl.max(self.min_ttl_secs);
        // A generated id that happens to be taken is replaced by the next one.
        let attempts = if req.id == 0 { 3 } else { 1 };
        let mut last = ApiError::LeaseExist;
        for _ in 0..attempts {
            let id = if req.id == 0 { self.ids.next() } else { req.id };
            match self.grant_everywhere(id, ttl).await {
                Ok(revision) => {
                    return Ok(Response::new(LeaseGrantResponse {
                        header: self.header(revision),
                        id,
                        ttl,
                        error: String::new(),
                    }))
                }
                Err(e @ ApiError::LeaseExist) => last = e,
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.into())
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let caller = crate::server::auth::caller_of(&self.auth, &request)?;
        let id = request.into_inner().id;
        crate::server::auth::check::lease_keys(&self.auth, caller.as_ref(), &self.router, id)
            .await?;
        let revision = self.revoke_everywhere(id).await?;
        Ok(Response::new(LeaseRevokeResponse {
            header: self.header(revision),
        }))
    }

    type LeaseKeepAliveStream = ReceiverStream<Result<LeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        // etcd's learners refuse the Watch and LeaseKeepAlive streams.
        if self.members.local_is_learner() {
            return Err(ApiError::NotSupportedForLearner.into());
        }
        let mut leader = self.leader_loss.open(request.metadata())?;
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let this = self.clone();
        tokio::spawn(async move {
            let mut ending = Ending::default();
            // One renewal at a time per stream, answered in order (etcd's way).
            loop {
                let req = tokio::select! {
                    req = inbound.message() => match req {
                        Ok(Some(req)) => req,
                        Ok(None) => break,
                        // A request that could not be read: the client is
                        // told, after the answers queued for it.
                        Err(status) => {
                            ending.set(status);
                            break;
                        }
                    },
                    // The member lost its leader: the client is told.
                    () = leader.lost() => {
                        ending.set(require_leader::no_leader());
                        break;
                    }
                };
                let answer = this
                    .keep_alive_once(req.id)
                    .await
                    .map(|ttl| LeaseKeepAliveResponse {
                        header: Some(this.identity.header_current()),
                        id: req.id,
                        ttl,
                    });
                let failed = answer.is_err();
                let sent = stream_end::send_unless_lost(&tx, answer, leader.lost()).await;
                if ending.ends(sent) || failed {
                    break;
                }
            }
            if ending.is_set() {
                // What is left of the request body is not held meanwhile.
                drop(inbound);
                ending.tell(&tx).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        let infos = self
            .on_every_shard(|s| self.query_at(s, req.id, req.keys))
            .await?;
        let mut resp = LeaseTimeToLiveResponse {
            header: Some(self.identity.header_current()),
            id: req.id,
            ttl: -1,
            granted_ttl: 0,
            keys: Vec::new(),
        };
        if infos.iter().all(Option::is_some) {
            let infos: Vec<LeaseInfo> = infos.into_iter().flatten().collect();
            resp.ttl = infos
                .iter()
                .map(|i| i.remaining.as_secs().min(i64::MAX as u64) as i64)
                .min()
                .unwrap_or(-1);
            resp.granted_ttl = infos.iter().map(|i| i.granted_ttl).max().unwrap_or(0);
            let mut keys: Vec<Vec<u8>> = infos.into_iter().flat_map(|i| i.keys).collect();
            keys.sort_unstable();
            resp.keys = keys.into_iter().map(Bytes::from).collect();
        } else if infos.iter().any(Option::is_some) {
            self.revoke_remains(req.id);
        }
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        _: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let parts = join_all(self.shards().into_iter().map(|s| self.router.lease_list(s))).await;
        let mut ids = BTreeSet::new();
        for p in parts {
            ids.extend(p?);
        }
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.identity.header_current()),
            leases: ids.into_iter().map(|id| LeaseStatus { id }).collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_ttl_follows_etcd() {
        // etcd's defaults: 100 ms heartbeat, 1 s election: 1.5 s, rounded up.
        assert_eq!(min_lease_ttl_secs(100, 1000), 2);
        assert_eq!(min_lease_ttl_secs(100, 2000), 3);
        assert_eq!(min_lease_ttl_secs(50, 250), 1);
        assert_eq!(min_lease_ttl_secs(0, 0), 1);
    }

    #[test]
    fn generated_ids_are_positive_distinct_and_carry_the_member() {
        let ids = LeaseIds::new(0xabcd_1234);
        let a = ids.next();
        let b = ids.next();
        assert!(a > 0 && b > 0 && a != b);
        assert_eq!((a as u64) >> 48, 0x1234 & 0x7fff);
    }
}

//! The etcd v3 KV service: Range, Put, DeleteRange, Txn, Compact.
//!
//! Requests are checked here (etcd's checks, etcd's errors), routed to the shards
//! that own their keys, and answered with etcd's response header. A range over
//! several shards is answered by all of them and merged in key order; a txn or
//! a delete over several shards runs as one txn at one revision
//! (`cross_txn`), and a read-only txn over several shards is read at one
//! revision (`cross_read`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_proto::cairnpb::shard_request::Request as ShardReq;
use cairn_proto::etcdserverpb::kv_server::Kv;
use cairn_proto::etcdserverpb::{
    request_op, response_op, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, TxnRequest, TxnResponse,
};
use futures::future::join_all;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::ops::readiness::Readiness;
use crate::routing::ShardId;
use crate::server::auth::{caller_of, check, AuthStore};
use crate::server::command::{ReadAt, ShardPoint, WriteResult, REQUEST_TIMEOUT};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::keyspace::Keyspace;
use crate::server::keyspace::{cross_read, cross_txn};
use crate::server::members::MemberRegistry;
use crate::server::peer_client;
use crate::server::shard::LEADERLESS_WAIT;
use crate::server::validate;

/// Read points a linearizable range over several shards takes at most when a
/// leader change replaced a point's entry before it was read (each a
/// ReadIndex round per shard, so a few are cheap).
pub const POINT_TRIES: u32 = 3;

pub use crate::server::identity::Identity;

/// Request limits, etcd's flags.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
}

#[derive(Clone)]
pub struct KvService {
    pub router: Arc<Router>,
    pub identity: Identity,
    pub limits: Limits,
    pub auth: Arc<AuthStore>,
    /// Where the keyspace leader is found for a read point.
    pub members: Arc<MemberRegistry>,
    pub peers: peer_client::PeerClient,
    /// Which shards know a leader: a serializable read over several waits
    /// for them to reach the revision one of them reached only while each does.
    pub readiness: Arc<Readiness>,
}

/// A linearizable read at one point of the revision order: a point from
/// `read_point`, then `read` with the point's revision and each shard's
/// part, taken again (up to [`POINT_TRIES`]) when a leader change replaced
/// a point's entry before it was read. A read of a revision past the point
/// (`newest`) is a future revision. Answers the point's revision and what
/// `read` gave.
pub async fn read_at_point<T, P, PFut, F, Fut>(
    read_point: P,
    newest: i64,
    read: F,
) -> Result<(i64, T), Status>
where
    P: Fn() -> PFut,
    PFut: std::future::Future<Output = Result<(i64, Vec<ShardPoint>), Status>>,
    F: Fn(i64, Vec<ShardPoint>) -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let (revision, points) = read_point().await?;
        if newest > revision {
            return Err(ApiError::FutureRev.into());
        }
        match read(revision, points).await {
            Ok(r) => return Ok((revision, r)),
            Err(ApiError::LeaderChanged) if tries < POINT_TRIES => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// How long a serializable read over several shards waits at a time for
/// them all to reach the revision one of them reached before it looks
/// again whether each still has a leader, whose closes move an idle shard
/// on.
const CUT_WAIT_SLICE: Duration = Duration::from_millis(50);

/// How long a serializable read over several shards waits at most for them
/// all to reach the revision one of them reached: far above a close
/// interval and a commit. Past it (the keyspace not open, a shard far
/// behind) the read is served at the cut reached, stale as serializable
/// reads may be, rather than refused.
const CUT_CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// The newest revision a serializable read-only txn's ranges name that this
/// member has, 0 when they name none: its shards must reach it before it is
/// read (a range past the member's revision is a future one, which the
/// shards refuse).
fn txn_named_revision(keyspace: &Keyspace, req: &TxnRequest) -> i64 {
    validate::txn_newest_revision(req).min(keyspace.counter.reached.member_revision())
}

/// Asks the keyspace leader at `url` to run a txn over several shards.
async fn forward_txn(
    peers: &peer_client::PeerClient,
    url: &str,
    cluster_id: u64,
    req: &TxnRequest,
) -> peer_client::Forwarded<TxnResponse> {
    peers
        .call(
            url,
            hyper::Method::POST,
            peer_client::TXN_PATH,
            &[(peer_client::CLUSTER_HEADER, format!("{cluster_id:x}"))],
            bytes::Bytes::from(req.encode_to_vec()),
            peer_client::PEER_HTTP_TIMEOUT,
        )
        .await
        .and_decode(|b| TxnResponse::decode(b).map_err(|e| format!("bad txn answer: {e}")))
}

fn unexpected(what: &str) -> Status {
    Status::internal(format!(
        "cairn: shard answered {what} with the wrong result kind"
    ))
}

impl KvService {
    fn check_size(&self, m: &impl Message) -> Result<(), ApiError> {
        if m.encoded_len() > self.limits.max_request_bytes {
            return Err(ApiError::RequestTooLarge);
        }
        Ok(())
    }

    pub async fn range_across(&self, req: RangeRequest) -> Result<RangeResponse, Status> {
        validate::check_range(&req)?;
        if !req.serializable && self.members.local_is_learner() {
            // At once, before any read point is asked of a leader: a
            // learner serves serializable reads only.
            return Err(ApiError::NotSupportedForLearner.into());
        }
        let shards = self
            .router
            .routing
            .shards_for_range(&req.key, &req.range_end);
        let mut resp = if self.router.keyspace.is_some() && !req.serializable {
            self.range_at_point(&req, &shards).await?
        } else if let Some(keyspace) = &self.router.keyspace {
            // Serializable, several shards per member: read at a cut of the
            // revision order this member's shards have reached.
            if shards.len() == 1 && req.revision == 0 {
                // One shard's own state is a cut at its own revision.
                self.router.range(shards[0], req).await?
            } else {
                let revision = if req.revision > 0 {
                    keyspace
                        .counter
                        .reached
                        .wait_for(&shards, req.revision, REQUEST_TIMEOUT)
                        .await?;
                    req.revision
                } else {
                    self.current_cut(keyspace, &shards, 0).await?
                };
                let places = cross_read::cut_places(&shards, revision);
                cross_read::range_at(&self.router, &req, &places).await?
            }
        } else {
            self.router.range(shards[0], req).await?
        };
        self.identity.stamp(&mut resp.header);
        Ok(resp)
    }

    /// A linearizable range over `shards` at one point of the revision order
    /// for them all. A point whose entry a later leader replaced on some
    /// shard before it was read there is taken again.
    async fn range_at_point(
        &self,
        req: &RangeRequest,
        shards: &[ShardId],
    ) -> Result<RangeResponse, Status> {
        self.at_point(shards, req.revision, |revision, points| async move {
            let places = cross_read::point_places(shards, revision, points);
            cross_read::range_at(&self.router, req, &places).await
        })
        .await
    }

    /// A linearizable read over `shards` at one point of the revision
    /// order ([`read_at_point`], the point asked of the keyspace leader).
    async fn at_point<T, F, Fut>(
        &self,
        shards: &[ShardId],
        newest: i64,
        read: F,
    ) -> Result<T, Status>
    where
        F: Fn(i64, Vec<ShardPoint>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        read_at_point(|| self.read_point(shards), newest, read)
            .await
            .map(|(_, r)| r)
    }

    /// etcd's read-only txn on one shard, read as a range is and not
    /// through the log: serializable when every range is, else
    /// linearizable (with several shards, at a point of the one revision
    /// order, as a range is). As in etcd, only the ranges of the branch its
    /// compares take are checked: a revision named on the other branch
    /// never fails it.
    async fn read_txn(&self, shard: ShardId, req: TxnRequest) -> Result<TxnResponse, Status> {
        let serializable = validate::txn_is_serializable(&req);
        let Some(keyspace) = &self.router.keyspace else {
            return Ok(self.router.read_txn(shard, req, serializable, None).await?);
        };
        if !serializable {
            // The shard refuses a range past the point on the branch taken.
            return self
                .at_point(&[shard], 0, |revision, points| {
                    let at = ReadAt::point(revision, points[0]);
                    self.router.read_txn(shard, req.clone(), false, Some(at))
                })
                .await;
        }
        // Without a revision named, one shard's own state is a cut at its
        // own revision.
        let reached = &keyspace.counter.reached;
        let at = match txn_named_revision(keyspace, &req) {
            0 => None,
            named => {
                reached.wait_for(&[shard], named, REQUEST_TIMEOUT).await?;
                Some(ReadAt::cut(reached.cut(&[shard])))
            }
        };
        Ok(self.router.read_txn(shard, req, true, at).await?)
    }

    /// etcd's read-only txn over several shards, read at one revision of
    /// the keyspace and not through the logs ([`cross_read`]): a read
    /// point's when linearizable, else the cut this member's shards
    /// reached, once they reached every revision it names that this member
    /// has (as on one shard).
    async fn read_txn_across(&self, req: TxnRequest) -> Result<TxnResponse, Status> {
        let Some(keyspace) = &self.router.keyspace else {
            return Err(ApiError::Unsupported("a txn over several shards with one shard").into());
        };
        let shards: Vec<ShardId> = validate::txn_shards(&req, &self.router.routing)
            .into_iter()
            .collect();
        if !validate::txn_is_serializable(&req) {
            // The shards refuse a range past the point on the branch taken.
            return self
                .at_point(&shards, 0, |revision, points| {
                    let at = cross_read::point_places(&shards, revision, points);
                    let req = &req;
                    async move { cross_read::read_txn_at(&self.router, req, false, revision, &at).await }
                })
                .await;
        }
        let named = txn_named_revision(keyspace, &req);
        let revision = self.current_cut(keyspace, &shards, named).await?;
        let at = cross_read::cut_places(&shards, revision);
        Ok(cross_read::read_txn_at(&self.router, &req, true, revision, &at).await?)
    }

    /// The revision a serializable read over several `shards` is read at:
    /// the cut they reached, once they reached `named` (a revision the read
    /// names that this member has, else 0) and the highest revision any of
    /// them had reached when the read began. So such a read sees every write
    /// to its keys that this member acknowledged before it began, and
    /// nothing older than an earlier read of this member showed of them, as
    /// etcd's serializable reads on one member do: a member acknowledges a
    /// write once its shard has applied it, and the other shards get past
    /// it by applying their own entries, or an idle shard by the keyspace
    /// leader's next close (within a close interval and a commit). A shard
    /// that knows no leader gets no closes: the read is then served at the
    /// cut reached, stale as a cut-off etcd member's serializable read, as
    /// it is after [`CUT_CATCH_UP_WAIT`].
    async fn current_cut(
        &self,
        keyspace: &Keyspace,
        shards: &[ShardId],
        named: i64,
    ) -> Result<i64, ApiError> {
        let reached = &keyspace.counter.reached;
        if named > 0 {
            reached.wait_for(shards, named, REQUEST_TIMEOUT).await?;
        }
        let highest = reached.highest(shards);
        let until = Instant::now() + CUT_CATCH_UP_WAIT;
        while reached.cut(shards) < highest && self.readiness.shards_have_leader(shards) {
            if Instant::now() >= until {
                tracing::debug!(
                    highest,
                    cut = reached.cut(shards),
                    "a serializable read over several shards served before they caught up"
                );
                break;
            }
            // Each slice ends with a fresh look at the shards' leaders.
            reached.reach(shards, highest, CUT_WAIT_SLICE).await;
        }
        Ok(reached.cut(shards))
    }

    /// The read point of a linearizable read over `shards`, from the keyspace
    /// leader: this member, or asked over the peer port.
    async fn read_point(&self, shards: &[ShardId]) -> Result<(i64, Vec<ShardPoint>), Status> {
        let cluster_id = self.members.cluster_id();
        peer_client::at_shard_leader(
            &self.members,
            LEADERLESS_WAIT,
            || self.router.read_point(shards),
            |url| async move { self.peers.read_point(&url, cluster_id, shards).await },
        )
        .await
    }

    /// A txn over several shards: run by the keyspace leader, here or, when
    /// another member is, forwarded to it over the peer port. Retried
    /// through elections only while nothing was proposed.
    async fn txn_across(&self, req: TxnRequest) -> Result<TxnResponse, Status> {
        let deadline = Instant::now() + LEADERLESS_WAIT;
        let mut last: Status = ApiError::NoLeader.into();
        loop {
            // Apart from this request: a client that gives up must not stop
            // a txn half way through its holds.
            let run = tokio::spawn(cross_txn::run(self.router.clone(), req.clone()));
            let leader = match run.await {
                Ok(Ok(r)) => return Ok(r),
                Ok(Err(ApiError::NotLeader { leader })) => leader,
                Ok(Err(e @ (ApiError::NoLeader | ApiError::LeaderChanged))) => {
                    last = e.into();
                    crate::raft::NONE
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(e) => {
                    return Err(Status::internal(format!(
                        "cairn: txn over several shards: {e}"
                    )))
                }
            };
            let url = self
                .members
                .get(leader)
                .filter(|_| leader != self.members.local_id())
                .and_then(|m| m.peer_urls.first().cloned());
            if let Some(url) = url {
                match forward_txn(&self.peers, &url, self.members.cluster_id(), &req).await {
                    peer_client::Forwarded::Ok(r) => {
                        self.applied_here(&req, &r).await;
                        return Ok(r);
                    }
                    peer_client::Forwarded::NotLeader(_) => {}
                    // Not retried: the leader may have proposed it.
                    peer_client::Forwarded::Refused(s) | peer_client::Forwarded::Failed(s) => {
                        return Err(s)
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(last);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Before a txn over several shards that the keyspace leader ran is
    /// answered here: waits until the shards it wrote applied it here
    /// ([`Reached::applied_here`](crate::server::revisions::reached::Reached::applied_here)).
    async fn applied_here(&self, req: &TxnRequest, resp: &TxnResponse) {
        let (Some(keyspace), Some(header)) = (&self.router.keyspace, &resp.header) else {
            return;
        };
        let shards: Vec<ShardId> = validate::txn_written_shards(req, resp, &self.router.routing)
            .into_iter()
            .collect();
        keyspace
            .counter
            .reached
            .applied_here(
                &shards,
                header.revision,
                REQUEST_TIMEOUT,
                "a txn over several shards",
            )
            .await;
    }

    async fn delete_across(&self, req: DeleteRangeRequest) -> Result<DeleteRangeResponse, Status> {
        validate::check_delete(&req)?;
        self.check_size(&req)?;
        let shards = self
            .router
            .routing
            .shards_for_range(&req.key, &req.range_end);
        if shards.len() > 1 && self.router.keyspace.is_some() {
            // One revision for the whole range: a txn of the one delete.
            let txn = TxnRequest {
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestDeleteRange(req)),
                }],
                ..Default::default()
            };
            let mut r = self.txn_across(txn).await?;
            return match r.responses.pop().and_then(|op| op.response) {
                Some(response_op::Response::ResponseDeleteRange(mut d)) => {
                    d.header = r.header;
                    self.identity.stamp(&mut d.header);
                    Ok(d)
                }
                _ => Err(unexpected("delete")),
            };
        }
        let parts = join_all(
            shards
                .iter()
                .map(|&s| self.router.write(s, ShardReq::DeleteRange(req.clone()))),
        )
        .await;
        let mut merged = DeleteRangeResponse::default();
        for (&shard, part) in shards.iter().zip(parts) {
            match part? {
                WriteResult::DeleteRange(r) => {
                    merged.deleted += r.deleted;
                    merged.prev_kvs.extend(r.prev_kvs);
                    let rev = r.header.as_ref().map_or(0, |h| h.revision);
                    if merged.header.as_ref().is_none_or(|h| rev > h.revision) {
                        merged.header = r.header;
                    }
                }
                _ => {
                    return Err(ApiError::Storage {
                        shard,
                        reason: "delete answered with another result kind".into(),
                    }
                    .into())
                }
            }
        }
        merged.prev_kvs.sort_by(|a, b| a.key.cmp(&b.key));
        self.identity.stamp(&mut merged.header);
        Ok(merged)
    }

    /// Compacts every shard at the request's revision, which must be at or
    /// below the keyspace's read point (etcd's "future revision" otherwise).
    /// Each shard's compaction entry takes a revision above the read point,
    /// so it comes after every entry of its shard at or below the compacted
    /// revision: one compaction point for the whole keyspace. With one shard
    /// this is exactly etcd.
    async fn compact_all(&self, req: CompactionRequest) -> Result<CompactionResponse, Status> {
        let shards: Vec<ShardId> = self.router.routing.shard_ids().collect();
        let current = if self.router.keyspace.is_some() {
            self.read_point(&shards).await?.0
        } else {
            self.router.status(0).await?.revision
        };
        if req.revision > current {
            return Err(ApiError::FutureRev.into());
        }
        let parts = join_all(
            shards
                .iter()
                .map(|&s| self.router.write(s, ShardReq::Compaction(req))),
        )
        .await;
        let mut header = None;
        let mut any_ok = false;
        let mut first_err = None;
        for (&shard, part) in shards.iter().zip(parts) {
            match part {
                Ok(WriteResult::Compaction(r)) => {
                    any_ok = true;
                    let rev = r.header.as_ref().map_or(0, |h| h.revision);
                    if header
                        .as_ref()
                        .is_none_or(|h: &ResponseHeader| rev > h.revision)
                    {
                        header = r.header;
                    }
                }
                // A shard already compacted at or past this revision (a
                // compaction retried after part of it failed) is not an error
                // for the cluster unless every shard says so.
                Err(ApiError::Compacted) => first_err = first_err.or(Some(ApiError::Compacted)),
                Err(e) => return Err(e.into()),
                Ok(_) => {
                    return Err(ApiError::Storage {
                        shard,
                        reason: "compaction answered with another result kind".into(),
                    }
                    .into())
                }
            }
        }
        if !any_ok {
            return Err(first_err.unwrap_or(ApiError::Compacted).into());
        }
        let mut resp = CompactionResponse { header };
        self.identity.stamp(&mut resp.header);
        Ok(resp)
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        check::range(&self.auth, caller.as_ref(), request.get_ref())?;
        Ok(Response::new(
            self.range_across(request.into_inner()).await?,
        ))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        let req = request.into_inner();
        validate::check_put(&req)?;
        self.check_size(&req)?;
        check::put(&self.auth, caller.as_ref(), &req)?;
        check::lease_keys(&self.auth, caller.as_ref(), &self.router, req.lease).await?;
        let shard = self.router.routing.shard_for_key(&req.key);
        match self.router.write(shard, ShardReq::Put(req)).await? {
            WriteResult::Put(mut r) => {
                self.identity.stamp(&mut r.header);
                Ok(Response::new(r))
            }
            _ => Err(unexpected("put")),
        }
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        check::delete(&self.auth, caller.as_ref(), request.get_ref())?;
        Ok(Response::new(
            self.delete_across(request.into_inner()).await?,
        ))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let caller = caller_of(&self.auth, &request)?;
        let req = request.into_inner();
        validate::check_txn(&req, self.limits.max_txn_ops)?;
        self.check_size(&req)?;
        for lease in check::txn(&self.auth, caller.as_ref(), &req)? {
            check::lease_keys(&self.auth, caller.as_ref(), &self.router, lease).await?;
        }
        // No learner gets here: its call gate refuses every txn, as etcd
        // 3.4's refuses them.
        let read_only = validate::txn_is_read_only(&req);
        let Some(shard) = validate::txn_shard(&req, &self.router.routing) else {
            let mut r = if read_only {
                self.read_txn_across(req).await?
            } else {
                self.txn_across(req).await?
            };
            self.identity.stamp(&mut r.header);
            return Ok(Response::new(r));
        };
        if read_only {
            let mut r = self.read_txn(shard, req).await?;
            self.identity.stamp(&mut r.header);
            return Ok(Response::new(r));
        }
        match self.router.write(shard, ShardReq::Txn(req)).await? {
            WriteResult::Txn(mut r) => {
                self.identity.stamp(&mut r.header);
                Ok(Response::new(r))
            }
            _ => Err(unexpected("txn")),
        }
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        Ok(Response::new(self.compact_all(request.into_inner()).await?))
    }
}

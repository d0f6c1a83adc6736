//! The peer port's HTTP side: what members ask of each other outside Raft.
//!
//! The peer port speaks the framed peer protocol (`cairn-net`), whose streams
//! start with the magic `CRNF`; a connection that starts with an HTTP method
//! is served here instead, as etcd serves its own peer HTTP API beside Raft:
//!
//! | request | answer |
//! |---|---|
//! | `GET /cairn/members` | the member table (`cairnpb.MemberTable`, protobuf): how a member started with `--initial-cluster-state existing` learns the cluster id, its own id and the shard count |
//! | `POST /cairn/conf-change` | carries out a membership change of one shard (`cairnpb.ShardConfChange`) if this member leads the shard: `200`, or `409` with `x-cairn-leader` naming the leader, or the gRPC error as `x-cairn-grpc-code` plus the message |
//! | `POST /cairn/removed` | tells a member it was removed from the cluster (`x-cairn-member` must be its id): it stops |
//! | `POST /cairn/lease-renew` | renews a lease at the leader of the shard in `x-cairn-shard` (`etcdserverpb.LeaseKeepAliveRequest`; answer `LeaseKeepAliveResponse`, TTL 0 when the shard has no such lease): `200`, or `409` with `x-cairn-leader` as above |
//! | `POST /cairn/lease-renews` | renews several leases at once at the leader of the shard in `x-cairn-shard` (`cairnpb.LeaseRenewals`, at most 4,096; answer `cairnpb.LeaseRenewalTtls`, each lease's TTL as above, in order): `200`, or `409` with `x-cairn-leader` as above when the shard refuses them (one refusal covers the whole request) |
//! | `POST /cairn/read-point` | the read point of a linearizable read over the shards listed (`cairnpb.KeyspaceReadPoint`), if this member is the keyspace leader: `200` with the revision and each shard's index, or `409` with `x-cairn-leader` naming shard 0's (or that shard's) leader |
//! | `POST /cairn/txn` | runs a txn over several shards (`etcdserverpb.TxnRequest`) if this member is the keyspace leader: `200` with the `TxnResponse`, or `409` with `x-cairn-leader` when nothing was proposed, or the gRPC error as above |
//! | `POST /cairn/lease-revoke` | with several shards, revokes a lease on every shard at one revision (`etcdserverpb.LeaseRevokeRequest`; answer `LeaseRevokeResponse`) if this member is the keyspace leader: `200`, or `409` with `x-cairn-leader` as above |
//! | `POST /cairn/lease-ttl` | a lease's time left at the leader of the shard in `x-cairn-shard` (`LeaseTimeToLiveRequest`; answer `LeaseTimeToLiveResponse` with the time left in milliseconds, -1 when the shard has no such lease): `200` or `409` as above |
//!
//! Every request but `GET /cairn/members` must carry the cluster id in
//! `x-cairn-cluster-id` (hex), so a member of another cluster is refused.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::cairnpb::{KeyspaceReadPoint, ShardConfChange};
use cairn_proto::etcdserverpb::TxnRequest;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prost::Message as _;

use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::member::peer_lease::{serve_lease, PeerLeaseAnswer};
use crate::server::members::MemberRegistry;
use crate::server::peer_client::{
    CLUSTER_HEADER, CODE_HEADER, LEADER_HEADER, MEMBER_HEADER, SHARD_HEADER, TXN_PATH,
};

/// Largest request body accepted (a membership change is a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// Largest txn forwarded to the keyspace leader: the forwarding member
/// checked it against its request size limit, which is at most this.
const MAX_TXN_BODY_BYTES: usize = cairn_mvcc::MAX_REQUEST_BYTES_LIMIT + 64 * 1024;

/// Whether a connection's first bytes are an HTTP request this side serves.
pub fn is_http(prefix: &[u8]) -> bool {
    prefix.starts_with(b"GET ") || prefix.starts_with(b"POST")
}

/// What the peer HTTP side serves from.
#[derive(Clone)]
pub struct PeerHttp {
    pub router: Arc<Router>,
    pub members: Arc<MemberRegistry>,
}

impl PeerHttp {
    /// Serves HTTP/1 on one connection (in clear, or the peer port's TLS
    /// session) until the peer closes it.
    pub async fn serve(self, stream: cairn_net::OtherStream, peer: String) {
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let this = self.clone();
            async move { Ok::<_, Infallible>(this.respond(req).await) }
        });
        if let Err(e) = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(5))
            .serve_connection(TokioIo::new(stream), service)
            .await
        {
            tracing::debug!(peer, error = %e, "peer HTTP connection ended with an error");
        }
    }

    async fn respond(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        if method == Method::GET && path == "/cairn/members" {
            return answer(
                StatusCode::OK,
                Bytes::from(self.members.table().encode_to_vec()),
            );
        }
        if method != Method::POST
            || !matches!(
                path.as_str(),
                "/cairn/conf-change"
                    | "/cairn/removed"
                    | "/cairn/lease-renew"
                    | "/cairn/lease-renews"
                    | "/cairn/lease-ttl"
                    | "/cairn/lease-revoke"
                    | "/cairn/read-point"
                    | TXN_PATH
            )
        {
            return text(StatusCode::NOT_FOUND, format!("no {method} {path} here"));
        }
        let cluster = req
            .headers()
            .get(CLUSTER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        if cluster != Some(self.members.cluster_id()) {
            return text(
                StatusCode::PRECONDITION_FAILED,
                format!(
                    "cluster id {:?} is not this member's cluster {:x}",
                    cluster,
                    self.members.cluster_id()
                ),
            );
        }
        if path == "/cairn/removed" {
            let member = req
                .headers()
                .get(MEMBER_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| u64::from_str_radix(v, 16).ok());
            if member != Some(self.members.local_id()) {
                return text(StatusCode::BAD_REQUEST, "not this member".to_string());
            }
            self.members.mark_removed();
            return text(StatusCode::OK, "stopping\n".to_string());
        }
        let shard_header = req
            .headers()
            .get(SHARD_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let limit = if path == TXN_PATH {
            MAX_TXN_BODY_BYTES
        } else {
            MAX_BODY_BYTES
        };
        let body = match Limited::new(req.into_body(), limit).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
        };
        if path.starts_with("/cairn/lease-") {
            return match serve_lease(&self.router, &path, &shard_header, body).await {
                PeerLeaseAnswer::Ok(b) => answer(StatusCode::OK, b),
                PeerLeaseAnswer::NotLeader(leader) => not_leader(leader),
                PeerLeaseAnswer::Failed(e) => failed(&e),
                PeerLeaseAnswer::BadRequest(m) => text(StatusCode::BAD_REQUEST, m),
            };
        }
        if path == "/cairn/read-point" {
            return serve_read_point(&self.router, body).await;
        }
        if path == TXN_PATH {
            return serve_txn(&self.router, body).await;
        }
        let change = match ShardConfChange::decode(body) {
            Ok(c) => c,
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad change: {e}")),
        };
        let Ok(kind) = crate::raft::ConfChangeType::try_from(change.change_type) else {
            return text(StatusCode::BAD_REQUEST, "unknown change type".to_string());
        };
        let Some(member) = change.member else {
            return text(
                StatusCode::BAD_REQUEST,
                "no member in the change".to_string(),
            );
        };
        if change.shard as usize >= self.router.routing.shard_count() {
            return text(
                StatusCode::BAD_REQUEST,
                format!("no shard {}", change.shard),
            );
        }
        match self
            .router
            .conf_change(change.shard, kind, member, change.check_only)
            .await
        {
            Ok(_) => text(StatusCode::OK, "applied\n".to_string()),
            Err(ApiError::NotLeader { leader }) => not_leader(leader),
            Err(e) => failed(&e),
        }
    }
}

/// Serves `POST /cairn/read-point`: see [`KeyspaceReadPoint`].
async fn serve_read_point(router: &Router, body: Bytes) -> Response<Full<Bytes>> {
    let asked = match KeyspaceReadPoint::decode(body) {
        Ok(a) => a,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad read point: {e}")),
    };
    let shard_count = router.routing.shard_count();
    if asked.shards.is_empty() || asked.shards.iter().any(|&s| s as usize >= shard_count) {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "shards {:?} asked; this member has shards 0 to {}",
                asked.shards,
                shard_count - 1
            ),
        );
    }
    match router.read_point(&asked.shards).await {
        Ok((revision, points)) => answer(
            StatusCode::OK,
            Bytes::from(
                KeyspaceReadPoint {
                    shards: asked.shards,
                    indexes: points.iter().map(|p| p.index).collect(),
                    revision,
                    terms: points.iter().map(|p| p.term).collect(),
                }
                .encode_to_vec(),
            ),
        ),
        Err(ApiError::NotLeader { leader }) => not_leader(leader),
        Err(e) => failed(&e),
    }
}

/// Serves `POST /cairn/txn`: runs a txn over several shards
/// (`etcdserverpb.TxnRequest`) if this member is the keyspace leader: `200`
/// with the `TxnResponse`, or `409` with `x-cairn-leader` naming the leader
/// of a shard it touches, when nothing was proposed.
async fn serve_txn(router: &Arc<Router>, body: Bytes) -> Response<Full<Bytes>> {
    let req = match TxnRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad txn: {e}")),
    };
    // Run apart from this connection: a peer that gives up must not stop a
    // txn half way through its holds.
    let run = tokio::spawn(crate::server::keyspace::cross_txn::run(router.clone(), req));
    match run.await {
        Ok(Ok(r)) => answer(StatusCode::OK, Bytes::from(r.encode_to_vec())),
        Ok(Err(ApiError::NotLeader { leader })) => not_leader(leader),
        Ok(Err(e)) => failed(&e),
        // The task ended without an answer (it panicked, or the runtime is
        // stopping): its parts may or may not have been proposed.
        Err(e) => {
            tracing::error!(error = %e, "a txn over several shards ended without an answer");
            failed(&ApiError::TimeoutLeaderFail)
        }
    }
}

/// `409`: this member does not lead the shard; `leader` does (0: unknown).
fn not_leader(leader: u64) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::CONFLICT, "not leader\n".to_string());
    if let Ok(v) = format!("{leader:x}").parse() {
        r.headers_mut().insert(LEADER_HEADER, v);
    }
    r
}

/// `422`: the request failed with `e`, whose gRPC code rides in a header;
/// `503` when asking again may succeed (`ApiError::is_transient`).
fn failed(e: &ApiError) -> Response<Full<Bytes>> {
    let status = if e.is_transient() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    let mut r = text(status, e.to_string());
    if let Ok(v) = (e.code() as i32).to_string().parse() {
        r.headers_mut().insert(CODE_HEADER, v);
    }
    r
}

fn answer(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    answer(status, Bytes::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::peer_client::{Forwarded, PeerClient};

    #[tokio::test]
    async fn concurrent_calls_reuse_pooled_connections() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    // Slow enough that every call of a wave is in flight at once.
                    let service = hyper::service::service_fn(|_: Request<Incoming>| async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let client = PeerClient::new(None);
        let wave = || {
            futures::future::join_all((0..64).map(|_| {
                client.call(
                    &url,
                    Method::POST,
                    "/cairn/lease-renew",
                    &[],
                    Bytes::new(),
                    Duration::from_secs(30),
                )
            }))
        };
        for answer in wave().await {
            assert!(matches!(answer, Forwarded::Ok(_)), "{answer:?}");
        }
        let opened = accepted.load(Ordering::SeqCst);
        assert!(
            (1..=64).contains(&opened),
            "{opened} connections for 64 calls"
        );
        for _ in 0..3 {
            for answer in wave().await {
                assert!(matches!(answer, Forwarded::Ok(_)), "{answer:?}");
            }
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            opened,
            "waves of as many calls at once as the first opened new connections"
        );
    }

    #[test]
    fn only_http_methods_this_side_serves_are_sniffed() {
        assert!(is_http(b"GET /cairn/members"));
        assert!(is_http(b"POST /cairn/conf-change"));
        assert!(!is_http(b"CRNF\x01"));
        assert!(!is_http(b"\x00\x01garbage"));
    }
}

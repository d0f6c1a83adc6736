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
//! | `POST /cairn/read-point` | the read point of a linearizable read over the shards listed (`cairnpb.KeyspaceReadPoint`), if this member is the keyspace leader: `200` with the revision and each shard's index, or `409` with `x-cairn-leader` naming shard 0's (or that shard's) leader |
//! | `POST /cairn/txn` | runs a txn over several shards (`etcdserverpb.TxnRequest`) if this member is the keyspace leader: `200` with the `TxnResponse`, or `409` with `x-cairn-leader` when nothing was proposed, or the gRPC error as above |
//! | `POST /cairn/lease-revoke` | with several shards, revokes a lease on every shard at one revision (`etcdserverpb.LeaseRevokeRequest`; answer `LeaseRevokeResponse`) if this member is the keyspace leader: `200`, or `409` with `x-cairn-leader` as above |
//! | `POST /cairn/lease-ttl` | a lease's time left at the leader of the shard in `x-cairn-shard` (`LeaseTimeToLiveRequest`; answer `LeaseTimeToLiveResponse` with the time left in milliseconds, -1 when the shard has no such lease): `200` or `409` as above |
//!
//! Every request but `GET /cairn/members` must carry the cluster id in
//! `x-cairn-cluster-id` (hex), so a member of another cluster is refused.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::cairnpb::{KeyspaceReadPoint, MemberTable, ShardConfChange};
use cairn_proto::etcdserverpb::TxnRequest;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prost::Message as _;
use tokio::net::TcpStream;
use tonic::Code;

use crate::routing::ShardId;
use crate::server::command::ShardPoint;
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::member::peer_lease::{serve_lease, PeerLeaseAnswer};
use crate::server::members::MemberRegistry;

pub const CLUSTER_HEADER: &str = "x-cairn-cluster-id";
pub const LEADER_HEADER: &str = "x-cairn-leader";
pub const CODE_HEADER: &str = "x-cairn-grpc-code";
pub const MEMBER_HEADER: &str = "x-cairn-member";
/// The header naming the shard of a forwarded lease request.
pub const SHARD_HEADER: &str = "x-cairn-shard";

/// Largest request body accepted (a membership change is a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// Largest txn forwarded to the keyspace leader: the forwarding member
/// checked it against its request size limit, which is at most this.
const MAX_TXN_BODY_BYTES: usize = cairn_mvcc::MAX_REQUEST_BYTES_LIMIT + 64 * 1024;

/// A txn over several shards, forwarded to the keyspace leader.
pub const TXN_PATH: &str = "/cairn/txn";

/// Largest answer read from a peer (a lease's TimeToLive with its keys).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// How long one request to a peer may take, connection included.
pub const PEER_HTTP_TIMEOUT: Duration = Duration::from_secs(10);

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
            self.members.record_removal();
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

/// `422`: the request failed with `e`, whose gRPC code rides in a header.
fn failed(e: &ApiError) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::UNPROCESSABLE_ENTITY, e.to_string());
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

/// One keep-alive HTTP/1 connection to a peer's HTTP side.
type PeerConnection = SendRequest<Full<Bytes>>;

/// Idle keep-alive connections kept per peer URL by one client (one per
/// core). A request holds its connection until answered, so the pool must
/// cover the requests a core forwards at once (a lease keep-alive stream per
/// client, forwarded from a follower): a connection dropped for lack of room
/// is a TCP connect and a TIME_WAIT socket for the next request that finds
/// the pool empty.
const IDLE_CONNECTIONS_PER_PEER: usize = 256;

/// What a peer's HTTP side answered: its body, that another member leads the
/// shard asked about (`x-cairn-leader`, 0 when none is known), or a failure
/// as a gRPC status (the leader's own error, with etcd's message, when the
/// peer gave `x-cairn-grpc-code`; Unavailable when it could not be reached).
#[derive(Debug)]
pub enum Forwarded<T = Bytes> {
    Ok(T),
    NotLeader(u64),
    Failed(tonic::Status),
}

impl<T> Forwarded<T> {
    /// Decodes an `Ok` body; a body that does not decode is a failure.
    pub fn and_decode<U>(self, decode: impl FnOnce(T) -> Result<U, String>) -> Forwarded<U> {
        match self {
            Forwarded::Ok(v) => match decode(v) {
                Ok(u) => Forwarded::Ok(u),
                Err(e) => Forwarded::Failed(tonic::Status::internal(e)),
            },
            Forwarded::NotLeader(l) => Forwarded::NotLeader(l),
            Forwarded::Failed(s) => Forwarded::Failed(s),
        }
    }
}

/// Requests to peers' HTTP sides over pooled keep-alive connections, by
/// peer URL (https:// ones over TLS with the member's peer certificate).
/// Cheap to clone; clones share the pool.
#[derive(Clone, Default)]
pub struct PeerClient {
    idle: Arc<Mutex<HashMap<String, Vec<PeerConnection>>>>,
    tls: Option<cairn_net::PeerTls>,
}

impl PeerClient {
    /// A client that reaches https:// peers with `tls`.
    pub fn new(tls: Option<cairn_net::PeerTls>) -> Self {
        PeerClient {
            idle: Arc::default(),
            tls,
        }
    }

    fn take_idle(&self, url: &str) -> Option<PeerConnection> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(url)?;
        while let Some(s) = list.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put_idle(&self, url: &str, s: PeerConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(url.to_string()).or_default();
        if list.len() < IDLE_CONNECTIONS_PER_PEER {
            list.push(s);
        }
    }

    async fn connect(&self, url: &str) -> Result<PeerConnection, String> {
        // A name is looked up on tokio's blocking pool, not on this core.
        let host_port =
            crate::config::url_host_port("peer-urls", url).map_err(|e| e.to_string())?;
        let stream = TcpStream::connect(host_port.as_str())
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
        let _ = stream.set_nodelay(true);
        if !crate::config::url_is_https(url) {
            return Self::handshake(url, stream).await;
        }
        let Some(tls) = &self.tls else {
            return Err(format!(
                "{url} is https but this member has no peer TLS \
                 (--peer-cert-file and --peer-key-file, or --peer-auto-tls)"
            ));
        };
        let name = cairn_net::tls::server_name_of(&host_port)?;
        let config = tls.0.client_config()?;
        let session = tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .map_err(|e| format!("{url}: TLS handshake: {e}"))?;
        Self::handshake(url, session).await
    }

    async fn handshake<S>(url: &str, stream: S) -> Result<PeerConnection, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn send(
        sender: &mut PeerConnection,
        url: &str,
        method: &Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
    ) -> Result<(u16, hyper::HeaderMap, Bytes), String> {
        sender
            .ready()
            .await
            .map_err(|e| format!("{url}: connection closed: {e}"))?;
        let mut req = Request::builder().method(method.clone()).uri(path).header(
            hyper::header::HOST,
            url.trim_start_matches("https://")
                .trim_start_matches("http://"),
        );
        for (name, value) in headers {
            req = req.header(*name, value.as_str());
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("{url}: reading the answer: {e}"))?
            .to_bytes();
        Ok((status, headers, body))
    }

    /// Sends one request to the peer at `url` and reads its whole answer,
    /// within `timeout`. A pooled connection the peer closed meanwhile fails
    /// once and the request is sent again on a fresh one.
    pub async fn call(
        &self,
        url: &str,
        method: Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
        timeout: Duration,
    ) -> Forwarded {
        let run = async {
            let mut answer = Err(String::new());
            if let Some(mut s) = self.take_idle(url) {
                answer = Self::send(&mut s, url, &method, path, headers, body.clone()).await;
                if answer.is_ok() {
                    self.put_idle(url, s);
                }
            }
            if answer.is_err() {
                let mut s = self.connect(url).await?;
                answer = Self::send(&mut s, url, &method, path, headers, body).await;
                if answer.is_ok() {
                    self.put_idle(url, s);
                }
            }
            answer
        };
        let (status, headers, body) = match tokio::time::timeout(timeout, run).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Forwarded::Failed(tonic::Status::unavailable(e)),
            Err(_) => {
                return Forwarded::Failed(tonic::Status::unavailable(format!(
                    "{url} did not answer within {timeout:?}"
                )))
            }
        };
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        match status {
            200 => Forwarded::Ok(body),
            409 => Forwarded::NotLeader(
                header(LEADER_HEADER)
                    .and_then(|v| u64::from_str_radix(v, 16).ok())
                    .unwrap_or(0),
            ),
            _ => {
                let message = String::from_utf8_lossy(&body);
                match header(CODE_HEADER).and_then(|v| v.parse::<i32>().ok()) {
                    Some(code) => Forwarded::Failed(tonic::Status::new(Code::from(code), message)),
                    None => Forwarded::Failed(tonic::Status::unavailable(format!(
                        "{url} answered {status}: {message}"
                    ))),
                }
            }
        }
    }
}

/// Runs `local` on this member's driver of a shard; where another member
/// leads the shard, runs `remote` with the leader's peer URL instead.
/// Retried through elections and leader changes for at most `wait`.
pub async fn at_shard_leader<T, L, LF, R, RF>(
    members: &MemberRegistry,
    wait: Duration,
    local: L,
    remote: R,
) -> Result<T, tonic::Status>
where
    L: Fn() -> LF,
    LF: std::future::Future<Output = Result<T, ApiError>>,
    R: Fn(String) -> RF,
    RF: std::future::Future<Output = Forwarded<T>>,
{
    let deadline = Instant::now() + wait;
    let mut last: tonic::Status = ApiError::NoLeader.into();
    let local_id = members.local_id();
    loop {
        let leader = match local().await {
            Ok(v) => return Ok(v),
            Err(ApiError::NotLeader { leader }) => leader,
            Err(e @ (ApiError::NoLeader | ApiError::LeaderChanged | ApiError::Timeout)) => {
                last = e.into();
                crate::raft::NONE
            }
            Err(e) => return Err(e.into()),
        };
        let url = members
            .get(leader)
            .filter(|_| leader != local_id)
            .and_then(|m| m.peer_urls.first().cloned());
        if let Some(url) = url {
            match remote(url).await {
                Forwarded::Ok(v) => return Ok(v),
                Forwarded::NotLeader(_) => {}
                Forwarded::Failed(s) if s.code() == Code::Unavailable => last = s,
                Forwarded::Failed(s) => return Err(s),
            }
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl PeerClient {
    /// Asks the member at `url` for the read point of a linearizable read
    /// over `shards`: the revision, and each shard's index.
    pub async fn read_point(
        &self,
        url: &str,
        cluster_id: u64,
        shards: &[ShardId],
    ) -> Forwarded<(i64, Vec<ShardPoint>)> {
        let body = KeyspaceReadPoint {
            shards: shards.to_vec(),
            ..Default::default()
        }
        .encode_to_vec();
        self.call(
            url,
            Method::POST,
            "/cairn/read-point",
            &[(CLUSTER_HEADER, format!("{cluster_id:x}"))],
            Bytes::from(body),
            PEER_HTTP_TIMEOUT,
        )
        .await
        .and_decode(|b| {
            let point = KeyspaceReadPoint::decode(b).map_err(|e| format!("bad read point: {e}"))?;
            if point.shards != shards
                || point.indexes.len() != shards.len()
                || !(point.terms.is_empty() || point.terms.len() == shards.len())
            {
                return Err(format!(
                    "read point for shards {:?} answered for {:?} with {} indexes and {} terms",
                    shards,
                    point.shards,
                    point.indexes.len(),
                    point.terms.len()
                ));
            }
            let terms = point.terms.into_iter().chain(std::iter::repeat(0));
            let points = point
                .indexes
                .into_iter()
                .zip(terms)
                .map(|(index, term)| ShardPoint { index, term })
                .collect();
            Ok((point.revision, points))
        })
    }

    /// Fetches the member table from a member's peer URL.
    pub async fn fetch_members(&self, peer_url: &str) -> Result<MemberTable, String> {
        let answer = self
            .call(
                peer_url,
                Method::GET,
                "/cairn/members",
                &[],
                Bytes::new(),
                PEER_HTTP_TIMEOUT,
            )
            .await
            .and_decode(|b| {
                MemberTable::decode(b).map_err(|e| format!("{peer_url}: member table: {e}"))
            });
        match answer {
            Forwarded::Ok(t) => Ok(t),
            Forwarded::NotLeader(_) => Err(format!("{peer_url} answered 409")),
            Forwarded::Failed(s) => Err(s.message().to_string()),
        }
    }

    /// Carries a membership change of one shard to the member at `peer_url`.
    pub async fn forward_conf_change(
        &self,
        peer_url: &str,
        cluster_id: u64,
        change: &ShardConfChange,
    ) -> Forwarded<()> {
        self.call(
            peer_url,
            Method::POST,
            "/cairn/conf-change",
            &[(CLUSTER_HEADER, format!("{cluster_id:x}"))],
            Bytes::from(change.encode_to_vec()),
            PEER_HTTP_TIMEOUT,
        )
        .await
        .and_decode(|_| Ok(()))
    }

    /// Tells a removed member at `peer_url` that it was removed.
    pub async fn tell_removed(
        &self,
        peer_url: &str,
        cluster_id: u64,
        member: u64,
    ) -> Result<(), String> {
        let headers = [
            (CLUSTER_HEADER, format!("{cluster_id:x}")),
            (MEMBER_HEADER, format!("{member:x}")),
        ];
        match self
            .call(
                peer_url,
                Method::POST,
                "/cairn/removed",
                &headers,
                Bytes::new(),
                PEER_HTTP_TIMEOUT,
            )
            .await
        {
            Forwarded::Ok(_) => Ok(()),
            Forwarded::NotLeader(_) => Err(format!("{peer_url} answered 409")),
            Forwarded::Failed(s) => Err(s.message().to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

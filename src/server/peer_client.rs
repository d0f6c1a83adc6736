//! The client of the peer port's HTTP side (`member/peer_http.rs` serves
//! it): pooled keep-alive connections to the other members, and a request
//! sent to a shard's leader wherever it is. The API services forward through
//! it; the paths and headers both sides speak are here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::cairnpb::{KeyspaceReadPoint, MemberTable, ShardConfChange};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::Code;

use crate::routing::ShardId;
use crate::server::command::ShardPoint;
use crate::server::errors::ApiError;
use crate::server::members::MemberRegistry;

pub const CLUSTER_HEADER: &str = "x-cairn-cluster-id";
pub const LEADER_HEADER: &str = "x-cairn-leader";
pub const CODE_HEADER: &str = "x-cairn-grpc-code";
pub const MEMBER_HEADER: &str = "x-cairn-member";
/// The header naming the shard of a forwarded lease request.
pub const SHARD_HEADER: &str = "x-cairn-shard";

/// A txn over several shards, forwarded to the keyspace leader.
pub const TXN_PATH: &str = "/cairn/txn";

/// Largest answer read from a peer (a lease's TimeToLive with its keys).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// How long one request to a peer may take, connection included.
pub const PEER_HTTP_TIMEOUT: Duration = Duration::from_secs(10);

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
/// shard asked about (`x-cairn-leader`, 0 when none is known), a refusal
/// that asking again would not change, or a failure that it might, as a
/// gRPC status (the leader's own error, with etcd's message, when the peer
/// gave `x-cairn-grpc-code`; Unavailable when it could not be reached).
#[derive(Debug)]
pub enum Forwarded<T = Bytes> {
    Ok(T),
    NotLeader(u64),
    /// The peer's final answer (an error that is not `is_transient`).
    Refused(tonic::Status),
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
            Forwarded::Refused(s) => Forwarded::Refused(s),
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
                // Boxed: connecting (TCP, maybe TLS) is rare next to sending on
                // a pooled connection, and its state is most of a call's size;
                // unboxed, every future that may forward would carry it.
                let mut s = Box::pin(self.connect(url)).await?;
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
                    // 503: a transient error of the peer's (`is_transient`).
                    Some(code) if status == 503 => {
                        Forwarded::Failed(tonic::Status::new(Code::from(code), message))
                    }
                    Some(code) => Forwarded::Refused(tonic::Status::new(Code::from(code), message)),
                    None => Forwarded::Failed(tonic::Status::unavailable(format!(
                        "{url} answered {status}: {message}"
                    ))),
                }
            }
        }
    }

    /// Posts a request about `shard` (a lease's, forwarded to the shard's
    /// leader) to the peer at `url`, with the cluster id and shard headers.
    pub async fn post_for_shard(
        &self,
        url: &str,
        path: &str,
        cluster_id: u64,
        shard: ShardId,
        body: Bytes,
        timeout: Duration,
    ) -> Forwarded {
        let headers = [
            (CLUSTER_HEADER, format!("{cluster_id:x}")),
            (SHARD_HEADER, shard.to_string()),
        ];
        self.call(url, Method::POST, path, &headers, body, timeout)
            .await
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
            Err(e) if e.is_transient() => {
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
                // A leader's refusal stands, as when this member leads.
                Forwarded::Refused(s) => return Err(s),
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
            Forwarded::Refused(s) | Forwarded::Failed(s) => Err(s.message().to_string()),
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
            Forwarded::Refused(s) | Forwarded::Failed(s) => Err(s.message().to_string()),
        }
    }
}

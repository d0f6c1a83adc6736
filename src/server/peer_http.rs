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
//! | `POST /cairn/lease-ttl` | a lease's time left at the leader of the shard in `x-cairn-shard` (`LeaseTimeToLiveRequest`; answer `LeaseTimeToLiveResponse` with the time left in milliseconds, -1 when the shard has no such lease): `200` or `409` as above |
//!
//! Every request but `GET /cairn/members` must carry the cluster id in
//! `x-cairn-cluster-id` (hex), so a member of another cluster is refused.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::cairnpb::{MemberTable, ShardConfChange};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

use super::errors::ApiError;
use super::members::MemberRegistry;
use super::router::Router;

pub const CLUSTER_HEADER: &str = "x-cairn-cluster-id";
pub const LEADER_HEADER: &str = "x-cairn-leader";
pub const CODE_HEADER: &str = "x-cairn-grpc-code";
pub const MEMBER_HEADER: &str = "x-cairn-member";

/// Largest request body accepted (a membership change is a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// Largest answer read by the client side (a member table of many members).
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

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
    /// Serves HTTP/1 on one connection until the peer closes it.
    pub async fn serve(self, stream: TcpStream, peer: String) {
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
                "/cairn/conf-change" | "/cairn/removed" | "/cairn/lease-renew" | "/cairn/lease-ttl"
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
            tracing::warn!("this member was removed from the cluster; stopping");
            if let Err(e) = self.members.mark_removed() {
                tracing::error!(error = %e, "recording the removal in member.toml failed");
            }
            return text(StatusCode::OK, "stopping\n".to_string());
        }
        let shard_header = req
            .headers()
            .get(super::lease::SHARD_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
        };
        if path.starts_with("/cairn/lease-") {
            use super::lease::PeerLeaseAnswer;
            return match super::lease::serve_peer(&self.router, &path, &shard_header, body).await {
                PeerLeaseAnswer::Ok(b) => answer(StatusCode::OK, b),
                PeerLeaseAnswer::NotLeader(leader) => not_leader(leader),
                PeerLeaseAnswer::Failed(e) => failed(&e),
                PeerLeaseAnswer::BadRequest(m) => text(StatusCode::BAD_REQUEST, m),
            };
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

/// An answer from a peer's HTTP side.
#[derive(Debug)]
pub struct PeerAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl PeerAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request to a peer URL (`http://host:port`), answered in full.
pub async fn request(
    peer_url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Result<PeerAnswer, String> {
    let addrs = crate::config::url_to_addrs("peer-urls", peer_url).map_err(|e| e.to_string())?;
    let run = async {
        let mut stream = TcpStream::connect(addrs.as_slice())
            .await
            .map_err(|e| format!("connecting to {peer_url}: {e}"))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-length: {}\r\n",
            addrs[0],
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream
            .write_all(head.as_bytes())
            .await
            .and(stream.write_all(body).await)
            .map_err(|e| format!("writing to {peer_url}: {e}"))?;
        let mut raw = Vec::new();
        (&mut stream)
            .take(MAX_ANSWER_BYTES as u64 + 1)
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("reading from {peer_url}: {e}"))?;
        if raw.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "{peer_url} answered more than {MAX_ANSWER_BYTES} bytes"
            ));
        }
        parse_answer(&raw).map_err(|e| format!("{peer_url}: {e}"))
    };
    tokio::time::timeout(PEER_HTTP_TIMEOUT, run)
        .await
        .map_err(|_| format!("{peer_url} did not answer within {PEER_HTTP_TIMEOUT:?}"))?
}

/// Parses an HTTP/1.1 answer whose body runs to the end of the connection or
/// to its `content-length`.
fn parse_answer(raw: &[u8]) -> Result<PeerAnswer, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("answer has no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "answer headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = &raw[end + 4..];
    if let Some(len) = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        if body.len() < len {
            return Err(format!(
                "answer body is {} bytes, content-length says {len}",
                body.len()
            ));
        }
        body = &body[..len];
    }
    Ok(PeerAnswer {
        status,
        headers,
        body: Bytes::copy_from_slice(body),
    })
}

/// Fetches the member table from a member's peer URL.
pub async fn fetch_members(peer_url: &str) -> Result<MemberTable, String> {
    let a = request(peer_url, "GET", "/cairn/members", &[], &[]).await?;
    if a.status != 200 {
        return Err(format!("{peer_url} answered {}", a.status));
    }
    MemberTable::decode(a.body).map_err(|e| format!("{peer_url}: member table: {e}"))
}

/// What became of a membership change carried to a shard's leader.
#[derive(Debug)]
pub enum Forwarded {
    Applied,
    /// The member asked does not lead the shard; `leader` does (0: unknown).
    NotLeader {
        leader: u64,
    },
    Failed(tonic::Status),
}

/// Carries a membership change of one shard to the member at `peer_url`.
pub async fn forward_conf_change(
    peer_url: &str,
    cluster_id: u64,
    change: &ShardConfChange,
) -> Forwarded {
    let headers = [(CLUSTER_HEADER, format!("{cluster_id:x}"))];
    let a = match request(
        peer_url,
        "POST",
        "/cairn/conf-change",
        &headers,
        &change.encode_to_vec(),
    )
    .await
    {
        Ok(a) => a,
        Err(e) => return Forwarded::Failed(tonic::Status::unavailable(e)),
    };
    match a.status {
        200 => Forwarded::Applied,
        409 => Forwarded::NotLeader {
            leader: a
                .header(LEADER_HEADER)
                .and_then(|v| u64::from_str_radix(v, 16).ok())
                .unwrap_or(0),
        },
        status => {
            let message = String::from_utf8_lossy(&a.body).into_owned();
            let code = a
                .header(CODE_HEADER)
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(Code::Unavailable, Code::from_i32);
            Forwarded::Failed(tonic::Status::new(
                code,
                if message.is_empty() {
                    format!("{peer_url} answered {status}")
                } else {
                    message
                },
            ))
        }
    }
}

/// Tells a removed member at `peer_url` that it was removed.
pub async fn tell_removed(peer_url: &str, cluster_id: u64, member: u64) -> Result<(), String> {
    let headers = [
        (CLUSTER_HEADER, format!("{cluster_id:x}")),
        (MEMBER_HEADER, format!("{member:x}")),
    ];
    let a = request(peer_url, "POST", "/cairn/removed", &headers, &[]).await?;
    if a.status == 200 {
        Ok(())
    } else {
        Err(format!(
            "{peer_url} answered {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_with_and_without_content_length() {
        let a = parse_answer(
            b"HTTP/1.1 409 Conflict\r\nX-Cairn-Leader: 1f\r\ncontent-length: 3\r\n\r\nabcdef",
        )
        .unwrap();
        assert_eq!(a.status, 409);
        assert_eq!(a.header(LEADER_HEADER), Some("1f"));
        assert_eq!(&a.body[..], b"abc");
        let a = parse_answer(b"HTTP/1.1 200 OK\r\n\r\nall of it").unwrap();
        assert_eq!(&a.body[..], b"all of it");
    }

    #[test]
    fn malformed_answers_are_errors() {
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_answer(b"garbage\r\n\r\n").is_err());
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort").is_err());
    }

    #[test]
    fn only_http_methods_this_side_serves_are_sniffed() {
        assert!(is_http(b"GET /cairn/members"));
        assert!(is_http(b"POST /cairn/conf-change"));
        assert!(!is_http(b"CRNF\x01"));
        assert!(!is_http(b"\x00\x01garbage"));
    }
}

//! The operator's HTTP endpoints: `/metrics`, `/health`, `/livez`, `/readyz`,
//! and the HTTP/1 side of the client port.
//!
//! They are served in two places, as etcd does:
//! - on their own listener for `--listen-metrics-urls` ([`serve_listener`]);
//! - on the client port, next to gRPC. etcd multiplexes HTTP/1 and gRPC on one
//!   port by looking at the first bytes of each connection; Cairn does the same
//!   ([`sniff`]): a gRPC client speaks HTTP/2 with prior knowledge and so opens
//!   with the fixed preface `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`; anything that
//!   diverges from it is HTTP/1 and is served here (paths other than these
//!   endpoints go to an [`Http1Fallback`]: the HTTP/JSON gateway). The bytes read while deciding
//!   are replayed to whichever server gets the connection ([`PrefixedIo`]), and
//!   [`PrefixedIo`] implements tonic's `Connected`, so gRPC connections go to
//!   tonic's `serve_with_incoming` through a channel ([`serve_client_port`]),
//!   behind [`super::h2_authority::AuthorityFix`], which lets through the
//!   `:authority: http://host:port` etcdctl sends and h2 would refuse.
//!
//!   Why not let tonic accept HTTP/1 itself (`accept_http1`) and mount these
//!   routes beside the gRPC services? That ties the endpoints to tonic's router
//!   internals and to axum, and routes HTTP/1 requests through the gRPC stack and
//!   its limits. Sniffing keeps the two servers independent: a plain hyper HTTP/1
//!   server here, an untouched tonic server there, with one cheap decision per
//!   connection (at most 24 bytes, usually one read).
//!
//!   On an `https://` client URL the TLS handshake comes first
//!   ([`crate::tls::ClientPortTls`]) and the sniffing reads the decrypted bytes,
//!   so the endpoints follow the client port's TLS and client certificates.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify, Semaphore};

use super::h2_authority::AuthorityFix;
use super::metrics::Registry;
use super::readiness::Readiness;
use super::watchdog::Watchdog;
use crate::tls::{ClientConn, ClientPortTls};

/// A client port connection that opened with the HTTP/2 preface: the sniffed
/// stream, preface replayed, for the gRPC server ([`crate::grpc`], or tonic's
/// behind [`GrpcConn`]).
pub type SniffedConn = PrefixedIo<ClientConn>;

/// A client port connection handed to tonic: the sniffed stream, behind the
/// shim that lets etcdctl's `:authority: http://host:port` through
/// ([`super::h2_authority`]).
pub type GrpcConn = AuthorityFix<SniffedConn>;

impl From<SniffedConn> for GrpcConn {
    /// The shim starts reading at the replayed preface.
    fn from(conn: SniffedConn) -> GrpcConn {
        AuthorityFix::new(conn, HTTP2_PREFACE.len())
    }
}

/// The HTTP/2 connection preface every gRPC client sends first (RFC 9113 §3.4).
pub const HTTP2_PREFACE: &[u8; 24] = cairn_proto::h2::frame::PREFACE;
/// Longest wait for a new connection's first bytes before it is dropped.
pub const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for an HTTP/1 request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most HTTP/1 connections served at once on the metrics listener.
pub const MAX_METRICS_CONNECTIONS: usize = 256;
/// Most HTTP/1 connections served at once on one client listener; more are
/// closed at once, so scrapers and probes can never crowd out gRPC clients.
pub const MAX_CLIENT_PORT_HTTP1_CONNECTIONS: usize = 64;
/// Content type of the Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Errors of the HTTP layer; each names the address or URL involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    #[error("--listen-metrics-urls: {url:?} is not http://HOST:PORT with an IP address ({why})")]
    BadUrl { url: String, why: &'static str },
    #[error("binding metrics listener {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("accepting on {addr}: {source}")]
    Accept { addr: SocketAddr, source: io::Error },
    #[error("reading the first bytes from {peer}: {source}")]
    Sniff { peer: String, source: io::Error },
    #[error("{peer} sent nothing within {SNIFF_TIMEOUT:?}")]
    SniffTimeout { peer: String },
    #[error("serving HTTP/1 to {peer}: {source}")]
    Serve { peer: String, source: hyper::Error },
}

/// Parses one `--listen-metrics-urls` entry: `http://IP:PORT` (a trailing `/` is
/// allowed). TLS is not served, so `https` is refused rather than served in clear.
pub fn parse_metrics_url(url: &str) -> Result<SocketAddr, HttpError> {
    let bad = |why| HttpError::BadUrl {
        url: url.to_string(),
        why,
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// is supported"))?;
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    if hostport.contains('/') {
        return Err(bad("a path is not allowed"));
    }
    hostport
        .parse::<SocketAddr>()
        .map_err(|_| bad("host must be an IP address and a port is required"))
}

/// The body of a response from an [`Http1Fallback`]: whole or streamed.
pub type FallbackBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Answers the HTTP/1 requests the operator endpoints do not know (on the client
/// port: the HTTP/JSON gateway). It runs on the connection's task, so the
/// endpoints and gRPC connections pay nothing for it.
pub trait Http1Fallback: Send + Sync + std::fmt::Debug + 'static {
    /// Answers one request. The request's extensions hold the connection's
    /// [`ConnectionCut`], for a stream that must end its connection.
    fn serve(&self, req: Request<Incoming>) -> BoxFuture<'static, Response<FallbackBody>>;
}

/// Closes the HTTP/1 connection a request came on, at once, whatever it is
/// writing: how a streamed response whose reader stopped reading is ended
/// without holding its buffers.
#[derive(Debug, Clone, Default)]
pub struct ConnectionCut(Arc<Notify>);

impl ConnectionCut {
    pub fn cut(&self) {
        self.0.notify_one();
    }
}

/// The endpoints and the sources they read. Cheap to clone (shared handles).
#[derive(Debug, Clone)]
pub struct OpsEndpoints {
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
    watchdog: Option<Arc<Watchdog>>,
    fallback: Option<Arc<dyn Http1Fallback>>,
}

impl OpsEndpoints {
    /// `watchdog`: when given, `/livez` fails while a core misses its check-ins.
    pub fn new(
        registry: Arc<Registry>,
        readiness: Arc<Readiness>,
        watchdog: Option<Arc<Watchdog>>,
    ) -> Self {
        OpsEndpoints {
            registry,
            readiness,
            watchdog,
            fallback: None,
        }
    }

    /// These endpoints, with `fallback` answering every other path.
    pub fn with_fallback(&self, fallback: Arc<dyn Http1Fallback>) -> Self {
        OpsEndpoints {
            fallback: Some(fallback),
            ..self.clone()
        }
    }

    fn is_ops_path(path: &str) -> bool {
        matches!(path, "/metrics" | "/health" | "/livez" | "/readyz")
    }

    /// Answers one request; `target` is the request path with its query.
    pub fn respond(&self, method: &Method, target: &str) -> Response<Full<Bytes>> {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let verbose = query
            .split('&')
            .any(|p| p == "verbose" || p == "verbose=true");
        if !Self::is_ops_path(path) {
            return text(StatusCode::NOT_FOUND, "404 page not found\n".to_string());
        }
        if method != Method::GET && method != Method::HEAD {
            let mut r = text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {method} not allowed on {path}\n"),
            );
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        let response = match path {
            "/metrics" => {
                let mut r = Response::new(Full::new(Bytes::from(self.registry.render())));
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
                r
            }
            "/health" => self.health(),
            "/livez" => self.livez(verbose),
            _ => self.readyz(verbose),
        };
        if method == Method::HEAD {
            let (parts, _) = response.into_parts();
            return Response::from_parts(parts, Full::new(Bytes::new()));
        }
        response
    }

    fn health(&self) -> Response<Full<Bytes>> {
        let report = self.readiness.report();
        let healthy = report.is_healthy();
        let body = serde_json::json!({
            "health": if healthy { "true" } else { "false" },
            "reason": report.health_reason(),
        });
        let status = if healthy {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }

    fn livez(&self, verbose: bool) -> Response<Full<Bytes>> {
        let stalled = self
            .watchdog
            .as_ref()
            .map(|w| w.stalled_cores())
            .unwrap_or_default();
        let check = if stalled.is_empty() {
            Check::pass("cores")
        } else {
            Check::fail(
                "cores",
                format!("cores {stalled:?} missed their watchdog check-in"),
            )
        };
        checks_response("livez", &[check], verbose)
    }

    fn readyz(&self, verbose: bool) -> Response<Full<Bytes>> {
        let report = self.readiness.report();
        let recovered = if report.recovered {
            Check::pass("recovered")
        } else {
            Check::fail("recovered", "shards are still recovering".to_string())
        };
        let leaders = if report.shards_without_leader.is_empty() {
            Check::pass("shard_leaders")
        } else {
            Check::fail(
                "shard_leaders",
                format!(
                    "shards without a leader: {:?}",
                    report.shards_without_leader
                ),
            )
        };
        let caught_up = if report.caught_up {
            Check::pass("caught_up")
        } else {
            Check::fail(
                "caught_up",
                format!("shards still catching up: {:?}", report.shards_catching_up),
            )
        };
        checks_response("readyz", &[recovered, leaders, caught_up], verbose)
    }

    /// Serves HTTP/1 on one accepted connection until the client closes it.
    pub async fn serve_http1<IO>(&self, io: IO, peer: &str) -> Result<(), HttpError>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let endpoints = self.clone();
        let cut = ConnectionCut::default();
        let cut_for_requests = cut.clone();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let fallback = endpoints
                .fallback
                .as_ref()
                .filter(|_| !Self::is_ops_path(req.uri().path()));
            let answer: BoxFuture<'static, Response<FallbackBody>> = match fallback {
                Some(fallback) => {
                    req.extensions_mut().insert(cut_for_requests.clone());
                    fallback.serve(req)
                }
                None => {
                    let target = req
                        .uri()
                        .path_and_query()
                        .map_or("/", |pq| pq.as_str())
                        .to_string();
                    let response = endpoints.respond(req.method(), &target);
                    Box::pin(async move {
                        response.map(|body| body.map_err(|never| match never {}).boxed())
                    })
                }
            };
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(io), service);
        tokio::select! {
            served = connection => served.map_err(|source| HttpError::Serve {
                peer: peer.to_string(),
                source,
            }),
            () = cut.0.notified() => {
                tracing::debug!(peer, "HTTP/1 connection cut");
                Ok(())
            }
        }
    }
}

struct Check {
    name: &'static str,
    failure: Option<String>,
}

impl Check {
    fn pass(name: &'static str) -> Check {
        Check {
            name,
            failure: None,
        }
    }

    fn fail(name: &'static str, why: String) -> Check {
        Check {
            name,
            failure: Some(why),
        }
    }
}

/// Kubernetes-style check output, as etcd's `/livez` and `/readyz` give: `ok`
/// when every check passes (each listed with `?verbose`), else every check with
/// the failing ones explained, and status 503.
fn checks_response(endpoint: &str, checks: &[Check], verbose: bool) -> Response<Full<Bytes>> {
    let failed = checks.iter().any(|c| c.failure.is_some());
    if !failed && !verbose {
        return text(StatusCode::OK, "ok\n".to_string());
    }
    let mut body = String::new();
    for check in checks {
        match &check.failure {
            None => body.push_str(&format!("[+]{} ok\n", check.name)),
            Some(why) => body.push_str(&format!("[-]{} failed: {why}\n", check.name)),
        }
    }
    if failed {
        body.push_str(&format!("{endpoint} check failed\n"));
        text(StatusCode::SERVICE_UNAVAILABLE, body)
    } else {
        body.push_str(&format!("{endpoint} check passed\n"));
        text(StatusCode::OK, body)
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Binds the listener for one `--listen-metrics-urls` entry.
pub async fn bind_metrics_url(url: &str) -> Result<TcpListener, HttpError> {
    bind(parse_metrics_url(url)?).await
}

/// Binds a metrics listener on an address already parsed from the config.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })
}

/// Serves the endpoints on a dedicated listener (`--listen-metrics-urls`) until
/// `shutdown` resolves. At most [`MAX_METRICS_CONNECTIONS`] connections at once;
/// more wait in the kernel's accept queue.
pub async fn serve_listener(
    listener: TcpListener,
    endpoints: OpsEndpoints,
    shutdown: impl Future<Output = ()>,
) -> Result<(), HttpError> {
    let local = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let slots = Arc::new(Semaphore::new(MAX_METRICS_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return Ok(()),
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of descriptors or a connection reset before accept: log and
                // go on; the listener itself is still fine.
                Err(source) => {
                    let error = HttpError::Accept { addr: local, source };
                    tracing::warn!(%error, "metrics listener");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = endpoints.serve_http1(stream, &peer.to_string()).await {
                tracing::debug!(%error, "metrics connection ended with an error");
            }
        });
    }
}

/// What a connection's first bytes say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 with prior knowledge: gRPC.
    Grpc,
    /// Anything else: served as HTTP/1 by [`OpsEndpoints::serve_http1`].
    Http1,
}

/// Decides from a prefix: `None` while the bytes so far are a proper prefix of the
/// HTTP/2 preface (more are needed).
pub fn classify(prefix: &[u8]) -> Option<Protocol> {
    let n = prefix.len().min(HTTP2_PREFACE.len());
    if prefix[..n] != HTTP2_PREFACE[..n] {
        Some(Protocol::Http1)
    } else if n == HTTP2_PREFACE.len() {
        Some(Protocol::Grpc)
    } else {
        None
    }
}

/// Reads just enough of a new connection to tell gRPC from HTTP/1, within
/// [`SNIFF_TIMEOUT`]. A connection closed before deciding is HTTP/1 (hyper then
/// sees the same bytes and ends it cleanly).
pub async fn sniff<S>(mut stream: S, peer: &str) -> Result<(Protocol, PrefixedIo<S>), HttpError>
where
    S: AsyncRead + Unpin,
{
    let mut prefix = Vec::with_capacity(HTTP2_PREFACE.len());
    let decide = async {
        let mut buf = [0u8; HTTP2_PREFACE.len()];
        loop {
            if let Some(protocol) = classify(&prefix) {
                return Ok(protocol);
            }
            let want = HTTP2_PREFACE.len() - prefix.len();
            let n = stream.read(&mut buf[..want]).await?;
            if n == 0 {
                return Ok(Protocol::Http1);
            }
            prefix.extend_from_slice(&buf[..n]);
        }
    };
    let protocol = match tokio::time::timeout(SNIFF_TIMEOUT, decide).await {
        Ok(Ok(protocol)) => protocol,
        Ok(Err(source)) => {
            return Err(HttpError::Sniff {
                peer: peer.to_string(),
                source,
            })
        }
        Err(_) => {
            return Err(HttpError::SniffTimeout {
                peer: peer.to_string(),
            })
        }
    };
    Ok((protocol, PrefixedIo::new(Bytes::from(prefix), stream)))
}

/// Serves the client port's non-gRPC side: accepts, runs the TLS handshake
/// when `tls` is given, sniffs each connection, serves HTTP/1 here and sends
/// gRPC connections into `grpc`, for [`crate::grpc::serve_incoming`] (or
/// tonic's `Server::serve_with_incoming`, each mapped into a [`GrpcConn`]).
/// Ends when `shutdown` resolves or the gRPC side has gone.
pub async fn serve_client_port(
    listener: TcpListener,
    endpoints: OpsEndpoints,
    tls: Option<ClientPortTls>,
    grpc: mpsc::Sender<SniffedConn>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), HttpError> {
    let local = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let http1_slots = Arc::new(Semaphore::new(MAX_CLIENT_PORT_HTTP1_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = grpc.closed() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(source) => {
                    let error = HttpError::Accept { addr: local, source };
                    tracing::warn!(%error, "client listener");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // gRPC is latency-sensitive; the daemon's own listeners set the same.
        let _ = stream.set_nodelay(true);
        let endpoints = endpoints.clone();
        let grpc = grpc.clone();
        let http1_slots = Arc::clone(&http1_slots);
        let tls = tls.clone();
        tokio::spawn(async move {
            let peer = peer.to_string();
            let stream = match &tls {
                None => ClientConn::Plain(stream),
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(peer, %error, "client connection refused");
                        return;
                    }
                },
            };
            match sniff(stream, &peer).await {
                Ok((Protocol::Grpc, io)) => {
                    // The stream replays the preface, then the client's frames.
                    // A closed channel means the gRPC server is shutting down;
                    // dropping the connection is the right answer then.
                    let _ = grpc.send(io).await;
                }
                Ok((Protocol::Http1, io)) => {
                    let Ok(_permit) = http1_slots.try_acquire_owned() else {
                        tracing::debug!(
                            peer,
                            limit = MAX_CLIENT_PORT_HTTP1_CONNECTIONS,
                            "HTTP/1 connection limit reached on the client port; closing"
                        );
                        return;
                    };
                    if let Err(error) = endpoints.serve_http1(io, &peer).await {
                        tracing::debug!(%error, "HTTP/1 connection on the client port ended with an error");
                    }
                }
                Err(error) => tracing::debug!(%error, "client connection dropped"),
            }
        });
    }
}

/// A stream whose first bytes were already read: they are replayed before the
/// rest of the stream. Writes go straight through.
#[derive(Debug)]
pub struct PrefixedIo<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> PrefixedIo<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        PrefixedIo { prefix, inner }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PrefixedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

super::write_through_to_inner!(PrefixedIo);

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for PrefixedIo<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_decides_at_first_divergence() {
        assert_eq!(classify(b""), None);
        assert_eq!(classify(b"G"), Some(Protocol::Http1));
        assert_eq!(classify(b"P"), None);
        assert_eq!(classify(b"PO"), Some(Protocol::Http1));
        assert_eq!(classify(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(classify(HTTP2_PREFACE), Some(Protocol::Grpc));
        assert_eq!(classify(b"PRI * HTTP/1.1\r\n"), Some(Protocol::Http1));
    }

    #[test]
    fn metrics_urls() {
        assert_eq!(
            parse_metrics_url("http://127.0.0.1:2381").unwrap(),
            "127.0.0.1:2381".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_url("http://[::1]:2381/").unwrap(),
            "[::1]:2381".parse().unwrap()
        );
        for bad in [
            "https://127.0.0.1:2381",
            "http://localhost:2381",
            "http://1.2.3.4",
            "http://1.2.3.4:1/x",
        ] {
            let err = parse_metrics_url(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[tokio::test]
    async fn prefixed_io_replays_then_reads_on() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"GET / HTTP/1.1\r\n")
            .await
            .unwrap();
        drop(a);
        let (protocol, mut io) = sniff(b, "test").await.unwrap();
        assert_eq!(protocol, Protocol::Http1);
        let mut all = String::new();
        io.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "GET / HTTP/1.1\r\n");
    }
}

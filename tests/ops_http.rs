//! The operator endpoints over real TCP sockets. Guards against: `/metrics` not
//! served, or served with a body a scraper cannot parse; `/readyz` and `/health`
//! saying ready before every shard has a leader (a load balancer would send
//! clients to a member that cannot serve them) or staying unready after; `/livez`
//! not noticing a core that stopped checking in; and, on the client port shared
//! with gRPC, HTTP/1 requests reaching the gRPC server or gRPC connections not
//! reaching it.

use crate::promtext;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn::ops::http::{serve_client_port, serve_listener, OpsEndpoints};
use cairn::ops::readiness::{Alarm, Readiness};
use cairn::ops::server_metrics::{server_metrics, CoreRecorder};
use cairn::ops::watchdog::Watchdog;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

const TIMEOUT: Duration = Duration::from_secs(10);

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// One HTTP/1.1 request on a fresh connection, read until the server closes it.
async fn get(addr: std::net::SocketAddr, method: &str, target: &str) -> Reply {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request =
            format!("{method} {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .expect("request timed out");
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("no header end");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("no status");
    Reply {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

struct Fixture {
    endpoints: OpsEndpoints,
    readiness: Arc<Readiness>,
    cores: Vec<CoreRecorder>,
    watchdog: Arc<Watchdog>,
}

fn fixture() -> Fixture {
    let (registry, cores) = server_metrics(2, &[(0, 0), (1, 1)]).unwrap();
    let readiness = Readiness::new(&[0, 1]);
    let watchdog = Watchdog::new(2, Duration::from_secs(60));
    let endpoints = OpsEndpoints::new(
        Arc::new(registry),
        Arc::clone(&readiness),
        Some(Arc::clone(&watchdog)),
    );
    Fixture {
        endpoints,
        readiness,
        cores,
        watchdog,
    }
}

async fn metrics_listener(endpoints: OpsEndpoints) -> (std::net::SocketAddr, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(serve_listener(listener, endpoints, async move {
        let _ = stop_rx.await;
    }));
    (addr, stop_tx)
}

#[tokio::test]
async fn metrics_endpoint_serves_parseable_text_that_follows_writes() {
    let f = fixture();
    let (addr, _stop) = metrics_listener(f.endpoints.clone()).await;

    let first = get(addr, "GET", "/metrics").await;
    assert_eq!(first.status, 200);
    assert!(
        first
            .headers
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        first.headers
    );
    let e = promtext::parse(&first.body).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        e.value("etcd_disk_wal_fsync_duration_seconds_count", &[]),
        Some(0.0)
    );

    f.cores[1].wal_fsync(Duration::from_millis(5));
    let second = get(addr, "GET", "/metrics").await;
    let e = promtext::parse(&second.body).unwrap();
    assert_eq!(
        e.value("etcd_disk_wal_fsync_duration_seconds_count", &[]),
        Some(1.0)
    );
    assert_eq!(
        e.value(
            "etcd_disk_wal_fsync_duration_seconds_bucket",
            &[("le", "0.008")]
        ),
        Some(1.0)
    );

    let head = get(addr, "HEAD", "/metrics").await;
    assert_eq!((head.status, head.body.as_str()), (200, ""));
    assert_eq!(get(addr, "GET", "/nope").await.status, 404);
    let post = get(addr, "POST", "/metrics").await;
    assert_eq!(post.status, 405);
    assert!(
        post.headers.contains("allow: get, head"),
        "{}",
        post.headers
    );
}

#[tokio::test]
async fn readyz_and_health_follow_the_readiness_source() {
    let f = fixture();
    let (addr, _stop) = metrics_listener(f.endpoints.clone()).await;

    // Recovered and caught up, but no shard has a leader yet.
    f.readiness.set_recovered(true);
    f.readiness.set_caught_up(true);
    let r = get(addr, "GET", "/readyz").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        r.body
            .contains("[-]shard_leaders failed: shards without a leader: [0, 1]"),
        "{}",
        r.body
    );
    assert!(r.body.contains("[+]recovered ok"), "{}", r.body);
    let h = get(addr, "GET", "/health").await;
    assert_eq!(h.status, 503);
    let json: serde_json::Value = serde_json::from_str(&h.body).unwrap();
    assert_eq!(json["health"], "false");
    assert!(
        json["reason"].as_str().unwrap().contains("RAFT NO LEADER"),
        "{json}"
    );

    // One leader is not enough.
    f.readiness.set_shard_has_leader(0, true);
    let r = get(addr, "GET", "/readyz").await;
    assert_eq!(r.status, 503);
    assert!(
        r.body.contains("shards without a leader: [1]"),
        "{}",
        r.body
    );

    f.readiness.set_shard_has_leader(1, true);
    let r = get(addr, "GET", "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let verbose = get(addr, "GET", "/readyz?verbose").await;
    assert_eq!(verbose.status, 200);
    assert!(
        verbose.body.contains("[+]shard_leaders ok"),
        "{}",
        verbose.body
    );
    let h = get(addr, "GET", "/health").await;
    assert_eq!(h.status, 200);
    let json: serde_json::Value = serde_json::from_str(&h.body).unwrap();
    assert_eq!(json, serde_json::json!({"health": "true", "reason": ""}));

    // An alarm makes the member unhealthy (etcd's meaning) but still ready.
    f.readiness.set_alarm(Alarm::NoSpace, true);
    let h = get(addr, "GET", "/health").await;
    assert_eq!(h.status, 503);
    assert!(h.body.contains("ALARM NOSPACE"), "{}", h.body);
    assert_eq!(get(addr, "GET", "/readyz").await.status, 200);

    // Losing a leader makes it unready again.
    f.readiness.set_shard_has_leader(1, false);
    assert_eq!(get(addr, "GET", "/readyz").await.status, 503);

    // So does a shard that falls behind (e.g. restoring a snapshot).
    f.readiness.set_shard_has_leader(1, true);
    f.readiness.set_shard_caught_up(1, false);
    let r = get(addr, "GET", "/readyz").await;
    assert_eq!(r.status, 503);
    assert!(
        r.body
            .contains("[-]caught_up failed: shards still catching up: [1]"),
        "{}",
        r.body
    );
    f.readiness.set_shard_caught_up(1, true);
    assert_eq!(get(addr, "GET", "/readyz").await.status, 200);
}

#[tokio::test]
async fn livez_fails_while_a_core_misses_check_ins() {
    let f = fixture();
    let (addr, _stop) = metrics_listener(f.endpoints.clone()).await;
    assert_eq!(get(addr, "GET", "/livez").await.body, "ok\n");
    f.watchdog.check_in(0);
    f.watchdog.tick();
    let r = get(addr, "GET", "/livez").await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("cores [1] missed"), "{}", r.body);
    f.watchdog.check_in(1);
    f.watchdog.tick();
    assert_eq!(get(addr, "GET", "/livez").await.status, 200);
}

#[tokio::test]
async fn client_port_serves_http1_here_and_hands_grpc_to_tonic() {
    let f = fixture();
    f.readiness.set_recovered(true);
    f.readiness.set_caught_up(true);
    f.readiness.set_shard_has_leader(0, true);
    f.readiness.set_shard_has_leader(1, true);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (grpc_tx, grpc_rx) = tokio::sync::mpsc::channel(16);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(serve_client_port(
        listener,
        f.endpoints.clone(),
        None,
        grpc_tx,
        async move {
            let _ = stop_rx.await;
        },
    ));
    // A gRPC server with no services: every call is answered UNIMPLEMENTED by
    // tonic itself, which proves the connection reached it.
    let mut server = tonic::transport::Server::builder();
    let router = server.add_routes(tonic::service::Routes::default());
    // (`--grpc-server tonic`; the connections the port hands over are wrapped
    // as that server takes them.)
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(grpc_rx),
        |conn| Ok::<_, std::io::Error>(cairn::ops::http::GrpcConn::from(conn)),
    );
    tokio::spawn(router.serve_with_incoming(incoming));

    let r = get(addr, "GET", "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let m = get(addr, "GET", "/metrics").await;
    promtext::parse(&m.body).unwrap();

    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    // An empty, uncompressed gRPC message: flag 0, length 0 (big-endian u32).
    let request = hyper::Request::post(format!("http://{addr}/etcdserverpb.KV/Range"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let response = tokio::time::timeout(TIMEOUT, sender.send_request(request))
        .await
        .expect("gRPC call timed out")
        .unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    let status = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(status.as_deref(), Some("12"), "tonic answers UNIMPLEMENTED");

    // Garbage is neither: served as HTTP/1, answered 400, and the port still works.
    let mut junk = TcpStream::connect(addr).await.unwrap();
    junk.write_all(b"\x16\x03\x01garbage\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(TIMEOUT, junk.read_to_end(&mut raw))
        .await
        .unwrap();
    let reply = String::from_utf8_lossy(&raw);
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 400"),
        "{reply}"
    );
    assert_eq!(get(addr, "GET", "/livez").await.status, 200);
    let _ = stop_tx.send(());
}

#[tokio::test]
async fn client_port_caps_http1_connections_without_touching_grpc() {
    use cairn::ops::http::MAX_CLIENT_PORT_HTTP1_CONNECTIONS;
    let f = fixture();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (grpc_tx, mut grpc_rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(serve_client_port(
        listener,
        f.endpoints.clone(),
        None,
        grpc_tx,
        std::future::pending(),
    ));

    // Keep-alive connections, each holding a slot after its first response.
    let mut held = Vec::new();
    for _ in 0..MAX_CLIENT_PORT_HTTP1_CONNECTIONS {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(TIMEOUT, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        held.push(s);
    }
    let mut over = TcpStream::connect(addr).await.unwrap();
    over.write_all(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    // Closed unserved: an end of stream, or a reset because the request was
    // left unread.
    match tokio::time::timeout(TIMEOUT, over.read_to_end(&mut rest))
        .await
        .unwrap()
    {
        Ok(_) => assert!(rest.is_empty(), "connection over the limit was served"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }

    // gRPC connections still get through to the gRPC side.
    let mut grpc = TcpStream::connect(addr).await.unwrap();
    grpc.write_all(cairn::ops::http::HTTP2_PREFACE)
        .await
        .unwrap();
    let handed = tokio::time::timeout(TIMEOUT, grpc_rx.recv()).await.unwrap();
    assert!(handed.is_some());

    // Freeing a slot lets the next HTTP/1 client in.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get(addr, "GET", "/livez").await.status, 200);
}

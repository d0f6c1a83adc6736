//! End to end against a real `cairn` process: its `--listen-metrics-urls`
//! endpoint becomes ready once the member has a leader, serves Prometheus text,
//! and the WAL fsync histogram moves when writes happen. Guards against a daemon
//! that exports the metric families but never records into them (an fsync
//! histogram stuck at zero hides a failing disk from every etcd dashboard), and
//! against `/readyz` never turning ready on a healthy single member.
//!
//! Also, with a fake `NOTIFY_SOCKET` and `WATCHDOG_USEC` in its environment (as
//! systemd gives a `Type=notify` unit), the process sends `READY=1` once ready,
//! keepalives while it runs, and `STOPPING=1` last on SIGTERM.
//!
//! Run alone with `cargo test -p cairn --test integration ops_daemon::`.

use crate::common::free_port;
use crate::promtext;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::PutRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const START_TIMEOUT: Duration = Duration::from_secs(30);
const WRITES: usize = 20;

struct Daemon(Child);

struct Ports {
    client_url: String,
    peer_url: String,
    metrics_addr: SocketAddr,
}

fn ports() -> Ports {
    Ports {
        client_url: format!("http://127.0.0.1:{}", free_port()),
        peer_url: format!("http://127.0.0.1:{}", free_port()),
        metrics_addr: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
    }
}

/// A single-member `cairn` on the given ports, with its data under `data`.
fn command(p: &Ports, data: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    c.args(["--name", "m1", "--cores", "1", "--shards", "1"])
        .arg("--data-dir")
        .arg(data.join("m1.cairn"))
        .args(["--listen-client-urls", &p.client_url])
        .args(["--advertise-client-urls", &p.client_url])
        .args(["--listen-peer-urls", &p.peer_url])
        .args(["--initial-advertise-peer-urls", &p.peer_url])
        .args(["--initial-cluster", &format!("m1={}", p.peer_url)])
        .args([
            "--listen-metrics-urls",
            &format!("http://{}", p.metrics_addr),
        ])
        .stdout(Stdio::null());
    c
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn http_get(addr: SocketAddr, target: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {target} HTTP/1.1\r\nHost: cairn\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

async fn scrape(addr: SocketAddr) -> promtext::Exposition {
    let (status, body) = http_get(addr, "/metrics")
        .await
        .expect("/metrics unreachable");
    assert_eq!(status, 200);
    promtext::parse(&body).unwrap_or_else(|e| panic!("{e}\n{body}"))
}

fn fsync_count(e: &promtext::Exposition) -> f64 {
    e.value("etcd_disk_wal_fsync_duration_seconds_count", &[])
        .expect("etcd_disk_wal_fsync_duration_seconds missing")
}

#[tokio::test]
async fn wal_fsync_histogram_moves_when_writes_happen() {
    let data = tempfile::tempdir().unwrap();
    let p = ports();
    let (client_url, metrics_addr) = (p.client_url.clone(), p.metrics_addr);
    let _daemon = Daemon(command(&p, data.path()).spawn().expect("starting cairn"));

    // Not ready until the single member has elected itself; then ready.
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some((200, body)) = http_get(metrics_addr, "/readyz").await {
            assert_eq!(body, "ok\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz not ready within {START_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = http_get(metrics_addr, "/health").await.unwrap();
    assert_eq!(
        health,
        (200, r#"{"health":"true","reason":""}"#.to_string())
    );

    let before = scrape(metrics_addr).await;
    assert_eq!(before.value("etcd_server_has_leader", &[]), Some(1.0));

    let mut kv = KvClient::connect(client_url.clone()).await.unwrap();
    for i in 0..WRITES {
        kv.put(PutRequest {
            key: format!("/ops/fsync/{i}").into_bytes().into(),
            value: b"v".to_vec().into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }

    let after = scrape(metrics_addr).await;
    let synced = fsync_count(&after) - fsync_count(&before);
    // Group commit may merge writes, but sequential acknowledged writes each
    // needed a sync before their reply.
    assert!(
        synced >= WRITES as f64,
        "{WRITES} acknowledged writes but the fsync histogram moved by {synced}"
    );
    let inf_before = before
        .value(
            "etcd_disk_wal_fsync_duration_seconds_bucket",
            &[("le", "+Inf")],
        )
        .unwrap();
    let inf_after = after
        .value(
            "etcd_disk_wal_fsync_duration_seconds_bucket",
            &[("le", "+Inf")],
        )
        .unwrap();
    assert_eq!(inf_after - inf_before, synced);
    assert!(
        after
            .value("etcd_server_proposals_applied_total", &[])
            .unwrap()
            >= WRITES as f64
    );
}

#[test]
fn daemon_notifies_systemd_in_order() {
    use std::os::unix::net::UnixDatagram;
    let data = tempfile::tempdir().unwrap();
    let socket_path = data.path().join("notify.sock");
    let systemd = UnixDatagram::bind(&socket_path).unwrap();
    let p = ports();
    let child = command(&p, data.path())
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .env_remove("WATCHDOG_PID")
        .spawn()
        .expect("starting cairn");
    let pid = child.id();
    let mut daemon_guard = Some(Daemon(child));

    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + START_TIMEOUT;
    // Until READY=1 and two keepalives (the keepalive period is 0.5 s).
    while messages
        .iter()
        .filter(|m: &&String| m.contains("WATCHDOG=1"))
        .count()
        < 2
    {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no READY=1 and keepalives: {messages:?}");
        systemd.set_read_timeout(Some(left)).unwrap();
        let n = systemd.recv(&mut buf).expect("no notification");
        messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let ready_at = messages
        .iter()
        .position(|m| m.lines().any(|l| l == "READY=1"))
        .unwrap_or_else(|| panic!("keepalives without READY=1: {messages:?}"));
    let first_keepalive = messages
        .iter()
        .position(|m| m.contains("WATCHDOG=1"))
        .unwrap();
    assert!(
        ready_at < first_keepalive,
        "keepalive before READY=1: {messages:?}"
    );

    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut tail = Vec::new();
    systemd
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    while let Ok(n) = systemd.recv(&mut buf) {
        tail.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if tail.last().is_some_and(|m| m.contains("STOPPING=1")) {
            break;
        }
    }
    let (last, before) = tail.split_last().expect("nothing after SIGTERM");
    assert!(last.lines().any(|l| l == "STOPPING=1"), "{tail:?}");
    assert!(before.iter().all(|m| m == "WATCHDOG=1\n"), "{tail:?}");
    let mut daemon = daemon_guard.take().unwrap();
    let exit = daemon.0.wait().unwrap();
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    // Nothing after STOPPING=1.
    systemd.set_nonblocking(true).unwrap();
    assert!(
        systemd.recv(&mut buf).is_err(),
        "a message after STOPPING=1"
    );
}

//! End to end against a real `cairn` process: its `--listen-metrics-urls`
//! endpoint becomes ready once the member has a leader, serves Prometheus text,
//! and the WAL fsync histogram moves when writes happen. Guards against a daemon
//! that exports the metric families but never records into them (an fsync
//! histogram stuck at zero hides a failing disk from every etcd dashboard), and
//! against `/readyz` never turning ready on a healthy single member.
//!
//! Ignored until the daemon serves the ops endpoints on `--listen-metrics-urls`
//! and records WAL syncs through `CoreRecorder::wal_fsync`; run it with
//! `cargo test -p cairn --test ops_daemon -- --ignored`.

#[path = "ops_promtext.rs"]
mod promtext;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::PutRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const START_TIMEOUT: Duration = Duration::from_secs(30);
const WRITES: usize = 20;

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Daemon(Child);

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
#[ignore = "needs the daemon to serve --listen-metrics-urls and record WAL syncs"]
async fn wal_fsync_histogram_moves_when_writes_happen() {
    let data = tempfile::tempdir().unwrap();
    let (client, peer, metrics) = (free_port(), free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let metrics_addr: SocketAddr = format!("127.0.0.1:{metrics}").parse().unwrap();
    let _daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--name", "m1", "--cores", "1", "--shards", "1"])
            .arg("--data-dir")
            .arg(data.path().join("m1.cairn"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("m1={peer_url}")])
            .args(["--listen-metrics-urls", &format!("http://{metrics_addr}")])
            .stdout(Stdio::null())
            .spawn()
            .expect("starting cairn"),
    );

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

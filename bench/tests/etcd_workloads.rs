//! Guards cairn-bench's measurements against a real etcd: every workload runs and
//! its counts add up (successes + errors = requests sent), histograms are filled,
//! failed requests are counted by gRPC code instead of vanishing, and fixed-rate
//! mode shows a server stall (SIGSTOP for 500 ms) in its p99.9 rather than hiding
//! it behind coordinated omission.
//!
//! Needs `etcd` on PATH: without it these tests print a skip note, unless `CI` is
//! set, in which case they fail.

use std::path::Path;
use std::time::Duration;

mod common;

use cairn_bench::cluster::StartOptions;
use cairn_bench::{LocalCluster, Report, System};
use common::{bench, watch_latency_40_puts};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A TCP socket bound to a free port of 127.0.0.1 without listening: the kernel
/// refuses connections to it, and no other test can take the port meanwhile.
fn dead_port() -> socket2::Socket {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("create a socket");
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).expect("bind a free port");
    socket
}

async fn single_etcd(dir: &Path) -> Option<LocalCluster> {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return None;
    }
    let mut cluster =
        LocalCluster::start(System::Etcd, Path::new("etcd"), 1, dir).expect("start etcd");
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("etcd serves");
    Some(cluster)
}

fn assert_filled(r: &Report) {
    assert!(r.requests() > 0, "{}: no successful request", r.workload);
    assert!(r.p50_ms() > 0.0, "{}: empty histogram", r.workload);
    assert!(r.p50_ms() <= r.p99_ms() && r.p99_ms() <= r.p999_ms() && r.p999_ms() <= r.max_ms());
    assert!(r.requests_per_sec() > 0.0);
    assert!(r.avg_ms() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_and_its_counts_match() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = single_etcd(dir.path()).await else {
        return;
    };
    let ep = etcd.endpoints_arg();
    let common = [
        "--endpoints",
        &ep,
        "--conns",
        "2",
        "--clients",
        "8",
        "--total",
        "300",
    ];
    let workloads: [&[&str]; 9] = [
        &["put", "--key-space-size", "100", "--val-size", "64"],
        &["put", "--key-space-size", "100", "--sequential-keys"],
        &["range", "00000001", "--consistency", "l"],
        &[
            "range",
            "0000",
            "--prefix",
            "--consistency",
            "s",
            "--limit",
            "10",
        ],
        &["txn-put", "--key-space-size", "10"],
        &["txn-one", "--key-space-size", "10", "--keys-per-txn", "3"],
        &["txn-cross", "--key-space-size", "10", "--keys-per-txn", "3"],
        &["mixed", "--key-space-size", "100", "--read-ratio", "0.5"],
        &["lease-keepalive"],
    ];
    for w in workloads {
        let args: Vec<&str> = common.iter().chain(w).copied().collect();
        let r = bench(&args).await;
        assert_eq!(
            r.requests() + r.errors(),
            300,
            "{w:?}: {:?}",
            r.recorder.errors
        );
        assert_eq!(r.errors(), 0, "{w:?}: {:?}", r.recorder.errors);
        assert_filled(&r);
        let json = r.to_json();
        for field in [
            "workload",
            "requests",
            "errors",
            "requests_per_sec",
            "avg_ms",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "p999_ms",
            "max_ms",
        ] {
            assert!(!json[field].is_null(), "{w:?}: JSON lacks {field}");
        }
        match w[0] {
            "txn-put" | "txn-one" | "txn-cross" => {
                let c = &r.recorder.counters;
                assert_eq!(c["txn_cas_won"] + c["txn_cas_conflicts"], 300);
                assert!(
                    c["txn_cas_won"] >= 10,
                    "every key is won at least once: {c:?}"
                );
            }
            "mixed" => {
                let c = &r.recorder.counters;
                assert_eq!(c["reads"] + c["writes"], 300);
                assert!(c["reads"] > 50 && c["writes"] > 50, "{c:?}");
            }
            _ => {}
        }
    }

    // Alone on keys other runs wrote before, a requester must win every swap: its
    // view of the store is fresh from setup on.
    let r = bench(&[
        "--endpoints",
        &ep,
        "--total",
        "100",
        "txn-put",
        "--key-space-size",
        "100",
    ])
    .await;
    assert_eq!(
        r.recorder.counters.get("txn_cas_won"),
        Some(&100),
        "{:?}",
        r.recorder.counters
    );

    // 40 puts, each owed to 2 x 5 watchers.
    let r = watch_latency_40_puts(&ep).await;
    assert_eq!(r.recorder.counters["puts"], 40);
    assert_eq!(r.requests(), 400, "{:?}", r.recorder.errors);
    assert_eq!(r.errors(), 0);
    assert_filled(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_is_excluded_from_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = single_etcd(dir.path()).await else {
        return;
    };
    let ep = etcd.endpoints_arg();
    let r = bench(&[
        "--endpoints",
        &ep,
        "--clients",
        "2",
        "--warmup",
        "300ms",
        "--total",
        "100",
        "put",
    ])
    .await;
    assert_eq!(r.requests(), 100);
    assert!(r.warmup_requests > 0);
    assert_eq!(r.to_json()["warmup_requests_excluded"], r.warmup_requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_are_counted_by_code() {
    // A socket bound but never listening keeps its port reserved for this test
    // while every connection to it is refused.
    let dead = dead_port();
    let port = dead.local_addr().unwrap().as_socket().unwrap().port();
    let ep = format!("127.0.0.1:{port}");
    let r = bench(&[
        "--endpoints",
        &ep,
        "--timeout",
        "1s",
        "--total",
        "50",
        "put",
    ])
    .await;
    assert_eq!(r.requests(), 0);
    assert_eq!(r.errors(), 50);
    assert_eq!(
        r.recorder.errors.get("Unavailable"),
        Some(&50),
        "{:?}",
        r.recorder.errors
    );

    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = single_etcd(dir.path()).await else {
        return;
    };
    let ep = etcd.endpoints_arg();
    // Above the 1.5 MiB request limit: the server refuses each one.
    let r = bench(&[
        "--endpoints",
        &ep,
        "--total",
        "5",
        "put",
        "--val-size",
        "2097152",
    ])
    .await;
    assert_eq!(r.requests(), 0);
    assert_eq!(r.errors(), 5, "{:?}", r.recorder.errors);
    // Mixed outcomes in one run: half the endpoints are dead.
    let mixed = format!("{ep},127.0.0.1:{port}");
    let r = bench(&[
        "--endpoints",
        &mixed,
        "--conns",
        "2",
        "--clients",
        "2",
        "--timeout",
        "1s",
        "--total",
        "200",
        "put",
    ])
    .await;
    assert_eq!(r.requests() + r.errors(), 200);
    assert!(
        r.requests() > 0 && r.errors() > 0,
        "ok {} errors {:?}",
        r.requests(),
        r.recorder.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_rate_mode_reports_a_server_stall_in_p999() {
    let dir = tempfile::tempdir().unwrap();
    let Some(etcd) = single_etcd(dir.path()).await else {
        return;
    };
    let ep = etcd.endpoints_arg();
    let stall = Duration::from_millis(500);
    let pauser = std::thread::spawn({
        let pid = etcd.members[0].pid().unwrap();
        move || {
            std::thread::sleep(Duration::from_millis(1_000));
            let sig = |s: &str| {
                let ok = std::process::Command::new("kill")
                    .args([s, &pid.to_string()])
                    .status()
                    .unwrap();
                assert!(ok.success());
            };
            sig("-STOP");
            std::thread::sleep(stall);
            sig("-CONT");
        }
    });
    let r = bench(&[
        "--endpoints",
        &ep,
        "--clients",
        "4",
        "--rate",
        "400",
        "--duration",
        "3s",
        "put",
    ])
    .await;
    pauser.join().unwrap();
    assert_eq!(r.errors(), 0, "{:?}", r.recorder.errors);
    assert!(r.requests() >= 1_100, "{} requests", r.requests());
    // Requests due during the stall waited for it: up to 500 ms each, about 200
    // of them, so well above 0.1% of the run sits near the stall's length.
    assert!(
        r.p999_ms() >= 400.0,
        "p99.9 {} ms hides the 500 ms stall",
        r.p999_ms()
    );
    assert!(r.p99_ms() >= 100.0, "p99 {} ms", r.p99_ms());
    assert!(r.max_ms() < 5_000.0, "max {} ms", r.max_ms());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_cores_limit_etcd_with_gomaxprocs() {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let options = StartOptions {
        cores: Some(1),
        ..StartOptions::default()
    };
    let mut cluster =
        LocalCluster::start_with(System::Etcd, Path::new("etcd"), 1, dir.path(), &options)
            .expect("start etcd");
    cluster
        .wait_ready(READY_TIMEOUT)
        .await
        .expect("etcd serves");
    let pid = cluster.members[0].pid().expect("etcd runs");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|v| v == b"GOMAXPROCS=1".as_slice()),
        "etcd was not started with GOMAXPROCS=1"
    );
}

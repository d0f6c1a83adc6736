//! Guards cairn-bench's client TLS and authentication against real 1-member
//! clusters with mutual TLS on both ports and auth on, set up the way
//! `compare --secure` sets them up: workloads authenticated as the non-root
//! user succeed without a single error; a wrong password stops the run before
//! it starts instead of being measured as errors; a client without a token is
//! refused on every request; and a plaintext client is refused by the TLS
//! port.
//!
//! Cairn's test needs a built `cairn` (skip note without one, failure under
//! `CI`); etcd's is `#[ignore]`d (run with `--ignored`) and needs `etcd` on PATH.

use std::path::Path;
use std::time::Duration;

mod common;

use cairn_bench::cluster::StartOptions;
use cairn_bench::security::{self, bench_user, ClusterCerts};
use cairn_bench::{run_workload, BenchError, Cli, LocalCluster, System};
use clap::Parser;
use common::bench;

async fn secure_cluster(system: System, bin: &Path, dir: &Path) -> LocalCluster {
    let certs = ClusterCerts::generate(&dir.join("certs")).expect("certificates");
    let options = StartOptions {
        tls: Some(certs),
        ..StartOptions::default()
    };
    let mut cluster =
        LocalCluster::start_with(system, bin, 1, &dir.join("cluster"), &options).expect("start");
    cluster
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{} does not serve over TLS: {e}", bin.display()));
    assert!(cluster.client_urls()[0].starts_with("https://"));
    cluster
        .enable_auth(security::ROOT_PASSWORD, &bench_user())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    cluster
}

async fn workloads_run_authenticated_over_mutual_tls(system: System, bin: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = secure_cluster(system, bin, dir.path()).await;
    let endpoints = cluster.endpoints_arg();
    let with_user = cluster.client_args(Some(&bench_user()));
    let args = |extra: &[&str], tls: &[String]| -> Vec<String> {
        let mut v: Vec<String> = ["--endpoints", &endpoints, "--conns", "2", "--clients", "4"]
            .map(String::from)
            .to_vec();
        v.extend_from_slice(tls);
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let run = |a: Vec<String>| async move {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        bench(&refs).await
    };

    for workload in [
        &[
            "--total",
            "200",
            "put",
            "--key-space-size",
            "100",
            "--val-size",
            "64",
        ][..],
        &["--total", "200", "range", "00000001", "--consistency", "l"],
        &["--total", "100", "txn-put", "--key-space-size", "100"],
        &["--total", "100", "lease-keepalive"],
        &[
            "--total",
            "20",
            "--rate",
            "100",
            "watch-latency",
            "--streams",
            "2",
            "--watchers-per-stream",
            "2",
        ],
    ] {
        let r = run(args(workload, &with_user)).await;
        assert_eq!(
            r.errors(),
            0,
            "{workload:?} on {system}: {:?}",
            r.recorder.errors
        );
        assert!(r.requests() > 0, "{workload:?} on {system}");
    }

    // No token: TLS lets the client in, auth refuses every request.
    let tls_only = cluster.client_args(None);
    let r = run(args(&["--total", "20", "put"], &tls_only)).await;
    assert_eq!(r.requests(), 0, "{system} served a put without a token");
    assert_eq!(r.errors(), 20);

    // A wrong password is a setup failure, not 20 measured errors.
    let mut wrong = tls_only.clone();
    wrong.extend(["--user".into(), "bench:wrong".into()]);
    let mut full = vec!["cairn-bench".to_owned()];
    full.extend(args(&["--total", "20", "put"], &wrong));
    let cli = Cli::try_parse_from(&full).unwrap();
    match run_workload(&cli.global, &cli.command, false).await {
        Err(BenchError::Auth { user, .. }) => assert_eq!(user, "bench"),
        other => panic!(
            "{system}: a wrong password gave {:?}",
            other.map(|r| r.requests())
        ),
    }

    // Plaintext to the TLS port: every request fails.
    let plain = endpoints.replace("https://", "http://");
    let r = bench(&[
        "--endpoints",
        &plain,
        "--total",
        "5",
        "--timeout",
        "2s",
        "put",
    ])
    .await;
    assert_eq!(
        (r.requests(), r.errors()),
        (0, 5),
        "{system} answered plaintext"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cairn_serves_workloads_over_mutual_tls_with_auth() {
    let Some(bin) = cairn_bench::binaries::workspace_cairn_or_skip() else {
        return;
    };
    workloads_run_authenticated_over_mutual_tls(System::Cairn, &bin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd on PATH"]
async fn etcd_serves_workloads_over_mutual_tls_with_auth() {
    if !cairn_bench::binary_available_or_skip(Path::new("etcd")) {
        return;
    }
    workloads_run_authenticated_over_mutual_tls(System::Etcd, Path::new("etcd")).await;
}

//! Guards `cairn-bench put --gateway` against a real Cairn member (this
//! workspace's `cairn` binary): every put goes through the HTTP/JSON gateway
//! and lands (the keys are there afterwards, read over gRPC), counts and
//! histograms are filled, and a refused put (an oversize value) is counted
//! with etcd's gRPC code from the gateway's error body, not lost.
//!
//! Needs a built `cairn` (`cargo build`): without one this test prints a skip
//! note, unless `CI` is set, in which case it fails.

use std::time::Duration;

mod common;

use cairn_bench::{LocalCluster, System};
use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::RangeRequest;
use common::bench;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_puts_land_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = cairn_bench::binaries::workspace_cairn_or_skip() else {
        return;
    };
    let mut cairn = LocalCluster::start(System::Cairn, &bin, 1, dir.path()).expect("start cairn");
    cairn
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{} does not serve: {e}", bin.display()));
    let ep = cairn.endpoints_arg();

    let r = bench(&[
        "--endpoints",
        &ep,
        "--clients",
        "4",
        "--total",
        "200",
        "put",
        "--gateway",
        "--key-space-size",
        "50",
        "--val-size",
        "100",
        "--sequential-keys",
    ])
    .await;
    assert_eq!(r.workload, "put-gateway");
    assert_eq!(
        (r.requests(), r.errors()),
        (200, 0),
        "{:?}",
        r.recorder.error_samples
    );
    assert!(r.p50_ms() > 0.0 && r.p50_ms() <= r.p99_ms() && r.p99_ms() <= r.max_ms());

    // The keys are in the store, whole.
    let mut kv = KvClient::connect(cairn.members[0].client_url.clone())
        .await
        .unwrap();
    let all = kv
        .range(RangeRequest {
            key: vec![0].into(),
            range_end: vec![0].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let written: Vec<_> = all.kvs.iter().filter(|kv| kv.value.len() == 100).collect();
    assert_eq!(written.len(), 50, "{} keys", all.kvs.len());

    // Over etcd's request limit: refused with InvalidArgument, counted.
    let r = bench(&[
        "--endpoints",
        &ep,
        "--clients",
        "1",
        "--total",
        "3",
        "put",
        "--gateway",
        "--val-size",
        "1600000",
    ])
    .await;
    assert_eq!(r.errors(), 3);
    assert_eq!(
        r.recorder.errors.get("InvalidArgument").copied(),
        Some(3),
        "{:?}",
        r.recorder.errors
    );
}

//! Guards cairn-bench against a real 3-member Cairn cluster (this workspace's
//! `cairn` binary, the newest of the release and debug builds): every workload
//! (watch-latency included) runs with matching counts and filled histograms,
//! `watch-load` reads its watchers' events through the generator's own client, and
//! fixed-rate mode shows a 500 ms SIGSTOP of the member serving the requests in
//! its p99.9.
//!
//! Needs a built `cairn` (`cargo build`): without one these tests print a skip
//! note, unless `CI` is set, in which case they fail.

use std::path::Path;
use std::time::Duration;

mod common;

use cairn_bench::cluster::StartOptions;
use cairn_bench::{LocalCluster, System};
use common::{bench, watch_latency_40_puts};

async fn cairn_cluster(dir: &Path) -> Option<LocalCluster> {
    let bin = cairn_bench::binaries::workspace_cairn_or_skip()?;
    let mut cluster = LocalCluster::start(System::Cairn, &bin, 3, dir).expect("start cairn");
    cluster
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{} cluster does not serve: {e}", bin.display()));
    Some(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_against_cairn() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cairn) = cairn_cluster(dir.path()).await else {
        return;
    };
    let ep = cairn.endpoints_arg();
    let common = [
        "--endpoints",
        &ep,
        "--conns",
        "3",
        "--clients",
        "6",
        "--total",
        "300",
    ];
    let workloads: [&[&str]; 7] = [
        &["put", "--key-space-size", "100", "--val-size", "64"],
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
        // One shard here (a default cairn): txn-cross's keys share it.
        &["txn-one", "--key-space-size", "10", "--keys-per-txn", "3"],
        &["txn-cross", "--key-space-size", "10", "--keys-per-txn", "3"],
        &["mixed", "--key-space-size", "100", "--read-ratio", "0.5"],
    ];
    for w in workloads {
        let args: Vec<&str> = common.iter().chain(w).copied().collect();
        let r = bench(&args).await;
        assert_eq!(r.requests() + r.errors(), 300, "{w:?}");
        // The daemon's own tests judge its error rate; here failed requests must
        // be counted (and shown), and most requests must succeed.
        if r.errors() > 0 {
            eprintln!(
                "{w:?} against cairn: errors {:?}, e.g. {:?}",
                r.recorder.errors, r.recorder.error_samples
            );
        }
        assert!(r.errors() * 10 <= 300, "{w:?}: {:?}", r.recorder.errors);
        assert!(
            r.p50_ms() > 0.0 && r.p50_ms() <= r.p99_ms() && r.p99_ms() <= r.max_ms(),
            "{w:?}"
        );
        if w[0].starts_with("txn-") {
            let c = &r.recorder.counters;
            assert_eq!(c["txn_cas_won"] + c["txn_cas_conflicts"], 300);
        }
    }

    // 40 puts, each owed to 2 x 5 watchers; a missing event is counted, not lost.
    let r = watch_latency_40_puts(&ep).await;
    let missing = r.recorder.errors.get("MissingEvent").copied().unwrap_or(0);
    assert_eq!(
        r.requests() + missing,
        r.recorder.counters["puts"] * 10,
        "{:?}",
        r.recorder.errors
    );
    assert!(
        r.requests() * 10 >= 400 * 9,
        "{} events, {:?}",
        r.requests(),
        r.recorder.errors
    );
    assert!(r.p50_ms() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_rate_mode_reports_a_cairn_stall_in_p999() {
    let dir = tempfile::tempdir().unwrap();
    let Some(cairn) = cairn_cluster(dir.path()).await else {
        return;
    };
    // Serializable reads from one member: pausing it stalls every request.
    let ep = cairn.members[0].client_url.clone();
    let pid = cairn.members[0].pid().unwrap();
    let pauser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1_000));
        let sig = |s: &str| {
            let ok = std::process::Command::new("kill")
                .args([s, &pid.to_string()])
                .status()
                .unwrap();
            assert!(ok.success());
        };
        sig("-STOP");
        std::thread::sleep(Duration::from_millis(500));
        sig("-CONT");
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
        "range",
        "00000000",
        "--consistency",
        "s",
    ])
    .await;
    pauser.join().unwrap();
    assert_eq!(r.errors(), 0, "{:?}", r.recorder.errors);
    assert!(
        r.p999_ms() >= 400.0,
        "p99.9 {} ms hides the 500 ms stall",
        r.p999_ms()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_cores_reach_cairn_as_its_cores_flag() {
    let Some(bin) = cairn_bench::binaries::workspace_cairn_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let options = StartOptions {
        cores: Some(1),
        ..StartOptions::default()
    };
    let mut cluster = LocalCluster::start_with(System::Cairn, &bin, 1, dir.path(), &options)
        .expect("start cairn");
    cluster
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{} does not serve: {e}", bin.display()));
    let pid = cluster.members[0].pid().expect("cairn runs");
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<&str> = cmdline.split('\0').collect();
    assert!(args.windows(2).any(|w| w == ["--cores", "1"]), "{args:?}");
    let log = std::fs::read_to_string(&cluster.members[0].log_path).unwrap();
    assert!(log.contains("cores=1"), "{log}");
}

/// `watch-load` end to end against a real member: its reading watchers, on
/// the load generator's own client, confirm their creates and read the
/// events of the puts to their keys; the stalled one holds its stream.
#[test]
fn watch_load_reads_events_through_its_own_client() {
    let Some(bin) = cairn_bench::binaries::workspace_cairn_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn-bench"))
        .args(["--duration", "1s", "--warmup", "0s", "--json", "watch-load"])
        .args(["--runs", "1", "--watchers", "1000", "--streams", "10"])
        .arg("--cairn-bin")
        .arg(&bin)
        .arg("--work-dir")
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run cairn-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let row = &v["watch_load"][0];
    let puts = row["with_watchers"]["report"]["requests"].as_u64().unwrap();
    let events = row["with_watchers"]["events_read"].as_u64().unwrap();
    // 1,000 watched keys of the preset's 100,000: about one put in a hundred.
    assert!(puts > 0, "{row}");
    assert!(
        events > 0 && events <= puts,
        "{events} events for {puts} puts: {row}"
    );
    assert_eq!(row["without_watchers"]["events_read"], 0, "{row}");
    for field in ["pooled_p99_ratio", "p99_ratio"] {
        assert!(
            row[field].as_f64().is_some_and(|r| r > 0.0),
            "{field}: {row}"
        );
    }
    assert_eq!(row["p99_ratio_per_run"].as_array().map(Vec::len), Some(1));
}

//! The operations surface of a real `cairn` process: /metrics on the client
//! port (etcd's names, moving with writes), /readyz that waits for a leader,
//! and systemd's notification protocol (READY=1 only once ready, WATCHDOG=1
//! while the cores are alive, STOPPING=1 on SIGTERM). Guards against a daemon
//! that tells systemd it is ready before it can serve, metrics that do not move,
//! or a supervisor that never hears from it.

use crate::common;
use crate::promtext;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::{client, http_get, wait_writable, Cluster};

/// A scrape, parsed once; the whole exposition must parse.
fn parsed(text: &str) -> promtext::Exposition {
    promtext::parse(text).unwrap_or_else(|e| panic!("bad exposition: {e}\n{text}"))
}

/// The value of an unlabelled sample.
fn sample(exposition: &promtext::Exposition, name: &str) -> f64 {
    exposition
        .value(name, &[])
        .unwrap_or_else(|| panic!("{name} not exported once"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_writes_and_readyz_waits_for_a_leader() {
    // One member of a three-member cluster alone has no quorum: never ready.
    let mut cluster = Cluster::start(3, &["--shards", "2"]);
    cluster.members[1].kill9();
    cluster.members[2].kill9();
    let port = cluster.members[0].client_port;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = http_get(port, "/readyz");
        if code != 0 {
            assert_eq!(code, 503, "ready without a quorum: {body}");
            assert!(body.contains("shard_leaders failed"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "client port never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.members[1].restart();
    cluster.members[2].restart();
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warm").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = http_get(port, "/readyz");
        if code == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never ready with a quorum: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, health) = http_get(port, "/health");
    assert_eq!(code, 200);
    assert!(health.contains("\"health\":\"true\""), "{health}");

    let (_, before) = http_get(port, "/metrics");
    let before = parsed(&before);
    let fsyncs_before = sample(&before, "etcd_disk_wal_fsync_duration_seconds_count");
    let applied_before = sample(&before, "etcd_server_proposals_applied_total");
    for i in 0..50 {
        c.put(format!("/metrics/{i}"), "v", None).await.unwrap();
    }
    let (_, after_text) = http_get(port, "/metrics");
    let after = parsed(&after_text);
    let fsyncs_after = sample(&after, "etcd_disk_wal_fsync_duration_seconds_count");
    assert!(
        fsyncs_after > fsyncs_before,
        "WAL fsync histogram did not move: {fsyncs_before} -> {fsyncs_after}"
    );
    assert!(sample(&after, "etcd_server_proposals_applied_total") >= applied_before + 50.0);
    assert_eq!(sample(&after, "etcd_server_has_leader"), 1.0);
    assert!(after_text.contains("etcd_server_leader_changes_seen_total"));
    assert!(after_text.contains("cairn_wal_backend_info"));

    // Idle polling is on by default: among 50 replicated writes' waits some are
    // shorter than its window, and those are polled through.
    let log = cluster.members[0].log_text();
    assert!(log.contains("idle_polling=true"), "{log}");
    let idle_polls = after.sum("cairn_core_idle_polls_total");
    assert!(idle_polls > 0.0, "no idle polls counted:\n{after_text}");
    // Each poll is timed: as many observations as polls (give or take the
    // polls a core counts while the scrape reads it), and time spent.
    let timed = after.sum("cairn_core_idle_poll_duration_seconds_count");
    assert!(
        (timed - idle_polls).abs() <= 4.0,
        "{timed} timed of {idle_polls}:\n{after_text}"
    );
    assert!(
        after.sum("cairn_core_idle_poll_duration_seconds_sum") > 0.0,
        "idle polls took no time:\n{after_text}"
    );

    // Three members on one host divide its CPUs: each gets a third of them (at
    // least one) and pins them from its own offset, so members 0 and 1 share none.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let share = format!("cores={} shards=2 members_on_host=3", (cpus / 3).max(1));
    let pinned: Vec<Vec<String>> = (0..2)
        .map(|i| {
            let log = cluster.members[i].log_text();
            assert!(log.contains(&share), "{share:?} not in\n{log}");
            log.lines()
                .filter(|l| l.contains("core started"))
                .filter_map(|l| l.split(' ').find(|w| w.starts_with("cpu=")))
                .filter(|w| *w != "cpu=unpinned")
                .map(str::to_string)
                .collect()
        })
        .collect();
    // Pinning is best effort (a cpuset may forbid it): compare what was pinned.
    if cpus >= 2 {
        assert!(
            pinned[0].iter().all(|c| !pinned[1].contains(c)),
            "members 0 and 1 pinned to the same CPU: {pinned:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_stages_and_cross_core_commands_are_counted() {
    // Two cores, a shard each: one connection lands on one core, and the
    // keys of the other core's shard cross to it.
    let cluster = Cluster::start(1, &["--cores", "2", "--shards", "2"]);
    let port = cluster.members[0].client_port;
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warm").await;
    let (_, before) = http_get(port, "/metrics");
    const PUTS: f64 = 64.0;
    for i in 0..PUTS as usize {
        c.put(format!("/stages/{i}"), "v", None).await.unwrap();
    }
    c.get("/stages/0", None).await.unwrap();
    let (_, after) = http_get(port, "/metrics");
    let (before_all, after_all) = (parsed(&before), parsed(&after));
    let moved = |name: &str| after_all.sum(name) - before_all.sum(name);

    // Every unary KV call is timed once, on the core that took it.
    assert_eq!(
        moved("cairn_core_kv_request_duration_seconds_count"),
        PUTS + 1.0,
        "{after}"
    );
    assert!(moved("cairn_core_kv_request_duration_seconds_sum") > 0.0);
    // Every put was proposed here and timed to its apply; the read was not.
    assert_eq!(
        moved("cairn_shard_proposal_duration_seconds_count"),
        PUTS,
        "{after}"
    );
    let proposal_secs = moved("cairn_shard_proposal_duration_seconds_sum");
    let request_secs = moved("cairn_core_kv_request_duration_seconds_sum");
    assert!(
        proposal_secs > 0.0 && proposal_secs < request_secs,
        "a proposal's time is part of its request's: {proposal_secs} of {request_secs}"
    );
    // A WAL flush is timed in both histograms (give or take one a scrape
    // reads between the two: another shard may close a revision meanwhile).
    let flushes = moved("cairn_core_wal_flush_duration_seconds_count");
    let fsyncs = moved("cairn_core_wal_fsync_duration_seconds_count");
    assert!(
        (flushes - fsyncs).abs() <= 2.0,
        "{flushes} flushes, {fsyncs} fsyncs"
    );
    assert!(flushes > 0.0);
    // One command per request (the read and the puts), at least; the keys
    // of the shard the connection's core does not own crossed.
    let commands = moved("cairn_core_shard_commands_total");
    let forwarded = moved("cairn_core_forwarded_commands_total");
    assert!(commands >= PUTS + 1.0, "{commands} commands:\n{after}");
    assert!(
        forwarded >= 1.0 && forwarded < commands,
        "{forwarded} of {commands} forwarded:\n{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_commits_go_in_steps_and_land() {
    let mut cluster = Cluster::start(1, &[]);
    let port = cluster.members[0].client_port;
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warm").await;
    let (_, before) = http_get(port, "/metrics");
    let before = parsed(&before);
    let value = "v".repeat(256);
    for i in 0..200 {
        c.put(format!("/steps/{i:03}"), value.as_str(), None)
            .await
            .unwrap();
    }
    // The puts commit on a tick within 200 ms; waited for by progress (the
    // commit counter), with a bound far beyond it for a loaded machine.
    let (commits, steps, after) = common::eventually(
        "a store commit after 200 puts",
        Duration::from_secs(60),
        || async {
            let (_, text) = http_get(port, "/metrics");
            let after = parsed(&text);
            let moved = |name: &str| after.sum(name) - before.sum(name);
            let commits = moved("cairn_shard_backend_commit_duration_seconds_count");
            let steps = moved("cairn_shard_backend_commit_step_duration_seconds_count");
            // The finer histogram counts the same commits since the start
            // (totals from one scrape: it may fall between the two
            // observations of a commit, and the next one settles it).
            let total = |name: &str| after.sum(name);
            let same = total("cairn_shard_store_commit_duration_seconds_count")
                == total("cairn_shard_backend_commit_duration_seconds_count");
            if commits >= 1.0 && same {
                Ok((commits, steps, text))
            } else {
                Err(format!("no commit yet, or not in both histograms:\n{text}"))
            }
        },
    )
    .await;
    // A commit takes at least a step for its trees and one for its pages;
    // 200 puts of 256 B take more.
    assert!(
        steps >= 2.0 * commits,
        "{commits} commits in {steps} steps:\n{after}"
    );
    // Killed after the commit and restarted, the member has every put: from
    // the store file, and the WAL past it.
    cluster.members[0].kill9();
    cluster.members[0].restart();
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/after").await;
    let got = c
        .get(
            "/steps/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(got.kvs().len(), 200);
    assert!(got.kvs().iter().all(|kv| kv.value() == value.as_bytes()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_member_on_a_taken_client_port_is_refused() {
    // The cores' client listeners share their port through SO_REUSEPORT; a
    // second process must not join that group and take half the clients.
    let cluster = Cluster::start(1, &["--cores", "2"]);
    let port = cluster.members[0].client_port;
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/first").await;

    let dir = tempfile::tempdir().unwrap();
    let peer_port = common::free_port();
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir.path())
        .args([
            "--data-dir",
            "second.cairn",
            "--listen-client-urls",
            &format!("http://127.0.0.1:{port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("a second member on port {port} kept running");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!("binding the client port on 127.0.0.1:{port}"))
            && log.contains("in use"),
        "{log}"
    );
    // The first member still has every client of its port: puts over new
    // connections are all read back through the one opened before the
    // second start (a member sharing the port would have taken some).
    for i in 0..20 {
        let mut fresh = client(&cluster.members[0].endpoint()).await;
        fresh.put(format!("/after/{i}"), "v", None).await.unwrap();
    }
    for i in 0..20 {
        let got = c.get(format!("/after/{i}"), None).await.unwrap();
        assert_eq!(got.kvs().len(), 1, "a put on port {port} was not read back");
    }
}

#[test]
fn systemd_notifications_arrive_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let client_port = common::free_port();
    let peer_port = common::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir.path())
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client_port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
        ])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    // READY=1 first, then keepalives.
    while !seen.iter().any(|m: &String| m.contains("WATCHDOG=1")) {
        let n = sock.recv(&mut buf).expect("a notification within 30 s");
        seen.push(String::from_utf8_lossy(&buf[..n]).to_string());
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    loop {
        let n = sock.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
        let m = String::from_utf8_lossy(&buf[..n]).to_string();
        seen.push(m.clone());
        if m.contains("STOPPING=1") {
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    let ready = seen
        .iter()
        .position(|m| m.contains("READY=1"))
        .expect("READY=1 sent");
    let watchdog = seen.iter().position(|m| m.contains("WATCHDOG=1")).unwrap();
    let stopping = seen.iter().position(|m| m.contains("STOPPING=1")).unwrap();
    assert!(ready < watchdog && watchdog < stopping, "order: {seen:?}");
}

/// The harness's port claim files: the ones no process holds any more are
/// removed, a held one stays.
#[test]
fn unheld_port_claim_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("40001");
    let held = dir.path().join("40002");
    std::fs::write(&gone, b"").unwrap();
    let holder = common::open_claim_file(&held).unwrap();
    assert!(common::try_lock(&holder), "a fresh file is free to lock");
    common::remove_unheld_claims(dir.path());
    assert!(!gone.exists(), "a claim nobody holds is removed");
    assert!(held.exists(), "a held claim stays");
    drop(holder);
    common::remove_unheld_claims(dir.path());
    assert!(!held.exists(), "removed once its holder let go");
}

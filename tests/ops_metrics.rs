//! The metrics Cairn exports, read back the way Prometheus reads them. Guards
//! against: a `/metrics` output that does not parse as Prometheus text 0.0.4;
//! etcd metric names missing or of another type than etcd's (which would break
//! existing dashboards and alerts); histograms whose buckets do not move when
//! observations are recorded, or move in the wrong bucket; per-core figures lost
//! when summed into the member-wide etcd series; and scrapes that see torn
//! histograms while cores are writing.

use crate::promtext;

use std::time::Duration;

use cairn::ops::server_metrics::{server_metrics, WalBackendKind};

const FSYNC: &str = "etcd_disk_wal_fsync_duration_seconds";

fn bucket(e: &promtext::Exposition, name: &str, le: &str) -> f64 {
    e.value(&format!("{name}_bucket"), &[("le", le)])
        .unwrap_or_else(|| panic!("no single {name}_bucket{{le={le}}}"))
}

#[test]
fn renderer_output_parses_as_prometheus_text() {
    let placement = [(0, 0), (1, 1), (2, 0), (3, 1)];
    let (registry, cores) = server_metrics(2, &placement).unwrap();
    for core in &cores {
        core.set_wal_backend(WalBackendKind::IoUring);
        core.wal_fsync(Duration::from_micros(150));
        core.wal_group_commit(12, 12 * 4096);
        core.shard_command(true);
        for &(shard, on) in &placement {
            if on != core.core() {
                continue;
            }
            let s = core.shard(shard).unwrap();
            s.set_leader(true, shard % 2 == 0, true);
            s.set_term(3);
            s.set_committed_index(100 + u64::from(shard));
            s.set_applied_index(99 + u64::from(shard));
            s.proposals_pending_add(2);
            s.proposal_failed();
            s.slow_apply();
            s.backend_commit(Duration::from_millis(3));
            s.set_db_size(1 << 20, 1 << 19);
        }
    }
    let text = registry.render();
    let e = promtext::parse(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));

    let expected_types = [
        (FSYNC, "histogram"),
        ("etcd_disk_backend_commit_duration_seconds", "histogram"),
        ("etcd_server_proposals_committed_total", "gauge"),
        ("etcd_server_proposals_applied_total", "gauge"),
        ("etcd_server_proposals_pending", "gauge"),
        ("etcd_server_proposals_failed_total", "counter"),
        ("etcd_server_leader_changes_seen_total", "counter"),
        ("etcd_server_has_leader", "gauge"),
        ("etcd_server_slow_apply_total", "counter"),
        ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
        ("etcd_mvcc_db_total_size_in_use_in_bytes", "gauge"),
        ("cairn_wal_group_commit_batch_size", "histogram"),
        ("cairn_wal_backend_info", "gauge"),
        ("cairn_core_wal_fsync_duration_seconds", "histogram"),
        ("cairn_shard_store_commit_duration_seconds", "histogram"),
        ("cairn_shard_has_leader", "gauge"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("cairn_build_info", "gauge"),
    ];
    for (name, kind) in expected_types {
        let family = e.family(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(family.kind, kind, "{name}");
        assert!(
            family.help.as_deref().is_some_and(|h| !h.is_empty()),
            "{name} has no HELP"
        );
    }

    // Member-wide etcd series: sums over shards, has_leader as "every shard".
    assert_eq!(e.value("etcd_server_has_leader", &[]), Some(1.0));
    assert_eq!(
        e.value("etcd_server_leader_changes_seen_total", &[]),
        Some(4.0)
    );
    assert_eq!(
        e.value("etcd_server_proposals_committed_total", &[]),
        Some((100 + 101 + 102 + 103) as f64)
    );
    assert_eq!(e.value("etcd_server_proposals_pending", &[]), Some(8.0));
    assert_eq!(
        e.value("etcd_server_proposals_failed_total", &[]),
        Some(4.0)
    );
    assert_eq!(e.value("etcd_server_slow_apply_total", &[]), Some(4.0));
    assert_eq!(
        e.value("etcd_mvcc_db_total_size_in_bytes", &[]),
        Some((4u64 << 20) as f64)
    );
    assert_eq!(
        e.value("etcd_mvcc_db_total_size_in_use_in_bytes", &[]),
        Some((4u64 << 19) as f64)
    );
    assert_eq!(e.value(&format!("{FSYNC}_count"), &[]), Some(2.0));
    assert_eq!(bucket(&e, FSYNC, "0.001"), 2.0);

    // A store commit of 3 ms on each of the four shards, in etcd's buckets
    // for the member and in finer ones per shard.
    const COMMIT: &str = "etcd_disk_backend_commit_duration_seconds";
    assert_eq!(bucket(&e, COMMIT, "0.002"), 0.0);
    assert_eq!(bucket(&e, COMMIT, "0.004"), 4.0);
    const FINE: &str = "cairn_shard_store_commit_duration_seconds";
    for shard in ["0", "1", "2", "3"] {
        let fine = |le: &str| e.value(&format!("{FINE}_bucket"), &[("shard", shard), ("le", le)]);
        assert_eq!(fine("0.002"), Some(0.0), "shard {shard}");
        assert_eq!(fine("0.003"), Some(1.0), "shard {shard}");
    }

    // etcd's bucket layout, exactly.
    let les: Vec<String> = e
        .family(FSYNC)
        .unwrap()
        .samples
        .iter()
        .filter_map(|s| s.label("le").map(str::to_string))
        .collect();
    assert_eq!(
        les,
        [
            "0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256",
            "0.512", "1.024", "2.048", "4.096", "8.192", "+Inf"
        ]
    );

    // Cairn's labelled series.
    assert_eq!(
        e.value(
            "cairn_wal_backend_info",
            &[("core", "1"), ("backend", "io_uring")]
        ),
        Some(1.0)
    );
    assert_eq!(
        e.value("cairn_shard_is_leader", &[("core", "1"), ("shard", "3")]),
        Some(0.0)
    );
    assert_eq!(
        e.value(
            "cairn_wal_group_commit_batch_size_bucket",
            &[("core", "0"), ("le", "16")]
        ),
        Some(1.0)
    );
    assert_eq!(
        e.value(
            "cairn_wal_group_commit_batch_size_bucket",
            &[("core", "0"), ("le", "8")]
        ),
        Some(0.0)
    );
}

#[test]
fn wal_fsync_histogram_buckets_move_with_observations() {
    let (registry, cores) = server_metrics(2, &[(0, 0), (1, 1)]).unwrap();
    let before = promtext::parse(&registry.render()).unwrap();
    assert_eq!(before.value(&format!("{FSYNC}_count"), &[]), Some(0.0));

    cores[0].wal_fsync(Duration::from_micros(3_000));
    cores[1].wal_fsync(Duration::from_micros(500));
    cores[1].wal_fsync(Duration::from_secs(20));

    let after = promtext::parse(&registry.render()).unwrap();
    let moved = |le: &str| bucket(&after, FSYNC, le) - bucket(&before, FSYNC, le);
    assert_eq!(moved("0.001"), 1.0, "500 µs lands at le=0.001");
    assert_eq!(moved("0.002"), 1.0, "3 ms is above 2 ms");
    assert_eq!(moved("0.004"), 2.0, "3 ms lands at le=0.004");
    assert_eq!(moved("8.192"), 2.0, "20 s is above every finite bound");
    assert_eq!(moved("+Inf"), 3.0);
    assert_eq!(after.value(&format!("{FSYNC}_count"), &[]), Some(3.0));
    let sum = after.value(&format!("{FSYNC}_sum"), &[]).unwrap();
    assert!((sum - 20.0035).abs() < 1e-9, "sum {sum}");
    // The per-core series show where each observation came from.
    assert_eq!(
        after.value(
            "cairn_core_wal_fsync_duration_seconds_count",
            &[("core", "1")]
        ),
        Some(2.0)
    );
}

#[test]
fn scrapes_during_writes_always_parse_and_never_go_backwards() {
    let (registry, cores) = server_metrics(4, &[(0, 0), (1, 1), (2, 2), (3, 3)]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for core in &cores {
            let stop = &stop;
            scope.spawn(move || {
                let shard = core.shard(core.core() as u32).unwrap();
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    core.wal_fsync(Duration::from_micros(50 + (i % 5000)));
                    core.wal_group_commit(1 + i % 64, 4096);
                    shard.backend_commit(Duration::from_micros(i % 20_000));
                    i += 1;
                }
            });
        }
        let mut last_count = 0.0;
        for _ in 0..50 {
            let text = registry.render();
            let e = promtext::parse(&text).unwrap_or_else(|err| panic!("{err}"));
            let count = e.value(&format!("{FSYNC}_count"), &[]).unwrap();
            assert!(
                count >= last_count,
                "count went back from {last_count} to {count}"
            );
            last_count = count;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(last_count > 0.0, "writers made no progress");
    });
}

/// Cost of the hot-path calls and of a scrape. Run with
/// `cargo test --release -p cairn --test integration ops_metrics:: -- --ignored --nocapture`.
#[test]
#[ignore = "benchmark"]
fn bench_hot_path_and_scrape_cost() {
    const OPS: u64 = 20_000_000;
    let placement: Vec<(u32, usize)> = (0..64u32).map(|s| (s, (s % 8) as usize)).collect();
    let (registry, cores) = server_metrics(8, &placement).unwrap();
    let per_op_ns = |f: &dyn Fn(u64)| {
        let start = std::time::Instant::now();
        for i in 0..OPS {
            f(i);
        }
        start.elapsed().as_nanos() as f64 / OPS as f64
    };
    let core = &cores[0];
    let shard = core.shard(0).unwrap();
    let counter_ns = per_op_ns(&|_| core.shard_command(false));
    let observe_ns = per_op_ns(&|i| core.wal_fsync(Duration::from_nanos(50_000 + (i & 0xffff))));
    let shard_observe_ns = per_op_ns(&|i| shard.backend_commit(Duration::from_nanos(i & 0xfffff)));
    // Two cores writing their own cells at once: no shared cache line, so the
    // per-op cost should match the single-thread figure.
    let parallel_ns = std::thread::scope(|s| {
        let handles: Vec<_> = cores[..2]
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let start = std::time::Instant::now();
                    for i in 0..OPS {
                        c.wal_fsync(Duration::from_nanos(50_000 + (i & 0xffff)));
                    }
                    start.elapsed().as_nanos() as f64 / OPS as f64
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold(0.0, f64::max)
    });
    let scrapes = 200;
    let start = std::time::Instant::now();
    let mut bytes = 0;
    for _ in 0..scrapes {
        bytes = registry.render().len();
    }
    let scrape_us = start.elapsed().as_micros() as f64 / scrapes as f64;

    println!("| operation (8 cores, 64 shards) | cost |");
    println!("|---|---|");
    println!("| counter add | {counter_ns:.1} ns |");
    println!("| core histogram observe | {observe_ns:.1} ns |");
    println!("| shard histogram observe | {shard_observe_ns:.1} ns |");
    println!("| core histogram observe, 2 threads at once | {parallel_ns:.1} ns |");
    println!("| scrape (render {bytes} bytes) | {scrape_us:.0} µs |");
    println!(
        "{{\"counter_add_ns\":{counter_ns:.2},\"observe_ns\":{observe_ns:.2},\"shard_observe_ns\":{shard_observe_ns:.2},\"observe_2_threads_ns\":{parallel_ns:.2},\"scrape_us\":{scrape_us:.0},\"scrape_bytes\":{bytes}}}"
    );
    assert!(observe_ns < 1_000.0, "an observation costs {observe_ns} ns");
}

//! A slow store disk stalls no other shard: with every store sync of shard 0
//! taking 3 s on the member that leads shard 1 (store commits are off the
//! write path: the WAL already holds every entry), and then every write of
//! shard 0's snapshot metadata (at each log compaction), writes keep flowing
//! to both shards, and shard 1, driven by the same core thread as shard 0,
//! keeps its leader; likewise while the member defragments its stores. And a
//! member installing a snapshot on shard 0 whose store's syncs stall goes on
//! applying and serving shard 1, driven by the same core thread. Guards
//! against a core thread that waits on one shard's store syncs, metadata
//! writes or snapshot install, which would stop the ticks, heartbeats and
//! requests of every shard on that core.

use crate::common;
use crate::promtext;

use std::time::{Duration, Instant};

use cairn::routing::RoutingTable;
use common::{client, http_get, shard0_leader, wait_writable, Cluster};

/// Shard `shard`'s sample `name` in a Prometheus text exposition.
fn sample(text: &str, name: &str, shard: u32) -> Option<f64> {
    let shard = shard.to_string();
    promtext::parse(text)
        .ok()?
        .value(name, &[("shard", shard.as_str())])
}

/// Shard `shard`'s (Raft term, leader changes seen) on each member.
fn terms(cluster: &Cluster, shard: u32) -> Vec<(f64, f64)> {
    cluster
        .members
        .iter()
        .map(|m| {
            let (code, body) = http_get(m.client_port, "/metrics");
            assert_eq!(code, 200, "{} /metrics", m.name);
            let term = sample(&body, "cairn_shard_raft_term", shard);
            let changes = sample(&body, "cairn_shard_leader_changes_seen_total", shard);
            match (term, changes) {
                (Some(t), Some(c)) => (t, c),
                _ => panic!(
                    "{}: no term or leader changes of shard {shard}\n{body}",
                    m.name
                ),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_on_one_shard_leaves_the_other_shards_leader_alone() {
    // Both shards on one core; an election timeout that a busy test machine
    // does not reach by itself, but a core that waited for its store's
    // syncer would: a stalled round is two syncs of 3 s, and a core that
    // waits once the syncer's queue (16 commits, one per 100 ms) is full
    // stops for about 4 s.
    let cluster = Cluster::start(
        3,
        &[
            "--shards",
            "2",
            "--cores",
            "1",
            "--election-timeout",
            "2000",
            "--snapshot-count",
            "100",
            "--test-disk-faults",
            "faults",
        ],
    );
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/slow/ready").await;
    // Leadership settles first: every shard's leadership is handed to shard
    // 0's leader soon after start (a term change of its own).
    let mut before = terms(&cluster, 1);
    let mut stable_since = Instant::now();
    let settle_by = Instant::now() + Duration::from_secs(60);
    while stable_since.elapsed() < Duration::from_secs(4) {
        assert!(
            Instant::now() < settle_by,
            "shard 1's leadership never settled: {before:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = terms(&cluster, 1);
        if now != before {
            before = now;
            stable_since = Instant::now();
        }
    }
    let leader = cluster
        .members
        .iter()
        .find(|m| {
            let (_, body) = http_get(m.client_port, "/metrics");
            sample(&body, "cairn_shard_is_leader", 1) == Some(1.0)
        })
        .expect("a member leads shard 1");
    let faults = leader.data_dir.join("faults");
    // The store's syncs stall first, then the snapshot metadata each log
    // compaction of shard 0 writes (one per 100 entries here), for longer
    // than any election timeout: a core that waited for it would stop shard
    // 1's heartbeats past every follower's patience.
    for fault in [
        "store-stall 3000 shard-0.mvcc",
        "store-stall 6000 shard-0/raft-snapshot",
    ] {
        let compactions_before = leader
            .log_text()
            .matches("raft log compacted shard=0")
            .count();
        common::replace_file(&faults, fault);
        let acked = write_for(&mut c, Duration::from_secs(12)).await;
        common::replace_file(&faults, "none");
        let after = terms(&cluster, 1);
        assert!(
            acked > 100,
            "writes stopped under {fault:?}: {acked} acknowledged\n{}",
            cluster.logs()
        );
        assert_eq!(
            before,
            after,
            "shard 1's (term, leader changes) per member moved under {fault:?}\n{}",
            cluster.logs()
        );
        let compactions = leader
            .log_text()
            .matches("raft log compacted shard=0")
            .count();
        assert!(
            !fault.ends_with("raft-snapshot") || compactions > compactions_before,
            "shard 0 never compacted its log under {fault:?}\n{}",
            cluster.logs()
        );
    }

    // A defragment of the leader's stores while shard 0's store syncs stall:
    // its steps wait for the syncer on the ticks, never on the core.
    common::replace_file(&faults, "store-stall 3000 shard-0.mvcc");
    let mut admin = client(&leader.endpoint()).await;
    let defrag = tokio::spawn(async move { admin.defragment().await });
    let acked = write_for(&mut c, Duration::from_secs(12)).await;
    common::replace_file(&faults, "none");
    let after = terms(&cluster, 1);
    assert!(
        acked > 100,
        "writes stopped during a defragment: {acked} acknowledged\n{}",
        cluster.logs()
    );
    assert_eq!(
        before,
        after,
        "shard 1's (term, leader changes) per member moved during a defragment\n{}",
        cluster.logs()
    );
    let answer = tokio::time::timeout(Duration::from_secs(120), defrag)
        .await
        .expect("the defragment answers once the stall is lifted")
        .expect("defragment task");
    assert!(answer.is_ok(), "defragment: {answer:?}\n{}", cluster.logs());
}

/// Writes under many prefixes, so both shards get them, for `time`;
/// returns how many were acknowledged.
async fn write_for(c: &mut etcd_client::Client, time: Duration) -> u64 {
    let until = Instant::now() + time;
    let mut acked = 0u64;
    let mut i = 0u64;
    while Instant::now() < until {
        i += 1;
        let key = format!("/slow{}/{i}", i % 32);
        if tokio::time::timeout(Duration::from_secs(5), c.put(key, "v", None))
            .await
            .is_ok_and(|r| r.is_ok())
        {
            acked += 1;
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_snapshot_install_leaves_the_other_shard_of_its_core_serving() {
    let mut cluster = Cluster::start(
        3,
        &[
            "--shards",
            "2",
            "--cores",
            "1",
            "--snapshot-count",
            "100",
            "--test-disk-faults",
            "faults",
        ],
    );
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/install/ready").await;
    let routing = RoutingTable::new(2, 1);
    let on_shard = |shard: u32, tag: &str| {
        (0..)
            .map(|i| format!("/install{i}/{tag}/k"))
            .find(|k| routing.shard_for_key(k.as_bytes()) == shard)
            .unwrap()
    };
    let leader = shard0_leader(&cluster).await;
    let down = (leader + 1) % 3;
    let mut c = client(&cluster.members[leader].endpoint()).await;
    let shard1_key = on_shard(1, "one");
    c.put(shard1_key.as_str(), "before", None).await.unwrap();
    // Shard 0's log moves far past the stopped member (compacted every 100
    // entries), so it is sent a snapshot; shard 1's does not.
    cluster.members[down].kill9();
    let shard0_key = on_shard(0, "zero");
    for i in 0..600 {
        let mut attempt = 0;
        while let Err(e) = c.put(shard0_key.as_str(), format!("{i}"), None).await {
            attempt += 1;
            assert!(attempt < 5, "put {shard0_key}: {e}\n{}", cluster.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Every sync of the restored shard 0 store takes 15 s.
    let faults = cluster.members[down].data_dir.join("faults");
    common::replace_file(&faults, "store-stall 15000 shard-0.mvcc");
    cluster.members[down].restart();
    let installing = "installing snapshot shard=0";
    let installed = "snapshot installed shard=0";
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cluster.members[down].log_text().contains(installing) {
        assert!(
            Instant::now() < deadline,
            "no snapshot install of shard 0 began\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A watch over every shard created meanwhile cannot reach shard 0 in
    // time: it is cancelled with the reason, not left waiting for shard 0.
    let mut own = client(&cluster.members[down].endpoint()).await;
    let mut watcher = own.clone();
    let watch = tokio::spawn(async move {
        let mut stream = watcher
            .watch("", Some(etcd_client::WatchOptions::new().with_all_keys()))
            .await
            .unwrap();
        stream.message().await.unwrap().expect("a create response")
    });
    // While the install waits for its disk, shard 1 on the same core applies
    // a new write and serves it.
    c.put(shard1_key.as_str(), "during", None).await.unwrap();
    let serializable = etcd_client::GetOptions::new().with_serializable();
    loop {
        let log = cluster.members[down].log_text();
        assert!(
            !log.contains(installed),
            "shard 1 answered the new write only after shard 0's install ended\n{}",
            cluster.logs()
        );
        let got = own
            .get(shard1_key.as_str(), Some(serializable.clone()))
            .await
            .ok()
            .and_then(|r| r.kvs().first().map(|kv| kv.value().to_vec()));
        if got.as_deref() == Some(&b"during"[..]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let created = watch.await.unwrap();
    if !cluster.members[down].log_text().contains(installed) {
        assert!(
            created.created()
                && created.canceled()
                && created.cancel_reason().contains("timed out"),
            "a watch missing shard 0: {created:?}\n{}",
            cluster.logs()
        );
    }
    // Lifted, the install finishes and the member serves shard 0 too.
    common::replace_file(&faults, "none");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = own
            .get(shard0_key.as_str(), Some(serializable.clone()))
            .await
            .ok()
            .and_then(|r| r.kvs().first().map(|kv| kv.value().to_vec()));
        if got.as_deref() == Some(&b"599"[..]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shard 0 never caught up after the stall: {got:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cluster.members[down].log_text().contains(installed));
}

//! A 3-member cluster of real `cairn` processes on 127.0.0.1, driven by the
//! third-party `etcd-client` crate. Guards against: writes that only work on
//! the leader, followers serving stale linearizable reads, txn compare-and-swap
//! letting two writers win, keys routed to the wrong shard, merged ranges out of
//! order or miscounted, cross-shard txns silently accepted, and bad requests
//! getting anything but etcd's errors — or taking the daemon down.

use crate::common;
use crate::promtext;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use common::{client, status_of, wait_writable, Cluster};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_member_cluster_behaves_like_etcd() {
    let cluster = Cluster::start(3, &["--shards", "4", "--cores", "2"]);
    let eps = cluster.endpoints();
    let mut clients = Vec::new();
    for ep in &eps {
        let mut c = client(ep).await;
        wait_writable(&mut c, &format!("/ready/{ep}")).await;
        clients.push(c);
    }
    // Every member says how it numbers revisions.
    for m in &cluster.members {
        let log = m.log_text();
        assert!(
            log.contains("running 4 shards: revisions start at 2^40"),
            "{}: {log}",
            m.name
        );
    }

    // Writes on any member; linearizable reads on every member see the latest.
    for round in 0..3 {
        for (i, writer) in clients.clone().iter_mut().enumerate() {
            let value = format!("v{round}-{i}");
            writer
                .put("/cfg/shared", value.clone(), None)
                .await
                .unwrap();
            for (j, reader) in clients.iter_mut().enumerate() {
                let r = reader.get("/cfg/shared", None).await.unwrap();
                assert_eq!(
                    r.kvs()[0].value_str().unwrap(),
                    value,
                    "member {j} missed the write made through member {i}\n{}",
                    cluster.logs()
                );
            }
        }
    }

    // Serializable reads are served locally and catch up.
    clients[0].put("/cfg/serial", "s1", None).await.unwrap();
    for reader in clients.iter_mut() {
        let mut seen = String::new();
        for _ in 0..100 {
            let r = reader
                .get("/cfg/serial", Some(GetOptions::new().with_serializable()))
                .await
                .unwrap();
            if let Some(kv) = r.kvs().first() {
                seen = kv.value_str().unwrap().to_string();
                if seen == "s1" {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen, "s1");
    }

    // Compare-and-swap under contention: exactly one winner per round.
    clients[0].put("/lock/cas", "0", None).await.unwrap();
    for round in 0..5 {
        let current = clients[0].get("/lock/cas", None).await.unwrap().kvs()[0].mod_revision();
        let mut tasks = Vec::new();
        for i in 0..12 {
            let mut c = clients[i % clients.len()].clone();
            tasks.push(tokio::spawn(async move {
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        "/lock/cas",
                        CompareOp::Equal,
                        current,
                    )])
                    .and_then([TxnOp::put("/lock/cas", format!("{round}-{i}"), None)]);
                c.txn(txn).await.map(|r| r.succeeded())
            }));
        }
        let mut winners = 0;
        for t in tasks {
            if t.await.unwrap().expect("txn must not fail") {
                winners += 1;
            }
        }
        assert_eq!(
            winners, 1,
            "round {round}: exactly one compare-and-swap wins"
        );
    }

    // Keys spread over shards; a range over all of them is merged in key order
    // with etcd's limit, count and more.
    let mut expected = BTreeMap::new();
    for i in 0..40 {
        let key = format!("/merge{i:02}/item");
        clients[i % 3]
            .put(key.clone(), format!("{i}"), None)
            .await
            .unwrap();
        expected.insert(key, format!("{i}"));
    }
    let r = clients[1]
        .get("/merge", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let got: Vec<(String, String)> = r
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected.clone().into_iter().collect();
    assert_eq!(got, want, "merged range in key order");
    assert_eq!(r.count(), 40);
    let r = clients[2]
        .get(
            "/merge",
            Some(GetOptions::new().with_prefix().with_limit(7)),
        )
        .await
        .unwrap();
    assert_eq!(r.kvs().len(), 7);
    assert!(r.more());
    assert_eq!(r.count(), 40);
    assert_eq!(r.kvs()[6].key_str().unwrap(), "/merge06/item");
    let r = clients[0]
        .get(
            "/merge",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Key, SortOrder::Descend)
                    .with_limit(3),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = r.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(
        keys,
        vec!["/merge39/item", "/merge38/item", "/merge37/item"]
    );
    let r = clients[0]
        .get(
            "/merge",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(r.count(), 40);
    assert!(r.kvs().is_empty());

    // A txn over keys of one routing prefix works, and one over every shard
    // too, through every member: one revision for all its writes.
    let ok = clients[0]
        .txn(Txn::new().and_then([
            TxnOp::put("/registry/pods/a", "1", None),
            TxnOp::put("/registry/pods/b", "2", None),
        ]))
        .await
        .unwrap();
    assert!(ok.succeeded());
    for (n, c) in clients.iter_mut().enumerate() {
        let puts: Vec<TxnOp> = (0..40)
            .map(|i| TxnOp::put(format!("/merge{i:02}/txn"), format!("by {n}"), None))
            .collect();
        let t = c.txn(Txn::new().and_then(puts)).await.unwrap();
        assert!(t.succeeded());
        let revision = t.header().unwrap().revision();
        let r = c
            .get("/merge", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let txn_keys: Vec<_> = r
            .kvs()
            .iter()
            .filter(|kv| kv.key().ends_with(b"/txn"))
            .collect();
        assert_eq!(txn_keys.len(), 40, "through member {n}");
        for kv in txn_keys {
            assert_eq!(kv.mod_revision(), revision, "through member {n}");
            assert_eq!(kv.value(), format!("by {n}").as_bytes());
        }
    }

    // Deleting a prefix across shards.
    let d = clients[1]
        .delete(
            "/merge",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(d.deleted(), 80);
    assert_eq!(d.prev_kvs().len(), 80);

    // Bad input gets etcd's errors.
    let e = status_of(clients[0].put("", "v", None).await.unwrap_err());
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "etcdserver: key is not provided")
    );
    let big = vec![b'x'; 1_600_000];
    let e = status_of(clients[0].put("/big", big, None).await.unwrap_err());
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    let ops: Vec<TxnOp> = (0..129)
        .map(|i| TxnOp::put(format!("/registry/x/{i}"), "v", None))
        .collect();
    let e = status_of(clients[0].txn(Txn::new().and_then(ops)).await.unwrap_err());
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )
    );
    let rev = clients[0]
        .put("/rev/k", "1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let e = status_of(
        clients[0]
            .get("/rev/k", Some(GetOptions::new().with_revision(rev + 1000)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    clients[0].put("/rev/k", "2", None).await.unwrap();
    clients[0].put("/rev/k", "3", None).await.unwrap();
    let latest = clients[0].get("/rev/k", None).await.unwrap();
    let latest_rev = latest.kvs()[0].mod_revision();
    clients[0].compact(latest_rev, None).await.unwrap();
    let e = status_of(
        clients[0]
            .get("/rev/k", Some(GetOptions::new().with_revision(rev)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );

    // Garbage on the client and peer ports closes those connections only.
    for port in [cluster.members[0].client_port, cluster.members[0].peer_port] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(&[0xde; 4096]);
        let mut buf = [0u8; 1024];
        // The member answers with an error or closes; either way it does not hang.
        let _ = s.read(&mut buf);
    }
    let r = clients[0].get("/cfg/shared", None).await.unwrap();
    assert_eq!(r.kvs().len(), 1, "still serving after garbage");

    // Every member holds the same keyspace once it has applied what is committed.
    let mut hashes = Vec::new();
    for _ in 0..50 {
        hashes.clear();
        for c in clients.iter_mut() {
            hashes.push(c.hash_kv(0).await.unwrap().hash());
        }
        if hashes.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "HashKV differs: {hashes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_see_writes_made_through_other_members() {
    let cluster = Cluster::start(3, &["--shards", "1", "--cores", "1"]);
    let mut writer = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut writer, "/warm").await;
    let mut watcher = client(&cluster.members[2].endpoint()).await;
    let first = writer.put("/watched/a", "0", None).await.unwrap();
    let start = first.header().unwrap().revision();
    let mut stream = watcher
        .watch(
            "/watched/",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_start_revision(start),
            ),
        )
        .await
        .unwrap();
    writer.put("/watched/a", "1", None).await.unwrap();
    writer.delete("/watched/a", None).await.unwrap();
    writer.put("/elsewhere", "x", None).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("events within 10 s")
            .unwrap()
            .expect("stream open");
        for e in resp.events() {
            let kv = e.kv().unwrap();
            seen.push((
                format!("{:?}", e.event_type()),
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
                e.prev_kv().map(|p| p.value_str().unwrap().to_string()),
            ));
        }
    }
    assert_eq!(
        seen,
        vec![
            ("Put".into(), "/watched/a".into(), "0".into(), None),
            (
                "Put".into(),
                "/watched/a".into(),
                "1".into(),
                Some("0".into())
            ),
            (
                "Delete".into(),
                "/watched/a".into(),
                "".into(),
                Some("1".into())
            ),
        ]
    );

    // A progress request is answered with a revision through which every
    // event has been sent (etcd's promise), not 0.
    let last = writer
        .put("/watched/b", "2", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the event within 10 s")
        .unwrap()
        .expect("stream open");
    assert_eq!(
        event.events()[0].kv().unwrap().key_str().unwrap(),
        "/watched/b"
    );
    stream.request_progress().await.unwrap();
    let progress = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("progress within 10 s")
        .unwrap()
        .expect("stream open");
    assert!(progress.events().is_empty() && !progress.canceled());
    assert!(
        progress.header().unwrap().revision() >= last,
        "progress at {} but events through {last} were sent",
        progress.header().unwrap().revision()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_gives_freed_space_back_to_the_disk() {
    let cluster = Cluster::start(1, &["--shards", "2", "--cores", "1"]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/defrag/ready").await;
    let value = "x".repeat(4096);
    for i in 0..3000 {
        let prefix = if i % 2 == 0 { "/da/" } else { "/db/" };
        c.put(format!("{prefix}{i:05}"), value.clone(), None)
            .await
            .unwrap();
    }
    let mut last = 0;
    for prefix in ["/da/", "/db/"] {
        let r = c
            .delete(
                prefix,
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        last = last.max(r.header().unwrap().revision());
    }
    c.compact(
        last,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    let before = c.status().await.unwrap().db_size();
    c.defragment().await.unwrap();
    let after = c.status().await.unwrap();
    assert!(
        after.db_size() * 2 < before,
        "db size {} before defragment, {} after",
        before,
        after.db_size()
    );
    // Status reports one Raft log's indexes, shard 0's (whose term it gives
    // too), not a sum over the shards' logs.
    let (_, body) = common::http_get(cluster.members[0].client_port, "/metrics");
    let committed = promtext::parse(&body)
        .unwrap()
        .value("cairn_shard_proposals_committed_total", &[("shard", "0")]);
    assert_eq!(Some(after.raft_index() as f64), committed, "{body}");
    // Still serving, with the data that is left.
    c.put("/da/after", "1", None).await.unwrap();
    let r = c.get("/defrag/ready", None).await.unwrap();
    assert_eq!(r.kvs().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_carry_on_while_leadership_is_handed_over() {
    // Three shards on three members, all led by one member (the keyspace
    // leader). MoveLeader, asked of that member every 1.5 s, hands every
    // shard to the next member while writers through every member keep
    // going: a proposal that reaches a leader in the middle of a handover,
    // or a member whose revision counter has not opened yet, waits for the
    // new leader instead of being lost (its client would hang until the
    // request timeout) or refused.
    let flags = ["--shards", "3", "--cores", "1"];
    let cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/handover/ready").await;
    let ids: Vec<(String, u64)> = c
        .member_list()
        .await
        .unwrap()
        .members()
        .iter()
        .map(|m| (m.name().to_string(), m.id()))
        .collect();
    let id_of = |i: usize| {
        ids.iter()
            .find(|(name, _)| *name == cluster.members[i].name)
            .map(|(_, id)| *id)
            .unwrap()
    };
    let openings = |logs: &str| {
        logs.matches("keyspace leader: this member assigns revisions")
            .count()
    };
    let opened_before = openings(&cluster.logs());
    let mut writers = Vec::new();
    for (w, m) in cluster.members.iter().enumerate() {
        let endpoint = m.endpoint();
        writers.push(tokio::spawn(async move {
            let mut c = client(&endpoint).await;
            let until = std::time::Instant::now() + Duration::from_secs(8);
            let mut failures = Vec::new();
            let mut n = 0u64;
            while std::time::Instant::now() < until {
                // Eight routing prefixes per writer reach every shard.
                let key = format!("/handover{w}-{}/{n}", n % 8);
                let put = c.put(key.clone(), n.to_string(), None);
                match tokio::time::timeout(Duration::from_secs(4), put).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => failures.push(format!("{key}: {e}")),
                    Err(_) => failures.push(format!("{key}: no answer in 4 s")),
                }
                n += 1;
            }
            (n, failures)
        }));
    }
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let from = common::shard0_leader(&cluster).await;
        let to = (from + 1) % cluster.members.len();
        let mut l = client(&cluster.members[from].endpoint()).await;
        if let Err(e) = l.move_leader(id_of(to)).await {
            panic!(
                "move leader to {}: {e}\n{}",
                cluster.members[to].name,
                cluster.logs()
            );
        }
    }
    let mut written = 0;
    for w in writers {
        let (n, failures) = w.await.unwrap();
        assert!(failures.is_empty(), "{failures:?}\n{}", cluster.logs());
        written += n;
    }
    let logs = cluster.logs();
    assert!(
        openings(&logs) >= opened_before + 4,
        "the revision counter did not open on each new leader:\n{logs}"
    );
    assert!(written > 100, "only {written} writes");
}

/// A compaction over more keys than one step of its pass over the key index
/// takes (2,048): the pass goes on in steps, reads below the compaction are
/// refused from the start, after a `physical` compaction some member (the
/// one that proposed it) has ended its pass (a pass this short often ends
/// before an answer would reach the client anyway, so this does not tell
/// `physical` from not), and the members' HashKVs (which wait for a pass
/// under way) agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_over_many_keys_runs_in_steps_and_members_hash_alike() {
    let cluster = Cluster::start(3, &["--shards", "1"]);
    let endpoints = cluster.endpoints();
    let mut c = client(&endpoints[0]).await;
    wait_writable(&mut c, "/compact/ready").await;
    let keys = 20_000;
    let mut compact_at = 0;
    for round in 0..2 {
        for batch in 0..keys / 100 {
            let puts: Vec<TxnOp> = (0..100)
                .map(|i| {
                    let k = format!("/compact/{:05}", batch * 100 + i);
                    TxnOp::put(k, format!("v{round}"), None)
                })
                .collect();
            c.txn(Txn::new().and_then(puts)).await.unwrap();
        }
        if round == 0 {
            let r = c.get("/compact/ready", None).await.unwrap();
            compact_at = r.header().unwrap().revision();
        }
    }
    let steps_of = |port: u16| {
        let (_, body) = common::http_get(port, "/metrics");
        promtext::parse(&body)
            .unwrap()
            .value(
                "cairn_shard_compaction_index_step_duration_seconds_count",
                &[("shard", "0")],
            )
            .unwrap_or(0.0)
    };
    c.compact(
        compact_at,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    // The first of a pass's steps is taken in the compaction's apply, the
    // rest apart; the proposer had taken them all before it answered.
    let whole_pass = ((keys + 1) as f64 / 2048.0).ceil() - 1.0;
    let steps: Vec<f64> = cluster
        .members
        .iter()
        .map(|m| steps_of(m.client_port))
        .collect();
    assert!(
        steps.iter().any(|s| *s >= whole_pass),
        "a physical compaction answered before any member's pass of {whole_pass} steps ended: {steps:?}"
    );
    let old = c
        .get(
            "/compact/00000",
            Some(GetOptions::new().with_revision(compact_at - 1)),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(old).code(), Code::OutOfRange);
    let r = c
        .get(
            "/compact/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(r.count(), keys + 1, "the keys and /compact/ready");

    let latest = c.get("/compact/ready", None).await.unwrap();
    let at = latest.header().unwrap().revision();
    let mut hashes = Vec::new();
    for ep in &endpoints {
        let mut m = client(ep).await;
        // A follower answers once it has applied `at`.
        let h = common::eventually(
            "a HashKV at the leader's revision",
            Duration::from_secs(60),
            || {
                let mut m = m.clone();
                async move { m.hash_kv(at).await.map_err(|e| e.to_string()) }
            },
        )
        .await;
        assert_eq!(h.compact_version(), compact_at, "{ep}");
        hashes.push(h.hash());
        m.put("/compact/after", ep.as_str(), None).await.unwrap();
    }
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "members diverged: {hashes:?}\n{}",
        cluster.logs()
    );
}

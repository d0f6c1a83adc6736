//! One revision order over several shards (docs/KEYSPACE.md): with
//! `--shards 4` on three members, one member leads every shard, and writes
//! to keys on different shards, made one after another through any member,
//! get strictly increasing revisions, also across a kill -9 of that member;
//! every member stores each acknowledged write at the revision its client
//! was told, and the members agree on every key.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{client, http_get, wait_writable, Cluster};

#[path = "ops_promtext.rs"]
mod promtext;

const SHARDS: u32 = 4;

/// The member (index) that leads every shard, if one does.
fn keyspace_leader(cluster: &Cluster) -> Option<usize> {
    cluster.members.iter().position(|m| {
        if !m.is_running() {
            return false;
        }
        let (code, body) = http_get(m.client_port, "/metrics");
        let Ok(parsed) = promtext::parse(&body) else {
            return false;
        };
        code == 200
            && (0..SHARDS).all(|s| {
                let s = s.to_string();
                parsed.value("cairn_shard_is_leader", &[("shard", s.as_str())]) == Some(1.0)
            })
    })
}

async fn wait_keyspace_leader(cluster: &Cluster) -> usize {
    common::eventually(
        "one member leads every shard",
        Duration::from_secs(60),
        || async {
            keyspace_leader(cluster).ok_or_else(|| "no member leads every shard".to_string())
        },
    )
    .await
}

/// Writes `keys` one after another, each through the next running member,
/// retrying a refused or unanswered write on the next member until it is
/// acknowledged. Each acknowledged revision must be above every one before.
async fn write_in_order(
    cluster: &Cluster,
    keys: &[String],
    round: &'static str,
    acked: &mut Vec<(String, &'static str, i64)>,
    last: &mut i64,
) {
    let running: Vec<String> = cluster
        .members
        .iter()
        .filter(|m| m.is_running())
        .map(|m| m.endpoint())
        .collect();
    for (i, key) in keys.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut attempt = 0;
        let revision = loop {
            let endpoint = &running[(i + attempt) % running.len()];
            attempt += 1;
            let put = async {
                let mut c = client(endpoint).await;
                c.put(key.as_str(), round, None).await
            };
            match tokio::time::timeout(Duration::from_secs(5), put).await {
                Ok(Ok(r)) => break r.header().expect("a header").revision(),
                Ok(Err(e)) => {
                    assert!(
                        Instant::now() < deadline,
                        "{key}: never acknowledged: {e}\n{}",
                        cluster.logs()
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => assert!(
                    Instant::now() < deadline,
                    "{key}: never acknowledged\n{}",
                    cluster.logs()
                ),
            }
        };
        assert!(
            revision > *last,
            "{key} was written after a write acknowledged at revision {last} but got revision {revision}"
        );
        *last = revision;
        acked.push((key.clone(), round, revision));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_every_shard_follow_one_revision_order_across_a_leader_crash() {
    let flags = ["--shards", "4", "--cores", "1"];
    let mut cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/keyspace/ready").await;
    let leader = wait_keyspace_leader(&cluster).await;

    // Keys without '/' route by the whole key: these reach every shard.
    let routing = cairn::routing::RoutingTable::new(SHARDS as usize, 1);
    let keys: Vec<String> = (0..48).map(|i| format!("order-{i}")).collect();
    let reached: std::collections::BTreeSet<u32> = keys
        .iter()
        .map(|k| routing.shard_for_key(k.as_bytes()))
        .collect();
    assert_eq!(reached.len(), SHARDS as usize, "the keys reach every shard");

    let mut acked = Vec::new();
    let mut last = 0;
    write_in_order(&cluster, &keys, "before", &mut acked, &mut last).await;

    // The member leading every shard dies; another takes every shard over
    // and goes on above every revision acknowledged so far.
    cluster.members[leader].kill9();
    write_in_order(&cluster, &keys, "during", &mut acked, &mut last).await;
    let second = wait_keyspace_leader(&cluster).await;
    assert_ne!(second, leader);

    cluster.members[leader].restart();
    write_in_order(&cluster, &keys, "after", &mut acked, &mut last).await;

    // Every member holds every acknowledged write at the revision its client
    // was told. (A write whose client gave up may still be applied later, as
    // in etcd, so the latest value of a key is not asserted; the members
    // must agree on it.)
    for m in &cluster.members {
        let endpoint = m.endpoint();
        common::eventually(
            &format!("{} stores every acknowledged write", m.name),
            Duration::from_secs(60),
            || {
                let endpoint = endpoint.clone();
                let acked = &acked;
                async move {
                    let mut c = client(&endpoint).await;
                    for (key, round, revision) in acked {
                        let opts = etcd_client::GetOptions::new()
                            .with_serializable()
                            .with_revision(*revision);
                        let r = c
                            .get(key.as_str(), Some(opts))
                            .await
                            .map_err(|e| format!("{key} at {revision}: {e}"))?;
                        let got = r.kvs().first().map(|kv| (kv.mod_revision(), kv.value()));
                        if got != Some((*revision, round.as_bytes())) {
                            return Err(format!(
                                "{key} at {revision}: {got:?}, acknowledged as {round}"
                            ));
                        }
                    }
                    Ok(())
                }
            },
        )
        .await;
    }
    common::eventually(
        "the members agree on every key",
        Duration::from_secs(60),
        || async {
            let mut states = Vec::new();
            for m in &cluster.members {
                let mut c = client(&m.endpoint()).await;
                let mut state = BTreeMap::new();
                for key in &keys {
                    let opts = etcd_client::GetOptions::new().with_serializable();
                    let r = c
                        .get(key.as_str(), Some(opts))
                        .await
                        .map_err(|e| e.to_string())?;
                    let kv = r.kvs().first().ok_or(format!("{key} is missing"))?;
                    state.insert(key.clone(), (kv.mod_revision(), kv.value().to_vec()));
                }
                states.push(state);
            }
            if states.windows(2).all(|w| w[0] == w[1]) {
                Ok(())
            } else {
                Err(format!("{states:?}"))
            }
        },
    )
    .await;
}

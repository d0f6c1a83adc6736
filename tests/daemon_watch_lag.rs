//! A watch over several shards through a member one of whose shards lags:
//! with that member's first core's WAL stalled, its shard 0 applies nothing
//! while its shard 1, on the other core, applies every write. The watch's
//! merge can release nothing past shard 0's revision, and holds at most a
//! window of shard 1's events (`cairn_core_watch_merge_held_events`), not
//! all of them: shard 1 stops short of its events past the window and
//! reads them back from its store later. Once the stall is lifted the watch
//! is sent every write once, in revision order, and holds nothing.

use crate::common;
use crate::daemon_keyspace::{check_watched, watch_until, Acked};
use crate::promtext;

use std::time::{Duration, Instant};

use cairn::routing::RoutingTable;
use cairn::server::keyspace::watch_shards::WATCH_WINDOW_REVISIONS;
use common::{client, http_get, keyspace, wait_writable, Cluster};

/// Writes to the shard that keeps up: three windows' worth.
const WRITES: usize = 3 * WATCH_WINDOW_REVISIONS as usize;
/// Clients writing them at once.
const WRITERS: usize = 8;

/// Events the watches of the member on `port` hold, over its cores.
fn held_events(port: u16) -> f64 {
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "/metrics: {body}");
    promtext::parse(&body)
        .expect("the metrics parse")
        .sum("cairn_core_watch_merge_held_events")
}

/// The first `n` keys `lag<i>` that shard `shard` holds (a key without
/// '/' routes by all of it).
fn keys_of(routing: &RoutingTable, shard: u32, n: usize) -> Vec<String> {
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("lag{i}"))
        .filter(|k| routing.shard_for_key(k.as_bytes()) == shard)
        .take(n)
        .collect();
    assert_eq!(keys.len(), n, "keys of shard {shard}");
    keys
}

/// Puts `count` values, spread over `keys`, through `endpoint` from
/// `WRITERS` clients at once; each acknowledged write.
async fn write(endpoint: &str, keys: &[String], count: usize, tag: &str) -> Vec<Acked> {
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (endpoint, keys, tag) = (endpoint.to_string(), keys.to_vec(), tag.to_string());
        writers.push(tokio::spawn(async move {
            let mut c = client(&endpoint).await;
            let mut acked = Vec::new();
            for i in (w..count).step_by(WRITERS) {
                let key = keys[i % keys.len()].clone();
                let value = format!("{tag}-{i}");
                let put = c.put(key.as_str(), value.as_str(), None);
                let r = tokio::time::timeout(Duration::from_secs(60), put)
                    .await
                    .unwrap_or_else(|_| panic!("put {key}: no answer within 60 s"))
                    .unwrap_or_else(|e| panic!("put {key}: {e}"));
                acked.push(Acked {
                    key,
                    value,
                    revision: r.header().expect("a header").revision(),
                    at: Instant::now(),
                });
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("a writer"));
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_over_a_lagging_shard_holds_a_window_of_the_others_events_and_loses_none() {
    // An election timeout a busy test machine does not reach by itself:
    // the member that lags must stay a follower of both shards.
    let flags = [
        "--shards",
        "2",
        "--cores",
        "2",
        "--election-timeout",
        "3000",
        "--test-disk-faults",
        "faults",
    ];
    let cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/lag-ready").await;
    let leader = common::eventually(
        "one member leads both shards",
        Duration::from_secs(60),
        || async { keyspace::keyspace_leader(&cluster, 2).ok_or_else(|| "not yet".to_string()) },
    )
    .await;
    let lagging = (0..3).find(|&i| i != leader).expect("a follower");
    let leader_endpoint = cluster.members[leader].endpoint();
    let lagging_member = &cluster.members[lagging];
    let routing = RoutingTable::new(2, 2);
    let (keys0, keys1) = (keys_of(&routing, 0, 16), keys_of(&routing, 1, 64));

    // A watch of both shards through the member that will lag, from a
    // first write on.
    let mut l = client(&leader_endpoint).await;
    let first = l.put(keys0[0].as_str(), "first", None).await.unwrap();
    let from = first.header().unwrap().revision();
    let mut w = client(&lagging_member.endpoint()).await;
    let mut stream = w
        .watch(
            "lag",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(from),
            ),
        )
        .await
        .unwrap();
    let mut acked = vec![Acked {
        key: keys0[0].clone(),
        value: "first".into(),
        revision: from,
        at: Instant::now(),
    }];
    // Both shards keep up: writes to both are watched as they come.
    let mut both = keys0.clone();
    both.extend(keys1.iter().cloned());
    acked.extend(write(&leader_endpoint, &both, 200, "both").await);
    acked.sort_by_key(|a| a.revision);
    let mut seen = watch_until(&mut stream, acked.last().unwrap().revision, "both shards").await;

    // The member's shard 0 stops at its next WAL write; its shard 1 goes on.
    let faults = lagging_member.data_dir.join("faults");
    common::replace_file(&faults, "stall 600000 lane-0");
    acked.extend(write(&leader_endpoint, &keys0[..1], 1, "stalled").await);
    let lagging_writes = write(&leader_endpoint, &keys1, WRITES, "lagging").await;
    let last = lagging_writes
        .iter()
        .max_by_key(|a| a.revision)
        .map(|a| (a.key.clone(), a.revision))
        .expect("writes");
    acked.extend(lagging_writes);
    // Shard 1 of the lagging member applies them all (a serializable read
    // there sees the last), and feeds the watch what its window allows.
    let local = client(&lagging_member.endpoint()).await;
    common::eventually(
        "the lagging member's shard 1 applies every write",
        Duration::from_secs(120),
        || {
            let (mut local, (key, revision)) = (local.clone(), last.clone());
            async move {
                let r = local
                    .get(
                        key.as_str(),
                        Some(etcd_client::GetOptions::new().with_serializable()),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let at = r.kvs().first().map_or(0, |kv| kv.mod_revision());
                (at >= revision)
                    .then_some(())
                    .ok_or_else(|| format!("at {at}"))
            }
        },
    )
    .await;
    assert_eq!(
        keyspace::keyspace_leader(&cluster, 2),
        Some(leader),
        "leadership moved during the stall\n{}",
        cluster.logs()
    );
    let held_start = Instant::now();
    let mut held = held_events(lagging_member.client_port);
    // What shard 1 sends within the window reaches the stream soon after.
    while held_start.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held = held.max(held_events(lagging_member.client_port));
    }
    assert!(
        held <= WATCH_WINDOW_REVISIONS as f64,
        "the watch holds {held} events of shard 1 while shard 0 lags: more than a \
         window of {WATCH_WINDOW_REVISIONS} revisions ({WRITES} were written)"
    );
    assert!(
        held >= (WATCH_WINDOW_REVISIONS / 4) as f64,
        "the watch holds only {held} events: shard 0 did not lag behind {WRITES} writes \
         to shard 1\n{}",
        cluster.logs()
    );

    // Lifted: shard 0 catches up, and the watch is sent every write once,
    // in order, and then holds nothing.
    common::replace_file(&faults, "none");
    acked.sort_by_key(|a| a.revision);
    seen.extend(
        watch_until(
            &mut stream,
            acked.last().unwrap().revision,
            "after the stall",
        )
        .await,
    );
    check_watched("a watch over a lagging shard", &seen, &acked, from - 1);
    assert_eq!(seen.len(), acked.len(), "every write once");
    common::eventually(
        "the watch holds nothing once every shard caught up",
        Duration::from_secs(30),
        || async {
            let held = held_events(lagging_member.client_port);
            (held == 0.0)
                .then_some(())
                .ok_or_else(|| format!("{held} held"))
        },
    )
    .await;
}

//! Txns over the same two shards from many clients at once, so that the
//! keyspace leader runs them in batches (one hold serving several txns over
//! other keys): each client's compare-and-swaps over its own two keys must
//! all win, the clients racing over one shared pair must never both win
//! from the same read, every acknowledged txn has a revision of its own,
//! and a watch over the whole keyspace delivers each txn's two puts
//! together at its revision.

use std::collections::{BTreeMap, BTreeSet};

use cairn::routing::RoutingTable;
use etcd_client::{Compare, CompareOp, EventType, Txn, TxnOp};

use super::whole_watch::WholeWatch;
use super::{header_revision, send_txn, start, text, Failure};
use crate::common::{client, http_get, shard0_leader, wait_writable};

/// Clients each swapping its own pair of keys.
const OWN_CLIENTS: usize = 24;
/// Clients racing over the one shared pair.
const SHARED_CLIENTS: usize = 4;
/// Compare-and-swaps each client makes (the shared ones: attempts).
const STEPS: usize = 12;

/// Two routing prefixes of `/xb<i>/` on different shards.
fn two_prefixes(routing: &RoutingTable) -> (String, String) {
    let first = "/xb0/".to_string();
    let shard = routing.shard_for_key(first.as_bytes());
    let second = (1..1000)
        .map(|i| format!("/xb{i}/"))
        .find(|p| routing.shard_for_key(p.as_bytes()) != shard)
        .expect("a prefix on another shard");
    (first, second)
}

/// An acknowledged txn: its revision and the two puts it made.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Acked {
    revision: i64,
    puts: BTreeSet<(String, String)>,
}

/// Swaps `keys` to `value` if neither key changed since `mods` (their mod
/// revisions); Some(the txn) when it won.
async fn swap(
    c: &mut etcd_client::Client,
    keys: &[String; 2],
    mods: [i64; 2],
    value: &str,
) -> Result<Option<Acked>, Failure> {
    let txn = Txn::new()
        .when(
            keys.iter()
                .zip(mods)
                .map(|(k, m)| Compare::mod_revision(k.as_str(), CompareOp::Equal, m))
                .collect::<Vec<_>>(),
        )
        .and_then(
            keys.iter()
                .map(|k| TxnOp::put(k.as_str(), value, None))
                .collect::<Vec<_>>(),
        );
    let r = send_txn(c, txn).await?;
    Ok(r.succeeded().then(|| Acked {
        revision: header_revision(&r),
        puts: keys
            .iter()
            .map(|k| (k.clone(), value.to_string()))
            .collect(),
    }))
}

/// The mod revisions and values of `keys` in one read (a txn of ranges).
async fn read_pair(
    c: &mut etcd_client::Client,
    keys: &[String; 2],
) -> Result<([i64; 2], [String; 2]), Failure> {
    let txn = Txn::new().and_then(
        keys.iter()
            .map(|k| TxnOp::get(k.as_str(), None))
            .collect::<Vec<_>>(),
    );
    let r = send_txn(c, txn).await?;
    let mut mods = [0; 2];
    let mut values = [String::new(), String::new()];
    for (i, op) in r.op_responses().into_iter().enumerate() {
        if let etcd_client::TxnOpResponse::Get(g) = op {
            if let Some(kv) = g.kvs().first() {
                mods[i] = kv.mod_revision();
                values[i] = text(kv.value());
            }
        }
    }
    Ok((mods, values))
}

/// A client swapping its own pair `STEPS` times: every swap must win, since
/// no other client names its keys.
async fn own_client(endpoint: String, keys: [String; 2]) -> Result<Vec<Acked>, String> {
    let mut c = client(&endpoint).await;
    let mut mods = [0, 0];
    let mut acked = Vec::with_capacity(STEPS);
    for step in 1..=STEPS {
        let value = format!("{step}");
        match swap(&mut c, &keys, mods, &value).await {
            Ok(Some(a)) => {
                mods = [a.revision, a.revision];
                acked.push(a);
            }
            Ok(None) => {
                return Err(format!(
                    "{keys:?} step {step}: the compare on mod revisions {mods:?} failed, \
                     yet no other client names these keys"
                ))
            }
            Err(f) => return Err(format!("{keys:?} step {step}: {f}")),
        }
    }
    Ok(acked)
}

/// A client racing over the shared pair: reads it, then swaps it to one
/// more than it read; the swaps it won.
async fn shared_client(endpoint: String, keys: [String; 2]) -> Result<Vec<Acked>, String> {
    let mut c = client(&endpoint).await;
    let mut won = Vec::new();
    for attempt in 0..STEPS {
        let (mods, values) = read_pair(&mut c, &keys)
            .await
            .map_err(|f| format!("reading {keys:?}: {f}"))?;
        if values[0] != values[1] {
            return Err(format!(
                "{keys:?} read as {values:?} at mod revisions {mods:?}: half a txn"
            ));
        }
        let next = values[0].parse::<u64>().unwrap_or(0) + 1;
        match swap(&mut c, &keys, mods, &next.to_string()).await {
            Ok(Some(a)) => won.push(a),
            Ok(None) => {}
            Err(f) => return Err(format!("{keys:?} attempt {attempt}: {f}")),
        }
    }
    Ok(won)
}

/// Shard `shard`'s sample `name` on the member at `port`.
fn shard_sample(port: u16, name: &str, shard: u32) -> f64 {
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "/metrics answered {code}");
    crate::promtext::parse(&body)
        .expect("/metrics parses")
        .value(name, &[("shard", shard.to_string().as_str())])
        .unwrap_or_else(|| panic!("no {name} for shard {shard}"))
}

/// The scenario (see the module doc), 3 members with `shards` shards.
pub(crate) async fn batched_txns_keep_their_compares_and_revisions(shards: usize) {
    let routing = RoutingTable::new(shards, 1);
    let (a, b) = two_prefixes(&routing);
    let cluster = start(3, shards);
    let endpoints = cluster.endpoints();
    let mut c = client(&endpoints[0]).await;
    wait_writable(&mut c, "/xb-ready").await;
    let start_rev = header_revision(
        &send_txn(&mut c, Txn::new())
            .await
            .unwrap_or_else(|f| panic!("an empty txn: {f}")),
    );
    // Watch everything from here on.
    let what = format!("--shards {shards}");
    let watch = WholeWatch::start(&endpoints[1], start_rev + 1, &what).await;

    let leader = shard0_leader(&cluster).await;
    let (shard_a, shard_b) = (
        routing.shard_for_key(a.as_bytes()),
        routing.shard_for_key(b.as_bytes()),
    );
    let port = cluster.members[leader].client_port;
    let before: Vec<f64> = ["holds", "held_txns"]
        .iter()
        .map(|n| shard_sample(port, &format!("cairn_shard_cross_txn_{n}_total"), shard_a))
        .collect();

    let shared = [format!("{a}shared"), format!("{b}shared")];
    let mut tasks = Vec::new();
    for i in 0..OWN_CLIENTS {
        let keys = [format!("{a}c{i}"), format!("{b}c{i}")];
        tasks.push(tokio::spawn(own_client(
            endpoints[i % endpoints.len()].clone(),
            keys,
        )));
    }
    for i in 0..SHARED_CLIENTS {
        tasks.push(tokio::spawn(shared_client(
            endpoints[i % endpoints.len()].clone(),
            shared.clone(),
        )));
    }
    let mut acked = Vec::new();
    let mut shared_won = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let got = t
            .await
            .expect("a client panicked")
            .unwrap_or_else(|e| panic!("--shards {shards}: {e}"));
        if i >= OWN_CLIENTS {
            shared_won += got.len();
        }
        acked.extend(got);
    }

    // Every acknowledged txn has a revision of its own.
    let mut by_revision: BTreeMap<i64, Acked> = BTreeMap::new();
    for t in &acked {
        if let Some(other) = by_revision.insert(t.revision, t.clone()) {
            panic!("--shards {shards}: two txns acknowledged at one revision: {other:?} and {t:?}");
        }
    }
    // The shared pair counts the swaps won.
    let (_, values) = read_pair(&mut c, &shared)
        .await
        .unwrap_or_else(|f| panic!("reading the shared pair: {f}"));
    assert_eq!(
        values,
        [shared_won.to_string(), shared_won.to_string()],
        "--shards {shards}: the shared pair after {shared_won} swaps won"
    );
    assert!(shared_won >= 1, "--shards {shards}: no shared swap won");

    // The watch: each acknowledged txn's puts, together at its revision,
    // and nothing else from these clients.
    let expected: BTreeMap<i64, BTreeSet<(String, String)>> =
        by_revision.into_iter().map(|(r, t)| (r, t.puts)).collect();
    let last = *expected.keys().next_back().expect("txns were acknowledged");
    let mut watched: BTreeMap<i64, BTreeSet<(String, String)>> = BTreeMap::new();
    for e in watch.through(&mut c, last, &what).await {
        if e.key.starts_with("/xb") {
            assert!(
                e.kind == EventType::Put,
                "{what}: a delete of {} at {}",
                e.key,
                e.revision
            );
            watched
                .entry(e.revision)
                .or_default()
                .insert((e.key, e.value));
        }
    }
    if watched != expected {
        let diff: Vec<_> = expected
            .iter()
            .filter(|(r, p)| watched.get(r) != Some(p))
            .take(5)
            .map(|(r, p)| (r, p, watched.get(r)))
            .collect();
        panic!(
            "--shards {shards}: the watch differs from the acknowledged txns ({} watched \
             revisions, {} acknowledged); first differing (acknowledged, watched): {diff:?}",
            watched.len(),
            expected.len()
        );
    }

    // The keyspace leader served them in batches: more txns than holds.
    let after: Vec<f64> = ["holds", "held_txns"]
        .iter()
        .map(|n| shard_sample(port, &format!("cairn_shard_cross_txn_{n}_total"), shard_a))
        .collect();
    let (holds, txns) = (after[0] - before[0], after[1] - before[1]);
    assert!(
        txns > holds && holds >= 1.0,
        "--shards {shards}: shard {shard_a} (with {shard_b}) held {holds} times for {txns} \
         txns: no batch formed"
    );
}

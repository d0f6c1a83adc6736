//! One keyspace at every shard count (`--shards` 1, 2, 4 and 8, one member
//! and three), through the etcd-client crate: writes to keys of unrelated
//! names, made one after another through alternating members, take
//! increasing revisions; a list of the whole keyspace and a watch from the
//! list's revision + 1 see every later write once, in order; a read of the
//! whole keyspace at a past revision, through every member, is exactly the
//! writes at or below it; a compaction at that revision holds for the whole
//! keyspace, with etcd's errors below it for reads and watches. Guards
//! against a shard count at which the shards show through the API.
//! (etcd's lock, election and txn recipes at the same counts, through
//! etcdctl: `tests/etcdctl_recipes.rs`; three members at `--shards 4`
//! through kills: `tests/daemon_keyspace.rs`.)

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{client, wait_writable, Cluster};
use etcd_client::{Client, GetOptions, WatchOptions};

/// Keys of unrelated routing prefixes (a name up to its '/', Kubernetes
/// resource types, keys without '/'): at 2 shards and more they spread.
const KEYS: [&str; 8] = [
    "a",
    "zz",
    "lock-x/1",
    "mylock/2",
    "/registry/pods/p",
    "/registry/leases/l",
    "/x/y",
    "plain",
];

/// A write as acknowledged: its key, value and revision.
type Written = (String, String, i64);

/// Writes every key of `KEYS` with `round` in its value, through the
/// clients in turn; each revision above the one before.
async fn write_round(clients: &mut [Client], round: usize, after: i64, what: &str) -> Vec<Written> {
    let mut last = after;
    let mut written = Vec::new();
    for (i, key) in KEYS.iter().enumerate() {
        let value = format!("v{round}-{i}");
        let c = &mut clients[(round * KEYS.len() + i) % clients.len()];
        let r = c.put(*key, value.clone(), None).await.unwrap();
        let revision = r.header().unwrap().revision();
        assert!(
            revision > last,
            "{what}: put {key} got revision {revision}, not above {last}"
        );
        last = revision;
        written.push((key.to_string(), value, revision));
    }
    written
}

/// The whole keyspace at `revision` (0: now), as key -> (value, mod revision),
/// but for the keys `wait_writable` wrote; and the header's revision.
async fn whole_keyspace(c: &mut Client, revision: i64) -> (BTreeMap<String, (String, i64)>, i64) {
    let got = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_revision(revision)),
        )
        .await
        .unwrap();
    let kvs = got
        .kvs()
        .iter()
        .filter(|kv| !kv.key().starts_with(b"/ready"))
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                (kv.value_str().unwrap().to_string(), kv.mod_revision()),
            )
        })
        .collect();
    (kvs, got.header().unwrap().revision())
}

/// A watch over the whole keyspace from `revision`.
async fn watch_all_from(c: &mut Client, revision: i64) -> etcd_client::WatchStream {
    let opts = WatchOptions::new()
        .with_all_keys()
        .with_start_revision(revision);
    c.watch("", Some(opts)).await.unwrap()
}

/// What the writes at or below `revision` leave.
fn expected_at(written: &[Written], revision: i64) -> BTreeMap<String, (String, i64)> {
    written
        .iter()
        .filter(|w| w.2 <= revision)
        .map(|(k, v, r)| (k.clone(), (v.clone(), *r)))
        .collect()
}

async fn one_keyspace(members: usize, shards: usize) {
    let what = format!("{members} member(s), --shards {shards}");
    let cluster = Cluster::start(members, &["--shards", &shards.to_string()]);
    let mut clients = Vec::new();
    for ep in cluster.endpoints() {
        let mut c = client(&ep).await;
        wait_writable(&mut c, "/ready").await;
        clients.push(c);
    }
    let start = clients[0]
        .get("/ready", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let mut written = write_round(&mut clients, 0, start, &what).await;

    // List, then watch from the list's revision + 1 through another member.
    let (listed, list_revision) = whole_keyspace(&mut clients[0], 0).await;
    let before = expected_at(&written, list_revision);
    assert_eq!(listed, before, "{what}: the list is every write so far");
    let watcher = clients.len() - 1;
    let mut stream = watch_all_from(&mut clients[watcher], list_revision + 1).await;
    let later = write_round(&mut clients, 1, written.last().unwrap().2, &what).await;
    let until = later.last().unwrap().2;
    let mut seen: Vec<Written> = Vec::new();
    while seen.last().is_none_or(|e| e.2 < until) {
        let resp = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .unwrap_or_else(|_| panic!("{what}: no event within 30 s after {:?}", seen.last()))
            .unwrap()
            .expect("watch stream open");
        assert!(!resp.canceled(), "{what}: {}", resp.cancel_reason());
        for e in resp.events() {
            let kv = e.kv().unwrap();
            seen.push((
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
                kv.mod_revision(),
            ));
        }
    }
    assert_eq!(seen, later, "{what}: every later write once, in order");
    written.extend(later);

    // A past revision, read through every member: exactly the writes at or
    // below it, whatever shards they are on.
    let mid = written[KEYS.len() + KEYS.len() / 2].2;
    let at_mid = expected_at(&written, mid);
    for (m, c) in clients.iter_mut().enumerate() {
        let (got, _) = whole_keyspace(c, mid).await;
        assert_eq!(got, at_mid, "{what}: member {m} at revision {mid}");
    }

    // Compaction at that revision, for the whole keyspace.
    clients[0].compact(mid, None).await.unwrap();
    for (m, c) in clients.iter_mut().enumerate() {
        let below = c
            .get(
                "",
                Some(GetOptions::new().with_all_keys().with_revision(mid - 1)),
            )
            .await
            .unwrap_err();
        assert!(
            below.to_string().contains("compacted"),
            "{what}: member {m} read below the compaction: {below}"
        );
        let (got, _) = whole_keyspace(c, mid).await;
        assert_eq!(got, at_mid, "{what}: member {m} at the compacted revision");
    }
    let mut stream = watch_all_from(&mut clients[watcher], mid - 1).await;
    let resp = loop {
        let resp = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .unwrap_or_else(|_| panic!("{what}: a watch below the compaction got no answer"))
            .unwrap()
            .expect("watch stream open");
        if resp.canceled() || !resp.events().is_empty() {
            break resp;
        }
    };
    assert!(
        resp.canceled() && resp.compact_revision() == mid,
        "{what}: a watch from below the compaction: canceled {} at {} (events {})",
        resp.canceled(),
        resp.compact_revision(),
        resp.events().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_past_reads_and_compaction_hold_at_every_shard_count() {
    for members in [1, 3] {
        for shards in [1, 2, 4, 8] {
            one_keyspace(members, shards).await;
        }
    }
}

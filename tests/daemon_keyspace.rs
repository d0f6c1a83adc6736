//! One revision order over several shards (docs/KEYSPACE.md): with
//! `--shards 4` on three members, one member leads every shard, and writes
//! to keys on different shards, made one after another through any member,
//! get strictly increasing revisions, also across a kill -9 of that member;
//! every member stores each acknowledged write at the revision its client
//! was told, and the members agree on every key. Linearizable reads over
//! every shard, through any member, are one cut of that order at their
//! header revision, and a compaction compacts every shard at one revision.
//! A member's serializable reads over several shards see every write it
//! acknowledged, also a txn over several shards or a lease revoke that a
//! slow follower handed to the keyspace leader, and never show a key older
//! than before.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{client, wait_writable, Cluster};

use crate::common::keyspace;

const SHARDS: u32 = 4;

async fn wait_keyspace_leader(cluster: &Cluster) -> usize {
    common::eventually(
        "one member leads every shard",
        Duration::from_secs(60),
        || async {
            keyspace::keyspace_leader(cluster, SHARDS as usize)
                .ok_or_else(|| "no member leads every shard".to_string())
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

/// One acknowledged write: key, value, revision, and when it was
/// acknowledged.
#[derive(Debug, Clone)]
pub(crate) struct Acked {
    pub key: String,
    pub value: String,
    pub revision: i64,
    pub at: Instant,
}

/// One linearizable read over every `cut-` key: when it started, its header
/// revision, and what it returned (key to mod revision and value).
#[derive(Debug)]
struct Read {
    member: usize,
    started: Instant,
    revision: i64,
    kvs: BTreeMap<String, (i64, String)>,
}

fn kvs_of(r: &etcd_client::GetResponse) -> BTreeMap<String, (i64, String)> {
    r.kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                (
                    kv.mod_revision(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_over_every_shard_is_one_cut_of_the_revision_order_through_any_member() {
    let flags = ["--shards", "4", "--cores", "1"];
    let cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/keyspace/ready").await;
    wait_keyspace_leader(&cluster).await;
    let routing = cairn::routing::RoutingTable::new(SHARDS as usize, 1);
    let key = |w: usize, j: usize| format!("cut-{w}-{j}");
    let reached: std::collections::BTreeSet<u32> = (0..2)
        .flat_map(|w| (0..8).map(move |j| (w, j)))
        .map(|(w, j)| routing.shard_for_key(key(w, j).as_bytes()))
        .collect();
    assert!(
        reached.len() >= 3,
        "the keys reach most shards: {reached:?}"
    );

    let run = Duration::from_secs(4);
    let mut writers = Vec::new();
    for w in 0..2 {
        let endpoint = cluster.members[w].endpoint();
        writers.push(tokio::spawn(async move {
            let mut c = client(&endpoint).await;
            let until = Instant::now() + run;
            let (mut acked, mut uncertain) = (Vec::new(), Vec::new());
            let mut n = 0;
            while Instant::now() < until {
                let k = key(w, n % 8);
                let value = format!("{w}-{n}");
                let put = c.put(k.as_str(), value.as_str(), None);
                match tokio::time::timeout(Duration::from_secs(10), put).await {
                    Ok(Ok(r)) => acked.push(Acked {
                        key: k,
                        value,
                        revision: r.header().unwrap().revision(),
                        at: Instant::now(),
                    }),
                    // Its outcome is unknown: the key is not checked.
                    _ => uncertain.push(k),
                }
                n += 1;
            }
            (acked, uncertain)
        }));
    }
    let mut readers = Vec::new();
    for (member, m) in cluster.members.iter().enumerate() {
        let endpoint = m.endpoint();
        readers.push(tokio::spawn(async move {
            let mut c = client(&endpoint).await;
            let until = Instant::now() + run;
            let mut reads = Vec::new();
            let mut failures = Vec::new();
            while Instant::now() < until {
                let started = Instant::now();
                let opts = etcd_client::GetOptions::new().with_prefix();
                match c.get("cut-", Some(opts)).await {
                    Ok(r) => reads.push(Read {
                        member,
                        started,
                        revision: r.header().unwrap().revision(),
                        kvs: kvs_of(&r),
                    }),
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (reads, failures)
        }));
    }
    let mut acked = Vec::new();
    let mut uncertain = std::collections::BTreeSet::new();
    for w in writers {
        let (a, u) = w.await.unwrap();
        acked.extend(a);
        uncertain.extend(u);
    }
    let mut reads = Vec::new();
    for r in readers {
        let (rs, failures) = r.await.unwrap();
        assert!(failures.is_empty(), "{failures:?}\n{}", cluster.logs());
        reads.extend(rs);
    }
    assert!(acked.len() > 50, "only {} writes", acked.len());
    for m in 0..3 {
        assert!(
            reads.iter().filter(|r| r.member == m).count() > 10,
            "member {m} served few reads"
        );
    }

    for read in &reads {
        // Linearizable: every write acknowledged before the read began is
        // at or below its revision.
        if let Some(missed) = acked
            .iter()
            .find(|a| a.at < read.started && a.revision > read.revision)
        {
            panic!(
                "a read through member {} at revision {} began after {missed:?} was acknowledged",
                read.member, read.revision
            );
        }
        // One cut: each key holds its last acknowledged write at or below
        // the read's revision, and nothing above it.
        for w in 0..2 {
            for j in 0..8 {
                let k = key(w, j);
                if uncertain.contains(&k) {
                    continue;
                }
                let expected = acked
                    .iter()
                    .filter(|a| a.key == k && a.revision <= read.revision)
                    .max_by_key(|a| a.revision)
                    .map(|a| (a.revision, a.value.clone()));
                let got = read.kvs.get(&k).cloned();
                assert_eq!(
                    got, expected,
                    "{k} in a read through member {} at revision {}",
                    read.member, read.revision
                );
            }
        }
    }

    // Read again at each read's revision later: the same answer.
    let mut c = client(&cluster.members[2].endpoint()).await;
    for read in reads.iter().step_by(7) {
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_revision(read.revision);
        let again = c.get("cut-", Some(opts)).await.unwrap();
        assert_eq!(
            kvs_of(&again),
            read.kvs,
            "read again at revision {}",
            read.revision
        );
    }

    // Compaction at one revision for the whole keyspace: every shard keeps
    // the cut at it, and refuses any revision below it.
    let mid = &reads[reads.len() / 2];
    let last = reads.iter().map(|r| r.revision).max().unwrap();
    let e = c.compact(last + 1_000_000, None).await.unwrap_err();
    assert!(e.to_string().contains("future revision"), "{e}");
    c.compact(mid.revision, None).await.unwrap();
    let at = |revision| {
        etcd_client::GetOptions::new()
            .with_prefix()
            .with_revision(revision)
    };
    let kept = c.get("cut-", Some(at(mid.revision))).await.unwrap();
    assert_eq!(kvs_of(&kept), mid.kvs);
    for w in 0..2 {
        for j in 0..8 {
            let opts = etcd_client::GetOptions::new().with_revision(mid.revision - 1);
            let e = c.get(key(w, j), Some(opts)).await.unwrap_err();
            assert!(
                e.to_string()
                    .contains("required revision has been compacted"),
                "{}: {e}",
                key(w, j)
            );
        }
    }
    let e = c.compact(mid.revision, None).await.unwrap_err();
    assert!(e.to_string().contains("compacted"), "{e}");
}

/// Reads a watch stream until it has delivered an event at or above
/// `until`; each event as (revision, key, value), in arrival order.
pub(crate) async fn watch_until(
    stream: &mut etcd_client::WatchStream,
    until: i64,
    what: &str,
) -> Vec<(i64, String, String)> {
    let mut seen: Vec<(i64, String, String)> = Vec::new();
    while seen.last().is_none_or(|e| e.0 < until) {
        let resp = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .unwrap_or_else(|_| panic!("{what}: no event within 20 s after {:?}", seen.last()))
            .unwrap()
            .expect("stream open");
        assert!(
            !resp.canceled(),
            "{what}: cancelled: {}",
            resp.cancel_reason()
        );
        for e in resp.events() {
            let kv = e.kv().unwrap();
            seen.push((
                kv.mod_revision(),
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            ));
        }
    }
    seen
}

/// Every acknowledged write above `after` exactly once, in revision order,
/// and nothing at or below it.
pub(crate) fn check_watched(
    what: &str,
    seen: &[(i64, String, String)],
    acked: &[Acked],
    after: i64,
) {
    for pair in seen.windows(2) {
        assert!(
            pair[0].0 < pair[1].0,
            "{what}: events out of revision order: {pair:?}"
        );
    }
    assert!(
        seen.iter().all(|e| e.0 > after),
        "{what}: an event at or below {after}"
    );
    let by_revision: BTreeMap<i64, (String, String)> = seen
        .iter()
        .map(|(r, k, v)| (*r, (k.clone(), v.clone())))
        .collect();
    let last = seen.last().map_or(after, |e| e.0);
    for a in acked
        .iter()
        .filter(|a| a.revision > after && a.revision <= last)
    {
        assert_eq!(
            by_revision.get(&a.revision),
            Some(&(a.key.clone(), a.value.clone())),
            "{what}: acknowledged write missing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_then_watch_over_every_shard_sees_every_later_write_once_in_order() {
    let flags = ["--shards", "4", "--cores", "1"];
    let cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/keyspace/ready").await;
    wait_keyspace_leader(&cluster).await;
    let key = |w: usize, j: usize| format!("lw-{w}-{j}");

    let mut writers = Vec::new();
    for w in 0..2 {
        let endpoint = cluster.members[w].endpoint();
        writers.push(tokio::spawn(async move {
            let mut c = client(&endpoint).await;
            let until = Instant::now() + Duration::from_secs(3);
            let mut acked = Vec::new();
            let mut n = 0;
            while Instant::now() < until {
                let k = key(w, n % 8);
                let value = format!("{w}-{n}");
                let r = c.put(k.as_str(), value.as_str(), None).await.unwrap();
                acked.push(Acked {
                    key: k,
                    value,
                    revision: r.header().unwrap().revision(),
                    at: Instant::now(),
                });
                n += 1;
            }
            acked
        }));
    }
    // List, then watch from the list's revision, through a member that
    // leads nothing, while the writers go on.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let follower = (0..3)
        .find(|&i| Some(i) != keyspace::keyspace_leader(&cluster, SHARDS as usize))
        .unwrap();
    let mut w = client(&cluster.members[follower].endpoint()).await;
    let listed = w
        .get("lw-", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let list_revision = listed.header().unwrap().revision();
    let mut stream = w
        .watch(
            "lw-",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(list_revision + 1),
            ),
        )
        .await
        .unwrap();
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.unwrap());
    }
    acked.sort_by_key(|a| a.revision);
    let last = acked.last().unwrap().revision;
    let seen = watch_until(&mut stream, last, "list-then-watch").await;
    check_watched("list-then-watch", &seen, &acked, list_revision);
    // The list plus what the watch delivered is every key's last write.
    let mut state: BTreeMap<String, String> = kvs_of(&listed)
        .into_iter()
        .map(|(k, (_, v))| (k, v))
        .collect();
    for (_, k, v) in &seen {
        state.insert(k.clone(), v.clone());
    }
    let mut expected = BTreeMap::new();
    for a in &acked {
        expected.insert(a.key.clone(), a.value.clone());
    }
    assert_eq!(state, expected);

    // One write to one shard, the others idle: its event is released once
    // the idle shards have closed its revision.
    let one = c.put("lw-single", "x", None).await.unwrap();
    let single = one.header().unwrap().revision();
    let more = watch_until(&mut stream, single, "a write while the other shards idle").await;
    assert_eq!(
        more,
        vec![(single, "lw-single".to_string(), "x".to_string())]
    );

    // A watch from the first write's revision catches up from the stores in
    // one order too.
    let first = acked.first().unwrap().revision;
    let mut again = w
        .watch(
            "lw-",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(first),
            ),
        )
        .await
        .unwrap();
    let seen = watch_until(&mut again, last, "watch from the past").await;
    check_watched("watch from the past", &seen, &acked, first - 1);
}

/// A delete whose range spans shards: a watch over its range sees every
/// deleted key at the delete's one revision, in key order, as etcd gives
/// them, and the delete's answer counts them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_over_several_shards_is_watched_in_key_order_at_one_revision() {
    let routing = cairn::routing::RoutingTable::new(SHARDS as usize, 1);
    // Keys without a '/' route by the whole key: these spread over shards.
    let keys: Vec<String> = (0..12).map(|i| format!("spread{i:02}")).collect();
    let shards: std::collections::BTreeSet<u32> = keys
        .iter()
        .map(|k| routing.shard_for_key(k.as_bytes()))
        .collect();
    assert!(shards.len() >= 3, "keys on shards {shards:?}");
    let cluster = Cluster::start(1, &["--shards", "4"]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "ready-spread").await;
    let mut last = 0;
    for k in &keys {
        last = c
            .put(k.as_str(), "v", None)
            .await
            .expect("put")
            .header()
            .unwrap()
            .revision();
    }
    let mut stream = c
        .watch(
            "spread",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(last + 1),
            ),
        )
        .await
        .expect("watch");
    let deleted = c
        .delete(
            "spread",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("delete over several shards");
    assert_eq!(deleted.deleted(), keys.len() as i64);
    let revision = deleted.header().unwrap().revision();
    let mut seen = Vec::new();
    while seen.len() < keys.len() {
        let resp = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the deletes are watched within 30 s")
            .expect("watch stream")
            .expect("watch stream open");
        for e in resp.events() {
            let kv = e.kv().unwrap();
            assert_eq!(e.event_type(), etcd_client::EventType::Delete);
            assert_eq!(kv.mod_revision(), revision, "{:?}", kv.key_str());
            seen.push(kv.key_str().unwrap().to_string());
        }
    }
    assert_eq!(seen, keys, "the deletes in key order");
}

/// A member's serializable reads over several shards see every write it
/// acknowledged before they began and never go back, as etcd's serializable
/// reads on one member do. Through each member in turn: a put to one shard
/// (or a txn over two, which a follower hands to the keyspace leader), then
/// at once a serializable read of every key, over every shard. Read at the
/// lowest revision the shards had reached, such a read missed the write
/// until the keyspace leader's close moved the idle shards on (up to 5 ms
/// later), and after a forwarded txn a follower's read of one of its shards
/// could miss it until that member applied it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_serializable_reads_over_every_shard_see_what_it_acknowledged() {
    let flags = [
        "--shards",
        "4",
        "--cores",
        "1",
        "--test-disk-faults",
        "faults",
    ];
    let cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/keyspace/ready").await;
    let leader = wait_keyspace_leader(&cluster).await;
    let routing = cairn::routing::RoutingTable::new(SHARDS as usize, 1);
    let keys: Vec<String> = (0..8).map(|i| format!("ryw-{i}")).collect();
    let shard = |k: &String| routing.shard_for_key(k.as_bytes());
    let spread: std::collections::BTreeSet<u32> = keys.iter().map(shard).collect();
    assert!(spread.len() >= 3, "the keys reach most shards: {spread:?}");
    let other = keys
        .iter()
        .find(|k| shard(k) != shard(&keys[0]))
        .expect("a key on another shard")
        .clone();
    let serializable = || etcd_client::GetOptions::new().with_serializable();

    for (m, member) in cluster.members.iter().enumerate() {
        let mut c = client(&member.endpoint()).await;
        let mut last = 0;
        let mut seen: BTreeMap<String, i64> = BTreeMap::new();
        for n in 0..40 {
            let value = format!("{m}-{n}");
            // Every fourth write is a txn over two shards.
            let (written, revision) = if n % 4 == 3 {
                let txn = etcd_client::Txn::new().and_then([
                    etcd_client::TxnOp::put(keys[0].as_str(), value.as_str(), None),
                    etcd_client::TxnOp::put(other.as_str(), value.as_str(), None),
                ]);
                let r = c.txn(txn).await.expect("txn");
                assert!(r.header().unwrap().raft_term() > 0, "{:?}", r.header());
                (
                    vec![keys[0].clone(), other.clone()],
                    r.header().unwrap().revision(),
                )
            } else {
                let k = keys[n % keys.len()].clone();
                let r = c.put(k.as_str(), value.as_str(), None).await.expect("put");
                (vec![k], r.header().unwrap().revision())
            };
            let what = format!("member {m} (leader {leader}), write {n} at {revision}");
            // The written keys alone: one shard's own state.
            for k in &written {
                let r = c.get(k.as_str(), Some(serializable())).await.expect("get");
                let got = kvs_of(&r).remove(k);
                assert_eq!(got, Some((revision, value.clone())), "{what}: {k} alone");
            }
            // Every key, over every shard: one cut.
            let r = c
                .get("ryw-", Some(serializable().with_prefix()))
                .await
                .expect("get");
            let header = r.header().unwrap().revision();
            let kvs = kvs_of(&r);
            for k in &written {
                assert_eq!(
                    kvs.get(k),
                    Some(&(revision, value.clone())),
                    "{what}: the read over every shard at {header} missed {k}"
                );
            }
            assert!(
                header >= last,
                "{what}: read at {header} after one at {last}"
            );
            // A txn of compares alone over both shards: read, at a cut no
            // lower, with a term in its header as every answer has.
            let compares = etcd_client::Txn::new().when([
                etcd_client::Compare::version(keys[0].as_str(), etcd_client::CompareOp::Greater, 0),
                etcd_client::Compare::version(other.as_str(), etcd_client::CompareOp::Greater, 0),
            ]);
            let t = c.txn(compares).await.expect("txn of compares");
            let t_header = t.header().unwrap();
            let both = kvs.contains_key(&keys[0]) && kvs.contains_key(&other);
            assert_eq!(t.succeeded(), both, "{what}: {t_header:?}, read {kvs:?}");
            assert!(t_header.raft_term() > 0, "{what}: {t_header:?}");
            assert!(
                t_header.revision() >= header,
                "{what}: {t_header:?} after {header}"
            );
            for (k, (mod_revision, _)) in &kvs {
                let before = seen.insert(k.clone(), *mod_revision).unwrap_or(0);
                assert!(
                    *mod_revision >= before,
                    "{what}: {k} went back from {before} to {mod_revision}"
                );
            }
            last = header;
        }
    }

    // A follower whose WAL writes and syncs each take 150 ms applies what
    // the other two commit late; a txn over two shards through it is
    // answered once it applied the txn all the same.
    let slow = (0..3).find(|&i| i != leader).expect("a follower");
    let faults = cluster.members[slow].data_dir.join("faults");
    common::replace_file(&faults, "stall 150");
    let mut c = client(&cluster.members[slow].endpoint()).await;
    for n in 0..3 {
        let value = format!("slow-{n}");
        let txn = etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::put(keys[0].as_str(), value.as_str(), None),
            etcd_client::TxnOp::put(other.as_str(), value.as_str(), None),
        ]);
        let revision = c.txn(txn).await.expect("txn").header().unwrap().revision();
        for k in [&keys[0], &other] {
            let r = c.get(k.as_str(), Some(serializable())).await.expect("get");
            assert_eq!(
                kvs_of(&r).remove(k),
                Some((revision, value.clone())),
                "{k} through the slow member {slow} after its txn at {revision}"
            );
        }
    }
    // So is a lease revoke: the lease's keys, on two shards, are gone from
    // its next serializable read.
    let lease = c.lease_grant(60, None).await.expect("grant").id();
    for k in [&keys[0], &other] {
        let opts = etcd_client::PutOptions::new().with_lease(lease);
        c.put(k.as_str(), "leased", Some(opts)).await.expect("put");
    }
    let revoked = c.lease_revoke(lease).await.expect("revoke");
    let revision = revoked.header().unwrap().revision();
    for k in [&keys[0], &other] {
        let r = c.get(k.as_str(), Some(serializable())).await.expect("get");
        assert_eq!(
            kvs_of(&r).remove(k),
            None,
            "{k} through the slow member {slow} after the revoke at {revision}"
        );
    }
    common::replace_file(&faults, "none");
}

//! etcd's read-only txns (every op of both branches a range), against 3
//! real members with one shard and with several: they are read as ranges
//! are, never written to the Raft log. Most txns name keys of two routing
//! prefixes, so with several shards they are read over two shards at one
//! revision. Each such txn answers as etcd would (compares on both
//! branches, a range at an old revision, a prefix, a range over both
//! prefixes, compares on ranges over both and on no key); a
//! hundred of them leave every shard's commit index where it was (but for
//! an election's entries), where five txns that write move it; a
//! linearizable one on a follower sees the put just made through the
//! leader; a range at a revision between the shard's and the read point's
//! reads the shard's state; a future or compacted revision fails only on
//! the branch taken; and on a member cut off from the others, a
//! serializable one is still served while a linearizable one is refused,
//! as etcd serves them.

use crate::common;
use crate::promtext;

use std::time::Duration;

use cairn::routing::RoutingTable;
use common::{client, http_get, shard0_leader, status_of, wait_writable, Cluster};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

/// Longest wait for a refusal by a member without a leader: it holds a
/// read while it waits for one (5 s), with slack for a busy machine.
const REFUSED_WITHIN: Duration = Duration::from_secs(60);

/// Most keys the tests touch share one routing prefix; `far` keys have
/// another, on another shard when there are several, so a txn naming both
/// is read over two shards (at one revision of the keyspace).
const PREFIX: &str = "/rt/x/";

fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// A key of a routing prefix after [`PREFIX`] in key order, on another
/// shard than it of four (a key's shard depends on the shard count only,
/// not on the cores).
fn far(name: &str) -> String {
    let routing = RoutingTable::new(4, 1);
    let home = routing.shard_for_key(PREFIX.as_bytes());
    let prefix = (0..)
        .map(|i| format!("/rt/y{i}/"))
        .find(|p| routing.shard_for_key(p.as_bytes()) != home)
        .expect("some prefix is on another shard");
    format!("{prefix}{name}")
}

/// Entries committed on every shard of a member, summed (`0` when the
/// metric is missing, which fails the comparisons below).
fn committed(port: u16) -> f64 {
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "{body}");
    promtext::parse(&body)
        .expect("metrics parse")
        .value("etcd_server_proposals_committed_total", &[])
        .unwrap_or(0.0)
}

/// The entries committed on every member once they agree (a follower
/// learns the commit index with the leader's next message).
fn settled_committed(ports: &[u16]) -> f64 {
    common::wait_until(
        "the members agree on what is committed",
        Duration::from_secs(30),
        || {
            let each: Vec<f64> = ports.iter().map(|&p| committed(p)).collect();
            if each.iter().all(|&c| c > 0.0 && c == each[0]) {
                Ok(each[0])
            } else {
                Err(format!("committed {each:?}"))
            }
        },
    )
}

/// [`settled_committed`] once it has stayed the same for two seconds: a
/// cluster of several shards commits a few entries of its own in its first
/// seconds.
async fn quiet_committed(ports: &[u16]) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut last = settled_committed(ports);
    let mut same = 0;
    while same < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the members kept committing: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = settled_committed(ports);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// The values of each range answer of a txn, in order.
fn values(r: &TxnResponse) -> Vec<Vec<String>> {
    r.op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(g) => g
                .kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                .collect(),
            other => panic!("a read-only txn answered {other:?}"),
        })
        .collect()
}

fn value_is(k: String, v: &str) -> Compare {
    Compare::value(k, CompareOp::Equal, v)
}

fn get(k: String, serializable: bool) -> TxnOp {
    get_at(k, 0, serializable)
}

/// A range of `k` at `revision` (0: the txn's own).
fn get_at(k: String, revision: i64, serializable: bool) -> TxnOp {
    let options = GetOptions::new().with_revision(revision);
    TxnOp::get(
        k,
        Some(if serializable {
            options.with_serializable()
        } else {
            options
        }),
    )
}

/// A range of `key("a")` at `revision`, which `refusal` refuses, fails a
/// txn over two shards on the branch taken only.
async fn only_the_branch_taken_is_checked(
    c: &mut etcd_client::Client,
    revision: i64,
    serializable: bool,
    refusal: &str,
) {
    let at = || get_at(key("a"), revision, serializable);
    let b_is_2 = || Txn::new().when([value_is(far("b"), "2")]);
    let r = c
        .txn(
            b_is_2()
                .and_then([get(far("b"), serializable)])
                .or_else([at()]),
        )
        .await
        .unwrap();
    assert_eq!(values(&r), vec![vec!["2"]], "serializable {serializable}");
    let refused = c
        .txn(
            b_is_2()
                .and_then([at(), get(far("b"), serializable)])
                .or_else([get(far("b"), serializable)]),
        )
        .await
        .map(|_| ());
    let s = status_of(refused.expect_err(refusal));
    assert_eq!(
        (s.code(), s.message()),
        (tonic::Code::OutOfRange, refusal),
        "serializable {serializable}"
    );
}

async fn read_only_txns_with(shards: &str) {
    let mut cluster = Cluster::start(3, &["--shards", shards, "--cores", "1"]);
    let mut c0 = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c0, &key("ready")).await;
    // c0 at the leader (of every shard: one member leads them all), c2 at
    // a follower.
    let leader = shard0_leader(&cluster).await;
    let follower = (leader + 1) % 3;
    let mut c0 = client(&cluster.members[leader].endpoint()).await;
    let mut c2 = client(&cluster.members[follower].endpoint()).await;
    let first = c0.put(key("a"), "1", None).await.unwrap();
    let first_rev = first.header().unwrap().revision();
    c0.put(far("b"), "2", None).await.unwrap();
    let written = c0.put(key("a"), "3", None).await.unwrap();
    let now = written.header().unwrap().revision();

    // Both branches, an old revision, a prefix and a range over both
    // prefixes (whole, and limited); the header carries the revision read.
    let then = c2
        .txn(
            Txn::new()
                .when([value_is(key("a"), "3")])
                .and_then([
                    get(key("a"), false),
                    TxnOp::get(key("a"), Some(GetOptions::new().with_revision(first_rev))),
                    TxnOp::get(PREFIX, Some(GetOptions::new().with_prefix())),
                    TxnOp::get("/rt/", Some(GetOptions::new().with_prefix())),
                    TxnOp::get("/rt/", Some(GetOptions::new().with_prefix().with_limit(2))),
                ])
                .or_else([get(far("b"), false)]),
        )
        .await
        .unwrap();
    assert!(then.succeeded());
    assert_eq!(
        values(&then),
        vec![
            vec!["3"],
            vec!["1"],
            vec!["3", "ready"],
            vec!["3", "ready", "2"],
            vec!["3", "ready"]
        ],
        "{then:?}"
    );
    match &then.op_responses()[4] {
        TxnOpResponse::Get(g) => assert!(g.more() && g.count() == 3, "{g:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(then.header().unwrap().revision(), now);
    // Compares alone, on keys of both prefixes and on a range over both:
    // every compare must hold on every shard holding a key of its range,
    // and a range holding none follows etcd's rule for a missing key.
    let over_both = |c: Compare| c.with_prefix();
    for (compares, holds) in [
        (vec![value_is(key("a"), "3"), value_is(far("b"), "2")], true),
        (
            vec![value_is(key("a"), "3"), value_is(far("b"), "3")],
            false,
        ),
        (
            vec![over_both(Compare::version("/rt/", CompareOp::Greater, 0))],
            true,
        ),
        (
            vec![over_both(Compare::version("/rt/", CompareOp::Equal, 1))],
            false,
        ),
        (
            vec![over_both(Compare::mod_revision(
                "/rt/",
                CompareOp::Less,
                now + 1,
            ))],
            true,
        ),
        (
            vec![over_both(Compare::version("/none/", CompareOp::Equal, 0))],
            true,
        ),
        (
            vec![over_both(Compare::value("/none/", CompareOp::Equal, ""))],
            false,
        ),
    ] {
        let r = c2
            .txn(
                Txn::new()
                    .when(compares.clone())
                    .and_then([get(key("a"), false)])
                    .or_else([get(far("b"), false)]),
            )
            .await
            .unwrap();
        assert_eq!(r.succeeded(), holds, "{compares:?}");
        let want = if holds { "3" } else { "2" };
        assert_eq!(values(&r), vec![vec![want]], "{compares:?}");
        assert_eq!(r.header().unwrap().revision(), now, "{compares:?}");
    }
    // A serializable read over several shards is read at the cut this
    // member's shards reached (docs/KEYSPACE.md), which the keyspace
    // leader's close of the idle shard moves to `now` shortly after; a
    // serializable range at `now` waits for that.
    c2.get(
        "/rt/",
        Some(
            GetOptions::new()
                .with_prefix()
                .with_serializable()
                .with_revision(now),
        ),
    )
    .await
    .unwrap();
    let otherwise = c2
        .txn(
            Txn::new()
                .when([value_is(key("a"), "1")])
                .and_then([get(key("a"), true)])
                .or_else([get(far("b"), true)]),
        )
        .await
        .unwrap();
    assert!(!otherwise.succeeded());
    assert_eq!(values(&otherwise), vec![vec!["2"]]);

    // A hundred read-only txns write nothing; five that write do.
    let ports: Vec<u16> = cluster.members.iter().map(|m| m.client_port).collect();
    let before = quiet_committed(&ports).await;
    for i in 0..100 {
        let c = if i % 2 == 0 { &mut c0 } else { &mut c2 };
        let r = c
            .txn(
                Txn::new()
                    .when([value_is(far("b"), "2")])
                    .and_then([get(key("a"), i % 4 < 2), get(far("b"), i % 4 < 2)]),
            )
            .await
            .unwrap();
        assert_eq!(values(&r), vec![vec!["3"], vec!["2"]]);
    }
    // Through the log they would commit a hundred entries; an election
    // (on a busy machine) commits one empty entry per shard.
    let after = quiet_committed(&ports).await;
    assert!(
        after < before + 20.0,
        "read-only txns reached the log: {before} entries before them, {after} after"
    );
    for i in 0..5 {
        c0.txn(Txn::new().and_then([TxnOp::put(key("w"), i.to_string(), None)]))
            .await
            .unwrap();
    }
    let moved = settled_committed(&ports);
    assert!(moved >= before + 5.0, "committed {moved}, from {before}");

    // Linearizable on another member: the put just acknowledged is seen.
    for i in 0..20 {
        c0.put(key("lin"), i.to_string(), None).await.unwrap();
        let r = c2
            .txn(
                Txn::new()
                    .when([value_is(far("b"), "2")])
                    .and_then([get(key("lin"), false), get(far("b"), false)]),
            )
            .await
            .unwrap();
        assert_eq!(
            values(&r),
            vec![vec![i.to_string()], vec!["2".to_string()]],
            "round {i}"
        );
    }

    // Writes on other shards (with several) put the read point past the
    // shard's own revision: a range at a revision between them reads the
    // shard's state, linearizable or serializable.
    let mut elsewhere = 0;
    for i in 0..8 {
        let r = c0.put(format!("/rt-other{i}/k"), "o", None).await.unwrap();
        elsewhere = r.header().unwrap().revision();
    }
    for serializable in [false, true] {
        let r = c2
            .txn(Txn::new().when([value_is(far("b"), "2")]).and_then([get_at(
                key("a"),
                elsewhere,
                serializable,
            )]))
            .await
            .unwrap();
        assert_eq!(values(&r), vec![vec!["3"]], "serializable {serializable}");
        assert!(r.header().unwrap().revision() >= elsewhere, "{r:?}");
    }
    // As in etcd, only the ranges of the branch taken are checked: a
    // future revision on the other one fails nothing.
    let future = elsewhere + 1000;
    for serializable in [false, true] {
        only_the_branch_taken_is_checked(
            &mut c2,
            future,
            serializable,
            "etcdserver: mvcc: required revision is a future revision",
        )
        .await;
    }
    // So is a compacted revision (the serializable txn asked of the
    // leader, which answered the compaction once it applied it).
    c0.compact(now, None).await.unwrap();
    for serializable in [false, true] {
        only_the_branch_taken_is_checked(
            if serializable { &mut c0 } else { &mut c2 },
            first_rev,
            serializable,
            "etcdserver: mvcc: required revision has been compacted",
        )
        .await;
    }

    // Cut off: served serializable, refused linearizable.
    for (i, m) in cluster.members.iter_mut().enumerate() {
        if i != follower {
            m.kill9();
        }
    }
    let served = c2
        .txn(
            Txn::new()
                .when([value_is(far("b"), "2")])
                .and_then([get(key("lin"), true), get(key("a"), true)]),
        )
        .await
        .expect("a serializable read-only txn without a leader");
    assert!(served.succeeded());
    assert_eq!(values(&served), vec![vec!["19"], vec!["3"]]);
    let refused = tokio::time::timeout(
        REFUSED_WITHIN,
        c2.txn(
            Txn::new()
                .when([value_is(far("b"), "2")])
                .and_then([get(key("lin"), false)]),
        ),
    )
    .await
    .expect("refused in time");
    let s = status_of(refused.expect_err("a linearizable txn without a leader"));
    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_txns_are_read_not_logged_one_shard() {
    read_only_txns_with("1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_txns_are_read_not_logged_several_shards() {
    read_only_txns_with("4").await;
}

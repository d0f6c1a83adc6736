//! etcd's automatic compaction (`--auto-compaction-mode`,
//! `--auto-compaction-retention`): the periodic mode asked of a real etcd
//! 3.4 and of Cairn with the same flags, the revision mode on a 3-member
//! cluster. Guards against a history that grows without end under a
//! retention an etcd user set, and against compaction run by every member.

use crate::common;

use std::time::Duration;

use common::{etcdctl, require_tool, Cluster, Etcd};

/// The revision of the store at `endpoint`, from a read's header.
fn revision(endpoint: &str) -> i64 {
    let (ok, out) = etcdctl(endpoint, &["get", "/ac/k", "-w", "json"]);
    assert!(ok, "{out}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    json["header"]["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no revision in {out}"))
}

/// `n` puts of one key; the revision after them.
fn puts(endpoint: &str, n: usize) -> i64 {
    for i in 0..n {
        let (ok, out) = etcdctl(endpoint, &["put", "/ac/k", &i.to_string()]);
        assert!(ok, "{out}");
    }
    revision(endpoint)
}

/// Whether a read at `rev` is refused as compacted (else it must succeed).
fn compacted_at(endpoint: &str, rev: i64) -> bool {
    let (ok, out) = etcdctl(endpoint, &["get", "/ac/k", &format!("--rev={rev}")]);
    if ok {
        return false;
    }
    assert!(
        out.contains("required revision has been compacted"),
        "{out}"
    );
    true
}

/// Waits until the history before `rev` is compacted and `rev` is not.
fn wait_compacted_to(endpoint: &str, rev: i64, logs: impl Fn() -> String) {
    common::try_wait_until(
        &format!("history before {rev} compacted at {endpoint}"),
        Duration::from_secs(90),
        || {
            if compacted_at(endpoint, rev - 1) {
                Ok(())
            } else {
                Err(format!("revision {} still readable", rev - 1))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert!(
        !compacted_at(endpoint, rev),
        "compacted past {rev}\n{}",
        logs()
    );
}

#[test]
fn periodic_compaction_keeps_the_retention_as_etcds() {
    if !(require_tool("etcdctl") && require_tool("etcd")) {
        return;
    }
    let flags = [
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        "2s",
    ];
    // One shard: etcd's revision numbering, where the last write's revision
    // is the store's (with several, the keyspace's revision moves on past
    // it, and a compaction there lands past the revision the test saw).
    let cluster = Cluster::start(1, &[&flags[..], &["--shards", "1"]].concat());
    let cairn = cluster.endpoints()[0].clone();
    let owned: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let etcd = Etcd::start_with("http", &owned);
    common::try_wait_until("etcd serving", Duration::from_secs(60), || {
        let (ok, out) = etcdctl(&etcd.endpoint, &["put", "/ac/up", "1"]);
        ok.then_some(()).ok_or(out)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", etcd.log_text()));
    common::try_wait_until("Cairn serving", Duration::from_secs(60), || {
        let (ok, out) = etcdctl(&cairn, &["put", "/ac/up", "1"]);
        ok.then_some(()).ok_or(out)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));

    // Once the writes stop, every revision noted for the last two seconds
    // is the last one: both compact the whole history before it, and keep it.
    let at_etcd = puts(&etcd.endpoint, 10);
    let at_cairn = puts(&cairn, 10);
    wait_compacted_to(&etcd.endpoint, at_etcd, || etcd.log_text());
    wait_compacted_to(&cairn, at_cairn, || cluster.logs());
    let (ok, out) = etcdctl(&cairn, &["get", "/ac/k", "--print-value-only"]);
    assert!(ok && out.trim() == "9", "{out}");
}

#[test]
fn revision_compaction_keeps_that_many_revisions_and_runs_on_the_leader_only() {
    if !require_tool("etcdctl") {
        return;
    }
    let cluster = Cluster::start(
        3,
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            "5",
            "--test-revision-compaction-interval-ms",
            "200",
            "--shards",
            "1",
        ],
    );
    let eps = cluster.endpoints();
    common::try_wait_until("the cluster serving", Duration::from_secs(60), || {
        let (ok, out) = etcdctl(&eps[0], &["put", "/ac/up", "1"]);
        ok.then_some(()).ok_or(out)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    let last = puts(&eps[1], 20);
    // Every member holds the same compacted history: the last five
    // revisions and the one they are built on.
    for ep in &eps {
        wait_compacted_to(ep, last - 5, || cluster.logs());
    }
    let compacting: Vec<&str> = cluster
        .members
        .iter()
        .filter(|m| m.log_text().contains("completed auto compaction"))
        .map(|m| m.name.as_str())
        .collect();
    // The leader of shard 0 compacts; another only if leadership moved.
    assert!(
        !compacting.is_empty() && compacting.len() < 3,
        "members that compacted: {compacting:?}"
    );
}

//! etcdctl (Debian's etcd-client package, v3.4) against a `cairn` started with
//! no flags at all, as a new user would start it: 127.0.0.1:2379, data in
//! ./default.cairn. Guards against wire or semantic differences from etcd that
//! etcdctl, the tool operators reach for first, would trip over.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ctl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg("--endpoints=127.0.0.1:2379")
        .arg("--command-timeout=10s")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run etcdctl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The `raft_term` of a response header, wherever etcdctl's JSON puts it.
fn raft_term(v: &serde_json::Value) -> Option<u64> {
    match v {
        serde_json::Value::Object(m) => m
            .get("raft_term")
            .and_then(serde_json::Value::as_u64)
            .or_else(|| m.values().find_map(raft_term)),
        serde_json::Value::Array(a) => a.iter().find_map(raft_term),
        _ => None,
    }
}

fn ok(args: &[&str]) -> String {
    let (success, out) = ctl(args, None);
    assert!(success, "etcdctl {args:?} failed:\n{out}");
    out
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("-w");
    all.push("json");
    serde_json::from_str(&ok(&all)).expect("etcdctl json output")
}

#[test]
fn etcdctl_works_against_a_default_cairn() {
    if !common::require_tool("etcdctl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("cairn.log")).unwrap())
        .spawn()
        .unwrap();
    let _daemon = Daemon { child, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ctl(&["put", "warmup", "1"], None).0 {
        assert!(
            Instant::now() < deadline,
            "cairn never answered on 127.0.0.1:2379"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        _daemon._dir.path().join("default.cairn").is_dir(),
        "data in ./default.cairn"
    );

    // put / get
    assert_eq!(ok(&["put", "foo", "bar"]).trim(), "OK");
    assert_eq!(ok(&["get", "foo"]), "foo\nbar\n");
    let put = json(&["put", "foo", "baz"]);
    let rev_baz = put["header"]["revision"].as_i64().unwrap();
    ok(&["put", "foo", "qux"]);
    let g = json(&["get", "foo"]);
    assert_eq!(g["count"], 1);
    assert_eq!(g["kvs"][0]["version"], 3);
    assert!(g["header"]["cluster_id"].as_u64().unwrap() != 0);
    let term = g["header"]["raft_term"].as_u64().unwrap();
    assert!(term >= 1);
    // Headers no shard produces carry the member's term too, as etcd's do.
    for args in [
        &["lease", "grant", "30"][..],
        &["lease", "list"],
        &["member", "list"],
    ] {
        let v = json(args);
        assert_eq!(raft_term(&v), Some(term), "etcdctl {args:?}: {v}");
    }
    let watch = Command::new("timeout")
        .args(["5", "etcdctl", "--endpoints=127.0.0.1:2379", "watch", "foo"])
        .args(["--rev", "1", "-w", "json"])
        .output()
        .expect("run etcdctl watch");
    let out = String::from_utf8_lossy(&watch.stdout);
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap_or(""))
        .unwrap_or_else(|e| panic!("etcdctl watch -w json: {e}: {out}"));
    assert_eq!(raft_term(&first), Some(term), "etcdctl watch: {first}");
    // --rev reads the past.
    assert_eq!(
        ok(&["get", "foo", "--rev", &rev_baz.to_string()]),
        "foo\nbaz\n"
    );

    // prefix, from-key, limit, sort
    for k in ["/app/a", "/app/b", "/app/c"] {
        ok(&["put", k, &format!("v{k}")]);
    }
    assert_eq!(
        ok(&["get", "/app/", "--prefix", "--keys-only"]),
        "/app/a\n\n/app/b\n\n/app/c\n\n"
    );
    assert_eq!(
        ok(&["get", "/app/b", "--from-key", "--keys-only"]),
        "/app/b\n\n/app/c\n\nfoo\n\nwarmup\n\n"
    );
    assert_eq!(
        ok(&["get", "/app/", "--prefix", "--limit", "2", "--keys-only"]),
        "/app/a\n\n/app/b\n\n"
    );
    assert_eq!(
        ok(&[
            "get",
            "/app/",
            "--prefix",
            "--sort-by",
            "KEY",
            "--order",
            "DESCEND",
            "--keys-only"
        ]),
        "/app/c\n\n/app/b\n\n/app/a\n\n"
    );
    let j = json(&["get", "/app/", "--prefix", "--limit", "1"]);
    assert_eq!(j["count"], 3);
    assert_eq!(j["more"], true);

    // txn, interactive: compares on value, version, create and mod revision.
    let g = json(&["get", "foo"]);
    let create = g["kvs"][0]["create_revision"].as_i64().unwrap();
    let modr = g["kvs"][0]["mod_revision"].as_i64().unwrap();
    let script = format!(
        "value(\"foo\") = \"qux\"\nver(\"foo\") = \"3\"\nc(\"foo\") = \"{create}\"\nm(\"foo\") = \"{modr}\"\n\nput foo won\n\nput foo lost\n\n"
    );
    let (success, out) = ctl(&["txn"], Some(&script));
    assert!(success, "{out}");
    assert!(out.starts_with("SUCCESS"), "{out}");
    assert_eq!(ok(&["get", "foo", "--print-value-only"]), "won\n");
    let (success, out) = ctl(
        &["txn"],
        Some("value(\"foo\") = \"nope\"\n\nput foo a\n\nget foo\n\n"),
    );
    assert!(success, "{out}");
    assert!(out.starts_with("FAILURE"), "{out}");
    assert!(out.contains("won"), "failure branch ran the get: {out}");

    // del: key, prefix, prev-kv
    assert_eq!(ok(&["del", "/app/a"]).trim(), "1");
    assert_eq!(ok(&["del", "/app/", "--prefix"]).trim(), "2");
    ok(&["put", "gone", "soon"]);
    assert_eq!(ok(&["del", "gone", "--prev-kv"]), "1\ngone\nsoon\n");

    // compaction: older revisions go away. HashKV's compact revision is
    // etcd's: -1 before any compaction, then the revision compacted.
    let hashkv_compacted = || {
        json(&["endpoint", "hashkv"])[0]["HashKV"]["compact_revision"]
            .as_i64()
            .unwrap_or(0)
    };
    assert_eq!(hashkv_compacted(), -1);
    let rev = json(&["put", "foo", "latest"])["header"]["revision"]
        .as_i64()
        .unwrap();
    assert_eq!(
        ok(&["compaction", &rev.to_string()]).trim(),
        format!("compacted revision {rev}")
    );
    assert_eq!(hashkv_compacted(), rev);
    let (success, out) = ctl(&["get", "foo", "--rev", &rev_baz.to_string()], None);
    assert!(
        !success && out.contains("required revision has been compacted"),
        "{out}"
    );

    // member list, endpoint status / health / hashkv
    let members = ok(&["member", "list"]);
    assert!(
        members.contains("default")
            && members.contains("http://127.0.0.1:2380")
            && members.contains("http://127.0.0.1:2379"),
        "{members}"
    );
    let status = ok(&["endpoint", "status"]);
    assert!(
        status.contains("127.0.0.1:2379") && status.contains("true"),
        "{status}"
    );
    let health = ok(&["endpoint", "health"]);
    assert!(health.contains("is healthy"), "{health}");
    let hash = ok(&["endpoint", "hashkv"]);
    let h: u64 = hash
        .trim()
        .rsplit(", ")
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("hashkv output: {hash}"));
    assert!(h != 0);
    let defrag = ok(&["defrag"]);
    assert!(defrag.contains("Finished defragmenting"), "{defrag}");

    one_keyspace_by_default(&_daemon);
}

/// A default member runs one shard per core, and etcd's recipes and the
/// list-then-watch pattern hold over the whole keyspace whatever the keys are
/// named.
fn one_keyspace_by_default(daemon: &Daemon) {
    let log = std::fs::read_to_string(daemon._dir.path().join("cairn.log")).unwrap();
    let starting = log
        .lines()
        .find(|l| l.contains("starting"))
        .unwrap_or_else(|| panic!("no starting line:\n{log}"));
    let field = |name: &str| -> usize {
        let at = starting
            .find(&format!(" {name}="))
            .unwrap_or_else(|| panic!("{name} in {starting}"));
        starting[at + name.len() + 2..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {starting}"))
    };
    let (cores, shards) = (field("cores"), field("shards"));
    assert_eq!(shards, cores, "one shard per core by default: {starting}");
    if shards > 1 {
        let said = format!("running {shards} shards: revisions start at 2^40");
        let line = log.lines().find(|l| l.contains(&said));
        assert!(
            line.is_some_and(|l| l.contains("INFO")),
            "the numbering said once, as information:\n{log}"
        );
    }
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("shards")),
        "no warning about shards at a default start:\n{log}"
    );

    // etcd's lock recipe puts `<name>/<lease>` and ranges over `<name>/`.
    for name in ["mylock", "locks-x", "/locks/y"] {
        let out = ok(&["lock", name, "--", "echo", "held"]);
        assert_eq!(out.trim(), "held", "lock {name}");
    }

    // List, then watch from the list's revision + 1: every later write, once,
    // in order, whatever its key.
    let listed = json(&["get", "", "--prefix", "--keys-only"])["header"]["revision"]
        .as_i64()
        .unwrap();
    let keys = ["a", "/x/y", "locks-x/1", "/registry/pods/p", "zz"];
    for k in keys {
        ok(&["put", k, "v"]);
    }
    let mut watch = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints=127.0.0.1:2379", "watch", "--prefix", ""])
        .arg(format!("--rev={}", listed + 1))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run etcdctl watch");
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // etcdctl prints each event as three lines: PUT, key, value.
    let mut lines = Vec::new();
    while lines.len() < keys.len() * 3 {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => lines.push(line),
            Err(_) => break,
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let seen: Vec<&str> = lines.chunks(3).map(|e| e[1].as_str()).collect();
    assert_eq!(seen, keys, "watch from the listed revision: {lines:?}");
}

//! Backup and restore with real processes: `etcdctl snapshot save` against a
//! running Cairn member, then a new 3-member cluster started from the file
//! with `--restore-snapshot`. Guards against backups that lose keys or
//! revisions, restored members that disagree, and damaged or mismatched files
//! accepted at start.

use crate::common;

use common::{client, etcdctl, wait_writable, Cluster};
use etcd_client::GetOptions;

/// Every key under the two test prefixes with its value and revisions.
async fn dump(c: &mut etcd_client::Client) -> Vec<(String, String, i64, i64, i64)> {
    let mut out = Vec::new();
    for prefix in ["/ba/", "/bb/"] {
        let r = c
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        for kv in r.kvs() {
            out.push((
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_an_etcdctl_snapshot_has_every_key() {
    if !common::require_tool("etcdctl") {
        return;
    }
    let flags = ["--shards", "2", "--cores", "1"];
    let source = Cluster::start(3, &flags);
    let mut c = client(&source.members[0].endpoint()).await;
    wait_writable(&mut c, "/backup/ready").await;
    for i in 0..300 {
        c.put(format!("/ba/{i:04}"), format!("a{i}"), None)
            .await
            .unwrap();
        c.put(format!("/bb/{i:04}"), format!("b{i}"), None)
            .await
            .unwrap();
    }
    for i in 0..50 {
        c.put(format!("/ba/{i:04}"), format!("a{i}-again"), None)
            .await
            .unwrap();
        c.delete(format!("/bb/{i:04}"), None).await.unwrap();
    }
    let expected = dump(&mut c).await;
    assert_eq!(expected.len(), 550);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.db");
    let (ok, text) = etcdctl(
        &source.members[1].endpoint(),
        &["snapshot", "save", file.to_str().unwrap()],
    );
    assert!(ok, "snapshot save failed: {text}");
    assert!(text.contains("Snapshot saved at"), "{text}");
    drop(source);

    // A damaged copy and a wrong shard count are refused at start.
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    let damaged = dir.path().join("damaged.db");
    std::fs::write(&damaged, &bytes).unwrap();
    let mut bad = Cluster::start(0, &[]);
    let idx = bad.new_joining_member("x", &[]);
    let m = &mut bad.members[idx];
    for (shards, backup, refusal) in [
        ("2", &damaged, "checksum mismatch"),
        ("3", &file, "--shards 2"),
    ] {
        let backup = backup.to_str().unwrap();
        m.set_args(&[
            "--shards",
            shards,
            "--cores",
            "1",
            "--restore-snapshot",
            backup,
        ]);
        let (code, log) = m.start_expecting_refusal();
        assert_ne!(code, 0);
        assert!(log.contains(refusal), "{log}");
    }

    // A new cluster from the file; given no --shards, its members take the
    // file's shard count.
    let restored_flags = ["--cores", "1", "--restore-snapshot", file.to_str().unwrap()];
    let restored = Cluster::start(3, &restored_flags);
    let mut clients = Vec::new();
    for m in &restored.members {
        clients.push(client(&m.endpoint()).await);
    }
    wait_writable(&mut clients[0], "/backup/restored").await;
    let log = restored.members[1].log_text();
    assert!(
        log.contains("the backup holds 2 shards; using that count"),
        "{log}"
    );
    for c in &mut clients {
        let got = dump(c).await;
        assert_eq!(got, expected, "a restored member differs");
    }
    clients[2].put("/bb/new", "after", None).await.unwrap();
    let r = clients[0].get("/bb/new", None).await.unwrap();
    assert_eq!(r.kvs()[0].value_str().unwrap(), "after");
    let mut hashes = Vec::new();
    for c in &mut clients {
        // A linearizable read first: the member has applied the last write.
        c.get("/bb/new", None).await.unwrap();
        hashes.push(c.hash_kv(0).await.unwrap().hash());
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "restored members diverged: {hashes:?}\n{}",
        restored.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_keeps_users_roles_and_permissions() {
    if !common::require_tool("etcdctl") {
        return;
    }
    let flags = ["--cores", "1", "--bcrypt-cost", "4"];
    let source = Cluster::start(1, &flags);
    let ep = source.members[0].endpoint();
    let mut c = client(&ep).await;
    wait_writable(&mut c, "/backup/ready").await;
    let root = ["--user", "root:rootpw"];
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["auth", "enable"],
        &[root[0], root[1], "role", "add", "app"],
        &[
            root[0],
            root[1],
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "/app/",
            "--prefix",
        ],
        &[root[0], root[1], "user", "add", "app:apppw"],
        &[root[0], root[1], "user", "grant-role", "app", "app"],
        &["--user", "app:apppw", "put", "/app/a", "1"],
    ] {
        let (ok, text) = etcdctl(&ep, args);
        assert!(ok, "etcdctl {args:?}: {text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.db");
    let save = [root[0], root[1], "snapshot", "save", file.to_str().unwrap()];
    let (ok, text) = etcdctl(&ep, &save);
    assert!(ok, "snapshot save failed: {text}");
    drop(source);

    let mut flags = flags.to_vec();
    flags.extend(["--restore-snapshot", file.to_str().unwrap()]);
    let restored = Cluster::start(1, &flags);
    let ep = restored.members[0].endpoint();
    // The restored member answers once it leads.
    let read = common::wait_until(
        "the restored member serving app",
        std::time::Duration::from_secs(60),
        || match etcdctl(&ep, &["--user", "app:apppw", "get", "/app/a"]) {
            (true, text) => Ok(text),
            (false, text) => Err(text),
        },
    );
    assert!(read.contains("/app/a"), "{read}");
    let (ok, text) = etcdctl(&ep, &["get", "/app/a"]);
    assert!(!ok && text.contains("user name is empty"), "{text}");
    let (ok, text) = etcdctl(&ep, &["--user", "app:apppw", "put", "/other", "x"]);
    assert!(!ok && text.contains("permission denied"), "{text}");
    let (ok, text) = etcdctl(&ep, &[root[0], root[1], "role", "get", "app"]);
    assert!(ok && text.contains("[/app/, /app0)"), "{text}");
}

//! Membership changes with real processes: a learner added with etcdctl joins a
//! running 3-member cluster (`--initial-cluster-state existing`), catches up
//! by snapshot, refuses what etcd's learners refuse, is promoted and then
//! counts in the quorum; members are removed (a running one stops and cannot
//! start again); restarts keep the membership. Guards against joins that never
//! catch up, membership lost at restart, and removed members that linger.

use crate::common;

use std::time::{Duration, Instant};

use common::{client, etcdctl, wait_writable, Cluster};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

async fn member_names(c: &mut etcd_client::Client) -> Vec<(u64, String, bool, Vec<String>)> {
    let list = c.member_list().await.expect("member list");
    let mut v: Vec<_> = list
        .members()
        .iter()
        .map(|m| {
            (
                m.id(),
                m.name().to_string(),
                m.is_learner(),
                m.client_urls().to_vec(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.1.cmp(&b.1));
    v
}

/// Retries `f` until it returns Some, at most `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A removed member exits 0 within `within`, then refuses to start again.
fn stops_for_good(m: &mut common::Member, within: Duration) {
    let code = m.wait_exit(within);
    assert_eq!(
        code,
        Some(0),
        "{} should stop once removed:\n{}",
        m.name,
        m.log_text()
    );
    let (code, log) = m.start_expecting_refusal();
    assert_ne!(code, 0);
    assert!(log.contains("was removed from the cluster"), "{log}");
}

/// The member list once every member has published its client URLs.
async fn wait_published(c: &etcd_client::Client) -> Vec<(u64, String, bool, Vec<String>)> {
    eventually("published attributes", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let m = member_names(&mut c).await;
            m.iter()
                .all(|(_, _, _, urls)| !urls.is_empty())
                .then_some(m)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_joins_is_promoted_and_members_are_removed() {
    if !common::require_tool("etcdctl") {
        return;
    }
    let flags = ["--shards", "2", "--cores", "1", "--snapshot-count", "100"];
    let mut cluster = Cluster::start(3, &flags);
    let ep0 = cluster.members[0].endpoint();
    let mut c0 = client(&ep0).await;
    wait_writable(&mut c0, "/members/ready").await;

    // Every member publishes its name and client URLs.
    let listed = wait_published(&c0).await;
    let names: Vec<&str> = listed.iter().map(|m| m.1.as_str()).collect();
    assert_eq!(names, ["m0", "m1", "m2"]);
    for (i, m) in listed.iter().enumerate() {
        assert_eq!(m.3, vec![cluster.members[i].endpoint()]);
    }

    // Enough writes on both shards that the log is compacted: the new member
    // catches up by snapshot, which must carry the member table too.
    for i in 0..400 {
        c0.put(format!("/a/k{i:04}"), format!("a{i}"), None)
            .await
            .unwrap();
        c0.put(format!("/b/k{i:04}"), format!("b{i}"), None)
            .await
            .unwrap();
    }

    // etcdctl member add --learner, as an operator would. The new member is
    // given no --shards: it takes the cluster's.
    let idx = cluster.new_joining_member("m3", &["--cores", "1", "--snapshot-count", "100"]);
    let peer_url = cluster.members[idx].peer_url();
    let (ok, out) = common::etcdctl_when_healthy(|| {
        etcdctl(
            &ep0,
            &[
                "member",
                "add",
                "m3",
                "--learner",
                &format!("--peer-urls={peer_url}"),
            ],
        )
    });
    assert!(ok, "member add failed: {out}");
    assert!(out.contains("added to cluster"), "{out}");
    assert!(
        out.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{out}"
    );
    // The new member is in the cluster it is told to join, however soon
    // after the change the answering member applies it.
    assert!(out.contains(&format!("m3={peer_url}")), "{out}");
    let list = member_names(&mut c0).await;
    let (new_id, _, learner, _) = list
        .iter()
        .find(|m| m.1.is_empty())
        .cloned()
        .unwrap_or_else(|| panic!("no unstarted member in {list:?}"));
    assert!(learner);
    // The same peer URLs twice: etcd's error.
    let again = c0
        .member_add(
            vec![peer_url.clone()],
            Some(etcd_client::MemberAddOptions::new().with_is_learner()),
        )
        .await
        .unwrap_err();
    assert!(
        again.to_string().contains("Peer URLs already exists"),
        "{again}"
    );
    // A learner that has not caught up cannot be promoted.
    let early = c0.member_promote(new_id).await.unwrap_err();
    assert!(early.to_string().contains("in sync with leader"), "{early}");

    cluster.members[idx].restart();
    let ep3 = cluster.members[idx].endpoint();
    let mut c3 = client(&ep3).await;
    // The learner catches up: every key readable locally (serializable).
    // Each shard arrives whole, by snapshot; the wait is bounded by progress
    // (one more shard caught up). Catch-up took at most 1.6 s in 71 runs on
    // a loaded machine; 30 s without progress is a stall (a snapshot transfer
    // abandoned after its 60 s idle timeout would be one), not load.
    let local_count = GetOptions::new()
        .with_prefix()
        .with_serializable()
        .with_count_only();
    let mut caught_up = 0;
    let mut deadline = Instant::now() + Duration::from_secs(30);
    while caught_up < 2 {
        let mut now_caught_up = 0;
        for prefix in ["/a/", "/b/"] {
            if let Ok(r) = c3.get(prefix, Some(local_count.clone())).await {
                now_caught_up += usize::from(r.count() == 400);
            }
        }
        if now_caught_up > caught_up {
            caught_up = now_caught_up;
            deadline = Instant::now() + Duration::from_secs(30);
        }
        assert!(
            Instant::now() < deadline,
            "the learner has {caught_up} of 2 shards after 30 s without progress:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let v = c3
        .get("/b/k0399", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(v.kvs()[0].value_str().unwrap(), "b399");
    let log = cluster.members[idx].log_text();
    assert!(
        log.contains("the cluster runs 2 shards; using that count"),
        "{log}"
    );
    // What etcd's learners refuse.
    let put = c3.put("/a/from-learner", "x", None).await.unwrap_err();
    assert!(
        put.to_string().contains("not supported for learner"),
        "{put}"
    );
    let get = c3.get("/a/k0001", None).await.unwrap_err();
    assert!(
        get.to_string().contains("not supported for learner"),
        "{get}"
    );
    // Any txn, even a read-only serializable one over both shards (a
    // compare on one key, a range over keys of each), as etcd 3.4's
    // learners refuse every txn.
    for serializable in [false, true] {
        let options = GetOptions::new().with_prefix();
        let read_only = Txn::new()
            .when([Compare::version("/a/k0001", CompareOp::Greater, 0)])
            .and_then([TxnOp::get(
                "/b/k039",
                Some(if serializable {
                    options.with_serializable()
                } else {
                    options
                }),
            )]);
        let s = common::status_of(c3.txn(read_only).await.unwrap_err());
        assert_eq!(
            (s.code(), s.message()),
            (
                tonic::Code::Unavailable,
                "etcdserver: rpc not supported for learner"
            ),
            "serializable {serializable}"
        );
    }
    let Err(watch) = c3.watch("/a/", None).await else {
        panic!("a learner accepted Watch");
    };
    assert!(
        watch.to_string().contains("not supported for learner"),
        "{watch}"
    );
    let Err(keep_alive) = c3.lease_keep_alive(1).await else {
        panic!("a learner accepted LeaseKeepAlive");
    };
    assert!(
        keep_alive.to_string().contains("not supported for learner"),
        "{keep_alive}"
    );
    // Every other call but Status, as etcd 3.4's interceptors refuse them,
    // with etcd's code.
    for refused in [
        c3.member_list().await.map(|_| ()),
        c3.lease_grant(60, None).await.map(|_| ()),
        c3.alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .map(|_| ()),
    ] {
        let s = common::status_of(refused.expect_err("a call a learner refuses"));
        assert_eq!(
            (s.code(), s.message()),
            (
                tonic::Code::Unavailable,
                "etcdserver: rpc not supported for learner"
            )
        );
    }
    c3.status().await.expect("a learner's status");
    // Through the HTTP/JSON gateway alike.
    let port = cluster.members[idx].client_port;
    let (code, body) = common::http_post(port, "/v3/cluster/member/list", "{}");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("etcdserver: rpc not supported for learner"),
        "{body}"
    );
    let (code, body) = common::http_post(port, "/v3/maintenance/status", "{}");
    assert_eq!(code, 200, "{body}");
    // It published its name.
    eventually("m3's name", Duration::from_secs(20), || {
        let mut c = c0.clone();
        async move {
            member_names(&mut c)
                .await
                .iter()
                .any(|m| m.0 == new_id && m.1 == "m3")
                .then_some(())
        }
    })
    .await;
    assert!(
        cluster.members[idx]
            .log_text()
            .contains("snapshot installed"),
        "the new member was expected to catch up by snapshot:\n{}",
        cluster.members[idx].log_text()
    );

    // Promote with etcdctl (retried while it catches up the last entries).
    let id_hex = format!("{new_id:x}");
    eventually("promotion", Duration::from_secs(30), || {
        let ep0 = ep0.clone();
        let id_hex = id_hex.clone();
        async move {
            let (ok, out) = etcdctl(&ep0, &["member", "promote", &id_hex]);
            assert!(ok || out.contains("in sync with leader"), "{out}");
            ok.then_some(())
        }
    })
    .await;
    let list = member_names(&mut c0).await;
    assert!(list.iter().all(|m| !m.2), "no learner left: {list:?}");
    // Now a voter: it takes writes and linearizable reads, once it has
    // applied its promotion too (the answer came from m0, which may apply
    // it first). Any refusal but a learner's fails at once.
    eventually(
        "m3 taking writes as a voter",
        Duration::from_secs(30),
        || {
            let mut c = c3.clone();
            async move {
                match c.put("/a/from-m3", "voter", None).await {
                    Ok(_) => Some(()),
                    Err(e) if e.to_string().contains("not supported for learner") => None,
                    Err(e) => panic!("m3 refused a write after its promotion: {e}"),
                }
            }
        },
    )
    .await;
    let r = c0.get("/a/from-m3", None).await.unwrap();
    assert_eq!(r.kvs()[0].value_str().unwrap(), "voter");

    // With four voters, two of them down is one too many: m3 is in the quorum.
    cluster.members[0].kill9();
    cluster.members[1].kill9();
    let stalled =
        tokio::time::timeout(Duration::from_secs(3), c3.put("/a/stalled", "x", None)).await;
    assert!(
        !matches!(stalled, Ok(Ok(_))),
        "a write committed without a quorum of four voters"
    );
    cluster.members[1].restart();
    let ep1 = cluster.members[1].endpoint();
    let mut c1 = client(&ep1).await;
    wait_writable(&mut c1, "/members/after-restart").await;

    // Remove m0 while it is down (through m3), and m2 while it runs.
    let ids: std::collections::HashMap<String, u64> = member_names(&mut c1)
        .await
        .into_iter()
        .map(|m| (m.1, m.0))
        .collect();
    // m1 has just restarted and may still be catching up: a removal that
    // times out is asked again (each shard's step is idempotent), as an
    // operator would.
    let m0 = ids["m0"];
    eventually("m0's removal", Duration::from_secs(60), || {
        let mut c = c3.clone();
        async move {
            match c.member_remove(m0).await {
                Ok(_) => Some(()),
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::Unavailable => {
                    None
                }
                Err(e) => panic!("remove m0: {e}"),
            }
        }
    })
    .await;
    // m1 has just restarted: refused until its links have lasted 5 s.
    let (ok, out) = common::etcdctl_when_healthy(|| {
        etcdctl(&ep1, &["member", "remove", &format!("{:x}", ids["m2"])])
    });
    assert!(ok, "member remove failed: {out}");
    assert!(out.contains("removed from cluster"), "{out}");
    stops_for_good(&mut cluster.members[2], Duration::from_secs(20));
    let not_found = c1.member_remove(ids["m2"]).await.unwrap_err();
    assert!(
        not_found.to_string().contains("member not found"),
        "{not_found}"
    );

    // m0 was down when it was removed: started again, it finds that the
    // cluster no longer counts it in, and stops for good.
    cluster.members[0].restart();
    stops_for_good(&mut cluster.members[0], Duration::from_secs(60));

    // m1 and m3 carry on: two voters, both needed.
    let names: Vec<String> = member_names(&mut c1)
        .await
        .into_iter()
        .map(|m| m.1)
        .collect();
    assert_eq!(names, ["m1", "m3"]);
    wait_writable(&mut c1, "/members/two").await;
    c3.put("/b/after-removals", "yes", None).await.unwrap();

    // A restart keeps the membership (the table and each shard's conf state).
    cluster.members[idx].kill9();
    cluster.members[idx].restart();
    let mut c3 = client(&ep3).await;
    wait_writable(&mut c3, "/members/restarted").await;
    let names: Vec<String> = member_names(&mut c3)
        .await
        .into_iter()
        .map(|m| m.1)
        .collect();
    assert_eq!(names, ["m1", "m3"]);
    let r1 = c1.get("/b/after-removals", None).await.unwrap();
    let r3 = c3.get("/b/after-removals", None).await.unwrap();
    let h1 = c1.hash_kv(0).await.unwrap();
    let h3 = c3.hash_kv(0).await.unwrap();
    assert_eq!(
        r1.header().unwrap().revision(),
        r3.header().unwrap().revision()
    );
    assert_eq!(
        h1.hash(),
        h3.hash(),
        "members diverged:\n{}",
        cluster.logs()
    );
}

#[test]
fn joining_without_being_added_is_refused_with_the_command_to_run() {
    let mut cluster = Cluster::start(1, &["--shards", "1", "--cores", "1"]);
    let idx = cluster.new_joining_member("stranger", &["--shards", "1", "--cores", "1"]);
    let (code, log) = cluster.members[idx].start_expecting_refusal();
    assert_ne!(code, 0);
    assert!(log.contains("member add"), "{log}");
    // The wrong shard count is refused naming the flag.
    let idx = cluster.new_joining_member("wrong", &["--shards", "3", "--cores", "1"]);
    let (code, log) = cluster.members[idx].start_expecting_refusal();
    assert_ne!(code, 0);
    assert!(log.contains("--shards 1"), "{log}");
    assert!(cluster.members[0].is_running());
}

/// One HTTP/1.1 request on a fresh connection; the whole answer.
fn raw_http(port: u16, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_membership_requests_on_the_peer_port_are_refused() {
    let cluster = Cluster::start(1, &["--shards", "1", "--cores", "1"]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/peer-http/ready").await;
    let list = c.member_list().await.unwrap();
    let cluster_id = list.header().unwrap().cluster_id();
    let own_id = list.members()[0].id();
    let port = cluster.members[0].peer_port;

    let r = raw_http(
        port,
        "GET /nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    let r = raw_http(
        port,
        "POST /cairn/conf-change HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 412"), "no cluster id: {r}");
    let r = raw_http(
        port,
        &format!(
            "POST /cairn/conf-change HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             x-cairn-cluster-id: {cluster_id:x}\r\ncontent-length: 3\r\n\r\n\x0f\x0f\x0f"
        ),
    );
    assert!(r.starts_with("HTTP/1.1 400"), "garbage change: {r}");
    let r = raw_http(
        port,
        &format!(
            "POST /cairn/removed HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             x-cairn-cluster-id: {cluster_id:x}\r\nx-cairn-member: {:x}\r\ncontent-length: 0\r\n\r\n",
            own_id ^ 1
        ),
    );
    assert!(r.starts_with("HTTP/1.1 400"), "someone else's removal: {r}");
    // The table is served to joiners.
    let r = raw_http(
        port,
        "GET /cairn/members HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // Membership errors as etcd gives them.
    let e = c.member_remove(12345).await.unwrap_err();
    assert!(e.to_string().contains("member not found"), "{e}");
    let e = c.member_promote(own_id).await.unwrap_err();
    assert!(
        e.to_string().contains("can only promote a learner member"),
        "{e}"
    );
    let e = c
        .member_add(vec!["not a url".to_string()], None)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("given member URLs are invalid"),
        "{e}"
    );
    // Still serving.
    c.put("/peer-http/after", "ok", None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_member_that_leads_shards_completes_from_any_member() {
    // Three shards over three members: shard 0's leader leads every shard
    // (the keyspace leader), and it is the member removed, asked of another
    // member; shard 0 is the shard a removal reaches last.
    let flags = ["--shards", "3", "--cores", "1"];
    let mut cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[1].endpoint()).await;
    wait_writable(&mut c, "/spread/ready").await;
    let list = wait_published(&c).await;
    let victim = common::shard0_leader(&cluster).await;
    let victim_name = cluster.members[victim].name.clone();
    let (victim_id, _, _, _) = list.iter().find(|m| m.1 == victim_name).cloned().unwrap();
    let asker = (victim + 1) % 3;
    let mut asker_client = client(&cluster.members[asker].endpoint()).await;
    // Right after the start: refused until the links have lasted 5 s.
    common::remove_member(&asker_client, victim_id)
        .await
        .unwrap_or_else(|e| panic!("remove: {e}\n{}", cluster.logs()));
    stops_for_good(&mut cluster.members[victim], Duration::from_secs(20));
    let names: Vec<String> = member_names(&mut asker_client)
        .await
        .into_iter()
        .map(|m| m.1)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(!names.contains(&victim_name));
    // Every shard carries on with the two left.
    if let Err(e) = common::try_wait_writable(&mut asker_client, "/spread/after").await {
        panic!("{e}\n{}", cluster.logs());
    }
}

/// Members created with different shard counts (say the default of one per
/// core on machines with different CPU counts) would place keys on different
/// shards. Their cluster ids differ, so they refuse each other's peer
/// connections and say which flags must agree; the two that agree still form
/// a quorum and serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_created_with_different_shard_counts_refuse_each_other() {
    let cluster =
        Cluster::start_each(&[&["--shards", "1"], &["--shards", "1"], &["--shards", "2"]]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/agree").await;
    let odd = &cluster.members[2];
    common::wait_until(
        "the odd member's refusal in a log",
        Duration::from_secs(60),
        || {
            let logs = cluster.logs();
            let said = logs
                .lines()
                .any(|l| l.contains("wrong cluster id") && l.contains("--shards"));
            if said {
                Ok(())
            } else {
                Err(logs.lines().rev().take(5).collect::<Vec<_>>().join("\n"))
            }
        },
    );
    // The odd member never serves a write: it has no quorum of its own.
    let mut o = client(&odd.endpoint()).await;
    let put = tokio::time::timeout(Duration::from_secs(5), o.put("/odd", "v", None)).await;
    assert!(
        !matches!(put, Ok(Ok(_))),
        "a member of another cluster id took a write"
    );
    let got = c.get("/odd", None).await.unwrap();
    assert!(
        got.kvs().is_empty(),
        "the odd member's write reached the cluster"
    );
}

/// A member killed as it is about to write `member.toml` after applying a
/// membership change comes back with the change: the file is written off
/// the core after the apply, and the store is not committed past the change
/// until the file has it, so the WAL replays it at the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_before_its_table_is_written_replays_the_change() {
    let flags = ["--shards", "2", "--cores", "1"];
    let mut cluster = Cluster::start(3, &flags);
    let ep0 = cluster.members[0].endpoint();
    let mut c0 = client(&ep0).await;
    wait_writable(&mut c0, "/table/ready").await;
    // Published attributes are changes to the table too: done before the
    // crash point is armed.
    wait_published(&c0).await;
    let m2 = &mut cluster.members[2];
    // The writer thread waits 1.5 s at the point before the kill while the
    // shards go on applying and committing: a store committed past the
    // change would keep the restart from replaying it.
    m2.restart_armed("member-file-write", 1500);
    let mut c2 = client(&m2.endpoint()).await;
    wait_writable(&mut c2, "/table/m2-back").await;
    let url = format!("http://127.0.0.1:{}", common::free_port());
    // m2 has just come back: its links count after 5 s.
    common::add_learner(&c0, &url).await.unwrap();
    // Writes meanwhile, on both shards, applied by m2 before it dies.
    for i in 0..50 {
        c0.put(format!("/a/after-add{i:02}"), "v", None)
            .await
            .unwrap();
        c0.put(format!("/b/after-add{i:02}"), "v", None)
            .await
            .unwrap();
    }
    let m2 = &mut cluster.members[2];
    let code = m2.wait_exit(Duration::from_secs(120));
    let log = m2.log_text();
    assert!(
        log.contains("crash point member-file-write reached"),
        "exit {code:?}:\n{log}"
    );
    let before = std::fs::read_to_string(m2.data_dir.join("member.toml")).unwrap();
    assert!(
        !before.contains(&url),
        "the file was written before the crash"
    );
    m2.set_env(&[]);
    m2.restart();
    let mut c2 = client(&m2.endpoint()).await;
    wait_writable(&mut c2, "/table/m2-again").await;
    let listed = eventually(
        "the added member in the restarted member's table",
        Duration::from_secs(60),
        || {
            let mut c2 = c2.clone();
            let url = url.clone();
            async move {
                let list = c2.member_list().await.ok()?;
                list.members()
                    .iter()
                    .any(|m| m.peer_urls().contains(&url))
                    .then_some(())
            }
        },
    )
    .await;
    let _: () = listed;
    let data_dir = cluster.members[2].data_dir.clone();
    eventually(
        "the added member in member.toml",
        Duration::from_secs(60),
        || {
            let path = data_dir.join("member.toml");
            let url = url.clone();
            async move {
                std::fs::read_to_string(path)
                    .ok()
                    .filter(|t| t.contains(&url))
                    .map(|_| ())
            }
        },
    )
    .await;
}

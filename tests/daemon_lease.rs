//! Leases with real processes: a 3-member cluster with two shards, driven by
//! etcd's Rust client and etcdctl. A lease lives on every shard: keys on both
//! shards attach to it, keep-alives hold them past the TTL, an expiry or a
//! revoke deletes them on every member (watchers see the deletes), errors are
//! etcd's, and a kill -9 of a shard's leader does not lose a lease. Guards
//! against leases that only work on one shard, expiries that miss keys or
//! members, and TTLs lost with a leader.

use crate::common;

use std::time::{Duration, Instant};

use cairn::routing::RoutingTable;
use cairn_proto::cairnpb::{LeaseRenewalTtls, LeaseRenewals};
use common::{client, etcdctl, shard0_leader, wait_writable, Cluster};
use etcd_client::{
    EventType, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions, WatchOptions,
};
use prost::Message as _;

/// Keys under several routing prefixes, covering both shards.
fn keys_on_both_shards(tag: &str) -> Vec<String> {
    let routing = RoutingTable::new(2, 1);
    let keys: Vec<String> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|p| format!("/{p}-{tag}/key"))
        .collect();
    let mut shards: Vec<u32> = keys
        .iter()
        .map(|k| routing.shard_for_key(k.as_bytes()))
        .collect();
    shards.sort_unstable();
    shards.dedup();
    assert_eq!(shards, vec![0, 1], "the keys must cover both shards");
    keys
}

/// The keys under `-{tag}/` a member holds (serializable: its own copy);
/// None while it does not answer (restarting).
async fn keys_on(endpoint: &str, tag: &str) -> Option<Vec<String>> {
    let mut c = client(endpoint).await;
    let r = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_serializable()),
        )
        .await
        .ok()?;
    let mut keys: Vec<String> = r
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .filter(|k| k.contains(&format!("-{tag}/")))
        .collect();
    keys.sort();
    Some(keys)
}

async fn put_with_lease(c: &mut etcd_client::Client, keys: &[String], lease: i64) {
    for k in keys {
        c.put(k.as_str(), "v", Some(PutOptions::new().with_lease(lease)))
            .await
            .unwrap_or_else(|e| panic!("put {k} with lease {lease:x}: {e}"));
    }
}

/// Waits until every running member holds exactly `want` under `tag`.
async fn wait_keys_everywhere(cluster: &Cluster, tag: &str, want: &[String], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut want = want.to_vec();
    want.sort();
    loop {
        let mut all = true;
        for m in cluster.members.iter().filter(|m| m.is_running()) {
            if keys_on(&m.endpoint(), tag).await.as_ref() != Some(&want) {
                all = false;
            }
        }
        if all {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members do not converge on {want:?} for {tag}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ids LeaseLeases lists.
async fn listed_leases(c: &mut etcd_client::Client) -> Vec<i64> {
    c.leases()
        .await
        .expect("leases")
        .leases()
        .iter()
        .map(|l| l.id())
        .collect()
}

/// Asserts that a request was refused with etcd's `code` and `message`.
fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, etcd_client::Error>,
    what: &str,
    code: tonic::Code,
    message: &str,
) {
    let s = common::status_of(result.expect_err(what));
    assert_eq!((s.code(), s.message()), (code, message), "{what}");
}

/// TimeToLive with keys, retried while the cluster recovers (a crash or a
/// restart), at most `within`.
async fn time_to_live_within(
    c: &mut etcd_client::Client,
    id: i64,
    within: Duration,
    what: &str,
) -> etcd_client::LeaseTimeToLiveResponse {
    let deadline = Instant::now() + within;
    loop {
        match c
            .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
        {
            Ok(t) => return t,
            Err(e) => {
                assert!(Instant::now() < deadline, "{what}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_span_shards_expire_and_survive_a_leader_crash() {
    let mut cluster = Cluster::start(3, &["--shards", "2", "--cores", "1"]);
    let eps = cluster.endpoints();
    let mut c0 = client(&eps[0]).await;
    wait_writable(&mut c0, "/lease/ready").await;
    let mut c1 = client(&eps[1]).await;
    let mut c2 = client(&eps[2]).await;

    // Grant: an explicit id, then a duplicate of it.
    let g = c0
        .lease_grant(5, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .expect("grant an explicit id");
    assert_eq!((g.id(), g.ttl()), (0x1234, 5));
    assert_refused(
        c1.lease_grant(5, Some(LeaseGrantOptions::new().with_id(0x1234)))
            .await,
        "a duplicate id is refused",
        tonic::Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    // Server-chosen ids; TTL limits as etcd's (minimum 1.5 election timeouts
    // of 1 s: 2 s; at most 9e9 s).
    let a = c1.lease_grant(4, None).await.expect("grant").id();
    let short = c2.lease_grant(1, None).await.expect("grant a short TTL");
    assert!(a > 0 && short.id() > 0 && a != short.id());
    assert_eq!(short.ttl(), 2, "a TTL below the minimum is raised to it");
    assert_refused(
        c0.lease_grant(9_000_000_001, None).await,
        "too large a TTL",
        tonic::Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );

    // Keys on both shards attach to one lease; an unknown lease is refused.
    let keys = keys_on_both_shards("a");
    put_with_lease(&mut c1, &keys, a).await;
    assert_refused(
        c0.put("/x-a/key", "v", Some(PutOptions::new().with_lease(0x7777)))
            .await,
        "a put with an unknown lease",
        tonic::Code::NotFound,
        "etcdserver: requested lease not found",
    );
    let ttl = c2
        .lease_time_to_live(a, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .expect("time to live");
    let mut got: Vec<String> = ttl
        .keys()
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    got.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(got, want, "TimeToLive lists the keys of every shard");
    assert_eq!(ttl.granted_ttl(), 4);
    assert!(ttl.ttl() > 0 && ttl.ttl() <= 4, "remaining {}", ttl.ttl());
    let listed = listed_leases(&mut c0).await;
    for id in [0x1234, a, short.id()] {
        assert!(listed.contains(&id), "{id:x} not in {listed:x?}");
    }

    // A watcher on another member sees the expiry's deletes.
    let mut events = c2
        .watch("/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");

    // Keep-alives through a member hold the keys past twice the TTL.
    let (mut keeper, mut answers) = c1.lease_keep_alive(a).await.expect("keep alive");
    let held_until = Instant::now() + Duration::from_secs(9);
    while Instant::now() < held_until {
        keeper.keep_alive().await.expect("send keep-alive");
        let answer = answers
            .message()
            .await
            .expect("keep-alive answer")
            .expect("stream open");
        assert_eq!((answer.id(), answer.ttl()), (a, 4));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_keys_everywhere(&cluster, "a", &keys, Duration::from_secs(5)).await;

    // Without keep-alives the lease expires: its keys vanish everywhere.
    drop(keeper);
    drop(answers);
    let stopped = Instant::now();
    wait_keys_everywhere(&cluster, "a", &[], Duration::from_secs(20)).await;
    let gone_after = stopped.elapsed();
    assert!(
        gone_after >= Duration::from_secs(2),
        "keys vanished {gone_after:?} after the last keep-alive, before the TTL"
    );
    let mut deleted = Vec::new();
    let mut expired_at = std::collections::BTreeSet::new();
    let watch_deadline = Instant::now() + Duration::from_secs(10);
    while deleted.len() < keys.len() {
        let left = watch_deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, events.message())
            .await
            .expect("the watcher sees every delete")
            .expect("watch stream")
            .expect("watch open");
        for ev in msg.events() {
            let key = String::from_utf8_lossy(ev.kv().expect("kv").key()).into_owned();
            if ev.event_type() == EventType::Delete && key.contains("-a/") {
                deleted.push(key);
                expired_at.insert(ev.kv().expect("kv").mod_revision());
            }
        }
    }
    deleted.sort();
    assert_eq!(deleted, want);
    assert_eq!(
        expired_at.len(),
        1,
        "the expiry deleted the keys of both shards at one revision: {expired_at:?}"
    );
    let ttl = c0.lease_time_to_live(a, None).await.expect("time to live");
    assert_eq!(ttl.ttl(), -1, "an expired lease reports TTL -1");
    // The client sends a first keep-alive at once and reports the TTL 0
    // answer of a lease that is gone as "lease not found".
    let refused = c0
        .lease_keep_alive(a)
        .await
        .expect_err("keep-alive of an expired lease is refused");
    assert!(refused.to_string().contains("lease not found"), "{refused}");

    // Revoke deletes at once, everywhere; a second revoke finds nothing.
    let b = c0.lease_grant(60, None).await.expect("grant").id();
    let keys_b = keys_on_both_shards("b");
    put_with_lease(&mut c0, &keys_b, b).await;
    let revoked_at = c1
        .lease_revoke(b)
        .await
        .expect("revoke")
        .header()
        .expect("header")
        .revision();
    let left = c2
        .get("/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("linearizable get");
    // Both shards' keys went at the revoke's revision, not before.
    let before = c2
        .get(
            "/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_revision(revoked_at - 1),
            ),
        )
        .await
        .expect("get before the revoke");
    let held_b = before
        .kvs()
        .iter()
        .filter(|kv| String::from_utf8_lossy(kv.key()).contains("-b/"))
        .count();
    assert_eq!(
        held_b,
        keys_b.len(),
        "every key of the lease was there just before its revoke"
    );
    assert!(
        !left
            .kvs()
            .iter()
            .any(|kv| String::from_utf8_lossy(kv.key()).contains("-b/")),
        "keys survived their lease's revoke"
    );
    wait_keys_everywhere(&cluster, "b", &[], Duration::from_secs(5)).await;
    assert_refused(
        c2.lease_revoke(b).await,
        "revoke twice",
        tonic::Code::NotFound,
        "etcdserver: requested lease not found",
    );

    // kill -9 of shard 0's leader: the lease survives, its TTL restarts on
    // the new leader, keep-alives go on through a survivor.
    let c = c0.lease_grant(6, None).await.expect("grant").id();
    let keys_c = keys_on_both_shards("c");
    put_with_lease(&mut c0, &keys_c, c).await;
    let leader = shard0_leader(&cluster).await;

    // Renewals gathered in one request and asked of a member that does not
    // lead the shard are refused together, naming the leader; the asker
    // sends them all again there.
    let status = client(&eps[leader]).await.status().await.expect("status");
    let (cluster_id, leader_id) = (
        status.header().expect("header").cluster_id(),
        status.leader(),
    );
    let asked = LeaseRenewals {
        ids: vec![c, 0x7777],
    };
    let follower = (leader + 1) % 3;
    let r = raw_http(
        cluster.members[follower].peer_port,
        &lease_post(
            "/cairn/lease-renews",
            Some(cluster_id),
            Some("0"),
            &asked.encode_to_vec(),
        ),
    );
    assert!(
        r.starts_with("HTTP/1.1 409") && r.contains(&format!("x-cairn-leader: {leader_id:x}\r\n")),
        "renewals asked of a follower: {r}"
    );

    cluster.members[leader].kill9();
    let survivor = cluster.members[(leader + 1) % 3].endpoint();
    let mut cs = client(&survivor).await;
    let ttl = time_to_live_within(
        &mut cs,
        c,
        Duration::from_secs(20),
        "no TimeToLive after the crash",
    )
    .await;
    assert!(ttl.ttl() > 0, "the lease was lost with its leader");
    assert_eq!(ttl.keys().len(), keys_c.len());
    let (mut keeper, mut answers) = cs.lease_keep_alive(c).await.expect("keep alive");
    for _ in 0..8 {
        keeper.keep_alive().await.expect("send");
        let answer = answers.message().await.expect("answer").expect("open");
        assert_eq!(answer.ttl(), 6, "keep-alive after the crash");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_keys_everywhere(&cluster, "c", &keys_c, Duration::from_secs(5)).await;
    drop(keeper);
    drop(answers);
    // The killed member comes back and applies the expiry with the others.
    cluster.members[leader].restart();
    wait_keys_everywhere(&cluster, "c", &[], Duration::from_secs(30)).await;

    // etcdctl's lease commands.
    if !common::require_tool("etcdctl") {
        return;
    }
    let ep = &eps[(leader + 1) % 3];
    let (ok, out) = etcdctl(ep, &["lease", "grant", "10"]);
    assert!(ok, "{out}");
    let id = out
        .split_whitespace()
        .nth(1)
        .expect("lease <id> granted")
        .to_string();
    assert!(out.contains("granted with TTL(10s)"), "{out}");
    for k in &keys_on_both_shards("d") {
        let (ok, out) = etcdctl(ep, &["put", "--lease", &id, k, "v"]);
        assert!(ok, "{out}");
    }
    let (ok, out) = etcdctl(ep, &["lease", "timetolive", "--keys", &id]);
    assert!(ok && out.contains("attached keys(["), "{out}");
    for k in &keys_on_both_shards("d") {
        assert!(out.contains(k.as_str()), "{k} missing: {out}");
    }
    let (ok, out) = etcdctl(ep, &["lease", "keep-alive", "--once", &id]);
    assert!(ok && out.contains("keepalived with TTL(10)"), "{out}");
    let (ok, out) = etcdctl(ep, &["lease", "list"]);
    assert!(ok && out.contains(&id), "{out}");
    let (ok, out) = etcdctl(ep, &["lease", "revoke", &id]);
    assert!(ok && out.contains("revoked"), "{out}");
    let (ok, out) = etcdctl(ep, &["get", "--prefix", "/", "--keys-only"]);
    assert!(ok && !out.contains("-d/"), "{out}");
    let (ok, out) = etcdctl(ep, &["lease", "timetolive", &id]);
    assert!(ok && out.contains("already expired"), "{out}");
}

fn raw_http(port: u16, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn lease_post(path: &str, cluster_id: Option<u64>, shard: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut head = format!("POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
    if let Some(id) = cluster_id {
        head.push_str(&format!("x-cairn-cluster-id: {id:x}\r\n"));
    }
    if let Some(s) = shard {
        head.push_str(&format!("x-cairn-shard: {s}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_expire_leases_survive_a_restart_and_bad_peer_requests_are_refused() {
    let mut cluster = Cluster::start(1, &["--shards", "2", "--cores", "1"]);
    let ep = cluster.members[0].endpoint();
    let mut c = client(&ep).await;
    wait_writable(&mut c, "/lease/ready").await;
    let cluster_id = c
        .member_list()
        .await
        .expect("member list")
        .header()
        .expect("header")
        .cluster_id();

    // The peer port's lease routes refuse what is not theirs, without harm.
    let port = cluster.members[0].peer_port;
    let renew_5 = [0x08, 0x05]; // LeaseKeepAliveRequest { ID: 5 }
    let r = raw_http(
        port,
        &lease_post("/cairn/lease-renew", None, Some("0"), &renew_5),
    );
    assert!(r.starts_with("HTTP/1.1 412"), "no cluster id: {r}");
    for shard in [None, Some("2"), Some("-1"), Some("x")] {
        let r = raw_http(
            port,
            &lease_post("/cairn/lease-renew", Some(cluster_id), shard, &renew_5),
        );
        assert!(r.starts_with("HTTP/1.1 400"), "shard {shard:?}: {r}");
    }
    let r = raw_http(
        port,
        &lease_post(
            "/cairn/lease-ttl",
            Some(cluster_id),
            Some("1"),
            b"\x0f\x0f\x0f",
        ),
    );
    assert!(r.starts_with("HTTP/1.1 400"), "garbage body: {r}");
    let r = raw_http(
        port,
        &lease_post("/cairn/lease-renew", Some(cluster_id), Some("1"), &renew_5),
    );
    assert!(
        r.starts_with("HTTP/1.1 200"),
        "renew of an unknown lease: {r}"
    );
    // Renewals gathered in one request: garbage and too many are refused.
    let renews = |body: &[u8]| {
        raw_http(
            port,
            &lease_post("/cairn/lease-renews", Some(cluster_id), Some("1"), body),
        )
    };
    let r = renews(b"\x0f\x0f");
    assert!(r.starts_with("HTTP/1.1 400"), "garbage renewals: {r}");
    let too_many = LeaseRenewals {
        ids: (1..=4097).collect(),
    };
    let r = renews(&too_many.encode_to_vec());
    assert!(r.starts_with("HTTP/1.1 400"), "4,097 renewals: {r}");

    // Renewals in one request answer each lease's TTL in order; one the
    // shard does not have, 0.
    let x = c.lease_grant(30, None).await.expect("grant").id();
    let y = c.lease_grant(40, None).await.expect("grant").id();
    let asked = LeaseRenewals {
        ids: vec![x, 0x7777, y],
    };
    let r = renews(&asked.encode_to_vec());
    assert!(r.starts_with("HTTP/1.1 200"), "renewals: {r:?}");
    // Every byte of this answer is below 0x80 (small ids of fields, lengths
    // and TTLs), so the text `raw_http` returns holds it unchanged.
    let body = &r.as_bytes()[r.find("\r\n\r\n").expect("end of head") + 4..];
    let ttls = LeaseRenewalTtls::decode(body)
        .expect("renewals answer")
        .ttls;
    assert_eq!(ttls, [30, 0, 40], "the TTLs of x, none and y");
    c.lease_revoke(x).await.expect("revoke");
    c.lease_revoke(y).await.expect("revoke");

    // Many leases with keys on both shards expire together.
    let mut ids = Vec::new();
    for i in 0..200 {
        let id = c.lease_grant(2, None).await.expect("grant").id();
        c.put(
            format!("/many{}-m/{i}", i % 8),
            "v",
            Some(PutOptions::new().with_lease(id)),
        )
        .await
        .expect("put with lease");
        ids.push(id);
    }
    wait_keys_everywhere(&cluster, "m", &[], Duration::from_secs(20)).await;
    // Each shard's leader revokes the lease at its own expiry: the last may
    // come a moment after the keys of the others are gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = listed_leases(&mut c).await;
        if !ids.iter().any(|id| listed.contains(id)) {
            break;
        }
        assert!(Instant::now() < deadline, "expired leases still listed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A lease survives a restart, with its keys; its TTL starts afresh.
    let id = c.lease_grant(30, None).await.expect("grant").id();
    let keys = keys_on_both_shards("r");
    put_with_lease(&mut c, &keys, id).await;
    assert_eq!(cluster.members[0].terminate(), Some(0));
    cluster.members[0].restart();
    let mut c = client(&ep).await;
    let ttl = time_to_live_within(
        &mut c,
        id,
        Duration::from_secs(30),
        "no TimeToLive after restart",
    )
    .await;
    assert_eq!(ttl.granted_ttl(), 30);
    assert!(ttl.ttl() >= 25, "TTL after restart: {}", ttl.ttl());
    assert_eq!(ttl.keys().len(), keys.len());
    c.lease_revoke(id).await.expect("revoke after restart");
    wait_keys_everywhere(&cluster, "r", &[], Duration::from_secs(5)).await;
}

/// Sends one keep-alive on an open stream and waits (bounded) for its answer.
async fn keep_alive_once(
    keeper: &mut etcd_client::LeaseKeeper,
    answers: &mut etcd_client::LeaseKeepAliveStream,
) -> etcd_client::LeaseKeepAliveResponse {
    keeper.keep_alive().await.expect("send keep-alive");
    tokio::time::timeout(Duration::from_secs(20), answers.message())
        .await
        .expect("a keep-alive answer in time")
        .expect("keep-alive answer")
        .expect("stream open")
}

// Keep-alives that followers forward to a shard's leader go together, as one
// request per leader and shard at a time from each core: every stream must
// still get its own lease's answer, and a lease that is gone its own refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_forwarded_together_each_get_their_own_answer() {
    let cluster = Cluster::start(3, &["--shards", "2", "--cores", "1"]);
    let eps = cluster.endpoints();
    let mut c0 = client(&eps[0]).await;
    wait_writable(&mut c0, "/lease/ready").await;
    let mut clients = Vec::new();
    for ep in &eps {
        clients.push(client(ep).await);
    }
    // Distinct TTLs, so an answer given to the wrong stream shows.
    let mut leases = Vec::new();
    for i in 0..48 {
        let ttl = 30 + i;
        let id = c0.lease_grant(ttl, None).await.expect("grant").id();
        leases.push((id, ttl));
    }
    let mut streams = Vec::new();
    for (i, &(id, ttl)) in leases.iter().enumerate() {
        let n = clients.len();
        let c = &mut clients[i % n];
        let (keeper, answers) = c.lease_keep_alive(id).await.expect("keep alive");
        streams.push((id, ttl, keeper, answers));
    }
    for round in 0..5 {
        let sends = streams
            .iter_mut()
            .map(|(id, ttl, keeper, answers)| async move {
                let answer = keep_alive_once(keeper, answers).await;
                assert_eq!(
                    (answer.id(), answer.ttl()),
                    (*id, *ttl),
                    "round {round}: the answer of another lease"
                );
            });
        futures::future::join_all(sends).await;
    }
    // A revoked lease kept alive through each member is refused as etcd
    // refuses it, while the others go on.
    let (gone, _) = leases[0];
    c0.lease_revoke(gone).await.expect("revoke");
    for c in clients.iter_mut() {
        let refused = c
            .lease_keep_alive(gone)
            .await
            .expect_err("keep-alive of a revoked lease");
        assert!(refused.to_string().contains("lease not found"), "{refused}");
    }
    for (id, ttl, keeper, answers) in streams.iter_mut().skip(1) {
        keeper.keep_alive().await.expect("send keep-alive");
        let answer = answers.message().await.expect("answer").expect("open");
        assert_eq!((answer.id(), answer.ttl()), (*id, *ttl));
    }
}

// A lease granted through a follower is answered once that follower applied
// the grant, which can be before the shard's leader has: two followers make
// an entry committed while the leader's own write is still under way, and
// the leader applies only what its log holds. A keep-alive sent at once is
// renewed by the leader all the same: it waits for the leader to apply what
// was committed when it came, as etcd's leader waits for its applied index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_right_after_a_grant_through_a_follower_finds_the_lease() {
    let cluster = Cluster::start(3, &["--shards", "1", "--test-disk-faults", "faults"]);
    let eps = cluster.endpoints();
    let mut c0 = client(&eps[0]).await;
    wait_writable(&mut c0, "/lease/ready").await;
    let leader = shard0_leader(&cluster).await;
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    let faults = cluster.members[leader].data_dir.join("faults");
    // The leader's WAL writes and syncs take 300 ms each.
    common::replace_file(&faults, "stall 300");
    let mut c = client(&eps[follower]).await;
    for round in 0..3 {
        let id = c.lease_grant(60, None).await.expect("grant").id();
        // The stream's first keep-alive goes with its opening.
        let (mut keeper, mut answers) = c
            .lease_keep_alive(id)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the lease just granted: {e}"));
        let answer = keep_alive_once(&mut keeper, &mut answers).await;
        assert_eq!(
            (answer.id(), answer.ttl()),
            (id, 60),
            "round {round}: the leader did not find the lease just granted"
        );
    }
    common::replace_file(&faults, "none");
}

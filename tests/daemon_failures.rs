//! Crash tests with real processes: kill -9 the leader while clients write, kill
//! -9 every member at once, restart, and compare what is stored with what was
//! acknowledged. Guards against lost acknowledged writes, members that diverge
//! after recovery, members that cannot catch up after being down, and leader
//! failover slower than the election timeout allows.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, shard0_leader, wait_writable, Cluster};
use etcd_client::{GetOptions, PutOptions};

/// Acknowledged writes: key -> value, and when each ack arrived.
#[derive(Default)]
struct Acks {
    values: BTreeMap<String, String>,
    times: Vec<Instant>,
}

/// Starts `writers` tasks writing unique keys through every endpoint until
/// `stop` is set. A failed write is retried (the same key and value) until it
/// succeeds or the run stops, so every ack is recorded.
fn start_writers(
    endpoints: Vec<String>,
    writers: usize,
    acks: Arc<Mutex<Acks>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let endpoints = endpoints.clone();
            let acks = acks.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                // Each writer starts on a different member, as clients spread.
                let mut eps = endpoints.clone();
                eps.rotate_left(w % endpoints.len());
                let mut c = client(&eps[0]).await;
                let mut seq = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = format!("/crash/w{w}/{seq:06}");
                    let value = format!("{w}-{seq}");
                    let r = tokio::time::timeout(
                        Duration::from_secs(2),
                        c.put(key.clone(), value.clone(), None),
                    )
                    .await;
                    match r {
                        Ok(Ok(_)) => {
                            let mut a = acks.lock().unwrap();
                            a.values.insert(key, value);
                            a.times.push(Instant::now());
                            seq += 1;
                        }
                        _ => {
                            // The member may be the one killed: move to the next.
                            eps.rotate_left(1);
                            if let Ok(Ok(nc)) = tokio::time::timeout(
                                Duration::from_secs(1),
                                etcd_client::Client::connect([eps[0].as_str()], None),
                            )
                            .await
                            {
                                c = nc;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

/// Checks every acknowledged write on member `endpoint` with linearizable reads.
async fn check_acked(endpoint: &str, acks: &Acks) {
    let mut c = client(endpoint).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        match c
            .get("/crash/", Some(GetOptions::new().with_prefix()))
            .await
        {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{endpoint}: reading back failed: {e}"),
        }
    };
    let stored: BTreeMap<String, String> = r
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut missing = 0;
    for (k, v) in &acks.values {
        match stored.get(k) {
            Some(s) if s == v => {}
            other => {
                missing += 1;
                if missing < 5 {
                    eprintln!("{endpoint}: acknowledged {k}={v}, stored {other:?}");
                }
            }
        }
    }
    assert_eq!(missing, 0, "{endpoint}: {missing} acknowledged writes lost");
}

async fn wait_same_hash(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut hashes = Vec::new();
        for ep in cluster.endpoints() {
            let mut c = client(&ep).await;
            // A linearizable read first: the member applies what is committed.
            let _ = c
                .get(
                    "/crash/",
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await;
            match c.hash_kv(0).await {
                Ok(h) => hashes.push((h.hash(), h.header().map_or(0, |h| h.revision()))),
                Err(_) => hashes.push((0, -1)),
            }
        }
        if hashes.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members never converged: {hashes:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_leader_while_writing() {
    let mut cluster = Cluster::start(3, &["--shards", "1", "--cores", "1"]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warmup").await;
    let acks = Arc::new(Mutex::new(Acks::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = start_writers(cluster.endpoints(), 8, acks.clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let leader = shard0_leader(&cluster).await;
    let acked_before = acks.lock().unwrap().values.len();
    let killed_at = Instant::now();
    cluster.members[leader].kill9();
    // Keep writing through the failover.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let first_after = acks
        .lock()
        .unwrap()
        .times
        .iter()
        .copied()
        .find(|t| *t > killed_at);
    let window = first_after.map(|t| t - killed_at);
    eprintln!(
        "unavailability window after kill -9 of the leader: {:?} ({} writes acknowledged before)",
        window, acked_before
    );
    let window = window.expect("writes resumed after the leader was killed");
    assert!(
        window < Duration::from_secs(5),
        "writes stalled {window:?} after the leader died\n{}",
        cluster.logs()
    );

    // The killed member restarts and catches up while writes go on.
    cluster.members[leader].restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    wait_same_hash(&cluster).await;
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    assert!(
        acks.values.len() > acked_before,
        "writes continued after the kill"
    );
    for ep in cluster.endpoints() {
        check_acked(&ep, &acks).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_every_member_during_writes_loses_nothing_acknowledged() {
    let mut cluster = Cluster::start(3, &["--shards", "2", "--cores", "2"]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warmup").await;
    let acks = Arc::new(Mutex::new(Acks::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers = start_writers(cluster.endpoints(), 8, acks.clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for m in cluster.members.iter_mut() {
        m.kill9();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    assert!(
        acks.values.len() > 50,
        "the test wrote too little to mean anything"
    );
    for m in cluster.members.iter_mut() {
        m.restart();
    }
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/after-restart").await;
    wait_same_hash(&cluster).await;
    for ep in cluster.endpoints() {
        check_acked(&ep, &acks).await;
    }
    eprintln!(
        "{} acknowledged writes survived kill -9 of every member",
        acks.values.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly_and_restarts_with_the_data() {
    let mut cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warmup").await;
    for i in 0..100 {
        c.put(
            format!("/term/{i:03}"),
            format!("{i}"),
            Some(PutOptions::new()),
        )
        .await
        .unwrap();
    }
    let code = cluster.members[0].terminate();
    assert_eq!(code, Some(0), "SIGTERM exits 0\n{}", cluster.logs());
    cluster.members[0].restart();
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warmup").await;
    let r = c
        .get(
            "/term/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(r.count(), 100);
}

/// Puts `n` keys under `prefix`, recording each acknowledgement.
async fn put_keys(
    c: &mut etcd_client::Client,
    prefix: &str,
    n: usize,
    acks: &mut Acks,
    cluster: &Cluster,
) {
    for i in 0..n {
        let key = format!("{prefix}/{i:05}");
        // A loaded machine may time a write out (etcd's Unavailable): the
        // same put again is harmless.
        let mut attempt = 0;
        while let Err(e) = c.put(key.clone(), format!("{i}"), None).await {
            attempt += 1;
            assert!(attempt < 5, "put {key}: {e}\n{}", cluster.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        acks.values.insert(key, format!("{i}"));
    }
}

/// Three members that compact their logs after 100 entries, writable; the
/// index of shard 0's leader and of a follower.
async fn compacting_cluster(extra: &[&str]) -> (Cluster, usize, usize) {
    let mut flags = vec!["--shards", "1", "--cores", "1", "--snapshot-count", "100"];
    flags.extend_from_slice(extra);
    let cluster = Cluster::start(3, &flags);
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warmup").await;
    let leader = shard0_leader(&cluster).await;
    (cluster, leader, (leader + 1) % 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_behind_the_compacted_log_catches_up_by_snapshot() {
    // Take down a follower (any member but the leader).
    let (mut cluster, _, down) = compacting_cluster(&[]).await;
    cluster.members[down].kill9();
    let up: Vec<String> = cluster
        .members
        .iter()
        .filter(|m| m.is_running())
        .map(|m| m.endpoint())
        .collect();
    let mut c = client(&up[0]).await;
    let mut acks = Acks::default();
    put_keys(&mut c, "/crash/snap", 1500, &mut acks, &cluster).await;
    cluster.members[down].restart();
    wait_same_hash(&cluster).await;
    check_acked(&cluster.members[down].endpoint(), &acks).await;
    let log = cluster.members[down].log_text();
    assert!(
        log.contains("snapshot installed"),
        "the member caught up without a snapshot: the log was not compacted?\n{}",
        cluster.logs()
    );
    // It keeps following the log after the snapshot.
    c.put("/crash/snap/after", "1", None).await.unwrap();
    acks.values.insert("/crash/snap/after".into(), "1".into());
    wait_same_hash(&cluster).await;
    check_acked(&cluster.members[down].endpoint(), &acks).await;
}

/// A snapshot install is one crash-atomic step: a member killed at each of
/// its steps (store built; WAL truncated past the snapshot; directories
/// swapped, member table not yet rewritten) restarts into a consistent state,
/// catches up, and ends with every acknowledged write, the same HashKV as
/// the others, and the member table the snapshot carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_during_a_snapshot_install_recovers() {
    // A member is added while another is down, which etcd's strict
    // reconfiguration check refuses: turned off, as an operator would.
    let (mut cluster, leader, down) = compacting_cluster(&["--strict-reconfig-check=false"]).await;
    let mut c = client(&cluster.members[leader].endpoint()).await;
    let mut acks = Acks::default();
    let mut learner_url = None;
    for point in ["snapshot-built", "snapshot-truncated", "snapshot-swapped"] {
        cluster.members[down].kill9();
        put_keys(&mut c, &format!("/crash/{point}"), 600, &mut acks, &cluster).await;
        if point == "snapshot-swapped" {
            // A member added while it is down reaches it only through the
            // table the snapshot carries.
            let url = format!("http://127.0.0.1:{}", common::free_port());
            c.member_add(
                vec![url.clone()],
                Some(etcd_client::MemberAddOptions::new().with_is_learner()),
            )
            .await
            .unwrap();
            put_keys(&mut c, "/crash/after-add", 300, &mut acks, &cluster).await;
            learner_url = Some(url);
        }
        let member = &mut cluster.members[down];
        restart_until_crash_point(member, point);
        member.set_env(&[]);
        member.restart();
        wait_same_hash(&cluster).await;
        check_acked(&cluster.members[down].endpoint(), &acks).await;
    }
    // The table came with the snapshot, though the member died before
    // rewriting member.toml from it.
    let mut own = client(&cluster.members[down].endpoint()).await;
    let list = own.member_list().await.unwrap();
    let url = learner_url.unwrap();
    assert!(
        list.members().iter().any(|m| m.peer_urls().contains(&url)),
        "{:?}\n{}",
        list.members(),
        cluster.logs()
    );
}

/// Restarts `member` with `CAIRN_CRASH_AT=point` and waits until it dies by
/// its own SIGKILL there; returns its log of that run. Catching up is slow on
/// a loaded machine; a member that fails a shard or takes minutes has a bug.
fn restart_until_crash_point(member: &mut common::Member, point: &str) -> String {
    member.set_env(&[("CAIRN_CRASH_AT", point)]);
    let before = member.log_text().len();
    member.restart();
    let deadline = Instant::now() + Duration::from_secs(240);
    while member.wait_exit(Duration::from_secs(5)).is_none() {
        let log = member.log_text();
        assert!(!log[before..].contains("shard failed"), "{log}");
        assert!(
            Instant::now() < deadline,
            "{} never reached {point}:\n{}",
            member.name,
            &log[before..]
        );
    }
    let log = member.log_text()[before..].to_string();
    assert!(
        log.contains(&format!("crash point {point} reached")),
        "{log}"
    );
    log
}

/// The number after `field=` on the first line of `log` that holds `message`.
fn logged_number(log: &str, message: &str, field: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(message))?;
    let at = line.find(&format!("{field}="))? + field.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// An old leader's log tail does not outlive the snapshot that replaced it.
/// Shard 0's leader, its followers killed, appends writes it can never
/// commit, far past what the others later commit once they are restarted and
/// it is killed. Restarted, it is sent their snapshot, whose index lies
/// inside that tail, and dies right after swapping in the store. Restarted
/// again, it must open with the snapshot's log alone (the tail truncated
/// before the swap), catch up, and hold every acknowledged write: a log of
/// the snapshot followed by the older tail would make it vote as if its log
/// ended there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_leaders_tail_does_not_outlive_a_snapshot_install() {
    // A long election timeout: the cut-off leader takes writes for as long
    // before check-quorum makes it step down, a loaded machine included.
    let mut cluster = Cluster::start(
        3,
        &[
            "--shards",
            "1",
            "--cores",
            "1",
            "--snapshot-count",
            "100",
            "--election-timeout",
            "5000",
        ],
    );
    let mut c = client(&cluster.members[0].endpoint()).await;
    wait_writable(&mut c, "/warmup").await;
    let old = shard0_leader(&cluster).await;
    let others: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    // Killed, not stopped: a stopped follower's socket would still take in
    // part of the tail, which it reads once continued.
    for &i in &others {
        cluster.members[i].kill9();
    }
    // Puts the old leader appends until check-quorum makes it step down;
    // every one times out.
    let endpoint = cluster.members[old].endpoint();
    let stop = Instant::now() + Duration::from_secs(6);
    let mut writers = Vec::new();
    for w in 0..4 {
        let c = client(&endpoint).await;
        for t in 0..100 {
            let mut c = c.clone();
            writers.push(tokio::spawn(async move {
                let mut seq = 0;
                while Instant::now() < stop {
                    let put = c.put(format!("/tail/{w}/{t}/{seq}"), "x", None);
                    let _ = tokio::time::timeout(Duration::from_millis(500), put).await;
                    seq += 1;
                }
            }));
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    cluster.members[old].kill9();
    for &i in &others {
        cluster.members[i].restart();
    }
    let mut c = client(&cluster.members[others[0]].endpoint()).await;
    wait_writable(&mut c, "/crash/resumed").await;
    let mut acks = Acks::default();
    put_keys(&mut c, "/crash/after", 300, &mut acks, &cluster).await;
    // Restarted once more, they forget the messages their links still hold
    // for the old leader (an append from the start of their term would match
    // its log and cut the tail), and their logs begin past the old leader's
    // last committed entry: it can only be sent a snapshot.
    for &i in &others {
        cluster.members[i].kill9();
        cluster.members[i].restart();
    }
    let mut c = client(&cluster.members[others[0]].endpoint()).await;
    wait_writable(&mut c, "/crash/restarted").await;

    let member = &mut cluster.members[old];
    let log = restart_until_crash_point(member, "snapshot-swapped");
    // The test holds only if the snapshot lands inside the old tail.
    let tail_end = logged_number(&log, "shard recovered", "last_index").expect("last index");
    let snapshot = logged_number(&log, "snapshot received", "index").expect("snapshot index");
    eprintln!("the old leader's log ends at {tail_end}; the snapshot is at {snapshot}");
    assert!(
        snapshot < tail_end,
        "the old leader's log ends at {tail_end}, before the snapshot at {snapshot}: \
         it appended too little to test a tail past the snapshot\n{log}"
    );

    member.set_env(&[]);
    let before = member.log_text().len();
    member.restart();
    wait_same_hash(&cluster).await;
    check_acked(&cluster.members[old].endpoint(), &acks).await;
    let log = cluster.members[old].log_text()[before..].to_string();
    let opened_at = logged_number(&log, "shard recovered", "last_index").expect("last index");
    assert_eq!(
        opened_at, snapshot,
        "the log was rebuilt past the snapshot from the old tail\n{log}"
    );
}

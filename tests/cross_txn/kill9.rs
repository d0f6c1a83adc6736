//! kill -9 during txns: writers issuing single-shard and cross-shard txns
//! through every member, the waits between the kills (for acknowledgements,
//! for the keyspace leader, for a restarted member to serve), the fence and
//! the whole-keyspace reads, and the scenario that kills the keyspace
//! leader, a follower and every member at once and then checks that every
//! txn is there whole or not at all.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn::routing::RoutingTable;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::ledger::{check_all_or_nothing, marker, txn_keys, Issued, Ledger, Outcome};
use super::{
    header_revision, placed, send_txn, start, text, Failure, REQUEST_TIMEOUT, STEP_DEADLINE,
};
use crate::common::keyspace;
use crate::common::{self, client, wait_writable, Cluster};

/// Clients issuing txns at once, each through a member of its own until
/// that one fails it.
pub(crate) const WRITERS: usize = 3;
/// Txns acknowledged between two steps of the crash test: enough that
/// every step falls among txns in flight.
const ACKS_PER_STEP: usize = 25;

async fn connect(endpoint: &str) -> Result<etcd_client::Client, etcd_client::Error> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(REQUEST_TIMEOUT);
    etcd_client::Client::connect([endpoint], Some(options)).await
}

/// Issues txns `w`, `w + WRITERS`, ... until `stop`: each compares every
/// one of its keys absent and puts `txn-<n>` to all of them. A txn without
/// an answer is recorded as unknown and the writer moves to the next member.
async fn writer(
    w: usize,
    endpoints: Vec<String>,
    routing: RoutingTable,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
) {
    let mut at = w;
    let mut c: Option<etcd_client::Client> = None;
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        while {
            let l = ledger.lock().unwrap();
            l.acked >= l.budget
        } {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = (w + WRITERS * i) as u64;
        let (keys, cross) = txn_keys(&routing, n);
        let value = marker(n);
        let txn = Txn::new()
            .when(
                keys.iter()
                    .map(|k| Compare::version(k.as_str(), CompareOp::Equal, 0))
                    .collect::<Vec<_>>(),
            )
            .and_then(
                keys.iter()
                    .map(|k| TxnOp::put(k.as_str(), value.as_str(), None))
                    .collect::<Vec<_>>(),
            );
        let endpoint = &endpoints[at % endpoints.len()];
        let answer = match &mut c {
            Some(c) => send_txn(c, txn).await,
            None => match connect(endpoint).await {
                Ok(mut fresh) => {
                    let answer = send_txn(&mut fresh, txn).await;
                    c = Some(fresh);
                    answer
                }
                Err(e) => Err(Failure::of(e)),
            },
        };
        let what = || {
            format!(
                "{} txn {value} over {} through {endpoint}",
                if cross { "cross-shard" } else { "single-shard" },
                placed(&routing, &keys)
            )
        };
        let outcome = match answer {
            Ok(r) if r.succeeded() => Outcome::Acked(header_revision(&r)),
            Ok(r) => {
                ledger.lock().unwrap().fatal.get_or_insert(format!(
                    "{}: its compares (every key absent) failed at revision {}, though no other txn writes its keys",
                    what(),
                    header_revision(&r)
                ));
                return;
            }
            Err(Failure::Refused(why)) => {
                ledger
                    .lock()
                    .unwrap()
                    .fatal
                    .get_or_insert(format!("{} was refused: {why}", what()));
                return;
            }
            Err(Failure::Unknown(why)) => {
                at += 1;
                c = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
                Outcome::Unknown(why)
            }
        };
        let mut l = ledger.lock().unwrap();
        l.acked += usize::from(matches!(outcome, Outcome::Acked(_)));
        l.issued.push(Issued {
            n,
            keys,
            cross,
            outcome,
        });
    }
}

/// Lets the writers go on for `more` further acknowledged txns and as many
/// again, and waits until `more` are; fails at once if a writer met a
/// refusal.
async fn wait_acks(cluster: &Cluster, ledger: &Mutex<Ledger>, more: usize, step: &str) {
    let started = Instant::now();
    let from = {
        let mut l = ledger.lock().unwrap();
        l.budget = l.budget.max(l.acked + 2 * more);
        l.acked
    };
    loop {
        // The guard is gone before any panic, so the writers go on to stop.
        let (fatal, acked, unanswered, last_unanswered) = {
            let l = ledger.lock().unwrap();
            let last_unanswered = l.issued.iter().rev().find_map(|t| match &t.outcome {
                Outcome::Unknown(why) => Some(why.clone()),
                Outcome::Acked(_) => None,
            });
            let acked = l.acked;
            (
                l.fatal.clone(),
                acked,
                l.issued.len() - acked,
                last_unanswered,
            )
        };
        if let Some(fatal) = fatal {
            panic!("{step}: {fatal}");
        }
        if acked >= from + more {
            eprintln!(
                "{step}: {acked} txns acknowledged, {unanswered} unanswered, after {:?}",
                started.elapsed()
            );
            return;
        }
        assert!(
            started.elapsed() < STEP_DEADLINE,
            "{step}: {more} more txns not acknowledged within {STEP_DEADLINE:?}: {acked} acknowledged, {unanswered} unanswered (last: {last_unanswered:?})\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_keyspace_leader(cluster: &Cluster, shards: usize) -> usize {
    common::eventually("one member leads every shard", STEP_DEADLINE, || async {
        keyspace::keyspace_leader(cluster, shards)
            .ok_or_else(|| "no member leads every shard".to_string())
    })
    .await
}

/// Waits until member `i` answers a linearizable read of the whole
/// keyspace: it is back in the cluster and has applied what was committed.
async fn wait_serving(cluster: &Cluster, i: usize, step: &str) {
    let endpoint = cluster.members[i].endpoint();
    common::eventually(
        &format!("{step}: m{i} serving linearizable reads"),
        STEP_DEADLINE,
        || async {
            let mut c = connect(&endpoint).await.map_err(|e| e.to_string())?;
            let options = GetOptions::new().with_range("\0").with_count_only();
            tokio::time::timeout(REQUEST_TIMEOUT, c.get("\0", Some(options)))
                .await
                .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

/// A key of each shard, written one after another; the least revision
/// among them, which every shard of every member that applied them has
/// reached.
async fn fence(c: &mut etcd_client::Client, routing: &RoutingTable, what: &str) -> i64 {
    let mut least = i64::MAX;
    for shard in routing.shard_ids() {
        let key = (0..)
            .map(|i| format!("fence-{i}"))
            .find(|k| routing.shard_for_key(k.as_bytes()) == shard)
            .expect("some key routes to every shard");
        let r = c
            .put(key.as_str(), "fence", None)
            .await
            .unwrap_or_else(|e| panic!("{what}: put {key} (shard {shard}): {e}"));
        least = least.min(r.header().expect("a header").revision());
    }
    least
}

/// Every key, value and revision of the whole keyspace at `revision`, read
/// through `endpoint` (serializably: from that member's own stores).
async fn whole_keyspace(
    endpoint: &str,
    revision: i64,
    serializable: bool,
) -> Result<Vec<(String, String, i64, i64, i64)>, String> {
    let mut c = connect(endpoint).await.map_err(|e| e.to_string())?;
    let mut options = GetOptions::new().with_range("\0").with_revision(revision);
    if serializable {
        options = options.with_serializable();
    }
    let r = tokio::time::timeout(REQUEST_TIMEOUT, c.get("\0", Some(options)))
        .await
        .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(r.kvs()
        .iter()
        .map(|kv| {
            (
                text(kv.key()),
                text(kv.value()),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect())
}

/// Clients keep issuing single-shard and cross-shard txns through every
/// member while the keyspace leader is killed (kill -9) and restarted, then
/// a follower, then all three members at once. Afterwards, at one revision
/// every shard of every member has reached: every acknowledged txn is there
/// whole at its revision, none is there in part, every member returns the
/// same whole keyspace, and HashKV agrees.
pub(crate) async fn txns_stay_whole_across_kill9(shards: usize) {
    let what = format!("--shards {shards}");
    let routing = RoutingTable::new(shards, 1);
    let mut cluster = start(3, shards);
    let endpoints = cluster.endpoints();
    let mut c = client(&endpoints[0]).await;
    wait_writable(&mut c, "/xtxn/ready").await;
    wait_keyspace_leader(&cluster, shards).await;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                w,
                endpoints.clone(),
                routing.clone(),
                Arc::clone(&ledger),
                Arc::clone(&stop),
            ))
        })
        .collect();
    wait_acks(
        &cluster,
        &ledger,
        ACKS_PER_STEP,
        &format!("{what}: before any kill"),
    )
    .await;

    let leader = wait_keyspace_leader(&cluster, shards).await;
    cluster.members[leader].kill9();
    let step = format!("{what}: keyspace leader m{leader} killed");
    wait_acks(&cluster, &ledger, ACKS_PER_STEP, &step).await;
    cluster.members[leader].restart();
    let step = format!("{what}: m{leader} restarted");
    wait_serving(&cluster, leader, &step).await;
    wait_acks(&cluster, &ledger, ACKS_PER_STEP, &step).await;

    let leader = wait_keyspace_leader(&cluster, shards).await;
    let follower = (leader + 1) % cluster.members.len();
    cluster.members[follower].kill9();
    let step = format!("{what}: follower m{follower} killed");
    wait_acks(&cluster, &ledger, ACKS_PER_STEP, &step).await;
    cluster.members[follower].restart();
    let step = format!("{what}: m{follower} restarted");
    wait_serving(&cluster, follower, &step).await;
    wait_acks(&cluster, &ledger, ACKS_PER_STEP, &step).await;

    // Every member at once: SIGKILL to all, then reap them.
    for m in &cluster.members {
        m.signal(libc::SIGKILL);
    }
    for m in &mut cluster.members {
        m.kill9();
    }
    for m in &mut cluster.members {
        m.restart();
    }
    let step = format!("{what}: every member killed at once and restarted");
    wait_acks(&cluster, &ledger, ACKS_PER_STEP, &step).await;

    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("a writer panicked");
    }
    let ledger = Arc::try_unwrap(ledger)
        .ok()
        .expect("the writers are done")
        .into_inner()
        .unwrap();
    if let Some(fatal) = &ledger.fatal {
        panic!("{what}: {fatal}");
    }
    let acked = ledger.acked;
    let cross = ledger
        .issued
        .iter()
        .filter(|t| t.cross && matches!(t.outcome, Outcome::Acked(_)))
        .count();
    eprintln!(
        "{what}: {acked} txns acknowledged ({cross} of them cross-shard), {} unanswered",
        ledger.issued.len() - acked
    );

    // One revision every shard of every member reaches once it has applied
    // the fence.
    let mut c = client(&endpoints[0]).await;
    let at = fence(&mut c, &routing, &what).await;
    let state = common::eventually(
        &format!("{what}: a linearizable read of the whole keyspace at revision {at}"),
        STEP_DEADLINE,
        || whole_keyspace(&endpoints[0], at, false),
    )
    .await;
    check_all_or_nothing(
        &routing,
        &ledger.issued,
        &state,
        &format!("{what}: the whole keyspace at revision {at}"),
    );

    // Every member returns that same keyspace from its own stores, and the
    // same hash of it.
    for (i, endpoint) in endpoints.iter().enumerate() {
        let mine = common::eventually(
            &format!("{what}: m{i} serving revision {at} from its own stores"),
            STEP_DEADLINE,
            || async { whole_keyspace(endpoint, at, true).await },
        )
        .await;
        if mine != state {
            let differ: Vec<_> = mine
                .iter()
                .filter(|kv| !state.contains(kv))
                .chain(state.iter().filter(|kv| !mine.contains(kv)))
                .take(10)
                .collect();
            panic!(
                "{what}: m{i}'s keyspace at revision {at} differs from the linearizable read (key, value, create, mod, version): {differ:?}"
            );
        }
    }
    let hashes = common::eventually(
        &format!("{what}: HashKV at revision {at} from every member"),
        STEP_DEADLINE,
        || async {
            let mut hashes = Vec::new();
            for endpoint in &endpoints {
                let mut c = connect(endpoint).await.map_err(|e| e.to_string())?;
                let h = c
                    .hash_kv(at)
                    .await
                    .map_err(|e| format!("{endpoint}: {e}"))?;
                hashes.push((h.hash(), h.compact_version()));
            }
            Ok(hashes)
        },
    )
    .await;
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "{what}: HashKV at revision {at} (hash, compact revision) differs among the members: {hashes:?}\n{}",
        cluster.logs()
    );
}

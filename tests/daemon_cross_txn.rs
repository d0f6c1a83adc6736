//! Transactions over several shards (docs/KEYSPACE.md, "Transactions over
//! several shards"): a txn whose compares and operations name keys of any
//! routing prefixes is atomic and isolated exactly as in etcd, whatever
//! `--shards` is. Guards against a txn whose compares see more than one
//! revision or whose writes land at more than one, a read (a txn of range
//! ops, or gets at one revision) or a watch that sees part of a txn, a
//! compacted history whose past revisions are not cuts, and a kill -9 (of
//! the keyspace leader, of a follower, of every member at once) that leaves
//! a txn applied on some shards or members and not on others.
//!
//! The shard count comes from `CAIRN_XTXN_SHARDS` (comma-separated: each
//! test runs once per count; default 1). Until transactions over several
//! shards land, a run with more than one shard fails at the first txn whose
//! keys span shards, naming its keys, their shards and the
//! FAILED_PRECONDITION the member answered.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn::routing::RoutingTable;
use common::{client, wait_writable, Cluster};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse,
    WatchOptions,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[path = "common/keyspace.rs"]
mod keyspace;
#[path = "ops_promtext.rs"]
mod promtext;

/// The shard counts when `CAIRN_XTXN_SHARDS` is not set: the one every
/// build passes today. Once transactions over several shards land, make it
/// `&[1, 4]`.
const DEFAULT_SHARD_COUNTS: &[usize] = &[1, 4];

/// How long one step (a request, a member catching up, the cluster taking
/// writes again) may take on a busy 2-core machine before the test gives
/// up; steps normally take well under a second.
const STEP_DEADLINE: Duration = Duration::from_secs(60);
/// How long one request may go unanswered before its outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn flags(shards: usize) -> Vec<String> {
    ["--shards", &shards.to_string(), "--cores", "1"]
        .map(String::from)
        .to_vec()
}

fn start(members: usize, shards: usize) -> Cluster {
    let flags = flags(shards);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Cluster::start(members, &flags)
}

/// The keys with the shard each routes to, for a failure's message.
fn placed<K: AsRef<str>>(routing: &RoutingTable, keys: &[K]) -> String {
    keys.iter()
        .map(|k| {
            let k = k.as_ref();
            format!("{k} (shard {})", routing.shard_for_key(k.as_bytes()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn shards_of<K: AsRef<str>>(routing: &RoutingTable, keys: &[K]) -> BTreeSet<u32> {
    keys.iter()
        .map(|k| routing.shard_for_key(k.as_ref().as_bytes()))
        .collect()
}

/// Why a request failed.
#[derive(Debug)]
enum Failure {
    /// The member answered with a definite refusal (FAILED_PRECONDITION for
    /// keys spanning shards, INVALID_ARGUMENT, ...): nothing was applied,
    /// and a valid request must never get one.
    Refused(String),
    /// No answer, or one that leaves the outcome unknown (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, a broken connection): it may have been applied.
    Unknown(String),
}

impl Failure {
    fn of(e: etcd_client::Error) -> Failure {
        use tonic::Code;
        match e {
            etcd_client::Error::GRpcStatus(s) => {
                let text = format!("{:?}: {}", s.code(), s.message());
                match s.code() {
                    Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Unknown
                    | Code::Cancelled
                    | Code::Aborted
                    | Code::Internal
                    | Code::ResourceExhausted => Failure::Unknown(text),
                    _ => Failure::Refused(text),
                }
            }
            other => Failure::Unknown(other.to_string()),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(why) => write!(f, "refused: {why}"),
            Failure::Unknown(why) => write!(f, "outcome unknown: {why}"),
        }
    }
}

/// Sends `txn` and waits at most [`REQUEST_TIMEOUT`] for its answer.
async fn send_txn(c: &mut etcd_client::Client, txn: Txn) -> Result<TxnResponse, Failure> {
    match tokio::time::timeout(REQUEST_TIMEOUT, c.txn(txn)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(Failure::of(e)),
        Err(_) => Err(Failure::Unknown(format!(
            "no answer within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

fn header_revision(r: &TxnResponse) -> i64 {
    r.header().expect("a txn response has a header").revision()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------
// Bank transfers over accounts on every shard.

/// The accounts: routing prefixes of every shape (a plain name up to its
/// '/', two `/registry/<type>/` prefixes, a key without '/'), which reach
/// both shards of 2, every shard of 4, and five of 8.
const ACCOUNTS: [&str; 7] = [
    "acct-a/x",
    "acct-b/x",
    "acct-c/x",
    "acct-d/x",
    "/registry/pods/p",
    "/registry/nodes/n",
    "plainkey",
];
const OPENING_BALANCE: i64 = 100;
const TOTAL: i64 = OPENING_BALANCE * ACCOUNTS.len() as i64;
/// Clients moving money at once, each through the next member.
const TRANSFER_CLIENTS: usize = 4;
/// Transfers each client makes; a compare that fails (another client moved
/// one of its accounts after it read it) is retried with fresh reads.
const TRANSFERS_PER_CLIENT: usize = 40;
/// Attempts one client may make for its transfers before the test calls it
/// a livelock (every attempt losing its compare).
const MAX_ATTEMPTS_PER_CLIENT: usize = 2_000;
/// Most past revisions read back after the compaction.
const MAX_PAST_REVISIONS_READ: usize = 60;

/// One acknowledged transfer: the revision of its response header and the
/// balances it put (account index, new balance).
#[derive(Debug, Clone)]
struct Transfer {
    client: usize,
    revision: i64,
    puts: [(usize, i64); 2],
}

/// The balances every acknowledged txn leaves, revision by revision.
struct History {
    /// (revision, balances after the txn at it), in revision order.
    states: Vec<(i64, Vec<i64>)>,
}

impl History {
    fn new(opened_at: i64, transfers: &[Transfer]) -> History {
        let mut sorted: Vec<&Transfer> = transfers.iter().collect();
        sorted.sort_by_key(|t| t.revision);
        let mut balances = vec![OPENING_BALANCE; ACCOUNTS.len()];
        let mut states = vec![(opened_at, balances.clone())];
        for t in sorted {
            assert!(
                t.revision > states.last().unwrap().0,
                "two txns acknowledged at revision {}: {t:?} and the one before",
                t.revision
            );
            for &(account, balance) in &t.puts {
                balances[account] = balance;
            }
            states.push((t.revision, balances.clone()));
        }
        History { states }
    }

    /// The balances at `revision` (at or after the opening).
    fn at(&self, revision: i64) -> &[i64] {
        let i = self.states.partition_point(|(r, _)| *r <= revision);
        assert!(i > 0, "revision {revision} is before the accounts opened");
        &self.states[i - 1].1
    }
}

/// Balance and mod revision of an account in a range response.
fn account_of(kvs: &[KeyValue], key: &str) -> Result<(i64, i64), String> {
    let kv = kvs
        .iter()
        .find(|kv| kv.key() == key.as_bytes())
        .ok_or_else(|| format!("account {key} is missing"))?;
    let balance = text(kv.value())
        .parse()
        .map_err(|_| format!("account {key} holds {:?}", text(kv.value())))?;
    Ok((balance, kv.mod_revision()))
}

/// Every account read by one txn of range ops (one per account, read at
/// `revision` if given): the txn's header revision and the balances.
async fn read_by_txn(
    c: &mut etcd_client::Client,
    routing: &RoutingTable,
    revision: Option<i64>,
) -> Result<(i64, Vec<i64>), String> {
    let ops: Vec<TxnOp> = ACCOUNTS
        .iter()
        .map(|k| TxnOp::get(*k, revision.map(|r| GetOptions::new().with_revision(r))))
        .collect();
    let r = send_txn(c, Txn::new().and_then(ops)).await.map_err(|f| {
        format!(
            "a txn of range ops over {}{}: {f}",
            placed(routing, &ACCOUNTS),
            revision.map_or(String::new(), |r| format!(" at revision {r}"))
        )
    })?;
    let mut balances = Vec::with_capacity(ACCOUNTS.len());
    for (key, op) in ACCOUNTS.iter().zip(r.op_responses()) {
        let TxnOpResponse::Get(g) = op else {
            return Err(format!("the range op on {key} answered {op:?}"));
        };
        balances.push(account_of(g.kvs(), key)?.0);
    }
    Ok((header_revision(&r), balances))
}

/// Every account read by its own get at `revision`.
async fn read_by_gets(
    c: &mut etcd_client::Client,
    revision: i64,
) -> Result<Vec<i64>, etcd_client::Error> {
    let mut balances = Vec::with_capacity(ACCOUNTS.len());
    for key in ACCOUNTS {
        let r = c
            .get(key, Some(GetOptions::new().with_revision(revision)))
            .await?;
        let (balance, _) =
            account_of(r.kvs(), key).unwrap_or_else(|e| panic!("at {revision}: {e}"));
        balances.push(balance);
    }
    Ok(balances)
}

/// One client's transfers: read two accounts, then a txn that puts both
/// moved balances if neither account's mod revision changed since, and does
/// nothing otherwise (then it reads again and retries).
async fn transfer_client(
    endpoint: String,
    id: usize,
    routing: RoutingTable,
) -> Result<(Vec<Transfer>, usize), Failure> {
    let mut c = client(&endpoint).await;
    let mut rng = SmallRng::seed_from_u64(0x7478_6e00 + id as u64);
    let mut done = Vec::with_capacity(TRANSFERS_PER_CLIENT);
    let mut conflicts = 0;
    for attempt in 0.. {
        if done.len() == TRANSFERS_PER_CLIENT {
            break;
        }
        if attempt == MAX_ATTEMPTS_PER_CLIENT {
            return Err(Failure::Refused(format!(
                "client {id}: {} transfers after {attempt} attempts, {conflicts} of them conflicts",
                done.len()
            )));
        }
        let from = rng.gen_range(0..ACCOUNTS.len());
        let to = (from + rng.gen_range(1..ACCOUNTS.len())) % ACCOUNTS.len();
        let (from_key, to_key) = (ACCOUNTS[from], ACCOUNTS[to]);
        let mut read = Vec::new();
        for key in [from_key, to_key] {
            let r = c.get(key, None).await.map_err(Failure::of)?;
            read.push(account_of(r.kvs(), key).map_err(Failure::Refused)?);
        }
        let [(from_balance, from_mod), (to_balance, to_mod)] = read[..] else {
            unreachable!("two accounts read");
        };
        let amount = rng.gen_range(1..=20).min(from_balance);
        if amount == 0 {
            continue;
        }
        let puts = [(from, from_balance - amount), (to, to_balance + amount)];
        let txn = Txn::new()
            .when([
                Compare::mod_revision(from_key, CompareOp::Equal, from_mod),
                Compare::mod_revision(to_key, CompareOp::Equal, to_mod),
            ])
            .and_then(
                puts.map(|(a, b)| TxnOp::put(ACCOUNTS[a], b.to_string(), None))
                    .to_vec(),
            );
        let r = send_txn(&mut c, txn).await.map_err(|f| {
            let why = format!(
                "client {id}: transfer of {amount} over {}: {f}",
                placed(&routing, &[from_key, to_key])
            );
            match f {
                Failure::Refused(_) => Failure::Refused(why),
                Failure::Unknown(_) => Failure::Unknown(why),
            }
        })?;
        if r.succeeded() {
            done.push(Transfer {
                client: id,
                revision: header_revision(&r),
                puts,
            });
        } else {
            conflicts += 1;
        }
    }
    Ok((done, conflicts))
}

/// One read of every account while the transfers run.
#[derive(Debug)]
struct Sample {
    member: usize,
    how: &'static str,
    revision: i64,
    balances: Vec<i64>,
}

/// Reads every account through member `member` until `stop`, alternately
/// with one txn of range ops and with a get for a revision followed by a
/// get of each account at that revision.
async fn reader(
    endpoint: String,
    member: usize,
    routing: RoutingTable,
    stop: Arc<AtomicBool>,
) -> Result<Vec<Sample>, String> {
    let mut c = client(&endpoint).await;
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let (revision, balances) = read_by_txn(&mut c, &routing, None).await?;
        samples.push(Sample {
            member,
            how: "a txn of range ops",
            revision,
            balances,
        });
        let revision = c
            .get(ACCOUNTS[0], None)
            .await
            .map_err(|e| format!("get {}: {e}", ACCOUNTS[0]))?
            .header()
            .expect("a range response has a header")
            .revision();
        let balances = read_by_gets(&mut c, revision)
            .await
            .map_err(|e| format!("get --rev {revision}: {e}"))?;
        samples.push(Sample {
            member,
            how: "gets at one revision",
            revision,
            balances,
        });
    }
    Ok(samples)
}

/// One event a watch delivered.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    revision: i64,
    kind: EventType,
    key: String,
    value: String,
}

/// Checks what the whole-keyspace watch delivered from the opening on:
/// each txn's puts as events of its revision, adjacent (no event of another
/// revision between them) and in the order of its operations (as etcd
/// numbers them), revisions increasing, none missing, nothing that no
/// acknowledged txn wrote; and the balances the events replay to sum to the
/// total after every revision.
fn check_watched(seen: &[Seen], opened_at: i64, transfers: &[Transfer]) {
    let mut expected: BTreeMap<i64, Vec<(String, String)>> = BTreeMap::new();
    expected.insert(
        opened_at,
        ACCOUNTS
            .iter()
            .map(|k| (k.to_string(), OPENING_BALANCE.to_string()))
            .collect(),
    );
    for t in transfers {
        expected.insert(
            t.revision,
            t.puts
                .iter()
                .map(|&(a, b)| (ACCOUNTS[a].to_string(), b.to_string()))
                .collect(),
        );
    }
    // Runs of events of one revision, in arrival order.
    let mut runs: Vec<(i64, Vec<&Seen>)> = Vec::new();
    for e in seen {
        match runs.last_mut() {
            Some((r, events)) if *r == e.revision => events.push(e),
            Some((r, _)) if *r > e.revision => panic!(
                "the watch delivered an event of revision {} after one of revision {r} (a txn's events must be adjacent, in revision order): {e:?}",
                e.revision
            ),
            _ => runs.push((e.revision, vec![e])),
        }
    }
    let mut balances: BTreeMap<String, i64> = BTreeMap::new();
    for (revision, events) in &runs {
        let Some(want) = expected.get(revision) else {
            panic!("the watch delivered events at revision {revision}, where no acknowledged txn wrote: {events:?}");
        };
        let got: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                assert_eq!(e.kind, EventType::Put, "at revision {revision}: {e:?}");
                (e.key.clone(), e.value.clone())
            })
            .collect();
        let as_set = |v: &[(String, String)]| v.iter().cloned().collect::<BTreeSet<_>>();
        assert!(
            got.len() == want.len() && as_set(&got) == as_set(want),
            "the txn acknowledged at revision {revision} put {want:?}; the watch delivered, adjacent at that revision: {got:?}"
        );
        assert_eq!(
            &got, want,
            "the events of the txn at revision {revision} are not in the order of its puts (etcd numbers a txn's changes in operation order)"
        );
        for (k, v) in &got {
            balances.insert(k.clone(), v.parse().unwrap());
        }
        let sum: i64 = balances.values().sum();
        assert_eq!(
            sum, TOTAL,
            "the events up to revision {revision} replay to {balances:?}"
        );
    }
    let delivered: BTreeSet<i64> = runs.iter().map(|(r, _)| *r).collect();
    let missing: Vec<&i64> = expected.keys().filter(|r| !delivered.contains(r)).collect();
    assert!(
        missing.is_empty(),
        "the watch delivered no event for the txns acknowledged at revisions {missing:?}"
    );
}

/// Bank transfers between accounts on different shards, several clients at
/// once through every member: every read (a txn of range ops, or gets at
/// one revision) sees the total, and exactly the balances the acknowledged
/// txns up to its revision leave; each txn's puts carry its response's
/// revision; a watch over the whole keyspace delivers each txn's puts
/// together at its revision; after a compaction every kept past revision
/// is still such a cut, and the ones before it are gone.
async fn bank_transfers_keep_the_total_at_every_revision(shards: usize) {
    let what = format!("--shards {shards}");
    let routing = RoutingTable::new(shards, 1);
    let reached = shards_of(&routing, &ACCOUNTS);
    assert!(
        shards == 1 || reached.len() >= 2,
        "{what}: the accounts must span shards: {}",
        placed(&routing, &ACCOUNTS)
    );
    let cluster = start(3, shards);
    let endpoints = cluster.endpoints();
    let mut c = client(&endpoints[0]).await;
    wait_writable(&mut c, "/xtxn/ready").await;

    // Open every account in one txn: its revision is the first cut.
    let open = Txn::new().and_then(
        ACCOUNTS
            .iter()
            .map(|k| TxnOp::put(*k, OPENING_BALANCE.to_string(), None))
            .collect::<Vec<_>>(),
    );
    let opened = send_txn(&mut c, open).await.unwrap_or_else(|f| {
        panic!(
            "{what}: opening the accounts, one txn of puts over {}: {f}",
            placed(&routing, &ACCOUNTS)
        )
    });
    let opened_at = header_revision(&opened);

    // Watch everything ("\0" to "\0") from the opening on; a task drains the
    // stream as it comes so the member never holds events back for us.
    let mut w = client(&endpoints[2]).await;
    let mut stream = w
        .watch(
            "\0",
            Some(
                WatchOptions::new()
                    .with_range("\0")
                    .with_start_revision(opened_at),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: watching the whole keyspace: {e}"));
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let drain = tokio::spawn(async move {
        loop {
            let message = match stream.message().await {
                Ok(Some(resp)) if resp.canceled() => {
                    Err(format!("cancelled: {}", resp.cancel_reason()))
                }
                Ok(Some(resp)) => Ok(resp
                    .events()
                    .iter()
                    .map(|e| {
                        let kv = e.kv().expect("an event has a kv");
                        Seen {
                            revision: kv.mod_revision(),
                            kind: e.event_type(),
                            key: text(kv.key()),
                            value: text(kv.value()),
                        }
                    })
                    .collect::<Vec<_>>()),
                Ok(None) => Err("the stream ended".to_string()),
                Err(e) => Err(e.to_string()),
            };
            let end = message.is_err();
            if events_tx.send(message).is_err() || end {
                return;
            }
        }
    });

    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = [1, 2]
        .into_iter()
        .map(|m| {
            tokio::spawn(reader(
                endpoints[m].clone(),
                m,
                routing.clone(),
                Arc::clone(&stop),
            ))
        })
        .collect();
    let clients: Vec<_> = (0..TRANSFER_CLIENTS)
        .map(|i| {
            tokio::spawn(transfer_client(
                endpoints[i % endpoints.len()].clone(),
                i,
                routing.clone(),
            ))
        })
        .collect();
    let mut transfers = Vec::new();
    let mut conflicts = 0;
    for t in clients {
        match t.await.expect("a transfer client panicked") {
            Ok((done, lost)) => {
                transfers.extend(done);
                conflicts += lost;
            }
            Err(Failure::Refused(why)) => panic!("{what}: {why}"),
            Err(Failure::Unknown(why)) => panic!("{what}: {why}\n{}", cluster.logs()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for r in readers {
        samples.extend(
            r.await
                .expect("a reader panicked")
                .unwrap_or_else(|e| panic!("{what}: reading every account: {e}")),
        );
    }
    eprintln!(
        "{what}: {} transfers ({conflicts} compares lost and retried), {} reads",
        transfers.len(),
        samples.len()
    );
    let history = History::new(opened_at, &transfers);

    // Every read saw one cut: the total, and the balances of exactly the
    // txns acknowledged up to its revision.
    for s in &samples {
        let sum: i64 = s.balances.iter().sum();
        let want = history.at(s.revision);
        assert!(
            sum == TOTAL && s.balances == want,
            "{what}: {} through m{} at revision {} read {:?} (sum {sum}); the txns acknowledged up to it leave {want:?} (sum {TOTAL})",
            s.how,
            s.member,
            s.revision,
            s.balances
        );
    }

    // The watch delivered every txn together at its revision.
    let last = history.states.last().unwrap().0;
    let mut seen: Vec<Seen> = Vec::new();
    while seen.last().is_none_or(|e| e.revision < last) {
        let message = tokio::time::timeout(STEP_DEADLINE, events_rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{what}: the whole-keyspace watch delivered nothing for {STEP_DEADLINE:?} after {:?}, waiting for revision {last}",
                    seen.last()
                )
            })
            .expect("the watch task ended without saying why");
        seen.extend(message.unwrap_or_else(|e| panic!("{what}: the whole-keyspace watch: {e}")));
    }
    drain.abort();
    check_watched(&seen, opened_at, &transfers);

    // Each txn's puts were stored at its response's revision.
    for t in &transfers {
        for &(account, balance) in &t.puts {
            let key = ACCOUNTS[account];
            let r = c
                .get(key, Some(GetOptions::new().with_revision(t.revision)))
                .await
                .unwrap_or_else(|e| panic!("{what}: get {key} --rev {}: {e}", t.revision));
            let got = r
                .kvs()
                .first()
                .map(|kv| (kv.mod_revision(), text(kv.value())));
            assert_eq!(
                got,
                Some((t.revision, balance.to_string())),
                "{what}: client {}'s txn, answered with header revision {}, put {key}={balance}; get --rev {} shows (mod_revision, value)",
                t.client,
                t.revision,
                t.revision
            );
        }
    }

    // Compact at the middle transfer: every revision from it on still reads
    // as the cut the history says, by gets and by a txn of range ops at it;
    // the revisions before it are gone on every shard.
    let mut revisions: Vec<i64> = history.states.iter().map(|(r, _)| *r).collect();
    let compacted_at = revisions[revisions.len() / 2];
    c.compact(compacted_at, None)
        .await
        .unwrap_or_else(|e| panic!("{what}: compact at {compacted_at}: {e}"));
    // Between txns too: the revision just before each one.
    revisions.extend(history.states.iter().map(|(r, _)| r - 1));
    revisions.extend(samples.iter().map(|s| s.revision));
    revisions.retain(|&r| r >= compacted_at);
    revisions.sort_unstable();
    revisions.dedup();
    let step = revisions.len().div_ceil(MAX_PAST_REVISIONS_READ).max(1);
    for (i, &revision) in revisions.iter().enumerate().filter(|(i, _)| i % step == 0) {
        let want = history.at(revision);
        let by_gets = read_by_gets(&mut c, revision).await.unwrap_or_else(|e| {
            panic!("{what}: get --rev {revision} after compacting at {compacted_at}: {e}")
        });
        assert_eq!(
            by_gets, want,
            "{what}: gets at past revision {revision} (compacted at {compacted_at}) against the acknowledged txns' balances"
        );
        if i % (3 * step) == 0 {
            let (_, by_txn) = read_by_txn(&mut c, &routing, Some(revision))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                by_txn, want,
                "{what}: a txn of range ops at past revision {revision} (compacted at {compacted_at}) against the acknowledged txns' balances"
            );
        }
    }
    for key in ACCOUNTS {
        let e = c
            .get(key, Some(GetOptions::new().with_revision(compacted_at - 1)))
            .await
            .expect_err("a read below the compaction");
        assert!(
            e.to_string()
                .contains("required revision has been compacted"),
            "{what}: get {key} --rev {} after compacting at {compacted_at}: {e}",
            compacted_at - 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_transfers_across_shards_keep_the_total_in_every_read_watch_and_past_revision() {
    for shards in common::xtxn_shard_counts(DEFAULT_SHARD_COUNTS) {
        bank_transfers_keep_the_total_at_every_revision(shards).await;
    }
}

// ---------------------------------------------------------------------------
// kill -9 during txns.

/// Routing prefixes the crash test's txns write under (with keys of no
/// '/', which route by the whole key).
const PREFIXES: [&str; 8] = [
    "acct-a/",
    "acct-b/",
    "acct-c/",
    "acct-d/",
    "/registry/pods/",
    "/registry/nodes/",
    "/registry/secrets/",
    "/registry/leases/",
];
/// Every key the crash test writes has this in it, and no other key does.
const MARK: &str = "xk-";
/// Clients issuing txns at once, each through a member of its own until
/// that one fails it.
const WRITERS: usize = 3;
/// Txns acknowledged between two steps of the crash test: enough that
/// every step falls among txns in flight.
const ACKS_PER_STEP: usize = 25;

/// The keys of txn `n`: one in four writes two keys of one routing prefix
/// (one shard); the others write 2, 3 or 4 keys on as many shards as there
/// are, with a key of no '/' among the candidates. Every writer issues both
/// kinds.
fn txn_keys(routing: &RoutingTable, n: u64) -> (Vec<String>, bool) {
    let i = n as usize;
    if n.is_multiple_of(4) {
        let p = PREFIXES[i / 4 % PREFIXES.len()];
        return (
            vec![format!("{p}{MARK}{n}-a"), format!("{p}{MARK}{n}-b")],
            false,
        );
    }
    let want = 2 + i / 4 % 3;
    let mut candidates: Vec<String> = (0..PREFIXES.len())
        .map(|j| format!("{}{MARK}{n}", PREFIXES[(i + j) % PREFIXES.len()]))
        .collect();
    candidates.insert(i % 4, format!("{MARK}{n}"));
    let mut keys: Vec<String> = Vec::new();
    let mut taken = BTreeSet::new();
    for k in &candidates {
        if keys.len() < want && taken.insert(routing.shard_for_key(k.as_bytes())) {
            keys.push(k.clone());
        }
    }
    for k in &candidates {
        if keys.len() < want && !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    (keys, true)
}

fn marker(n: u64) -> String {
    format!("txn-{n}")
}

#[derive(Debug)]
enum Outcome {
    /// Answered: applied at this revision.
    Acked(i64),
    /// Not answered; it may have been applied, but wholly or not at all.
    Unknown(String),
}

#[derive(Debug)]
struct Issued {
    n: u64,
    keys: Vec<String>,
    cross: bool,
    outcome: Outcome,
}

#[derive(Default)]
struct Ledger {
    issued: Vec<Issued>,
    /// Acknowledged txns among `issued`.
    acked: usize,
    /// The writers pause once this many txns are acknowledged, until a step
    /// of the test raises it: they are busy at every kill, but do not fill
    /// the store while the test waits for a member to come back.
    budget: usize,
    /// Why the test must stop: a valid txn refused or its compares failing.
    fatal: Option<String>,
}

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

/// Checks the crash test's keys in `state` (the whole keyspace at one
/// revision): an acknowledged txn is there whole, at its revision; one
/// without an answer is there whole at one revision or not at all; no
/// other key carries the mark.
fn check_all_or_nothing(
    routing: &RoutingTable,
    issued: &[Issued],
    state: &[(String, String, i64, i64, i64)],
    what: &str,
) {
    let stored: BTreeMap<&str, (&str, i64)> = state
        .iter()
        .filter(|(k, ..)| k.contains(MARK))
        .map(|(k, v, _, m, _)| (k.as_str(), (v.as_str(), *m)))
        .collect();
    let mut expected_keys = BTreeSet::new();
    let mut revisions = BTreeMap::new();
    for t in issued {
        let value = marker(t.n);
        let kind = if t.cross {
            "cross-shard"
        } else {
            "single-shard"
        };
        let got: Vec<Option<(&str, i64)>> = t
            .keys
            .iter()
            .map(|k| stored.get(k.as_str()).copied())
            .collect();
        let shown = || {
            t.keys
                .iter()
                .zip(&got)
                .map(|(k, g)| {
                    let shard = routing.shard_for_key(k.as_bytes());
                    match g {
                        Some((v, m)) => format!("{k} (shard {shard}) = {v} at {m}"),
                        None => format!("{k} (shard {shard}) absent"),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &t.outcome {
            Outcome::Acked(revision) => {
                assert!(
                    got.iter().all(|g| *g == Some((value.as_str(), *revision))),
                    "{what}: {kind} txn {value}, acknowledged at revision {revision}, is not wholly there at it: {}",
                    shown()
                );
            }
            Outcome::Unknown(why) => {
                let revision = got.first().copied().flatten().map(|(_, m)| m);
                let whole = got
                    .iter()
                    .all(|g| *g == revision.map(|m| (value.as_str(), m)));
                assert!(
                    whole,
                    "{what}: {kind} txn {value} (unanswered: {why}) is partly there: {}",
                    shown()
                );
            }
        }
        if let Some(Some((_, m))) = got.first() {
            if let Some(other) = revisions.insert(*m, t.n) {
                panic!(
                    "{what}: txns {} and {value} both stored at revision {m}",
                    marker(other)
                );
            }
        }
        expected_keys.extend(t.keys.iter().map(String::as_str));
    }
    let strays: Vec<&&str> = stored
        .keys()
        .filter(|k| !expected_keys.contains(**k))
        .collect();
    assert!(strays.is_empty(), "{what}: keys no txn wrote: {strays:?}");
}

/// Clients keep issuing single-shard and cross-shard txns through every
/// member while the keyspace leader is killed (kill -9) and restarted, then
/// a follower, then all three members at once. Afterwards, at one revision
/// every shard of every member has reached: every acknowledged txn is there
/// whole at its revision, none is there in part, every member returns the
/// same whole keyspace, and HashKV agrees.
async fn txns_stay_whole_across_kill9(shards: usize) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txns_over_shards_stay_whole_when_members_are_killed() {
    for shards in common::xtxn_shard_counts(DEFAULT_SHARD_COUNTS) {
        txns_stay_whole_across_kill9(shards).await;
    }
}

// ---------------------------------------------------------------------------
// The checkers catch what they are for.

#[test]
fn txn_keys_spread_over_the_shards_and_mix_both_kinds() {
    let routing = RoutingTable::new(4, 1);
    for w in 0..WRITERS as u64 {
        let kinds: BTreeSet<bool> = (0..8).map(|i| txn_keys(&routing, w + 3 * i).1).collect();
        assert_eq!(kinds.len(), 2, "writer {w} issues both kinds");
    }
    for n in 0..200 {
        let (keys, cross) = txn_keys(&routing, n);
        let shards = shards_of(&routing, &keys);
        assert_eq!(
            shards.len() > 1,
            cross,
            "txn {n}: {}",
            placed(&routing, &keys)
        );
        assert!(cross || keys.len() == 2);
        assert!(
            !cross || shards.len() == keys.len(),
            "txn {n}: {}",
            placed(&routing, &keys)
        );
        assert!(keys.iter().all(|k| k.contains(MARK)));
    }
}

fn stored(kvs: &[(&str, &str, i64)]) -> Vec<(String, String, i64, i64, i64)> {
    kvs.iter()
        .map(|&(k, v, m)| (k.to_string(), v.to_string(), m, m, 1))
        .collect()
}

fn issued(n: u64, keys: &[&str], outcome: Outcome) -> Issued {
    Issued {
        n,
        keys: keys.iter().map(|k| k.to_string()).collect(),
        cross: true,
        outcome,
    }
}

#[test]
#[should_panic(expected = "is partly there")]
fn an_unanswered_txn_found_in_part_fails_the_check() {
    let routing = RoutingTable::new(4, 1);
    let txns = [issued(
        1,
        &["a/xk-1", "b/xk-1"],
        Outcome::Unknown("cut".into()),
    )];
    check_all_or_nothing(&routing, &txns, &stored(&[("a/xk-1", "txn-1", 7)]), "test");
}

#[test]
#[should_panic(expected = "is not wholly there")]
fn an_acknowledged_txn_at_two_revisions_fails_the_check() {
    let routing = RoutingTable::new(4, 1);
    let txns = [issued(1, &["a/xk-1", "b/xk-1"], Outcome::Acked(7))];
    let state = stored(&[("a/xk-1", "txn-1", 7), ("b/xk-1", "txn-1", 8)]);
    check_all_or_nothing(&routing, &txns, &state, "test");
}

#[test]
fn whole_txns_pass_the_check() {
    let routing = RoutingTable::new(4, 1);
    let txns = [
        issued(1, &["a/xk-1", "b/xk-1"], Outcome::Acked(7)),
        issued(2, &["a/xk-2", "b/xk-2"], Outcome::Unknown("cut".into())),
        issued(3, &["a/xk-3", "b/xk-3"], Outcome::Unknown("cut".into())),
    ];
    let state = stored(&[
        ("a/xk-1", "txn-1", 7),
        ("a/xk-3", "txn-3", 9),
        ("b/xk-1", "txn-1", 7),
        ("b/xk-3", "txn-3", 9),
    ]);
    check_all_or_nothing(&routing, &txns, &state, "test");
}

fn put(revision: i64, account: usize, balance: i64) -> Seen {
    Seen {
        revision,
        kind: EventType::Put,
        key: ACCOUNTS[account].to_string(),
        value: balance.to_string(),
    }
}

fn opening(revision: i64) -> Vec<Seen> {
    (0..ACCOUNTS.len())
        .map(|a| put(revision, a, OPENING_BALANCE))
        .collect()
}

fn transfer(revision: i64, from: usize, to: usize, amount: i64) -> Transfer {
    Transfer {
        client: 0,
        revision,
        puts: [
            (from, OPENING_BALANCE - amount),
            (to, OPENING_BALANCE + amount),
        ],
    }
}

#[test]
#[should_panic(expected = "must be adjacent")]
fn a_txn_whose_events_another_revision_splits_fails_the_watch_check() {
    let mut seen = opening(10);
    seen.extend([
        put(11, 0, 95),
        put(12, 2, 90),
        put(11, 1, 105),
        put(12, 3, 110),
    ]);
    check_watched(&seen, 10, &[transfer(11, 0, 1, 5), transfer(12, 2, 3, 10)]);
}

#[test]
#[should_panic(expected = "delivered no event")]
fn a_txn_missing_from_the_watch_fails_the_watch_check() {
    let mut seen = opening(10);
    seen.extend([put(12, 2, 90), put(12, 3, 110)]);
    check_watched(&seen, 10, &[transfer(11, 0, 1, 5), transfer(12, 2, 3, 10)]);
}

#[test]
#[should_panic(expected = "the watch delivered, adjacent at that revision")]
fn half_a_txn_in_the_watch_fails_the_watch_check() {
    let mut seen = opening(10);
    seen.push(put(11, 0, 95));
    check_watched(&seen, 10, &[transfer(11, 0, 1, 5)]);
}

#[test]
fn whole_txns_pass_the_watch_check() {
    let mut seen = opening(10);
    seen.extend([
        put(11, 0, 95),
        put(11, 1, 105),
        put(12, 2, 90),
        put(12, 3, 110),
    ]);
    check_watched(&seen, 10, &[transfer(11, 0, 1, 5), transfer(12, 2, 3, 10)]);
}

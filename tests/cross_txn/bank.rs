//! Bank transfers over accounts on every shard: clients moving money by
//! txns whose compares guard what they read, readers reading every account
//! while they run, a watch over the whole keyspace, and the scenario that
//! checks every read, the watch and the past revisions against the
//! transfers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn::routing::RoutingTable;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::accounts::{
    account_of, check_watched, read_by_gets, read_by_txn, read_serializable_range, History,
    Transfer, ACCOUNTS, OPENING_BALANCE, TOTAL,
};
use super::whole_watch::WholeWatch;
use super::{header_revision, placed, send_txn, shards_of, start, text, Failure};
use crate::common::{client, wait_writable};

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
        let balances = read_by_gets(&mut c, revision, false)
            .await
            .map_err(|e| format!("get --rev {revision}: {e}"))?;
        samples.push(Sample {
            member,
            how: "gets at one revision",
            revision,
            balances,
        });
        let (revision, balances) = read_serializable_range(&mut c).await?;
        samples.push(Sample {
            member,
            how: "a serializable range over every shard",
            revision,
            balances,
        });
        // A revision one shard of this member gave, read on every shard
        // (some may still be behind it here).
        let revision = c
            .get(ACCOUNTS[0], Some(GetOptions::new().with_serializable()))
            .await
            .map_err(|e| format!("get --consistency=s {}: {e}", ACCOUNTS[0]))?
            .header()
            .expect("a range response has a header")
            .revision();
        let balances = read_by_gets(&mut c, revision, true)
            .await
            .map_err(|e| format!("get --consistency=s --rev {revision}: {e}"))?;
        samples.push(Sample {
            member,
            how: "serializable gets at one revision",
            revision,
            balances,
        });
    }
    Ok(samples)
}

/// Bank transfers between accounts on different shards, several clients at
/// once through every member: every read (a txn of range ops, or gets at
/// one revision) sees the total, and exactly the balances the acknowledged
/// txns up to its revision leave; each txn's puts carry its response's
/// revision; a watch over the whole keyspace delivers each txn's puts
/// together at its revision; after a compaction every kept past revision
/// is still such a cut, and the ones before it are gone.
pub(crate) async fn bank_transfers_keep_the_total_at_every_revision(shards: usize) {
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

    // Watch everything from the opening on.
    let watch = WholeWatch::start(&endpoints[2], opened_at, &what).await;

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
    let seen = watch.through(&mut c, last, &what).await;
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
        let by_gets = read_by_gets(&mut c, revision, false)
            .await
            .unwrap_or_else(|e| {
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

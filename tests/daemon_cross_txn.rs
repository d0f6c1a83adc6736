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
//!
//! The scenarios, by concern: `cross_txn/bank.rs` (bank transfers, with
//! the accounts, their history and the watch check in
//! `cross_txn/accounts.rs`), `cross_txn/batch.rs` (many clients' txns over
//! the same shards, run in batches) and `cross_txn/kill9.rs` (kill -9
//! during txns, with the txns' keys, their ledger and the all-or-nothing
//! check in `cross_txn/ledger.rs`); `cross_txn/mod.rs` starts the clusters and
//! sends the txns. The tests are all here.

#[path = "cross_txn/mod.rs"]
mod cross_txn;

use crate::common;

use std::collections::BTreeSet;

use cairn::routing::RoutingTable;
use cross_txn::accounts::{check_watched, Seen, Transfer, ACCOUNTS, OPENING_BALANCE};
use cross_txn::bank::bank_transfers_keep_the_total_at_every_revision;
use cross_txn::batch::batched_txns_keep_their_compares_and_revisions;
use cross_txn::kill9::{txns_stay_whole_across_kill9, WRITERS};
use cross_txn::ledger::{check_all_or_nothing, txn_keys, Issued, Outcome, MARK};
use cross_txn::{placed, shards_of};
use etcd_client::EventType;

/// The shard counts when `CAIRN_XTXN_SHARDS` is not set: one shard, where
/// a txn stays on its shard, and four, where txns span shards.
const DEFAULT_SHARD_COUNTS: &[usize] = &[1, 4];

// ---------------------------------------------------------------------------
// Bank transfers over accounts on every shard (`cross_txn/bank.rs`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_transfers_across_shards_keep_the_total_in_every_read_watch_and_past_revision() {
    for shards in common::xtxn_shard_counts(DEFAULT_SHARD_COUNTS) {
        bank_transfers_keep_the_total_at_every_revision(shards).await;
    }
}

// ---------------------------------------------------------------------------
// Many txns over the same shards at once, run in batches (`cross_txn/batch.rs`).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txns_over_the_same_shards_run_in_batches_each_at_its_own_revision() {
    // One shard has no txn over several shards to batch.
    for shards in common::xtxn_shard_counts(DEFAULT_SHARD_COUNTS)
        .into_iter()
        .filter(|&s| s > 1)
    {
        batched_txns_keep_their_compares_and_revisions(shards).await;
    }
}

// ---------------------------------------------------------------------------
// kill -9 during txns (`cross_txn/kill9.rs`).

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

//! The daemon's shard driver under simulation (`cairn::sim::driver`): seeded
//! runs of 3 and 5 members, each running the production driver with the real
//! WAL on its power-cut disk and the real store, under crashes, partitions,
//! loss, slow syncs, leader transfers, membership changes and log
//! compactions (members catch up by snapshot), must lose no acknowledged
//! write, serve no stale or phantom read, send every watch each revision
//! once and in order as it moves between members, end no lease before its
//! TTL, keep every store the same, show one leader per term and no
//! committed entry replaced on the wire, and recover once the faults stop;
//! and each Raft safety rule switched off must be caught, with 3 members
//! and with 5. With several shards per member over one revision counter, the
//! same checks hold across the shards (one revision order for every key,
//! watches over every shard merged into it by the Watch service's own
//! code, no shard sending a watch an event past its window, and watches
//! from now sent all that follows their created revision and nothing
//! before), also through stale-view episodes in which two members each
//! believe they lead every shard; and a keyspace leader that
//! opens its counter too early, one that does not finish earlier txns, a
//! counter without its leases, a restarted member that votes at once, a
//! txn batch that takes in a txn naming its keys, a watch that does not
//! merge its shards, and a watch from now sent what its shards had at or
//! below its created revision must be caught. A task of the simulation
//! that panics (a client's call) fails its seed.
//!
//! The full runs are `cargo run --release --example driver-sim -- --seeds 2000
//! --members 3` (and `--members 5`, and `--shards 3`).

use cairn::raft::SafetyMutation;
use cairn::server::revisions::KeyspaceMutation;
use cairn::sim::driver::{self, DriverSimStats};
use cairn::sim::{self};

/// Seeds per member count in the normal suite.
const SUITE_SEEDS_3: u64 = 300;
const SUITE_SEEDS_5: u64 = 150;
/// Seeds of three members with three shards each.
const SUITE_SEEDS_SHARDS: u64 = 100;
/// The seeds the keyspace mutation checks scan, with three shards (with
/// the watch sessions from now, whose draws moved every seed's course):
/// with five members 11 of seeds 0-99 catch a counter opened too early
/// (the first seed 0; 14 before those sessions; with three members only 2
/// of 100 in an earlier form of the clients); with three members 46 of
/// them catch a leader that does not finish earlier txns (the first seed
/// 0), 5 a counter without its leases (the first seed 1, through the
/// stale-view episodes: a miss of all 100 has odds near 0.95^100, 6 in
/// 1,000), and 91 a batch that takes in a txn naming its keys (the first
/// seed 0).
const KEYSPACE_MUTATION_SEEDS: std::ops::Range<u64> = 0..100;
/// The seeds that scan for a restarted member voting at once, which only
/// the episodes whose other members restart at the swap reach: 9 of seeds
/// 0-599 with 3 members and 3 shards (the first seed 31, then 51, 139 and
/// 189; 7 before the watch sessions from now), so a miss of all 200 has
/// odds near 0.985^200, 5 in 100.
const NO_VOTE_HOLD_SEEDS: std::ops::Range<u64> = 0..200;
/// A watch over several shards that sends each shard's events as they
/// arrive is caught by every one of seeds 0-99 with three members (a
/// revision that goes back, as soon as two shards' events cross): a few
/// seeds are plenty.
const WATCH_MUTATION_SEEDS: std::ops::Range<u64> = 0..5;
/// A watch from now over several shards whose shards start past their own
/// revisions, not past its created header's, is caught by 84 of seeds 0-99
/// with three members (every one of seeds 0-9, the first seed 0; a watch
/// is sent an event at or below its header as soon as one begins while a
/// shard of its member is behind another): a miss of all five has odds
/// near 0.16^5, 1 in 10,000.
const WATCH_FROM_NOW_SEEDS: std::ops::Range<u64> = 0..5;
/// The seeds the mutation check scans, stopping at the first caught: a broken
/// core breaks safety only on some seeds (15 of seeds 0-199 in one run with 3
/// members before the checks on the wire, the first at seed 3, in a build
/// whose replays were not exact), so 100 seeds miss it with odds near
/// 0.925^100, 4 in 10,000. With the checks on the wire and exact replays the
/// first seed caught is seed 0 with 3 members and seed 3 with 5. A full search
/// is `cargo run --release --example driver-sim -- --seeds 2000 --mutation
/// vote-without-log-check`; each seed under it may spend up to 3 s.
const MUTATION_SEEDS: std::ops::Range<u64> = 0..100;
/// The same for committing an entry of an earlier term by counting (Raft
/// paper 5.4.2, figure 8): only the scripted adversary of the figure-8 seeds
/// (one seed in eight) provokes it, and then on nearly every such seed (the
/// first caught was the first scripted seed, seed 9, in every run so far,
/// and the first at or after seeds 100, 400, 900 and 1500 too). 60 seeds
/// hold some 7 scripted ones: a miss needs all of them to fail.
const FIGURE8_MUTATION_SEEDS: std::ops::Range<u64> = 0..60;

/// Runs `seeds` seeds from 0 of `base`; fails at the first violation.
fn no_violation(base: driver::DriverSimConfig, seeds: u64) -> DriverSimStats {
    let (run, stats, found) = driver::run_seeds(&base, seeds).expect("the driver simulation runs");
    if let Some(out) = found {
        panic!(
            "{out}\nreplay: cargo run --release --example driver-sim -- --seed {} --members {} \
             --shards {}",
            out.seed, out.members, out.shards
        );
    }
    assert_eq!(run, seeds);
    stats
}

fn suite(members: usize, seeds: u64) {
    let stats = no_violation(driver::DriverSimConfig::new(members, 0), seeds);
    // The faults and the work happened, many times over.
    assert!(stats.crashes > seeds, "{stats:#?}");
    assert!(stats.partitions > seeds, "{stats:#?}");
    // Lagging members caught up by snapshot, and leaders handed over.
    assert!(stats.snapshots_delivered > seeds / 10, "{stats:#?}");
    assert!(stats.transfers > seeds / 10, "{stats:#?}");
    assert!(stats.membership_changes > seeds / 10, "{stats:#?}");
    assert!(stats.puts_acknowledged > 100 * seeds, "{stats:#?}");
    assert!(stats.reads_served > 100 * seeds, "{stats:#?}");
    assert!(stats.messages_dropped > 100 * seeds, "{stats:#?}");
    // Watch sessions moved between members and were sent the log.
    assert!(stats.watches > 5 * seeds, "{stats:#?}");
    assert!(stats.watch_events > 300 * seeds, "{stats:#?}");
    // Leases were kept alive, and some ran out under the faults.
    assert!(stats.lease_renewals > seeds, "{stats:#?}");
    assert!(stats.lease_renewals_together > seeds, "{stats:#?}");
    assert!(stats.leases_seen_gone > 0, "{stats:#?}");
}

#[test]
fn three_member_seeds_keep_every_acknowledged_write() {
    suite(3, SUITE_SEEDS_3);
}

#[test]
fn five_member_seeds_keep_every_acknowledged_write() {
    suite(5, SUITE_SEEDS_5);
}

/// Three members, each running three shards over one revision counter:
/// every put and read goes to its key's shard, a linearizable read at a
/// read point the keyspace leader gives, and the history's checks (one
/// revision per put, real-time order, no stale read) hold across the
/// shards, as do the stores' and the wire's on every shard; watches of
/// every key, each registered on every shard and merged, are sent the log
/// in that one order.
#[test]
fn three_members_over_three_shards_keep_one_revision_order() {
    let mut base = driver::DriverSimConfig::new(3, 0);
    base.shards = 3;
    let seeds = SUITE_SEEDS_SHARDS;
    let stats = no_violation(base, seeds);
    assert!(stats.crashes > seeds, "{stats:#?}");
    assert!(stats.partitions > seeds, "{stats:#?}");
    assert!(stats.transfers > seeds / 10, "{stats:#?}");
    assert!(stats.snapshots_delivered > seeds / 10, "{stats:#?}");
    assert!(stats.puts_acknowledged > 100 * seeds, "{stats:#?}");
    assert!(stats.reads_served > 100 * seeds, "{stats:#?}");
    assert!(stats.txns_acknowledged > 20 * seeds, "{stats:#?}");
    assert!(stats.txns_compare_failed > seeds, "{stats:#?}");
    assert!(stats.reads_over_shards > 10 * seeds, "{stats:#?}");
    // Keyspace leadership moved: counters opened again and again.
    assert!(stats.keyspace_openings > 3 * seeds, "{stats:#?}");
    // Watch sessions moved between members and were sent the log.
    assert!(stats.watches > 5 * seeds, "{stats:#?}");
    assert!(stats.watch_events > 300 * seeds, "{stats:#?}");
    // Shards stopped short of their revision (nothing compacts here, so at
    // their watch's window or at the end of a catch-up pass) and read on
    // from the store: the window's path ran.
    assert!(stats.watch_window_stops > seeds, "{stats:#?}");
    // Txns over the same shards ran in batches of several.
    assert!(stats.txns_batched > seeds, "{stats:#?}");
    // Two members each believed they led every shard, now and then.
    assert!(stats.stale_views > seeds / 20, "{stats:#?}");
}

/// Scans `seeds` of `base` (a config with a mutation) until a
/// consensus-safety violation, and answers it.
fn caught(base: driver::DriverSimConfig, seeds: std::ops::Range<u64>) -> driver::DriverViolation {
    sim::install_quiet_panic_hook();
    let base = driver::DriverSimConfig {
        seed: seeds.start,
        ..base
    };
    let (run, _, found) =
        driver::run_seeds(&base, seeds.end - seeds.start).expect("the driver simulation runs");
    let out = found.unwrap_or_else(|| {
        panic!(
            "{:?} {:?} with {} members and {} shards not caught in {run} seeds",
            base.mutation, base.keyspace_mutation, base.members, base.shards
        )
    });
    let v = out.violation.expect("a violation");
    assert!(v.kind.is_consensus_safety(), "{v}");
    v
}

/// [`caught`] for `mutation` of the revision order, with three shards,
/// over `seeds`.
fn keyspace_mutation_is_caught(
    members: usize,
    mutation: KeyspaceMutation,
    seeds: std::ops::Range<u64>,
) -> driver::DriverViolation {
    let base = driver::DriverSimConfig {
        shards: 3,
        keyspace_mutation: Some(mutation),
        ..driver::DriverSimConfig::new(members, 0)
    };
    caught(base, seeds)
}

// docs/KEYSPACE.md, "Why revisions increase in real time", point 3: a
// keyspace leader that opens its counter before its shards applied what
// earlier leaders committed, and without its epoch, hands out revisions
// that committed writes already have.
#[test]
fn a_keyspace_leader_opening_before_its_shards_applied_is_caught() {
    keyspace_mutation_is_caught(
        5,
        KeyspaceMutation::OpenBeforeApplied,
        KEYSPACE_MUTATION_SEEDS,
    );
}

// docs/KEYSPACE.md, "Transactions over several shards": a txn whose
// keyspace leader failed between its parts is finished by the next one; a
// leader that does not leaves it torn.
#[test]
fn a_keyspace_leader_not_finishing_earlier_txns_is_caught() {
    let v = keyspace_mutation_is_caught(3, KeyspaceMutation::NoFinishing, KEYSPACE_MUTATION_SEEDS);
    assert_eq!(v.kind, driver::DriverViolationKind::TxnTorn, "{v}");
}

// docs/KEYSPACE.md, "Leader leases: closing the stale view": with a
// counter that hands out revisions without every shard's lease, the
// stale-view episodes' two members both hand them out, and writes (or a
// txn's parts) acknowledged by one are ordered before writes acknowledged
// earlier by the other.
#[test]
fn a_keyspace_counter_without_leases_is_caught() {
    keyspace_mutation_is_caught(3, KeyspaceMutation::NoLeases, KEYSPACE_MUTATION_SEEDS);
}

// The same section's restart rule: a member that restarts and votes at
// once helps elect a leader while a lease it backed still runs. Only the
// episodes whose pivots restart at the swap reach it, and then only when
// the new leader opens its counter inside the old lease's last tick or so.
#[test]
fn a_restarted_member_voting_at_once_is_caught() {
    keyspace_mutation_is_caught(3, KeyspaceMutation::NoRestartVoteHold, NO_VOTE_HOLD_SEEDS);
}

// txn_batch's rule: a txn joins a batch only when no txn of it names one
// of its keys, since a batch's compares are read together.
#[test]
fn a_txn_joining_a_batch_that_names_its_keys_is_caught() {
    let v = keyspace_mutation_is_caught(
        3,
        KeyspaceMutation::JoinIgnoresOverlap,
        KEYSPACE_MUTATION_SEEDS,
    );
    assert_eq!(v.kind, driver::DriverViolationKind::TxnTorn, "{v}");
}

// docs/KEYSPACE.md, "Watches": a watch over several shards releases an
// event only once every shard has sent through its revision; one that sends
// each shard's events as they arrive sends revisions out of order.
#[test]
fn a_watch_over_several_shards_not_merged_is_caught() {
    let v = keyspace_mutation_is_caught(3, KeyspaceMutation::WatchNoMerge, WATCH_MUTATION_SEEDS);
    assert_eq!(v.kind, driver::DriverViolationKind::WatchOrder, "{v}");
}

// docs/KEYSPACE.md, "Watches": a watch from now over several shards starts
// every shard's part of its merge at the created response's header
// revision; one that starts each shard past the revision that shard
// answered sends a shard's events at or below the header when that shard
// was behind the others.
#[test]
fn a_watch_from_now_sent_what_precedes_its_header_is_caught() {
    let v =
        keyspace_mutation_is_caught(3, KeyspaceMutation::WatchFromNowEarly, WATCH_FROM_NOW_SEEDS);
    assert_eq!(v.kind, driver::DriverViolationKind::WatchBeforeStart, "{v}");
}

// A task of the simulation itself that panics (here a client's call, once
// answered) fails its seed, rather than leaving the call out of the history
// and the seed passing.
#[test]
fn a_simulated_client_that_panics_fails_the_seed() {
    sim::install_quiet_panic_hook();
    let cfg = driver::DriverSimConfig {
        planted_panic: Some(driver::PlantedPanic::ClientCall(40)),
        ..driver::DriverSimConfig::new(3, 0)
    };
    let out = driver::run_seed_alone(&cfg).expect("the driver simulation runs");
    let v = out.violation.expect("the panic fails the seed");
    assert_eq!(v.kind, driver::DriverViolationKind::TaskPanic, "{v}");
    assert!(v.detail.contains("seed 0 (3 members, 1 shards)"), "{v}");
    assert!(v.detail.contains("the clients' call 40"), "{v}");
    assert!(v.detail.contains("planted"), "{v}");
}

#[test]
fn a_raft_core_voting_without_the_log_check_is_caught() {
    mutation_is_caught(3, MUTATION_SEEDS, SafetyMutation::VoteWithoutLogCheck);
}

/// [`caught`] for `mutation` of the Raft core.
fn mutation_is_caught(members: usize, seeds: std::ops::Range<u64>, mutation: SafetyMutation) {
    let base = driver::DriverSimConfig {
        mutation: Some(mutation),
        ..driver::DriverSimConfig::new(members, 0)
    };
    caught(base, seeds);
}

// Raft paper 5.4.2 and figure 8: a leader that commits an entry of an
// earlier term by counting replicas lets a later leader replace it.
#[test]
fn a_raft_core_committing_an_earlier_term_by_count_is_caught() {
    mutation_is_caught(
        3,
        FIGURE8_MUTATION_SEEDS,
        SafetyMutation::CommitPreviousTermByCount,
    );
    mutation_is_caught(
        5,
        FIGURE8_MUTATION_SEEDS,
        SafetyMutation::CommitPreviousTermByCount,
    );
}

// Raft paper 5.4.1: voting without the up-to-date check elects a leader
// that lacks committed entries; with five members too.
#[test]
fn a_raft_core_voting_without_the_log_check_is_caught_with_five() {
    mutation_is_caught(5, MUTATION_SEEDS, SafetyMutation::VoteWithoutLogCheck);
}

/// A seed replays exactly: run twice, each time on a runtime of its own, its
/// members send the same messages at the same simulated instants and its
/// counters agree. So a violating seed found once is there to study, and
/// `--seed N` shows what the many-seed run saw. Seeds 0-9 between them crash
/// members, change the membership and install snapshots (the driver's jobs
/// off its core), so those paths are among what must repeat; seeds 0-4 with
/// three shards per member too (a member's shards are woken in one order).
#[test]
fn a_seed_replays_exactly() {
    let mut seen = DriverSimStats::default();
    let one_shard = (0..10).map(|seed| driver::DriverSimConfig::new(3, seed));
    let three_shards = (0..5).map(|seed| driver::DriverSimConfig {
        shards: 3,
        ..driver::DriverSimConfig::new(3, seed)
    });
    for cfg in one_shard.chain(three_shards) {
        let seed = cfg.seed;
        let first = driver::run_seed_alone(&cfg).expect("the driver simulation runs");
        let again = driver::run_seed_alone(&cfg).expect("the driver simulation runs");
        assert!(first.violation.is_none(), "{first}");
        assert_eq!(
            (first.wire_digest, first.messages_sent),
            (again.wire_digest, again.messages_sent),
            "seed {seed}: the runs sent different messages; \
             `cargo run --release --example driver-sim -- --seed {seed} --shards {} \
             --replay-check` shows where",
            cfg.shards
        );
        assert_eq!(first.stats, again.stats, "seed {seed}");
        seen.add(&first.stats);
    }
    assert!(seen.crashes > 0, "{seen:#?}");
    assert!(seen.membership_changes > 0, "{seen:#?}");
    assert!(seen.snapshots_delivered > 0, "{seen:#?}");
}

#[test]
fn a_clock_that_runs_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime
        .block_on(
            tokio::task::LocalSet::new()
                .run_until(driver::run_seed(&driver::DriverSimConfig::new(3, 0))),
        )
        .unwrap_err();
    assert!(matches!(err, driver::DriverSimError::ClockRuns), "{err}");
}

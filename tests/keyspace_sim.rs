//! Guards the one-revision-order design of `docs/KEYSPACE.md` against its
//! known hole, a stale view of leadership, and the keyspace simulator
//! against losing its teeth. With the leader lease guard, seeded runs of 3
//! and 5 members, 2 to 4 shards each, under partitions (partial ones
//! included), stalled connections and timers, pauses, crashes, clock rate
//! skew and stale-view episodes, with single-shard writes, txns over several
//! shards, reads over several shards and a watch on every member, must keep
//! every check: the revision order, atomicity of txns, strict
//! serializability of the multi-key history, watch order and completeness,
//! and liveness. With the guard off, the checker must catch a write ordered
//! before one acknowledged earlier within a modest number of seeds; without
//! the restart vote hold, the lease alone must be caught too.
//!
//! Txns over several shards are modelled on `src/server/keyspace/txn_batch.rs`,
//! `src/server/keyspace/cross_txn.rs` and `src/server/shard/cross.rs`: they run in
//! batches (one hold and one entry of parts per shard per batch, a
//! revision per txn), and the guarded suites must see batches of several
//! txns, entries of several parts, and batches left half-proposed that a
//! later opening finishes; each bug planted in the batches must be caught.
//! The model of the protocol before its fix is caught (a part refused
//! during a leader transfer leaves its txn half applied); the suites run
//! it with the fix the model calls for (`keyspace::Protocol`), and each
//! bug planted in the fix must be caught. A read point carries, per shard,
//! the term of the entry at its index; a read served without checking it
//! where an entry of a new leader replaced that one must be caught.
//!
//! The full runs are `cargo run --release --example keyspace-sim --
//! --seeds 2000 --members 3 --guard lease` (and `--members 5`, `--guard
//! none` or `--guard lease-no-restart-hold`, `--protocol as-built`, `--bug
//! skip-finish` and the other bugs, to see the catches).

use cairn::sim::keyspace::{
    self, Bug, Guard, KsConfig, KsOutcome, KsStats, KsViolationKind, Protocol,
};

/// Seeds of the guarded suite for 3 members: enough for some hundred
/// episodes that reach two members each believing they lead every shard,
/// some thousand txns over several shards, and some hundred batches left
/// half-proposed.
const GUARDED_SEEDS_3: u64 = 1_000;
/// Seeds of the guarded suite for 5 members (each costs about twice as
/// much).
const GUARDED_SEEDS_5: u64 = 500;
/// The unguarded variant must be caught within this many seeds (measured:
/// the first catch at seed 4 for 3 members and 22 for 5; 139 and 46 of
/// 1,000 seeds catch it).
const NO_GUARD_BUDGET: u64 = 100;
/// The lease without the restart vote hold must be caught within this many
/// seeds of 3 members (measured: the first at seed 403, 2 of 1,000; the
/// lease's margin of one tick and 10% leaves a narrow window).
const NO_HOLD_BUDGET: u64 = 500;
/// The model of the code as built, and of the first fix alone, must be
/// caught within this many seeds of 3 members (measured: both first at
/// seed 8, whose trace shows a part refused during a transfer; 62 and 53
/// of 1,000 seeds).
const AS_BUILT_BUDGET: u64 = 100;
/// Each planted bug must be caught within this many seeds of 3 members
/// (measured, first catch: skip-finish seed 0, no-fence 79, skip-read-wait
/// 0, watch-no-merge 0; of 1,000 seeds, 393, 56, 569 and 1,000 catch them).
const BUG_BUDGET: u64 = 100;

/// A read served at a point whose entry a new shard leader replaced (the
/// term check skipped) must be caught within this window of seeds of 3
/// members. It takes a point answered with an entry not yet committed
/// that is a part of a txn, then that entry lost to a new leader's, and
/// the txn finished by an opening: rare under the random faults
/// (measured: seed 1122 is the only catch of 5,000, and the check refuses
/// 27 reads over those seeds), so the window starts just before the
/// measured catch rather than spend the suite's time on the seeds before.
const SKIP_READ_TERM_FROM: u64 = 1_100;
const SKIP_READ_TERM_BUDGET: u64 = 1_200;

/// Each bug planted in the batches must be caught within this many seeds
/// of 3 members (measured, first catch: batch-one-revision seed 0,
/// join-ignores-overlap 0; of 1,000 seeds, 380 and 135 catch them).
const BATCH_BUG_BUDGET: u64 = 100;

fn config(members: usize, seed: u64, guard: Guard) -> KsConfig {
    KsConfig::new(members, seed, guard)
}

fn run_cfg(cfg: &KsConfig) -> KsOutcome {
    keyspace::run_seed(cfg).expect("valid keyspace simulation config")
}

fn describe(out: &KsOutcome) -> String {
    format!(
        "{out}\nreplay: cargo run --release --example keyspace-sim -- --seed {} --members {} --guard {} --protocol {} --bug {}",
        out.seed,
        out.members,
        out.guard.name(),
        out.protocol.name(),
        out.bug.name()
    )
}

fn guarded_suite(members: usize, seeds: u64) {
    let mut st = KsStats::default();
    for seed in 0..seeds {
        let out = run_cfg(&config(members, seed, Guard::LeaseGuard));
        assert!(out.violation.is_none(), "{}", describe(&out));
        st.add(&out.stats);
    }
    eprintln!(
        "guarded suite, {members} members, {seeds} seeds: violations=0 txns_acked={} batches={} batched_txns={} batch_max_txns={} batch_joins={} joins_refused_overlap={} joins_refused_full={} parts_entries={} batches_half_proposed={} batches_finished_by_opening={} batch_parts_finished={} batches_abandoned={}",
        st.txns_acked,
        st.batches,
        st.batched_txns,
        st.batch_max_txns,
        st.batch_joins,
        st.joins_refused_overlap,
        st.joins_refused_full,
        st.parts_entries,
        st.batches_half_proposed,
        st.batches_finished_by_opening,
        st.batch_parts_finished,
        st.batches_abandoned
    );
    // The suite is worth something only if the stale view it guards
    // against actually came about, many times, and the txns, reads and
    // watches it checks ran, some txns finished by a later leader.
    let (held, acked, txns) = (st.episodes_held, st.writes_acked, st.txns_acked);
    assert!(
        held >= seeds / 10,
        "only {held} episodes reached two members each believing they lead every shard"
    );
    assert!(
        acked > seeds * 50,
        "suspiciously few acknowledged writes: {acked}"
    );
    assert!(
        txns > seeds * 2,
        "suspiciously few acknowledged txns: {txns}"
    );
    assert!(
        st.parts_finished > seeds / 10,
        "suspiciously few parts finished by an opening: {}",
        st.parts_finished
    );
    assert!(
        st.reads_acked > seeds * 10,
        "suspiciously few acknowledged reads: {}",
        st.reads_acked
    );
    assert!(
        st.watch_events_released > seeds * 100,
        "suspiciously few watch events: {}",
        st.watch_events_released
    );
    assert!(
        st.fences_under_half_txn > 0,
        "no fence ended the hold of a txn with a part proposed elsewhere"
    );
    // And batches ran as built: txns joined batches and were refused for
    // each reason, shards proposed entries of several parts, and some
    // batches were left half-proposed (an entry refused while another was
    // proposed) and finished by a later opening.
    assert!(
        st.batches > seeds && st.batch_max_txns >= 2 && st.batched_txns > st.batches,
        "too few batches of several txns: {st:?}"
    );
    assert!(
        st.joins_refused_overlap > 0 && st.joins_refused_full > 0,
        "no txn led a new batch for each reason: {st:?}"
    );
    assert!(
        st.parts_entries > seeds / 20,
        "suspiciously few entries of several parts: {}",
        st.parts_entries
    );
    assert!(
        st.batches_half_proposed > 0 && st.batches_finished_by_opening > 0,
        "no batch left half-proposed and finished by an opening: {st:?}"
    );
}

// docs/KEYSPACE.md, "Why revisions increase in real time across all keys",
// with the lease guard, for a group of three.
#[test]
fn lease_guard_keeps_revision_order_with_three_members() {
    guarded_suite(3, GUARDED_SEEDS_3);
}

// The same, for a group of five.
#[test]
fn lease_guard_keeps_revision_order_with_five_members() {
    guarded_suite(5, GUARDED_SEEDS_5);
}

fn first_catch(template: &KsConfig, budget: u64) -> KsOutcome {
    first_catch_from(template, 0, budget)
}

/// The first violating seed in `from..budget`.
fn first_catch_from(template: &KsConfig, from: u64, budget: u64) -> KsOutcome {
    for seed in from..budget {
        let mut cfg = template.clone();
        cfg.seed = seed;
        let out = run_cfg(&cfg);
        if let Some(v) = &out.violation {
            assert!(
                v.kind.is_consistency(),
                "expected a consistency violation: {}",
                describe(&out)
            );
            return out;
        }
    }
    panic!(
        "guard {:?}, protocol {:?}, bug {:?} not caught within {budget} seeds of {} members",
        template.guard, template.protocol, template.bug, template.members
    );
}

/// Replays the violating seed with a trace: the same violation.
fn replays(out: &KsOutcome, template: &KsConfig) -> Vec<String> {
    let mut cfg = template.clone();
    cfg.seed = out.seed;
    cfg.trace = true;
    let replay = run_cfg(&cfg);
    assert_eq!(
        replay.violation, out.violation,
        "the violating seed must replay to the same violation"
    );
    replay.trace
}

// docs/KEYSPACE.md, "Open: a stale view of leadership": without a guard,
// two members that each believe they lead every shard hand out revisions
// from two counters.
#[test]
fn planted_stale_view_bug_is_caught() {
    for members in [3, 5] {
        let template = config(members, 0, Guard::NoGuard);
        let out = first_catch(&template, NO_GUARD_BUDGET);
        let trace = replays(&out, &template);
        assert!(
            trace.iter().any(|l| l.contains("episode")),
            "the trace of seed {} shows no stale-view episode",
            out.seed
        );
    }
}

// A restarted member forgets the leader it heard and would vote at once;
// without the hold, a lease it vouched for before its crash is broken.
#[test]
fn lease_without_the_restart_vote_hold_is_caught() {
    first_catch(&config(3, 0, Guard::NoRestartVoteHold), NO_HOLD_BUDGET);
}

// docs/KEYSPACE.md, "Transactions over several shards", as built: a part
// that Raft refuses (its shard's leadership is being transferred) releases
// the hold, and when the transfer times out the same member keeps
// numbering writes with no opening, so nothing finishes the txn; reads at
// a point asked meanwhile see half of it.
#[test]
fn the_txn_protocol_as_built_is_caught() {
    let mut template = config(3, 0, Guard::LeaseGuard);
    template.protocol = Protocol::AsBuilt;
    // Some catches come about another way (a fence ends the hold of a part
    // still to come, as the first fix alone allows): find one through a
    // part refused during a transfer.
    let mut from = 0;
    loop {
        let out = first_catch_from(&template, from, AS_BUILT_BUDGET);
        assert!(
            matches!(
                out.violation.as_ref().map(|v| v.kind),
                Some(KsViolationKind::Atomicity | KsViolationKind::Serializability)
            ),
            "{}",
            describe(&out)
        );
        let trace = replays(&out, &template);
        if trace
            .iter()
            .any(|l| l.contains("leadership is being transferred"))
        {
            return;
        }
        from = out.seed + 1;
    }
}

// The first fix alone (a refused part closes the counter until a
// finishing) still lets a read point be answered by a shard whose hold
// ended without its part (the fence of a reopening on the same member, or
// the refusal itself), while the finishing then adds the part below the
// point.
#[test]
fn the_first_fix_alone_is_caught_by_reads() {
    let mut template = config(3, 0, Guard::LeaseGuard);
    template.protocol = Protocol::ReopenOnly;
    let out = first_catch(&template, AS_BUILT_BUDGET);
    assert_eq!(
        out.violation.as_ref().map(|v| v.kind),
        Some(KsViolationKind::Serializability),
        "{}",
        describe(&out)
    );
}

// Each bug planted in the fixed protocol is caught, as the property it
// breaks.
#[test]
fn planted_txn_read_and_watch_bugs_are_caught() {
    for (bug, kinds) in [
        (
            Bug::SkipFinish,
            &[KsViolationKind::Atomicity, KsViolationKind::Serializability][..],
        ),
        (
            Bug::NoFence,
            &[
                KsViolationKind::RevisionOrder,
                KsViolationKind::Atomicity,
                KsViolationKind::Serializability,
            ][..],
        ),
        (Bug::SkipReadWait, &[KsViolationKind::Serializability][..]),
        (Bug::WatchNoMerge, &[KsViolationKind::WatchOrder][..]),
    ] {
        let mut template = config(3, 0, Guard::LeaseGuard);
        template.bug = bug;
        let out = first_catch(&template, BUG_BUDGET);
        let kind = out.violation.as_ref().map(|v| v.kind).expect("caught");
        assert!(
            kinds.contains(&kind),
            "{bug:?} caught as {kind:?}: {}",
            describe(&out)
        );
    }
}

// docs/KEYSPACE.md, "Batches": each bug planted in the batches is caught.
// A shard that applies a batch's parts all at one revision breaks the
// revision order the watches and reads see; a txn that joins a batch
// naming a key of an earlier txn there reads the keyspace before that txn,
// not before its own revision.
#[test]
fn planted_batch_bugs_are_caught() {
    for (bug, kinds) in [
        (
            Bug::BatchOneRevision,
            &[
                KsViolationKind::WatchOrder,
                KsViolationKind::Serializability,
            ][..],
        ),
        (
            Bug::JoinIgnoresOverlap,
            &[KsViolationKind::Serializability][..],
        ),
    ] {
        let mut template = config(3, 0, Guard::LeaseGuard);
        template.bug = bug;
        let out = first_catch(&template, BATCH_BUG_BUDGET);
        let kind = out.violation.as_ref().map(|v| v.kind).expect("caught");
        assert!(
            kinds.contains(&kind),
            "{bug:?} caught as {kind:?}: {}",
            describe(&out)
        );
        let exercised = match bug {
            Bug::BatchOneRevision => out.stats.parts_entries,
            _ => out.stats.batch_joins,
        };
        assert!(
            exercised > 0,
            "{bug:?} caught in a run with no entry of several parts or no join: {}",
            describe(&out)
        );
        replays(&out, &template);
    }
}

// Raft paper 5.3, log matching: a read point carries each shard's index
// with the term of the entry there in its leader's log, and is served only
// where the entry at that index has that term. Without the check, a point
// taken over a part the shard's leader had appended but not committed is
// served after a new leader's entry took the index, and the part is then
// finished by an opening below the point: the read sees half a txn.
#[test]
fn planted_read_term_bug_is_caught() {
    let mut template = config(3, 0, Guard::LeaseGuard);
    template.bug = Bug::SkipReadTerm;
    let out = first_catch_from(&template, SKIP_READ_TERM_FROM, SKIP_READ_TERM_BUDGET);
    assert_eq!(
        out.violation.as_ref().map(|v| v.kind),
        Some(KsViolationKind::Serializability),
        "{}",
        describe(&out)
    );
    let trace = replays(&out, &template);
    assert!(
        trace
            .iter()
            .any(|l| l.contains("the entry's term is not the point's")),
        "the trace of seed {} shows no read served over a replaced entry",
        out.seed
    );
}

#[test]
fn replay_of_a_seed_is_deterministic() {
    for members in [3, 5] {
        let mut cfg = config(members, 7, Guard::LeaseGuard);
        cfg.trace = true;
        let a = run_cfg(&cfg);
        let b = run_cfg(&cfg);
        assert!(
            a.trace.len() > 1_000,
            "trace too short: {} lines",
            a.trace.len()
        );
        assert_eq!(a.trace, b.trace);
        assert_eq!(a.stats, b.stats);
    }
}

//! Guards the Raft core against losing safety under a hostile world, and the
//! simulator against losing its teeth: seeded runs of 3 and 5 members under
//! drops, delays, duplicates, partitions, crashes, compaction, transfers and
//! membership changes must break no property (Raft paper 5.2-5.4, thesis
//! 6.4); a seed must replay to the same trace; and each safety rule of the
//! core, switched off through the hidden `Config::mutation` knob, must be
//! caught by the checks within 2,000 seeds.
//!
//! The full runs (2,000 seeds each) are `cargo run --release --example
//! raft-sim -- --seeds 2000 --members 3` (and `--members 5`). The seeds on
//! which the simulator once caught the core breaking a property are replayed
//! as regression tests.

use cairn::raft::SafetyMutation;
use cairn::sim::{self, SimConfig, SimOutcome};

/// Seeds per member count in the normal suite: enough to cover every fault
/// kind many times, few enough to stay well under a minute at opt-level 1.
const SUITE_SEEDS: u64 = 200;
/// The mutation check must succeed within this many seeds.
const MUTATION_SEED_BUDGET: u64 = 2_000;

fn run(members: usize, seed: u64, mutation: Option<SafetyMutation>, trace: bool) -> SimOutcome {
    let mut cfg = SimConfig::new(members, seed);
    cfg.mutation = mutation;
    cfg.trace = trace;
    sim::run_seed(&cfg).expect("valid simulation config")
}

fn run_pipelined(members: usize, seed: u64) -> SimOutcome {
    let mut cfg = SimConfig::new(members, seed);
    cfg.pipelined = true;
    sim::run_seed(&cfg).expect("valid simulation config")
}

fn describe(out: &SimOutcome) -> String {
    format!(
        "{out}\nreplay: cargo run --release --example raft-sim -- --seed {} --members {}",
        out.seed, out.members
    )
}

// Raft paper 5.2-5.4 and thesis 6.4, for a group of five: every property,
// liveness included, holds on every seed.
#[test]
fn five_member_seeds_pass() {
    let mut steps = 0;
    for seed in 0..SUITE_SEEDS {
        let out = run(5, seed, None, false);
        assert!(out.violation.is_none(), "{}", describe(&out));
        assert!(
            out.stats.leaders_elected > 0,
            "seed {seed} never elected a leader"
        );
        steps += out.stats.steps;
    }
    assert!(
        steps > SUITE_SEEDS * 1_000,
        "suspiciously few steps: {steps}"
    );
}

// Raft paper 5.2-5.4 and thesis 6.4, for a group of three: no property,
// safety or liveness, breaks on any seed.
#[test]
fn three_member_seeds_are_safe() {
    for seed in 0..SUITE_SEEDS {
        let out = run(3, seed, None, false);
        assert!(out.violation.is_none(), "{}", describe(&out));
    }
}

#[test]
fn replay_of_a_seed_is_deterministic() {
    for members in [3, 5] {
        let a = run(members, 11, None, true);
        let b = run(members, 11, None, true);
        assert!(
            a.trace.len() > 100,
            "trace too short: {} lines",
            a.trace.len()
        );
        assert_eq!(a.stats, b.stats);
        assert_eq!(
            a.trace, b.trace,
            "seed 11 with {members} members replayed differently"
        );
    }
}

/// Searches seeds from 0 for the first one on which the mutated core breaks
/// a consensus property; then shows the same seed is clean without the
/// mutation, so the mutation is what the checks caught.
fn mutation_is_caught(members: usize, mutation: SafetyMutation) {
    for seed in 0..MUTATION_SEED_BUDGET {
        let out = run(members, seed, Some(mutation), false);
        let Some(v) = &out.violation else {
            continue;
        };
        if !v.kind.is_consensus_safety() {
            continue;
        }
        let clean = run(members, seed, None, false);
        assert!(
            clean
                .violation
                .as_ref()
                .is_none_or(|c| !c.kind.is_consensus_safety()),
            "seed {seed} breaks consensus safety even without {mutation:?}: {}",
            describe(&clean)
        );
        return;
    }
    panic!("{mutation:?} with {members} members not caught within {MUTATION_SEED_BUDGET} seeds");
}

// Raft paper 5.4.1: voting without the up-to-date check elects a leader that
// lacks committed entries.
#[test]
fn mutation_vote_without_log_check_is_caught() {
    mutation_is_caught(3, SafetyMutation::VoteWithoutLogCheck);
    mutation_is_caught(5, SafetyMutation::VoteWithoutLogCheck);
}

// Raft paper 5.4.2 and figure 8: committing an entry of an earlier term by
// counting replicas lets a later leader overwrite it.
#[test]
fn mutation_commit_previous_term_by_count_is_caught() {
    mutation_is_caught(3, SafetyMutation::CommitPreviousTermByCount);
}

// The same for five members, where the first catching seed lies further out.
#[test]
fn mutation_commit_previous_term_by_count_is_caught_with_five() {
    mutation_is_caught(5, SafetyMutation::CommitPreviousTermByCount);
}

// Thesis 4.2.2 with membership applied at commit: a leader that removes
// itself used to step down as soon as it applied the change, while a
// remaining voter that had not learnt the commit still needed its vote. The
// group stayed leaderless; the leader now hands over by transfer.
#[test]
fn removed_leader_does_not_leave_the_group_leaderless() {
    for seed in [36, 203, 837, 1218, 1360, 1790, 1906, 1911] {
        let out = run(3, seed, None, false);
        assert!(out.violation.is_none(), "{}", describe(&out));
    }
}

// Thesis 6.4: a leader may answer a ReadIndex only once it has committed an
// entry of its term. The single-voter shortcut used to answer at once, with a
// commit index lagging the one the previous leader reached.
#[test]
fn single_voter_read_index_waits_for_its_term() {
    let out = run(3, 512, None, false);
    assert!(out.violation.is_none(), "{}", describe(&out));
}

// Raft paper 5.2-5.4 and thesis 6.4 with pipelined writes (Raft's
// async_append, as the shard driver runs it): members take the next Ready
// while earlier writes are in flight, apply committed entries at once, and a
// crash loses every write still in flight. Every property holds on every seed.
#[test]
fn pipelined_writes_keep_every_property() {
    let mut writes = 0;
    let mut most_in_flight = 0;
    for members in [3, 5] {
        for seed in 0..SUITE_SEEDS {
            let out = run_pipelined(members, seed);
            assert!(
                out.violation.is_none(),
                "{} (add --pipelined to the replay)",
                describe(&out)
            );
            writes += out.stats.writes_applied;
            most_in_flight = most_in_flight.max(out.stats.max_writes_in_flight);
        }
    }
    // Every run makes progress: on average ten client writes or more.
    assert!(
        writes > 2 * SUITE_SEEDS * 10,
        "suspiciously few writes: {writes}"
    );
    assert!(
        most_in_flight > 1,
        "no member ever had two writes in flight: the pipeline was not exercised"
    );
}

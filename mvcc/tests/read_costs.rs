//! Figures, not checks (every test here is ignored): how long reads that
//! grow with the store hold the thread that owns it. Run with
//! `cargo test --release -p cairn-mvcc --test read_costs -- --ignored --nocapture`.

mod common;

use cairn_mvcc::*;
use common::store::{cmp, TestStore as T};

#[test]
#[ignore = "a measurement: cargo test --release -p cairn-mvcc --test read_costs compare_cost -- --ignored --nocapture"]
fn compare_cost() {
    let mut t = T::new();
    let n = 200_000;
    for i in 0..n {
        let v = if i == 0 || i == n - 1 { "x" } else { "v" };
        t.put(&format!("k{i:06}"), v);
    }
    // From the first key on, the compare fails there; from the second, at
    // the last key.
    for (first, fails_at) in [("k000000", "its first"), ("k000001", "its last")] {
        let c = Compare {
            range_end: "\0".into(),
            ..cmp(
                first,
                CompareTarget::Value(b"x".to_vec()),
                CompareResult::NotEqual,
            )
        };
        let started = std::time::Instant::now();
        let r = t.txn(TxnRequest {
            compare: vec![c],
            success: Vec::new(),
            failure: Vec::new(),
        });
        assert!(!r.unwrap().succeeded);
        println!(
            "a value compare over {} keys failing at {fails_at} key: {:?}",
            n - first[1..].parse::<usize>().unwrap(),
            started.elapsed()
        );
    }
}

#[test]
#[ignore = "a measurement: cargo test --release -p cairn-mvcc --test read_costs hash_kv_cost -- --ignored --nocapture"]
fn hash_kv_cost() {
    let mut t = T::new();
    let n = 200_000;
    for i in 0..n {
        t.put(&format!("k{i:06}"), &"v".repeat(100));
        if i % 10_000 == 0 {
            t.store.commit().unwrap();
        }
    }
    t.store.commit().unwrap();
    let started = std::time::Instant::now();
    let whole = t.store.hash_kv(0).unwrap();
    let one_pass = started.elapsed();
    let mut stream = t.store.hash_kv_stream(0).unwrap();
    let (mut steps, mut longest) = (0, std::time::Duration::ZERO);
    let stepped = loop {
        let started = std::time::Instant::now();
        let answer = stream.step(4_096).unwrap();
        longest = longest.max(started.elapsed());
        steps += 1;
        if let Some(h) = answer {
            break h;
        }
    };
    assert_eq!(stepped, whole);
    println!(
        "HashKV of {n} records of 100 B: one pass {one_pass:?}; {steps} steps of 4,096, \
         the longest {longest:?}"
    );
}

#[test]
#[ignore = "a measurement: cargo test --release -p cairn-mvcc --test read_costs compact_cost -- --ignored --nocapture"]
fn compact_cost() {
    let n = 1_000_000;
    // One pass (what a compaction held the thread for before its pass went
    // in steps), then the default steps.
    for step_keys in [usize::MAX, Config::default().compact_step_keys] {
        let mut t = T::with(Config {
            compact_step_keys: step_keys,
            ..Config::default()
        });
        // Committed as a shard commits, every few thousand puts (one commit
        // of millions frees as many records at once, and the allocator's
        // next large request pays for tidying them).
        for round in ["v", "w"] {
            for i in 0..n {
                t.put(&format!("k{i:07}"), round);
                if i % 2_000 == 0 {
                    t.store.commit().unwrap();
                }
            }
        }
        t.store.commit().unwrap();
        let at = t.store.current_revision() - (n as i64) / 2;
        let started = std::time::Instant::now();
        t.apply(Op::Compact(CompactionRequest { revision: at }))
            .unwrap();
        let apply = started.elapsed();
        let mut took = Vec::new();
        while let Some(step) = t.store.compaction_step() {
            took.push(step.took);
        }
        let total = apply + took.iter().sum::<std::time::Duration>();
        let steps = took.len();
        took.sort();
        let at_share = |q: f64| {
            took.get(((steps as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or_default()
        };
        let (median, p99, longest) = (at_share(0.5), at_share(0.99), at_share(1.0));
        let per_step = match step_keys {
            usize::MAX => "all keys in one step".to_string(),
            k => format!("{k} keys a step"),
        };
        // A HashKV begun before the next commit (etcd's compaction hash
        // check asks one right after a compaction).
        let started = std::time::Instant::now();
        let stream = t.store.hash_kv_stream(0).unwrap();
        let hash_start = started.elapsed();
        drop(stream);
        println!("a HashKV's start after it: {hash_start:?}");
        println!(
            "compaction over {n} keys, {per_step}: the apply {apply:?}, \
             then {steps} steps (median {median:?}, p99 {p99:?}, longest {longest:?}); \
             {total:?} in all"
        );
    }
}

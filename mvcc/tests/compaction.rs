//! Guards compaction: etcd's errors and what it keeps, and its pass over the
//! key index in steps: reads and change reads the same during the pass and
//! after, a pass that ends however often compactions come, and what etcd's
//! `physical` compaction waits for.

mod common;

use cairn_mvcc::*;
use common::store::{put_req, rr, TestStore as T};

#[test]
fn compaction_and_its_errors() {
    let mut t = T::new();
    for i in 0..10 {
        t.put("k", &i.to_string());
    }
    t.put("gone", "x");
    t.apply(Op::DeleteRange(DeleteRangeRequest {
        key: "gone".into(),
        ..Default::default()
    }))
    .unwrap();
    t.apply(Op::Compact(CompactionRequest { revision: 6 }))
        .unwrap();
    t.store.commit().unwrap();
    assert_eq!(
        t.range(RangeRequest {
            revision: 6,
            ..rr("k", "")
        })
        .kvs[0]
            .value,
        b"4"
    );
    let e = t
        .store
        .range(&RangeRequest {
            revision: 5,
            ..rr("k", "")
        })
        .unwrap_err();
    assert_eq!(e.to_string(), COMPACTED_MSG);
    let e = t
        .apply(Op::Compact(CompactionRequest { revision: 6 }))
        .unwrap_err();
    assert_eq!(e.to_string(), COMPACTED_MSG);
    let e = t
        .apply(Op::Compact(CompactionRequest { revision: 99 }))
        .unwrap_err();
    assert_eq!(e.to_string(), FUTURE_REV_MSG);
    let cur = t.store.current_revision();
    t.apply(Op::Compact(CompactionRequest { revision: cur }))
        .unwrap();
    t.store.commit().unwrap();
    assert_eq!(t.range(rr("\0", "\0")).count, 1);
    let kv = t.store.get(b"k").unwrap().unwrap();
    assert_eq!(kv.version, 10, "versions survive compaction");
    assert!(matches!(
        t.store.events(cur - 1, 10),
        Err(ReadError::Compacted { .. })
    ));
}

/// Events from the compaction's own revision, while its pass over the key
/// index is under way and after: a delete at that revision ends a
/// generation compaction drops, and is never among them.
#[test]
fn events_from_the_compaction_revision_are_the_same_during_its_pass_and_after() {
    let mut t = T::with(Config {
        compact_step_keys: 1,
        ..Config::default()
    });
    for k in ["a", "b", "c", "x", "y", "z"] {
        t.put(k, "1");
    }
    // One revision with a put compaction keeps and a delete it drops.
    t.txn(TxnRequest {
        compare: Vec::new(),
        success: vec![
            RequestOp::Put(put_req("q", "1")),
            RequestOp::DeleteRange(DeleteRangeRequest {
                key: "y".into(),
                ..Default::default()
            }),
        ],
        failure: Vec::new(),
    })
    .unwrap();
    let at = t.store.current_revision();
    t.put("b", "2");
    t.apply(Op::Compact(CompactionRequest { revision: at }))
        .unwrap();
    let want = vec![(EventKind::Put, at), (EventKind::Put, at + 1)];
    let mut seen = 0;
    loop {
        let ev = t.store.events(at, 100).unwrap();
        let kinds: Vec<(EventKind, i64)> = ev.iter().map(|e| (e.kind, e.revision.main)).collect();
        assert_eq!(kinds, want, "after {seen} steps");
        if t.store.compaction_step().is_none() {
            break;
        }
        seen += 1;
    }
    assert!(seen >= 4, "a key a step: {seen} steps");
    t.store.commit().unwrap();
    let ev = t.store.events(at, 100).unwrap();
    assert_eq!(ev.len(), 2);
}

/// Compactions applied faster than a pass over the key index can end (a
/// key a step, a new compaction every four steps) do not keep it going for
/// ever: it ends, and leaves what one whole compaction at the last revision
/// leaves.
#[test]
fn compactions_faster_than_a_pass_still_let_it_end() {
    let stepped_config = Config {
        compact_step_keys: 1,
        ..Config::default()
    };
    let (mut stepped, mut whole) = (T::with(stepped_config), T::new());
    for t in [&mut stepped, &mut whole] {
        for i in 0..40 {
            t.put(&format!("k{i:02}"), "first");
        }
    }
    let mut steps = 0;
    let mut compactions = 0;
    while compactions < 2 || stepped.store.compaction_running() {
        for t in [&mut stepped, &mut whole] {
            t.put(&format!("k{:02}", compactions % 40), "again");
        }
        if compactions < 100 {
            let revision = stepped.store.current_revision() - 1;
            for t in [&mut stepped, &mut whole] {
                t.apply(Op::Compact(CompactionRequest { revision }))
                    .unwrap();
            }
            compactions += 1;
        }
        for _ in 0..4 {
            if stepped.store.compaction_step().is_some() {
                steps += 1;
            }
        }
        assert!(steps < 1_000, "the pass never ends");
    }
    assert!(compactions < 100, "ended while compactions kept coming");
    assert_eq!(
        stepped.store.hash_kv(0).unwrap(),
        whole.store.hash_kv(0).unwrap()
    );
    assert_eq!(stepped.range(rr("\0", "\0")), whole.range(rr("\0", "\0")));
}

/// What etcd's `physical` compaction waits for: a compaction's dropped
/// records out of the tree, its pass ended and a commit since done; a later
/// compaction applied meanwhile does not hold an earlier one back.
#[test]
fn a_compaction_is_out_of_the_tree_once_its_pass_and_a_commit_after_it_end() {
    let mut t = T::with(Config {
        compact_step_keys: 1,
        commit_step_records: 1,
        ..Config::default()
    });
    for round in ["1", "2"] {
        for k in ["a", "b", "c", "d"] {
            t.put(k, round);
        }
    }
    let first = t.store.current_revision() - 1;
    t.apply(Op::Compact(CompactionRequest { revision: first }))
        .unwrap();
    assert!(t.store.compacted_out_through() < first);
    while t.store.compaction_step().is_some() {
        assert!(t.store.compacted_out_through() < first, "the pass runs");
    }
    assert!(
        t.store.compacted_out_through() < first,
        "its drops are not committed"
    );
    assert!(t.store.commit_begin_unless_busy().unwrap());
    t.put("e", "1");
    let second = t.store.current_revision();
    t.apply(Op::Compact(CompactionRequest { revision: second }))
        .unwrap();
    while t.store.commit_running() {
        assert!(t.store.compacted_out_through() < first, "the commit runs");
        t.store.commit_step().unwrap();
    }
    assert_eq!(t.store.compacted_out_through(), first);
    while t.store.compaction_step().is_some() {}
    t.store.commit().unwrap();
    assert_eq!(t.store.compacted_out_through(), second);
}

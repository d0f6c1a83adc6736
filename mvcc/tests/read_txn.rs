//! etcd's read-only txns read without the log (`Store::read_txn`) give
//! exactly what applying them gives: random histories of puts, deletes,
//! compactions and lease changes, and after each step random read-only txns
//! (compares on every target, ranges with every option and old revisions)
//! both read and applied. Each answer is kept and read again later at its
//! revision, where compaction has not removed it.

mod common;

use cairn_mvcc::*;
use common::*;

fn random_compare(rng: &mut SmallRng, rev: i64) -> Compare {
    let target = match rng.gen_range(0..5) {
        0 => CompareTarget::Version(rng.gen_range(0i64..3)),
        1 => CompareTarget::Value(if rng.flip() { value(rng) } else { Vec::new() }),
        2 => CompareTarget::ModRevision(rng.gen_range(0..rev + 2)),
        3 => CompareTarget::CreateRevision(rng.gen_range(0..rev + 2)),
        _ => CompareTarget::Lease(rng.gen_range(0i64..3)),
    };
    let result = compare_result(rng);
    let k = key(rng);
    Compare {
        result,
        target,
        range_end: if rng.gen_bool(0.3) {
            range_end(rng, &k)
        } else {
            Vec::new()
        },
        key: k,
    }
}

fn random_range(rng: &mut SmallRng, rev: i64) -> RangeRequest {
    let k = key(rng);
    RangeRequest {
        range_end: range_end(rng, &k),
        key: k,
        revision: if rng.gen_bool(0.3) {
            rng.gen_range(0..rev + 2)
        } else {
            0
        },
        limit: if rng.flip() {
            rng.gen_range(0i64..4)
        } else {
            0
        },
        keys_only: rng.gen_bool(0.2),
        count_only: rng.gen_bool(0.1),
        sort_target: match rng.gen_range(0..6) {
            0 => SortTarget::Version,
            1 => SortTarget::Mod,
            2 => SortTarget::Value,
            _ => SortTarget::Key,
        },
        sort_order: match rng.gen_range(0..3) {
            0 => SortOrder::Descend,
            1 => SortOrder::Ascend,
            _ => SortOrder::None,
        },
        min_mod_revision: if rng.gen_bool(0.1) {
            rng.gen_range(0..rev + 1)
        } else {
            0
        },
        ..RangeRequest::default()
    }
}

fn random_read_txn(rng: &mut SmallRng, rev: i64) -> TxnRequest {
    let compares = rng.gen_range(0usize..3);
    let ops = |rng: &mut SmallRng| -> Vec<RequestOp> {
        (0..rng.gen_range(0usize..3))
            .map(|_| RequestOp::Range(random_range(rng, rev)))
            .collect()
    };
    TxnRequest {
        compare: (0..compares).map(|_| random_compare(rng, rev)).collect(),
        success: ops(rng),
        failure: ops(rng),
    }
}

/// What an error of either side says, to compare them.
fn read_outcome(r: Result<TxnResponse, ReadError>) -> Result<TxnResponse, String> {
    r.map_err(|e| e.to_string())
}

fn applied_outcome(r: Result<OpResult, ApplyError>) -> Result<TxnResponse, String> {
    match r {
        Ok(OpResult::Txn(t)) => Ok(t),
        Ok(other) => panic!("a txn answered {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

/// How many txns of a seed took each way: (then, else, refused).
fn run_seed(seed: u64, steps: usize) -> (usize, usize, usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut store =
        Store::open_with(Box::new(MemStorage::new()), "read-txn", Config::default()).expect("open");
    let mut m = Model::new();
    let mut index = 0u64;
    let mut kept: Vec<(TxnRequest, i64, TxnResponse)> = Vec::new();
    let mut refused = 0;
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        let op = random_op(&mut rng, &m);
        index += 1;
        m.apply(index, &op);
        let _ = store.apply(index, &op);
        if rng.gen_range(0..8) == 0 {
            store.commit().expect("commit");
        }
        while store.compaction_running() {
            store.compaction_step();
        }
        for _ in 0..3 {
            let t = random_read_txn(&mut rng, store.current_revision());
            let before = store.current_revision();
            let read = read_outcome(store.read_txn(&t, 0));
            index += 1;
            let applied = applied_outcome(store.apply(index, &Op::Txn(t.clone())));
            assert_eq!(read, applied, "{ctx}: {t:?}");
            assert_eq!(
                store.current_revision(),
                before,
                "{ctx}: a read changed nothing"
            );
            match read {
                Ok(r) => kept.push((t, before, r)),
                Err(_) => refused += 1,
            }
        }
    }
    let then = kept.iter().filter(|(_, _, r)| r.succeeded).count();
    let ways = (then, kept.len() - then, refused);
    // Every answer again at its revision, unless compaction has removed it.
    let compact = store.compact_revision();
    for (t, at, answer) in kept {
        let again = store.read_txn(&t, at);
        if at < compact {
            assert!(
                matches!(again, Err(ReadError::Compacted { .. })),
                "seed {seed}: {again:?}"
            );
            continue;
        }
        // A range of the txn that read further back than the compaction
        // now fails; any other answer is the same.
        match again {
            Ok(r) => assert_eq!(r, answer, "seed {seed}: {t:?} at {at}"),
            Err(ReadError::Compacted { .. }) => {}
            Err(e) => panic!("seed {seed}: {t:?} at {at}: {e}"),
        }
    }
    ways
}

#[test]
fn read_only_txns_read_as_they_apply() {
    let (mut then, mut otherwise, mut refused) = (0, 0, 0);
    for seed in 0..40 {
        let (t, e, r) = run_seed(seed, 120);
        then += t;
        otherwise += e;
        refused += r;
    }
    // Each way taken often: the comparison is not of errors alone.
    assert!(
        then > 1000 && otherwise > 1000 && refused > 100,
        "then {then}, else {otherwise}, refused {refused}"
    );
}

#[test]
fn reading_a_txn_with_writes_is_refused() {
    let mut t = common::store::TestStore::new();
    t.put("a", "1");
    let txn = TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp::Range(common::store::rr("a", ""))],
        failure: vec![RequestOp::Put(common::store::put_req("a", "2"))],
    };
    assert_eq!(t.store.read_txn(&txn, 0), Err(ReadError::NotReadOnly));
    let future = t.store.current_revision() + 1;
    let read_only = TxnRequest {
        failure: Vec::new(),
        ..txn
    };
    assert!(matches!(
        t.store.read_txn(&read_only, future),
        Err(ReadError::FutureRevision { .. })
    ));
}

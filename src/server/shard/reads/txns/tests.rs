//! Guards the read-only txn read in chunks against answering anything but
//! what the store's whole read of it answers (`mvcc::Store::read_txn`):
//! both branches, long, short, sorted, counted and limited ranges, old,
//! compacted and future revisions, at the store's revision and at a read
//! point past it; and against holding the core: other tasks must run
//! between the chunks of a txn of long ranges, and what they apply must not
//! show in it.

use std::cell::RefCell;
use std::rc::Rc;

use bytes::Bytes;
use cairn_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_proto::etcdserverpb::range_request::SortTarget;
use cairn_proto::etcdserverpb::{Compare, RequestOp};

use super::*;
use crate::server::shard::test_store::{beside_writes, TestStore};

const SHARD: ShardId = 5;
const TERM: u64 = 3;
const A_KEYS: usize = 1_500;
const B_KEYS: usize = 400;

fn header() -> pb::ResponseHeader {
    pb::ResponseHeader {
        raft_term: TERM,
        ..Default::default()
    }
}

/// Keys under `/a/` and `/b/`, some overwritten or deleted, the oldest
/// history compacted, the newest writes left in the open batch. Answers the
/// store, a compacted revision and a revision before the overwrites.
fn populated() -> (TestStore, i64, i64) {
    let mut f = TestStore::new(SHARD);
    for i in 0..A_KEYS {
        f.put(&format!("/a/{i:04}"), format!("a{}", i * 31 % 97), 0);
    }
    let compacted = f.store.current_revision() - 5;
    for i in 0..B_KEYS {
        f.put(&format!("/b/{i:04}"), format!("b{}", i % 11), 0);
    }
    f.store.commit().unwrap();
    let past = f.store.current_revision();
    for i in (0..A_KEYS).step_by(4) {
        f.put(&format!("/a/{i:04}"), format!("new{i}"), 0);
    }
    for i in (0..B_KEYS).step_by(3) {
        f.delete(&format!("/b/{i:04}"));
    }
    f.apply(mvcc::Op::Compact(mvcc::CompactionRequest {
        revision: compacted + 1,
    }));
    f.put("/b/0000", "back", 0);
    (f, compacted, past)
}

fn range(key: &str, range_end: &str) -> RangeRequest {
    RangeRequest {
        key: Bytes::from(key.as_bytes().to_vec()),
        range_end: Bytes::from(range_end.as_bytes().to_vec()),
        ..Default::default()
    }
}

fn op(r: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(r)),
    }
}

fn value_is(key: &str, value: &str) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Value as i32,
        key: Bytes::from(key.as_bytes().to_vec()),
        target_union: Some(TargetUnion::Value(Bytes::from(value.as_bytes().to_vec()))),
        ..Default::default()
    }
}

/// The txns compared, named for the failure message: each branch list is
/// tried under a compare that holds and one that does not.
fn txn_matrix(compacted: i64, past: i64, current: i64) -> Vec<(String, TxnRequest)> {
    let long_a = range("/a/", "/a0");
    let long_b = range("/b/", "/b0");
    let lists: Vec<(&str, Vec<RangeRequest>)> = vec![
        ("no range", vec![]),
        ("one key", vec![range("/a/0004", "")]),
        ("a long range", vec![long_a.clone()]),
        ("two long ranges", vec![long_a.clone(), long_b.clone()]),
        (
            "small ranges then a long one",
            vec![
                range("/b/0001", ""),
                range("/a/0001", "/a/0009"),
                long_b.clone(),
            ],
        ),
        (
            "sorted by value, counted, limited",
            vec![
                RangeRequest {
                    sort_target: SortTarget::Value as i32,
                    ..long_b.clone()
                },
                RangeRequest {
                    count_only: true,
                    ..long_a.clone()
                },
                RangeRequest {
                    limit: 5,
                    ..long_a.clone()
                },
            ],
        ),
        (
            "at a past revision",
            vec![
                RangeRequest {
                    revision: past,
                    ..long_a.clone()
                },
                long_b.clone(),
            ],
        ),
        (
            "a compacted revision after a long range",
            vec![
                long_a.clone(),
                RangeRequest {
                    revision: compacted,
                    ..long_b.clone()
                },
            ],
        ),
        (
            "a future revision",
            vec![RangeRequest {
                revision: current + 1,
                ..range("/a/0001", "")
            }],
        ),
        (
            "a long range, then the store's revision",
            vec![
                long_a.clone(),
                RangeRequest {
                    revision: current,
                    ..long_b.clone()
                },
            ],
        ),
    ];
    let mut out = Vec::new();
    for (name, ranges) in lists {
        for (holds, compare) in [
            (true, value_is("/b/0000", "back")),
            (false, value_is("/b/0000", "x")),
        ] {
            out.push((
                format!("{name}, compare holds: {holds}"),
                TxnRequest {
                    compare: vec![compare],
                    success: ranges.iter().cloned().map(op).collect(),
                    failure: vec![op(range("/a/0002", ""))],
                },
            ));
        }
    }
    out
}

/// The store's whole read of `request`, as the shard answered every
/// read-only txn before it read them in chunks; `point` as in `serve_txn`.
fn whole(
    store: &mvcc::Store,
    request: &TxnRequest,
    point: Option<i64>,
) -> Result<TxnResponse, ApiError> {
    let mut request = request.clone();
    let revision = point.map_or(0, |p| {
        read_at_point(&mut request, p, store.current_revision())
    });
    store
        .read_txn(&convert::txn_from_pb(&request), revision)
        .map(|r| {
            let mut r = convert::txn_to_pb(r, header());
            if let Some(point) = point {
                convert::set_txn_revision(&mut r, point);
            }
            r
        })
        .map_err(|e| read_error_to_api(SHARD, e))
}

/// The chunked answer, with whether it took a task.
fn chunked(
    store: &mvcc::Store,
    request: &TxnRequest,
    point: Option<i64>,
    chunk_keys: usize,
) -> (Result<TxnResponse, ApiError>, bool) {
    let txn = match start_txn(store, request, point, header(), chunk_keys, SHARD) {
        TxnStart::Answered(answer) => return (answer, false),
        TxnStart::Chunked(txn) => txn,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = tokio::task::LocalSet::new().block_on(&rt, async {
        let (tx, rx) = Reply::channel();
        tokio::task::spawn_local(read_txn_rest(txn, tx));
        rx.await.expect("the txn answers")
    });
    (answer, true)
}

#[test]
fn chunked_txns_answer_as_the_whole_txn_does() {
    let (f, compacted, past) = populated();
    let current = f.store.current_revision();
    let txns = txn_matrix(compacted, past, current);
    let mut tasks = [0usize; 2];
    for chunk_keys in [1, 7, 1_000] {
        // A point past the store's, and one before it (a range at the
        // store's revision is then in the txn's future).
        for point in [None, Some(current + 9), Some(past + 3)] {
            for (name, txn) in &txns {
                let expected = whole(&f.store, txn, point);
                let (got, took_task) = chunked(&f.store, txn, point, chunk_keys);
                assert_eq!(
                    got, expected,
                    "{name}, chunks of {chunk_keys} keys, point {point:?}"
                );
                tasks[usize::from(took_task)] += 1;
            }
        }
    }
    assert!(
        tasks.iter().all(|&n| n > 0),
        "answered inline / by a task: {tasks:?}"
    );
    // The matrix reaches both branches and etcd's errors.
    let answers: Vec<_> = txns.iter().map(|(_, t)| whole(&f.store, t, None)).collect();
    for e in [ApiError::Compacted, ApiError::FutureRev] {
        assert!(answers.contains(&Err(e.clone())), "no txn fails with {e}");
    }
    for succeeded in [true, false] {
        assert!(answers
            .iter()
            .any(|a| a.as_ref().is_ok_and(|r| r.succeeded == succeeded)));
    }
}

#[test]
fn a_txn_of_long_ranges_lets_the_cores_other_tasks_run_between_chunks() {
    const KEYS: usize = 2_000;
    const CHUNK_KEYS: usize = 10;
    let mut f = TestStore::new(SHARD);
    for i in 0..KEYS {
        f.put(&format!("/k/{i:05}"), format!("old{i}"), 0);
    }
    f.store.commit().unwrap();
    let request = TxnRequest {
        compare: vec![value_is("/k/00000", "old0")],
        success: vec![op(range("/k/", "/k0")), op(range("/k/00100", "/k0"))],
        ..Default::default()
    };
    let expected = whole(&f.store, &request, None);
    let f = Rc::new(RefCell::new(f));
    // Another shard's work on the same core writes into the ranges.
    let write = |fixture: &mut TestStore, n: usize| {
        let i = n % KEYS;
        fixture.put(&format!("/k/{i:05}"), format!("new{n}"), 0);
        fixture.delete(&format!("/k/{:05}", (i * 7) % KEYS));
        if n.is_multiple_of(50) {
            fixture.store.commit().unwrap();
        }
    };
    let (answer, writes_meanwhile) = beside_writes(&f, write, async {
        let (tx, rx) = Reply::channel();
        let start = start_txn(
            &f.borrow().store,
            &request,
            None,
            header(),
            CHUNK_KEYS,
            SHARD,
        );
        match start {
            TxnStart::Answered(answer) => {
                let _ = tx.send(answer);
            }
            TxnStart::Chunked(txn) => {
                tokio::task::spawn_local(read_txn_rest(txn, tx));
            }
        }
        rx.await.expect("the txn answers")
    });
    assert_eq!(answer, expected, "the answer is the store's when it began");
    let chunks = (2 * KEYS - 100) / CHUNK_KEYS;
    assert!(
        writes_meanwhile >= chunks / 2,
        "the core ran other work {writes_meanwhile} times during a txn of {chunks} chunks"
    );
}

//! Guards the chunked range against answering anything but what the whole
//! range read in one go answers (kvs, count, more, header, errors) for etcd's
//! range options, against spawning a task for a range that fits in one chunk,
//! against a partial answer when a read fails mid-stream, and against holding
//! the core: other tasks on the core's `LocalSet` must run between the chunks
//! of a long range, and the writes they apply meanwhile must not show in it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::Bytes;
use cairn_proto::etcdserverpb::range_request::{SortOrder, SortTarget};

use super::*;

const SHARD: ShardId = 3;
const TERM: u64 = 7;
/// Keys under `/a/`, `/b/` and `c` in [`populated`].
const A_KEYS: usize = 2_000;
const B_KEYS: usize = 1_000;
const C_KEYS: usize = 200;
const LEASE: i64 = 42;

fn header() -> pb::ResponseHeader {
    pb::ResponseHeader {
        raft_term: TERM,
        ..Default::default()
    }
}

use crate::server::shard::test_store::{beside_writes, TestStore};

/// Revisions of [`populated`] worth reading at.
struct Revisions {
    /// Compacted away: reading at it fails.
    compacted: i64,
    /// Before the overwrites and deletes.
    past: i64,
    /// Some keys were modified after it.
    mid: i64,
}

/// A store of a few thousand keys, values unordered (so that a sort by value
/// moves them), some overwritten, some deleted, some under a lease, the
/// oldest history compacted; part of it committed to the file, the rest in
/// the store's open batch.
fn populated() -> (TestStore, Revisions) {
    let mut f = TestStore::new(SHARD);
    f.apply(mvcc::Op::LeaseGrant {
        id: LEASE,
        ttl_secs: 60,
    });
    for i in 0..A_KEYS {
        f.put(&format!("/a/{i:04}"), format!("v{}", i * 7_919 % 1_000), 0);
    }
    let compacted = f.store.current_revision() - 10;
    for i in 0..B_KEYS {
        f.put(&format!("/b/{i:04}"), format!("b{}", i % 13), 0);
    }
    for i in 0..C_KEYS {
        f.put(&format!("c{i:03}"), "c".repeat(i % 50), LEASE);
    }
    f.store.commit().unwrap();
    let past = f.store.current_revision();
    for i in (0..A_KEYS).step_by(3) {
        f.put(&format!("/a/{i:04}"), format!("new{i}"), 0);
    }
    let mid = f.store.current_revision();
    f.store.commit().unwrap();
    for i in (0..B_KEYS).step_by(5) {
        f.delete(&format!("/b/{i:04}"));
    }
    for i in (1..A_KEYS).step_by(7) {
        f.put(&format!("/a/{i:04}"), format!("again{i}"), LEASE);
    }
    f.apply(mvcc::Op::Compact(mvcc::CompactionRequest {
        revision: compacted + 1,
    }));
    // Left uncommitted: reads take the open batch's records from memory.
    f.put("/b/0000", "back", 0);
    (
        f,
        Revisions {
            compacted,
            past,
            mid,
        },
    )
}

fn range(key: &str, range_end: &str) -> RangeRequest {
    RangeRequest {
        key: Bytes::from(key.as_bytes().to_vec()),
        range_end: Bytes::from(range_end.as_bytes().to_vec()),
        ..Default::default()
    }
}

/// The answer of the range read whole, as the shard served every range
/// before it read them in chunks.
fn whole(store: &mvcc::Store, request: &RangeRequest) -> Result<RangeResponse, ApiError> {
    store
        .range(&convert::range_from_pb(request))
        .map(|r| convert::range_to_pb(r, header()))
        .map_err(|e| read_error_to_api(SHARD, e))
}

/// The chunked answer, with whether it took a task.
fn chunked(
    store: &mvcc::Store,
    request: &RangeRequest,
    chunk_keys: usize,
) -> (Result<RangeResponse, ApiError>, bool) {
    let range = match start_range(store, request, header(), chunk_keys, SHARD) {
        RangeStart::Answered(answer) => return (answer, false),
        RangeStart::Chunked(range) => range,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let answer = local.block_on(&rt, async {
        let (tx, rx) = Reply::channel();
        tokio::task::spawn_local(read_rest(range, tx));
        rx.await.expect("the range answers")
    });
    (answer, true)
}

/// The requests compared, named for the failure message.
fn request_matrix(revs: &Revisions, current: i64) -> Vec<(String, RangeRequest)> {
    let bases = [
        ("prefix /a/", range("/a/", "/a0"), A_KEYS),
        ("prefix /b/", range("/b/", "/b0"), B_KEYS),
        (
            "whole keyspace",
            range("\0", "\0"),
            A_KEYS + B_KEYS + C_KEYS,
        ),
        ("from /b/", range("/b/", "\0"), B_KEYS + C_KEYS),
        ("one key", range("/a/0001", ""), 1),
        ("a missing key", range("/zz", ""), 1),
        ("an end before the key", range("/b/", "/a/"), 1),
    ];
    let mut out = Vec::new();
    for (name, base, keys) in bases {
        let mut add = |what: &str, r: RangeRequest| out.push((format!("{name}, {what}"), r));
        add("plain", base.clone());
        for limit in [1, 6, 7, 8, 999, 1_000, 1_001, keys - 1, keys, keys + 1] {
            let limit = limit as i64;
            add(
                &format!("limit {limit}"),
                RangeRequest {
                    limit,
                    ..base.clone()
                },
            );
        }
        add(
            "limit -1",
            RangeRequest {
                limit: -1,
                ..base.clone()
            },
        );
        add(
            "keys only",
            RangeRequest {
                keys_only: true,
                ..base.clone()
            },
        );
        add(
            "keys only, limit 20",
            RangeRequest {
                keys_only: true,
                limit: 20,
                ..base.clone()
            },
        );
        add(
            "count only",
            RangeRequest {
                count_only: true,
                ..base.clone()
            },
        );
        add(
            "count only, limit 5",
            RangeRequest {
                count_only: true,
                limit: 5,
                ..base.clone()
            },
        );
        add(
            "past revision",
            RangeRequest {
                revision: revs.past,
                ..base.clone()
            },
        );
        add(
            "past revision, limit 100, keys only",
            RangeRequest {
                revision: revs.past,
                limit: 100,
                keys_only: true,
                ..base.clone()
            },
        );
        add(
            "current revision",
            RangeRequest {
                revision: current,
                ..base.clone()
            },
        );
        add(
            "future revision",
            RangeRequest {
                revision: current + 1,
                ..base.clone()
            },
        );
        add(
            "compacted revision",
            RangeRequest {
                revision: revs.compacted,
                ..base.clone()
            },
        );
        add(
            "min mod revision",
            RangeRequest {
                min_mod_revision: revs.mid,
                ..base.clone()
            },
        );
        add(
            "max mod revision, limit 10",
            RangeRequest {
                max_mod_revision: revs.past,
                limit: 10,
                ..base.clone()
            },
        );
        add(
            "min and max create revision, limit 300",
            RangeRequest {
                min_create_revision: revs.compacted,
                max_create_revision: revs.past,
                limit: 300,
                ..base.clone()
            },
        );
        add(
            "mod revision window at a past revision",
            RangeRequest {
                revision: revs.mid,
                min_mod_revision: revs.past,
                max_mod_revision: revs.mid,
                ..base.clone()
            },
        );
        for (order, order_name) in [
            (SortOrder::None, "none"),
            (SortOrder::Ascend, "ascend"),
            (SortOrder::Descend, "descend"),
        ] {
            for (target, target_name) in [
                (SortTarget::Key, "key"),
                (SortTarget::Version, "version"),
                (SortTarget::Create, "create"),
                (SortTarget::Mod, "mod"),
                (SortTarget::Value, "value"),
            ] {
                for limit in [0, 3, 1_001] {
                    add(
                        &format!("sort by {target_name} {order_name}, limit {limit}"),
                        RangeRequest {
                            sort_order: order as i32,
                            sort_target: target as i32,
                            limit,
                            ..base.clone()
                        },
                    );
                }
            }
        }
        add(
            "sort by key descend, keys only, min mod revision, limit 50",
            RangeRequest {
                sort_order: SortOrder::Descend as i32,
                keys_only: true,
                min_mod_revision: revs.mid,
                limit: 50,
                ..base.clone()
            },
        );
        add(
            "sort by value, keys only",
            RangeRequest {
                sort_target: SortTarget::Value as i32,
                keys_only: true,
                ..base.clone()
            },
        );
    }
    out.push(("an empty key".into(), range("", "\0")));
    out
}

#[test]
fn chunked_ranges_answer_as_the_whole_range_does() {
    let (f, revs) = populated();
    let requests = request_matrix(&revs, f.store.current_revision());
    for chunk_keys in [1, 7, 1_000] {
        // Answers by path: read whole, inline in one chunk, from a task.
        let mut paths = [0usize; 3];
        for (name, request) in &requests {
            let expected = whole(&f.store, request);
            let (got, took_task) = chunked(&f.store, request, chunk_keys);
            assert_eq!(got, expected, "{name}, chunks of {chunk_keys} keys");
            // A task only when more than a chunk's keys are in the range,
            // and the first chunk left more to read or the first step of
            // the count more to count.
            let by_key = request.sort_target == SortTarget::Key as i32;
            let keys = expected.as_ref().map_or(0, |r| r.kvs.len());
            let count = expected.as_ref().map_or(0, |r| r.count as usize);
            let limit = usize::try_from(request.limit).unwrap_or(0);
            let limit_in_first = limit > 0 && limit <= chunk_keys;
            let more_keys = keys >= chunk_keys && !limit_in_first;
            let more_to_count = count >= chunk_keys * COUNT_CHUNKS_PER_STEP;
            assert_eq!(
                took_task,
                by_key && count > chunk_keys && (more_keys || more_to_count),
                "{name}, chunks of {chunk_keys} keys: {keys} of {count} keys"
            );
            if keys > 0 {
                paths[if !by_key {
                    0
                } else {
                    1 + usize::from(took_task)
                }] += 1;
            }
        }
        assert!(
            paths.iter().all(|&n| n > 0),
            "chunks of {chunk_keys}: {paths:?}"
        );
    }
    // The matrix reaches etcd's errors and `more`.
    let answers: Vec<_> = requests.iter().map(|(_, r)| whole(&f.store, r)).collect();
    for e in [ApiError::Compacted, ApiError::FutureRev, ApiError::EmptyKey] {
        assert!(
            answers.contains(&Err(e.clone())),
            "no request fails with {e}"
        );
    }
    assert!(answers.iter().any(|a| a.as_ref().is_ok_and(|r| r.more)));
}

#[test]
fn the_header_carries_the_snapshot_revision_and_the_term() {
    let (f, _) = populated();
    let (got, took_task) = chunked(&f.store, &range("/a/", "/a0"), 100);
    let got = got.unwrap();
    assert!(took_task);
    assert_eq!(
        got.header,
        Some(pb::ResponseHeader {
            revision: f.store.current_revision(),
            raft_term: TERM,
            ..Default::default()
        })
    );
    assert_eq!(
        (got.kvs.len(), got.count, got.more),
        (A_KEYS, A_KEYS as i64, false)
    );
}

/// The store of [`a_long_range_lets_the_cores_other_tasks_run_between_its_chunks`].
const LONG_RANGE_KEYS: usize = 3_000;
const LONG_RANGE_CHUNK_KEYS: usize = 10;

#[test]
fn a_long_range_lets_the_cores_other_tasks_run_between_its_chunks() {
    let chunks = LONG_RANGE_KEYS / LONG_RANGE_CHUNK_KEYS;
    let writes_meanwhile = other_work_during(range("/k/", "/k0"));
    assert!(
        writes_meanwhile >= chunks / 2,
        "the core ran other work {writes_meanwhile} times during a range of {chunks} chunks"
    );
}

#[test]
fn a_long_count_lets_the_cores_other_tasks_run_between_its_steps() {
    let steps = LONG_RANGE_KEYS / (LONG_RANGE_CHUNK_KEYS * COUNT_CHUNKS_PER_STEP);
    for request in [
        RangeRequest {
            count_only: true,
            ..range("/k/", "/k0")
        },
        RangeRequest {
            limit: 5,
            ..range("/k/", "/k0")
        },
    ] {
        let writes_meanwhile = other_work_during(request.clone());
        assert!(
            writes_meanwhile >= steps / 2,
            "the core ran other work {writes_meanwhile} times while counting {steps} steps: \
             {request:?}"
        );
    }
}

/// Serves `request` over a store of [`LONG_RANGE_KEYS`] keys under `/k/`,
/// in chunks of [`LONG_RANGE_CHUNK_KEYS`], while another task on the core
/// writes into the range; checks the answer is the store's when the read
/// began, and answers how many times the other task ran meanwhile.
fn other_work_during(request: RangeRequest) -> usize {
    let mut f = TestStore::new(SHARD);
    for i in 0..LONG_RANGE_KEYS {
        f.put(&format!("/k/{i:05}"), format!("old{i}"), 0);
    }
    f.store.commit().unwrap();
    let expected = whole(&f.store, &request);
    let f = Rc::new(RefCell::new(f));
    // Another shard's work on the same core: it applies writes into the
    // range, one batch a turn, committing now and then.
    let write = |fixture: &mut TestStore, n: usize| {
        let i = n % LONG_RANGE_KEYS;
        fixture.put(&format!("/k/{i:05}"), format!("new{n}"), 0);
        fixture.delete(&format!("/k/{:05}", (i * 7) % LONG_RANGE_KEYS));
        fixture.put(&format!("/k/new{n}"), "new", 0);
        if n.is_multiple_of(50) {
            fixture.store.commit().unwrap();
        }
    };
    let (answer, writes_meanwhile) = beside_writes(&f, write, async {
        let (tx, rx) = Reply::channel();
        let start = start_range(
            &f.borrow().store,
            &request,
            header(),
            LONG_RANGE_CHUNK_KEYS,
            SHARD,
        );
        match start {
            RangeStart::Answered(answer) => {
                let _ = tx.send(answer);
            }
            RangeStart::Chunked(range) => {
                tokio::task::spawn_local(read_rest(range, tx));
            }
        }
        rx.await.expect("the range answers")
    });
    // What was applied meanwhile is not in the answer: it is the snapshot's.
    assert_eq!(answer, expected);
    assert!(f.borrow().store.current_revision() > expected.unwrap().header.unwrap().revision);
    writes_meanwhile
}

/// A store of many keys and a range over them whose first chunk was read.
fn long_range_started() -> (TestStore, Box<ChunkedRange>) {
    let mut f = TestStore::new(SHARD);
    for i in 0..LONG_RANGE_KEYS {
        f.put(&format!("/k/{i:05}"), "v", 0);
    }
    let RangeStart::Chunked(range) = start_range(
        &f.store,
        &range("/k/", "/k0"),
        header(),
        LONG_RANGE_CHUNK_KEYS,
        SHARD,
    ) else {
        panic!("a range of many chunks is answered in one");
    };
    (f, range)
}

#[test]
fn a_read_error_mid_range_is_the_answer_not_a_partial_range() {
    let (mut f, range) = long_range_started();
    // A compaction past the snapshot's revision, applied while the range is
    // in flight, takes the history it reads.
    f.put("/k/00000", "newer", 0);
    let revision = f.store.current_revision();
    f.apply(mvcc::Op::Compact(mvcc::CompactionRequest { revision }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = tokio::task::LocalSet::new().block_on(&rt, async {
        let (tx, rx) = Reply::channel();
        tokio::task::spawn_local(read_rest(range, tx));
        rx.await.expect("the range answers")
    });
    assert_eq!(answer, Err(ApiError::Compacted));
}

#[test]
fn a_range_whose_client_is_gone_stops_reading() {
    let (_f, range) = long_range_started();
    let (tx, rx) = Reply::channel();
    drop(rx);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let turns = Rc::new(Cell::new(0usize));
    tokio::task::LocalSet::new().block_on(&rt, async {
        let reader = tokio::task::spawn_local(read_rest(range, tx));
        while !reader.is_finished() {
            turns.set(turns.get() + 1);
            tokio::task::yield_now().await;
        }
    });
    // Reading all of it would take a turn a chunk.
    let chunks = LONG_RANGE_KEYS / LONG_RANGE_CHUNK_KEYS;
    assert!(
        turns.get() < 10,
        "read on for {} turns of {chunks}",
        turns.get()
    );
}

/// Figures, not a check: how long a range over 200,000 keys holds the core
/// read whole and in chunks, and what a one-key range costs either way with
/// 10,000 records in the store's open batch (which a snapshot copies), and
/// what a snapshot and counting the long range cost.
/// `cargo test --release --lib range_figures -- --ignored --nocapture`
#[test]
#[ignore]
fn range_figures() {
    use std::time::{Duration, Instant};
    const KEYS: usize = 200_000;
    const PENDING: usize = 10_000;
    const SMALL_READS: u32 = 20_000;
    let mut f = TestStore::new(SHARD);
    for i in 0..KEYS {
        f.put(&format!("/k/{i:06}"), "v".repeat(100), 0);
        if i % 10_000 == 0 {
            f.store.commit().unwrap();
        }
    }
    f.store.commit().unwrap();
    let request = range("/k/", "/k0");
    let started = Instant::now();
    let expected = whole(&f.store, &request);
    let whole_ms = started.elapsed().as_secs_f64() * 1e3;
    let chunk_keys = mvcc::Config::default().range_chunk_keys;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // The answer, the time `start_range` held the core, the longest wait of
    // another task on the core, and the time to the answer.
    let timed = |request: &RangeRequest| {
        tokio::task::LocalSet::new().block_on(&rt, async {
            let started = Instant::now();
            let (tx, rx) = Reply::channel();
            match start_range(&f.store, request, header(), chunk_keys, SHARD) {
                RangeStart::Answered(answer) => {
                    let _ = tx.send(answer);
                }
                RangeStart::Chunked(range) => {
                    tokio::task::spawn_local(read_rest(range, tx));
                }
            }
            let first_ms = started.elapsed().as_secs_f64() * 1e3;
            // Another task on the core notes the longest wait between its turns.
            let longest = Rc::new(Cell::new(Duration::ZERO));
            let ticker = tokio::task::spawn_local({
                let longest = longest.clone();
                async move {
                    let mut last = Instant::now();
                    loop {
                        tokio::task::yield_now().await;
                        longest.set(longest.get().max(last.elapsed()));
                        last = Instant::now();
                    }
                }
            });
            let answer = rx.await.expect("the range answers");
            ticker.abort();
            let total_ms = started.elapsed().as_secs_f64() * 1e3;
            (
                answer,
                first_ms,
                longest.get().as_secs_f64() * 1e3,
                total_ms,
            )
        })
    };
    let (answer, first_ms, longest_gap_ms, total_ms) = timed(&request);
    assert_eq!(answer, expected);
    // A page of a paginated list (Kubernetes asks for 500 keys and the
    // count of the rest), and a count alone.
    let page = RangeRequest {
        limit: 500,
        ..request.clone()
    };
    let (answer, page_first_ms, page_gap_ms, _) = timed(&page);
    assert_eq!(answer, whole(&f.store, &page));
    let counted = RangeRequest {
        count_only: true,
        ..request.clone()
    };
    let (answer, count_first_ms, count_gap_ms, _) = timed(&counted);
    assert_eq!(answer, whole(&f.store, &counted));
    for i in 0..PENDING {
        f.put(&format!("/p/{i:06}"), "v".repeat(100), 0);
    }
    // Per read, the whole path against the chunked one, for one key and for
    // a prefix of 100 keys.
    let per_read_ns = |request: &RangeRequest, chunked: bool| {
        let started = Instant::now();
        for _ in 0..SMALL_READS {
            let answer = if chunked {
                match start_range(&f.store, request, header(), chunk_keys, SHARD) {
                    RangeStart::Answered(answer) => answer,
                    RangeStart::Chunked(_) => panic!("a small range took a task"),
                }
            } else {
                whole(&f.store, request)
            };
            assert!(answer.is_ok_and(|r| !r.kvs.is_empty()));
        }
        started.elapsed().as_nanos() / u128::from(SMALL_READS)
    };
    let one_key = range("/k/000100", "");
    let hundred = range("/k/0001", "/k/0002");
    let one_key_whole_ns = per_read_ns(&one_key, false);
    let one_key_chunked_ns = per_read_ns(&one_key, true);
    let hundred_whole_ns = per_read_ns(&hundred, false);
    let hundred_chunked_ns = per_read_ns(&hundred, true);
    let started = Instant::now();
    let count_only = RangeRequest {
        count_only: true,
        ..request.clone()
    };
    assert!(whole(&f.store, &count_only).is_ok_and(|r| r.count == KEYS as i64));
    let count_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    drop(f.store.snapshot());
    let snapshot_us = started.elapsed().as_secs_f64() * 1e6;
    println!("| figure | value |\n|---|---:|");
    println!("| whole range of {KEYS} keys, core held ms | {whole_ms:.1} |");
    println!("| chunked: first chunk inline ms | {first_ms:.1} |");
    println!("| chunked: longest wait of another task ms | {longest_gap_ms:.1} |");
    println!("| chunked: whole answer ms | {total_ms:.1} |");
    println!("| limit 500: inline ms, longest wait of another task ms | {page_first_ms:.1}, {page_gap_ms:.1} |");
    println!("| count only: inline ms, longest wait of another task ms | {count_first_ms:.1}, {count_gap_ms:.1} |");
    println!("| counting {KEYS} keys (index only) ms | {count_ms:.1} |");
    println!("| snapshot, {PENDING} records pending, us | {snapshot_us:.0} |");
    println!("| one key, whole path ns | {one_key_whole_ns} |");
    println!("| one key, chunked path ns | {one_key_chunked_ns} |");
    println!("| 100 keys, whole path ns | {hundred_whole_ns} |");
    println!("| 100 keys, chunked path ns | {hundred_chunked_ns} |");
    println!(
        "range_figures keys={KEYS} chunk_keys={chunk_keys} whole_ms={whole_ms:.2} \
         first_chunk_ms={first_ms:.2} longest_gap_ms={longest_gap_ms:.2} \
         chunked_total_ms={total_ms:.2} count_ms={count_ms:.2} pending={PENDING} \
         snapshot_us={snapshot_us:.1} one_key_whole_ns={one_key_whole_ns} \
         one_key_chunked_ns={one_key_chunked_ns} hundred_whole_ns={hundred_whole_ns} \
         hundred_chunked_ns={hundred_chunked_ns}"
    );
}

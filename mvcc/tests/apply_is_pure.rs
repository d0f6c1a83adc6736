//! Guards against members diverging on the same committed entries: apply must
//! be a pure function of the Raft log, so two stores whose configurations
//! differ in every knob apply a txn of many ops (with a nested txn), a put far
//! above etcd's default request size and everything else identically: same
//! results, same revision, same HashKV, before and after a commit, and the
//! same reads while one store's compaction pass is still under way. Request
//! limits (`--max-txn-ops`, `--max-request-bytes`) belong to the API.

use cairn_mvcc::*;

fn put(k: &str, v: &[u8]) -> RequestOp {
    RequestOp::Put(PutRequest {
        key: k.as_bytes().to_vec(),
        value: v.to_vec(),
        ..PutRequest::default()
    })
}

/// Every knob at its smallest accepted value.
fn small_config() -> Config {
    Config {
        max_batch_bytes: MAX_REQUEST_BYTES_LIMIT,
        grow_min_bytes: PAGE_SIZE_BYTES as u64,
        grow_max_bytes: PAGE_SIZE_BYTES as u64,
        range_chunk_keys: 1,
        snapshot_chunk_bytes: 4096,
        defrag_step_pages: 1,
        commit_step_records: 1,
        commit_step_bytes: 1,
        compact_step_keys: 1,
        background_sync: false,
        sync_faults: None,
    }
}

/// The entries of a log: a 10-op txn holding a nested 10-op txn, a 2 MiB put
/// (above etcd's default 1.5 MiB request limit) and a 40-op txn.
fn entries() -> Vec<Op> {
    let nested = TxnRequest {
        compare: vec![],
        success: (0..10).map(|i| put(&format!("n{i}"), b"nested")).collect(),
        failure: vec![],
    };
    let mut outer: Vec<RequestOp> = (0..9).map(|i| put(&format!("t{i}"), b"outer")).collect();
    outer.push(RequestOp::Txn(nested));
    let compares = (0..10)
        .map(|i| Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Version(0),
            key: format!("t{i}").into_bytes(),
            range_end: vec![],
        })
        .collect();
    vec![
        Op::Put(PutRequest {
            key: b"first".to_vec(),
            value: b"1".to_vec(),
            ..PutRequest::default()
        }),
        Op::Txn(TxnRequest {
            compare: compares,
            success: outer,
            failure: vec![],
        }),
        Op::Put(PutRequest {
            key: b"big".to_vec(),
            value: vec![0x5a; 2 << 20],
            ..PutRequest::default()
        }),
        Op::Txn(TxnRequest {
            compare: vec![],
            success: (0..40).map(|i| put(&format!("w{i}"), b"wide")).collect(),
            failure: vec![],
        }),
    ]
}

#[test]
fn stores_with_different_configs_apply_the_same_entries_identically() {
    let mut small = Store::open_with(Box::new(MemStorage::new()), "small", small_config()).unwrap();
    let mut large =
        Store::open_with(Box::new(MemStorage::new()), "large", Config::default()).unwrap();
    for (i, op) in entries().iter().enumerate() {
        let index = i as u64 + 1;
        let a = small.apply(index, op);
        let b = large.apply(index, op);
        assert_eq!(
            a.as_ref().map_err(|e| e.to_string()),
            b.as_ref().map_err(|e| e.to_string()),
            "entry {index} applied differently"
        );
        assert!(a.is_ok(), "entry {index} refused at apply: {a:?}");
        assert_eq!(small.current_revision(), large.current_revision());
    }
    // first, the txn (one revision for all of its puts), big, the wide txn.
    assert_eq!(small.current_revision(), 5);
    assert_eq!(small.hash_kv(0).unwrap(), large.hash_kv(0).unwrap());
    small.commit().unwrap();
    large.commit().unwrap();
    assert_eq!(small.hash_kv(0).unwrap(), large.hash_kv(0).unwrap());
    assert_eq!(
        small.get(b"n9").unwrap().map(|kv| kv.value),
        Some(b"nested".to_vec())
    );
    assert_eq!(
        large.get(b"big").unwrap().map(|kv| kv.value.len()),
        Some(2 << 20)
    );

    // A compaction: the small store's pass over the key index takes a key
    // a step, the large one's is done at once. Reads cannot tell.
    let later = [
        Op::Put(PutRequest {
            key: b"first".to_vec(),
            value: b"2".to_vec(),
            ..PutRequest::default()
        }),
        Op::DeleteRange(DeleteRangeRequest {
            key: b"t0".to_vec(),
            range_end: b"t5".to_vec(),
            ..DeleteRangeRequest::default()
        }),
        Op::Compact(CompactionRequest { revision: 7 }),
        put_op("t1", b"again"),
    ];
    for (i, op) in later.iter().enumerate() {
        let index = entries().len() as u64 + i as u64 + 1;
        let a = small.apply(index, op).map_err(|e| e.to_string());
        assert_eq!(a, large.apply(index, op).map_err(|e| e.to_string()));
        assert!(a.is_ok(), "entry {index} refused at apply: {a:?}");
    }
    assert!(small.compaction_running());
    assert!(!large.compaction_running());
    let everything = |revision| RangeRequest {
        key: vec![0],
        range_end: vec![0],
        revision,
        ..RangeRequest::default()
    };
    for revision in [0, 7] {
        let a = small.range(&everything(revision)).unwrap();
        assert_eq!(a, large.range(&everything(revision)).unwrap());
        // 61 keys, 5 deleted, one put again.
        assert_eq!(a.count, 56 + i64::from(revision == 0));
    }
    for revision in [1, 6] {
        assert_eq!(
            small
                .range(&everything(revision))
                .map_err(|e| e.to_string()),
            large
                .range(&everything(revision))
                .map_err(|e| e.to_string())
        );
        assert!(small.range(&everything(revision)).is_err());
    }
    let mut steps = 0;
    while small.compaction_running() && steps < 3 {
        small.compaction_step().unwrap();
        steps += 1;
    }
    assert!(small.compaction_running(), "a key a step: still going");
    // A HashKV finishes the pass first: it leaves out what compaction drops.
    assert_eq!(small.hash_kv(0).unwrap(), large.hash_kv(0).unwrap());
    assert!(!small.compaction_running());
    small.commit().unwrap();
    large.commit().unwrap();
    assert_eq!(small.hash_kv(0).unwrap(), large.hash_kv(0).unwrap());
}

fn put_op(k: &str, v: &[u8]) -> Op {
    match put(k, v) {
        RequestOp::Put(p) => Op::Put(p),
        _ => unreachable!("put builds a put"),
    }
}

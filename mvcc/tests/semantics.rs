//! Guards etcd's KV semantics case by case, as etcd's own tests state them:
//! revisions and versions, range options (limit, more, count, count_only,
//! keys_only, sorting, revision filters, prefix and from-key), txn compares and
//! nested branches in one revision, leases, HashKV agreement, watch events,
//! streamed ranges and snapshot isolation while the writer goes on.
//! Compaction has its own file (`compaction.rs`).

mod common;

use cairn_mvcc::*;
use common::store::{cmp, keys, put_req, rr, TestStore as T};

#[test]
fn revisions_versions_and_generations() {
    let mut t = T::new();
    assert_eq!(t.store.current_revision(), 1);
    assert_eq!(t.put("a", "1").revision, 2);
    t.put("a", "2");
    let kv = t.store.get(b"a").unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    let d = t
        .apply(Op::DeleteRange(DeleteRangeRequest {
            key: "a".into(),
            prev_kv: true,
            ..Default::default()
        }))
        .unwrap();
    let OpResult::DeleteRange(d) = d else {
        panic!()
    };
    assert_eq!(
        (d.deleted, d.revision, d.prev_kvs[0].value.as_slice()),
        (1, 4, b"2".as_slice())
    );
    // Deleting nothing does not advance the revision.
    let OpResult::DeleteRange(d) = t
        .apply(Op::DeleteRange(DeleteRangeRequest {
            key: "a".into(),
            ..Default::default()
        }))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((d.deleted, d.revision), (0, 4));
    t.put("a", "3");
    let kv = t.store.get(b"a").unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (5, 5, 1));
    let old = t.range(RangeRequest {
        revision: 3,
        ..rr("a", "")
    });
    assert_eq!(old.kvs[0].value, b"2");
    assert_eq!(old.revision, 5, "header revision is the current one");
    assert!(t
        .range(RangeRequest {
            revision: 4,
            ..rr("a", "")
        })
        .kvs
        .is_empty());
    let r = t
        .apply(Op::Put(PutRequest {
            prev_kv: true,
            ..put_req("a", "4")
        }))
        .unwrap();
    let OpResult::Put(p) = r else { panic!() };
    assert_eq!(p.prev_kv.unwrap().value, b"3");
}

#[test]
fn put_flags_and_their_errors() {
    let mut t = T::new();
    let e = t
        .apply(Op::Put(PutRequest {
            ignore_value: true,
            ..put_req("x", "")
        }))
        .unwrap_err();
    assert_eq!(e.to_string(), "etcdserver: key not found");
    let e = t
        .apply(Op::Put(PutRequest {
            lease: 9,
            ..put_req("x", "v")
        }))
        .unwrap_err();
    assert_eq!(e.to_string(), "lease not found");
    t.apply(Op::LeaseGrant {
        id: 9,
        ttl_secs: 30,
    })
    .unwrap();
    t.apply(Op::Put(PutRequest {
        lease: 9,
        ..put_req("x", "v")
    }))
    .unwrap();
    t.apply(Op::Put(PutRequest {
        ignore_value: true,
        ..put_req("x", "")
    }))
    .unwrap();
    let kv = t.store.get(b"x").unwrap().unwrap();
    assert_eq!((kv.value.as_slice(), kv.lease), (b"v".as_slice(), 0));
    t.apply(Op::Put(PutRequest {
        lease: 9,
        ..put_req("x", "w")
    }))
    .unwrap();
    t.apply(Op::Put(PutRequest {
        ignore_lease: true,
        ..put_req("x", "z")
    }))
    .unwrap();
    let kv = t.store.get(b"x").unwrap().unwrap();
    assert_eq!((kv.value.as_slice(), kv.lease), (b"z".as_slice(), 9));
    assert!(matches!(
        t.apply(Op::Put(PutRequest {
            ignore_value: true,
            ..put_req("x", "v")
        })),
        Err(ApplyError::ValueProvided)
    ));
    assert!(matches!(
        t.apply(Op::Put(PutRequest {
            ignore_lease: true,
            lease: 9,
            ..put_req("x", "v")
        })),
        Err(ApplyError::LeaseProvided)
    ));
}

#[test]
fn range_options_follow_etcd() {
    let mut t = T::new();
    for (k, v) in [
        ("a", "3"),
        ("b", "1"),
        ("c", "2"),
        ("d", "0"),
        ("foo", "x"),
        ("foo/1", "y"),
        ("fop", "z"),
    ] {
        t.put(k, v);
    }
    t.put("b", "1b");
    // [key, end), prefix, from-key, all.
    assert_eq!(keys(&t.range(rr("a", "c"))), ["a", "b"]);
    assert_eq!(keys(&t.range(rr("foo", "fop"))), ["foo", "foo/1"]);
    assert_eq!(keys(&t.range(rr("d", "\0"))), ["d", "foo", "foo/1", "fop"]);
    assert_eq!(t.range(rr("\0", "\0")).count, 7);
    assert!(t.range(rr("c", "a")).kvs.is_empty());
    // limit, more, count.
    let r = t.range(RangeRequest {
        limit: 2,
        ..rr("a", "\0")
    });
    assert_eq!(
        (keys(&r), r.more, r.count),
        (vec!["a".to_string(), "b".into()], true, 7)
    );
    let r = t.range(RangeRequest {
        limit: 7,
        ..rr("a", "\0")
    });
    assert!(!r.more);
    // count_only and keys_only.
    let r = t.range(RangeRequest {
        count_only: true,
        ..rr("a", "\0")
    });
    assert_eq!((r.count, r.kvs.len()), (7, 0));
    let r = t.range(RangeRequest {
        keys_only: true,
        ..rr("a", "b")
    });
    assert!(r.kvs[0].value.is_empty() && r.kvs[0].key == b"a");
    // Sorting.
    let r = t.range(RangeRequest {
        sort_order: SortOrder::Descend,
        ..rr("a", "e")
    });
    assert_eq!(keys(&r), ["d", "c", "b", "a"]);
    let r = t.range(RangeRequest {
        sort_target: SortTarget::Value,
        ..rr("a", "e")
    });
    assert_eq!(
        keys(&r),
        ["d", "b", "c", "a"],
        "values 0 1b 2 3, ascending by default"
    );
    let r = t.range(RangeRequest {
        sort_target: SortTarget::Mod,
        sort_order: SortOrder::Descend,
        limit: 1,
        ..rr("a", "e")
    });
    assert_eq!(
        (keys(&r), r.more, r.count),
        (vec!["b".to_string()], true, 4)
    );
    let r = t.range(RangeRequest {
        sort_target: SortTarget::Version,
        sort_order: SortOrder::Descend,
        ..rr("a", "e")
    });
    assert_eq!(keys(&r)[0], "b");
    let r = t.range(RangeRequest {
        sort_target: SortTarget::Create,
        sort_order: SortOrder::Ascend,
        ..rr("a", "e")
    });
    assert_eq!(keys(&r), ["a", "b", "c", "d"]);
    let r = t.range(RangeRequest {
        sort_target: SortTarget::Value,
        keys_only: true,
        sort_order: SortOrder::Descend,
        ..rr("a", "e")
    });
    assert_eq!(keys(&r), ["a", "c", "b", "d"]);
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    // Revision filters prune after counting, as etcd does.
    let r = t.range(RangeRequest {
        min_mod_revision: 5,
        max_mod_revision: 7,
        ..rr("a", "\0")
    });
    assert_eq!(
        (keys(&r), r.count),
        (vec!["d".to_string(), "foo".into(), "foo/1".into()], 7)
    );
    let r = t.range(RangeRequest {
        min_create_revision: 3,
        max_create_revision: 3,
        ..rr("a", "\0")
    });
    assert_eq!(keys(&r), ["b"]);
    let r = t.range(RangeRequest {
        max_create_revision: 3,
        limit: 1,
        ..rr("a", "\0")
    });
    assert_eq!((keys(&r), r.more), (vec!["a".to_string()], true));
    // Errors.
    let e = t
        .store
        .range(&RangeRequest {
            revision: 100,
            ..rr("a", "")
        })
        .unwrap_err();
    assert_eq!(e.to_string(), FUTURE_REV_MSG);
    assert!(matches!(
        t.store.range(&rr("", "")),
        Err(ReadError::EmptyKey)
    ));
}

#[test]
fn txn_compares_branches_and_one_revision() {
    let mut t = T::new();
    t.put("a", "1");
    t.put("b", "2");
    let rev = t.store.current_revision();
    let r = t
        .txn(TxnRequest {
            compare: vec![
                cmp(
                    "a",
                    CompareTarget::Value(b"1".to_vec()),
                    CompareResult::Equal,
                ),
                cmp("a", CompareTarget::Version(0), CompareResult::Greater),
                cmp("b", CompareTarget::ModRevision(3), CompareResult::Equal),
                cmp("a", CompareTarget::CreateRevision(3), CompareResult::Less),
                cmp("a", CompareTarget::Lease(0), CompareResult::Equal),
                cmp("zz", CompareTarget::Version(0), CompareResult::Equal),
                cmp(
                    "a",
                    CompareTarget::Value(b"9".to_vec()),
                    CompareResult::NotEqual,
                ),
            ],
            success: vec![
                RequestOp::Put(put_req("c", "3")),
                RequestOp::DeleteRange(DeleteRangeRequest {
                    key: "a".into(),
                    ..Default::default()
                }),
                RequestOp::Range(rr("a", "\0")),
                RequestOp::Txn(TxnRequest {
                    compare: vec![cmp("c", CompareTarget::Version(0), CompareResult::Equal)],
                    success: vec![RequestOp::Put(put_req("d", "nested-ok"))],
                    failure: vec![RequestOp::Put(put_req("d", "nested-else"))],
                }),
            ],
            failure: vec![RequestOp::Put(put_req("e", "x"))],
        })
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(r.revision, rev + 1, "the whole txn is one revision");
    let ResponseOp::Range(inner) = &r.responses[2] else {
        panic!()
    };
    assert_eq!(keys(inner), ["b", "c"], "a txn reads its own writes");
    // Nested compares see the state before the txn: "c" did not exist yet.
    assert_eq!(t.store.get(b"d").unwrap().unwrap().value, b"nested-ok");
    let c = t.store.get(b"c").unwrap().unwrap();
    let d = t.store.get(b"d").unwrap().unwrap();
    assert_eq!((c.mod_revision, d.mod_revision), (rev + 1, rev + 1));
    // A value compare on a missing key fails; the failure branch runs.
    let r = t
        .txn(TxnRequest {
            compare: vec![cmp(
                "missing",
                CompareTarget::Value(Vec::new()),
                CompareResult::Equal,
            )],
            success: vec![],
            failure: vec![RequestOp::Range(rr("b", ""))],
        })
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(
        r.revision,
        rev + 1,
        "a read-only txn does not advance the revision"
    );
    // A range compare needs every key to match.
    let all = Compare {
        range_end: "\0".into(),
        ..cmp("b", CompareTarget::Version(1), CompareResult::Equal)
    };
    assert!(
        t.txn(TxnRequest {
            compare: vec![all],
            ..Default::default()
        })
        .unwrap()
        .succeeded
    );
    let e = t
        .txn(TxnRequest {
            success: vec![
                RequestOp::Put(put_req("k", "1")),
                RequestOp::Put(put_req("k", "2")),
            ],
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "etcdserver: duplicate key given in txn request"
    );
    let e = t
        .txn(TxnRequest {
            success: vec![
                RequestOp::DeleteRange(DeleteRangeRequest {
                    key: "a".into(),
                    range_end: "z".into(),
                    ..Default::default()
                }),
                RequestOp::Put(put_req("k", "2")),
            ],
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, ApplyError::DuplicateKey));
    // The op count is the API's limit (--max-txn-ops), not apply's: a
    // committed txn of any length is applied, in one revision.
    let many = (0..129)
        .map(|i| RequestOp::Put(put_req(&format!("k{i}"), "")))
        .collect();
    let before = t.store.current_revision();
    assert!(
        t.txn(TxnRequest {
            success: many,
            ..Default::default()
        })
        .unwrap()
        .succeeded
    );
    assert_eq!(t.store.current_revision(), before + 1);
    // A txn that fails its checks changes nothing, not even partly.
    let before = t.store.current_revision();
    let e = t.txn(TxnRequest {
        success: vec![
            RequestOp::Put(put_req("p", "1")),
            RequestOp::Put(PutRequest {
                lease: 77,
                ..put_req("q", "1")
            }),
        ],
        ..Default::default()
    });
    assert!(matches!(e, Err(ApplyError::LeaseNotFound { id: 77 })));
    assert_eq!(t.store.current_revision(), before);
    assert!(t.store.get(b"p").unwrap().is_none());
}

#[test]
fn leases_attach_detach_and_revoke_in_one_revision() {
    let mut t = T::new();
    t.apply(Op::LeaseGrant {
        id: 7,
        ttl_secs: 60,
    })
    .unwrap();
    assert!(matches!(
        t.apply(Op::LeaseGrant {
            id: 7,
            ttl_secs: 60
        }),
        Err(ApplyError::LeaseExists { id: 7 })
    ));
    for k in ["a", "b", "c"] {
        t.apply(Op::Put(PutRequest {
            lease: 7,
            ..put_req(k, "v")
        }))
        .unwrap();
    }
    t.put("b", "no lease now");
    t.apply(Op::LeaseCheckpoint {
        id: 7,
        remaining_ttl_secs: 42,
    })
    .unwrap();
    t.store.commit().unwrap();
    let l = t.store.lease(7).unwrap();
    assert_eq!(
        (l.ttl_secs, l.remaining_ttl_secs, l.keys.len()),
        (60, 42, 2)
    );
    let rev = t.store.current_revision();
    let OpResult::LeaseRevoke { revision, deleted } = t.apply(Op::LeaseRevoke { id: 7 }).unwrap()
    else {
        panic!()
    };
    assert_eq!((revision, deleted), (rev + 1, 2));
    assert!(t.store.get(b"a").unwrap().is_none());
    assert!(t.store.get(b"b").unwrap().is_some());
    assert!(t.store.lease(7).is_none());
    assert!(matches!(
        t.apply(Op::LeaseRevoke { id: 7 }),
        Err(ApplyError::LeaseNotFound { id: 7 })
    ));
    assert!(matches!(
        t.apply(Op::LeaseGrant { id: 0, ttl_secs: 1 }),
        Err(ApplyError::LeaseIdZero)
    ));
}

#[test]
fn negative_and_positive_lease_ids_commit_together_and_reopen() {
    let storage = MemStorage::new();
    let open = || Store::open_with(Box::new(storage.clone()), "leases", Config::default()).unwrap();
    let mut store = open();
    let ids = [-5i64, 9, i64::MIN, 3, -1];
    for (i, id) in ids.iter().enumerate() {
        store
            .apply(
                i as u64 + 1,
                &Op::LeaseGrant {
                    id: *id,
                    ttl_secs: 30,
                },
            )
            .unwrap();
    }
    store.commit().unwrap();
    store.apply(6, &Op::LeaseRevoke { id: -5 }).unwrap();
    store.commit().unwrap();
    drop(store);
    let store = open();
    let mut found: Vec<i64> = store.leases().iter().map(|l| l.id).collect();
    found.sort_unstable();
    assert_eq!(found, vec![i64::MIN, -1, 3, 9]);
    assert!(store.lease(-5).is_none());
    assert_eq!(store.lease(-1).unwrap().ttl_secs, 30);
}

#[test]
fn hash_kv_agrees_across_batching_and_stays_put_for_old_revisions() {
    let mut a = T::new();
    let mut b = T::new();
    for i in 0..300 {
        let op = Op::Put(put_req(&format!("k{}", i % 37), &format!("v{i}")));
        a.apply(op.clone()).unwrap();
        b.apply(op).unwrap();
        if i % 10 == 0 {
            a.store.commit().unwrap();
        }
        if i == 150 {
            a.apply(Op::Compact(CompactionRequest { revision: 100 }))
                .unwrap();
            b.apply(Op::Compact(CompactionRequest { revision: 100 }))
                .unwrap();
        }
    }
    assert_eq!(a.store.hash_kv(0).unwrap(), b.store.hash_kv(0).unwrap());
    let h250 = a.store.hash_kv(250).unwrap();
    a.put("k1", "changed");
    a.store.commit().unwrap();
    assert_eq!(a.store.hash_kv(250).unwrap().hash, h250.hash);
    assert_ne!(
        a.store.hash_kv(0).unwrap().hash,
        b.store.hash_kv(0).unwrap().hash
    );
}

#[test]
fn events_list_puts_and_deletes_in_revision_order() {
    let mut t = T::new();
    t.put("a", "1");
    t.store.commit().unwrap();
    t.put("b", "2");
    t.apply(Op::DeleteRange(DeleteRangeRequest {
        key: "a".into(),
        ..Default::default()
    }))
    .unwrap();
    let ev = t.store.events(2, 100).unwrap();
    let kinds: Vec<(EventKind, i64)> = ev.iter().map(|e| (e.kind, e.revision.main)).collect();
    assert_eq!(
        kinds,
        [
            (EventKind::Put, 2),
            (EventKind::Put, 3),
            (EventKind::Delete, 4)
        ]
    );
    assert_eq!(t.store.events(3, 1).unwrap().len(), 1);
}

#[test]
fn streamed_ranges_come_in_bounded_chunks_with_etcds_count_and_more() {
    let mut t = T::new();
    for i in 0..2500 {
        t.put(&format!("k{i:05}"), "v");
        if i % 500 == 0 {
            t.store.commit().unwrap();
        }
    }
    let mut s = t.store.snapshot().range_stream(rr("k", "l"), 1000).unwrap();
    let mut sizes = Vec::new();
    while let Some(c) = s.next_chunk().unwrap() {
        sizes.push(c.len());
    }
    assert_eq!(
        (sizes, s.count().unwrap(), s.more()),
        (vec![1000, 1000, 500], 2500, false)
    );
    let mut s = t
        .store
        .snapshot()
        .range_stream(
            RangeRequest {
                limit: 1500,
                ..rr("k", "l")
            },
            1000,
        )
        .unwrap();
    let mut got = Vec::new();
    while let Some(c) = s.next_chunk().unwrap() {
        got.extend(c);
    }
    assert_eq!((got.len(), s.more()), (1500, true));
    assert_eq!(got.last().unwrap().key, b"k01499");
    let mut s = t
        .store
        .snapshot()
        .range_stream(
            RangeRequest {
                sort_order: SortOrder::Descend,
                limit: 3,
                ..rr("k", "l")
            },
            2,
        )
        .unwrap();
    let first = s.next_chunk().unwrap().unwrap();
    let second = s.next_chunk().unwrap().unwrap();
    assert_eq!(
        (first[0].key.as_slice(), second.len()),
        (b"k02499".as_slice(), 1)
    );
    assert!(s.next_chunk().unwrap().is_none() && s.more());
    let r = t.store.snapshot().range_stream(
        RangeRequest {
            sort_target: SortTarget::Mod,
            ..rr("k", "l")
        },
        10,
    );
    assert!(matches!(r, Err(ReadError::NotStreamable(_))));
    // Counted in steps, the count is the snapshot's whatever is written
    // meanwhile; a step counts at least one key.
    let mut s = t.store.snapshot().range_stream(rr("k", "l"), 1000).unwrap();
    let mut counting = t.store.snapshot().range_stream(rr("k", "l"), 1000).unwrap();
    assert_eq!(counting.count_step(1_000).unwrap(), None);
    t.put("k00000", "again");
    t.put("k99999", "new key");
    t.apply(Op::DeleteRange(DeleteRangeRequest {
        key: "k01000".into(),
        range_end: "k01100".into(),
        ..DeleteRangeRequest::default()
    }))
    .unwrap();
    // A compaction at the snapshot's revision prunes history it does not
    // see.
    let snapshot_revision = counting.revision();
    t.apply(Op::Compact(CompactionRequest {
        revision: snapshot_revision,
    }))
    .unwrap();
    let mut steps = 1;
    while counting
        .count_step(if steps % 2 == 0 { 7 } else { 0 })
        .unwrap()
        .is_none()
    {
        steps += 1;
    }
    assert_eq!(counting.count().unwrap(), 2500);
    assert!(steps > 1500 / 7, "steps of 1 and 7 keys: {steps}");
    // Compaction past the stream's revision ends it, and its count, with
    // etcd's error.
    s.next_chunk().unwrap();
    t.put("k00000", "new");
    let cur = t.store.current_revision();
    t.apply(Op::Compact(CompactionRequest { revision: cur }))
        .unwrap();
    assert!(matches!(s.next_chunk(), Err(ReadError::Compacted { .. })));
    assert!(matches!(s.count_step(10), Err(ReadError::Compacted { .. })));
}

#[test]
fn a_snapshot_keeps_its_view_while_the_writer_overwrites_and_compacts() {
    let mut t = T::new();
    for i in 0..400 {
        t.put(&format!("k{i:03}"), &"old".repeat(50));
    }
    t.store.commit().unwrap();
    // A clone pins the same state: dropping the first leaves it readable.
    let first = t.store.snapshot();
    let snap = first.clone();
    drop(first);
    let at = snap.revision();
    for round in 0..5 {
        for i in 0..400 {
            t.put(&format!("k{i:03}"), &format!("new{round}").repeat(40));
        }
        t.store.commit().unwrap();
    }
    let r = snap.range(&rr("k", "l")).unwrap();
    assert_eq!(r.kvs.len(), 400);
    assert!(r
        .kvs
        .iter()
        .all(|kv| kv.value == "old".repeat(50).as_bytes() && kv.mod_revision <= at));
    // The writer's pages grew while the clone pinned the old ones...
    let pinned = t.store.size_in_use_bytes();
    drop(snap);
    let cur = t.store.current_revision();
    t.apply(Op::Compact(CompactionRequest { revision: cur }))
        .unwrap();
    t.store.commit().unwrap();
    t.store.commit().unwrap();
    // ...and are reused once it is gone and compaction dropped old revisions.
    assert!(
        t.store.size_in_use_bytes() < pinned / 2,
        "{} vs {pinned}",
        t.store.size_in_use_bytes()
    );
}

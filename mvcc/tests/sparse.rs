//! Guards `apply_at`, case by case: a shard of a keyspace with one revision
//! counter applies each entry at the revision it carries, so its revisions are
//! sparse. Reads, compactions, HashKV and events at revisions no write of the
//! shard has; entries that write nothing still reach their revision; every
//! revision an answer carries is the entry's; an entry at a revision already
//! reached is refused without harm; the reached revision survives commit and
//! reopen, a snapshot stream and its restore, and defragmenting; `apply`
//! after `apply_at` writes at the revision after the reached one; captured
//! changes carry the entries' revisions.

use cairn_mvcc::*;

struct T {
    store: Store,
    index: u64,
}

impl T {
    fn new() -> T {
        T {
            store: Store::open_with(Box::new(MemStorage::new()), "sparse", Config::default())
                .unwrap(),
            index: 0,
        }
    }
    fn at(&mut self, revision: i64, op: Op) -> Result<OpResult, ApplyError> {
        self.index += 1;
        self.store.apply_at(self.index, revision, &op)
    }
    fn put(&mut self, revision: i64, k: &str, v: &str) {
        let r = self.at(revision, put(k, v)).unwrap();
        assert_eq!(
            r,
            OpResult::Put(PutResponse {
                revision,
                prev_kv: None
            })
        );
    }
    fn read(&self, k: &str, end: &str, revision: i64) -> Result<RangeResponse, ReadError> {
        self.store.range(&RangeRequest {
            key: k.into(),
            range_end: end.into(),
            revision,
            ..RangeRequest::default()
        })
    }
    /// (key, value, mod revision) of every key at `revision`.
    fn all(&self, revision: i64) -> Vec<(String, String, i64)> {
        self.read("\0", "\0", revision)
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8(kv.key).unwrap(),
                    String::from_utf8(kv.value).unwrap(),
                    kv.mod_revision,
                )
            })
            .collect()
    }
}

fn put(k: &str, v: &str) -> Op {
    Op::Put(PutRequest {
        key: k.into(),
        value: v.into(),
        ..PutRequest::default()
    })
}

fn delete(k: &str, end: &str) -> Op {
    Op::DeleteRange(DeleteRangeRequest {
        key: k.into(),
        range_end: end.into(),
        prev_kv: false,
    })
}

fn kv(k: &str, v: &str, rev: i64) -> (String, String, i64) {
    (k.to_string(), v.to_string(), rev)
}

#[test]
fn reads_and_compaction_at_revisions_no_write_has() {
    let mut t = T::new();
    t.put(3, "a", "1");
    t.put(7, "b", "1");
    let r = t.at(12, delete("a", "")).unwrap();
    let OpResult::DeleteRange(d) = r else {
        panic!("{r:?}")
    };
    assert_eq!((d.deleted, d.revision), (1, 12));
    assert_eq!(t.store.current_revision(), 12);
    assert_eq!(t.all(1), vec![]);
    assert_eq!(t.all(2), vec![]);
    for at in 3..7 {
        assert_eq!(t.all(at), vec![kv("a", "1", 3)], "at {at}");
    }
    for at in 7..12 {
        assert_eq!(t.all(at), vec![kv("a", "1", 3), kv("b", "1", 7)], "at {at}");
    }
    assert_eq!(t.all(12), vec![kv("b", "1", 7)]);
    assert_eq!(t.all(0), vec![kv("b", "1", 7)]);
    assert_eq!(
        t.read("a", "", 9).unwrap().revision,
        12,
        "header: the reached revision"
    );
    let e = t.read("a", "", 13).unwrap_err();
    assert_eq!(
        e,
        ReadError::FutureRevision {
            revision: 13,
            current_revision: 12
        }
    );
    assert_eq!(e.to_string(), FUTURE_REV_MSG);

    // Compaction at 9, which no write has, keeps a@3 and b@7 as of 9.
    let r = t
        .at(15, Op::Compact(CompactionRequest { revision: 9 }))
        .unwrap();
    assert_eq!(r, OpResult::Compact(CompactionResponse { revision: 15 }));
    assert_eq!(
        (t.store.compact_revision(), t.store.current_revision()),
        (9, 15)
    );
    assert_eq!(t.all(9), vec![kv("a", "1", 3), kv("b", "1", 7)]);
    assert_eq!(t.all(14), vec![kv("b", "1", 7)]);
    let e = t.read("a", "", 8).unwrap_err();
    assert_eq!(e.to_string(), COMPACTED_MSG);
    // Compaction may name any revision before the entry's own, reached by
    // the store or not: nothing lies between 15 and 20 here.
    t.at(20, Op::Compact(CompactionRequest { revision: 19 }))
        .unwrap();
    assert_eq!(t.all(19), vec![kv("b", "1", 7)]);
    // The entry's own revision is in the future of the op.
    let e = t
        .at(21, Op::Compact(CompactionRequest { revision: 21 }))
        .unwrap_err();
    assert!(
        matches!(
            e,
            ApplyError::FutureRevision {
                revision: 21,
                current_revision: 20
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        t.store.current_revision(),
        21,
        "a refused entry still reaches its revision"
    );
    assert_eq!(t.store.compact_revision(), 19);
}

#[test]
fn an_entry_that_writes_nothing_still_reaches_its_revision() {
    let mut t = T::new();
    t.store.capture_changes(true);
    t.put(2, "a", "1");
    assert_eq!(t.store.take_changes().len(), 1);
    let failing = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Value(b"other".to_vec()),
            key: b"a".to_vec(),
            range_end: Vec::new(),
        }],
        success: vec![RequestOp::Put(PutRequest {
            key: b"b".to_vec(),
            ..PutRequest::default()
        })],
        failure: vec![RequestOp::Range(RangeRequest {
            key: b"a".to_vec(),
            ..RangeRequest::default()
        })],
    };
    let r = t.at(5, Op::Txn(failing)).unwrap();
    let OpResult::Txn(x) = r else { panic!("{r:?}") };
    assert!(!x.succeeded);
    assert_eq!(x.revision, 5);
    let ResponseOp::Range(rr) = &x.responses[0] else {
        panic!("{x:?}")
    };
    assert_eq!((rr.revision, rr.kvs[0].mod_revision), (5, 2));
    assert_eq!(t.store.current_revision(), 5);

    let steps: Vec<(i64, Op, OpResult)> = vec![
        (
            6,
            Op::LeaseGrant {
                id: 7,
                ttl_secs: 10,
            },
            OpResult::LeaseGrant { revision: 6 },
        ),
        (
            9,
            delete("zz", "\0"),
            OpResult::DeleteRange(DeleteRangeResponse {
                revision: 9,
                deleted: 0,
                prev_kvs: vec![],
            }),
        ),
        (
            10,
            Op::LeaseCheckpoint {
                id: 7,
                remaining_ttl_secs: 4,
            },
            OpResult::LeaseCheckpoint { revision: 10 },
        ),
        (
            11,
            Op::LeaseRevoke { id: 7 },
            OpResult::LeaseRevoke {
                revision: 11,
                deleted: 0,
            },
        ),
    ];
    for (rev, op, want) in steps {
        assert_eq!(t.at(rev, op.clone()).unwrap(), want, "{op:?}");
        assert_eq!(t.store.current_revision(), rev, "{op:?}");
    }
    // A request error is the entry's answer; the entry still reaches its revision.
    let e = t
        .at(
            14,
            Op::Put(PutRequest {
                lease: 99,
                ..PutRequest::default()
            }),
        )
        .unwrap_err();
    assert!(e.is_request_error(), "{e}");
    assert_eq!(
        (t.store.current_revision(), t.store.applied_index()),
        (14, t.index)
    );
    assert!(t.store.take_changes().is_empty(), "nothing was written");
    assert_eq!(t.store.events(3, 100).unwrap(), vec![]);
    assert_eq!(t.all(13), vec![kv("a", "1", 2)]);
}

#[test]
fn a_revision_already_reached_is_refused_without_harm() {
    let mut t = T::new();
    t.put(4, "a", "1");
    t.at(8, Op::LeaseGrant { id: 1, ttl_secs: 5 }).unwrap();
    let hash = t.store.hash_kv(0).unwrap();
    for stale in [8, 5, 4, 1, 0, -3] {
        let e = t
            .store
            .apply_at(t.index + 1, stale, &put("a", "2"))
            .unwrap_err();
        match &e {
            ApplyError::StaleRevision {
                revision,
                current_revision,
                ..
            } => assert_eq!((*revision, *current_revision), (stale, 8)),
            e => panic!("{e:?}"),
        }
        assert!(!e.is_request_error());
        assert_eq!(
            e.to_string(),
            format!("sparse: entry revision {stale} is not after the store's revision 8")
        );
        assert!(!t.store.is_poisoned());
        assert_eq!(t.store.applied_index(), t.index);
        assert_eq!(t.store.current_revision(), 8);
        assert_eq!(t.store.hash_kv(0).unwrap(), hash);
    }
    // The same index applies at a good revision.
    t.put(9, "a", "2");
    assert_eq!(t.all(0), vec![kv("a", "2", 9)]);
    t.store.commit().unwrap();
}

#[test]
fn txn_reads_and_compares_see_the_state_before_the_entry() {
    let mut t = T::new();
    t.put(2, "a", "1");
    let txn = |range_rev: i64| TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Greater,
            target: CompareTarget::Version(0),
            key: b"a".to_vec(),
            range_end: Vec::new(),
        }],
        success: vec![
            RequestOp::Put(PutRequest {
                key: b"a".to_vec(),
                value: b"2".to_vec(),
                ..PutRequest::default()
            }),
            RequestOp::Range(RangeRequest {
                key: b"a".to_vec(),
                revision: range_rev,
                ..RangeRequest::default()
            }),
        ],
        failure: vec![],
    };
    // The store has reached 2; the entry is at 10. A read at 9 lies past the
    // reached revision but before the entry: valid, and it sees a@2.
    let r = t.at(10, Op::Txn(txn(9))).unwrap();
    let OpResult::Txn(x) = r else { panic!("{r:?}") };
    assert!(x.succeeded);
    let ResponseOp::Range(rr) = &x.responses[1] else {
        panic!("{x:?}")
    };
    assert_eq!((rr.revision, rr.kvs[0].mod_revision), (10, 2));
    // A read at the entry's own revision is a future one for the txn.
    let e = t.at(20, Op::Txn(txn(20))).unwrap_err();
    assert!(
        matches!(e, ApplyError::FutureRevision { revision: 20, .. }),
        "{e:?}"
    );
    assert_eq!(t.store.current_revision(), 20);
    assert_eq!(t.all(0), vec![kv("a", "2", 10)]);
}

#[test]
fn hash_kv_and_events_across_gaps() {
    let mut t = T::new();
    t.put(3, "a", "1");
    t.put(7, "b", "1");
    t.at(12, delete("a", "")).unwrap();
    t.at(30, Op::LeaseGrant { id: 1, ttl_secs: 1 }).unwrap();
    let h = |t: &mut T, at: i64| t.store.hash_kv(at).unwrap();
    for at in 3..7 {
        assert_eq!(h(&mut t, at).hash, h(&mut t, 3).hash, "at {at}");
        assert_eq!(h(&mut t, at).hash_revision, at);
    }
    assert_ne!(h(&mut t, 7).hash, h(&mut t, 6).hash);
    assert_eq!(h(&mut t, 0).hash, h(&mut t, 12).hash);
    assert_eq!(
        (h(&mut t, 0).hash_revision, h(&mut t, 0).revision),
        (30, 30)
    );
    assert!(matches!(
        t.store.hash_kv(31),
        Err(ReadError::FutureRevision { .. })
    ));
    let revs = |t: &T, from: i64| -> Vec<i64> {
        t.store
            .events(from, 100)
            .unwrap()
            .iter()
            .map(|e| e.revision.main)
            .collect()
    };
    assert_eq!(revs(&t, 0), vec![3, 7, 12]);
    assert_eq!(revs(&t, 4), vec![7, 12]);
    assert_eq!(revs(&t, 8), vec![12]);
    assert_eq!(revs(&t, 13), Vec::<i64>::new());
    // A compaction at a gap keeps the newest version of each key at or below it.
    t.at(31, Op::Compact(CompactionRequest { revision: 10 }))
        .unwrap();
    assert_eq!(revs(&t, 10), vec![12]);
    assert!(matches!(
        t.store.events(9, 10),
        Err(ReadError::Compacted { .. })
    ));
    assert_eq!(t.all(10), vec![kv("a", "1", 3), kv("b", "1", 7)]);
}

#[test]
fn apply_after_apply_at_writes_at_the_revision_after_the_reached_one() {
    let mut t = T::new();
    t.put(5, "a", "1");
    t.at(9, Op::LeaseGrant { id: 1, ttl_secs: 1 }).unwrap();
    t.index += 1;
    let r = t.store.apply(t.index, &put("b", "1")).unwrap();
    assert_eq!(
        r,
        OpResult::Put(PutResponse {
            revision: 10,
            prev_kv: None
        })
    );
    t.index += 1;
    let r = t.store.apply(t.index, &delete("zz", "")).unwrap();
    let OpResult::DeleteRange(d) = r else {
        panic!("{r:?}")
    };
    assert_eq!(
        d.revision, 10,
        "apply writing nothing stays at the store's revision"
    );
    assert_eq!(t.store.current_revision(), 10);
}

#[test]
fn the_reached_revision_survives_commit_reopen_restore_and_defragment() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 1, Config::default()).unwrap();
    let value = vec![7u8; 3000];
    for i in 0..200i64 {
        let op = Op::Put(PutRequest {
            key: format!("k{}", i % 40).into_bytes(),
            value: value.clone(),
            ..PutRequest::default()
        });
        store.apply_at(i as u64 + 1, 10 + i * 3, &op).unwrap();
    }
    // The last entries write nothing.
    store
        .apply_at(201, 700, &Op::Compact(CompactionRequest { revision: 650 }))
        .unwrap();
    store.apply_at(202, 800, &delete("none", "")).unwrap();
    store.commit().unwrap();
    store.sync().unwrap();
    let hash = store.hash_kv(0).unwrap();
    assert_eq!(hash.revision, 800);
    drop(store);

    let mut store = Store::open(dir.path(), 1, Config::default()).unwrap();
    assert_eq!(
        (
            store.current_revision(),
            store.compact_revision(),
            store.applied_index()
        ),
        (800, 650, 202)
    );
    assert_eq!(store.hash_kv(0).unwrap(), hash);
    assert_eq!(store.hash_kv(790).unwrap().hash, hash.hash);

    let stream = store.snapshot_stream();
    assert_eq!(stream.revision(), 800);
    let chunks: Vec<Vec<u8>> = stream.map(|c| c.unwrap()).collect();
    let other = tempfile::tempdir().unwrap();
    let mut restored = Store::restore(other.path(), 1, Config::default(), chunks).unwrap();
    assert_eq!(
        (restored.current_revision(), restored.compact_revision()),
        (800, 650)
    );
    assert_eq!(restored.hash_kv(0).unwrap(), hash);
    drop(restored);
    let restored = Store::open(other.path(), 1, Config::default()).unwrap();
    assert_eq!(restored.current_revision(), 800);

    store.apply_at(203, 900, &delete("k", "\0")).unwrap();
    store
        .apply_at(204, 950, &Op::Compact(CompactionRequest { revision: 940 }))
        .unwrap();
    let before = store.size_bytes();
    store.defragment().unwrap();
    assert!(store.size_bytes() < before, "defragment shrank nothing");
    assert_eq!(store.current_revision(), 950);
    drop(store);
    let store = Store::open(dir.path(), 1, Config::default()).unwrap();
    assert_eq!(
        (
            store.current_revision(),
            store.compact_revision(),
            store.key_count()
        ),
        (950, 940, 0)
    );
    assert!(matches!(
        store.range(&RangeRequest {
            key: b"k".to_vec(),
            revision: 951,
            ..RangeRequest::default()
        }),
        Err(ReadError::FutureRevision { .. })
    ));
}

#[test]
fn captured_changes_and_snapshots_carry_the_entries_revisions() {
    let mut t = T::new();
    t.store.capture_changes(true);
    t.put(4, "a", "1");
    t.at(9, delete("a", "")).unwrap();
    t.at(11, Op::LeaseGrant { id: 1, ttl_secs: 1 }).unwrap();
    let revs: Vec<(i64, i64)> = t
        .store
        .take_changes()
        .iter()
        .map(|c| (c.revision().main, c.kv().mod_revision))
        .collect();
    assert_eq!(revs, vec![(4, 4), (9, 9)]);
    let snap = t.store.snapshot();
    assert_eq!(snap.revision(), 11);
    t.put(15, "b", "1");
    let r = snap
        .range(&RangeRequest {
            key: b"a".to_vec(),
            revision: 6,
            ..RangeRequest::default()
        })
        .unwrap();
    assert_eq!((r.revision, r.kvs.len()), (11, 1));
    let mut stream = snap
        .range_stream(
            RangeRequest {
                key: vec![0],
                range_end: vec![0],
                revision: 10,
                ..RangeRequest::default()
            },
            1,
        )
        .unwrap();
    assert_eq!((stream.revision(), stream.count().unwrap()), (11, 0));
    assert_eq!(stream.next_chunk().unwrap(), None);
}

/// Parts of several txns in one entry: each lands at its own revision, in
/// order; a part at a revision already reached is refused alone; the entry's
/// index is applied once, and the store is at the last part's revision.
#[test]
fn the_parts_of_one_entry_land_each_at_its_own_revision() {
    let mut t = T::new();
    t.put(10, "a", "0");
    let (first, second, stale) = (put("a", "1"), put("b", "1"), put("c", "1"));
    let answers = t
        .store
        .apply_parts_at(
            2,
            &[(20, &first, &[]), (15, &stale, &[]), (30, &second, &[])],
        )
        .unwrap();
    assert!(matches!(
        answers[0],
        Ok(OpResult::Put(PutResponse { revision: 20, .. }))
    ));
    assert!(matches!(
        answers[1],
        Err(ApplyError::StaleRevision { revision: 15, .. })
    ));
    assert!(matches!(
        answers[2],
        Ok(OpResult::Put(PutResponse { revision: 30, .. }))
    ));
    assert_eq!(t.store.applied_index(), 2);
    assert_eq!(t.store.current_revision(), 30);
    assert_eq!(t.all(20), vec![kv("a", "1", 20)]);
    assert_eq!(t.all(29), vec![kv("a", "1", 20)]);
    assert_eq!(t.all(30), vec![kv("a", "1", 20), kv("b", "1", 30)]);
    // The index is taken: the entry again, or an older one, is refused whole.
    assert!(matches!(
        t.store.apply_parts_at(2, &[(40, &stale, &[])]),
        Err(ApplyError::StaleIndex { .. })
    ));
    t.index = 2;
    t.put(40, "c", "2");
    assert_eq!(t.all(40).len(), 3);
}

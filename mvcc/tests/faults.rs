//! Guards the handling of bad input and faults: a torn newest meta page falls
//! back to the older one; two bad metas or a failed page check stop the open
//! with an error naming the file and page; a write or sync error poisons the
//! store until reopened; a full disk is reported as such; a second opener is
//! locked out; damaged or incomplete snapshot streams are refused; keys and
//! values of any bytes and sizes up to the store's format limit round-trip;
//! a stalled background sync defers commits instead of blocking the applier,
//! and a failed one still surfaces.

use cairn_mvcc::*;

fn put(key: &[u8], value: &[u8]) -> Op {
    Op::Put(PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..PutRequest::default()
    })
}

fn get(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
    store.get(key).unwrap().map(|kv| kv.value)
}

fn open(storage: &MemStorage) -> Result<Store, OpenError> {
    Store::open_with(
        Box::new(storage.clone()),
        "mem://shard-0",
        Config::default(),
    )
}

#[test]
fn torn_newest_meta_falls_back_to_the_previous_commit() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    store.apply(1, &put(b"a", b"1")).unwrap();
    store.commit().unwrap();
    store.apply(2, &put(b"a", b"2")).unwrap();
    store.commit().unwrap();
    drop(store);
    // Creation wrote txn 1 to page 1; the commits wrote page 0 then page 1.
    storage.corrupt(PAGE_SIZE_BYTES as u64 + 40, &[0xAB; 8]);
    let store = open(&storage).unwrap();
    assert_eq!(store.applied_index(), 1);
    assert_eq!(get(&store, b"a").unwrap(), b"1");
}

#[test]
fn both_metas_bad_names_file_and_pages() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    store.apply(1, &put(b"a", b"1")).unwrap();
    store.commit().unwrap();
    drop(store);
    storage.corrupt(40, &[1; 4]);
    storage.corrupt(PAGE_SIZE_BYTES as u64 + 40, &[1; 4]);
    let err = open(&storage).err().expect("open must fail").to_string();
    assert!(
        err.contains("mem://shard-0") && err.contains("page 0") && err.contains("page 1"),
        "{err}"
    );
}

#[test]
fn a_failed_page_check_stops_the_open_naming_file_and_page() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    store.apply(1, &put(b"a", b"1")).unwrap();
    store.commit().unwrap();
    drop(store);
    // The first tree page is the root leaf holding "a".
    storage.corrupt(2 * PAGE_SIZE_BYTES as u64 + 300, &[0x5A]);
    let err = open(&storage).err().expect("open must fail");
    assert!(
        matches!(err, OpenError::Corrupt(CorruptPage { page: 2, .. })),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("mem://shard-0") && msg.contains("page 2") && msg.contains("checksum"),
        "{msg}"
    );
}

#[test]
fn a_write_error_poisons_until_reopened() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    store.apply(1, &put(b"a", b"1")).unwrap();
    store.commit().unwrap();
    store.apply(2, &put(b"a", b"2")).unwrap();
    storage.fail_next_write();
    let err = store.commit().unwrap_err();
    assert!(err.to_string().contains("mem://shard-0"), "{err}");
    assert!(store.is_poisoned());
    assert!(matches!(
        store.apply(3, &put(b"b", b"x")),
        Err(ApplyError::Poisoned { .. })
    ));
    assert!(matches!(store.commit(), Err(CommitError::Poisoned { .. })));
    drop(store);
    let store = open(&storage).unwrap();
    assert_eq!(store.applied_index(), 1);
    assert_eq!(get(&store, b"a").unwrap(), b"1");
}

#[test]
fn a_sync_error_poisons_until_reopened() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    store.apply(1, &put(b"a", b"1")).unwrap();
    storage.fail_next_sync();
    assert!(store.commit().is_err());
    assert!(matches!(
        store.apply(2, &put(b"b", b"x")),
        Err(ApplyError::Poisoned { .. })
    ));
    drop(store);
    let store = open(&storage).unwrap();
    assert_eq!(store.applied_index(), 0);
    assert_eq!(get(&store, b"a"), None);
}

#[test]
fn a_full_disk_is_reported_as_no_space() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    storage.set_space_limit(Some(2 * PAGE_SIZE_BYTES as u64));
    store.apply(1, &put(b"a", &[7u8; 5000])).unwrap();
    let err = store.commit().unwrap_err();
    assert!(err.is_no_space(), "{err}");
    assert!(err.to_string().contains("no space left"), "{err}");
    drop(store);
    storage.set_space_limit(None);
    let mut store = open(&storage).unwrap();
    store.apply(1, &put(b"a", &[7u8; 5000])).unwrap();
    store.commit().unwrap();
}

#[test]
fn a_second_opener_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 3, Config::default()).unwrap();
    let err = Store::open(dir.path(), 3, Config::default())
        .err()
        .expect("locked");
    assert!(matches!(err, OpenError::Locked { .. }), "{err:?}");
    assert!(err.to_string().contains("shard-3.mvcc"), "{err}");
    // Another shard in the same directory is a different file.
    let other = Store::open(dir.path(), 4, Config::default()).unwrap();
    drop((store, other));
    Store::open(dir.path(), 3, Config::default()).unwrap();
    let lock = DirLock::acquire(dir.path()).unwrap();
    assert!(matches!(
        DirLock::acquire(dir.path()),
        Err(OpenError::Locked { .. })
    ));
    drop(lock);
    DirLock::acquire(dir.path()).unwrap();
}

#[test]
fn damaged_or_incomplete_snapshot_streams_are_refused() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    for i in 0..50u64 {
        store
            .apply(i + 1, &put(format!("k{i}").as_bytes(), &[i as u8; 100]))
            .unwrap();
    }
    store.commit().unwrap();
    let chunks: Vec<Vec<u8>> = store.snapshot_stream().map(|c| c.unwrap()).collect();
    assert!(chunks.len() >= 3);

    let mut bad = chunks.clone();
    let n = bad[1].len();
    bad[1][n - 1] ^= 1;
    let r = Store::restore_with(
        Box::new(MemStorage::new()),
        "restore",
        Config::default(),
        bad,
    );
    assert!(
        matches!(r, Err(SnapshotError::BadChunk { seq: 1, .. })),
        "{:?}",
        r.err()
    );

    let target = MemStorage::new();
    let short = chunks[..chunks.len() - 1].to_vec();
    let r = Store::restore_with(
        Box::new(target.clone()),
        "restore",
        Config::default(),
        short,
    );
    assert!(
        matches!(r, Err(SnapshotError::Incomplete { .. })),
        "{:?}",
        r.err()
    );
    // The half-restored file refuses to open as a store.
    let r = Store::open_with(Box::new(target), "restore", Config::default());
    assert!(
        matches!(r, Err(OpenError::IncompleteRestore { .. })),
        "{:?}",
        r.err()
    );

    let r = Store::restore_with(
        Box::new(storage.clone()),
        "restore",
        Config::default(),
        chunks.clone(),
    );
    assert!(
        matches!(r, Err(SnapshotError::TargetNotEmpty { .. })),
        "{:?}",
        r.err()
    );

    let mut restored = Store::restore_with(
        Box::new(MemStorage::new()),
        "restore",
        Config::default(),
        chunks,
    )
    .unwrap();
    assert_eq!(restored.hash_kv(0).unwrap(), store.hash_kv(0).unwrap());
    assert_eq!(restored.applied_index(), 50);
}

#[test]
fn any_bytes_and_sizes_up_to_the_limit_round_trip() {
    let storage = MemStorage::new();
    let mut store = open(&storage).unwrap();
    let binary_key: Vec<u8> = (0..=255u8).collect();
    // Above etcd's default request limit: that limit is the API's; the
    // store refuses only what its format cannot hold.
    let big = vec![0xC3u8; 2 << 20];
    store.apply(1, &put(&binary_key, b"")).unwrap();
    store.apply(2, &put(b"big", &big)).unwrap();
    store.apply(3, &put(b"\x00", &[0, 1, 2, 255])).unwrap();
    let too_big = vec![1u8; MAX_REQUEST_BYTES_LIMIT];
    assert!(matches!(
        store.apply(4, &put(b"k", &too_big)),
        Err(ApplyError::RequestTooLarge { .. })
    ));
    assert!(matches!(
        store.apply(5, &put(b"", b"v")),
        Err(ApplyError::EmptyKey)
    ));
    store.commit().unwrap();
    drop(store);
    let mut store = open(&storage).unwrap();
    assert_eq!(get(&store, &binary_key).unwrap(), b"");
    assert_eq!(get(&store, b"big").unwrap(), big);
    assert_eq!(get(&store, b"\x00").unwrap(), vec![0, 1, 2, 255]);
    // Overwriting and compacting the big value frees its overflow pages.
    store.apply(6, &put(b"big", b"small")).unwrap();
    let rev = store.current_revision();
    store
        .apply(7, &Op::Compact(CompactionRequest { revision: rev }))
        .unwrap();
    store.commit().unwrap();
    store.commit().unwrap();
    assert!(
        store.size_in_use_bytes() < 64 * 1024,
        "{}",
        store.size_in_use_bytes()
    );
}

/// A store on a real file whose syncs obey the control file `faults`.
fn open_with_sync_faults(dir: &std::path::Path) -> Store {
    let cfg = Config {
        sync_faults: Some(dir.join("faults")),
        ..Config::default()
    };
    Store::open(dir, 0, cfg).unwrap()
}

#[test]
fn a_stalled_syncer_defers_commits_and_they_land_once_it_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("faults");
    let mut store = open_with_sync_faults(dir.path());
    std::fs::write(&control, "store-stall 2000").unwrap();
    // Many more commits than the syncer's queue holds, while its first sync
    // sleeps: the ones past the queue are left pending, not waited for.
    for i in 1..=64u64 {
        store
            .apply(i, &put(format!("k{i}").as_bytes(), b"v"))
            .unwrap();
        store.commit_unless_busy().unwrap();
    }
    assert!(
        store.commit_stats().deferred > 0,
        "no commit was deferred: {:?}",
        store.commit_stats()
    );
    assert_eq!(
        get(&store, b"k64").as_deref(),
        Some(&b"v"[..]),
        "reads see pending changes"
    );
    std::fs::write(&control, "none").unwrap();
    // Bounded by progress: the syncer drains, then the deferred changes commit.
    let mut rounds = 0;
    while store.committed_index() < 64 {
        store.commit_unless_busy().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        rounds += 1;
        assert!(rounds < 2_000, "the deferred commit never landed");
    }
    store.sync().unwrap();
    drop(store);
    let store = open_with_sync_faults(dir.path());
    assert_eq!(store.applied_index(), 64);
    assert_eq!(get(&store, b"k1").as_deref(), Some(&b"v"[..]));
}

#[test]
fn a_discarded_store_does_not_wait_for_its_stalled_syncer_and_a_dropped_one_does() {
    let stall = std::time::Duration::from_millis(1500);
    for discard in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("faults");
        let mut store = open_with_sync_faults(dir.path());
        std::fs::write(&control, format!("store-stall {}", stall.as_millis())).unwrap();
        store.apply(1, &put(b"k", b"v")).unwrap();
        // The syncer takes the commit and sleeps in its sync. A new file has
        // no room yet: the first try asks the syncer to grow it and waits
        // for a later one.
        let mut tries = 0;
        while !store.commit_unless_busy().unwrap() {
            tries += 1;
            assert!(tries < 2_000, "the commit never went to the syncer");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let started = std::time::Instant::now();
        if discard {
            store.discard();
            assert!(
                started.elapsed() < stall / 2,
                "discard waited {:?} for a sync stalled {stall:?}",
                started.elapsed()
            );
        } else {
            drop(store);
            assert!(
                started.elapsed() >= stall / 2,
                "drop returned after {:?}, before the stalled sync ended",
                started.elapsed()
            );
        }
    }
}

#[test]
fn a_failed_sync_is_reported_not_deferred_forever() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("faults");
    let mut store = open_with_sync_faults(dir.path());
    std::fs::write(&control, "store-error").unwrap();
    let mut failed = None;
    for i in 1..=2_000u64 {
        store.apply(i, &put(b"k", b"v")).unwrap();
        if let Err(e) = store.commit_unless_busy() {
            failed = Some(e);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let e = failed.expect("the failed sync never surfaced");
    assert!(e.to_string().contains("Input/output error"), "{e}");
    assert!(store.is_poisoned());
}

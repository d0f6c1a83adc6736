//! Guards the store's pending cross-shard txn records: they survive close and
//! reopen, and their pages stay in use across a reopen (were they counted
//! free, later commits would overwrite them); puts and removes within one
//! batch are seen at once and land as their net result; they leave HashKV
//! alone; a snapshot stream carries them to the restored store, and a stream
//! of the previous format (none) still restores; defragmenting moves their
//! pages and keeps them; a file of format 1 (no txn record tree) opens with
//! none and takes them from its next commit on; a 2 MiB record round-trips.
//! Atomicity with the entry they were put for, at every crash point, is
//! guarded by `crash.rs`.

use cairn_mvcc::*;

fn put(key: &[u8], value: &[u8]) -> Op {
    Op::Put(PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..PutRequest::default()
    })
}

/// Bytes that differ from record to record and from offset to offset.
fn record(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn open_mem(storage: &MemStorage) -> Store {
    Store::open_with(
        Box::new(storage.clone()),
        "mem://shard-0",
        Config::default(),
    )
    .unwrap()
}

#[test]
fn records_survive_reopen_and_their_pages_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
    store.apply_at(1, 10, &put(b"a", b"1")).unwrap();
    let hash = store.hash_kv(0).unwrap();
    store.put_txn_record(10, &record(1, 300));
    store.put_txn_record(-4, &record(2, 5000));
    store.put_txn_record(7, &[]);
    assert_eq!(store.hash_kv(0).unwrap(), hash, "records are not keys");
    store.commit().unwrap();
    store.apply_at(2, 12, &put(b"b", b"2")).unwrap();
    store.put_txn_record(12, &record(3, 9000));
    store.remove_txn_record(7);
    store.commit().unwrap();
    store.sync().unwrap();
    let want = vec![
        (-4, record(2, 5000)),
        (10, record(1, 300)),
        (12, record(3, 9000)),
    ];
    assert_eq!(store.txn_records(), want);
    let hash = store.hash_kv(0).unwrap();
    drop(store);

    let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
    assert_eq!(store.txn_records(), want);
    assert_eq!(store.hash_kv(0).unwrap(), hash);
    assert_eq!(store.applied_index(), 2);
    // Enough writes to take every page the open counted free, and more.
    let value = vec![0x5Au8; 3000];
    for i in 0..400u64 {
        let op = put(format!("k{}", i % 50).as_bytes(), &value);
        store.apply_at(3 + i, 20 + i as i64, &op).unwrap();
        if i % 40 == 39 {
            store.commit().unwrap();
        }
    }
    store.commit().unwrap();
    store.sync().unwrap();
    drop(store);
    let store = Store::open(dir.path(), 0, Config::default()).unwrap();
    assert_eq!(store.txn_records(), want);
}

#[test]
fn puts_and_removes_within_one_batch_are_seen_at_once_and_land_as_their_net_result() {
    let storage = MemStorage::new();
    let mut store = open_mem(&storage);
    assert!(store.txn_records().is_empty());
    store.remove_txn_record(3);
    assert!(
        !store.commit().unwrap(),
        "removing no record changes nothing"
    );

    store.put_txn_record(5, b"five");
    store.put_txn_record(3, b"three");
    assert_eq!(
        store.txn_records(),
        vec![(3, b"three".to_vec()), (5, b"five".to_vec())]
    );
    store.remove_txn_record(5);
    store.put_txn_record(3, b"three again");
    store.put_txn_record(8, &record(4, 2000));
    store.remove_txn_record(8);
    assert_eq!(store.txn_records(), vec![(3, b"three again".to_vec())]);
    assert!(
        store.commit().unwrap(),
        "a record alone is a change to commit"
    );
    drop(store);

    let mut store = open_mem(&storage);
    assert_eq!(store.txn_records(), vec![(3, b"three again".to_vec())]);
    store.put_txn_record(9, b"nine");
    store.remove_txn_record(3);
    store.remove_txn_record(9);
    assert!(store.txn_records().is_empty());
    store.commit().unwrap();
    drop(store);
    assert!(open_mem(&storage).txn_records().is_empty());
}

// A snapshot stream chunk: "CSNP", kind u8, seq u64, length u32, crc u32, payload.
const CHUNK_KIND_OFFSET: usize = 4;
const CHUNK_LEN_OFFSET: usize = CHUNK_KIND_OFFSET + size_of::<u8>() + size_of::<u64>();
const CHUNK_CRC_OFFSET: usize = CHUNK_LEN_OFFSET + size_of::<u32>();
const CHUNK_PAYLOAD_OFFSET: usize = CHUNK_CRC_OFFSET + size_of::<u32>();
// The header payload: applied index, revision, compact revision, format u32.
const HEADER_FORMAT_OFFSET: usize = 3 * size_of::<u64>();

/// Rewrites a chunk of a snapshot stream with `payload`, sealing it again.
fn rechunk(chunk: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut b = chunk[..CHUNK_PAYLOAD_OFFSET].to_vec();
    b[CHUNK_LEN_OFFSET..CHUNK_CRC_OFFSET].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(payload);
    let mut h = crc32fast::Hasher::new();
    h.update(&b[CHUNK_KIND_OFFSET..CHUNK_CRC_OFFSET]);
    h.update(payload);
    b[CHUNK_CRC_OFFSET..CHUNK_PAYLOAD_OFFSET].copy_from_slice(&h.finalize().to_le_bytes());
    b
}

/// The header chunk `chunk` rewritten to claim stream format `format`.
fn with_format(chunk: &[u8], format: u32) -> Vec<u8> {
    let mut header = chunk[CHUNK_PAYLOAD_OFFSET..].to_vec();
    header[HEADER_FORMAT_OFFSET..].copy_from_slice(&format.to_le_bytes());
    rechunk(chunk, &header)
}

#[test]
fn a_snapshot_stream_carries_the_records_to_the_restored_store() {
    // Small chunks: records share chunks, and the large one overflows its own.
    let cfg = Config {
        snapshot_chunk_bytes: 4096,
        ..Config::default()
    };
    let mut store =
        Store::open_with(Box::new(MemStorage::new()), "mem://shard-0", cfg.clone()).unwrap();
    for i in 0..40u64 {
        let op = put(format!("k{i}").as_bytes(), &[7; 200]);
        store.apply_at(i + 1, 2 * i as i64 + 2, &op).unwrap();
    }
    store.put_txn_record(20, &record(1, 300));
    store.put_txn_record(40, &record(9, 2 * 1024 * 1024));
    store.put_txn_record(-1, b"negative");
    for id in 100..110 {
        store.put_txn_record(id, &record(id as u8, 700));
    }
    store.commit().unwrap();
    // Pending changes are in the stream too.
    store.put_txn_record(60, &record(2, 6000));
    store.remove_txn_record(20);
    let want = store.txn_records();
    assert_eq!(want.len(), 13);
    let hash = store.hash_kv(0).unwrap();
    let stream = store.snapshot_stream();
    // Changes after the stream was taken are not in it.
    store.remove_txn_record(40);
    store.put_txn_record(60, b"replaced");
    store.put_txn_record(70, b"added");
    store.commit().unwrap();
    let chunks: Vec<Vec<u8>> = stream.map(|c| c.unwrap()).collect();

    let target = MemStorage::new();
    let mut restored = Store::restore_with(
        Box::new(target.clone()),
        "restore",
        cfg.clone(),
        chunks.clone(),
    )
    .unwrap();
    assert_eq!(restored.txn_records(), want);
    assert_eq!(restored.hash_kv(0).unwrap(), hash);
    drop(restored);
    let reopened = Store::open_with(Box::new(target), "restore", cfg.clone()).unwrap();
    assert_eq!(reopened.txn_records(), want);

    // A stream of format 1 with txn records in it is not a stream at all.
    let mut bad = chunks;
    bad[0] = with_format(&bad[0], 1);
    let r = Store::restore_with(Box::new(MemStorage::new()), "restore", cfg, bad);
    assert!(
        matches!(r, Err(SnapshotError::BadChunk { ref what, .. }) if what.contains("format 1")),
        "{:?}",
        r.err()
    );
}

#[test]
fn a_snapshot_stream_of_format_1_restores_with_no_records() {
    let storage = MemStorage::new();
    let mut store = open_mem(&storage);
    for i in 0..30u64 {
        store
            .apply(i + 1, &put(format!("k{i}").as_bytes(), &[3; 100]))
            .unwrap();
    }
    store.commit().unwrap();
    let mut chunks: Vec<Vec<u8>> = store.snapshot_stream().map(|c| c.unwrap()).collect();
    // What a member of the previous version sends: format 1 in the header,
    // no txn record count in the end chunk.
    chunks[0] = with_format(&chunks[0], 1);
    let last = chunks.len() - 1;
    let end = chunks[last][CHUNK_PAYLOAD_OFFSET..].to_vec();
    assert_eq!(end.len(), 24);
    chunks[last] = rechunk(&chunks[last], &end[..16]);
    let mut restored = Store::restore_with(
        Box::new(MemStorage::new()),
        "restore",
        Config::default(),
        chunks,
    )
    .unwrap();
    assert!(restored.txn_records().is_empty());
    assert_eq!(restored.hash_kv(0).unwrap(), store.hash_kv(0).unwrap());
}

#[test]
fn defragment_moves_the_records_pages_and_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        grow_min_bytes: 64 * 1024,
        ..Config::default()
    };
    let mut store = Store::open(dir.path(), 0, cfg.clone()).unwrap();
    let value = vec![0x42u8; 3000];
    let mut index = 0u64;
    for i in 0..2000u64 {
        index += 1;
        let op = put(format!("k{i:05}").as_bytes(), &value);
        store.apply(index, &op).unwrap();
        if i % 200 == 199 {
            store.commit().unwrap();
        }
    }
    // The records' pages go after all of those, at the end of the file.
    store.put_txn_record(5, &record(5, 2 * 1024 * 1024));
    store.put_txn_record(6, &record(6, 400));
    store.commit().unwrap();
    index += 1;
    let delete = Op::DeleteRange(DeleteRangeRequest {
        key: b"k".to_vec(),
        range_end: vec![0],
        prev_kv: false,
    });
    store.apply(index, &delete).unwrap();
    index += 1;
    let revision = store.current_revision();
    store
        .apply(index, &Op::Compact(CompactionRequest { revision }))
        .unwrap();
    store.commit().unwrap();
    store.sync().unwrap();
    let want = store.txn_records();
    let report = store.defragment().unwrap();
    assert!(
        report.file_bytes_before > 8 * 1024 * 1024,
        "{report:?}: the file never held the keys"
    );
    // Little more than the 2 MiB record stays; had its pages stayed at the
    // end, nothing could have been cut.
    assert!(report.file_bytes_after < 3 * 1024 * 1024, "{report:?}");
    assert_eq!(store.txn_records(), want);
    drop(store);
    let store = Store::open(dir.path(), 0, cfg).unwrap();
    assert_eq!(store.txn_records(), want);
    assert_eq!(store.key_count(), 0);
}

/// Rewrites the meta page of `slot` in `image` as format 1 wrote it: version
/// 1, no txn root, CRC over bytes 4..84.
fn write_format_1_meta(image: &mut [u8], slot: usize) {
    const VERSION_OFFSET: usize = 32;
    const TXN_ROOT_OFFSET: usize = 84;
    const META_END_V1: usize = TXN_ROOT_OFFSET;
    let page = &mut image[slot * PAGE_SIZE_BYTES..(slot + 1) * PAGE_SIZE_BYTES];
    assert_eq!(page[VERSION_OFFSET..VERSION_OFFSET + 4], 2u32.to_le_bytes());
    assert_eq!(
        page[TXN_ROOT_OFFSET..TXN_ROOT_OFFSET + 8],
        [0; 8],
        "format 1 has no txn record tree"
    );
    page[VERSION_OFFSET..VERSION_OFFSET + 4].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32fast::hash(&page[4..META_END_V1]);
    page[..4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn a_format_1_file_opens_with_no_records_and_takes_them_from_its_next_commit() {
    let storage = MemStorage::new();
    let mut store = open_mem(&storage);
    store
        .apply(
            1,
            &Op::LeaseGrant {
                id: 3,
                ttl_secs: 60,
            },
        )
        .unwrap();
    for i in 0..50u64 {
        let op = Op::Put(PutRequest {
            key: format!("k{i}").into_bytes(),
            value: record(i as u8, 1500),
            lease: if i % 2 == 0 { 3 } else { 0 },
            ..PutRequest::default()
        });
        store.apply(i + 2, &op).unwrap();
        if i % 10 == 9 {
            store.commit().unwrap();
        }
    }
    let hash = store.hash_kv(0).unwrap();
    drop(store);
    let mut image = storage.live_image();
    write_format_1_meta(&mut image, 0);
    write_format_1_meta(&mut image, 1);
    let old = MemStorage::from_image(image);

    let mut store = open_mem(&old);
    assert!(store.txn_records().is_empty());
    assert_eq!(store.applied_index(), 51);
    assert_eq!(store.hash_kv(0).unwrap(), hash);
    assert_eq!(store.lease(3).unwrap().keys.len(), 25);
    store.apply(52, &put(b"k0", b"new")).unwrap();
    store.put_txn_record(store.current_revision(), b"first record");
    store.commit().unwrap();
    drop(store);
    // One meta of each format now; the newer, of format 2, wins.
    let mut store = open_mem(&old);
    let want = vec![(store.current_revision(), b"first record".to_vec())];
    assert_eq!(store.txn_records(), want);
    store.apply(53, &put(b"k1", b"new")).unwrap();
    store.commit().unwrap();
    drop(store);
    let store = open_mem(&old);
    assert_eq!(store.txn_records(), want);
    assert_eq!(store.applied_index(), 53);
}

#[test]
fn a_2_mib_record_round_trips_and_is_replaced_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
    let first = record(1, 2 * 1024 * 1024);
    store.put_txn_record(1, &first);
    store.commit().unwrap();
    store.sync().unwrap();
    drop(store);

    let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
    assert_eq!(store.txn_records(), vec![(1, first)]);
    let second = record(2, 2 * 1024 * 1024 + 17);
    store.put_txn_record(1, &second);
    store.commit().unwrap();
    store.sync().unwrap();
    drop(store);

    let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
    assert_eq!(store.txn_records(), vec![(1, second)]);
    store.remove_txn_record(1);
    store.commit().unwrap();
    store.sync().unwrap();
    // Nothing but the metas and freed pages remain in use.
    assert!(
        store.size_in_use_bytes() < 64 * 1024,
        "{}",
        store.size_in_use_bytes()
    );
    drop(store);
    let store = Store::open(dir.path(), 0, Config::default()).unwrap();
    assert!(store.txn_records().is_empty());
}

#[test]
fn a_store_restored_on_another_thread_is_used_and_reopened_by_its_owner() {
    let cfg = Config {
        snapshot_chunk_bytes: 4096,
        ..Config::default()
    };
    let mut source =
        Store::open_with(Box::new(MemStorage::new()), "mem://shard-0", cfg.clone()).unwrap();
    for i in 0..300u64 {
        let op = put(format!("k{i}").as_bytes(), &[i as u8; 300]);
        source.apply(i + 1, &op).unwrap();
    }
    source.put_txn_record(5, &record(3, 900));
    source.commit().unwrap();
    let hash = source.hash_kv(0).unwrap();
    let chunks: Vec<Vec<u8>> = source.snapshot_stream().map(|c| c.unwrap()).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let builder_cfg = cfg.clone();
    // Built and synced on its own thread, handed over whole.
    let restored =
        std::thread::spawn(move || Store::restore_detached(&path, 3, builder_cfg, chunks).unwrap())
            .join()
            .unwrap();
    assert_eq!(restored.applied_index(), 300);
    let mut store = restored.into_store();
    assert_eq!(store.hash_kv(0).unwrap(), hash);
    // The owner reads, writes and commits it as any store it opened.
    let snap = store.snapshot();
    store.apply(301, &put(b"k1", b"new")).unwrap();
    store.commit().unwrap();
    let before = snap
        .range(&RangeRequest {
            key: b"k1".to_vec(),
            ..RangeRequest::default()
        })
        .unwrap();
    assert_eq!(before.kvs[0].value, vec![1u8; 300]);
    drop(snap);
    assert_eq!(store.txn_records().len(), 1);
    drop(store);
    let reopened = Store::open(dir.path(), 3, cfg).unwrap();
    assert_eq!(reopened.applied_index(), 301);
    assert_eq!(reopened.get(b"k1").unwrap().unwrap().value, b"new");
}

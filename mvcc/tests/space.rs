//! Guards space handling on a real file (memory map, background syncer): pages
//! freed by overwrites and compaction are reused online so a steady workload
//! stops growing the file; an explicit defragment shrinks the file while a
//! snapshot keeps reading; applied index and data survive a reopen.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_mvcc::*;

fn put(key: &[u8], value: &[u8]) -> Op {
    Op::Put(PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..PutRequest::default()
    })
}

fn small_growth() -> Config {
    Config {
        grow_min_bytes: 64 * 1024,
        ..Config::default()
    }
}

/// [`small_growth`] on a disk whose every sync takes `stall_ms` (a control
/// file in `dir`, which the test may rewrite).
fn slow_disk(dir: &std::path::Path, stall_ms: u64) -> (Config, std::path::PathBuf) {
    let control = dir.join("faults");
    std::fs::write(&control, format!("store-stall {stall_ms}")).unwrap();
    let cfg = Config {
        sync_faults: Some(control.clone()),
        ..small_growth()
    };
    (cfg, control)
}

#[test]
fn steady_overwrites_with_compaction_stop_growing_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // Inline syncs: with the background syncer, how many freed pages wait on a
    // sync at the peak depends on the disk's mood; the bound below is about
    // page reuse, so it is checked without that noise (mvccbench covers the
    // background syncer).
    let cfg = Config {
        background_sync: false,
        ..small_growth()
    };
    let mut store = Store::open(dir.path(), 0, cfg).unwrap();
    let value = vec![0x42u8; 256];
    let (ops, keys, compact_every) = (60_000u64, 500u64, 5_000i64);
    let mut index = 0;
    let mut last_compact = 0;
    let mut half = 0;
    let mut x = 12345u64;
    for i in 0..ops {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        index += 1;
        store
            .apply(
                index,
                &put(format!("key/{}", (x >> 33) % keys).as_bytes(), &value),
            )
            .unwrap();
        let rev = store.current_revision();
        if rev - last_compact >= compact_every {
            index += 1;
            store
                .apply(index, &Op::Compact(CompactionRequest { revision: rev }))
                .unwrap();
            last_compact = rev;
        }
        if index % 500 == 0 {
            store.commit().unwrap();
        }
        if i + 1 == ops / 2 {
            store.commit().unwrap();
            half = store.size_bytes();
        }
    }
    store.commit().unwrap();
    store.sync().unwrap();
    let end = store.size_bytes();
    assert!(
        end as f64 <= 1.1 * half as f64,
        "file grew from {half} to {end} bytes"
    );
    assert_eq!(store.key_count() as u64, keys);
    drop(store);
    let store = Store::open(dir.path(), 0, small_growth()).unwrap();
    assert_eq!(store.applied_index(), index);
    assert_eq!(store.key_count() as u64, keys);
}

#[test]
fn defragment_shrinks_the_file_while_a_snapshot_keeps_reading() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, mut index) = mostly_free_store(dir.path());
    let snap = store.snapshot();
    let before = store.size_bytes();
    let report = store.defragment().unwrap();
    // The snapshot still sees every surviving key, with its value.
    let r = snap
        .range(&RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            ..RangeRequest::default()
        })
        .unwrap();
    assert_eq!(r.kvs.len(), 1000);
    assert!(r.kvs.iter().all(|kv| kv.value.len() == 200));
    drop(snap);
    // With the snapshot gone the next commit cuts the rest.
    index += 1;
    store.apply(index, &put(b"after", b"x")).unwrap();
    store.commit().unwrap();
    store.sync().unwrap();
    store.commit().unwrap();
    let report2 = store.defragment().unwrap();
    let after = store.size_bytes();
    assert!(
        after * 4 < before,
        "defragment left {after} of {before} bytes ({report:?}, {report2:?})"
    );
    assert_eq!(
        store.get(b"k019999").unwrap().unwrap().value,
        vec![19_999u32 as u8; 200]
    );
    drop(store);
    let len = std::fs::metadata(Store::file_path(dir.path(), 0))
        .unwrap()
        .len();
    assert_eq!(len, after);
    let store = Store::open(dir.path(), 0, small_growth()).unwrap();
    assert_eq!(store.key_count(), 1001);
    assert_eq!(store.applied_index(), index);
}

/// A store of 20,000 keys whose first 19,000 are deleted and compacted away,
/// all committed and durable: most of its file is free pages, the live ones
/// at the end.
fn mostly_free_store(dir: &std::path::Path) -> (Store, u64) {
    let mut store = Store::open(dir, 0, small_growth()).unwrap();
    let index = fill_mostly_free(&mut store);
    (store, index)
}

/// Fills `store` as [`mostly_free_store`] describes; answers the last
/// applied index.
fn fill_mostly_free(store: &mut Store) -> u64 {
    let mut index = 0;
    for i in 0..20_000u32 {
        index += 1;
        store
            .apply(index, &put(format!("k{i:06}").as_bytes(), &[i as u8; 200]))
            .unwrap();
        if index % 1000 == 0 {
            store.commit().unwrap();
        }
    }
    index += 1;
    store
        .apply(
            index,
            &Op::DeleteRange(DeleteRangeRequest {
                key: b"k".to_vec(),
                range_end: b"k019000".to_vec(),
                prev_kv: false,
            }),
        )
        .unwrap();
    let rev = store.current_revision();
    index += 1;
    store
        .apply(index, &Op::Compact(CompactionRequest { revision: rev }))
        .unwrap();
    store.commit().unwrap();
    store.sync().unwrap();
    index
}

/// Runs a defragment in steps while the store's owner writes and commits
/// between steps as fast as it can, as a shard's core does; then commits on
/// until the file is cut (pages the last steps freed are cut by the commits
/// that follow, once durable). Answers the run's report, the steps that
/// moved pages, the last index and the keys written.
fn defragment_while_writing(store: &mut Store, mut index: u64) -> (DefragReport, u32, u64, u32) {
    let before = store.size_bytes();
    let mut run = store.defragment_start();
    let (mut moved, mut waiting, mut written) = (0, 0, 0u32);
    let write = |store: &mut Store, index: &mut u64, written: &mut u32| {
        *index += 1;
        store
            .apply(*index, &put(format!("new{written:05}").as_bytes(), b"v"))
            .unwrap();
        *written += 1;
        store.commit_unless_busy().unwrap();
    };
    let report = loop {
        // 16 pages a step: the live pages at the end take several.
        match store.defragment_step(&mut run, 16).unwrap() {
            DefragProgress::Moved => moved += 1,
            DefragProgress::Waiting => {
                waiting += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            DefragProgress::Done(report) => break report,
        }
        assert!(
            moved + waiting < 100_000,
            "the run never ends: {run:?}, {moved} moved, {waiting} waiting"
        );
        write(store, &mut index, &mut written);
    };
    let mut tries = 0;
    while store.size_bytes() * 4 >= before {
        tries += 1;
        assert!(
            tries < 100_000,
            "the file stays at {} of {before} bytes after the run ({report:?}, {moved} moved, {waiting} waiting)",
            store.size_bytes()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
        write(store, &mut index, &mut written);
    }
    (report, moved, index, written)
}

/// Checks a store [`defragment_while_writing`] ran on, after a reopen.
fn check_after_defragment(
    mut store: Store,
    dir: &std::path::Path,
    cfg: Config,
    index: u64,
    written: u32,
    other_keys: usize,
) {
    store.commit().unwrap();
    store.sync().unwrap();
    drop(store);
    let store = Store::open(dir, 0, cfg).unwrap();
    assert_eq!(store.applied_index(), index);
    assert_eq!(store.key_count(), 1000 + written as usize + other_keys);
    for i in [19_000u32, 19_500, 19_999] {
        assert_eq!(
            store
                .get(format!("k{i:06}").as_bytes())
                .unwrap()
                .unwrap()
                .value,
            vec![i as u8; 200]
        );
    }
    assert!(store
        .get(format!("new{:05}", written - 1).as_bytes())
        .unwrap()
        .is_some());
}

#[test]
fn a_defragment_in_steps_never_waits_while_writes_and_commits_go_on_between_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, index) = mostly_free_store(dir.path());
    let (report, moved, index, written) = defragment_while_writing(&mut store, index);
    assert!(moved > 2, "{moved} steps moved pages ({report:?})");
    check_after_defragment(store, dir.path(), small_growth(), index, written, 0);
}

#[test]
fn a_defragment_in_steps_ends_on_a_slow_disk_while_the_owner_commits_between_steps() {
    // Every sync takes 10 ms. The owner's commits used to take every turn
    // the syncer gave (each sync's end let the next owner commit in before
    // the step), so a step waiting for pages still syncing never ran.
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = slow_disk(dir.path(), 10);
    let mut store = Store::open(dir.path(), 0, cfg.clone()).unwrap();
    let index = fill_mostly_free(&mut store);
    let (report, moved, mut index, written) = defragment_while_writing(&mut store, index);
    assert!(moved > 2, "{moved} steps moved pages ({report:?})");
    // After the run, the file grows on the syncer again, not on the
    // applying thread: the cut leaves room, and a grow is asked for ahead.
    let inline_before = store.commit_stats().grown_inline;
    let size_before = store.size_bytes();
    let mut grown_keys = 0usize;
    let mut tries = 0;
    while store.size_bytes() < size_before * 2 {
        tries += 1;
        assert!(
            tries < 100_000,
            "the file never grew: {:?}",
            store.commit_stats()
        );
        for _ in 0..50 {
            index += 1;
            grown_keys += 1;
            store
                .apply(index, &put(format!("grow{index:07}").as_bytes(), &[7; 200]))
                .unwrap();
        }
        store.commit_unless_busy().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        store.commit_stats().grown_inline,
        inline_before,
        "the applying thread grew the file after the defragment: {:?}",
        store.commit_stats()
    );
    check_after_defragment(store, dir.path(), cfg, index, written, grown_keys);
}

#[test]
fn a_defragment_dropped_while_it_waits_holds_the_owners_commits_back_only_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, control) = slow_disk(dir.path(), 20);
    let mut store = Store::open(dir.path(), 0, cfg).unwrap();
    let mut index = fill_mostly_free(&mut store);
    // Fill the syncer's queue (until a commit is deferred), so that the
    // first step waits for the syncer, then drop the run.
    let deferred = store.commit_stats().deferred;
    let mut tries = 0;
    while store.commit_stats().deferred == deferred {
        tries += 1;
        assert!(tries < 10_000, "the syncer's queue never filled");
        index += 1;
        store.apply(index, &put(b"busy", b"v")).unwrap();
        store.commit_unless_busy().unwrap();
    }
    let mut run = store.defragment_start();
    assert_eq!(
        store.defragment_step(&mut run, 16).unwrap(),
        DefragProgress::Waiting,
        "a step went ahead with the syncer's queue full: {run:?}"
    );
    // The run is abandoned here: no step is taken again. The owner writes
    // on, and its commits go through again, bounded by progress.
    std::fs::write(&control, "none").unwrap();
    index += 1;
    store.apply(index, &put(b"after-the-run", b"v")).unwrap();
    let mut tries = 0;
    while store.committed_index() < index {
        tries += 1;
        assert!(
            tries < 100_000,
            "commits stay held back after the run was dropped: {:?}",
            store.commit_stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
        store.commit_unless_busy().unwrap();
    }
}

/// The store's file, counting the syncs and the grows made on the applying
/// thread; the background syncer's handle is the file's own.
struct CountedSyncs {
    inner: FileStorage,
    syncs: Arc<AtomicU64>,
    grows: Arc<AtomicU64>,
}

impl CountedSyncs {
    fn open(path: &std::path::Path) -> (CountedSyncs, Arc<AtomicU64>, Arc<AtomicU64>) {
        let syncs = Arc::new(AtomicU64::new(0));
        let grows = Arc::new(AtomicU64::new(0));
        let storage = CountedSyncs {
            inner: FileStorage::open(path).unwrap(),
            syncs: syncs.clone(),
            grows: grows.clone(),
        };
        (storage, syncs, grows)
    }
}

impl Storage for CountedSyncs {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn set_len(&mut self, len: u64) -> std::io::Result<()> {
        if len > self.inner.len()? {
            self.grows.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.set_len(len)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.inner.sync_data()
    }
    fn file(&self) -> Option<&std::fs::File> {
        self.inner.file()
    }
    fn sync_handle(&self) -> Option<Box<dyn SyncHandle>> {
        self.inner.sync_handle()
    }
}

#[test]
fn a_defragment_in_steps_never_syncs_on_the_applying_thread() {
    // A daemon core runs the steps: a sync there (the file's cut, say) would
    // stop every shard of the core for as long as the disk takes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard-0.mvcc");
    let (storage, syncs, _) = CountedSyncs::open(&path);
    let mut store = Store::open_with(Box::new(storage), "shard-0.mvcc", small_growth()).unwrap();
    let mut index = fill_mostly_free(&mut store);
    let before = store.size_bytes();
    let synced_before = syncs.load(Ordering::SeqCst);
    let mut run = store.defragment_start();
    let mut steps = 0;
    loop {
        steps += 1;
        assert!(steps < 1_000_000, "the run never ends: {run:?}");
        match store.defragment_step(&mut run, 64).unwrap() {
            DefragProgress::Done(_) => break,
            DefragProgress::Moved => {}
            DefragProgress::Waiting => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
    // Pages the last steps freed are cut by the commits that follow.
    for i in 0..50u32 {
        index += 1;
        store
            .apply(index, &put(format!("after{i:02}").as_bytes(), b"v"))
            .unwrap();
        store.commit_unless_busy().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    store.commit().unwrap();
    let after = store.size_bytes();
    assert!(
        after * 4 < before,
        "the file went from {before} to {after} bytes"
    );
    assert_eq!(
        syncs.load(Ordering::SeqCst),
        synced_before,
        "the applying thread synced the store file during the defragment"
    );
    store.sync().unwrap();
    drop(store);
    let store = Store::open(dir.path(), 0, small_growth()).unwrap();
    assert_eq!(store.applied_index(), index);
    assert_eq!(store.key_count(), 1000 + 50);
}

#[test]
fn the_file_grows_on_the_syncer_ahead_of_need_never_on_the_applying_thread() {
    // Reserving blocks can wait on the file system's journal as long as a
    // sync; on a daemon core that would stop every shard of the core.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard-0.mvcc");
    let (storage, _, grows) = CountedSyncs::open(&path);
    let mut store = Store::open_with(Box::new(storage), "shard-0.mvcc", small_growth()).unwrap();
    let grown_at_open = grows.load(Ordering::SeqCst);
    let before = store.size_bytes();
    let mut index = 0u64;
    let mut committed = 0;
    for i in 0..40_000u32 {
        index += 1;
        store
            .apply(index, &put(format!("g{i:06}").as_bytes(), &[i as u8; 200]))
            .unwrap();
        if index.is_multiple_of(200) && store.commit_unless_busy().unwrap() {
            committed += 1;
        }
    }
    let stats = store.commit_stats();
    let after = store.size_bytes();
    assert!(
        after > before * 16,
        "the file went from {before} to {after} bytes only"
    );
    // How many grows depends on how far the syncer lags (a commit waiting
    // for room gathers more, and the grow covers it), not on the workload.
    assert!(
        stats.grown_ahead >= 1,
        "{} grows on the syncer over {committed} commits: {stats:?}",
        stats.grown_ahead
    );
    assert_eq!(
        (
            grows.load(Ordering::SeqCst) - grown_at_open,
            stats.grown_inline
        ),
        (0, 0),
        "the applying thread grew the file: {stats:?}"
    );
    store.commit().unwrap();
    store.sync().unwrap();
    drop(store);
    let store = Store::open(dir.path(), 0, small_growth()).unwrap();
    assert_eq!(store.applied_index(), index);
    assert_eq!(store.key_count(), 40_000);
    assert_eq!(
        store.get(b"g039999").unwrap().map(|kv| kv.value),
        Some(vec![39_999u32 as u8; 200])
    );
}

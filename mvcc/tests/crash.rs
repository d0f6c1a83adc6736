//! Guards crash safety: a random workload runs on a storage backend with a live
//! and a durable image and is stopped at every sync point in turn. After
//! reopening from the durable image (unsynced writes lost, or torn at sector
//! boundaries) the store must equal the model at the last completed commit (or,
//! when the torn write happens to include the in-flight meta page, the
//! in-flight commit), with the matching applied index. Run again with
//! entries applied at the sparse revisions they carry (`apply_at`), the
//! reached revision after recovery must be the one committed, also where the
//! last entry of a commit wrote nothing. Beside its entries the workload puts
//! and removes txn records as the shard driver does, so a record and the
//! entry it was put for are found after recovery together or not at all.
//! Now and then the workload defragments the store, whose last step cuts the
//! file without a sync of its own. Half the commits go in steps of a few
//! records and a page or two, as the shard driver takes them.
//!
//! More seeds: `MVCC_CRASH_SEEDS=200 cargo test --release -p cairn-mvcc --test crash`.

mod common;

use cairn_mvcc::*;
use common::*;

const OPS: usize = 160;

/// How entries get their revisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Revisions {
    /// `apply`: each write at the revision after the store's.
    Next,
    /// `apply_at`: each entry at the revision it carries, 1 to 4 past the last.
    Sparse,
}

/// Runs the workload of `seed`; with `crash_at`, the n-th sync stops the machine.
/// Returns (syncs used, model at the last completed commit, model of the commit
/// in flight when the machine stopped).
fn run(
    seed: u64,
    storage: &MemStorage,
    crash_at: Option<u64>,
    revs: Revisions,
) -> (u64, Model, Option<Model>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    // Its own generator, so the entries are those of the workload without records.
    let mut txn_rng = SmallRng::seed_from_u64(seed ^ 0x7478_6e72);
    let mut store = Store::open_with(Box::new(storage.clone()), "crash", stepped()).unwrap();
    let start_syncs = storage.syncs_done();
    if let Some(n) = crash_at {
        storage.crash_at_sync(n);
    }
    let mut m = Model::new();
    let mut committed = m.clone();
    for i in 0..OPS {
        let op = random_op(&mut rng, &m);
        let index = i as u64 + 1;
        let (accepted, r) = match revs {
            Revisions::Next => (m.apply(index, &op), store.apply(index, &op)),
            Revisions::Sparse => {
                let revision = m.rev + rng.gen_range(1i64..=4);
                (
                    m.apply_at(index, revision, &op),
                    store.apply_at(index, revision, &op),
                )
            }
        };
        assert_eq!(r.is_ok(), accepted, "seed {seed} op {i}: {op:?} -> {r:?}");
        change_txn_records(&mut txn_rng, &mut store, &mut m);
        // Now and then a whole defragment after the commit: its steps move
        // pages and commit them, and its end cuts the file.
        let defragment = rng.gen_range(0..30) == 0;
        if !(defragment || rng.gen_range(0..6) == 0 || i + 1 == OPS) {
            continue;
        }
        let mut result = if rng.flip() {
            commit_in_steps(&mut store)
        } else {
            store.commit().map(|_| ()).map_err(|e| e.to_string())
        };
        if result.is_ok() && defragment {
            committed = m.clone();
            result = store.defragment().map(|_| ()).map_err(|e| e.to_string());
        }
        match result {
            Ok(()) => committed = m.clone(),
            Err(e) => {
                assert!(
                    storage.crashed(),
                    "seed {seed}: commit failed without a crash: {e}"
                );
                assert!(store.is_poisoned());
                let after = store.apply(index + 1, &Op::Compact(CompactionRequest { revision: 1 }));
                assert!(
                    matches!(after, Err(ApplyError::Poisoned { .. })),
                    "{after:?}"
                );
                return (storage.syncs_done() - start_syncs, committed, Some(m));
            }
        }
    }
    (storage.syncs_done() - start_syncs, committed, None)
}

/// Commits take small steps.
fn stepped() -> Config {
    Config {
        commit_step_records: 3,
        commit_step_bytes: 6000,
        ..Config::default()
    }
}

/// A commit of everything applied, in steps.
fn commit_in_steps(store: &mut Store) -> Result<(), String> {
    if !store
        .commit_begin_unless_busy()
        .map_err(|e| e.to_string())?
    {
        return Ok(());
    }
    loop {
        match store.commit_step().map_err(|e| e.to_string())? {
            Some(Step { done: Some(_), .. }) => return Ok(()),
            Some(_) => {}
            None => return Err("the commit stopped running before it was done".into()),
        }
    }
}

/// What the shard driver does beside an entry that starts or ends a
/// cross-shard txn: puts a record under the entry's revision (some long
/// enough for overflow pages), or removes one; mostly neither.
fn change_txn_records(rng: &mut SmallRng, store: &mut Store, m: &mut Model) {
    match rng.gen_range(0..6) {
        0 | 1 => {
            let len = if rng.gen_range(0..8) == 0 {
                rng.gen_range(1025usize..9000)
            } else {
                rng.gen_range(0usize..400)
            };
            let record: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
            store.put_txn_record(m.rev, &record);
            m.txn_records.insert(m.rev, record);
        }
        2 if !m.txn_records.is_empty() => {
            let ids: Vec<i64> = m.txn_records.keys().copied().collect();
            let id = ids[rng.gen_range(0..ids.len())];
            store.remove_txn_record(id);
            m.txn_records.remove(&id);
        }
        _ => {}
    }
}

/// Whether a commit of `m` records a revision reached by an entry that wrote
/// nothing.
fn reached_past_last_write(m: &Model) -> bool {
    m.events.last().is_some_and(|e| e.revision.main < m.rev)
}

/// Crashes the workload of `seed` at each of its sync points; returns how
/// many recoveries found a revision reached past the last write.
fn crash_every_sync_point(seed: u64, revs: Revisions) -> usize {
    let full = MemStorage::new();
    let (syncs, _, _) = run(seed, &full, None, revs);
    assert!(syncs >= 4, "seed {seed}: workload made only {syncs} syncs");
    let mut past_last_write = 0;
    for n in 1..=syncs {
        for mode in [
            CrashMode::LoseUnsynced,
            CrashMode::Tear {
                seed: seed * 1000 + n,
            },
        ] {
            let storage = MemStorage::new();
            let (_, committed, inflight) = run(seed, &storage, Some(n), revs);
            let inflight = inflight.unwrap_or_else(|| panic!("seed {seed}: no crash at sync {n}"));
            let image = storage.crash_image(mode);
            let store = Store::open_with(Box::new(image), "crash", Config::default())
                .unwrap_or_else(|e| panic!("seed {seed} sync {n} {mode:?}: reopen failed: {e}"));
            let want = if store.applied_index() == committed.applied_index {
                &committed
            } else {
                assert_eq!(
                    store.applied_index(),
                    inflight.applied_index,
                    "seed {seed} sync {n} {mode:?}: applied index is neither the last commit's nor the in-flight one's"
                );
                assert!(
                    matches!(mode, CrashMode::Tear { .. }),
                    "seed {seed} sync {n}: unsynced commit survived"
                );
                &inflight
            };
            let ctx = format!("seed {seed} crash at sync {n} {mode:?} {revs:?}");
            assert_eq!(
                store.current_revision(),
                want.rev,
                "{ctx}: reached revision after recovery"
            );
            past_last_write += usize::from(reached_past_last_write(want));
            let mut rng = SmallRng::seed_from_u64(n);
            check(&store, want, &mut rng, &ctx);
        }
    }
    past_last_write
}

#[test]
fn reopen_after_a_crash_at_any_sync_point_equals_the_last_commit() {
    let seeds: u64 = std::env::var("MVCC_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    for seed in 0..seeds {
        crash_every_sync_point(seed, Revisions::Next);
    }
}

#[test]
fn reopen_after_a_crash_with_sparse_revisions_finds_the_committed_reached_revision() {
    let seeds: u64 = std::env::var("MVCC_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let mut past_last_write = 0;
    for seed in 0..seeds {
        past_last_write += crash_every_sync_point(seed, Revisions::Sparse);
    }
    assert!(
        past_last_write > 0,
        "no recovery found a revision reached by an entry that wrote nothing"
    );
}

#[test]
fn store_keeps_working_after_reopen_from_a_crash() {
    let storage = MemStorage::new();
    let (_, committed, _) = run(77, &storage, Some(9), Revisions::Next);
    let image = storage.crash_image(CrashMode::LoseUnsynced);
    let mut store = Store::open_with(Box::new(image.clone()), "crash", Config::default()).unwrap();
    let mut m = committed;
    let mut rng = SmallRng::seed_from_u64(5);
    // The server replays the WAL past the applied index.
    for i in 0..100u64 {
        let op = random_op(&mut rng, &m);
        let index = m.applied_index + 1;
        let accepted = m.apply(index, &op);
        assert_eq!(store.apply(index, &op).is_ok(), accepted);
        if i % 10 == 9 {
            store.commit().unwrap();
        }
    }
    store.commit().unwrap();
    drop(store);
    let store = Store::open_with(Box::new(image), "crash", Config::default()).unwrap();
    check(&store, &m, &mut rng, "after replay and reopen");
}

//! Guards the store's etcd semantics as a whole: random sequences of puts,
//! deletes, txns, compactions (their pass over the key index in steps of a
//! few keys), lease grants and revokes, commits (whole, and in steps with
//! everything else going on between them), reopens, and
//! snapshot-stream restores are checked against a plain model of all
//! revisions, including reads at old revisions and reads from snapshots taken
//! while the writer went on.
//!
//! The normal suite runs 40 seeds; `MVCC_MODEL_SEEDS=2000 cargo test --release
//! -p cairn-mvcc --test model` runs more.

mod common;

use cairn_mvcc::*;
use common::*;

fn run_seed(seed: u64, steps: usize) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut storage = MemStorage::new();
    let name = format!("model-{seed}");
    // Steps of one to a few records, and of a page or two.
    let cfg = Config {
        commit_step_records: rng.gen_range(1usize..4),
        commit_step_bytes: rng.gen_range(1usize..8192),
        compact_step_keys: rng.gen_range(1usize..4),
        ..Config::default()
    };
    let mut store = Store::open_with(Box::new(storage.clone()), &name, cfg.clone()).unwrap();
    let mut m = Model::new();
    let mut committed = m.clone();
    // What the commit running in steps holds: everything applied when it began.
    let mut running: Option<Model> = None;
    let mut index = 0u64;
    let mut snaps: Vec<(Snapshot, Model)> = Vec::new();
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        if store.commit_running()
            && rng.gen_range(0..3) == 0
            && store
                .commit_step()
                .unwrap()
                .is_some_and(|s| s.done.is_some())
        {
            committed = running.take().expect("a commit was running");
            assert!(!store.commit_running(), "{ctx}: the commit ended");
        }
        if store.compaction_running() && rng.gen_range(0..4) == 0 {
            store.compaction_step().expect("a pass was running");
        }
        match rng.gen_range(0..100) {
            0..=79 => {
                let op = random_op(&mut rng, &m);
                index += 1;
                let accepted = m.apply(index, &op);
                let r = store.apply(index, &op);
                assert_eq!(r.is_ok(), accepted, "{ctx}: {op:?} -> {r:?}");
                if let Err(e) = &r {
                    assert!(e.is_request_error(), "{ctx}: {e}");
                }
            }
            80..=83 => {
                store.commit().unwrap();
                committed = m.clone();
                running = None;
            }
            84..=87 => {
                if !store.commit_running() && store.commit_begin_unless_busy().unwrap() {
                    running = Some(m.clone());
                }
            }
            88..=90 => {
                // Uncommitted work is lost on reopen, as after a crash.
                drop(std::mem::take(&mut snaps));
                drop(store);
                store = Store::open_with(Box::new(storage.clone()), &name, cfg.clone()).unwrap();
                m = committed.clone();
                running = None;
                index = m.applied_index;
                assert_eq!(
                    store.applied_index(),
                    index,
                    "{ctx}: applied index after reopen"
                );
            }
            91..=93 => {
                let chunks: Vec<Vec<u8>> = store.snapshot_stream().map(|c| c.unwrap()).collect();
                let hash = store.hash_kv(0).unwrap();
                drop(std::mem::take(&mut snaps));
                drop(store);
                storage = MemStorage::new();
                store = Store::restore_with(Box::new(storage.clone()), &name, cfg.clone(), chunks)
                    .unwrap();
                assert_eq!(
                    store.hash_kv(0).unwrap().hash,
                    hash.hash,
                    "{ctx}: hash after restore"
                );
                assert_eq!(
                    store.applied_index(),
                    m.applied_index,
                    "{ctx}: applied index after restore"
                );
                committed = m.clone();
                running = None;
            }
            94..=96 => {
                if snaps.len() < 4 {
                    snaps.push((store.snapshot(), m.clone()));
                }
            }
            _ => {
                if let Some((s, sm)) = snaps.pop() {
                    let r = s.range(&RangeRequest {
                        key: vec![0],
                        range_end: vec![0],
                        ..RangeRequest::default()
                    });
                    if store.compact_revision() > sm.rev {
                        assert!(
                            matches!(r, Err(ReadError::Compacted { .. })),
                            "{ctx}: {r:?}"
                        );
                    } else {
                        assert_eq!(r.unwrap().kvs, sm.all_at(sm.rev), "{ctx}: snapshot view");
                    }
                }
            }
        }
        if step % 7 == 0 {
            check(&store, &m, &mut rng, &ctx);
        }
    }
    check(&store, &m, &mut rng, &format!("seed {seed} end"));
    drop(snaps);
    store.commit().unwrap();
    drop(store);
    let store = Store::open_with(Box::new(storage), &name, cfg).unwrap();
    check(&store, &m, &mut rng, &format!("seed {seed} final reopen"));
}

#[test]
fn random_workloads_match_the_model() {
    let seeds: u64 = std::env::var("MVCC_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for seed in 0..seeds {
        run_seed(seed, 300);
    }
}

#[test]
fn long_workload_with_many_pages_matches_the_model() {
    run_seed(9_999, 3000);
}

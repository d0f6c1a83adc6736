//! Guards HashKV in steps against answering anything but what the store's
//! one-go hash answers (at every revision, with compacted history, records in
//! the open batch, errors), and against holding the core: other tasks on the
//! core's `LocalSet` run between its steps, and what they write meanwhile is
//! not in the hash.

use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::server::shard::test_store::{beside_writes, TestStore};

const SHARD: ShardId = 5;

/// A store with overwritten, deleted, leased and compacted keys, part of it
/// committed and part in the open batch; and the revision compacted at.
fn populated() -> (TestStore, i64) {
    let mut f = TestStore::new(SHARD);
    f.apply(mvcc::Op::LeaseGrant {
        id: 9,
        ttl_secs: 60,
    });
    for i in 0..600 {
        f.put(
            &format!("k{i:03}"),
            format!("v{i}"),
            if i % 5 == 0 { 9 } else { 0 },
        );
    }
    f.store.commit().unwrap();
    for i in (0..600).step_by(3) {
        f.put(&format!("k{i:03}"), "again", 0);
    }
    let compacted = f.store.current_revision() - 100;
    f.apply(mvcc::Op::Compact(mvcc::CompactionRequest {
        revision: compacted,
    }));
    f.store.commit().unwrap();
    for i in (0..600).step_by(7) {
        f.delete(&format!("k{i:03}"));
    }
    (f, compacted)
}

/// The answer of a HashKV in steps of `per_step` records, with whether it
/// took a task.
fn stepped(
    store: &mut mvcc::Store,
    revision: i64,
    per_step: usize,
) -> (Result<ShardHash, ApiError>, bool) {
    let stream = match start_hash_kv(store, revision, SHARD, per_step) {
        HashStart::Answered(answer) => return (answer, false),
        HashStart::Stepping(stream) => stream,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = tokio::task::LocalSet::new().block_on(&rt, async {
        let (tx, rx) = Reply::channel();
        tokio::task::spawn_local(hash_rest(stream, SHARD, per_step, tx));
        rx.await.expect("the HashKV answers")
    });
    (answer, true)
}

#[test]
fn steps_answer_what_one_pass_answers_at_every_revision() {
    let (mut f, compacted) = populated();
    let current = f.store.current_revision();
    let mut tasks = 0;
    for revision in [
        0,
        current,
        current - 1,
        compacted,
        compacted + 37,
        current - 100,
    ] {
        let whole = f.store.hash_kv(revision).unwrap();
        for per_step in [1, 7, 100, 4_096] {
            let (answer, took_task) = stepped(&mut f.store, revision, per_step);
            let h = answer.unwrap();
            assert_eq!(
                (h.hash, h.revision, h.compact_revision),
                (whole.hash, whole.hash_revision, whole.compact_revision),
                "revision {revision}, {per_step} records a step"
            );
            tasks += usize::from(took_task);
        }
    }
    assert!(tasks >= 12, "small steps take a task: {tasks}");
    // Hashes of different revisions differ.
    assert_ne!(
        f.store.hash_kv(current).unwrap().hash,
        f.store.hash_kv(current - 1).unwrap().hash
    );
    // Refused as the one-go hash is.
    let (future, _) = stepped(&mut f.store, current + 1, 10);
    assert!(matches!(future, Err(ApiError::FutureRev)), "{future:?}");
    let (old, _) = stepped(&mut f.store, compacted - 1, 10);
    assert!(matches!(old, Err(ApiError::Compacted)), "{old:?}");
}

#[test]
fn a_long_hash_lets_the_cores_other_tasks_run_between_its_steps() {
    let (mut f, _) = populated();
    let expected = f.store.hash_kv(0).unwrap();
    let records_per_step = 5;
    let f = Rc::new(RefCell::new(f));
    // Another shard's work on the same core: writes, one a turn, committed
    // now and then, and a compaction.
    let write = |fixture: &mut TestStore, n: usize| {
        fixture.put(&format!("k{:03}", n % 600), format!("new{n}"), 0);
        if n.is_multiple_of(50) {
            fixture.store.commit().unwrap();
        }
        if n == 20 {
            let revision = fixture.store.current_revision() - 5;
            fixture.apply(mvcc::Op::Compact(mvcc::CompactionRequest { revision }));
        }
    };
    let (answer, writes_meanwhile) = beside_writes(&f, write, async {
        let (tx, rx) = Reply::channel();
        match start_hash_kv(&mut f.borrow_mut().store, 0, SHARD, records_per_step) {
            HashStart::Answered(answer) => {
                let _ = tx.send(answer);
            }
            HashStart::Stepping(stream) => {
                tokio::task::spawn_local(hash_rest(stream, SHARD, records_per_step, tx));
            }
        }
        rx.await.expect("the HashKV answers")
    });
    let h = answer.unwrap();
    assert_eq!(
        (h.hash, h.revision, h.compact_revision),
        (
            expected.hash,
            expected.hash_revision,
            expected.compact_revision
        ),
        "the hash is of the state when it began"
    );
    assert!(
        writes_meanwhile >= 50,
        "the core ran other work {writes_meanwhile} times while {} records were hashed",
        records_per_step * writes_meanwhile
    );
    assert!(f.borrow().store.current_revision() > expected.revision);
}

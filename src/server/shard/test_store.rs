//! A real store in a temporary directory, with the Raft index its writes are
//! applied at, for the shard's unit tests.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

use cairn_mvcc as mvcc;

use crate::routing::ShardId;

pub(super) struct TestStore {
    _dir: tempfile::TempDir,
    pub(super) store: mvcc::Store,
    pub(super) index: u64,
}

impl TestStore {
    pub(super) fn new(shard: ShardId) -> TestStore {
        let dir = tempfile::tempdir().unwrap();
        let store = mvcc::Store::open(dir.path(), shard, mvcc::Config::default()).unwrap();
        TestStore {
            _dir: dir,
            store,
            index: 0,
        }
    }

    /// Applies `op` at the next Raft index; a refused op fails the test.
    pub(super) fn apply(&mut self, op: mvcc::Op) {
        self.index += 1;
        self.store.apply(self.index, &op).unwrap();
    }

    pub(super) fn put(&mut self, key: &str, value: impl Into<Vec<u8>>, lease: i64) {
        self.apply(mvcc::Op::Put(mvcc::PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        }));
    }

    pub(super) fn delete(&mut self, key: &str) {
        self.apply(mvcc::Op::DeleteRange(mvcc::DeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        }));
    }
}

/// Runs `serve` on a core's `LocalSet` beside another shard's work: a task
/// that applies `write(fixture, n)` for n = 0, 1, ..., one a turn. Answers
/// what `serve` gave and how many writes ran before it did.
pub(super) fn beside_writes<T>(
    fixture: &Rc<RefCell<TestStore>>,
    write: impl Fn(&mut TestStore, usize) + 'static,
    serve: impl Future<Output = T>,
) -> (T, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        let writes = Rc::new(Cell::new(0usize));
        let writer = tokio::task::spawn_local({
            let (fixture, writes) = (fixture.clone(), writes.clone());
            async move {
                for n in 0.. {
                    write(&mut fixture.borrow_mut(), n);
                    writes.set(writes.get() + 1);
                    tokio::task::yield_now().await;
                }
            }
        });
        let answer = serve.await;
        writer.abort();
        (answer, writes.get())
    })
}

//! A real store in a temporary directory, with the Raft index its writes are
//! applied at, for the shard's unit tests.

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

//! A store in memory with the Raft index its entries are applied at, and
//! request builders, for the tests of etcd's semantics, compaction and the
//! read-cost figures.

use cairn_mvcc::*;

pub struct TestStore {
    pub store: Store,
    pub index: u64,
}

impl TestStore {
    pub fn new() -> TestStore {
        TestStore::with(Config::default())
    }
    pub fn with(cfg: Config) -> TestStore {
        TestStore {
            store: Store::open_with(Box::new(MemStorage::new()), "test", cfg).unwrap(),
            index: 0,
        }
    }
    pub fn apply(&mut self, op: Op) -> Result<OpResult, ApplyError> {
        self.index += 1;
        self.store.apply(self.index, &op)
    }
    pub fn put(&mut self, k: &str, v: &str) -> PutResponse {
        match self.apply(Op::Put(put_req(k, v))).unwrap() {
            OpResult::Put(r) => r,
            r => panic!("{r:?}"),
        }
    }
    pub fn range(&self, req: RangeRequest) -> RangeResponse {
        self.store.range(&req).unwrap()
    }
    pub fn txn(&mut self, t: TxnRequest) -> Result<TxnResponse, ApplyError> {
        match self.apply(Op::Txn(t))? {
            OpResult::Txn(r) => Ok(r),
            r => panic!("{r:?}"),
        }
    }
}

pub fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..PutRequest::default()
    }
}

pub fn rr(k: &str, end: &str) -> RangeRequest {
    RangeRequest {
        key: k.into(),
        range_end: end.into(),
        ..RangeRequest::default()
    }
}

pub fn keys(r: &RangeResponse) -> Vec<String> {
    r.kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
        .collect()
}

pub fn cmp(key: &str, target: CompareTarget, result: CompareResult) -> Compare {
    Compare {
        result,
        target,
        key: key.into(),
        range_end: Vec::new(),
    }
}

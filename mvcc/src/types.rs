//! Requests and responses of the store, mirroring etcd's KV messages field by
//! field so the server maps its protobufs onto them one to one.

/// A revision: `main` counts write transactions, `sub` the writes inside one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    pub main: i64,
    pub sub: i64,
}

/// A key and its value at one revision, as etcd's `mvccpb.KeyValue`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Vec<u8>,
    pub lease: i64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// etcd's `RangeRequest`. `range_end` empty: the single key; `"\0"`: every key
/// at or after `key`; otherwise `[key, range_end)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeRequest {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub limit: i64,
    /// 0 reads the current revision.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

impl RangeRequest {
    /// Whether [`crate::Snapshot::range_stream`] streams this range: a
    /// count, or keys in key order (either way). Any other order needs
    /// every key before the first.
    pub fn streamable(&self) -> bool {
        self.count_only || self.sort_target == SortTarget::Key
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The store's revision when the range was served (etcd's header revision).
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutRequest {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutResponse {
    pub revision: i64,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRangeResponse {
    pub revision: i64,
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// What a compare looks at, with the operand (etcd's `target` + `target_union`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(Vec<u8>),
    Lease(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub result: CompareResult,
    pub target: CompareTarget,
    pub key: Vec<u8>,
    /// As in a range: empty for one key, `"\0"` from the key on.
    pub range_end: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOp {
    Range(RangeRequest),
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    Range(RangeResponse),
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnResponse {
    pub revision: i64,
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionRequest {
    pub revision: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionResponse {
    pub revision: i64,
}

/// A lease as the store keeps it. Expiry timing is the server's business; the
/// store persists the TTL and the last checkpointed remaining TTL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub ttl_secs: i64,
    /// Remaining TTL at the last checkpoint; 0 when never checkpointed.
    pub remaining_ttl_secs: i64,
    /// Keys currently attached, in key order.
    pub keys: Vec<Vec<u8>>,
}

/// A write that goes through Raft and is applied in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    LeaseGrant { id: i64, ttl_secs: i64 },
    LeaseRevoke { id: i64 },
    LeaseCheckpoint { id: i64, remaining_ttl_secs: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    /// Revision after the grant (a grant writes no key).
    LeaseGrant {
        revision: i64,
    },
    /// Revision after the revoke, which deleted the attached keys in one revision.
    LeaseRevoke {
        revision: i64,
        deleted: i64,
    },
    LeaseCheckpoint {
        revision: i64,
    },
}

/// A change for watchers: a put or a delete at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// For deletes: the key, with `mod_revision` the delete's revision.
    pub kv: KeyValue,
    pub revision: Revision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// etcd's HashKV answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashKv {
    pub hash: u32,
    pub compact_revision: i64,
    /// The revision the hash covers up to.
    pub hash_revision: i64,
    pub revision: i64,
}

//! Mapping between the etcd v3 protobuf messages and the store's own request and
//! response types. The store mirrors etcd's fields one to one, so this is a plain
//! field copy in each direction; headers are added by the caller.

use bytes::Bytes;
use cairn_mvcc as mvcc;
use cairn_proto::etcdserverpb as pb;
use cairn_proto::mvccpb;

fn b(v: Vec<u8>) -> Bytes {
    Bytes::from(v)
}

pub fn kv_to_pb(kv: mvcc::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: b(kv.key),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: b(kv.value),
        lease: kv.lease,
    }
}

pub fn range_from_pb(r: &pb::RangeRequest) -> mvcc::RangeRequest {
    use pb::range_request::{SortOrder as O, SortTarget as T};
    mvcc::RangeRequest {
        key: r.key.to_vec(),
        range_end: r.range_end.to_vec(),
        limit: r.limit,
        revision: r.revision,
        sort_order: match O::try_from(r.sort_order).unwrap_or(O::None) {
            O::None => mvcc::SortOrder::None,
            O::Ascend => mvcc::SortOrder::Ascend,
            O::Descend => mvcc::SortOrder::Descend,
        },
        sort_target: match T::try_from(r.sort_target).unwrap_or(T::Key) {
            T::Key => mvcc::SortTarget::Key,
            T::Version => mvcc::SortTarget::Version,
            T::Create => mvcc::SortTarget::Create,
            T::Mod => mvcc::SortTarget::Mod,
            T::Value => mvcc::SortTarget::Value,
        },
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

pub fn range_to_pb(r: mvcc::RangeResponse, header: pb::ResponseHeader) -> pb::RangeResponse {
    pb::RangeResponse {
        header: Some(pb::ResponseHeader {
            revision: r.revision,
            ..header
        }),
        kvs: r.kvs.into_iter().map(kv_to_pb).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_from_pb(p: &pb::PutRequest) -> mvcc::PutRequest {
    mvcc::PutRequest {
        key: p.key.to_vec(),
        value: p.value.to_vec(),
        lease: p.lease,
        prev_kv: p.prev_kv,
        ignore_value: p.ignore_value,
        ignore_lease: p.ignore_lease,
    }
}

pub fn put_to_pb(r: mvcc::PutResponse, header: pb::ResponseHeader) -> pb::PutResponse {
    pb::PutResponse {
        header: Some(pb::ResponseHeader {
            revision: r.revision,
            ..header
        }),
        prev_kv: r.prev_kv.map(kv_to_pb),
    }
}

pub fn delete_from_pb(d: &pb::DeleteRangeRequest) -> mvcc::DeleteRangeRequest {
    mvcc::DeleteRangeRequest {
        key: d.key.to_vec(),
        range_end: d.range_end.to_vec(),
        prev_kv: d.prev_kv,
    }
}

pub fn delete_to_pb(
    r: mvcc::DeleteRangeResponse,
    header: pb::ResponseHeader,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: Some(pb::ResponseHeader {
            revision: r.revision,
            ..header
        }),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(kv_to_pb).collect(),
    }
}

pub fn compare_from_pb(c: &pb::Compare) -> mvcc::Compare {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result).unwrap_or(R::Equal) {
        R::Equal => mvcc::CompareResult::Equal,
        R::Greater => mvcc::CompareResult::Greater,
        R::Less => mvcc::CompareResult::Less,
        R::NotEqual => mvcc::CompareResult::NotEqual,
    };
    // etcd reads the operand from the union member that matches the target and
    // treats a missing one as zero (or an empty value).
    let target = match T::try_from(c.target).unwrap_or(T::Version) {
        T::Version => mvcc::CompareTarget::Version(match c.target_union {
            Some(U::Version(v)) => v,
            _ => 0,
        }),
        T::Create => mvcc::CompareTarget::CreateRevision(match c.target_union {
            Some(U::CreateRevision(v)) => v,
            _ => 0,
        }),
        T::Mod => mvcc::CompareTarget::ModRevision(match c.target_union {
            Some(U::ModRevision(v)) => v,
            _ => 0,
        }),
        T::Value => mvcc::CompareTarget::Value(match &c.target_union {
            Some(U::Value(v)) => v.to_vec(),
            _ => Vec::new(),
        }),
        T::Lease => mvcc::CompareTarget::Lease(match c.target_union {
            Some(U::Lease(v)) => v,
            _ => 0,
        }),
    };
    mvcc::Compare {
        result,
        target,
        key: c.key.to_vec(),
        range_end: c.range_end.to_vec(),
    }
}

fn op_from_pb(op: &pb::RequestOp) -> Option<mvcc::RequestOp> {
    use pb::request_op::Request as R;
    Some(match op.request.as_ref()? {
        R::RequestRange(r) => mvcc::RequestOp::Range(range_from_pb(r)),
        R::RequestPut(p) => mvcc::RequestOp::Put(put_from_pb(p)),
        R::RequestDeleteRange(d) => mvcc::RequestOp::DeleteRange(delete_from_pb(d)),
        R::RequestTxn(t) => mvcc::RequestOp::Txn(txn_from_pb(t)),
    })
}

/// Empty ops (no request set) are dropped. A client's txn with one is
/// refused before it is proposed (`validate::check_txn`, as etcd refuses
/// it); only entries written before that check can hold one.
pub fn txn_from_pb(t: &pb::TxnRequest) -> mvcc::TxnRequest {
    mvcc::TxnRequest {
        compare: t.compare.iter().map(compare_from_pb).collect(),
        success: t.success.iter().filter_map(op_from_pb).collect(),
        failure: t.failure.iter().filter_map(op_from_pb).collect(),
    }
}

/// The header an op's answer inside a txn starts from: as etcd answers,
/// it carries the op's revision alone (the `*_to_pb` set it), and a nested
/// txn's stays empty.
pub const OP_HEADER: pb::ResponseHeader = pb::ResponseHeader {
    cluster_id: 0,
    member_id: 0,
    revision: 0,
    raft_term: 0,
};

/// An op's answer inside a txn, from [`OP_HEADER`].
fn op_to_pb(op: mvcc::ResponseOp) -> pb::ResponseOp {
    use pb::response_op::Response as R;
    let header = OP_HEADER;
    pb::ResponseOp {
        response: Some(match op {
            mvcc::ResponseOp::Range(r) => R::ResponseRange(range_to_pb(r, header)),
            mvcc::ResponseOp::Put(r) => R::ResponsePut(put_to_pb(r, header)),
            mvcc::ResponseOp::DeleteRange(r) => R::ResponseDeleteRange(delete_to_pb(r, header)),
            mvcc::ResponseOp::Txn(r) => R::ResponseTxn(pb::TxnResponse {
                header: Some(header),
                succeeded: r.succeeded,
                responses: r.responses.into_iter().map(op_to_pb).collect(),
            }),
        }),
    }
}

/// A txn's answer: `header` (the shard's, with its Raft term) at the txn's
/// revision, and its ops' answers (`op_to_pb`).
pub fn txn_to_pb(r: mvcc::TxnResponse, header: pb::ResponseHeader) -> pb::TxnResponse {
    pb::TxnResponse {
        header: Some(pb::ResponseHeader {
            revision: r.revision,
            ..header
        }),
        succeeded: r.succeeded,
        responses: r.responses.into_iter().map(op_to_pb).collect(),
    }
}

/// Sets the revision of a txn's answer and of every op's answer in it,
/// nested txns' included (a nested txn's own header stays empty).
pub fn set_txn_revision(r: &mut pb::TxnResponse, revision: i64) {
    if let Some(h) = r.header.as_mut() {
        h.revision = revision;
    }
    set_ops_revision(&mut r.responses, revision);
}

fn set_ops_revision(ops: &mut [pb::ResponseOp], revision: i64) {
    use pb::response_op::Response as R;
    for op in ops {
        let header = match &mut op.response {
            Some(R::ResponseRange(x)) => x.header.as_mut(),
            Some(R::ResponsePut(x)) => x.header.as_mut(),
            Some(R::ResponseDeleteRange(x)) => x.header.as_mut(),
            Some(R::ResponseTxn(x)) => {
                set_ops_revision(&mut x.responses, revision);
                None
            }
            None => None,
        };
        if let Some(h) = header {
            h.revision = revision;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_reads_the_operand_matching_its_target() {
        let c = pb::Compare {
            result: pb::compare::CompareResult::Greater as i32,
            target: pb::compare::CompareTarget::Mod as i32,
            key: Bytes::from_static(b"k"),
            range_end: Bytes::new(),
            target_union: Some(pb::compare::TargetUnion::ModRevision(7)),
        };
        let m = compare_from_pb(&c);
        assert_eq!(m.result, mvcc::CompareResult::Greater);
        assert_eq!(m.target, mvcc::CompareTarget::ModRevision(7));
        // A union member that does not match the target reads as zero, as in etcd.
        let c = pb::Compare {
            target: pb::compare::CompareTarget::Version as i32,
            target_union: Some(pb::compare::TargetUnion::ModRevision(7)),
            ..c
        };
        assert_eq!(compare_from_pb(&c).target, mvcc::CompareTarget::Version(0));
    }

    #[test]
    fn empty_txn_ops_are_dropped() {
        let t = pb::TxnRequest {
            compare: vec![],
            success: vec![pb::RequestOp { request: None }],
            failure: vec![],
        };
        assert!(txn_from_pb(&t).success.is_empty());
    }
}

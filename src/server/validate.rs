//! Request checks done before a request reaches Raft, as etcd does them in its
//! gRPC layer: a malformed request is refused at once with etcd's error, and never
//! costs a log entry.

use std::collections::BTreeSet;

use cairn_proto::etcdserverpb::{
    range_request, request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest,
    RequestOp, ResponseOp, TxnRequest, TxnResponse,
};

use crate::routing::{RoutingTable, ShardId};
use crate::server::errors::ApiError;

pub fn check_range(r: &RangeRequest) -> Result<(), ApiError> {
    if r.key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    if range_request::SortOrder::try_from(r.sort_order).is_err()
        || range_request::SortTarget::try_from(r.sort_target).is_err()
    {
        return Err(ApiError::InvalidSortOption);
    }
    Ok(())
}

pub fn check_put(r: &PutRequest) -> Result<(), ApiError> {
    if r.key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(ApiError::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(ApiError::LeaseProvided);
    }
    Ok(())
}

pub fn check_delete(r: &DeleteRangeRequest) -> Result<(), ApiError> {
    if r.key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    Ok(())
}

fn check_compare(c: &Compare) -> Result<(), ApiError> {
    if c.key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    Ok(())
}

fn check_op(op: &RequestOp, max_txn_ops: usize) -> Result<(), ApiError> {
    match &op.request {
        Some(request_op::Request::RequestRange(r)) => check_range(r),
        Some(request_op::Request::RequestPut(r)) => check_put(r),
        Some(request_op::Request::RequestDeleteRange(r)) => check_delete(r),
        Some(request_op::Request::RequestTxn(t)) => check_txn(t, max_txn_ops),
        // etcd (3.3 on) refuses an op with no request in it.
        None => Err(ApiError::KeyNotFound),
    }
}

/// etcd's txn checks: op counts, empty keys, and no key written twice in one
/// branch (a put and a delete, or two puts, of the same key). A nested txn
/// may hold what its parent's longest list leaves of `max_txn_ops`.
pub fn check_txn(t: &TxnRequest, max_txn_ops: usize) -> Result<(), ApiError> {
    let ops = t.compare.len().max(t.success.len()).max(t.failure.len());
    if ops > max_txn_ops {
        return Err(ApiError::TooManyOps);
    }
    for c in &t.compare {
        check_compare(c)?;
    }
    for op in t.success.iter().chain(&t.failure) {
        check_op(op, max_txn_ops - ops)?;
    }
    check_no_duplicate_writes(&t.success)?;
    check_no_duplicate_writes(&t.failure)?;
    Ok(())
}

/// Written keys and deleted ranges of one branch, nested txns included.
fn collect_writes(ops: &[RequestOp], puts: &mut Vec<Vec<u8>>, dels: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    for op in ops {
        match &op.request {
            Some(request_op::Request::RequestPut(p)) => puts.push(p.key.to_vec()),
            Some(request_op::Request::RequestDeleteRange(d)) => {
                dels.push((d.key.to_vec(), d.range_end.to_vec()))
            }
            Some(request_op::Request::RequestTxn(t)) => {
                // Only one branch of a nested txn runs; etcd checks each against
                // the outer writes, which the union below over-approximates safely
                // for puts and exactly for the common cases.
                collect_writes(&t.success, puts, dels);
                collect_writes(&t.failure, puts, dels);
            }
            _ => {}
        }
    }
}

fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    if end.is_empty() {
        return key == start;
    }
    if end == b"\0" {
        return key >= start;
    }
    key >= start && key < end
}

fn check_no_duplicate_writes(ops: &[RequestOp]) -> Result<(), ApiError> {
    let mut puts = Vec::new();
    let mut dels = Vec::new();
    // Nested txns may legitimately write the same key in their two branches, so
    // count duplicates only among the direct ops and between direct puts and
    // direct deletes, as etcd does.
    for op in ops {
        match &op.request {
            Some(request_op::Request::RequestPut(p)) => puts.push(p.key.to_vec()),
            Some(request_op::Request::RequestDeleteRange(d)) => {
                dels.push((d.key.to_vec(), d.range_end.to_vec()))
            }
            _ => {}
        }
    }
    let mut seen = BTreeSet::new();
    for k in &puts {
        if !seen.insert(k.clone()) {
            return Err(ApiError::DuplicateKey);
        }
    }
    for (start, end) in &dels {
        if puts.iter().any(|k| in_range(k, start, end)) {
            return Err(ApiError::DuplicateKey);
        }
    }
    // Writes inside nested txns must not collide with this level's direct puts.
    for op in ops {
        if let Some(request_op::Request::RequestTxn(t)) = &op.request {
            for branch in [&t.success, &t.failure] {
                let mut inner_puts = Vec::new();
                let mut inner_dels = Vec::new();
                collect_writes(branch, &mut inner_puts, &mut inner_dels);
                if inner_puts.iter().any(|k| seen.contains(k))
                    || inner_dels
                        .iter()
                        .any(|(s, e)| puts.iter().any(|k| in_range(k, s, e)))
                {
                    return Err(ApiError::DuplicateKey);
                }
            }
        }
    }
    Ok(())
}

/// etcd's read-only txn: every op of both branches is a range (a nested txn
/// or an empty op is not). It is read, not applied: linearizable unless
/// [`txn_is_serializable`].
pub fn txn_is_read_only(t: &TxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .all(|op| matches!(op.request, Some(request_op::Request::RequestRange(_))))
}

/// etcd's serializable txn: every op of both branches is a serializable
/// range (so a txn of compares alone is one).
pub fn txn_is_serializable(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).all(
        |op| matches!(&op.request, Some(request_op::Request::RequestRange(r)) if r.serializable),
    )
}

/// The newest revision a read-only txn's ranges name (0: each reads the
/// current one).
pub fn txn_newest_revision(t: &TxnRequest) -> i64 {
    t.success
        .iter()
        .chain(&t.failure)
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestRange(r)) => Some(r.revision),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Every shard a txn touches: compares and ops of both branches, nested txns
/// included. A txn must stay on one shard.
pub fn txn_shards(t: &TxnRequest, routing: &RoutingTable) -> BTreeSet<ShardId> {
    let mut shards = BTreeSet::new();
    add_txn_shards(t, routing, &mut shards);
    shards
}

fn add_txn_shards(t: &TxnRequest, routing: &RoutingTable, out: &mut BTreeSet<ShardId>) {
    for c in &t.compare {
        out.extend(routing.shards_for_range(&c.key, &c.range_end));
    }
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                out.extend(routing.shards_for_range(&r.key, &r.range_end))
            }
            Some(request_op::Request::RequestPut(p)) => {
                out.insert(routing.shard_for_key(&p.key));
            }
            Some(request_op::Request::RequestDeleteRange(d)) => {
                out.extend(routing.shards_for_range(&d.key, &d.range_end))
            }
            Some(request_op::Request::RequestTxn(inner)) => add_txn_shards(inner, routing, out),
            None => {}
        }
    }
}

/// The shards the writes of the branch a txn took touch, as its answer
/// `resp` tells the branch (a nested txn's by its own answer; both of its
/// branches where the answer has none).
pub fn txn_written_shards(
    t: &TxnRequest,
    resp: &TxnResponse,
    routing: &RoutingTable,
) -> BTreeSet<ShardId> {
    let mut shards = BTreeSet::new();
    add_written_shards(t, resp.succeeded, &resp.responses, routing, &mut shards);
    shards
}

fn add_written_shards(
    t: &TxnRequest,
    succeeded: bool,
    responses: &[ResponseOp],
    routing: &RoutingTable,
    out: &mut BTreeSet<ShardId>,
) {
    let ops = if succeeded { &t.success } else { &t.failure };
    for (i, op) in ops.iter().enumerate() {
        match &op.request {
            Some(request_op::Request::RequestPut(p)) => {
                out.insert(routing.shard_for_key(&p.key));
            }
            Some(request_op::Request::RequestDeleteRange(d)) => {
                out.extend(routing.shards_for_range(&d.key, &d.range_end))
            }
            Some(request_op::Request::RequestTxn(inner)) => {
                match responses.get(i).and_then(|r| r.response.as_ref()) {
                    Some(response_op::Response::ResponseTxn(r)) => {
                        add_written_shards(inner, r.succeeded, &r.responses, routing, out)
                    }
                    _ => {
                        add_written_shards(inner, true, &[], routing, out);
                        add_written_shards(inner, false, &[], routing, out);
                    }
                }
            }
            Some(request_op::Request::RequestRange(_)) | None => {}
        }
    }
}

/// The one shard a txn touches (a txn that touches no key at all, only
/// empty ops, is answered by shard 0), or None when it touches several:
/// then it runs as a txn over several shards (`cross_txn`).
pub fn txn_shard(t: &TxnRequest, routing: &RoutingTable) -> Option<ShardId> {
    let shards = txn_shards(t, routing);
    match shards.len() {
        0 => Some(0),
        1 => shards.iter().next().copied(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn put(k: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: Bytes::copy_from_slice(k.as_bytes()),
                ..Default::default()
            })),
        }
    }

    fn del(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: Bytes::copy_from_slice(k.as_bytes()),
                    range_end: Bytes::copy_from_slice(end.as_bytes()),
                    ..Default::default()
                },
            )),
        }
    }

    #[test]
    fn empty_keys_are_refused() {
        assert_eq!(
            check_range(&RangeRequest::default()),
            Err(ApiError::EmptyKey)
        );
        assert_eq!(check_put(&PutRequest::default()), Err(ApiError::EmptyKey));
        assert_eq!(
            check_delete(&DeleteRangeRequest::default()),
            Err(ApiError::EmptyKey)
        );
    }

    #[test]
    fn put_flags_conflicting_with_payload_are_refused() {
        let p = PutRequest {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            ignore_value: true,
            ..Default::default()
        };
        assert_eq!(check_put(&p), Err(ApiError::ValueProvided));
        let p = PutRequest {
            key: Bytes::from_static(b"k"),
            lease: 7,
            ignore_lease: true,
            ..Default::default()
        };
        assert_eq!(check_put(&p), Err(ApiError::LeaseProvided));
    }

    #[test]
    fn bad_sort_option_is_refused() {
        let r = RangeRequest {
            key: Bytes::from_static(b"k"),
            sort_order: 9,
            ..Default::default()
        };
        assert_eq!(check_range(&r), Err(ApiError::InvalidSortOption));
    }

    #[test]
    fn txn_limits_and_duplicates() {
        let t = TxnRequest {
            success: (0..129).map(|i| put(&format!("k{i}"))).collect(),
            ..Default::default()
        };
        assert_eq!(check_txn(&t, 128), Err(ApiError::TooManyOps));
        // A nested txn has what its parent's longest list leaves.
        let nested = |ops: usize| RequestOp {
            request: Some(request_op::Request::RequestTxn(TxnRequest {
                failure: (0..ops).map(|i| put(&format!("n{i}"))).collect(),
                ..Default::default()
            })),
        };
        let t = TxnRequest {
            success: vec![put("a"), nested(126)],
            ..Default::default()
        };
        assert_eq!(check_txn(&t, 128), Ok(()));
        let t = TxnRequest {
            success: vec![put("a"), nested(127)],
            ..Default::default()
        };
        assert_eq!(check_txn(&t, 128), Err(ApiError::TooManyOps));
        let t = TxnRequest {
            success: vec![put("a"), put("a")],
            ..Default::default()
        };
        assert_eq!(check_txn(&t, 128), Err(ApiError::DuplicateKey));
        let t = TxnRequest {
            success: vec![put("b"), del("a", "c")],
            ..Default::default()
        };
        assert_eq!(check_txn(&t, 128), Err(ApiError::DuplicateKey));
        // The same key in the two branches is fine: only one runs.
        let t = TxnRequest {
            success: vec![put("a")],
            failure: vec![put("a")],
            ..Default::default()
        };
        assert_eq!(check_txn(&t, 128), Ok(()));
    }

    #[test]
    fn an_op_with_no_request_is_refused_as_etcd_refuses_it() {
        let empty = RequestOp { request: None };
        let nested = RequestOp {
            request: Some(request_op::Request::RequestTxn(TxnRequest {
                failure: vec![empty.clone()],
                ..Default::default()
            })),
        };
        for t in [
            TxnRequest {
                success: vec![put("a"), empty.clone()],
                ..Default::default()
            },
            TxnRequest {
                failure: vec![empty.clone()],
                ..Default::default()
            },
            TxnRequest {
                success: vec![nested],
                ..Default::default()
            },
        ] {
            assert_eq!(check_txn(&t, 128), Err(ApiError::KeyNotFound), "{t:?}");
        }
    }

    #[test]
    fn a_txn_names_its_one_shard_or_none_across_shards() {
        let routing = RoutingTable::new(8, 2);
        let mut a = 0;
        let mut b = 0;
        // Find two keys on different shards.
        for i in 0..100 {
            let s = routing.shard_for_key(format!("/x{i}/a/").as_bytes());
            if i == 0 {
                a = s;
            } else if s != a {
                b = i;
                break;
            }
        }
        let t = TxnRequest {
            success: vec![put("/x0/a/k"), put(&format!("/x{b}/a/k"))],
            ..Default::default()
        };
        assert_eq!(txn_shards(&t, &routing).len(), 2);
        assert_eq!(txn_shard(&t, &routing), None);
        let t = TxnRequest {
            success: vec![put("/x0/a/k"), put("/x0/a/j")],
            ..Default::default()
        };
        assert_eq!(txn_shard(&t, &routing), Some(a));

        // The shards written: the branch taken's, a nested txn's by its
        // answer, both of its branches without one.
        let (ka, kb) = ("/x0/a/k".to_string(), format!("/x{b}/a/k"));
        let nested = |answer: Option<bool>| {
            let t = TxnRequest {
                success: vec![get(&kb, false, 0), put(&ka)],
                failure: vec![RequestOp {
                    request: Some(request_op::Request::RequestTxn(TxnRequest {
                        success: vec![put(&kb)],
                        failure: vec![],
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            };
            let inner = answer.map(|succeeded| ResponseOp {
                response: Some(response_op::Response::ResponseTxn(TxnResponse {
                    succeeded,
                    ..Default::default()
                })),
            });
            let resp = TxnResponse {
                succeeded: false,
                responses: inner.into_iter().collect(),
                ..Default::default()
            };
            (t, resp)
        };
        let (t, mut resp) = nested(Some(true));
        assert_eq!(
            txn_written_shards(&t, &resp, &routing),
            BTreeSet::from([b_shard(&routing, b)])
        );
        resp.succeeded = true;
        assert_eq!(txn_written_shards(&t, &resp, &routing), BTreeSet::from([a]));
        let (t, resp) = nested(Some(false));
        assert!(txn_written_shards(&t, &resp, &routing).is_empty());
        let (t, resp) = nested(None);
        assert_eq!(
            txn_written_shards(&t, &resp, &routing),
            BTreeSet::from([b_shard(&routing, b)])
        );
    }

    fn b_shard(routing: &RoutingTable, b: usize) -> ShardId {
        routing.shard_for_key(format!("/x{b}/a/k").as_bytes())
    }

    fn get(k: &str, serializable: bool, revision: i64) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: Bytes::copy_from_slice(k.as_bytes()),
                serializable,
                revision,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn read_only_and_serializable_txns_as_etcd_tells_them() {
        let t = |success: Vec<RequestOp>, failure: Vec<RequestOp>| TxnRequest {
            success,
            failure,
            ..Default::default()
        };
        // No op at all, with or without compares: read-only and
        // serializable, as in etcd.
        let compares_alone = TxnRequest {
            compare: vec![Compare {
                key: Bytes::from_static(b"a"),
                ..Default::default()
            }],
            ..Default::default()
        };
        for t in [t(vec![], vec![]), compares_alone] {
            assert!(txn_is_read_only(&t) && txn_is_serializable(&t), "{t:?}");
        }
        let mixed = t(vec![get("a", true, 0)], vec![get("b", false, 7)]);
        assert!(txn_is_read_only(&mixed) && !txn_is_serializable(&mixed));
        assert_eq!(txn_newest_revision(&mixed), 7);
        let all = t(vec![get("a", true, 3)], vec![get("b", true, 0)]);
        assert!(txn_is_serializable(&all));
        assert_eq!(txn_newest_revision(&all), 3);
        // A write on either branch, or a nested txn even of ranges, is not.
        for writes in [
            t(vec![get("a", true, 0)], vec![put("b")]),
            t(vec![del("a", "")], vec![]),
            t(
                vec![RequestOp {
                    request: Some(request_op::Request::RequestTxn(t(
                        vec![get("a", true, 0)],
                        vec![],
                    ))),
                }],
                vec![],
            ),
        ] {
            assert!(!txn_is_read_only(&writes), "{writes:?}");
            assert!(!txn_is_serializable(&writes), "{writes:?}");
        }
    }
}

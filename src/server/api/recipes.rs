//! What etcd's Lock and Election services share, as etcd 3.4 builds them on
//! its client's concurrency recipes: each contender holds a key
//! `<name>/<lease id in hex>` bound to its lease, contenders take their turn
//! in the order their keys were created, and one waits for every key created
//! before its own to be deleted.
//!
//! Every step is a call of the member's own KV, Lease and Watch services on
//! the client's behalf ([`Caller`]), so auth, quotas, limits and the
//! keyspace's order apply to it as to any client's call.

use bytes::Bytes;
use cairn_proto::etcdserverpb::{
    compare, range_request, request_op, response_op, Compare, DeleteRangeRequest,
    LeaseGrantRequest, LeaseGrantResponse, PutRequest, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, ResponseOp, TxnRequest, TxnResponse, WatchCreateRequest,
};
use cairn_proto::mvccpb::event::EventType;
use cairn_proto::mvccpb::KeyValue;
use tonic::Status;

use super::in_process::Caller;
use crate::routing::prefix_end;

/// TTL of the lease granted for a contender that names none (etcd's
/// session default).
pub const SESSION_TTL_SECS: i64 = 60;

const TXN: &str = "/etcdserverpb.KV/Txn";
const RANGE: &str = "/etcdserverpb.KV/Range";
const DELETE: &str = "/etcdserverpb.KV/DeleteRange";
const GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";

/// The lease a contender's key is bound to: `lease`, or a fresh one of
/// [`SESSION_TTL_SECS`] when it is 0.
pub async fn session_lease(caller: &Caller, lease: i64) -> Result<i64, Status> {
    if lease != 0 {
        return Ok(lease);
    }
    let granted: LeaseGrantResponse = caller
        .unary(
            GRANT,
            &LeaseGrantRequest {
                ttl: SESSION_TTL_SECS,
                id: 0,
            },
        )
        .await?;
    Ok(granted.id)
}

/// `name/`: the prefix of every contender's key.
pub fn contenders_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The key of the contender holding `lease` under `prefix`.
pub fn contender_key(prefix: &[u8], lease: i64) -> Bytes {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key.into()
}

/// The key under `prefix` created first (the holder, or leader), or, with
/// `created_before`, the one created last at or before that revision.
pub fn one_contender(prefix: &[u8], created_before: Option<i64>) -> RangeRequest {
    let order = match created_before {
        None => range_request::SortOrder::Ascend,
        Some(_) => range_request::SortOrder::Descend,
    };
    RangeRequest {
        key: Bytes::copy_from_slice(prefix),
        range_end: prefix_end(prefix).into(),
        limit: 1,
        sort_order: order as i32,
        sort_target: range_request::SortTarget::Create as i32,
        max_create_revision: created_before.unwrap_or(0),
        ..RangeRequest::default()
    }
}

/// "`key`'s create revision is `revision`" (0: the key does not exist).
pub fn created_at(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: Bytes::copy_from_slice(key),
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        ..Compare::default()
    }
}

pub fn put_op(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
            lease,
            ..PutRequest::default()
        })),
    }
}

pub fn range_op(range: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(range)),
    }
}

pub fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: Bytes::copy_from_slice(key),
                ..DeleteRangeRequest::default()
            },
        )),
    }
}

/// A header's revision; 0 without one.
pub fn revision(header: &Option<ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

/// A contender's key after [`enter`]: put now, or found where its lease
/// contends already.
pub struct Entered {
    /// The txn's answer: its header, and `also`'s answer second.
    pub answer: TxnResponse,
    /// The key's create revision: its place among the contenders.
    pub created: i64,
    /// The key as it was, when its lease contended already.
    pub existing: Option<KeyValue>,
}

/// The first step of Lock and Campaign, one txn as etcd's recipes make it:
/// puts `key` holding `value` under `lease` unless it exists, else reads
/// it; `also` is read in the same txn either way (Lock reads the holder).
pub async fn enter(
    caller: &Caller,
    key: &Bytes,
    value: &[u8],
    lease: i64,
    also: Option<RequestOp>,
) -> Result<Entered, Status> {
    let own = range_op(RangeRequest {
        key: key.clone(),
        ..RangeRequest::default()
    });
    let answer = txn(
        caller,
        TxnRequest {
            compare: vec![created_at(key, 0)],
            success: std::iter::once(put_op(key, value, lease))
                .chain(also.clone())
                .collect(),
            failure: std::iter::once(own).chain(also).collect(),
        },
    )
    .await?;
    let existing = if answer.succeeded {
        None
    } else {
        let found = ranged(answer.responses.first())?.kvs.first().cloned();
        Some(found.ok_or_else(|| Status::internal("a contender's key vanished within its txn"))?)
    };
    let created = existing
        .as_ref()
        .map_or_else(|| revision(&answer.header), |kv| kv.create_revision);
    Ok(Entered {
        answer,
        created,
        existing,
    })
}

/// The range answer of a txn's op.
pub fn ranged(op: Option<&ResponseOp>) -> Result<&RangeResponse, Status> {
    match op.and_then(|op| op.response.as_ref()) {
        Some(response_op::Response::ResponseRange(r)) => Ok(r),
        _ => Err(Status::internal(
            "a txn answered no range where one was asked",
        )),
    }
}

pub async fn txn(caller: &Caller, txn: TxnRequest) -> Result<TxnResponse, Status> {
    caller.unary(TXN, &txn).await
}

pub async fn range(caller: &Caller, range: RangeRequest) -> Result<RangeResponse, Status> {
    caller.unary(RANGE, &range).await
}

/// Deletes `key`: etcd's Unlock.
pub async fn delete(caller: &Caller, key: &[u8]) -> Result<Option<ResponseHeader>, Status> {
    let deleted: cairn_proto::etcdserverpb::DeleteRangeResponse = caller
        .unary(
            DELETE,
            &DeleteRangeRequest {
                key: Bytes::copy_from_slice(key),
                ..DeleteRangeRequest::default()
            },
        )
        .await?;
    Ok(deleted.header)
}

/// Deletes `key` if it was created at `created`, so a leader's key that a
/// newer campaign replaced is left alone: etcd's Resign. Answers the txn's
/// header.
pub async fn resign(
    caller: &Caller,
    key: &[u8],
    created: i64,
) -> Result<Option<ResponseHeader>, Status> {
    let answer = txn(
        caller,
        TxnRequest {
            compare: vec![created_at(key, created)],
            success: vec![delete_op(key)],
            failure: Vec::new(),
        },
    )
    .await?;
    Ok(answer.header)
}

/// A contender's key, taken back when the call that waits for its turn
/// ends before [`Withdrawal::forget`]: dropped (the client went away or
/// its deadline passed) or returning early. The deletion runs as a task
/// of its own, as the dropped call can no longer wait for it.
pub struct Withdrawal {
    caller: Caller,
    key: Bytes,
    /// Delete only if the key was created at this revision ([`resign`]).
    created: Option<i64>,
    armed: bool,
}

impl Withdrawal {
    /// Deletes `key` whatever it holds (a lock waiter's key).
    pub fn delete(caller: Caller, key: Bytes) -> Withdrawal {
        Withdrawal {
            caller,
            key,
            created: None,
            armed: true,
        }
    }

    /// Resigns `key` created at `created` (a campaigner's key).
    pub fn resign(caller: Caller, key: Bytes, created: i64) -> Withdrawal {
        Withdrawal {
            caller,
            key,
            created: Some(created),
            armed: true,
        }
    }

    /// The call reached its end: the key stays.
    pub fn forget(mut self) {
        self.armed = false;
    }
}

impl Drop for Withdrawal {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // The member is stopping: the key goes with its lease.
            return;
        };
        let (caller, key, created) = (
            self.caller.clone(),
            std::mem::take(&mut self.key),
            self.created,
        );
        runtime.spawn(async move {
            let withdrawn = match created {
                None => delete(&caller, &key).await,
                Some(created) => resign(&caller, &key, created).await,
            };
            if let Err(status) = withdrawn {
                tracing::debug!(
                    key = %String::from_utf8_lossy(&key),
                    %status,
                    "a contender's key could not be taken back; it goes with its lease"
                );
            }
        });
    }
}

/// Waits until no key under `prefix` created at or before `max_create_rev`
/// is left: the contenders ahead of one whose key was created next. Watches
/// the last created of them until it is deleted, then looks again. Answers
/// the header of the read that found none.
pub async fn wait_deletes(
    caller: &Caller,
    prefix: &[u8],
    max_create_rev: i64,
) -> Result<Option<ResponseHeader>, Status> {
    loop {
        let ahead = range(caller, one_contender(prefix, Some(max_create_rev))).await?;
        let Some(last) = ahead.kvs.first() else {
            return Ok(ahead.header);
        };
        let from = revision(&ahead.header);
        wait_delete(caller, &last.key, from).await?;
    }
}

/// Waits for `key`'s deletion at or after revision `from`.
async fn wait_delete(caller: &Caller, key: &[u8], from: i64) -> Result<(), Status> {
    let mut events = caller
        .watch(WatchCreateRequest {
            key: Bytes::copy_from_slice(key),
            start_revision: from,
            ..WatchCreateRequest::default()
        })
        .await?;
    while let Some(answer) = events.next().await? {
        if answer
            .events
            .iter()
            .any(|e| e.r#type == EventType::Delete as i32)
        {
            return Ok(());
        }
        if answer.canceled {
            return Err(watch_refused(&answer));
        }
    }
    Err(Status::unknown("lost watcher waiting for delete"))
}

/// Why a watch a recipe opened was cancelled by the member.
pub fn watch_refused(answer: &cairn_proto::etcdserverpb::WatchResponse) -> Status {
    if answer.compact_revision > 0 {
        // etcd's client turns the refusal into a plain error, which its
        // services pass on as code Unknown.
        return Status::unknown("etcdserver: mvcc: required revision has been compacted");
    }
    if answer.cancel_reason.is_empty() {
        Status::unknown("watch canceled")
    } else {
        Status::unknown(answer.cancel_reason.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_are_named_by_their_lease_in_hex() {
        let prefix = contenders_prefix(b"lock");
        assert_eq!(prefix, b"lock/");
        assert_eq!(
            &contender_key(&prefix, 0x694d_1a2b_3c4d)[..],
            b"lock/694d1a2b3c4d"
        );
        let holder = one_contender(&prefix, None);
        assert_eq!(&holder.range_end[..], b"lock0");
        assert_eq!(holder.sort_order, range_request::SortOrder::Ascend as i32);
        assert_eq!(holder.max_create_revision, 0);
        let ahead = one_contender(&prefix, Some(41));
        assert_eq!(ahead.sort_order, range_request::SortOrder::Descend as i32);
        assert_eq!(ahead.max_create_revision, 41);
    }
}

//! What each KV and Lease request needs permission for, as etcd checks it:
//! a Range reads its range; a Put writes its key (and reads it with
//! `prev_kv`); a DeleteRange writes its range (and reads it with `prev_kv`);
//! a Txn reads every compare's key or range and needs what each of its
//! operations needs, on both branches; attaching a key to a lease, or revoking
//! one, needs write permission on every key the lease holds.

use cairn_proto::authpb::permission::Type as PermType;
use cairn_proto::etcdserverpb::{
    request_op, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use super::{AuthStore, Caller};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;

pub fn range(auth: &AuthStore, caller: Option<&Caller>, r: &RangeRequest) -> Result<(), ApiError> {
    auth.check(caller, &r.key, &r.range_end, PermType::Read)
}

pub fn put(auth: &AuthStore, caller: Option<&Caller>, r: &PutRequest) -> Result<(), ApiError> {
    auth.check(caller, &r.key, b"", PermType::Write)?;
    if r.prev_kv {
        auth.check(caller, &r.key, b"", PermType::Read)?;
    }
    Ok(())
}

pub fn delete(
    auth: &AuthStore,
    caller: Option<&Caller>,
    r: &DeleteRangeRequest,
) -> Result<(), ApiError> {
    auth.check(caller, &r.key, &r.range_end, PermType::Write)?;
    if r.prev_kv {
        auth.check(caller, &r.key, &r.range_end, PermType::Read)?;
    }
    Ok(())
}

/// Checks a txn's compares and operations; the leases its puts attach keys
/// to, for [`lease_keys`].
pub fn txn(
    auth: &AuthStore,
    caller: Option<&Caller>,
    t: &TxnRequest,
) -> Result<Vec<i64>, ApiError> {
    for c in &t.compare {
        auth.check(caller, &c.key, &c.range_end, PermType::Read)?;
    }
    let mut leases = Vec::new();
    ops(
        auth,
        caller,
        t.success.iter().chain(&t.failure),
        &mut leases,
    )?;
    Ok(leases)
}

fn ops<'a>(
    auth: &AuthStore,
    caller: Option<&Caller>,
    list: impl Iterator<Item = &'a RequestOp>,
    leases: &mut Vec<i64>,
) -> Result<(), ApiError> {
    for op in list {
        match &op.request {
            Some(request_op::Request::RequestRange(r)) => range(auth, caller, r)?,
            Some(request_op::Request::RequestPut(p)) => {
                put(auth, caller, p)?;
                if p.lease != 0 {
                    leases.push(p.lease);
                }
            }
            Some(request_op::Request::RequestDeleteRange(d)) => delete(auth, caller, d)?,
            Some(request_op::Request::RequestTxn(t)) => {
                for c in &t.compare {
                    auth.check(caller, &c.key, &c.range_end, PermType::Read)?;
                }
                ops(auth, caller, t.success.iter().chain(&t.failure), leases)?;
            }
            None => {}
        }
    }
    Ok(())
}

/// Checks the caller may write every key lease `id` holds (on any shard): a
/// user who could not revoke a lease may neither revoke it nor attach more
/// keys to it. The root role may always.
pub async fn lease_keys(
    auth: &AuthStore,
    caller: Option<&Caller>,
    router: &Router,
    id: i64,
) -> Result<(), ApiError> {
    if id == 0 || !auth.is_enabled() || auth.check_admin(caller).is_ok() {
        return Ok(());
    }
    for shard in router.routing.shard_ids() {
        // This member's copy: the keys are applied state, known to every
        // member (only a lease's remaining time needs its leader).
        if let Some(keys) = router.lease_keys(shard, id).await? {
            for key in &keys {
                auth.check(caller, key, b"", PermType::Write)?;
            }
        }
    }
    Ok(())
}

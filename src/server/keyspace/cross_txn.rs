//! Txns over several shards, run by the keyspace leader (docs/KEYSPACE.md,
//! "Transactions over several shards").
//!
//! 1. **Hold** every shard the txn touches, all at once once the member's
//!    [`HoldTable`](crate::server::keyspace::hold_table::HoldTable) gives the txn all of them
//!    (so two txns never wait for each other, and none holds a shard while
//!    it waits for another): a held shard gives no entry a revision and
//!    answers read points only once the hold ends.
//! 2. **Compare**, in the same request as the hold: each shard evaluates
//!    every compare over its own keys once the entries proposed before its
//!    hold are applied, so it answers for the keyspace as it is until the
//!    hold ends. The answers decide the branches.
//! 3. Take the txn's revision `T` from the counter: every entry of the held
//!    shards proposed so far has a revision below it, and none proposed
//!    until the shard's part will have one above.
//! 4. **Check** each written shard's ops (what would refuse them on apply),
//!    and read the ranges of shards the txn only reads; let those go.
//! 5. **Propose** each written shard's part at `T`. With more than one, each
//!    part carries the whole plan, which the shard's store keeps until every
//!    part is applied: a keyspace leader that opens after a failure
//!    proposes the parts its shards lack from any record it finds
//!    ([`finish_earlier`]) before it assigns a revision.
//! 6. Merge the parts' answers into one etcd answer at `T`, and have the
//!    shards forget the plan.
//!
//! Nothing is proposed before step 5, so an error up to there leaves no
//! trace and the request may be retried. An error after it is etcd's
//! "request timed out, possibly due to previous leader failure": the txn is
//! applied whole or not at all, and a read tells which.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_proto::cairnpb::{CrossTxnPart, CrossTxnPlan, CrossTxnShardOps};
use cairn_proto::etcdserverpb::{
    request_op, response_op, Compare, RequestOp, ResponseOp, TxnRequest, TxnResponse,
};
use futures::future::join_all;
use prost::Message;

use crate::routing::ShardId;
use crate::server::command::{CrossHeld, ReadAt, ShardCommand, WriteResult};
use crate::server::errors::ApiError;
use crate::server::keyspace::cross_plan::{all_compares, combine, Plan};
use crate::server::keyspace::hold_table::Taken;
use crate::server::keyspace::router::{Answer, Router};
use crate::server::keyspace::txn_batch::{Batch, Entry};
use crate::server::keyspace::Keyspace;
use crate::server::revisions::KeyspaceMutation;
use crate::server::validate;

/// Numbers the txns over several shards this member runs, for the holds.
static NEXT_TXN: AtomicU64 = AtomicU64::new(1);

/// Runs `req`, which touches several shards, with this member as the
/// keyspace leader: alone, or in a batch with other txns over the same
/// shards (see [`crate::server::keyspace::txn_batch`]). Refused with [`ApiError::NotLeader`]
/// (nothing proposed) where it is not.
pub async fn run(router: Arc<Router>, req: TxnRequest) -> Result<TxnResponse, ApiError> {
    let Some(keyspace) = router.keyspace.clone() else {
        return Err(ApiError::Unsupported(
            "a txn over several shards with one shard",
        ));
    };
    let shards: Vec<ShardId> = validate::txn_shards(&req, &router.routing)
        .into_iter()
        .collect();
    let mut keys = crate::server::shard::txn_ranges(&req);
    if keyspace
        .counter
        .mutated(KeyspaceMutation::JoinIgnoresOverlap)
    {
        // A batch that knows no key of this txn lets it join whatever it names.
        keys.clear();
    }
    let leading = match keyspace.batches.enter(&shards, keys, req) {
        Entry::Joined(answer) => {
            // The batch's leader answers; its task ending first means the
            // outcome is not known here.
            return answer.await.unwrap_or(Err(ApiError::TimeoutLeaderFail));
        }
        Entry::Lead(leading) => leading,
    };
    let txn = NEXT_TXN.fetch_add(1, Ordering::Relaxed);
    let taken = keyspace.holds.take(&shards).await;
    let batch = leading.close();
    let mut answers = held(&router, &keyspace, txn, &shards, &batch, taken).await;
    let mine = answers.remove(0);
    for (reply, answer) in batch.joined.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
    mine
}

/// What a txn of a batch is once its compares are read and its ops checked.
enum Step {
    /// Answered: it writes nothing.
    Done(TxnResponse),
    /// Its parts are to be proposed at `revision`.
    Write {
        revision: i64,
        plan: Plan,
        /// The answers of the shards it only reads.
        answers: BTreeMap<ShardId, Vec<ResponseOp>>,
    },
}

/// A txn of a batch once the writing ones' parts are queued.
enum Settling {
    Done(TxnResponse),
    Queued {
        revision: i64,
        plan: Plan,
        /// The answers of the shards it only reads.
        answers: BTreeMap<ShardId, Vec<ResponseOp>>,
    },
}

/// Steps 1 to 6 (see the module doc) for the txns of `batch` (held as
/// `txn`), which name no key in common, in their order. Ends every hold:
/// a written shard's with the proposal of its parts, the others here.
async fn held(
    router: &Router,
    keyspace: &Keyspace,
    txn: u64,
    shards: &[ShardId],
    batch: &Batch,
    taken: Taken,
) -> Vec<Result<TxnResponse, ApiError>> {
    let reqs = &batch.txns;
    // Every txn's compares, asked of each shard in one hold with the
    // batch's keys.
    let mut compares = Vec::new();
    let mut spans = Vec::with_capacity(reqs.len());
    for r in reqs {
        let from = compares.len();
        all_compares(r, &mut compares);
        spans.push(from..compares.len());
    }
    let txns = u32::try_from(reqs.len()).unwrap_or(u32::MAX);
    let held = match hold_all(router, txn, txns, shards, &compares, &batch.keys).await {
        Ok(held) => held,
        Err(e) => {
            // The shards that granted the hold let it go.
            for &s in shards {
                router.tell(s, ShardCommand::CrossRelease { txn }).await;
            }
            return vec![Err(e); reqs.len()];
        }
    };
    let no_space = held.iter().any(|h| h.no_space);
    // Revisions in the batch's order. No txn of the batch touches another's
    // keys, so what each shard answered for a txn's compares is the
    // keyspace just before its own revision.
    let mut planned = Vec::with_capacity(reqs.len());
    for (r, span) in reqs.iter().zip(&spans) {
        let Some(revision) = keyspace.counter.next_revision() else {
            planned.push(Err(ApiError::NoLeader));
            continue;
        };
        let per_shard: Vec<Vec<Option<bool>>> = held
            .iter()
            .map(|h| h.compares[span.clone()].to_vec())
            .collect();
        let outcomes = combine(&compares[span.clone()], &per_shard);
        planned.push(Ok((revision, Plan::of(r, &outcomes, &router.routing))));
    }
    let steps = join_all(planned.into_iter().map(|p| async move {
        let (revision, plan) = p?;
        prepare(router, txn, revision, plan, no_space).await
    }))
    .await;
    // Each written shard proposes the batch's parts there in one entry
    // (revisions ascending), which ends its hold; the others are let go.
    let mut per_shard: BTreeMap<ShardId, Vec<(i64, CrossTxnPart)>> = BTreeMap::new();
    let mut settling = Vec::with_capacity(steps.len());
    for step in steps {
        settling.push(match step {
            Ok(Step::Write {
                revision,
                plan,
                answers,
            }) => {
                for (shard, part) in parts_of(revision, &plan) {
                    per_shard.entry(shard).or_default().push((revision, part));
                }
                Ok(Settling::Queued {
                    revision,
                    plan,
                    answers,
                })
            }
            Ok(Step::Done(answer)) => Ok(Settling::Done(answer)),
            Err(e) => Err(e),
        });
    }
    for &s in shards.iter().filter(|s| !per_shard.contains_key(s)) {
        router.tell(s, ShardCommand::CrossRelease { txn }).await;
    }
    let queued = queue_parts(router, txn, per_shard).await;
    // Queued ahead of any later txn's hold from this core: the next txn
    // over these shards may go (a hold it asks from another core waits at
    // the shard).
    drop(taken);
    let mut per_part = settle_shards(queued).await;
    let mut records = Vec::new();
    let answers = settling
        .into_iter()
        .map(|step| match step? {
            Settling::Done(answer) => Ok(answer),
            Settling::Queued {
                revision,
                plan,
                mut answers,
            } => {
                // Each written shard's next answer is this txn's, taken even
                // when another of its parts failed, so that the next txn
                // gets its own.
                let parts = take_parts(&mut per_part, &plan.written)?;
                answers.extend(parts);
                // Only a txn whose every part applied has its records
                // forgotten: any other is finished from them by an opening.
                // Its parts keep records when it writes several shards.
                if plan.written.len() > 1 {
                    records.push((revision, plan.written.iter().copied().collect()));
                }
                Ok(plan.answer(answers, revision))
            }
        })
        .collect();
    forget(router, records).await;
    answers
}

/// Takes a txn's answer from each shard it writes (the next answer of each:
/// parts were queued in the batch's order), all of them even when one
/// failed. Its responses per shard, or etcd's "request timed out" when any
/// part did not apply as a txn part (its outcome is not known here).
fn take_parts(
    per_part: &mut BTreeMap<ShardId, std::vec::IntoIter<Result<WriteResult, ApiError>>>,
    written: &BTreeSet<ShardId>,
) -> Result<BTreeMap<ShardId, Vec<ResponseOp>>, ApiError> {
    let mut answers = BTreeMap::new();
    let mut failed = false;
    for &s in written {
        match per_part.get_mut(&s).and_then(Iterator::next) {
            Some(Ok(WriteResult::Txn(r))) => {
                answers.insert(s, r.responses);
            }
            _ => failed = true,
        }
    }
    if failed {
        return Err(ApiError::TimeoutLeaderFail);
    }
    Ok(answers)
}

/// A written txn's parts at `revision`, one per written shard, each
/// carrying the whole plan as its record when there are several.
fn parts_of(revision: i64, plan: &Plan) -> Vec<(ShardId, CrossTxnPart)> {
    let parts: Vec<CrossTxnShardOps> = plan
        .written
        .iter()
        .map(|&s| CrossTxnShardOps {
            shard: s,
            ops: Some(ops_txn(&plan.ops[&s])),
            revoke_lease: 0,
            subs: plan.subs[&s].clone(),
        })
        .collect();
    shard_parts(revision, parts)
}

/// `parts` as each shard proposes it: with the whole plan as its record
/// when there are several.
fn shard_parts(revision: i64, parts: Vec<CrossTxnShardOps>) -> Vec<(ShardId, CrossTxnPart)> {
    let record = if parts.len() > 1 {
        Bytes::from(
            CrossTxnPlan {
                revision,
                parts: parts.clone(),
            }
            .encode_to_vec(),
        )
    } else {
        Bytes::new()
    };
    parts
        .into_iter()
        .map(|p| {
            (
                p.shard,
                CrossTxnPart {
                    ops: p.ops,
                    plan: record.clone(),
                    revoke_lease: p.revoke_lease,
                    subs: p.subs,
                },
            )
        })
        .collect()
}

/// Step 6's wait: each shard's answers to its `count` parts once applied
/// here, in the order they were queued; a shard that failed answers each
/// part with etcd's "request timed out" (the outcome is not known here).
async fn settle_shards(
    queued: Vec<(ShardId, usize, Result<Answer<WriteResult>, ApiError>)>,
) -> BTreeMap<ShardId, std::vec::IntoIter<Result<WriteResult, ApiError>>> {
    join_all(queued.into_iter().map(|(s, count, answer)| async move {
        let got = match answer {
            Ok(a) => a.within(crate::server::command::REQUEST_TIMEOUT).await,
            Err(e) => Err(e),
        };
        let parts = match got {
            Ok(WriteResult::Parts(parts)) if parts.len() == count && count > 1 => parts,
            Ok(one) if count == 1 => vec![Ok(one)],
            Ok(_) => vec![Err(ApiError::TimeoutLeaderFail); count],
            Err(e) => {
                tracing::warn!(
                    shard = s,
                    parts = count,
                    error = %e,
                    "txns over several shards have an unknown outcome here"
                );
                vec![Err(ApiError::TimeoutLeaderFail); count]
            }
        };
        (s, parts.into_iter())
    }))
    .await
    .into_iter()
    .collect()
}

/// Steps 3 and 4 for one txn at `revision`: the checks of what a shard's
/// state could refuse, and the ranges of the shards it only reads.
async fn prepare(
    router: &Router,
    txn: u64,
    revision: i64,
    plan: Plan,
    no_space: bool,
) -> Result<Step, ApiError> {
    if no_space && plan.puts() {
        return Err(ApiError::NoSpace);
    }
    // Ops a shard's state may refuse are checked before any part is
    // proposed; others (puts of a key and value, deletes, ranges at the
    // current revision) are never refused on apply.
    let checks = join_all(plan.ops.iter().filter(|(_, ops)| may_be_refused(ops)).map(
        |(&s, ops)| {
            let ops = ops.clone();
            router.ask(s, move |reply| ShardCommand::CrossCheck {
                txn,
                ops,
                revision,
                reply,
            })
        },
    ))
    .await;
    for c in checks {
        c?;
    }
    // The shards only read: read now, at the keyspace just before the txn.
    let mut answers: BTreeMap<ShardId, Vec<ResponseOp>> = BTreeMap::new();
    for (&s, ops) in plan.ops.iter().filter(|(s, _)| !plan.written.contains(s)) {
        let ranges = join_all(ops.iter().map(|op| match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                router.range_at(s, r.clone(), ReadAt::cut(revision - 1))
            }
            _ => unreachable!("a shard the txn does not write has only ranges"),
        }))
        .await;
        let mut got = Vec::with_capacity(ranges.len());
        for r in ranges {
            got.push(ResponseOp {
                response: Some(response_op::Response::ResponseRange(r?)),
            });
        }
        answers.insert(s, got);
    }
    if plan.written.is_empty() {
        return Ok(Step::Done(plan.answer(answers, revision - 1)));
    }
    Ok(Step::Write {
        revision,
        plan,
        answers,
    })
}

/// Step 1: asks every hold of `txn` at once (the hold table gave it its
/// shards: no other txn of this member holds or waits first for any of
/// them); each shard's answer, in `shards`' order.
async fn hold_all(
    router: &Router,
    txn: u64,
    txns: u32,
    shards: &[ShardId],
    compares: &[Compare],
    keys: &[(Bytes, Bytes)],
) -> Result<Vec<CrossHeld>, ApiError> {
    join_all(shards.iter().map(|&s| {
        router.ask(s, |reply| ShardCommand::CrossHold {
            txn,
            txns,
            compares: compares.to_vec(),
            keys: keys.to_vec(),
            reply,
        })
    }))
    .await
    .into_iter()
    .collect()
}

/// Step 5: queues each held shard's parts (revisions ascending) for
/// proposal as one entry, which ends its hold; with each, how many parts
/// it has.
async fn queue_parts(
    router: &Router,
    txn: u64,
    per_shard: BTreeMap<ShardId, Vec<(i64, CrossTxnPart)>>,
) -> Vec<(ShardId, usize, Result<Answer<WriteResult>, ApiError>)> {
    let mut queued = Vec::with_capacity(per_shard.len());
    for (s, parts) in per_shard {
        let count = parts.len();
        let answer = router
            .queue(s, move |reply| ShardCommand::CrossPropose {
                txn,
                parts,
                reply,
            })
            .await;
        queued.push((s, count, answer));
    }
    queued
}

/// Has each shard forget, in one entry, the records of the txns at the
/// revisions given for it (every part of those txns is applied). A record
/// not forgotten (this member stopped leading) is forgotten by the next
/// opening's finishing.
async fn forget(router: &Router, records: impl IntoIterator<Item = (i64, Vec<ShardId>)>) {
    let mut per_shard: BTreeMap<ShardId, Vec<i64>> = BTreeMap::new();
    for (revision, shards) in records {
        for s in shards {
            per_shard.entry(s).or_default().push(revision);
        }
    }
    for (s, revisions) in per_shard {
        let (reply, _) = crate::server::command::Reply::channel();
        router
            .tell(s, ShardCommand::CrossForget { revisions, reply })
            .await;
    }
}

/// Revokes lease `id` on every shard that has it, at one revision, the way
/// a txn over several shards writes (the keys of the lease on every shard
/// are deleted at that revision); its revision. Refused with
/// [`ApiError::NotLeader`] where this member is not the keyspace leader, and
/// with [`ApiError::LeaseNotFound`] where no shard has the lease.
pub async fn revoke_lease(router: Arc<Router>, id: i64) -> Result<i64, ApiError> {
    let Some(keyspace) = router.keyspace.clone() else {
        return Err(ApiError::Unsupported(
            "a lease revoke over several shards with one shard",
        ));
    };
    let shards: Vec<ShardId> = router.routing.shard_ids().collect();
    let txn = NEXT_TXN.fetch_add(1, Ordering::Relaxed);
    let taken = keyspace.holds.take(&shards).await;
    let answer = revoke_held(&router, &keyspace, txn, &shards, id, taken).await;
    for &s in &shards {
        router.tell(s, ShardCommand::CrossRelease { txn }).await;
    }
    answer
}

async fn revoke_held(
    router: &Router,
    keyspace: &Keyspace,
    txn: u64,
    shards: &[ShardId],
    id: i64,
    taken: Taken,
) -> Result<i64, ApiError> {
    // No compares; every key, since the lease's keys are not named: the
    // hold is answered once every entry before it is applied, so that the
    // lease's presence below is current.
    let every_key = [(Bytes::from_static(b"\0"), Bytes::from_static(b"\0"))];
    hold_all(router, txn, 1, shards, &[], &every_key).await?;
    let revision = keyspace.counter.next_revision().ok_or(ApiError::NoLeader)?;
    let has = join_all(
        shards
            .iter()
            .map(|&s| router.ask(s, |reply| ShardCommand::CrossHasLease { txn, id, reply })),
    )
    .await;
    let mut parts = Vec::new();
    for (&s, has) in shards.iter().zip(has) {
        if has? {
            parts.push(CrossTxnShardOps {
                shard: s,
                ops: None,
                revoke_lease: id,
                subs: Vec::new(),
            });
        } else {
            router.tell(s, ShardCommand::CrossRelease { txn }).await;
        }
    }
    if parts.is_empty() {
        return Err(ApiError::LeaseNotFound);
    }
    let parts = shard_parts(revision, parts);
    let record = (parts.len() > 1).then(|| (revision, parts.iter().map(|p| p.0).collect()));
    let per_shard = parts
        .into_iter()
        .map(|(s, part)| (s, vec![(revision, part)]))
        .collect();
    let queued = queue_parts(router, txn, per_shard).await;
    drop(taken);
    for (_, mut answer) in settle_shards(queued).await {
        answer.next().unwrap_or(Err(ApiError::TimeoutLeaderFail))?;
    }
    forget(router, record).await;
    Ok(revision)
}

/// Revokes, on every shard at one revision, the leases shard 0's leader
/// finds expired, for as long as the member runs.
pub async fn revoke_expired_leases(router: Arc<Router>) {
    let Some(keyspace) = router.keyspace.clone() else {
        return;
    };
    loop {
        for id in keyspace.counter.take_expired_leases().await {
            match revoke_lease(router.clone(), id).await {
                Ok(revision) => {
                    tracing::debug!(lease = id, revision, "lease expired; revoked")
                }
                Err(ApiError::LeaseNotFound) => {}
                // It comes due again after the retry delay.
                Err(e) => {
                    tracing::debug!(lease = id, error = %e, "revoking an expired lease failed")
                }
            }
        }
    }
}

/// Whether a shard's state may refuse `ops` on apply (see
/// `mvcc::Store::check_ops`): a put naming a lease or keeping the key's
/// value or lease, or a range at a past revision. Empty keys and sizes were
/// refused with the request.
fn may_be_refused(ops: &[RequestOp]) -> bool {
    ops.iter().any(|op| match &op.request {
        Some(request_op::Request::RequestPut(p)) => {
            p.lease != 0 || p.ignore_value || p.ignore_lease
        }
        Some(request_op::Request::RequestRange(r)) => r.revision != 0,
        _ => false,
    })
}

/// A txn whose ops are `ops`, without compares: a shard's part.
fn ops_txn(ops: &[RequestOp]) -> TxnRequest {
    TxnRequest {
        compare: Vec::new(),
        success: ops.to_vec(),
        failure: Vec::new(),
    }
}

/// Before this member assigns revisions as keyspace leader: proposes every
/// part its shards lack of each txn over several shards a shard holds a
/// record of (one part applied means all must be), then has the records
/// forgotten. Answers how many parts were proposed. An error leaves the
/// counter closed; the caller tries again while the opening stands.
pub async fn finish_earlier(router: &Router) -> Result<usize, ApiError> {
    let shards: Vec<ShardId> = router.routing.shard_ids().collect();
    let found = join_all(
        shards
            .iter()
            .map(|&s| router.ask(s, |reply| ShardCommand::CrossRecords { reply })),
    )
    .await;
    let mut reached = BTreeMap::new();
    let mut plans: BTreeMap<i64, (Vec<u8>, BTreeSet<ShardId>)> = BTreeMap::new();
    for (&s, f) in shards.iter().zip(found) {
        let f = f?;
        reached.insert(s, f.revision);
        for (revision, plan) in f.records {
            plans
                .entry(revision)
                .or_insert_with(|| (plan, BTreeSet::new()))
                .1
                .insert(s);
        }
    }
    let mut proposed = 0;
    let finishing = router
        .keyspace
        .as_ref()
        .is_none_or(|k| !k.counter.mutated(KeyspaceMutation::NoFinishing));
    for (revision, (bytes, mut holders)) in plans.into_iter().filter(|_| finishing) {
        let plan = CrossTxnPlan::decode(bytes.as_slice()).map_err(|e| ApiError::Storage {
            shard: holders.first().copied().unwrap_or(0),
            reason: format!("the record of the txn at revision {revision} does not decode: {e}"),
        })?;
        for part in &plan.parts {
            if reached.get(&part.shard).is_none_or(|&r| r >= revision) {
                continue;
            }
            let part_msg = CrossTxnPart {
                ops: part.ops.clone(),
                plan: Bytes::from(bytes.clone()),
                revoke_lease: part.revoke_lease,
                subs: part.subs.clone(),
            };
            router
                .ask(part.shard, |reply| ShardCommand::CrossPropose {
                    txn: 0,
                    parts: vec![(revision, part_msg)],
                    reply,
                })
                .await?;
            tracing::info!(
                shard = part.shard,
                revision,
                "finished a txn over several shards an earlier leader left half-proposed"
            );
            holders.insert(part.shard);
            proposed += 1;
        }
        for &s in &holders {
            router
                .ask(s, |reply| ShardCommand::CrossForget {
                    revisions: vec![revision],
                    reply,
                })
                .await?;
        }
    }
    Ok(proposed)
}

/// Runs the finishing for every opening of the keyspace counter on this
/// member, for as long as the member runs.
pub async fn finish_at_every_opening(router: Arc<Router>) {
    let Some(keyspace) = router.keyspace.clone() else {
        return;
    };
    loop {
        let generation = keyspace.counter.opening_wanted().await;
        let started = Instant::now();
        match finish_earlier(&router).await {
            Ok(parts) => {
                if keyspace.counter.finished(generation) && parts > 0 {
                    tracing::info!(parts, took = ?started.elapsed(), "earlier txns over several shards finished");
                }
            }
            Err(e) => {
                tracing::info!(error = %e, "finishing earlier txns over several shards; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(tag: i64) -> Result<WriteResult, ApiError> {
        Ok(WriteResult::Txn(TxnResponse {
            responses: vec![ResponseOp {
                response: Some(response_op::Response::ResponsePut(
                    cairn_proto::etcdserverpb::PutResponse {
                        header: Some(cairn_proto::etcdserverpb::ResponseHeader {
                            revision: tag,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )),
            }],
            ..Default::default()
        }))
    }

    fn tag(ops: &[ResponseOp]) -> i64 {
        match &ops[0].response {
            Some(response_op::Response::ResponsePut(p)) => p.header.as_ref().unwrap().revision,
            other => panic!("{other:?}"),
        }
    }

    /// Txn A writes shards 1 and 2, B writes shard 2: shard 1 fails A's
    /// part. A is not answered as applied, and B still gets its own answer
    /// from shard 2, not A's.
    #[test]
    fn a_failed_part_does_not_shift_the_answers_of_later_txns() {
        let mut per_part = BTreeMap::new();
        per_part.insert(1, vec![Err(ApiError::LeaderChanged)].into_iter());
        per_part.insert(2, vec![part(10), part(20)].into_iter());
        let a = take_parts(&mut per_part, &BTreeSet::from([1, 2]));
        assert!(matches!(a, Err(ApiError::TimeoutLeaderFail)), "{a:?}");
        let b = take_parts(&mut per_part, &BTreeSet::from([2])).unwrap();
        assert_eq!(tag(&b[&2]), 20, "B got its own answer");
        // Nothing left: a missing answer is an unknown outcome.
        let c = take_parts(&mut per_part, &BTreeSet::from([2]));
        assert!(matches!(c, Err(ApiError::TimeoutLeaderFail)));
    }
}

//! Reads over several shards at one revision of the keyspace
//! (docs/KEYSPACE.md, "Consistent reads"): a range ([`range_at`]), and
//! etcd's read-only txns ([`read_txn_at`]), never written to a log, as a
//! read-only txn on one shard is:
//!
//! 1. each shard a compare's range touches answers every compare over its
//!    own keys at that revision (`ShardCommand::ReadCompares`);
//! 2. the answers decide the branch as they decide a writing txn's
//!    ([`combine`]), and the branch's ranges are split by shard
//!    ([`Plan`]);
//! 3. each shard with a part reads it at the same revision as a read-only
//!    txn of those ranges alone (so its checks refuse a compacted or future
//!    revision as on one shard), and the parts merge into one etcd answer
//!    at that revision, with the highest Raft term the parts carried.
//!
//! The revision and each shard's place come from the caller: a read point
//! for a linearizable read ([`point_places`]), the cut this member's shards
//! reached for a serializable one ([`cut_places`]).

use std::collections::{BTreeMap, BTreeSet};

use cairn_proto::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use futures::future::join_all;

use crate::routing::ShardId;
use crate::server::command::{ReadAt, ShardPoint};
use crate::server::errors::ApiError;
use crate::server::keyspace::cross_plan::{combine, Plan};
use crate::server::keyspace::merge::merge_ranges;
use crate::server::keyspace::router::Router;

/// `req` read on each shard of `places` at its place, the answers merged
/// as one keyspace would answer it (`merge_ranges`).
pub async fn range_at(
    router: &Router,
    req: &RangeRequest,
    places: &BTreeMap<ShardId, ReadAt>,
) -> Result<RangeResponse, ApiError> {
    let parts = join_all(
        places
            .iter()
            .map(|(&shard, &at)| router.range_at(shard, req.clone(), at)),
    )
    .await;
    let parts = parts.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(merge_ranges(req, parts))
}

/// Reads `req`, a read-only txn ([`crate::server::validate::txn_is_read_only`])
/// over several shards, at `revision`: each shard it touches at its place
/// in `at` (every shard of [`crate::server::validate::txn_shards`] must
/// have one). Serializable when `serializable` (then `at` names no index
/// to wait for), else each shard waits for the index its place names.
pub async fn read_txn_at(
    router: &Router,
    req: &TxnRequest,
    serializable: bool,
    revision: i64,
    at: &BTreeMap<ShardId, ReadAt>,
) -> Result<TxnResponse, ApiError> {
    let place = |shard: ShardId| {
        at.get(&shard).copied().ok_or(ApiError::Unsupported(
            "a read-only txn over a shard it took no read point of",
        ))
    };
    let compare_shards: BTreeSet<ShardId> = req
        .compare
        .iter()
        .flat_map(|c| router.routing.shards_for_range(&c.key, &c.range_end))
        .collect();
    let asked = join_all(compare_shards.iter().map(|&shard| async move {
        router
            .read_compares(
                shard,
                req.compare.clone(),
                serializable,
                Some(place(shard)?),
            )
            .await
    }))
    .await;
    let per_shard = asked.into_iter().collect::<Result<Vec<_>, _>>()?;
    let plan = Plan::of(req, &combine(&req.compare, &per_shard), &router.routing);
    let parts = join_all(plan.ops.iter().map(|(&shard, ops)| async move {
        let part = TxnRequest {
            success: ops.clone(),
            ..Default::default()
        };
        let read = router
            .read_txn(shard, part, serializable, Some(place(shard)?))
            .await?;
        let term = read.header.map_or(0, |h| h.raft_term);
        Ok::<_, ApiError>((shard, (read.responses, term)))
    }))
    .await;
    let mut answers = BTreeMap::new();
    let mut raft_term = 0;
    for part in parts {
        let (shard, (responses, term)) = part?;
        raft_term = raft_term.max(term);
        answers.insert(shard, responses);
    }
    let mut answer = plan.answer(answers, revision);
    if let Some(h) = answer.header.as_mut() {
        h.raft_term = raft_term;
    }
    Ok(answer)
}

/// Each shard's place at a read point at `revision`, from the points of
/// `shards` in their order (a linearizable read).
pub fn point_places(
    shards: &[ShardId],
    revision: i64,
    points: Vec<ShardPoint>,
) -> BTreeMap<ShardId, ReadAt> {
    shards
        .iter()
        .zip(points)
        .map(|(&shard, p)| {
            let at = ReadAt::point(revision, p);
            (shard, at)
        })
        .collect()
}

/// Each of `shards` at `revision` of a cut this member's shards reached (a
/// serializable read).
pub fn cut_places(shards: &[ShardId], revision: i64) -> BTreeMap<ShardId, ReadAt> {
    shards
        .iter()
        .map(|&shard| (shard, ReadAt::cut(revision)))
        .collect()
}

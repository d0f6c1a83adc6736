//! The simulated clients' reads, sent as the API layer sends them: a key
//! through a range or etcd's read-only txn (the shard's own ReadIndex
//! round with one shard, a read point with several), and with several
//! shards every client key at one read point, through a range or a
//! read-only txn over every shard.

use bytes::Bytes;
use cairn_proto::etcdserverpb as pb;

use super::{answered, range, Unanswered};
use crate::routing::ShardId;
use crate::server::api::kv::read_at_point;
use crate::server::command::{ReadAt, ShardCommand, ShardPoint};
use crate::server::errors::ApiError;
use crate::server::keyspace::cross_read;
use crate::server::keyspace::router::Router;
use crate::server::peer_client::{self, Forwarded};
use crate::server::shard::LEADERLESS_WAIT;
use crate::sim::driver::world::{self, World};

/// A linearizable read of `key` through `member`, as the API layer makes it:
/// with one shard, the shard's own ReadIndex round; with several, at a read
/// point the keyspace leader gives ([`range_at_point`]). A read point's
/// answers come through the router, whose own timeout ends them: a lost one
/// is a failure, not unanswered.
pub(super) async fn read(
    world: &World,
    member: u64,
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    key: &Bytes,
) -> Result<Option<cairn_proto::mvccpb::KeyValue>, Unanswered> {
    let request = pb::RangeRequest {
        key: key.clone(),
        ..Default::default()
    };
    // Keys ending in an odd byte are read through etcd's read-only txn (a
    // compare and one range, read as a range is and not through the log),
    // as the API layer reads one; the others through a range.
    let as_txn = key.last().is_some_and(|b| b % 2 == 1);
    if world.shards() == 1 {
        if as_txn {
            return read_txn(commands, request, None).await;
        }
        return range(commands, key, 0, false).await;
    }
    if as_txn {
        let router = world
            .router(member)
            .ok_or_else(|| Unanswered::Error("the member stopped".into()))?;
        let shard = world.routing.shard_for_key(key);
        let router = &router;
        let request = &request;
        let (_, kv) = at_point(
            world,
            member,
            router,
            &[shard],
            |revision, points| async move {
                let at = ReadAt::point(revision, points[0]);
                let txn = one_range_txn(request.clone());
                let r = router.read_txn(shard, txn, false, Some(at)).await?;
                Ok(first_kv(r))
            },
        )
        .await
        .map_err(Unanswered::Error)?;
        return Ok(kv);
    }
    let (_, r) = range_at_point(world, member, request)
        .await
        .map_err(Unanswered::Error)?;
    Ok(r.kvs.into_iter().next())
}

/// A txn that reads its range's key on either branch of a compare on the
/// key's existence (its version), so that what the compare saw and what
/// the range read must agree ([`first_kv`]) whatever happened meanwhile:
/// both are read at one revision.
fn one_range_txn(request: pb::RangeRequest) -> pb::TxnRequest {
    let compare = pb::Compare {
        result: pb::compare::CompareResult::Greater as i32,
        target: pb::compare::CompareTarget::Version as i32,
        key: request.key.clone(),
        target_union: Some(pb::compare::TargetUnion::Version(0)),
        ..Default::default()
    };
    range_either_way(compare, request)
}

/// A read-only txn of `compare` with `request` on both branches.
fn range_either_way(compare: pb::Compare, request: pb::RangeRequest) -> pb::TxnRequest {
    let read = pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(request)),
    };
    pb::TxnRequest {
        compare: vec![compare],
        success: vec![read.clone()],
        failure: vec![read],
    }
}

/// The key a [`one_range_txn`] read. A compare that found the key where the
/// range found none (or the other way round) read two states: the seed
/// fails (a panicking client fails it).
fn first_kv(r: pb::TxnResponse) -> Option<cairn_proto::mvccpb::KeyValue> {
    let succeeded = r.succeeded;
    let kv = match r.responses.into_iter().next()?.response? {
        pb::response_op::Response::ResponseRange(r) => r.kvs.into_iter().next(),
        _ => None,
    };
    assert_eq!(
        succeeded,
        kv.is_some(),
        "a read-only txn's compare and range read different states: {kv:?}"
    );
    kv
}

/// Reads `request` through a one-range read-only txn on a member's driver of
/// its shard, at `at` or after a ReadIndex round.
async fn read_txn(
    commands: &tokio::sync::mpsc::Sender<ShardCommand>,
    request: pb::RangeRequest,
    at: Option<ReadAt>,
) -> Result<Option<cairn_proto::mvccpb::KeyValue>, Unanswered> {
    let (reply, rx) = crate::server::command::Reply::channel();
    commands
        .try_send(ShardCommand::ReadTxn {
            request: one_range_txn(request),
            serializable: false,
            at,
            reply,
        })
        .map_err(|e| Unanswered::Error(format!("the member's queue refused the read: {e}")))?;
    answered(rx).await.map(first_kv)
}

/// Where every client key lies: `[k, l)`.
pub(in crate::sim::driver) const CLIENT_KEYS: (Bytes, Bytes) =
    (Bytes::from_static(b"k"), Bytes::from_static(b"l"));

/// A linearizable range of every client key through `member`, over every
/// shard at one read point: a range, or (`by_txn`) a read-only txn
/// ([`all_by_txn`]).
pub(super) async fn read_all(
    world: &World,
    member: u64,
    by_txn: Option<i64>,
) -> Result<(i64, Vec<(Bytes, Bytes)>), String> {
    let request = pb::RangeRequest {
        key: CLIENT_KEYS.0.clone(),
        range_end: CLIENT_KEYS.1.clone(),
        ..Default::default()
    };
    let (revision, r) = match by_txn {
        Some(lag) => all_by_txn(world, member, request, lag).await?,
        None => range_at_point(world, member, request).await?,
    };
    Ok((
        revision,
        r.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect(),
    ))
}

/// `request` (over every shard) read through etcd's read-only txn as
/// `KvService` reads one over several shards ([`cross_read::read_txn_at`]
/// at a read point R): a compare that holds when every key of the range
/// was last modified at R - `lag` or before, the range on both branches.
/// With a small lag the clients' writes make the compare go either way,
/// so a compare read at another state than the range fails the seed (a
/// panicking client fails it).
async fn all_by_txn(
    world: &World,
    member: u64,
    request: pb::RangeRequest,
    lag: i64,
) -> Result<(i64, pb::RangeResponse), String> {
    let router = world.router(member).ok_or("the member stopped")?;
    let txn_at = |revision: i64| {
        let compare = pb::Compare {
            result: pb::compare::CompareResult::Less as i32,
            target: pb::compare::CompareTarget::Mod as i32,
            key: request.key.clone(),
            range_end: request.range_end.clone(),
            target_union: Some(pb::compare::TargetUnion::ModRevision(revision - lag + 1)),
        };
        range_either_way(compare, request.clone())
    };
    // The compare and the range cover the same keys.
    let shards = world
        .routing
        .shards_for_range(&request.key, &request.range_end);
    let (router, shards, txn_at) = (&router, &shards, &txn_at);
    let (revision, r) = at_point(world, member, router, shards, |revision, points| {
        let at = cross_read::point_places(shards, revision, points);
        let txn = txn_at(revision);
        async move { cross_read::read_txn_at(router, &txn, false, revision, &at).await }
    })
    .await?;
    let succeeded = r.succeeded;
    let range = match r.responses.into_iter().next().and_then(|op| op.response) {
        Some(pb::response_op::Response::ResponseRange(range)) => range,
        other => return Err(format!("a read-only txn answered {other:?}")),
    };
    let bound = revision - lag + 1;
    assert_eq!(
        succeeded,
        range.kvs.iter().all(|kv| kv.mod_revision < bound),
        "a read-only txn over every shard at {revision} chose its branch (every key modified \
         before {bound}) from another state than its range read: {:?}",
        range.kvs
    );
    Ok((revision, range))
}

/// A linearizable range through `member` over the shards it covers, as
/// `KvService::range_at_point` reads it: one read point for those shards,
/// each shard read there, the answers merged; a point whose entry a later
/// leader replaced on some shard is taken again. Answers the point's
/// revision and the merged range, or the error's text.
async fn range_at_point(
    world: &World,
    member: u64,
    request: pb::RangeRequest,
) -> Result<(i64, pb::RangeResponse), String> {
    let router = world.router(member).ok_or("the member stopped")?;
    let shards = world
        .routing
        .shards_for_range(&request.key, &request.range_end);
    let (router, request, shards) = (&router, &request, &shards);
    at_point(
        world,
        member,
        router,
        shards,
        |revision, points| async move {
            let places = cross_read::point_places(shards, revision, points);
            cross_read::range_at(router, request, &places).await
        },
    )
    .await
}

/// A linearizable read over `shards` at one read point, taken as the API
/// layer takes it ([`read_at_point`]), the point from [`read_point`].
/// Answers the point's revision and what `read` gave, or the error's text.
async fn at_point<T, F, Fut>(
    world: &World,
    member: u64,
    router: &Router,
    shards: &[ShardId],
    read: F,
) -> Result<(i64, T), String>
where
    F: Fn(i64, Vec<ShardPoint>) -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let point = || async {
        read_point(world, member, router, shards)
            .await
            .map_err(tonic::Status::unavailable)
    };
    read_at_point(point, 0, read)
        .await
        .map_err(|status| status.message().to_string())
}

/// The read point of `shards` from the keyspace leader, through the API
/// layer's own [`peer_client::at_shard_leader`]: asked of `member`, else of
/// the member it names, whose peer port here is that member's router
/// answering as its `/cairn/read-point` route does.
async fn read_point(
    world: &World,
    member: u64,
    router: &Router,
    shards: &[ShardId],
) -> Result<(i64, Vec<ShardPoint>), String> {
    let registry = world.registry(member).ok_or("the member stopped")?;
    peer_client::at_shard_leader(
        &registry,
        LEADERLESS_WAIT,
        || router.read_point(shards),
        |url| async move {
            let leader = world::member_of_url(&url).and_then(|id| world.router(id));
            let Some(leader) = leader else {
                return Forwarded::Failed(tonic::Status::unavailable(format!(
                    "the member at {url} is not running"
                )));
            };
            match leader.read_point(shards).await {
                Ok(point) => Forwarded::Ok(point),
                Err(ApiError::NotLeader { leader }) => Forwarded::NotLeader(leader),
                Err(e) if e.is_transient() => Forwarded::Failed(e.into()),
                Err(e) => Forwarded::Refused(e.into()),
            }
        },
    )
    .await
    .map_err(|status| status.message().to_string())
}

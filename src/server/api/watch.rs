//! Watch: the etcd v3 Watch service. Each shard feeds its watchers from its
//! own table (`shard::watchers`) with the changes each apply made.
//!
//! A slow watcher never slows a writer: each watch stream has a bounded queue,
//! and a shard that finds it full moves that watcher to catch-up, where it
//! reads the missed events back from the store once its queue has room again.
//! Apply never waits for a watcher.
//!
//! A watch over keys of several shards is registered on each of them; each
//! shard delivers its events in revision order, and the stream releases them
//! in one revision order as the shards say how far they have sent
//! (`keyspace::watch_shards`). With `--shards 1` ordering is exactly etcd's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_proto::etcdserverpb::watch_server::Watch;
use cairn_proto::etcdserverpb::{
    watch_create_request, watch_request, ResponseHeader, WatchRequest, WatchResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::ops::server_metrics::CoreRecorder;
use crate::routing::ShardId;
use crate::server::api::kv::Identity;
use crate::server::command::{ShardCommand, WatchBatch, WatchSpec};
use crate::server::keyspace::router::Router;
use crate::server::keyspace::watch_shards::{Delivery, ShardsWatch, WATCH_WINDOW_REVISIONS};

/// Event batches queued per watch stream before its watchers fall back to
/// catching up from the store.
pub const WATCH_STREAM_QUEUE_BATCHES: usize = 256;

/// The etcd v3 Watch service.
#[derive(Clone)]
pub struct WatchService {
    pub router: Arc<Router>,
    /// To refuse streams while this member is a learner, as etcd does.
    pub members: Arc<crate::server::members::MemberRegistry>,
    pub identity: Identity,
    pub next_stream: Arc<AtomicU64>,
    pub auth: Arc<crate::server::auth::AuthStore>,
    /// This core's metrics (None in tests without them).
    pub metrics: Option<CoreRecorder>,
}

/// One stream's share of its core's `cairn_core_watch_merge_held_events`:
/// what its watches over several shards hold, given back when it ends.
struct HeldEvents {
    metrics: Option<CoreRecorder>,
    held: i64,
}

impl HeldEvents {
    /// A watch's held events went from `before` to `after`.
    fn changed(&mut self, before: usize, after: usize) {
        let delta = after as i64 - before as i64;
        if delta != 0 {
            self.held += delta;
            if let Some(m) = &self.metrics {
                m.watch_merge_held(delta);
            }
        }
    }
}

impl Drop for HeldEvents {
    fn drop(&mut self) {
        self.changed(self.held as usize, 0);
    }
}

impl WatchService {
    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(self.identity.header_now(revision))
    }

    /// Whether the stream's caller may read the watched range; the cancel
    /// reason etcd gives when not (its gRPC status, as text).
    fn permitted(
        &self,
        token: Option<&str>,
        common_name: Option<&str>,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), String> {
        if !self.auth.is_enabled() {
            return Ok(());
        }
        self.auth
            .caller_by(token, common_name)
            .and_then(|caller| {
                self.auth.check(
                    caller.as_ref(),
                    key,
                    range_end,
                    cairn_proto::authpb::permission::Type::Read,
                )
            })
            .map_err(cancel_reason)
    }
}

/// A refused create's `cancel_reason`, as etcd's clients print an error.
fn cancel_reason(e: crate::server::errors::ApiError) -> String {
    let status = Status::from(e);
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ReceiverStream<Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        if self.members.local_is_learner() {
            return Err(crate::server::errors::ApiError::NotSupportedForLearner.into());
        }
        // Each create is checked against the stream's credentials, as etcd
        // checks them: a token that expired since the stream opened fails.
        // The stream keeps only the token of its request's metadata: the
        // connection counted the request's header list once, against its
        // budget of held bytes, and the list goes with `into_inner` below.
        let token = crate::server::auth::request_token(request.metadata()).map(str::to_owned);
        let common_name =
            crate::server::auth::conn_info(&request).and_then(|i| i.common_name.clone());
        let mut incoming = request.into_inner();
        let (out_tx, out_rx) =
            mpsc::channel::<Result<WatchResponse, Status>>(WATCH_STREAM_QUEUE_BATCHES);
        let (batch_tx, mut batch_rx) = mpsc::channel::<WatchBatch>(WATCH_STREAM_QUEUE_BATCHES);
        let stream_id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let svc = self.clone();
        tokio::spawn(async move {
            let mut next_watch_id: i64 = 0;
            // watch id -> the watch on its shards (with the merge of a watch
            // over several shards)
            let mut active: HashMap<i64, ShardsWatch> = HashMap::new();
            // As etcd, a client that closes its side of the stream keeps its
            // watchers: events flow until it goes away (an HTTP/JSON gateway
            // client always sends its whole body first).
            let mut requests_ended = false;
            let mut held = HeldEvents {
                metrics: svc.metrics.clone(),
                held: 0,
            };
            loop {
                tokio::select! {
                    req = incoming.message(), if !requests_ended => {
                        let req = match req {
                            Ok(Some(r)) => r,
                            Ok(None) => {
                                requests_ended = true;
                                continue;
                            }
                            Err(_) => break,
                        };
                        match req.request_union {
                            Some(watch_request::RequestUnion::CreateRequest(c)) => {
                                // Ids only grow on a stream, as in etcd, so a late
                                // batch of a cancelled watcher never reaches a new one.
                                let id = if c.watch_id != 0 { c.watch_id } else {
                                    while active.contains_key(&next_watch_id) { next_watch_id += 1; }
                                    next_watch_id += 1;
                                    next_watch_id - 1
                                };
                                if active.contains_key(&id) {
                                    let _ = out_tx.send(Ok(WatchResponse {
                                        header: svc.header(0),
                                        watch_id: id,
                                        created: true,
                                        canceled: true,
                                        cancel_reason: "etcdserver: duplicate watch ID".into(),
                                        ..Default::default()
                                    })).await;
                                    continue;
                                }
                                if c.key.is_empty() {
                                    let _ = out_tx.send(Ok(WatchResponse {
                                        header: svc.header(0),
                                        watch_id: id,
                                        created: true,
                                        canceled: true,
                                        cancel_reason: "etcdserver: key is not provided".into(),
                                        ..Default::default()
                                    })).await;
                                    continue;
                                }
                                if let Err(e) = svc.permitted(token.as_deref(), common_name.as_deref(), &c.key, &c.range_end) {
                                    let _ = out_tx.send(Ok(WatchResponse {
                                        header: svc.header(0),
                                        watch_id: -1,
                                        created: true,
                                        canceled: true,
                                        cancel_reason: e,
                                        ..Default::default()
                                    })).await;
                                    continue;
                                }
                                let spec = WatchSpec {
                                    key: c.key.to_vec(),
                                    range_end: c.range_end.to_vec(),
                                    prev_kv: c.prev_kv,
                                    no_put: c.filters.contains(&(watch_create_request::FilterType::Noput as i32)),
                                    no_delete: c.filters.contains(&(watch_create_request::FilterType::Nodelete as i32)),
                                    // Set for a watch over several shards.
                                    progress: false,
                                    window: None,
                                };
                                let created = ShardsWatch::create(
                                    &svc.router,
                                    (stream_id, id),
                                    spec,
                                    c.start_revision,
                                    batch_tx.clone(),
                                    WATCH_WINDOW_REVISIONS,
                                ).await;
                                let (watch, revision) = match created {
                                    Ok(created) => created,
                                    Err(e) => {
                                        // Cancelled on every shard: the
                                        // client is told why.
                                        tracing::warn!(watch = id, error = %e, "a watch could not be created");
                                        if out_tx.send(Ok(WatchResponse {
                                            header: svc.header(0),
                                            watch_id: id,
                                            created: true,
                                            canceled: true,
                                            cancel_reason: cancel_reason(e),
                                            ..Default::default()
                                        })).await.is_err() {
                                            break;
                                        }
                                        continue;
                                    }
                                };
                                active.insert(id, watch);
                                if out_tx.send(Ok(WatchResponse {
                                    header: svc.header(revision),
                                    watch_id: id,
                                    created: true,
                                    ..Default::default()
                                })).await.is_err() {
                                    break;
                                }
                            }
                            Some(watch_request::RequestUnion::CancelRequest(c)) => {
                                if let Some(watch) = active.remove(&c.watch_id) {
                                    end_watch(&svc, stream_id, &mut held, c.watch_id, watch).await;
                                    let _ = out_tx.send(Ok(WatchResponse {
                                        header: svc.header(0),
                                        watch_id: c.watch_id,
                                        canceled: true,
                                        ..Default::default()
                                    })).await;
                                }
                            }
                            Some(watch_request::RequestUnion::ProgressRequest(_)) => {
                                // etcd's promise: every event up to the header's
                                // revision has been sent on this stream. Each
                                // shard says how far its watchers of this stream
                                // got; batches it sent before answering are
                                // already queued here and go out first.
                                let mut shards: Vec<ShardId> = active.values().flat_map(|w| w.shards().iter().copied()).collect();
                                if shards.is_empty() {
                                    shards = svc.router.routing.shard_ids().collect();
                                }
                                shards.sort_unstable();
                                shards.dedup();
                                let mut revision = i64::MAX;
                                for s in shards {
                                    match svc.router.ask(s, |reply| ShardCommand::WatchProgress {
                                        stream: stream_id,
                                        reply,
                                    }).await {
                                        Ok(r) => revision = revision.min(r),
                                        // A shard that cannot say how far it got
                                        // allows no promise at all.
                                        Err(_) => {
                                            revision = i64::MAX;
                                            break;
                                        }
                                    }
                                }
                                let mut closed = false;
                                while let Ok(batch) = batch_rx.try_recv() {
                                    if let Some(resp) = batch_response(&svc, stream_id, &mut active, &mut held, batch).await {
                                        closed |= out_tx.send(Ok(resp)).await.is_err();
                                    }
                                }
                                // Events a merge holds back are not sent yet.
                                if let (Some(held), false) = (active.values().filter_map(ShardsWatch::released).min(), revision == i64::MAX) {
                                    revision = revision.min(held);
                                }
                                if revision == i64::MAX || closed {
                                    // A shard did not answer, or the client is
                                    // gone: promise nothing.
                                    continue;
                                }
                                let _ = out_tx.send(Ok(WatchResponse {
                                    header: svc.header(revision),
                                    watch_id: -1,
                                    ..Default::default()
                                })).await;
                            }
                            None => {}
                        }
                    }
                    Some(batch) = batch_rx.recv() => {
                        let Some(resp) = batch_response(&svc, stream_id, &mut active, &mut held, batch).await else {
                            continue;
                        };
                        if out_tx.send(Ok(resp)).await.is_err() {
                            break;
                        }
                    }
                    () = out_tx.closed(), if requests_ended => break,
                }
            }
            // The client went away: the shards drop these watchers when they
            // find the stream's queue closed.
        });
        Ok(Response::new(ReceiverStream::new(out_rx)))
    }
}

/// Ends watch `id` of stream `stream_id`: what it held is given back, and
/// its watchers are cancelled on its shards.
async fn end_watch(
    svc: &WatchService,
    stream_id: u64,
    held: &mut HeldEvents,
    id: i64,
    watch: ShardsWatch,
) {
    held.changed(watch.held_events(), 0);
    watch.cancel(&svc.router, (stream_id, id)).await;
}

/// The response a shard's batch becomes on its stream: none for a watcher
/// cancelled meanwhile; a cancellation for one whose position was compacted
/// (its watchers on the watch's other shards cancelled too); for a watch
/// over several shards, the events its merge releases, if any.
async fn batch_response(
    svc: &WatchService,
    stream_id: u64,
    active: &mut HashMap<i64, ShardsWatch>,
    held: &mut HeldEvents,
    batch: WatchBatch,
) -> Option<WatchResponse> {
    let watch_id = batch.watch_id;
    let watch = active.get_mut(&watch_id)?;
    let before = watch.held_events();
    let delivery = watch.take(batch);
    held.changed(before, watch.held_events());
    Some(match delivery? {
        Delivery::Events { revision, events } => WatchResponse {
            header: svc.header(revision),
            watch_id,
            events,
            ..Default::default()
        },
        Delivery::Compacted {
            revision,
            compact_revision,
        } => {
            if let Some(watch) = active.remove(&watch_id) {
                end_watch(svc, stream_id, held, watch_id, watch).await;
            }
            WatchResponse {
                header: svc.header(revision),
                watch_id,
                canceled: true,
                compact_revision,
                cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
                ..Default::default()
            }
        }
    })
}

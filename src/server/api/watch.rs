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
//! A stream's watches are kept by `api::watch_stream`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::etcdserverpb::watch_server::Watch;
use cairn_proto::etcdserverpb::{
    watch_create_request, watch_request, ResponseHeader, WatchCreateRequest, WatchRequest,
    WatchResponse,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::ops::server_metrics::CoreRecorder;
use crate::server::api::kv::Identity;
use crate::server::api::require_leader::{self, LeaderLoss};
use crate::server::api::stream_end::{self, Ending};
use crate::server::api::watch_stream::{Refused, StreamWatches};
use crate::server::command::{ShardCommand, WatchBatch, WatchSpec};
use crate::server::key_ranges::holds_no_key;
use crate::server::keyspace::router::Router;
use crate::server::keyspace::watch_shards::{Delivery, WATCH_WINDOW_REVISIONS};

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
    /// Ends the streams that require a leader when the member has none.
    pub leader_loss: LeaderLoss,
    /// How often a watch created with `progress_notify` that saw no event
    /// is told how far its stream got
    /// (`--experimental-watch-progress-notify-interval`).
    pub progress_interval: Duration,
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

/// The id a create gets, or why etcd refuses it before it has one: the
/// caller may not read the range, the range holds no key, or the id it
/// chose is a live watch's.
fn create_id(
    svc: &WatchService,
    watches: &mut StreamWatches,
    token: Option<&str>,
    common_name: Option<&str>,
    c: &WatchCreateRequest,
) -> Result<i64, String> {
    svc.permitted(token, common_name, &c.key, &c.range_end)?;
    if holds_no_key(&c.key, &c.range_end) {
        return Err("mvcc: watcher range is empty".into());
    }
    watches.id_for(c.watch_id).map_err(|Refused::DuplicateId| {
        "mvcc: duplicate watch ID provided on the WatchStream".into()
    })
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
        let mut leader = self.leader_loss.open(request.metadata())?;
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
            let mut watches = StreamWatches::new(stream_id, svc.metrics.clone());
            // As etcd, a client that closes its side of the stream keeps its
            // watchers: events flow until it goes away (an HTTP/JSON gateway
            // client always sends its whole body first).
            let mut requests_ended = false;
            // Why the stream ends, when the client is to be told. Every
            // message goes through `deliver`: a client that stopped reading
            // leaves the queue full, and the loss of the leader still ends
            // the wait for room.
            let mut ending = Ending::default();
            // Watches created with progress_notify: whether each saw no
            // event since the last tick.
            let mut quiet: HashMap<i64, Notified> = HashMap::new();
            // etcd adds up to a tenth at random, so that streams opened
            // together do not tick together.
            let period = svc.progress_interval + jitter(svc.progress_interval / 10);
            let mut progress_ticks = tokio::time::interval_at(Instant::now() + period, period);
            progress_ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    req = incoming.message(), if !requests_ended => {
                        let req = match req {
                            Ok(Some(r)) => r,
                            Ok(None) => {
                                requests_ended = true;
                                continue;
                            }
                            // A request that could not be read (one over the
                            // message cap): the stream ends with why, as
                            // etcd's, after what is queued.
                            Err(status) => {
                                ending.set(status);
                                break;
                            }
                        };
                        match req.request_union {
                            Some(watch_request::RequestUnion::CreateRequest(mut c)) => {
                                // As etcd: an empty key is the smallest key.
                                if c.key.is_empty() {
                                    c.key = vec![0u8].into();
                                }
                                let refused = create_id(&svc, &mut watches, token.as_deref(), common_name.as_deref(), &c);
                                // Refused before the watch has an id: id -1,
                                // as etcd answers.
                                let id = match refused {
                                    Ok(id) => id,
                                    Err(reason) => {
                                        let refusal = WatchResponse {
                                            header: Some(svc.identity.header_current()),
                                            watch_id: -1,
                                            created: true,
                                            canceled: true,
                                            cancel_reason: reason,
                                            ..Default::default()
                                        };
                                        if deliver(&out_tx, refusal, &mut leader, &mut ending).await {
                                            break;
                                        }
                                        continue;
                                    }
                                };
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
                                let created = watches.create(
                                    &svc.router,
                                    id,
                                    spec,
                                    c.start_revision,
                                    batch_tx.clone(),
                                    WATCH_WINDOW_REVISIONS,
                                ).await;
                                let revision = match created {
                                    Ok(created) => created,
                                    Err(e) => {
                                        // Cancelled on every shard: the
                                        // client is told why.
                                        tracing::warn!(watch = id, error = %e, "a watch could not be created");
                                        let refusal = WatchResponse {
                                            header: Some(svc.identity.header_current()),
                                            watch_id: id,
                                            created: true,
                                            canceled: true,
                                            cancel_reason: cancel_reason(e),
                                            ..Default::default()
                                        };
                                        if deliver(&out_tx, refusal, &mut leader, &mut ending).await {
                                            break;
                                        }
                                        continue;
                                    }
                                };
                                if c.progress_notify {
                                    if quiet.is_empty() {
                                        // A tick a whole period after this
                                        // watch, not at once on an old stream.
                                        progress_ticks.reset();
                                    }
                                    quiet.insert(id, Notified { quiet: true, seen: revision });
                                }
                                let created = WatchResponse {
                                    header: svc.header(revision),
                                    watch_id: id,
                                    created: true,
                                    ..Default::default()
                                };
                                if deliver(&out_tx, created, &mut leader, &mut ending).await {
                                    break;
                                }
                            }
                            Some(watch_request::RequestUnion::CancelRequest(c)) => {
                                // As etcd, an id the stream has no watch of
                                // is not answered.
                                let cancelled = watches.cancel(&svc.router, c.watch_id).await;
                                quiet.remove(&c.watch_id);
                                if cancelled {
                                    let answer = WatchResponse {
                                        header: Some(svc.identity.header_current()),
                                        watch_id: c.watch_id,
                                        canceled: true,
                                        ..Default::default()
                                    };
                                    if deliver(&out_tx, answer, &mut leader, &mut ending).await {
                                        break;
                                    }
                                }
                            }
                            Some(watch_request::RequestUnion::ProgressRequest(_)) => {
                                let mut out = Out { tx: &out_tx, leader: &mut leader, ending: &mut ending, quiet: &mut quiet };
                                let Ok(revision) = stream_progress(&svc, &mut watches, stream_id, &mut batch_rx, &mut out).await else {
                                    break;
                                };
                                // A shard that did not answer: promise nothing.
                                let Some(revision) = revision else { continue };
                                let progress = WatchResponse {
                                    header: svc.header(revision),
                                    watch_id: -1,
                                    ..Default::default()
                                };
                                if out.send(progress).await {
                                    break;
                                }
                            }
                            None => {}
                        }
                    }
                    Some(batch) = batch_rx.recv() => {
                        let Some(resp) = batch_response(&svc, &mut watches, batch).await else {
                            continue;
                        };
                        let mut out = Out { tx: &out_tx, leader: &mut leader, ending: &mut ending, quiet: &mut quiet };
                        if out.send(resp).await {
                            break;
                        }
                    }
                    // etcd's progress notification: each watch created
                    // with progress_notify that saw no event since the last
                    // tick is told how far its stream got.
                    _ = progress_ticks.tick(), if !quiet.is_empty() => {
                        let mut out = Out { tx: &out_tx, leader: &mut leader, ending: &mut ending, quiet: &mut quiet };
                        let Ok(revision) = stream_progress(&svc, &mut watches, stream_id, &mut batch_rx, &mut out).await else {
                            break;
                        };
                        // A watch is told the stream's revision, or the
                        // last its own answers carried if higher: never less
                        // than it was already told.
                        let due: Vec<(i64, i64)> = out.quiet.iter().filter(|(_, n)| n.quiet).map(|(id, n)| (*id, n.seen)).collect();
                        out.quiet.values_mut().for_each(|n| n.quiet = true);
                        let Some(revision) = revision else { continue };
                        let mut ends = false;
                        for (watch_id, seen) in due {
                            let progress = WatchResponse {
                                header: svc.header(revision.max(seen)),
                                watch_id,
                                ..Default::default()
                            };
                            if out.send(progress).await {
                                ends = true;
                                break;
                            }
                        }
                        if ends {
                            break;
                        }
                    }
                    () = out_tx.closed(), if requests_ended => break,
                    // The member lost its leader: the client is told, and
                    // moves to another member.
                    () = leader.lost() => {
                        ending.set(require_leader::no_leader());
                        break;
                    }
                }
            }
            if ending.is_set() {
                // The watchers go first, and what is left of the request
                // body: a client that does not read must not hold them
                // while its error waits for room.
                drop(watches);
                drop(batch_rx);
                drop(incoming);
                ending.tell(&out_tx).await;
            }
            // The client went away: the shards drop these watchers when they
            // find the stream's queue closed.
        });
        Ok(Response::new(ReceiverStream::new(out_rx)))
    }
}

/// A watch created with `progress_notify`: whether it saw no event since
/// the last tick, and the highest revision its answers carried.
struct Notified {
    quiet: bool,
    seen: i64,
}

/// Where a stream's answers go, with what sending them changes.
struct Out<'a> {
    tx: &'a mpsc::Sender<Result<WatchResponse, Status>>,
    leader: &'a mut require_leader::Stream,
    ending: &'a mut Ending<WatchResponse>,
    quiet: &'a mut HashMap<i64, Notified>,
}

impl Out<'_> {
    /// Delivers `resp` (see [`deliver`]). Events make their watch not quiet;
    /// a watch the server cancelled (compacted) is no longer notified.
    async fn send(&mut self, resp: WatchResponse) -> bool {
        if resp.canceled {
            self.quiet.remove(&resp.watch_id);
        } else if let Some(n) = self.quiet.get_mut(&resp.watch_id) {
            if !resp.events.is_empty() {
                n.quiet = false;
            }
            n.seen = n.seen.max(resp.header.as_ref().map_or(0, |h| h.revision));
        }
        deliver(self.tx, resp, self.leader, self.ending).await
    }
}

/// How far the stream got: every event up to the answer's revision has
/// been sent on it (etcd's promise of a progress notification). Each shard
/// says how far its watchers of this stream got; batches they sent before
/// answering are delivered first. `Ok(None)`: a shard could not say, so
/// nothing is promised; `Err(())`: the stream ends.
async fn stream_progress(
    svc: &WatchService,
    watches: &mut StreamWatches,
    stream_id: u64,
    batch_rx: &mut mpsc::Receiver<WatchBatch>,
    out: &mut Out<'_>,
) -> Result<Option<i64>, ()> {
    let mut shards = watches.shards();
    if shards.is_empty() {
        shards = svc.router.routing.shard_ids().collect();
    }
    let mut revision = Some(i64::MAX);
    for s in shards {
        match svc
            .router
            .ask(s, |reply| ShardCommand::WatchProgress {
                stream: stream_id,
                reply,
            })
            .await
        {
            Ok(r) => revision = revision.map(|rev| rev.min(r)),
            // A shard that cannot say how far it got allows no promise.
            Err(_) => {
                revision = None;
                break;
            }
        }
    }
    while let Ok(batch) = batch_rx.try_recv() {
        if let Some(resp) = batch_response(svc, watches, batch).await {
            if out.send(resp).await {
                return Err(());
            }
        }
    }
    // Events a merge holds back are not sent yet.
    if let (Some(held), Some(rev)) = (watches.released(), revision) {
        revision = Some(rev.min(held));
    }
    Ok(revision.filter(|&r| r != i64::MAX))
}

/// A random duration below `max`.
fn jitter(max: Duration) -> Duration {
    let nanos = max.as_nanos() as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rand::random::<u64>() % nanos)
}

/// Queues `resp` for the client, waiting for room only until the member
/// loses its leader (`stream_end::send_unless_lost`): true when the stream
/// is to end, the client gone or `ending` set.
async fn deliver(
    out_tx: &mpsc::Sender<Result<WatchResponse, Status>>,
    resp: WatchResponse,
    leader: &mut require_leader::Stream,
    ending: &mut Ending<WatchResponse>,
) -> bool {
    ending.ends(stream_end::send_unless_lost(out_tx, Ok(resp), leader.lost()).await)
}

/// The response a shard's batch becomes on its stream: none for a watch
/// cancelled meanwhile; a cancellation for one whose position was compacted
/// (`StreamWatches::take` cancels it on its other shards); for a watch over
/// several shards, the events its merge releases, if any.
async fn batch_response(
    svc: &WatchService,
    watches: &mut StreamWatches,
    batch: WatchBatch,
) -> Option<WatchResponse> {
    let (watch_id, delivery) = watches.take(&svc.router, batch).await?;
    Some(match delivery {
        Delivery::Events { revision, events } => WatchResponse {
            header: svc.header(revision),
            watch_id,
            events,
            ..Default::default()
        },
        // etcd's header here carries no revision.
        Delivery::Compacted {
            compact_revision, ..
        } => WatchResponse {
            header: svc.header(0),
            watch_id,
            canceled: true,
            compact_revision,
            cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
            ..Default::default()
        },
    })
}

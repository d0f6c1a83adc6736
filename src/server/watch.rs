//! Watch: the etcd v3 Watch service, and the per-shard watcher table the shard
//! driver feeds after each apply.
//!
//! A slow watcher never slows a writer: each watch stream has a bounded queue,
//! and a shard that finds it full leaves that watcher where it was and retries
//! on a later turn, reading the missed events back from the store (catch-up).
//! Apply never waits for a watcher.
//!
//! A watch over keys of several shards is registered on each of them; each
//! shard delivers its events in its own revision order (shards have separate
//! revision counters). With `--shards 1` ordering is exactly etcd's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_mvcc as mvcc;
use cairn_proto::etcdserverpb::watch_server::Watch;
use cairn_proto::etcdserverpb::{
    watch_create_request, watch_request, ResponseHeader, WatchRequest, WatchResponse,
};
use cairn_proto::mvccpb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert::kv_to_pb;
use super::kv::Identity;
use super::router::{Router, ShardCommand};
use crate::routing::ShardId;

/// Event batches queued per watch stream before its watchers fall back to
/// catching up from the store.
pub const WATCH_STREAM_QUEUE_BATCHES: usize = 256;

/// Events read from the store per watcher-table pass.
pub const MAX_EVENTS_PER_PASS: usize = 4096;

/// Identifies a watcher on a shard: the stream it belongs to and its id there.
pub type WatcherKey = (u64, i64);

#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
}

impl WatchSpec {
    fn matches(&self, key: &[u8]) -> bool {
        if self.range_end.is_empty() {
            key == self.key.as_slice()
        } else if self.range_end == b"\0" {
            key >= self.key.as_slice()
        } else {
            key >= self.key.as_slice() && key < self.range_end.as_slice()
        }
    }
}

/// What a shard sends a watch stream.
#[derive(Debug)]
pub struct WatchBatch {
    pub watch_id: i64,
    pub shard: ShardId,
    pub revision: i64,
    pub events: Vec<mvccpb::Event>,
    /// Set when the watcher's next revision was compacted away: it is cancelled.
    pub compact_revision: Option<i64>,
}

struct Watcher {
    spec: WatchSpec,
    next_rev: i64,
    tx: mpsc::Sender<WatchBatch>,
}

/// A shard's watchers.
#[derive(Default)]
pub struct ShardWatchers {
    watchers: HashMap<WatcherKey, Watcher>,
}

impl ShardWatchers {
    pub fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }

    /// Adds a watcher that wants events from `start_revision` on (0: from the
    /// next revision after `current_revision`).
    pub fn add(
        &mut self,
        key: WatcherKey,
        spec: WatchSpec,
        start_revision: i64,
        current_revision: i64,
        tx: mpsc::Sender<WatchBatch>,
    ) {
        let next_rev = if start_revision > 0 {
            start_revision
        } else {
            current_revision + 1
        };
        self.watchers.insert(key, Watcher { spec, next_rev, tx });
    }

    pub fn remove(&mut self, key: &WatcherKey) {
        self.watchers.remove(key);
    }

    /// The revision through which every watcher of watch stream `stream` has
    /// been sent its events (`current_revision` when the stream has none
    /// here): what a progress notification may promise.
    pub fn delivered_through(&self, stream: u64, current_revision: i64) -> i64 {
        self.watchers
            .iter()
            .filter(|(key, _)| key.0 == stream)
            .map(|(_, w)| (w.next_rev - 1).min(current_revision))
            .min()
            .unwrap_or(current_revision)
    }

    /// Delivers what the store holds past each watcher's position. Never waits:
    /// a watcher whose stream is full stays behind and is retried next time.
    pub fn notify(&mut self, shard: ShardId, store: &mvcc::Store) {
        let current = store.current_revision();
        let compact = store.compact_revision();
        self.watchers.retain(|_, w| !w.tx.is_closed());
        // Watchers whose position was compacted away are cancelled first, so
        // they do not hold back (or empty) the pass for the others. A cancel
        // that finds the queue full is retried on a later pass.
        let mut cancelled = Vec::new();
        for (key, w) in self.watchers.iter() {
            if w.next_rev < compact && w.next_rev <= current {
                match w.tx.try_send(WatchBatch {
                    watch_id: key.1,
                    shard,
                    revision: current,
                    events: Vec::new(),
                    compact_revision: Some(compact),
                }) {
                    Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => cancelled.push(*key),
                    Err(mpsc::error::TrySendError::Full(_)) => {}
                }
            }
        }
        for key in cancelled.drain(..) {
            self.watchers.remove(&key);
        }
        let Some(from) = self
            .watchers
            .values()
            .filter(|w| w.next_rev <= current && w.next_rev >= compact)
            .map(|w| w.next_rev)
            .min()
        else {
            return;
        };
        // Read whole revisions: a pass cut inside one revision (a large delete)
        // reads more rather than splitting it.
        let mut max = MAX_EVENTS_PER_PASS;
        let events = loop {
            match store.events(from, max) {
                Ok(e) => {
                    let cut_inside_one = e.len() >= max
                        && e.first().map(|f| f.revision.main) == e.last().map(|l| l.revision.main);
                    if !cut_inside_one {
                        break e;
                    }
                    max *= 2;
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "reading events for watchers failed");
                    return;
                }
            }
        };
        // Everything up to `scanned` has been looked at (all of it unless the
        // pass was cut; then up to the last whole revision read).
        let scanned = if events.len() >= max {
            events.last().map_or(current, |e| e.revision.main - 1)
        } else {
            current
        };
        for (key, w) in self.watchers.iter_mut() {
            if w.next_rev > scanned || w.next_rev < compact {
                continue;
            }
            let mut out = Vec::new();
            for e in events
                .iter()
                .filter(|e| e.revision.main >= w.next_rev && e.revision.main <= scanned)
            {
                if !w.spec.matches(&e.kv.key) {
                    continue;
                }
                let kind = match e.kind {
                    mvcc::EventKind::Put if w.spec.no_put => continue,
                    mvcc::EventKind::Delete if w.spec.no_delete => continue,
                    mvcc::EventKind::Put => mvccpb::event::EventType::Put,
                    mvcc::EventKind::Delete => mvccpb::event::EventType::Delete,
                };
                let prev_kv = if w.spec.prev_kv {
                    previous(store, &e.kv.key, e.revision.main)
                } else {
                    None
                };
                out.push(mvccpb::Event {
                    r#type: kind as i32,
                    kv: Some(kv_to_pb(e.kv.clone())),
                    prev_kv,
                });
            }
            if out.is_empty() {
                w.next_rev = w.next_rev.max(scanned + 1);
                continue;
            }
            match w.tx.try_send(WatchBatch {
                watch_id: key.1,
                shard,
                revision: current,
                events: out,
                compact_revision: None,
            }) {
                Ok(()) => w.next_rev = w.next_rev.max(scanned + 1),
                // Full: stay behind, catch up from the store on a later pass.
                Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => cancelled.push(*key),
            }
        }
        for key in cancelled {
            self.watchers.remove(&key);
        }
    }
}

/// The key's value just before `revision`, for watchers that asked for prev_kv.
fn previous(store: &mvcc::Store, key: &[u8], revision: i64) -> Option<mvccpb::KeyValue> {
    let r = store
        .range(&mvcc::RangeRequest {
            key: key.to_vec(),
            revision: revision - 1,
            ..Default::default()
        })
        .ok()?;
    r.kvs.into_iter().next().map(kv_to_pb)
}

/// The etcd v3 Watch service.
#[derive(Clone)]
pub struct WatchService {
    pub router: Arc<Router>,
    /// To refuse streams while this member is a learner, as etcd does.
    pub members: Arc<super::members::MemberRegistry>,
    pub identity: Identity,
    pub next_stream: Arc<AtomicU64>,
}

impl WatchService {
    fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(self.identity.header(revision, 0))
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ReceiverStream<Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        if self.members.local_is_learner() {
            return Err(super::errors::ApiError::NotSupportedForLearner.into());
        }
        let mut incoming = request.into_inner();
        let (out_tx, out_rx) =
            mpsc::channel::<Result<WatchResponse, Status>>(WATCH_STREAM_QUEUE_BATCHES);
        let (batch_tx, mut batch_rx) = mpsc::channel::<WatchBatch>(WATCH_STREAM_QUEUE_BATCHES);
        let stream_id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let svc = self.clone();
        tokio::spawn(async move {
            let mut next_watch_id: i64 = 0;
            // watch id -> shards it is registered on
            let mut active: HashMap<i64, Vec<ShardId>> = HashMap::new();
            // As etcd, a client that closes its side of the stream keeps its
            // watchers: events flow until it goes away (an HTTP/JSON gateway
            // client always sends its whole body first).
            let mut requests_ended = false;
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
                                let spec = WatchSpec {
                                    key: c.key.to_vec(),
                                    range_end: c.range_end.to_vec(),
                                    prev_kv: c.prev_kv,
                                    no_put: c.filters.contains(&(watch_create_request::FilterType::Noput as i32)),
                                    no_delete: c.filters.contains(&(watch_create_request::FilterType::Nodelete as i32)),
                                };
                                let shards = svc.router.routing.shards_for_range(&c.key, &c.range_end);
                                let mut revision = 0;
                                for &s in &shards {
                                    let spec = spec.clone();
                                    let tx = batch_tx.clone();
                                    let r = svc.router.ask(s, |reply| ShardCommand::Watch {
                                        key: (stream_id, id),
                                        spec,
                                        start_revision: c.start_revision,
                                        tx,
                                        reply,
                                    }).await;
                                    if let Ok(rev) = r {
                                        revision = revision.max(rev);
                                    }
                                }
                                active.insert(id, shards);
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
                                if let Some(shards) = active.remove(&c.watch_id) {
                                    for s in shards {
                                        let _ = svc.router.ask(s, |reply| ShardCommand::CancelWatch {
                                            key: (stream_id, c.watch_id),
                                            reply,
                                        }).await;
                                    }
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
                                let mut shards: Vec<ShardId> = active.values().flatten().copied().collect();
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
                                    if let Some(resp) = batch_response(&svc, &mut active, batch) {
                                        closed |= out_tx.send(Ok(resp)).await.is_err();
                                    }
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
                        let Some(resp) = batch_response(&svc, &mut active, batch) else {
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

/// The response a shard's batch becomes on its stream: none for a watcher
/// cancelled meanwhile; a cancellation for one whose position was compacted.
fn batch_response(
    svc: &WatchService,
    active: &mut HashMap<i64, Vec<ShardId>>,
    batch: WatchBatch,
) -> Option<WatchResponse> {
    if !active.contains_key(&batch.watch_id) {
        return None;
    }
    Some(match batch.compact_revision {
        Some(compact) => {
            active.remove(&batch.watch_id);
            WatchResponse {
                header: svc.header(batch.revision),
                watch_id: batch.watch_id,
                canceled: true,
                compact_revision: compact,
                cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
                ..Default::default()
            }
        }
        None => WatchResponse {
            header: svc.header(batch.revision),
            watch_id: batch.watch_id,
            events: batch.events,
            ..Default::default()
        },
    })
}

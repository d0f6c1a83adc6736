//! The shard's watcher table, fed after each apply: events matching each
//! watcher go to its stream's bounded queue; a watcher whose queue is full
//! stays where it was and catches up from the store on a later turn.

use std::collections::HashMap;

use cairn_mvcc as mvcc;
use cairn_proto::mvccpb;
use tokio::sync::mpsc;

use crate::routing::ShardId;
use crate::server::command::{WatchBatch, WatchSpec, WatcherKey};
use crate::server::convert::kv_to_pb;

/// Events read from the store per watcher-table pass.
pub const MAX_EVENTS_PER_PASS: usize = 4096;

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

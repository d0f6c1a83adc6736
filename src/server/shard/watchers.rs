//! The shard's watcher table.
//!
//! A watcher is either synced (it has been sent every matching event up to
//! the last revision fed) or catching up. Synced watchers are fed from apply:
//! the store hands over the changes it just applied (`mvcc::Store::take_changes`)
//! and each change goes only to the watchers it concerns, found through an
//! index of single-key watchers by key and one of range watchers by the keys
//! they hold (`watch_ranges`). Nothing is read back from the store for them.
//!
//! A synced watcher whose stream queue is full is moved to catch-up at the
//! first revision it missed. Catch-up reads events back from the store, at
//! most `MAX_EVENTS_PER_PASS` per pass, and only for watchers whose queue has
//! room: a stream that stops reading costs nothing after its bounded queue
//! filled, and a writer never waits for it. A watcher that catches up with
//! the store's revision is synced again.
//!
//! A watcher of a watch over several shards (`WatchSpec::progress`) is also
//! told how far it has been sent when nothing it watches changed: a batch
//! with no events whenever the shard's revision moves, so the watch stream
//! can release other shards' events in revision order. Such a watcher is
//! sent no event past its watch's window (`WatchSpec::window`): one with
//! events past it moves to catch-up, as with a full queue, is told it was
//! sent through the revision before the first of them, and reads on from
//! the store once the stream has released the other shards' events and
//! moved the window. A lagging shard thus makes the stream hold a window's
//! worth of the others' events at most.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cairn_mvcc as mvcc;
use cairn_proto::mvccpb;
use tokio::sync::mpsc;

use crate::routing::ShardId;
use crate::server::command::{WatchBatch, WatchSpec, WatcherKey};
use crate::server::convert::kv_to_pb;
use crate::server::shard::watch_ranges::RangeWatchers;

/// Events read from the store per catch-up pass.
pub const MAX_EVENTS_PER_PASS: usize = 4096;

struct Watcher {
    /// With the window of a watch over several shards, if it has one.
    spec: WatchSpec,
    /// The first revision not yet sent; while synced, revisions up to
    /// `fed_through` count as sent whatever this says.
    next_rev: i64,
    tx: mpsc::Sender<WatchBatch>,
    synced: bool,
    /// Catching up: the revision of its first event past its watch's
    /// window, found by the last pass; it is not read for again until the
    /// window reaches it.
    blocked_at: Option<i64>,
}

impl Watcher {
    /// The highest revision of an event this watcher may be sent now: its
    /// watch's window's (`WatchWindow`), or any.
    fn event_limit(&self) -> i64 {
        self.spec.window.as_ref().map_or(i64::MAX, |w| w.limit())
    }

    /// Whether it waits for its watch's window to reach its next event.
    fn waits_for_window(&self) -> bool {
        self.blocked_at.is_some_and(|b| b > self.event_limit())
    }
}

/// A shard's watchers. The maps that are walked are ordered: watchers are
/// fed in the same order on every run, so a simulated seed replays exactly.
#[derive(Default)]
pub struct ShardWatchers {
    watchers: BTreeMap<WatcherKey, Watcher>,
    /// Synced watchers of one key, by that key.
    by_key: HashMap<Vec<u8>, BTreeSet<WatcherKey>>,
    /// Synced watchers of a key range.
    ranges: RangeWatchers,
    /// Watchers catching up from the store.
    behind: BTreeSet<WatcherKey>,
    /// Watchers told how far they were sent at every feed.
    progress: BTreeSet<WatcherKey>,
    /// The store revision through which synced watchers have been fed.
    fed_through: i64,
}

impl ShardWatchers {
    /// Watchers that are catching up from the store.
    #[cfg(test)]
    fn behind_count(&self) -> usize {
        self.behind.len()
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
        if self.watchers.is_empty() {
            // Nothing was fed while there were no watchers.
            self.fed_through = current_revision;
        }
        self.remove(&key);
        if spec.progress {
            self.progress.insert(key);
        }
        let next_rev = if start_revision > 0 {
            start_revision
        } else {
            current_revision + 1
        };
        self.watchers.insert(
            key,
            Watcher {
                spec,
                next_rev,
                tx,
                synced: false,
                blocked_at: None,
            },
        );
        if next_rev > self.fed_through {
            self.sync(key);
        } else {
            self.behind.insert(key);
        }
    }

    pub fn remove(&mut self, key: &WatcherKey) {
        if self.watchers.contains_key(key) {
            self.unsync(key);
            self.behind.remove(key);
            self.progress.remove(key);
            self.watchers.remove(key);
        }
    }

    /// Drops the watchers whose stream has gone away.
    pub fn sweep_closed(&mut self) {
        let closed: Vec<WatcherKey> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.tx.is_closed())
            .map(|(k, _)| *k)
            .collect();
        for key in closed {
            self.remove(&key);
        }
    }

    /// The revision through which every watcher of watch stream `stream` has
    /// been sent its events (`current_revision` when the stream has none
    /// here): what a progress notification may promise.
    pub fn delivered_through(&self, stream: u64, current_revision: i64) -> i64 {
        self.watchers
            .range((stream, i64::MIN)..=(stream, i64::MAX))
            .map(|(_, w)| {
                let through = if w.synced {
                    self.fed_through
                } else {
                    w.next_rev - 1
                };
                through.min(current_revision)
            })
            .min()
            .unwrap_or(current_revision)
    }

    /// Feeds synced watchers what the store applied since the last call, then
    /// lets watchers that are behind catch up. Never waits. Turns the store's
    /// change capture on while there are watchers and off when there are none.
    pub fn notify(&mut self, shard: ShardId, store: &mut mvcc::Store) {
        if self.watchers.is_empty() {
            store.capture_changes(false);
            return;
        }
        store.capture_changes(true);
        let since = store.captured_since();
        let changes = store.take_changes();
        let current = store.current_revision();
        if current != self.fed_through {
            // The capture began at the last feed: it holds every change
            // since (revisions may skip numbers, and an entry may move the
            // revision without a change).
            let follows_on = since == Some(self.fed_through);
            if follows_on {
                self.feed(shard, store, &changes, current);
            } else {
                // The changes do not cover the revisions since the last feed
                // (capture was just turned on, or the store was replaced by a
                // snapshot): every synced watcher reads them from the store.
                let synced: Vec<WatcherKey> = self
                    .watchers
                    .iter()
                    .filter(|(_, w)| w.synced)
                    .map(|(k, _)| *k)
                    .collect();
                for key in synced {
                    self.fall_behind(key);
                }
            }
            self.fed_through = current;
        }
        if !self.behind.is_empty() {
            self.catch_up(shard, store);
        }
    }

    /// Sends each synced watcher the changes of revisions up to `current`
    /// that it watches, in one batch per watcher.
    fn feed(
        &mut self,
        shard: ShardId,
        store: &mvcc::Store,
        changes: &[mvcc::Change],
        current: i64,
    ) {
        let mut out: BTreeMap<WatcherKey, (Vec<mvccpb::Event>, Vec<i64>)> = BTreeMap::new();
        let ranges = self.ranges.index();
        let mut ranged = Vec::new();
        for c in changes {
            let key = c.kv().key.as_slice();
            // The key's previous value and the change in its wire form, each
            // made once for all the watchers of this change that need it.
            let mut prev: Option<Option<mvccpb::KeyValue>> = None;
            let mut kv: Option<mvccpb::KeyValue> = None;
            ranged.clear();
            ranges.holding(key, &mut ranged);
            let single = self.by_key.get(key).into_iter().flatten();
            for wk in single.chain(&ranged) {
                let w = &self.watchers[wk];
                if c.revision().main < w.next_rev {
                    continue;
                }
                let prev_kv = || {
                    prev.get_or_insert_with(|| previous(store, key, c.revision().main))
                        .clone()
                };
                let kv = || kv.get_or_insert_with(|| kv_to_pb(c.kv().clone())).clone();
                if let Some(event) = event_for(&w.spec, c.kind(), kv, prev_kv) {
                    let (events, subs) = out.entry(*wk).or_default();
                    events.push(event);
                    subs.push(c.revision().sub);
                }
            }
        }
        // Watchers of several shards hear how far they were sent even when
        // nothing they watch changed.
        for key in &self.progress {
            if self.watchers.get(key).is_some_and(|w| w.synced) {
                out.entry(*key).or_default();
            }
        }
        for (key, (events, subs)) in out {
            let Some(w) = self.watchers.get_mut(&key) else {
                continue;
            };
            let last = events.last().and_then(|e| e.kv.as_ref());
            if last.is_some_and(|kv| kv.mod_revision > w.event_limit()) {
                // Events past its watch's window: it reads them back from
                // the store as the window moves on.
                self.fall_behind(key);
                continue;
            }
            match w.tx.try_send(WatchBatch {
                watcher: key.1,
                shard,
                revision: current,
                through: current,
                events,
                subs,
                compact_revision: None,
            }) {
                Ok(()) => w.next_rev = w.next_rev.max(current + 1),
                // Full: it goes on from the first revision it missed.
                Err(mpsc::error::TrySendError::Full(_)) => self.fall_behind(key),
                Err(mpsc::error::TrySendError::Closed(_)) => self.remove(&key),
            }
        }
    }

    /// Delivers what the store holds past the position of each watcher that
    /// is behind and whose stream has room; one that reaches the store's
    /// revision is synced again.
    fn catch_up(&mut self, shard: ShardId, store: &mvcc::Store) {
        let current = store.current_revision();
        let compact = store.compact_revision();
        // Watchers whose position was compacted away are cancelled first, so
        // they do not hold back (or empty) the pass for the others. A cancel
        // that finds the queue full is retried on a later pass.
        let mut done = Vec::new();
        for key in &self.behind {
            let w = &self.watchers[key];
            if w.next_rev < compact && w.next_rev <= current {
                match w.tx.try_send(WatchBatch {
                    watcher: key.1,
                    shard,
                    revision: current,
                    through: w.next_rev - 1,
                    events: Vec::new(),
                    subs: Vec::new(),
                    compact_revision: Some(compact),
                }) {
                    Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => done.push(*key),
                    Err(mpsc::error::TrySendError::Full(_)) => {}
                }
            }
        }
        for key in done.drain(..) {
            self.remove(&key);
        }
        // A watcher whose stream is full is not read for: it waits for room;
        // likewise one whose next event its watch's window does not reach.
        let ready: Vec<WatcherKey> = self
            .behind
            .iter()
            .filter(|k| {
                let w = &self.watchers[*k];
                w.tx.capacity() > 0 && !w.waits_for_window()
            })
            .copied()
            .collect();
        let Some(from) = ready
            .iter()
            .map(|k| self.watchers[k].next_rev)
            .filter(|&r| r <= current)
            .min()
        else {
            for key in ready {
                if self.watchers[&key].next_rev > current {
                    self.sync(key);
                }
            }
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
        for key in ready {
            let w = &self.watchers[&key];
            if w.next_rev > scanned {
                if w.next_rev > current {
                    self.sync(key);
                }
                continue;
            }
            // Its events of the pass, up to the first past its window: it
            // is sent through the revision before that one.
            let limit = w.event_limit();
            let (mut out, mut subs) = (Vec::new(), Vec::new());
            let (mut upto, mut blocked_at) = (scanned, None);
            for e in events.iter().filter(|e| {
                e.revision.main >= w.next_rev
                    && e.revision.main <= scanned
                    && w.spec.matches(&e.kv.key)
            }) {
                if !keeps(&w.spec, e.kind) {
                    continue;
                }
                if e.revision.main > limit {
                    upto = e.revision.main - 1;
                    blocked_at = Some(e.revision.main);
                    break;
                }
                let kv = || kv_to_pb(e.kv.clone());
                let previous = || previous(store, &e.kv.key, e.revision.main);
                let Some(event) = event_for(&w.spec, e.kind, kv, previous) else {
                    continue;
                };
                out.push(event);
                subs.push(e.revision.sub);
            }
            if upto < w.next_rev {
                // Nothing it may be sent: it waits for the window.
                self.watchers
                    .get_mut(&key)
                    .expect("watcher in table")
                    .blocked_at = blocked_at;
                continue;
            }
            let sent = (out.is_empty() && !w.spec.progress)
                || match w.tx.try_send(WatchBatch {
                    watcher: key.1,
                    shard,
                    revision: current,
                    through: upto,
                    events: out,
                    subs,
                    compact_revision: None,
                }) {
                    Ok(()) => true,
                    // Full: stays behind, tried again on a later pass.
                    Err(mpsc::error::TrySendError::Full(_)) => false,
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        done.push(key);
                        false
                    }
                };
            if sent {
                let w = self.watchers.get_mut(&key).expect("watcher in table");
                w.next_rev = w.next_rev.max(upto + 1);
                w.blocked_at = blocked_at;
                if upto == current && self.fed_through == current {
                    self.sync(key);
                }
            }
        }
        for key in done {
            self.remove(&key);
        }
    }

    /// Puts a watcher in the feed: everything up to `fed_through` was sent.
    fn sync(&mut self, key: WatcherKey) {
        let Some(w) = self.watchers.get_mut(&key) else {
            return;
        };
        self.behind.remove(&key);
        w.blocked_at = None;
        if w.synced {
            return;
        }
        w.synced = true;
        if w.spec.range_end.is_empty() {
            self.by_key
                .entry(w.spec.key.clone())
                .or_default()
                .insert(key);
        } else {
            self.ranges.insert(key, &w.spec);
        }
    }

    /// Takes a watcher out of the feed, keeping its position.
    fn unsync(&mut self, key: &WatcherKey) {
        let Some(w) = self.watchers.get_mut(key) else {
            return;
        };
        if !w.synced {
            return;
        }
        w.synced = false;
        // Everything through the last feed was sent to it.
        w.next_rev = w.next_rev.max(self.fed_through + 1);
        if w.spec.range_end.is_empty() {
            if let Some(keys) = self.by_key.get_mut(&w.spec.key) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_key.remove(&w.spec.key);
                }
            }
        } else {
            self.ranges.remove(*key, &w.spec);
        }
    }

    /// Moves a synced watcher that missed the current feed to catch-up, from
    /// the first revision of that feed.
    fn fall_behind(&mut self, key: WatcherKey) {
        self.unsync(&key);
        if self.watchers.contains_key(&key) {
            self.behind.insert(key);
        }
    }
}

/// Whether a watcher with `spec` is sent changes of `kind` (etcd's filters).
fn keeps(spec: &WatchSpec, kind: mvcc::EventKind) -> bool {
    match kind {
        mvcc::EventKind::Put => !spec.no_put,
        mvcc::EventKind::Delete => !spec.no_delete,
    }
}

/// The event a watcher with `spec` gets for a change, if its filters keep it;
/// `kv` is asked for the changed key-value only if they do, and `prev_kv` for
/// the key's previous value only if the spec wants it.
fn event_for(
    spec: &WatchSpec,
    kind: mvcc::EventKind,
    kv: impl FnOnce() -> mvccpb::KeyValue,
    prev_kv: impl FnOnce() -> Option<mvccpb::KeyValue>,
) -> Option<mvccpb::Event> {
    if !keeps(spec, kind) {
        return None;
    }
    let kind = match kind {
        mvcc::EventKind::Put => mvccpb::event::EventType::Put,
        mvcc::EventKind::Delete => mvccpb::event::EventType::Delete,
    };
    let prev_kv = if spec.prev_kv { prev_kv() } else { None };
    Some(mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv()),
        prev_kv,
    })
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

#[cfg(test)]
mod tests;

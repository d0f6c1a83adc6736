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
//! can release other shards' events in revision order.

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
    spec: WatchSpec,
    /// The first revision not yet sent; while synced, revisions up to
    /// `fed_through` count as sent whatever this says.
    next_rev: i64,
    tx: mpsc::Sender<WatchBatch>,
    synced: bool,
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
            match w.tx.try_send(WatchBatch {
                watch_id: key.1,
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
                    watch_id: key.1,
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
        // A watcher whose stream is full is not read for: it waits for room.
        let ready: Vec<WatcherKey> = self
            .behind
            .iter()
            .filter(|k| self.watchers[*k].tx.capacity() > 0)
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
            let (out, subs): (Vec<mvccpb::Event>, Vec<i64>) = events
                .iter()
                .filter(|e| e.revision.main >= w.next_rev && e.revision.main <= scanned)
                .filter(|e| w.spec.matches(&e.kv.key))
                .filter_map(|e| {
                    let kv = || kv_to_pb(e.kv.clone());
                    event_for(&w.spec, e.kind, kv, || {
                        previous(store, &e.kv.key, e.revision.main)
                    })
                    .map(|ev| (ev, e.revision.sub))
                })
                .unzip();
            let sent = (out.is_empty() && !w.spec.progress)
                || match w.tx.try_send(WatchBatch {
                    watch_id: key.1,
                    shard,
                    revision: current,
                    through: scanned,
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
                w.next_rev = w.next_rev.max(scanned + 1);
                if scanned == current && self.fed_through == current {
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

/// The event a watcher with `spec` gets for a change, if its filters keep it;
/// `kv` is asked for the changed key-value only if they do, and `prev_kv` for
/// the key's previous value only if the spec wants it.
fn event_for(
    spec: &WatchSpec,
    kind: mvcc::EventKind,
    kv: impl FnOnce() -> mvccpb::KeyValue,
    prev_kv: impl FnOnce() -> Option<mvccpb::KeyValue>,
) -> Option<mvccpb::Event> {
    let kind = match kind {
        mvcc::EventKind::Put if spec.no_put => return None,
        mvcc::EventKind::Delete if spec.no_delete => return None,
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
mod tests {
    use super::*;
    use crate::server::shard::test_store::TestStore;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// What a watcher received: (revision, put?, key, value, previous value).
    type Seen = (i64, bool, Vec<u8>, Vec<u8>, Option<Vec<u8>>);

    struct Client {
        key: WatcherKey,
        spec: WatchSpec,
        start: i64,
        rx: mpsc::Receiver<WatchBatch>,
        seen: Vec<Seen>,
        /// Reads nothing until the end of the run.
        stalled: bool,
        cancelled: bool,
    }

    impl Client {
        fn drain(&mut self, max_batches: usize) {
            for _ in 0..max_batches {
                let Ok(b) = self.rx.try_recv() else { return };
                assert_eq!(b.watch_id, self.key.1);
                if b.compact_revision.is_some() {
                    self.cancelled = true;
                }
                for e in b.events {
                    let kv = e.kv.unwrap();
                    self.seen.push((
                        kv.mod_revision,
                        e.r#type == mvccpb::event::EventType::Put as i32,
                        kv.key.to_vec(),
                        kv.value.to_vec(),
                        e.prev_kv.map(|p| p.value.to_vec()),
                    ));
                }
            }
        }
    }

    fn put_req(key: &str, value: &str) -> mvcc::PutRequest {
        mvcc::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    fn delete_req(key: &str, range_end: &str) -> mvcc::DeleteRangeRequest {
        mvcc::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: range_end.as_bytes().to_vec(),
            prev_kv: false,
        }
    }

    /// What a watcher must have received: every event from its start on, read
    /// back from the store, that its spec and filters keep.
    fn expected(store: &mvcc::Store, spec: &WatchSpec, start: i64) -> Vec<Seen> {
        store
            .events(start, usize::MAX)
            .unwrap()
            .into_iter()
            .filter(|e| spec.matches(&e.kv.key))
            .filter(|e| match e.kind {
                mvcc::EventKind::Put => !spec.no_put,
                mvcc::EventKind::Delete => !spec.no_delete,
            })
            .map(|e| {
                let prev = spec
                    .prev_kv
                    .then(|| previous(store, &e.kv.key, e.revision.main))
                    .flatten()
                    .map(|p| p.value.to_vec());
                (
                    e.revision.main,
                    e.kind == mvcc::EventKind::Put,
                    e.kv.key.clone(),
                    e.kv.value.clone(),
                    prev,
                )
            })
            .collect()
    }

    fn random_spec(rng: &mut SmallRng) -> WatchSpec {
        let k = |i: u32| format!("k{i}").into_bytes();
        let (key, range_end) = match rng.gen_range(0..4) {
            0 | 1 => (k(rng.gen_range(0..8)), Vec::new()),
            2 => {
                let a = rng.gen_range(0..7);
                (k(a), k(rng.gen_range(a + 1..9)))
            }
            _ => (b"k".to_vec(), b"\0".to_vec()),
        };
        WatchSpec {
            key,
            range_end,
            prev_kv: rng.gen_bool(0.3),
            no_put: rng.gen_bool(0.1),
            no_delete: rng.gen_bool(0.1),
            progress: false,
        }
    }

    fn random_write(rng: &mut SmallRng) -> mvcc::Op {
        // The txn's second put is to k7: its first must be to another key.
        let key = format!("k{}", rng.gen_range(0..7));
        let value = format!("v{}", rng.gen::<u16>());
        match rng.gen_range(0..10) {
            0 => mvcc::Op::DeleteRange(delete_req(&key, "")),
            1 => mvcc::Op::DeleteRange(delete_req("k2", "k5")),
            2 => mvcc::Op::Txn(mvcc::TxnRequest {
                compare: Vec::new(),
                success: vec![
                    mvcc::RequestOp::Put(put_req(&key, &value)),
                    mvcc::RequestOp::Put(put_req("k7", &value)),
                ],
                failure: Vec::new(),
            }),
            _ => mvcc::Op::Put(put_req(&key, &value)),
        }
    }

    #[test]
    fn every_watcher_gets_each_matching_event_once_in_order_at_any_reading_pace() {
        for seed in 0..30u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut h = TestStore::new(0);
            let mut watchers = ShardWatchers::default();
            let mut clients = Vec::new();
            for i in 0..5 {
                h.put(&format!("k{i}"), "initial", 0);
            }
            for id in 0..24i64 {
                let spec = random_spec(&mut rng);
                let current = h.store.current_revision();
                // From now, or from a past revision (catch-up first).
                let start = if rng.gen_bool(0.3) {
                    rng.gen_range(1..=current)
                } else {
                    0
                };
                let (tx, rx) = mpsc::channel(rng.gen_range(1..4));
                let key = (id as u64 % 3, id);
                watchers.add(key, spec.clone(), start, current, tx);
                watchers.notify(0, &mut h.store);
                clients.push(Client {
                    key,
                    spec,
                    start: if start > 0 { start } else { current + 1 },
                    rx,
                    seen: Vec::new(),
                    stalled: rng.gen_bool(0.2),
                    cancelled: false,
                });
            }
            for _ in 0..300 {
                for _ in 0..rng.gen_range(1..4) {
                    let op = random_write(&mut rng);
                    h.apply(op);
                }
                watchers.notify(0, &mut h.store);
                for c in clients.iter_mut().filter(|c| !c.stalled) {
                    let n = rng.gen_range(0..3);
                    c.drain(n);
                }
            }
            assert!(
                watchers.behind_count() > 0,
                "seed {seed}: the run never made a watcher fall behind"
            );
            // Everyone reads now; every watcher catches up and is synced.
            for _ in 0..1_000 {
                for c in clients.iter_mut() {
                    c.drain(usize::MAX);
                }
                watchers.notify(0, &mut h.store);
                if watchers.behind_count() == 0 {
                    break;
                }
            }
            for c in clients.iter_mut() {
                c.drain(usize::MAX);
            }
            assert_eq!(watchers.behind_count(), 0, "seed {seed}: still behind");
            for c in &clients {
                assert!(!c.cancelled, "seed {seed}: nothing was compacted");
                let want = expected(&h.store, &c.spec, c.start);
                assert_eq!(
                    c.seen, want,
                    "seed {seed}: watcher {:?} {:?}",
                    c.key, c.spec
                );
                let current = h.store.current_revision();
                assert_eq!(watchers.delivered_through(c.key.0, current), current);
            }
        }
    }

    #[test]
    fn a_stalled_watcher_holds_a_bounded_queue_and_the_others_stay_fed() {
        let mut h = TestStore::new(0);
        let mut watchers = ShardWatchers::default();
        let spec = WatchSpec {
            key: b"k".to_vec(),
            range_end: b"\0".to_vec(),
            prev_kv: false,
            no_put: false,
            no_delete: false,
            progress: false,
        };
        let (stalled_tx, stalled_rx) = mpsc::channel(4);
        let (live_tx, mut live_rx) = mpsc::channel(4);
        let start = h.store.current_revision();
        watchers.add((1, 1), spec.clone(), 0, start, stalled_tx);
        watchers.add((2, 1), spec, 0, start, live_tx);
        for i in 1..=1_000 {
            h.put(&format!("k{}", i % 10), "v", 0);
            watchers.notify(0, &mut h.store);
            let batch = live_rx
                .try_recv()
                .expect("the reading watcher is fed every turn");
            assert_eq!(batch.events.len(), 1);
            assert_eq!(batch.events[0].kv.as_ref().unwrap().mod_revision, start + i);
        }
        let current = h.store.current_revision();
        assert_eq!(stalled_rx.len(), 4, "the stalled queue stays at its bound");
        assert_eq!(watchers.behind_count(), 1);
        assert_eq!(watchers.delivered_through(1, current), start + 4);
        assert_eq!(watchers.delivered_through(2, current), current);
    }

    #[test]
    fn a_watcher_behind_a_compaction_is_cancelled_with_the_compact_revision() {
        let mut h = TestStore::new(0);
        let mut watchers = ShardWatchers::default();
        let (tx, mut rx) = mpsc::channel(1);
        let spec = WatchSpec {
            key: b"a".to_vec(),
            range_end: Vec::new(),
            prev_kv: false,
            no_put: false,
            no_delete: false,
            progress: false,
        };
        let start = h.store.current_revision();
        watchers.add((1, 7), spec, 0, start, tx);
        for _ in 0..3 {
            h.put("a", "v", 0);
            watchers.notify(0, &mut h.store);
        }
        // A queue of one: the first put went out, the next two did not.
        assert_eq!(watchers.behind_count(), 1);
        h.apply(mvcc::Op::Compact(mvcc::CompactionRequest {
            revision: start + 3,
        }));
        let first = rx.try_recv().unwrap();
        assert_eq!(first.events.len(), 1);
        watchers.notify(0, &mut h.store);
        let cancel = rx.try_recv().unwrap();
        assert_eq!(cancel.compact_revision, Some(start + 3));
        assert!(
            watchers.watchers.is_empty(),
            "a cancelled watcher is dropped"
        );
    }

    #[test]
    fn a_replaced_store_makes_synced_watchers_read_from_it() {
        let mut a = TestStore::new(0);
        let mut watchers = ShardWatchers::default();
        let (tx, mut rx) = mpsc::channel(16);
        let spec = WatchSpec {
            key: b"k".to_vec(),
            range_end: b"\0".to_vec(),
            prev_kv: true,
            no_put: false,
            no_delete: false,
            progress: false,
        };
        let start = a.store.current_revision();
        watchers.add((1, 1), spec.clone(), 0, start, tx);
        a.put("k1", "1", 0);
        watchers.notify(0, &mut a.store);
        // A store installed from a snapshot: the same first write and more.
        let mut b = TestStore::new(0);
        for v in ["1", "2", "3"] {
            b.put("k1", v, 0);
        }
        watchers.notify(0, &mut b.store);
        let mut got = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            got.extend(batch.events);
        }
        let revs: Vec<i64> = got
            .iter()
            .map(|e| e.kv.as_ref().unwrap().mod_revision)
            .collect();
        assert_eq!(revs, [start + 1, start + 2, start + 3]);
        assert_eq!(got[2].prev_kv.as_ref().unwrap().value.as_ref(), b"2");
        assert_eq!(watchers.behind_count(), 0);
        // And fed from apply again afterwards.
        b.put("k2", "x", 0);
        watchers.notify(0, &mut b.store);
        assert_eq!(rx.try_recv().unwrap().events.len(), 1);
    }

    #[test]
    fn closed_streams_are_swept_and_capture_stops_with_the_last_watcher() {
        let mut h = TestStore::new(0);
        let mut watchers = ShardWatchers::default();
        let (tx, rx) = mpsc::channel(1);
        let current = h.store.current_revision();
        watchers.add(
            (1, 1),
            random_spec(&mut SmallRng::seed_from_u64(1)),
            0,
            current,
            tx,
        );
        watchers.notify(0, &mut h.store);
        assert!(h.store.is_capturing_changes());
        drop(rx);
        watchers.sweep_closed();
        watchers.notify(0, &mut h.store);
        assert!(watchers.watchers.is_empty());
        assert!(!h.store.is_capturing_changes());
    }
}

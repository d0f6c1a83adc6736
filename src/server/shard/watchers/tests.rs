//! Guards the watcher table: every watcher gets each matching event once and
//! in order at any reading pace, a stalled one holds a bounded queue, a
//! compacted position cancels, a replaced store is read from, closed streams
//! are swept, a watcher is sent nothing past its watch's window.

use super::*;
use crate::server::command::WatchWindow;
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
            assert_eq!(b.watcher, self.key.1);
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
        window: None,
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
        window: None,
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
fn a_watcher_ahead_of_its_window_waits_and_reads_on_from_the_store_as_it_moves() {
    let mut h = TestStore::new(0);
    let mut watchers = ShardWatchers::default();
    let (tx, mut rx) = mpsc::channel(64);
    let start = h.store.current_revision();
    // Released through `start`, three revisions wide: events up to 3 (as
    // revisions after `start`) may be sent.
    let window = WatchWindow::new(start, 3);
    let spec = WatchSpec {
        progress: true,
        window: Some(window.clone()),
        ..WatchSpec::every_change(b"k", b"l")
    };
    watchers.add((1, 1), spec, 0, start, tx);
    // (revisions of its events, through) of each batch it has been sent.
    let sent = |rx: &mut mpsc::Receiver<WatchBatch>| {
        let mut batches = Vec::new();
        while let Ok(b) = rx.try_recv() {
            let revisions: Vec<i64> = b
                .events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision - start)
                .collect();
            batches.push((revisions, b.through - start));
        }
        batches
    };
    let none = Vec::<i64>::new;
    // Changes it does not watch: it hears how far it was sent, past the
    // window too (only events are held back).
    for i in 0..5 {
        h.put(&format!("x{i}"), "v", 0);
        watchers.notify(0, &mut h.store);
    }
    let told: Vec<_> = (1..=5).map(|r| (none(), r)).collect();
    assert_eq!(sent(&mut rx), told);
    // Its own, all past the window: nothing is sent however many come.
    for i in 0..5 {
        h.put(&format!("k{i}"), "v", 0);
        watchers.notify(0, &mut h.store);
    }
    assert_eq!(sent(&mut rx), []);
    assert_eq!(watchers.behind_count(), 1);
    assert_eq!(watchers.delivered_through(1, start + 10), start + 5);
    // The window moves to 7: read from the store through it, still behind.
    window.set_released(start + 4);
    watchers.notify(0, &mut h.store);
    assert_eq!(sent(&mut rx), [(vec![6, 7], 7)]);
    assert_eq!(watchers.behind_count(), 1);
    watchers.notify(0, &mut h.store);
    assert_eq!(sent(&mut rx), []);
    // Past the store's revision: the rest, and fed from apply again.
    window.set_released(start + 10);
    watchers.notify(0, &mut h.store);
    assert_eq!(sent(&mut rx), [(vec![8, 9, 10], 10)]);
    assert_eq!(watchers.behind_count(), 0);
    h.put("k", "v", 0);
    watchers.notify(0, &mut h.store);
    assert_eq!(sent(&mut rx), [(vec![11], 11)]);
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
        window: None,
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
        window: None,
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

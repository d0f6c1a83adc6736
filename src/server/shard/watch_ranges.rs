//! The shard's synced range watchers, found by a key they hold.
//!
//! Each change goes to the range watchers whose range holds its key: a
//! stabbing query. The ranges are kept in start order in a flat array with a
//! tree above it naming, for each span of the array, the range of that span
//! that ends last. A query descends only into spans that start at or below
//! the key and have a range ending above it, so it costs O((1 + m) log n) for
//! m watchers found among n, where testing every range watcher cost n for
//! every change. The array and its tree are built again, in linear time, at
//! the first query after a watcher came or went.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::server::command::{WatchSpec, WatcherKey};

/// Where a range stops: before a key, or never (etcd's range end "\0").
/// `At` orders below `Unbounded`, and two `At`s by their keys.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    At(Rc<[u8]>),
    Unbounded,
}

impl End {
    fn of(spec: &WatchSpec) -> End {
        if spec.range_end == b"\0" {
            End::Unbounded
        } else {
            End::At(spec.range_end.as_slice().into())
        }
    }

    /// Whether a range ending here, and starting at or below `key`, holds it.
    fn above(&self, key: &[u8]) -> bool {
        match self {
            End::At(end) => key < &end[..],
            End::Unbounded => true,
        }
    }
}

/// No range: the tree's mark for a span past the array's end.
const NONE: u32 = u32::MAX;

/// The synced watchers of a key range (a `WatchSpec` with a range end).
#[derive(Default)]
pub struct RangeWatchers {
    /// Every one, by its range's start and its key; the value is its end.
    by_start: BTreeMap<(Rc<[u8]>, WatcherKey), End>,
    /// The query's form of `by_start`; None when it has changed since.
    built: Option<Built>,
}

struct Built {
    /// The ranges in start order: start, end, watcher.
    ranges: Vec<(Rc<[u8]>, End, WatcherKey)>,
    /// A complete binary tree over `ranges` padded to `width` leaves: node 1
    /// spans them all, node `i`'s children are `2i` and `2i + 1`, leaf `j` is
    /// node `width + j`. Each node holds the index in `ranges` of the range
    /// of its span that ends last, or `NONE` for a span of padding only.
    last_end: Vec<u32>,
    width: usize,
}

impl RangeWatchers {
    /// Adds a watcher of `spec`, whose range end is not empty.
    pub fn insert(&mut self, key: WatcherKey, spec: &WatchSpec) {
        let start: Rc<[u8]> = spec.key.as_slice().into();
        self.by_start.insert((start, key), End::of(spec));
        self.built = None;
    }

    pub fn remove(&mut self, key: WatcherKey, spec: &WatchSpec) {
        let start: Rc<[u8]> = spec.key.as_slice().into();
        if self.by_start.remove(&(start, key)).is_some() {
            self.built = None;
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// The index the queries read, built now if the set changed since the
    /// last build.
    pub fn index(&mut self) -> RangeIndex<'_> {
        let by_start = &self.by_start;
        RangeIndex(self.built.get_or_insert_with(|| Built::new(by_start)))
    }
}

/// The synced range watchers as they stand, ready for queries.
pub struct RangeIndex<'a>(&'a Built);

impl RangeIndex<'_> {
    /// Appends to `out` every watcher whose range holds `key`, in the order
    /// of their starts (and keys, among equal starts).
    pub fn holding(&self, key: &[u8], out: &mut Vec<WatcherKey>) {
        let b = self.0;
        // Ranges from this index on start above the key.
        let starting_above = b.ranges.partition_point(|(start, _, _)| &start[..] <= key);
        if starting_above > 0 {
            b.descend(1, 0, b.width, starting_above, key, out);
        }
    }
}

impl Built {
    fn new(by_start: &BTreeMap<(Rc<[u8]>, WatcherKey), End>) -> Built {
        let ranges: Vec<(Rc<[u8]>, End, WatcherKey)> = by_start
            .iter()
            .map(|((start, key), end)| (start.clone(), end.clone(), *key))
            .collect();
        let width = ranges.len().max(1).next_power_of_two();
        let mut last_end = vec![NONE; 2 * width];
        for j in 0..ranges.len() {
            last_end[width + j] = j as u32;
        }
        for node in (1..width).rev() {
            let (l, r) = (last_end[2 * node], last_end[2 * node + 1]);
            last_end[node] = match (l, r) {
                (NONE, _) => r,
                (_, NONE) => l,
                _ if ranges[r as usize].1 > ranges[l as usize].1 => r,
                _ => l,
            };
        }
        Built {
            ranges,
            last_end,
            width,
        }
    }

    /// Visits node `node`, spanning ranges `lo..hi`, of which those below
    /// `limit` start at or below `key`.
    fn descend(
        &self,
        node: usize,
        lo: usize,
        hi: usize,
        limit: usize,
        key: &[u8],
        out: &mut Vec<WatcherKey>,
    ) {
        if lo >= limit {
            return;
        }
        let last = self.last_end[node];
        if last == NONE || !self.ranges[last as usize].1.above(key) {
            // No range of the span reaches past the key.
            return;
        }
        if hi - lo == 1 {
            out.push(self.ranges[lo].2);
            return;
        }
        let mid = (lo + hi) / 2;
        self.descend(2 * node, lo, mid, limit, key, out);
        self.descend(2 * node + 1, mid, hi, limit, key, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// A key of up to three letters of a four-letter alphabet that includes
    /// the 0 byte, so that ranges touch, nest and end where others start.
    fn random_key(rng: &mut SmallRng) -> Vec<u8> {
        let len = rng.gen_range(0..=3);
        (0..len).map(|_| b"\0ab\xff"[rng.gen_range(0..4)]).collect()
    }

    #[test]
    fn finds_the_watchers_a_scan_of_every_range_finds() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut found_some = 0;
        let mut found_none = 0;
        for _round in 0..200 {
            let mut set = RangeWatchers::default();
            let mut live: BTreeMap<WatcherKey, WatchSpec> = BTreeMap::new();
            for step in 0..rng.gen_range(1..60) {
                let remove = !live.is_empty() && rng.gen_bool(0.3);
                if remove {
                    let i = rng.gen_range(0..live.len());
                    let key = *live.keys().nth(i).unwrap();
                    let s = live.remove(&key).unwrap();
                    set.remove(key, &s);
                } else {
                    let mut start = random_key(&mut rng);
                    if start.is_empty() {
                        start.push(b'a');
                    }
                    // Some ends are at or below their start: such a range
                    // holds no key. (A watcher without a range end watches
                    // one key and is not kept here.)
                    let end = match random_key(&mut rng) {
                        e if e.is_empty() || rng.gen_bool(0.2) => b"\0".to_vec(),
                        e => e,
                    };
                    let s = WatchSpec::every_change(&start, &end);
                    // Several watchers may share a range, and a stream.
                    let key = (rng.gen_range(0..3), step);
                    set.insert(key, &s);
                    live.insert(key, s);
                }
                assert_eq!(set.len(), live.len());
                for _ in 0..8 {
                    let probe = random_key(&mut rng);
                    let mut got = Vec::new();
                    set.index().holding(&probe, &mut got);
                    got.sort();
                    let want: Vec<WatcherKey> = live
                        .iter()
                        .filter(|(_, s)| s.matches(&probe))
                        .map(|(k, _)| *k)
                        .collect();
                    assert_eq!(got, want, "probe {probe:?} over {live:?}");
                    if want.is_empty() {
                        found_none += 1;
                    } else {
                        found_some += 1;
                    }
                }
            }
        }
        assert!(
            found_some > 2_000 && found_none > 2_000,
            "{found_some} / {found_none}"
        );
    }

    #[test]
    fn ranges_are_half_open_and_the_zero_end_is_unbounded() {
        let mut set = RangeWatchers::default();
        set.insert((1, 1), &WatchSpec::every_change(b"b", b"d"));
        set.insert((1, 2), &WatchSpec::every_change(b"c", b"\0"));
        set.insert((1, 3), &WatchSpec::every_change(b"d", b"c"));
        let holding = |set: &mut RangeWatchers, key: &[u8]| {
            let mut out = Vec::new();
            set.index().holding(key, &mut out);
            out
        };
        assert_eq!(holding(&mut set, b"a"), []);
        assert_eq!(holding(&mut set, b"b"), [(1, 1)]);
        assert_eq!(holding(&mut set, b"c"), [(1, 1), (1, 2)]);
        assert_eq!(holding(&mut set, b"d"), [(1, 2)]);
        assert_eq!(holding(&mut set, b"\xff\xff"), [(1, 2)]);
        set.remove((1, 2), &WatchSpec::every_change(b"c", b"\0"));
        assert_eq!(holding(&mut set, b"c"), [(1, 1)]);
        assert_eq!(holding(&mut set, b"z"), []);
    }

    /// What feeding a change costs with many range watchers, none of which
    /// holds the written keys, beside one that holds them all. Run with
    /// `cargo test --release --lib watch_ranges::tests::feed_cost -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore]
    fn feed_cost() {
        use crate::server::shard::test_store::TestStore;
        use crate::server::shard::watchers::ShardWatchers;
        use std::time::{Duration, Instant};
        use tokio::sync::mpsc;

        for n in [0usize, 1_000, 10_000, 100_000] {
            let mut h = TestStore::new(0);
            let mut watchers = ShardWatchers::default();
            let current = h.store.current_revision();
            let mut idle = Vec::new();
            for i in 0..n {
                let (tx, rx) = mpsc::channel(1);
                idle.push(rx);
                let s = WatchSpec::every_change(
                    format!("r{i:06}/").as_bytes(),
                    format!("r{i:06}0").as_bytes(),
                );
                watchers.add((i as u64, 1), s, 0, current, tx);
            }
            let (tx, mut rx) = mpsc::channel(1);
            watchers.add(
                (u64::MAX, 1),
                WatchSpec::every_change(b"k", b"l"),
                0,
                current,
                tx,
            );
            watchers.notify(0, &mut h.store);
            let (mut spent, mut changes, mut events) = (Duration::ZERO, 0, 0);
            for _turn in 0..50 {
                for j in 0..100 {
                    h.put(&format!("k{j}"), "v", 0);
                }
                let t = Instant::now();
                watchers.notify(0, &mut h.store);
                spent += t.elapsed();
                changes += 100;
                events += rx.try_recv().map_or(0, |b| b.events.len());
            }
            assert_eq!(events, changes, "the watcher of every key got every change");
            println!(
                "{n:>7} range watchers holding none of the keys: {:>9.0} ns a change",
                spent.as_nanos() as f64 / changes as f64
            );
        }
    }
}

//! The in-memory key index: for every key, its generations of revisions.
//!
//! A generation runs from the put that created the key to the tombstone that
//! deleted it; a put after a delete starts a new generation. The last
//! generation is empty while the key is deleted. Versions count puts within a
//! generation, starting at 1.

use std::ops::Bound;
use std::rc::Rc;

use crate::types::Revision;

/// Revisions of one generation. Most keys have one live revision after
/// compaction; keeping it inline saves an allocation per key.
#[derive(Debug, Clone, Default)]
enum Revs {
    #[default]
    Empty,
    One(Revision),
    Many(Vec<Revision>),
}

impl std::ops::Deref for Revs {
    type Target = [Revision];
    fn deref(&self) -> &[Revision] {
        match self {
            Revs::Empty => &[],
            Revs::One(r) => std::slice::from_ref(r),
            Revs::Many(v) => v,
        }
    }
}

impl Revs {
    fn push(&mut self, r: Revision) {
        *self = match std::mem::take(self) {
            Revs::Empty => Revs::One(r),
            Revs::One(a) => Revs::Many(vec![a, r]),
            Revs::Many(mut v) => {
                v.push(r);
                Revs::Many(v)
            }
        };
    }

    /// Moves the first `n` revisions to `out`.
    fn drain_front(&mut self, n: usize, out: &mut Vec<Revision>) {
        out.extend_from_slice(&self[..n]);
        let rest = &self[n..];
        *self = match rest.len() {
            0 => Revs::Empty,
            1 => Revs::One(rest[0]),
            _ => Revs::Many(rest.to_vec()),
        };
    }
}

#[derive(Debug, Clone, Default)]
struct Generation {
    /// Number of puts in this generation, including compacted ones.
    ver: i64,
    created: Revision,
    revs: Revs,
}

/// A key's generations: the current one inline (most keys never had a
/// delete, so a lookup reaches its revisions without another allocation),
/// the closed ones before it, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyIndex {
    /// Empty while the key is deleted.
    cur: Generation,
    /// Each ends with its tombstone.
    closed: Vec<Generation>,
}

/// What the index knows of a key at some revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    pub modified: Revision,
    pub created: Revision,
    pub version: i64,
}

impl KeyIndex {
    fn is_empty(&self) -> bool {
        self.closed.is_empty() && self.cur.revs.is_empty()
    }

    fn is_live(&self) -> bool {
        !self.cur.revs.is_empty()
    }

    fn get(&self, at: i64) -> Option<Found> {
        let gens =
            std::iter::once((true, &self.cur)).chain(self.closed.iter().rev().map(|g| (false, g)));
        for (current, g) in gens {
            let (Some(first), Some(tail)) = (g.revs.first(), g.revs.last()) else {
                continue;
            };
            // A closed generation ends with its tombstone.
            if !current && tail.main <= at {
                return None;
            }
            if first.main <= at {
                let n = g.revs.partition_point(|r| r.main <= at) - 1;
                return Some(Found {
                    modified: g.revs[n],
                    created: g.created,
                    version: g.ver - (g.revs.len() - 1 - n) as i64,
                });
            }
        }
        None
    }

    fn put(&mut self, rev: Revision) -> (Revision, i64) {
        let g = &mut self.cur;
        if g.revs.is_empty() {
            g.created = rev;
        }
        if let Some(last) = g.revs.last() {
            assert!(*last < rev, "key index put {rev:?} not after {last:?}");
        }
        g.revs.push(rev);
        g.ver += 1;
        (g.created, g.ver)
    }

    /// Ends the current generation with its tombstone.
    fn close(&mut self, rev: Revision) {
        self.put(rev);
        self.closed.push(std::mem::take(&mut self.cur));
    }

    /// Removes revisions that no read at or after `at` can reach; returns them.
    fn compact(&mut self, at: i64, removed: &mut Vec<Revision>) {
        let gone = self
            .closed
            .iter()
            .take_while(|g| {
                g.revs
                    .last()
                    .expect("closed generations are not empty")
                    .main
                    <= at
            })
            .count();
        for g in self.closed.drain(..gone) {
            removed.extend_from_slice(&g.revs);
        }
        let g = self.closed.first_mut().unwrap_or(&mut self.cur);
        let keep_from = g.revs.partition_point(|r| r.main <= at);
        if keep_from > 1 {
            g.revs.drain_front(keep_from - 1, removed);
        }
    }
}

/// Where a range ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Only the start key.
    Single,
    /// Every key at or after the start key.
    Open,
    /// Keys before this one.
    Before(Vec<u8>),
}

impl End {
    /// etcd's encoding: empty means one key, "\0" means to the end of the keyspace.
    pub(crate) fn from_range_end(range_end: &[u8]) -> End {
        match range_end {
            [] => End::Single,
            [0] => End::Open,
            e => End::Before(e.to_vec()),
        }
    }
}

const HEAD_BYTES: usize = size_of::<u128>();

/// An index key with its first bytes inline: most comparisons during a tree
/// search are settled by the inline head without a pointer chase to the key.
/// Zero padding keeps the order of the heads consistent with the order of the
/// keys: heads differ only where one key has a larger byte (or a byte where
/// the other has ended), and then the keys order the same way.
#[derive(Debug, Clone)]
pub(crate) struct IKey {
    /// The first bytes, zero padded, read as a big-endian integer: integer
    /// order is byte order, and comparing two integers needs no memcmp call.
    head: u128,
    full: Rc<[u8]>,
}

impl IKey {
    fn new(k: &[u8]) -> IKey {
        let mut head = [0u8; HEAD_BYTES];
        let n = k.len().min(HEAD_BYTES);
        head[..n].copy_from_slice(&k[..n]);
        IKey {
            head: u128::from_be_bytes(head),
            full: Rc::from(k),
        }
    }
}

impl PartialEq for IKey {
    fn eq(&self, o: &IKey) -> bool {
        self.head == o.head && self.full == o.full
    }
}
impl Eq for IKey {}
impl PartialOrd for IKey {
    fn partial_cmp(&self, o: &IKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for IKey {
    fn cmp(&self, o: &IKey) -> std::cmp::Ordering {
        self.head.cmp(&o.head).then_with(|| self.full.cmp(&o.full))
    }
}

/// Keys in order.
#[derive(Debug, Default)]
pub(crate) struct Index {
    keys: std::collections::BTreeMap<IKey, KeyIndex>,
}

impl Index {
    pub(crate) fn get(&self, key: &[u8], at: i64) -> Option<Found> {
        self.keys.get(&IKey::new(key))?.get(at)
    }

    pub(crate) fn is_live(&self, key: &[u8]) -> bool {
        self.keys
            .get(&IKey::new(key))
            .is_some_and(KeyIndex::is_live)
    }

    /// Records a put; returns the key's create revision and new version.
    pub(crate) fn put(&mut self, key: &[u8], rev: Revision) -> (Revision, i64) {
        let k = IKey::new(key);
        if let Some(ki) = self.keys.get_mut(&k) {
            return ki.put(rev);
        }
        let mut ki = KeyIndex::default();
        let r = ki.put(rev);
        self.keys.insert(k, ki);
        r
    }

    /// Rebuilds a key from a stored record whose generation may have lost its
    /// earlier revisions to compaction.
    pub(crate) fn restore(&mut self, key: &[u8], rev: Revision, created: i64, version: i64) {
        let ki = match self.keys.entry(IKey::new(key)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(KeyIndex {
                    cur: Generation {
                        ver: version,
                        created: Revision {
                            main: created,
                            sub: 0,
                        },
                        revs: Revs::One(rev),
                    },
                    closed: Vec::new(),
                });
                return;
            }
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
        };
        if ki.is_live() {
            ki.put(rev);
            return;
        }
        let g = &mut ki.cur;
        g.created = Revision {
            main: created,
            sub: 0,
        };
        g.ver = version;
        g.revs.push(rev);
    }

    /// Records a delete of a live key; false if the key is not live.
    pub(crate) fn tombstone(&mut self, key: &[u8], rev: Revision) -> bool {
        let Some(ki) = self.keys.get_mut(&IKey::new(key)) else {
            return false;
        };
        if !ki.is_live() {
            return false;
        }
        ki.close(rev);
        true
    }

    /// Visits keys of the range that exist at `at`, in key order (or reverse),
    /// starting after `resume` when given; stops when `f` returns false.
    pub(crate) fn visit(
        &self,
        key: &[u8],
        end: &End,
        at: i64,
        resume: Option<&[u8]>,
        reverse: bool,
        mut f: impl FnMut(&[u8], Found) -> bool,
    ) {
        if let End::Single = end {
            if resume.is_none() {
                if let Some(found) = self.get(key, at) {
                    f(key, found);
                }
            }
            return;
        }
        let upper = match end {
            End::Before(e) => {
                if e.as_slice() <= key {
                    return;
                }
                Bound::Excluded(IKey::new(e))
            }
            _ => Bound::Unbounded,
        };
        let mut lower = Bound::Included(IKey::new(key));
        let mut upper = upper;
        if let Some(r) = resume {
            if reverse {
                upper = Bound::Excluded(IKey::new(r));
                if r <= key {
                    return;
                }
            } else {
                if let Bound::Excluded(e) = &upper {
                    if r >= &*e.full {
                        return;
                    }
                }
                lower = Bound::Excluded(IKey::new(r));
            }
        }
        let range = self.keys.range((lower, upper));
        let mut visit = |(k, ki): (&IKey, &KeyIndex)| match ki.get(at) {
            Some(found) => f(&k.full, found),
            None => true,
        };
        if reverse {
            for e in range.rev() {
                if !visit(e) {
                    return;
                }
            }
        } else {
            for e in range {
                if !visit(e) {
                    return;
                }
            }
        }
    }

    /// Drops what compaction at `at` makes unreachable; returns the dropped
    /// revisions, sorted, for physical removal.
    pub(crate) fn compact(&mut self, at: i64) -> Vec<Revision> {
        let mut removed = Vec::new();
        self.compact_keys(at, None, usize::MAX, &mut removed);
        removed.sort_unstable();
        removed
    }

    /// Compacts at `at` at most `max_keys` keys (at least one) from the
    /// first key after `after` (from the first key when `None`), adding the
    /// revisions dropped to `removed` in no particular order. Returns the
    /// last key compacted while keys remain after it, `None` once the pass
    /// has reached the end.
    ///
    /// Leaving keys past the returned one uncompacted changes no read at or
    /// after `at`: a key's revisions at or below `at` that compaction drops
    /// are older than the one such a read finds (or in a generation deleted
    /// by then), and revisions written meanwhile are all above `at`.
    pub(crate) fn compact_keys(
        &mut self,
        at: i64,
        after: Option<&IKey>,
        max_keys: usize,
        removed: &mut Vec<Revision>,
    ) -> Option<IKey> {
        let lower = match after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        let mut range = self.keys.range_mut::<IKey, _>((lower, Bound::Unbounded));
        let mut gone = Vec::new();
        let mut last = None;
        for (k, ki) in range.by_ref().take(max_keys.max(1)) {
            ki.compact(at, removed);
            if ki.is_empty() {
                gone.push(k.clone());
            }
            last = Some(k);
        }
        // Only the key the next step resumes after is kept.
        let resume = range.next().and(last).cloned();
        for k in &gone {
            self.keys.remove(k);
        }
        resume
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(main: i64) -> Revision {
        Revision { main, sub: 0 }
    }

    #[test]
    fn inline_heads_order_keys_as_bytes_do() {
        let keys: Vec<&[u8]> = vec![
            b"",
            b"\0",
            b"\0\0",
            b"a",
            b"a\0",
            b"a\0\0x",
            b"a\x01",
            b"abcdefghijklmnop",
            b"abcdefghijklmnop\0",
            b"abcdefghijklmnopq",
            b"abcdefghijklmnoq",
            b"b",
            b"\xff",
        ];
        for a in &keys {
            for b in &keys {
                assert_eq!(IKey::new(a).cmp(&IKey::new(b)), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn versions_and_generations_follow_puts_and_deletes() {
        let mut ix = Index::default();
        assert_eq!(ix.put(b"a", r(2)), (r(2), 1));
        assert_eq!(ix.put(b"a", r(3)), (r(2), 2));
        assert!(ix.tombstone(b"a", r(4)));
        assert!(!ix.tombstone(b"a", r(5)));
        assert_eq!(ix.put(b"a", r(6)), (r(6), 1));
        assert_eq!(ix.get(b"a", 3).unwrap().version, 2);
        assert_eq!(ix.get(b"a", 4), None);
        assert_eq!(ix.get(b"a", 5), None);
        assert_eq!(ix.get(b"a", 1), None);
        assert_eq!(ix.get(b"a", 7).unwrap().modified, r(6));
    }

    #[test]
    fn compaction_keeps_the_newest_revision_at_or_below_and_drops_dead_generations() {
        let mut ix = Index::default();
        ix.put(b"a", r(2));
        ix.put(b"a", r(3));
        ix.tombstone(b"a", r(4));
        ix.put(b"b", r(5));
        ix.put(b"b", r(6));
        assert_eq!(ix.compact(3), vec![r(2)]);
        assert_eq!(ix.get(b"a", 3).unwrap().modified, r(3));
        assert_eq!(ix.compact(5), vec![r(3), r(4)]);
        assert!(!ix.keys.contains_key(&IKey::new(b"a")));
        assert_eq!(ix.get(b"b", 5).unwrap().version, 1);
        assert_eq!(ix.compact(6), vec![r(5)]);
        assert_eq!(ix.get(b"b", 6).unwrap().version, 2);
    }

    /// Keys of five histories around the compaction point 100: one put
    /// below; several puts below; a put and its delete below; puts on both
    /// sides; a generation deleted below and a new one above.
    fn histories(keys: u32) -> (Index, Vec<Vec<u8>>) {
        let mut ix = Index::default();
        let mut names = Vec::new();
        for i in 0..keys {
            let k = format!("k{i:03}").into_bytes();
            let base = i64::from(i % 40) * 2 + 2;
            match i % 5 {
                0 => {
                    ix.put(&k, r(base));
                }
                1 => {
                    ix.put(&k, r(base));
                    ix.put(&k, r(base + 1));
                }
                2 => {
                    ix.put(&k, r(base));
                    ix.tombstone(&k, r(base + 1));
                }
                3 => {
                    ix.put(&k, r(base));
                    ix.put(&k, r(100 + base));
                }
                _ => {
                    ix.put(&k, r(base));
                    ix.tombstone(&k, r(base + 1));
                    ix.put(&k, r(100 + base));
                }
            }
            names.push(k);
        }
        (ix, names)
    }

    #[test]
    fn a_pass_in_steps_with_writes_between_drops_what_one_pass_drops() {
        let at = 100;
        for per_step in [1, 2, 7, 1000] {
            let (mut whole, names) = histories(60);
            let (mut stepped, _) = histories(60);
            let mut expected = whole.compact(at);
            let mut removed = Vec::new();
            let mut after = None;
            let mut steps = 0;
            let mut next_rev = 300;
            loop {
                after = stepped.compact_keys(at, after.as_ref(), per_step, &mut removed);
                steps += 1;
                // Writes above the compaction point between steps, to keys
                // the pass has passed, has not reached, and dropped.
                for k in names.iter().skip(steps % 3).step_by(7) {
                    next_rev += 1;
                    if next_rev % 4 == 0 {
                        whole.tombstone(k, r(next_rev));
                        stepped.tombstone(k, r(next_rev));
                    } else {
                        whole.put(k, r(next_rev));
                        stepped.put(k, r(next_rev));
                    }
                }
                if after.is_none() {
                    break;
                }
            }
            assert_eq!(steps, 60usize.div_ceil(per_step), "steps of {per_step}");
            removed.sort_unstable();
            expected.sort_unstable();
            assert_eq!(removed, expected, "steps of {per_step}");
            assert!(!expected.is_empty());
            assert_eq!(stepped.len(), whole.len(), "steps of {per_step}");
            for k in &names {
                for rev in [at, at + 50, next_rev] {
                    assert_eq!(stepped.get(k, rev), whole.get(k, rev), "{k:?} at {rev}");
                }
            }
        }
    }

    #[test]
    fn a_key_deleted_twice_keeps_each_closed_generation_until_compacted() {
        let mut ix = Index::default();
        ix.put(b"a", r(2));
        assert!(ix.tombstone(b"a", r(3)));
        ix.put(b"a", r(4));
        ix.put(b"a", r(5));
        assert!(ix.tombstone(b"a", r(6)));
        ix.put(b"a", r(7));
        assert!(ix.is_live(b"a"));
        assert_eq!(ix.get(b"a", 2).unwrap().created, r(2));
        assert_eq!(ix.get(b"a", 3), None);
        let at5 = ix.get(b"a", 5).unwrap();
        assert_eq!((at5.created, at5.version), (r(4), 2));
        assert_eq!(ix.get(b"a", 6), None);
        assert_eq!(ix.get(b"a", 7).unwrap().version, 1);
        // The first closed generation goes whole; the second keeps its last
        // put before the compaction point.
        assert_eq!(ix.compact(5), vec![r(2), r(3), r(4)]);
        assert_eq!(ix.get(b"a", 5).unwrap().modified, r(5));
        assert_eq!(ix.compact(7), vec![r(5), r(6)]);
        assert_eq!(ix.get(b"a", 7).unwrap().modified, r(7));
        assert!(ix.tombstone(b"a", r(8)));
        assert_eq!(ix.compact(8), vec![r(7), r(8)]);
        assert_eq!(ix.len(), 0);
    }
}

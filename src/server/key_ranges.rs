//! etcd key ranges: `(key, range_end)`, `range_end` empty for the one key
//! and `"\0"` for every key from `key` on.

use bytes::Bytes;

/// The keys of a list of etcd key ranges, as sorted disjoint half-open spans,
/// to ask whether other ranges share a key with them: n ranges against m cost
/// O((n + m) log n), where comparing every pair cost n × m (two txns of a
/// request's size, tens of thousands of ranges each, would take billions of
/// comparisons). A range whose end is not above its key holds no key and
/// shares none.
#[derive(Debug, Default)]
pub(crate) struct KeyRangeSet {
    /// `(start, end)`, `None` for an end past every key.
    spans: Vec<(Bytes, Option<Bytes>)>,
}

impl KeyRangeSet {
    pub(crate) fn new(ranges: &[(Bytes, Bytes)]) -> KeyRangeSet {
        let mut bounds: Vec<(Bytes, Option<Bytes>)> = ranges
            .iter()
            .filter(|(key, end)| !holds_no_key(key, end))
            .map(|(key, end)| (key.clone(), upper(key, end)))
            .collect();
        bounds.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut spans: Vec<(Bytes, Option<Bytes>)> = Vec::with_capacity(bounds.len());
        for (start, end) in bounds {
            if let Some((_, last_end)) = spans.last_mut() {
                // Overlapping or touching the previous span: one span.
                if last_end.as_ref().is_none_or(|e| *e >= start) {
                    *last_end = match (last_end.take(), end) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                    continue;
                }
            }
            spans.push((start, end));
        }
        KeyRangeSet { spans }
    }

    /// Whether etcd key range `range` shares a key with the set.
    pub(crate) fn overlaps(&self, (key, end): &(Bytes, Bytes)) -> bool {
        if holds_no_key(key, end) {
            return false;
        }
        let end = upper(key, end);
        // Only the last span starting before the range's end can reach it:
        // every earlier one ends before that span starts.
        let before = match &end {
            None => self.spans.len(),
            Some(end) => self.spans.partition_point(|(start, _)| start < end),
        };
        before > 0 && self.spans[before - 1].1.as_ref().is_none_or(|e| e > key)
    }

    /// Whether any of `ranges` shares a key with the set.
    pub(crate) fn overlaps_any(&self, ranges: &[(Bytes, Bytes)]) -> bool {
        ranges.iter().any(|r| self.overlaps(r))
    }
}

/// The exclusive end of etcd key range `(key, end)`; `None` past every key.
fn upper(key: &Bytes, end: &Bytes) -> Option<Bytes> {
    match end.as_ref() {
        [] => {
            let mut next = Vec::with_capacity(key.len() + 1);
            next.extend_from_slice(key);
            next.push(0);
            Some(Bytes::from(next))
        }
        [0] => None,
        _ => Some(end.clone()),
    }
}

/// Whether the range `(key, range_end)` holds no key: an end at or below
/// its key (an empty end is the one key, `"\0"` every key from it on).
pub(crate) fn holds_no_key(key: &[u8], range_end: &[u8]) -> bool {
    !matches!(range_end, [] | [0]) && range_end <= key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(k: &[u8], e: &[u8]) -> (Bytes, Bytes) {
        (Bytes::copy_from_slice(k), Bytes::copy_from_slice(e))
    }

    /// Whether two ranges share a key, by listing the keys of a small
    /// keyspace: every key of up to three bytes over a four-letter alphabet.
    fn share_a_key(a: &[(Bytes, Bytes)], b: &[(Bytes, Bytes)], keys: &[Vec<u8>]) -> bool {
        let holds = |(k, e): &(Bytes, Bytes), x: &[u8]| match e.as_ref() {
            [] => x == k.as_ref(),
            [0] => x >= k.as_ref(),
            e => x >= k.as_ref() && x < e,
        };
        keys.iter()
            .any(|x| a.iter().any(|ra| holds(ra, x)) && b.iter().any(|rb| holds(rb, x)))
    }

    #[test]
    fn agrees_with_listing_the_keys() {
        const ALPHABET: &[u8] = b"\0abc";
        let mut keys: Vec<Vec<u8>> = vec![Vec::new()];
        for len in 1..=3 {
            let mut at = vec![0usize; len];
            loop {
                keys.push(at.iter().map(|&i| ALPHABET[i]).collect());
                let Some(i) = (0..len).rev().find(|&i| at[i] + 1 < ALPHABET.len()) else {
                    break;
                };
                at[i] += 1;
                at[i + 1..].iter_mut().for_each(|a| *a = 0);
            }
        }
        let mut seed = 11u64;
        let mut below = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let key = |below: &mut dyn FnMut(u64) -> u64| -> Vec<u8> {
            (0..below(3)).map(|_| ALPHABET[below(4) as usize]).collect()
        };
        let range = |below: &mut dyn FnMut(u64) -> u64| -> (Bytes, Bytes) {
            let k = key(below);
            let e: Vec<u8> = match below(4) {
                0 => Vec::new(),
                1 => vec![0],
                _ => key(below),
            };
            r(&k, &e)
        };
        let (mut shared, mut apart) = (0, 0);
        for _ in 0..5_000 {
            let a: Vec<_> = (0..below(5)).map(|_| range(&mut below)).collect();
            let b: Vec<_> = (0..below(5)).map(|_| range(&mut below)).collect();
            let want = share_a_key(&a, &b, &keys);
            assert_eq!(KeyRangeSet::new(&a).overlaps_any(&b), want, "{a:?} {b:?}");
            assert_eq!(KeyRangeSet::new(&b).overlaps_any(&a), want, "{b:?} {a:?}");
            if want {
                shared += 1;
            } else {
                apart += 1;
            }
        }
        assert!(
            shared > 500 && apart > 500,
            "{shared} sharing, {apart} apart"
        );
    }

    #[test]
    fn spans_merge_and_answer_at_their_edges() {
        let set = KeyRangeSet::new(&[r(b"b", b"d"), r(b"d", b""), r(b"f", b"h"), r(b"x", b"\0")]);
        assert_eq!(set.spans.len(), 3);
        assert!(set.overlaps(&r(b"d", b"")) && !set.overlaps(&r(b"d\0", b"")));
        assert!(!set.overlaps(&r(b"a", b"b")) && set.overlaps(&r(b"a", b"b\0")));
        assert!(set.overlaps(&r(b"g", b"")) && !set.overlaps(&r(b"h", b"")));
        assert!(set.overlaps(&r(b"\0", b"\0")) && set.overlaps(&r(b"zzz", b"")));
        assert!(
            !set.overlaps(&r(b"e", b"b")),
            "an inverted range holds no key"
        );
        assert!(!KeyRangeSet::new(&[]).overlaps(&r(b"a", b"\0")));
    }
}

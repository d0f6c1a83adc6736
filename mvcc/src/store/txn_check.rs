//! etcd's rule for the keys of a txn, checked before it is applied: within one
//! path a key is put at most once and never inside a range the same path
//! deletes (nested txns included; a `then` and an `else` branch may put the
//! same key, since only one of them runs).
//!
//! The deleted ranges are kept as their union, disjoint intervals in an
//! ordered map, so a txn of n puts and deletes costs O(n log n) whatever their
//! overlap. Scanning every delete for every put cost one request of 1.5 MiB
//! (75,000 puts and 75,000 deletes in nested txns) billions of key
//! comparisons on the applying core of every member.
//!
//! No limit on the number of ops here: that is the API's `--max-txn-ops`,
//! checked before proposing, and apply must not depend on a member's flags.

use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;

use crate::error::ApplyError;
use crate::types::{RequestOp, TxnRequest};

/// Checks both branches of `t`.
pub(super) fn check_txn(t: &TxnRequest) -> Result<(), ApplyError> {
    check_ops(&t.success)?;
    check_ops(&t.failure)?;
    Ok(())
}

/// The keys one path of `ops` puts and the ranges it deletes, or
/// `DuplicateKey` if a key is put twice or inside a deleted range.
fn check_ops(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Deleted), ApplyError> {
    let mut dels = Deleted::default();
    for op in ops {
        if let RequestOp::DeleteRange(d) = op {
            dels.insert_range(&d.key, &d.range_end);
        }
    }
    let mut puts = HashSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (then_puts, then_dels) = check_ops(&t.success)?;
        let (else_puts, else_dels) = check_ops(&t.failure)?;
        for k in &then_puts {
            if puts.contains(k) || dels.contains(k) {
                return Err(ApplyError::DuplicateKey);
            }
        }
        for k in &else_puts {
            if (puts.contains(k) && !then_puts.contains(k)) || dels.contains(k) {
                return Err(ApplyError::DuplicateKey);
            }
        }
        puts.extend(then_puts);
        puts.extend(else_puts);
        dels.absorb(then_dels);
        dels.absorb(else_dels);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || dels.contains(&p.key) {
            return Err(ApplyError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// A union of key ranges: disjoint half-open intervals `[start, end)` by
/// start, `None` for an end past every key.
#[derive(Debug, Default)]
struct Deleted {
    by_start: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl Deleted {
    /// Adds the range a DeleteRange names, in etcd's encoding: an empty
    /// `range_end` is the one key, `"\0"` every key from `key` on.
    fn insert_range(&mut self, key: &[u8], range_end: &[u8]) {
        let end = match range_end {
            [] => {
                // The one key: up to its immediate successor, the key and a 0 byte.
                let mut next = Vec::with_capacity(key.len() + 1);
                next.extend_from_slice(key);
                next.push(0);
                Some(next)
            }
            [0] => None,
            e => Some(e.to_vec()),
        };
        self.insert(key.to_vec(), end);
    }

    fn contains(&self, k: &[u8]) -> bool {
        self.by_start
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(k)))
            .next_back()
            .is_some_and(|(_, end)| end.as_deref().is_none_or(|e| k < e))
    }

    /// Adds `[start, end)`, merged with every interval it overlaps or touches.
    fn insert(&mut self, mut start: Vec<u8>, mut end: Option<Vec<u8>>) {
        if end.as_deref().is_some_and(|e| e <= start.as_slice()) {
            // An empty range deletes nothing.
            return;
        }
        if let Some((s, e)) = self
            .by_start
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(start.as_slice())))
            .next_back()
        {
            if e.as_deref().is_none_or(|e| e >= start.as_slice()) {
                start = s.clone();
            }
        }
        // Every interval starting in [start, end] is taken into this one
        // (the one found above among them).
        while let Some((s, e)) = self
            .by_start
            .range::<[u8], _>((Bound::Included(start.as_slice()), Bound::Unbounded))
            .next()
            .filter(|(s, _)| end.as_deref().is_none_or(|end| s.as_slice() <= end))
            .map(|(s, e)| (s.clone(), e.clone()))
        {
            self.by_start.remove(&s);
            end = match (end, e) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        self.by_start.insert(start, end);
    }

    /// Adds every range of `other`, the smaller set into the larger.
    fn absorb(&mut self, mut other: Deleted) {
        if other.by_start.len() > self.by_start.len() {
            std::mem::swap(self, &mut other);
        }
        for (start, end) in other.by_start {
            self.insert(start, end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::End;
    use crate::types::{DeleteRangeRequest, PutRequest};

    /// The rule as a scan of every deleted range for every put: the
    /// reference the interval union must agree with.
    type Ranges = Vec<(Vec<u8>, End)>;

    fn reference(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Ranges), ()> {
        let in_range = |k: &[u8], (s, e): &(Vec<u8>, End)| match e {
            End::Single => k == s.as_slice(),
            End::Open => k >= s.as_slice(),
            End::Before(e) => k >= s.as_slice() && k < e.as_slice(),
        };
        let mut dels: Ranges = ops
            .iter()
            .filter_map(|op| match op {
                RequestOp::DeleteRange(d) => {
                    Some((d.key.clone(), End::from_range_end(&d.range_end)))
                }
                _ => None,
            })
            .collect();
        let hit = |dels: &Ranges, k: &[u8]| dels.iter().any(|d| in_range(k, d));
        let mut puts = HashSet::new();
        for op in ops {
            let RequestOp::Txn(t) = op else { continue };
            let (then_puts, then_dels) = reference(&t.success)?;
            let (else_puts, else_dels) = reference(&t.failure)?;
            for k in &then_puts {
                if puts.contains(k) || hit(&dels, k) {
                    return Err(());
                }
            }
            for k in &else_puts {
                if (puts.contains(k) && !then_puts.contains(k)) || hit(&dels, k) {
                    return Err(());
                }
            }
            puts.extend(then_puts);
            puts.extend(else_puts);
            dels.extend(then_dels);
            dels.extend(else_dels);
        }
        for op in ops {
            let RequestOp::Put(p) = op else { continue };
            if puts.contains(&p.key) || hit(&dels, &p.key) {
                return Err(());
            }
            puts.insert(p.key.clone());
        }
        Ok((puts, dels))
    }

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }

        /// Keys of up to two bytes from a small alphabet, so ranges overlap,
        /// touch and nest often; the 0 byte makes immediate successors.
        fn key(&mut self) -> Vec<u8> {
            (0..self.below(3))
                .map(|_| b"\0abc"[self.below(4) as usize])
                .collect()
        }

        fn ops(&mut self, depth: u32) -> Vec<RequestOp> {
            (0..self.below(6))
                .map(|_| match self.below(if depth > 0 { 4 } else { 3 }) {
                    0 => RequestOp::Put(PutRequest {
                        key: self.key(),
                        ..PutRequest::default()
                    }),
                    1 => RequestOp::DeleteRange(DeleteRangeRequest {
                        key: self.key(),
                        range_end: match self.below(4) {
                            0 => Vec::new(),
                            1 => vec![0],
                            _ => self.key(),
                        },
                        prev_kv: false,
                    }),
                    2 => RequestOp::Range(Default::default()),
                    _ => RequestOp::Txn(TxnRequest {
                        compare: Vec::new(),
                        success: self.ops(depth - 1),
                        failure: self.ops(depth - 1),
                    }),
                })
                .collect()
        }
    }

    #[test]
    fn agrees_with_a_scan_of_every_deleted_range() {
        let mut rng = Rng(7);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let t = TxnRequest {
                compare: Vec::new(),
                success: rng.ops(3),
                failure: rng.ops(3),
            };
            let want = reference(&t.success)
                .and_then(|_| reference(&t.failure))
                .is_ok();
            assert_eq!(check_txn(&t).is_ok(), want, "{t:?}");
            if want {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        // Both answers are well exercised.
        assert!(
            accepted > 2_000 && refused > 2_000,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn the_union_merges_overlapping_and_touching_ranges() {
        let mut d = Deleted::default();
        d.insert_range(b"b", b"d");
        d.insert_range(b"f", b"h");
        d.insert_range(b"d", b"e"); // touches [b, d)
        assert_eq!(d.by_start.len(), 2);
        d.insert_range(b"a", b"g"); // covers [b, e), overlaps [f, h)
        assert_eq!(d.by_start.len(), 1);
        assert_eq!(d.by_start.get(b"a".as_slice()), Some(&Some(b"h".to_vec())));
        d.insert_range(b"x", b"\0");
        d.insert_range(b"z", b"");
        assert_eq!(d.by_start.len(), 2);
        assert!(d.contains(b"a") && d.contains(b"gz") && !d.contains(b"h") && !d.contains(b"w"));
        assert!(d.contains(b"x") && d.contains(b"zzz"));
        d.insert_range(b"k", b"j"); // empty
        assert!(!d.contains(b"k"));
        let mut one = Deleted::default();
        one.insert_range(b"m", b"");
        assert!(one.contains(b"m") && !one.contains(b"m\0") && !one.contains(b"l"));
    }

    /// Nested txns of 125 puts and 125 single-key deletes each, every key
    /// distinct: what one request of about 1.5 MiB holds at 600 of them.
    fn wide(nested: usize) -> TxnRequest {
        let key = |n: usize| format!("k{n:07}").into_bytes();
        let success = (0..nested)
            .map(|t| {
                let ops = (0..125)
                    .flat_map(|i| {
                        let n = (t * 125 + i) * 2;
                        [
                            RequestOp::Put(PutRequest {
                                key: key(n),
                                ..PutRequest::default()
                            }),
                            RequestOp::DeleteRange(DeleteRangeRequest {
                                key: key(n + 1),
                                range_end: Vec::new(),
                                prev_kv: false,
                            }),
                        ]
                    })
                    .collect();
                RequestOp::Txn(TxnRequest {
                    compare: Vec::new(),
                    success: ops,
                    failure: Vec::new(),
                })
            })
            .collect();
        TxnRequest {
            compare: Vec::new(),
            success,
            failure: Vec::new(),
        }
    }

    #[test]
    #[ignore = "a measurement: cargo test --release -p cairn-mvcc --lib txn_check::tests::check_cost -- --ignored --nocapture"]
    fn check_cost() {
        for nested in [150, 300, 600] {
            let t = wide(nested);
            let started = std::time::Instant::now();
            assert!(check_txn(&t).is_ok());
            let union = started.elapsed();
            let started = std::time::Instant::now();
            assert!(reference(&t.success).is_ok());
            let scan = started.elapsed();
            println!(
                "{} puts and {} deletes: the union {union:?}, a scan of every range {scan:?}",
                nested * 125,
                nested * 125
            );
        }
    }
}

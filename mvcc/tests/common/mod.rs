//! A plain in-memory model of every revision of an etcd keyspace (applied at
//! the next revision as etcd does, or at the sparse revisions entries carry),
//! and a random workload generator, shared by the model, sparse-model and
//! crash tests; and a store in memory with request builders (`store`).
#![allow(dead_code)]

pub mod store;

use std::collections::BTreeMap;

use cairn_mvcc::*;

/// A small seeded generator (SplitMix64), so runs replay exactly from a seed.
pub struct SmallRng(u64);

impl SmallRng {
    pub fn seed_from_u64(seed: u64) -> SmallRng {
        SmallRng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `range` (half-open or inclusive), for integer ranges.
    pub fn gen_range<R: IntRange>(&mut self, range: R) -> R::Out {
        let (lo, span) = range.bounds();
        assert!(span > 0, "empty range");
        R::from_i128(lo + (self.next_u64() as u128 % span as u128) as i128)
    }
    pub fn gen_bool(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    pub fn flip(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

pub trait IntRange {
    type Out;
    fn bounds(&self) -> (i128, i128);
    fn from_i128(v: i128) -> Self::Out;
}

macro_rules! int_range {
    ($($t:ty),*) => {$(
        impl IntRange for std::ops::Range<$t> {
            type Out = $t;
            fn bounds(&self) -> (i128, i128) {
                (self.start as i128, self.end as i128 - self.start as i128)
            }
            fn from_i128(v: i128) -> $t {
                v as $t
            }
        }
        impl IntRange for std::ops::RangeInclusive<$t> {
            type Out = $t;
            fn bounds(&self) -> (i128, i128) {
                (*self.start() as i128, *self.end() as i128 - *self.start() as i128 + 1)
            }
            fn from_i128(v: i128) -> $t {
                v as $t
            }
        }
    )*};
}
int_range!(u8, i32, u32, u64, usize, i64);

/// Every version of every key: (revision, Some(kv) for a put / None for a delete).
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub history: BTreeMap<Vec<u8>, Vec<(i64, Option<KeyValue>)>>,
    /// The revision reached: the last write's with `apply`, the last entry's
    /// with `apply_at`.
    pub rev: i64,
    pub compact: i64,
    pub leases: BTreeMap<i64, i64>,
    /// Pending cross-shard txn records, as the shard driver puts and removes
    /// them beside its entries.
    pub txn_records: BTreeMap<i64, Vec<u8>>,
    pub applied_index: u64,
    /// Every write in revision order, as watch events.
    pub events: Vec<Event>,
    /// Sub revision of the next write of the op being applied.
    sub: i64,
}

impl Model {
    pub fn new() -> Model {
        Model {
            rev: 1,
            ..Model::default()
        }
    }

    pub fn get_at(&self, key: &[u8], at: i64) -> Option<KeyValue> {
        let h = self.history.get(key)?;
        h.iter()
            .rev()
            .find(|(r, _)| *r <= at)
            .and_then(|(_, kv)| kv.clone())
    }

    pub fn all_at(&self, at: i64) -> Vec<KeyValue> {
        self.history
            .keys()
            .filter_map(|k| self.get_at(k, at))
            .collect()
    }

    fn live_keys(&self) -> Vec<Vec<u8>> {
        self.history
            .keys()
            .filter(|k| self.get_at(k, self.rev).is_some())
            .cloned()
            .collect()
    }

    fn put_at(&mut self, key: &[u8], value: &[u8], lease: i64, rev: i64) {
        let prev = self.get_at(key, rev);
        let (create, version) = match &prev {
            Some(p) => (p.create_revision, p.version + 1),
            None => (rev, 1),
        };
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision: create,
            mod_revision: rev,
            version,
            value: value.to_vec(),
            lease,
        };
        self.push_event(EventKind::Put, kv.clone());
        let h = self.history.entry(key.to_vec()).or_default();
        if h.last().is_some_and(|(r, _)| *r == rev) {
            h.pop();
        }
        h.push((rev, Some(kv)));
    }

    fn delete_at(&mut self, key: &[u8], rev: i64) {
        self.push_event(
            EventKind::Delete,
            KeyValue {
                key: key.to_vec(),
                mod_revision: rev,
                ..KeyValue::default()
            },
        );
        let h = self.history.entry(key.to_vec()).or_default();
        if h.last().is_some_and(|(r, _)| *r == rev) {
            h.pop();
        }
        h.push((rev, None));
    }

    fn push_event(&mut self, kind: EventKind, kv: KeyValue) {
        let revision = Revision {
            main: kv.mod_revision,
            sub: self.sub,
        };
        self.sub += 1;
        self.events.push(Event { kind, kv, revision });
    }

    /// The events the store lists from `start` (at or above the compaction
    /// revision): every write from `start` on, except that compaction has
    /// removed the deletes at exactly the compaction revision.
    pub fn events_from(&self, start: i64, max: usize) -> Vec<Event> {
        self.events
            .iter()
            .filter(|e| e.revision.main >= start)
            .filter(|e| !(e.revision.main == self.compact && e.kind == EventKind::Delete))
            .take(max)
            .cloned()
            .collect()
    }

    /// etcd's range at `at` (checked by the caller), with the header revision
    /// the store reports.
    pub fn range_at(&self, req: &RangeRequest, at: i64) -> RangeResponse {
        let keys = self.keys_in(&req.key, &req.range_end, at);
        let mut resp = RangeResponse {
            revision: self.rev,
            count: keys.len() as i64,
            ..RangeResponse::default()
        };
        if req.count_only {
            return resp;
        }
        let mut kvs: Vec<KeyValue> = keys
            .iter()
            .map(|k| self.get_at(k, at).expect("key in range"))
            .filter(|kv| {
                let (m, c) = (kv.mod_revision, kv.create_revision);
                !(req.max_mod_revision != 0 && m > req.max_mod_revision
                    || req.min_mod_revision != 0 && m < req.min_mod_revision
                    || req.max_create_revision != 0 && c > req.max_create_revision
                    || req.min_create_revision != 0 && c < req.min_create_revision)
            })
            .collect();
        let sort = match (req.sort_target, req.sort_order) {
            (SortTarget::Key, SortOrder::None | SortOrder::Ascend) => None,
            (t, o) => Some((t, o == SortOrder::Descend)),
        };
        if let Some((target, descend)) = sort {
            let key = |a: &KeyValue, b: &KeyValue| match target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            if descend {
                kvs.sort_by(|a, b| key(b, a));
            } else {
                kvs.sort_by(key);
            }
        }
        if req.limit > 0 && kvs.len() > req.limit as usize {
            kvs.truncate(req.limit as usize);
            resp.more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value = Vec::new();
            }
        }
        resp.kvs = kvs;
        resp
    }

    /// The revision a read at `revision` (0: the reached one) sees, or the
    /// store's refusal.
    pub fn read_rev(&self, revision: i64) -> Result<i64, &'static str> {
        check_rev(revision, self.rev, self.compact)
    }

    /// etcd's range with its revision checks.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, &'static str> {
        let at = self.read_rev(req.revision)?;
        Ok(self.range_at(req, at))
    }

    fn keys_in(&self, start: &[u8], end: &[u8], at: i64) -> Vec<Vec<u8>> {
        self.history
            .keys()
            .filter(|k| in_range(k, start, end))
            .filter(|k| self.get_at(k, at).is_some())
            .cloned()
            .collect()
    }

    /// etcd's compare against the state at the reached revision.
    pub fn compare(&self, c: &Compare) -> bool {
        let keys = self.keys_in(&c.key, &c.range_end, self.rev);
        if keys.is_empty() {
            if matches!(c.target, CompareTarget::Value(_)) {
                return false;
            }
            return cmp(c, &KeyValue::default());
        }
        keys.iter()
            .all(|k| cmp(c, &self.get_at(k, self.rev).unwrap()))
    }

    /// Applies `op` as etcd would; returns false when the store must refuse it.
    pub fn apply(&mut self, index: u64, op: &Op) -> bool {
        let next = self.rev + 1;
        self.apply_with(index, next, op)
    }

    /// Applies `op` at `revision` (past the reached one) as `Store::apply_at`
    /// does: writes at `revision`, and the model reaches `revision` whether
    /// the op wrote, wrote nothing, or was refused.
    pub fn apply_at(&mut self, index: u64, revision: i64, op: &Op) -> bool {
        assert!(
            revision > self.rev,
            "model: revision {revision} not after {}",
            self.rev
        );
        let ok = self.apply_with(index, revision, op);
        self.rev = revision;
        ok
    }

    /// Writes at `next`; reads see the state before, at `next - 1`, which
    /// equals the state at the reached revision.
    fn apply_with(&mut self, index: u64, next: i64, op: &Op) -> bool {
        self.applied_index = index;
        self.sub = 0;
        let before = next - 1;
        match op {
            Op::Put(p) => {
                if p.lease != 0 && !self.leases.contains_key(&p.lease) {
                    return false;
                }
                self.put_at(&p.key, &p.value, p.lease, next);
                self.rev = next;
            }
            Op::DeleteRange(d) => {
                let keys = self.keys_in(&d.key, &d.range_end, self.rev);
                for k in &keys {
                    self.delete_at(k, next);
                }
                if !keys.is_empty() {
                    self.rev = next;
                }
            }
            Op::Txn(t) => {
                let ok = t.compare.iter().all(|c| self.compare(c));
                let ops = if ok { &t.success } else { &t.failure };
                for op in ops {
                    match op {
                        RequestOp::Put(p)
                            if p.lease != 0 && !self.leases.contains_key(&p.lease) =>
                        {
                            return false;
                        }
                        RequestOp::Range(r)
                            if check_rev(r.revision, before, self.compact).is_err() =>
                        {
                            return false;
                        }
                        _ => {}
                    }
                }
                let mut wrote = false;
                for op in ops {
                    match op {
                        RequestOp::Put(p) => {
                            self.put_at(&p.key, &p.value, p.lease, next);
                            wrote = true;
                        }
                        RequestOp::DeleteRange(d) => {
                            let at = if wrote { next } else { self.rev };
                            for k in self.keys_in(&d.key, &d.range_end, at) {
                                self.delete_at(&k, next);
                                wrote = true;
                            }
                        }
                        _ => {}
                    }
                }
                if wrote {
                    self.rev = next;
                }
            }
            Op::Compact(c) => {
                if c.revision <= self.compact || c.revision > before {
                    return false;
                }
                self.compact = c.revision;
            }
            Op::LeaseGrant { id, ttl_secs } => {
                if self.leases.contains_key(id) {
                    return false;
                }
                self.leases.insert(*id, *ttl_secs);
            }
            Op::LeaseRevoke { id } => {
                if self.leases.remove(id).is_none() {
                    return false;
                }
                let keys: Vec<Vec<u8>> = self
                    .live_keys()
                    .into_iter()
                    .filter(|k| self.get_at(k, self.rev).unwrap().lease == *id)
                    .collect();
                for k in &keys {
                    self.delete_at(k, next);
                }
                if !keys.is_empty() {
                    self.rev = next;
                }
            }
            Op::LeaseCheckpoint { id, .. } => return self.leases.contains_key(id),
        }
        true
    }
}

/// The store's check of a read revision: 0 reads `current`; above `current`
/// is a future revision; below `compact` is compacted.
pub fn check_rev(revision: i64, current: i64, compact: i64) -> Result<i64, &'static str> {
    if revision > current {
        return Err("future revision");
    }
    let at = if revision <= 0 { current } else { revision };
    if at < compact {
        return Err("compacted");
    }
    Ok(at)
}

pub fn in_range(k: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == start,
        [0] => k >= start,
        e => k >= start && k < e,
    }
}

fn cmp(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Value(v) => kv.value.cmp(v),
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::CreateRevision(v) => kv.create_revision.cmp(v),
        CompareTarget::ModRevision(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord.is_eq(),
        CompareResult::NotEqual => ord.is_ne(),
        CompareResult::Greater => ord.is_gt(),
        CompareResult::Less => ord.is_lt(),
    }
}

const KEYS: &[&[u8]] = &[
    b"a", b"ab", b"abc", b"b", b"b/1", b"b/2", b"c", b"\x00k", b"\xffz", b"zz", b"k1", b"k2",
];

pub fn key(rng: &mut SmallRng) -> Vec<u8> {
    KEYS[rng.gen_range(0..KEYS.len())].to_vec()
}

pub fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.gen_range(0..20) {
        0 => 0,
        1 => rng.gen_range(1025..9000),
        _ => rng.gen_range(1..300),
    };
    (0..len).map(|_| rng.byte()).collect()
}

pub fn range_end(rng: &mut SmallRng, k: &[u8]) -> Vec<u8> {
    match rng.gen_range(0..4) {
        0 => Vec::new(),
        1 => vec![0],
        2 => {
            let mut e = k.to_vec();
            *e.last_mut().unwrap() = e.last().unwrap().saturating_add(1);
            e
        }
        _ => key(rng),
    }
}

/// Any of a compare's four results.
pub fn compare_result(rng: &mut SmallRng) -> CompareResult {
    match rng.gen_range(0..4) {
        0 => CompareResult::Equal,
        1 => CompareResult::NotEqual,
        2 => CompareResult::Greater,
        _ => CompareResult::Less,
    }
}

/// A random write for the current model state.
pub fn random_op(rng: &mut SmallRng, m: &Model) -> Op {
    match rng.gen_range(0..100) {
        0..=44 => {
            let lease = if rng.gen_bool(0.2) && !m.leases.is_empty() {
                let ids: Vec<i64> = m.leases.keys().copied().collect();
                ids[rng.gen_range(0..ids.len())]
            } else {
                0
            };
            Op::Put(PutRequest {
                key: key(rng),
                value: value(rng),
                lease,
                ..PutRequest::default()
            })
        }
        45..=59 => {
            let k = key(rng);
            Op::DeleteRange(DeleteRangeRequest {
                range_end: range_end(rng, &k),
                key: k,
                prev_kv: rng.flip(),
            })
        }
        60..=79 => {
            let ck = key(rng);
            let target = match rng.gen_range(0..5) {
                0 => CompareTarget::Version(rng.gen_range(0i64..3)),
                1 => CompareTarget::Value(value(rng)),
                2 => CompareTarget::ModRevision(rng.gen_range(0..m.rev + 2)),
                3 => CompareTarget::CreateRevision(rng.gen_range(0..m.rev + 2)),
                _ => CompareTarget::Lease(0),
            };
            let result = compare_result(rng);
            let a = key(rng);
            let mut b = key(rng);
            while b == a {
                b = key(rng);
            }
            Op::Txn(TxnRequest {
                compare: vec![Compare {
                    result,
                    target,
                    key: ck,
                    range_end: if rng.gen_bool(0.2) {
                        vec![0]
                    } else {
                        Vec::new()
                    },
                }],
                success: vec![
                    RequestOp::Put(PutRequest {
                        key: a,
                        value: value(rng),
                        ..PutRequest::default()
                    }),
                    RequestOp::DeleteRange(DeleteRangeRequest {
                        key: b.clone(),
                        ..DeleteRangeRequest::default()
                    }),
                    RequestOp::Range(RangeRequest {
                        key: b,
                        ..RangeRequest::default()
                    }),
                ],
                failure: vec![RequestOp::Put(PutRequest {
                    key: key(rng),
                    value: value(rng),
                    ..PutRequest::default()
                })],
            })
        }
        80..=86 => {
            let lo = m.compact + 1;
            let rev = if lo <= m.rev {
                rng.gen_range(lo..=m.rev)
            } else {
                m.rev
            };
            Op::Compact(CompactionRequest { revision: rev })
        }
        87..=92 => Op::LeaseGrant {
            id: rng.gen_range(1i64..6),
            ttl_secs: 10,
        },
        _ => Op::LeaseRevoke {
            id: rng.gen_range(1i64..6),
        },
    }
}

/// Checks the store against the model: every key at several revisions, counts,
/// leases and txn records.
pub fn check(store: &Store, m: &Model, rng: &mut SmallRng, ctx: &str) {
    assert_eq!(store.current_revision(), m.rev, "{ctx}: revision");
    assert_eq!(
        store.compact_revision(),
        m.compact,
        "{ctx}: compact revision"
    );
    let mut revs = vec![0, m.rev, m.compact.max(1)];
    for _ in 0..3 {
        revs.push(rng.gen_range(m.compact.max(1)..=m.rev));
    }
    for at in revs {
        let want = m.all_at(if at == 0 { m.rev } else { at });
        let got = store
            .range(&RangeRequest {
                key: vec![0],
                range_end: vec![0],
                revision: at,
                ..RangeRequest::default()
            })
            .unwrap_or_else(|e| panic!("{ctx}: range at {at}: {e}"));
        assert_eq!(got.count as usize, want.len(), "{ctx}: count at {at}");
        assert_eq!(got.kvs, want, "{ctx}: keyspace at {at}");
    }
    if m.compact > 1 {
        let r = store.range(&RangeRequest {
            key: b"a".to_vec(),
            revision: m.compact - 1,
            ..RangeRequest::default()
        });
        assert!(
            matches!(r, Err(ReadError::Compacted { .. })),
            "{ctx}: read below compaction: {r:?}"
        );
    }
    let leases: Vec<(i64, i64)> = store.leases().iter().map(|l| (l.id, l.ttl_secs)).collect();
    let want: Vec<(i64, i64)> = m.leases.iter().map(|(a, b)| (*a, *b)).collect();
    assert_eq!(leases, want, "{ctx}: leases");
    let txn_records: Vec<(i64, Vec<u8>)> = m
        .txn_records
        .iter()
        .map(|(id, r)| (*id, r.clone()))
        .collect();
    assert_eq!(store.txn_records(), txn_records, "{ctx}: txn records");
    for id in m.leases.keys() {
        let mut keys: Vec<Vec<u8>> = m
            .all_at(m.rev)
            .into_iter()
            .filter(|kv| kv.lease == *id)
            .map(|kv| kv.key)
            .collect();
        keys.sort();
        assert_eq!(
            store.lease(*id).unwrap().keys,
            keys,
            "{ctx}: keys of lease {id}"
        );
    }
}

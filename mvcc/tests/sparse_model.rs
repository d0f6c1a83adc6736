//! Guards a store whose entries carry their revisions (`apply_at`), as a shard
//! of a keyspace with one revision counter applies them: random puts, deletes,
//! range deletes, txns (with failing compares and ranges at old revisions),
//! lease grants, checkpoints and revokes, and compactions at revisions that
//! are and are not write revisions, all at sparse increasing revisions. After
//! every step the store is checked against a plain model: reads at every
//! revision from the compaction revision to the reached one (most of them
//! revisions no write of this store has) with limits, counts, sorts, filters
//! and keys_only, streamed ranges, events from any revision, HashKV against a
//! second store that applies the same entries but commits at other points,
//! and the state after commit and reopen, after a snapshot stream is
//! restored, and after defragmenting.
//!
//! The normal suite runs 12 seeds; `MVCC_SPARSE_SEEDS=500 cargo test
//! --release -p cairn-mvcc --test sparse_model` runs more.

mod common;

use cairn_mvcc::*;
use common::*;

struct Run {
    seed: u64,
    rng: SmallRng,
    name: String,
    storage: MemStorage,
    store: Store,
    /// Applies every entry the store applies; commits on its own schedule.
    twin: Store,
    m: Model,
    index: u64,
    /// A snapshot taken earlier, with the model at that point.
    held: Option<(Snapshot, Model)>,
}

/// The gap to the next revision: this shard's entries are usually close
/// together, sometimes far apart (other shards took the revisions between).
fn gap(rng: &mut SmallRng) -> i64 {
    match rng.gen_range(0..20) {
        0..=7 => 1,
        8..=18 => rng.gen_range(2i64..=5),
        _ => rng.gen_range(20i64..=300),
    }
}

/// A compaction revision for an entry at `next`: a write revision, a
/// revision no write has (one the store reaches only with this entry among
/// them), or one the store must refuse.
fn compact_rev(rng: &mut SmallRng, m: &Model, next: i64) -> i64 {
    let mut writes: Vec<i64> = m
        .events
        .iter()
        .map(|e| e.revision.main)
        .filter(|r| *r > m.compact && *r < next)
        .collect();
    writes.dedup();
    match rng.gen_range(0..10) {
        0..=2 if !writes.is_empty() => writes[rng.gen_range(0..writes.len())],
        3..=4 if m.rev + 1 < next => rng.gen_range(m.rev + 1..next),
        0..=7 if m.compact + 1 < next => rng.gen_range(m.compact + 1..next),
        8 => next,
        _ => rng.gen_range(0..=m.compact),
    }
}

/// A read revision for an op at `next`: mostly valid (among them revisions
/// past the reached one that only this entry reaches), sometimes compacted
/// or the op's own (future) revision.
fn read_rev(rng: &mut SmallRng, m: &Model, next: i64) -> i64 {
    let lo = m.compact.max(1);
    match rng.gen_range(0..20) {
        0..=3 => 0,
        4 => next,
        5 if m.compact > 1 => m.compact - 1,
        6..=8 if m.rev + 1 < next => rng.gen_range(m.rev + 1..next),
        _ => rng.gen_range(lo..next),
    }
}

fn random_range(rng: &mut SmallRng, revision: i64) -> RangeRequest {
    let k = key(rng);
    let (key, range_end) = match rng.gen_range(0..4) {
        0 => (vec![0], vec![0]),
        1 => (k, Vec::new()),
        _ => {
            let e = range_end(rng, &k);
            (k, e)
        }
    };
    let pick = |rng: &mut SmallRng| {
        if rng.gen_bool(0.15) {
            rng.gen_range(1i64..=revision.max(1) + 1)
        } else {
            0
        }
    };
    RangeRequest {
        key,
        range_end,
        limit: if rng.flip() {
            rng.gen_range(1i64..5)
        } else {
            0
        },
        revision,
        sort_order: [SortOrder::None, SortOrder::Ascend, SortOrder::Descend]
            [rng.gen_range(0usize..3)],
        sort_target: [
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::Create,
            SortTarget::Mod,
            SortTarget::Value,
        ][rng.gen_range(0usize..5)],
        keys_only: rng.gen_bool(0.3),
        count_only: rng.gen_bool(0.1),
        min_mod_revision: pick(rng),
        max_mod_revision: pick(rng),
        min_create_revision: pick(rng),
        max_create_revision: pick(rng),
    }
}

/// A txn whose compare often fails, with ranges at old revisions (and now
/// and then one the store must refuse) on both branches.
fn sparse_txn(rng: &mut SmallRng, m: &Model, next: i64) -> Op {
    let a = key(rng);
    let mut c = key(rng);
    while c == a {
        c = key(rng);
    }
    let ranges = |rng: &mut SmallRng| {
        let at = read_rev(rng, m, next);
        RangeRequest {
            count_only: false,
            ..random_range(rng, at)
        }
    };
    let success = vec![
        RequestOp::Put(PutRequest {
            key: a,
            value: value(rng),
            ..PutRequest::default()
        }),
        RequestOp::Range(ranges(rng)),
    ];
    let failure = vec![
        RequestOp::Range(ranges(rng)),
        RequestOp::DeleteRange(DeleteRangeRequest {
            key: c,
            ..DeleteRangeRequest::default()
        }),
    ];
    Op::Txn(TxnRequest {
        compare: vec![Compare {
            result: [
                CompareResult::Equal,
                CompareResult::NotEqual,
                CompareResult::Greater,
                CompareResult::Less,
            ][rng.gen_range(0usize..4)],
            target: CompareTarget::ModRevision(rng.gen_range(0..=next)),
            key: key(rng),
            range_end: Vec::new(),
        }],
        success,
        failure,
    })
}

/// Every revision an answer carries, with the one each must be for an
/// entry at `next`: `next`, but inside a txn that writes, as etcd's, an op
/// before the txn's first change (a range, a delete of nothing) answers
/// the revision before.
fn result_revisions(r: &OpResult, next: i64) -> (Vec<i64>, Vec<i64>) {
    fn ops(
        t: &TxnResponse,
        next: i64,
        changed: &mut bool,
        got: &mut Vec<i64>,
        want: &mut Vec<i64>,
    ) {
        for r in &t.responses {
            let (rev, changes) = match r {
                ResponseOp::Range(x) => (x.revision, false),
                ResponseOp::Put(x) => (x.revision, true),
                ResponseOp::DeleteRange(x) => (x.revision, x.deleted > 0),
                ResponseOp::Txn(x) => {
                    ops(x, next, changed, got, want);
                    (x.revision, false)
                }
            };
            *changed |= changes;
            got.push(rev);
            want.push(if *changed { next } else { next - 1 });
        }
    }
    let (mut got, mut want) = (Vec::new(), Vec::new());
    match r {
        OpResult::Txn(t) => {
            let mut changed = false;
            ops(t, next, &mut changed, &mut got, &mut want);
            if !changed {
                // A txn that wrote nothing answers one revision throughout.
                want.iter_mut().for_each(|w| *w = next);
            }
            got.push(t.revision);
        }
        OpResult::Put(x) => got.push(x.revision),
        OpResult::DeleteRange(x) => got.push(x.revision),
        OpResult::Compact(x) => got.push(x.revision),
        OpResult::LeaseGrant { revision }
        | OpResult::LeaseRevoke { revision, .. }
        | OpResult::LeaseCheckpoint { revision } => got.push(*revision),
    }
    want.resize(got.len(), next);
    (got, want)
}

/// The ranges a txn answered match the model after the entry: each read the
/// state at its revision (0: before the txn's first write, or its writes
/// once it has written).
fn check_txn_ranges(t: &TxnRequest, resp: &TxnResponse, after: &Model, next: i64, ctx: &str) {
    let ops = if resp.succeeded {
        &t.success
    } else {
        &t.failure
    };
    let mut wrote = false;
    for (op, r) in ops.iter().zip(&resp.responses) {
        match (op, r) {
            (RequestOp::Range(req), ResponseOp::Range(got)) => {
                let at = match req.revision {
                    0 if wrote => next,
                    0 => next - 1,
                    r => r,
                };
                // Its revision is checked with every other answer's.
                let want = RangeResponse {
                    revision: got.revision,
                    ..after.range_at(req, at)
                };
                assert_eq!(*got, want, "{ctx}: txn range {req:?}");
            }
            (RequestOp::Put(_), _) => wrote = true,
            (RequestOp::DeleteRange(_), ResponseOp::DeleteRange(d)) => wrote |= d.deleted > 0,
            _ => panic!("{ctx}: answer {r:?} to {op:?}"),
        }
    }
}

impl Run {
    fn new(seed: u64) -> Run {
        let name = format!("sparse-{seed}");
        let storage = MemStorage::new();
        let store = Store::open_with(Box::new(storage.clone()), &name, Config::default()).unwrap();
        let twin = Store::open_with(
            Box::new(MemStorage::new()),
            &format!("{name}-twin"),
            Config::default(),
        )
        .unwrap();
        Run {
            seed,
            rng: SmallRng::seed_from_u64(seed),
            name,
            storage,
            store,
            twin,
            m: Model::new(),
            index: 0,
            held: None,
        }
    }

    /// Reopens the store from its storage. Callers commit first; the old
    /// store, dropped once the new one is open, writes nothing on drop.
    fn reopen(&mut self) {
        self.held = None;
        self.store = Store::open_with(
            Box::new(self.storage.clone()),
            &self.name,
            Config::default(),
        )
        .unwrap();
    }

    fn entry(&mut self, ctx: &str) {
        let next = self.m.rev + gap(&mut self.rng);
        let rng = &mut self.rng;
        let op = match rng.gen_range(0..100) {
            0..=14 => sparse_txn(rng, &self.m, next),
            15..=17 => Op::LeaseCheckpoint {
                id: rng.gen_range(1i64..6),
                remaining_ttl_secs: rng.gen_range(1i64..10),
            },
            _ => match random_op(rng, &self.m) {
                Op::Compact(_) => Op::Compact(CompactionRequest {
                    revision: compact_rev(rng, &self.m, next),
                }),
                op => op,
            },
        };
        if self.rng.gen_bool(0.05) {
            self.stale_entry(&op, ctx);
        }
        self.index += 1;
        let succeeds = match &op {
            Op::Txn(t) => t.compare.iter().all(|c| self.m.compare(c)),
            _ => false,
        };
        let accepted = self.m.apply_at(self.index, next, &op);
        let r = self.store.apply_at(self.index, next, &op);
        let t = self.twin.apply_at(self.index, next, &op);
        assert_eq!(r.is_ok(), accepted, "{ctx}: {op:?} at {next} -> {r:?}");
        match (&r, &t) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{ctx}: twin's answer"),
            (Err(a), Err(b)) => {
                assert!(a.is_request_error(), "{ctx}: {a}");
                assert_eq!(a.to_string(), b.to_string(), "{ctx}: twin's error");
            }
            _ => panic!("{ctx}: store {r:?}, twin {t:?}"),
        }
        if let Ok(res) = &r {
            let (got, want) = result_revisions(res, next);
            assert_eq!(got, want, "{ctx}: answer revisions, entry at {next}");
            if let (Op::Txn(req), OpResult::Txn(resp)) = (&op, res) {
                assert_eq!(resp.succeeded, succeeds, "{ctx}: txn branch");
                check_txn_ranges(req, resp, &self.m, next, ctx);
            }
        }
    }

    /// An entry at a revision the store has reached is refused untouched.
    fn stale_entry(&mut self, op: &Op, ctx: &str) {
        let stale = self.m.rev - self.rng.gen_range(0i64..3);
        let hash = self.store.hash_kv(0).unwrap();
        let r = self.store.apply_at(self.index + 1, stale, op);
        match r {
            Err(ApplyError::StaleRevision {
                revision,
                current_revision,
                ..
            }) => assert_eq!((revision, current_revision), (stale, self.m.rev), "{ctx}"),
            r => panic!("{ctx}: entry at stale revision {stale}: {r:?}"),
        }
        assert!(
            !self.store.is_poisoned(),
            "{ctx}: poisoned by a stale entry"
        );
        assert_eq!(
            self.store.applied_index(),
            self.index,
            "{ctx}: applied index"
        );
        assert_eq!(
            self.store.hash_kv(0).unwrap(),
            hash,
            "{ctx}: stale entry changed the store"
        );
    }

    fn step(&mut self, step: usize) {
        let ctx = format!("seed {} step {step}", self.seed);
        match self.rng.gen_range(0..100) {
            0..=69 => self.entry(&ctx),
            70..=77 => {
                self.store.commit().unwrap();
            }
            78..=81 => {
                self.store.commit().unwrap();
                let hash = self.store.hash_kv(0).unwrap();
                self.reopen();
                assert_eq!(
                    self.store.hash_kv(0).unwrap(),
                    hash,
                    "{ctx}: hash after reopen"
                );
            }
            82..=85 => {
                let stream = self.store.snapshot_stream();
                assert_eq!(stream.revision(), self.m.rev, "{ctx}: stream revision");
                let chunks: Vec<Vec<u8>> = stream.map(|c| c.unwrap()).collect();
                let hash = self.store.hash_kv(0).unwrap();
                self.held = None;
                self.storage = MemStorage::new();
                self.store = Store::restore_with(
                    Box::new(self.storage.clone()),
                    &self.name,
                    Config::default(),
                    chunks,
                )
                .unwrap();
                assert_eq!(
                    self.store.hash_kv(0).unwrap(),
                    hash,
                    "{ctx}: hash after restore"
                );
            }
            86..=88 => {
                let hash = self.store.hash_kv(0).unwrap();
                self.store.defragment().unwrap();
                assert_eq!(
                    self.store.hash_kv(0).unwrap(),
                    hash,
                    "{ctx}: hash after defragment"
                );
                self.reopen();
            }
            89..=93 => {
                if self.held.is_none() {
                    self.held = Some((self.store.snapshot(), self.m.clone()));
                }
            }
            _ => self.check_held(&ctx),
        }
        if self.rng.gen_bool(0.2) {
            self.twin.commit().unwrap();
        }
        check_all(&self.store, &self.m, &mut self.rng, &ctx);
        self.check_twin(&ctx);
    }

    /// A snapshot taken earlier reads every revision it saw as it did then,
    /// or answers compacted once the store compacted past it.
    fn check_held(&mut self, ctx: &str) {
        let Some((snap, sm)) = self.held.take() else {
            return;
        };
        assert_eq!(snap.revision(), sm.rev, "{ctx}: held snapshot revision");
        let compact = self.store.compact_revision();
        for at in sm.compact.max(1)..=sm.rev {
            let req = random_range(&mut self.rng, at);
            let r = snap.range(&req);
            if at < compact {
                assert!(
                    matches!(r, Err(ReadError::Compacted { .. })),
                    "{ctx}: {r:?}"
                );
            } else {
                assert_eq!(
                    r.unwrap(),
                    sm.range_at(&req, at),
                    "{ctx}: held snapshot at {at}"
                );
            }
        }
    }

    /// The twin applied the same entries, so it hashes the same at every
    /// revision although it committed at other points.
    fn check_twin(&mut self, ctx: &str) {
        let lo = self.m.compact.max(1);
        let mut revs = vec![0, lo, self.m.rev];
        revs.push(self.rng.gen_range(lo..=self.m.rev));
        for at in revs {
            let a = self.store.hash_kv(at).unwrap();
            let b = self.twin.hash_kv(at).unwrap();
            assert_eq!(a, b, "{ctx}: HashKV at {at} against the twin");
        }
        match self.store.hash_kv(self.m.rev + 1) {
            Err(ReadError::FutureRevision {
                current_revision, ..
            }) => assert_eq!(current_revision, self.m.rev, "{ctx}"),
            r => panic!("{ctx}: HashKV past the reached revision: {r:?}"),
        }
    }
}

/// Reads at every revision from the compaction revision to the reached one,
/// events from several revisions, a streamed range, leases.
fn check_all(store: &Store, m: &Model, rng: &mut SmallRng, ctx: &str) {
    assert_eq!(store.current_revision(), m.rev, "{ctx}: reached revision");
    assert_eq!(
        store.compact_revision(),
        m.compact,
        "{ctx}: compact revision"
    );
    assert_eq!(
        store.applied_index(),
        m.applied_index,
        "{ctx}: applied index"
    );
    let lo = m.compact.max(1);
    for at in std::iter::once(0).chain(lo..=m.rev) {
        let all = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: at,
            ..RangeRequest::default()
        };
        let want = m.range(&all).unwrap();
        assert_eq!(store.range(&all).unwrap(), want, "{ctx}: keyspace at {at}");
        let req = random_range(rng, at);
        let want = m.range(&req).unwrap();
        assert_eq!(store.range(&req).unwrap(), want, "{ctx}: {req:?}");
    }
    let future = store.range(&RangeRequest {
        key: b"a".to_vec(),
        revision: m.rev + 1,
        ..RangeRequest::default()
    });
    assert!(
        matches!(future, Err(ReadError::FutureRevision { .. })),
        "{ctx}: read past the reached revision: {future:?}"
    );
    if m.compact > 1 {
        let r = store.range(&RangeRequest {
            key: b"a".to_vec(),
            revision: m.compact - 1,
            ..RangeRequest::default()
        });
        assert!(
            matches!(r, Err(ReadError::Compacted { .. })),
            "{ctx}: {r:?}"
        );
        assert!(
            matches!(
                store.events(m.compact - 1, 10),
                Err(ReadError::Compacted { .. })
            ),
            "{ctx}: events below compaction"
        );
    }
    for _ in 0..3 {
        let start = rng.gen_range(m.compact..=m.rev + 1);
        let max = if rng.flip() {
            rng.gen_range(1usize..20)
        } else {
            usize::MAX
        };
        assert_eq!(
            store.events(start, max).unwrap(),
            m.events_from(start, max),
            "{ctx}: events from {start}, at most {max}"
        );
    }
    let at = rng.gen_range(lo..=m.rev);
    let req = RangeRequest {
        sort_order: [SortOrder::None, SortOrder::Descend][rng.gen_range(0usize..2)],
        sort_target: SortTarget::Key,
        ..random_range(rng, at)
    };
    if !req.key.is_empty() {
        let mut stream = store
            .snapshot()
            .range_stream(req.clone(), rng.gen_range(1usize..4))
            .unwrap();
        let mut kvs = Vec::new();
        while let Some(chunk) = stream.next_chunk().unwrap() {
            kvs.extend(chunk);
        }
        let want = m.range(&req).unwrap();
        assert_eq!(
            (
                stream.revision(),
                stream.count().unwrap(),
                stream.more(),
                kvs
            ),
            (want.revision, want.count, want.more, want.kvs),
            "{ctx}: streamed {req:?}"
        );
    }
    check(store, m, rng, ctx);
}

fn run_seed(seed: u64, steps: usize) {
    let mut run = Run::new(seed);
    for step in 0..steps {
        run.step(step);
    }
    run.held = None;
    run.store.commit().unwrap();
    run.reopen();
    let ctx = format!("seed {seed} final reopen");
    check_all(&run.store, &run.m, &mut run.rng, &ctx);
    run.check_twin(&ctx);
}

#[test]
fn sparse_revisions_match_the_model() {
    let seeds: u64 = std::env::var("MVCC_SPARSE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    for seed in 0..seeds {
        run_seed(seed, 250);
    }
}

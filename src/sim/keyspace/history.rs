//! The checks that need the whole run, made once it has settled (the
//! faults stopped, every member up, every shard's log applied everywhere):
//!
//! - **Atomicity.** Every txn with a part in any shard's log has its parts
//!   on exactly the shards its plan writes, each once, all at one revision
//!   `T`; every member applied every entry of every shard.
//! - **Strict serializability of the multi-key history.** The committed
//!   writes and parts, ordered by revision, are replayed into one
//!   sequential model of the keyspace. Each txn's compares, evaluated there
//!   just before `T`, must choose the branch whose ops its parts carry; an
//!   acknowledged txn's `succeeded` and gets must be what that model
//!   answers (gets on a written shard see the txn's earlier ops there); an
//!   acknowledged read at `R`, and a txn that wrote nothing (at `T - 1`),
//!   must see exactly the model at that revision. Real time is checked as
//!   the run goes (`checker.rs`): an op invoked after another was
//!   acknowledged sits later in this order.
//! - **Watches.** Each watch's released stream is exactly the model's
//!   events up to the revision it released through, in revision order.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::checker::{found, Answer, Check, KsChecker, KsViolationKind, OpKind};
use super::kv::{Event, GetResult, Key, Op, Payload, Store};
use super::watch::Watcher;

/// One shard's committed log, as first applied.
type Log<'a> = Vec<Option<&'a Payload>>;

impl KsChecker {
    /// Every shard's log, indexes 1..=last, from the entries applied.
    fn logs(&self, shards: usize) -> Result<Vec<Log<'_>>, super::checker::Found> {
        let mut logs: Vec<Log<'_>> = vec![Vec::new(); shards];
        let mut last = vec![0u64; shards];
        for (shard, index) in self.applied.keys() {
            last[*shard] = last[*shard].max(*index);
        }
        for (shard, log) in logs.iter_mut().enumerate() {
            for index in 1..=last[shard] {
                let Some(e) = self.applied.get(&(shard, index)) else {
                    return Err(found(
                        KsViolationKind::StateMachineSafety,
                        format!(
                            "shard {shard} index {index} was never applied, though {} was",
                            last[shard]
                        ),
                    ));
                };
                log.push(e.payload.as_ref());
            }
        }
        Ok(logs)
    }

    /// The end-of-run checks (module doc). `applied[m][s]` is what member
    /// `m` applied of shard `s`; `watches` every watch the run had, with
    /// its member.
    pub fn check_end(
        &self,
        shards: usize,
        applied: &[(u64, Vec<u64>)],
        watches: &[(u64, &Watcher)],
    ) -> Check {
        let logs = self.logs(shards)?;
        for (member, per_shard) in applied {
            for (shard, a) in per_shard.iter().enumerate() {
                if *a != logs[shard].len() as u64 {
                    return Err(found(
                        KsViolationKind::Liveness,
                        format!(
                            "settled, but member {member} applied shard {shard} through {a} of {}",
                            logs[shard].len()
                        ),
                    ));
                }
            }
        }
        // Atomicity.
        struct Parts<'a> {
            by_shard: BTreeMap<usize, (u64, u64, &'a [Op])>,
            plan: Option<BTreeMap<usize, &'a [Op]>>,
        }
        let mut txns: BTreeMap<u64, Parts<'_>> = BTreeMap::new();
        let mut effects: Vec<(u64, usize, u64, u64, &[Op])> = Vec::new();
        for (shard, log) in logs.iter().enumerate() {
            for (i, p) in log.iter().enumerate() {
                let index = i as u64 + 1;
                match p {
                    Some(Payload::Write { id, rev, op }) => {
                        effects.push((*rev, shard, index, *id, std::slice::from_ref(op)));
                    }
                    Some(p @ (Payload::Part { .. } | Payload::Parts { .. })) => {
                        if let Payload::Part { shard: s, .. } | Payload::Parts { shard: s, .. } = p
                        {
                            assert_eq!(*s, shard, "a part names its shard");
                        }
                        for (id, rev, ops, plan) in p.parts() {
                            effects.push((rev, shard, index, id, ops));
                            let t = txns.entry(id).or_insert(Parts {
                                by_shard: BTreeMap::new(),
                                plan: None,
                            });
                            if let Some((r, i, _)) = t.by_shard.insert(shard, (rev, index, ops)) {
                                return Err(found(
                                    KsViolationKind::Atomicity,
                                    format!("txn x{id} has two parts on shard {shard}: index {i} at {r} and index {index} at {rev}"),
                                ));
                            }
                            if let Some(plan) = plan {
                                t.plan = Some(
                                    plan.parts.iter().map(|(s, o)| (*s, o.as_slice())).collect(),
                                );
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        for (id, t) in &txns {
            let revs: BTreeSet<u64> = t.by_shard.values().map(|(r, _, _)| *r).collect();
            let shards_with: BTreeSet<usize> = t.by_shard.keys().copied().collect();
            let planned: BTreeSet<usize> = match &t.plan {
                Some(p) => p.keys().copied().collect(),
                None => shards_with.clone(),
            };
            if revs.len() != 1
                || shards_with != planned
                || (t.plan.is_none() && shards_with.len() != 1)
            {
                return Err(found(
                    KsViolationKind::Atomicity,
                    format!(
                        "txn x{id} writes shards {planned:?}, but after settling its parts are on {:?}",
                        t.by_shard
                            .iter()
                            .map(|(s, (r, i, _))| format!("shard {s} index {i} at revision {r}"))
                            .collect::<Vec<_>>()
                    ),
                ));
            }
        }
        // The sequential model: every committed write and part in revision
        // order (a txn's parts touch disjoint keys).
        effects.sort_by_key(|(rev, shard, ..)| (*rev, *shard));
        let mut model = Store::default();
        let mut events: Vec<(usize, Event)> = Vec::new();
        for (rev, shard, _, id, ops) in &effects {
            let (_, ev) = model.apply_ops(*rev, *id, ops);
            events.extend(ev.into_iter().map(|e| (*shard, e)));
        }
        // Each committed txn chose the branch its compares call for at
        // T - 1, and an acknowledged one answered what the model does.
        for (id, t) in &txns {
            let rev = t.by_shard.values().next().expect("a part").0;
            let Some(rec) = self.ops.get(id) else {
                continue;
            };
            let OpKind::Txn { spec } = &rec.kind else {
                return Err(found(
                    KsViolationKind::StateMachineSafety,
                    format!("op {id} has parts but is not a txn"),
                ));
            };
            let succeeded = spec
                .compares
                .iter()
                .all(|c| c.holds(model.get_at(c.key(), rev - 1)));
            let want = spec.ops_by_shard(succeeded);
            let want_written = spec.written(succeeded);
            let got: BTreeMap<usize, &[Op]> =
                t.by_shard.iter().map(|(s, (_, _, o))| (*s, *o)).collect();
            let matches = want_written.iter().copied().collect::<BTreeSet<_>>()
                == got.keys().copied().collect()
                && got
                    .iter()
                    .all(|(s, o)| want.get(s).map(Vec::as_slice) == Some(*o));
            if !matches {
                return Err(found(
                    KsViolationKind::Serializability,
                    format!(
                        "txn x{id} ({spec}) at {rev}: its compares over the keyspace at {} choose the {} branch, {want:?}, but its parts carry {got:?}",
                        rev - 1,
                        if succeeded { "success" } else { "failure" }
                    ),
                ));
            }
        }
        // In op order: the first violation found is the same on a replay.
        let mut ops: Vec<(&u64, &super::checker::OpRecord)> = self.ops.iter().collect();
        ops.sort_unstable_by_key(|(id, _)| **id);
        for (id, rec) in ops {
            let Some(answer) = &rec.answer else {
                continue;
            };
            match (answer, &rec.kind) {
                (Answer::Txn(a), OpKind::Txn { spec }) => {
                    let before = a.rev - 1;
                    let succeeded = spec
                        .compares
                        .iter()
                        .all(|c| c.holds(model.get_at(c.key(), before)));
                    let mut overlay: HashMap<Key, GetResult> = HashMap::new();
                    let mut gets = Vec::new();
                    let version = |k: Key, o: &HashMap<Key, GetResult>| {
                        o.get(&k)
                            .copied()
                            .unwrap_or_else(|| model.get_at(k, before))
                    };
                    for op in spec.branch(succeeded) {
                        match *op {
                            Op::Get(k) => gets.push((k, version(k, &overlay))),
                            Op::Put(k) => {
                                let v = version(k, &overlay).map_or(0, |x| x.version) + 1;
                                overlay.insert(
                                    k,
                                    Some(super::kv::KeyVal {
                                        value: *id,
                                        version: v,
                                    }),
                                );
                            }
                            Op::Del(k) => {
                                overlay.insert(k, None);
                            }
                        }
                    }
                    if a.succeeded != succeeded || a.gets != gets {
                        return Err(found(
                            KsViolationKind::Serializability,
                            format!(
                                "txn x{id} ({spec}) at {} answered succeeded={} gets {:?}; the keyspace at {before} says succeeded={succeeded} gets {gets:?}",
                                a.rev, a.succeeded, a.gets
                            ),
                        ));
                    }
                }
                (Answer::Read(a), OpKind::Read { .. }) => {
                    for (k, v) in &a.values {
                        let want = model.get_at(*k, a.rev);
                        if *v != want {
                            return Err(found(
                                KsViolationKind::Serializability,
                                format!(
                                    "read q{id} at {} saw key {k} as {v:?}, but the writes at or below {} leave it {want:?} (history of key {k}: {:?})",
                                    a.rev,
                                    a.rev,
                                    key_history(&effects, *k)
                                ),
                            ));
                        }
                    }
                }
                (Answer::Write, OpKind::Write { .. }) => {}
                _ => {
                    return Err(found(
                        KsViolationKind::StateMachineSafety,
                        format!("op {id} answered as another kind of op"),
                    ))
                }
            }
        }
        // Watches.
        for (member, w) in watches {
            let upto = w.released_through;
            let want: Vec<&(usize, Event)> = events.iter().filter(|(_, e)| e.rev <= upto).collect();
            let got: Vec<&(usize, Event)> =
                w.released.iter().filter(|(_, e)| e.rev <= upto).collect();
            if want != got || got.len() != w.released.len() {
                let at = want
                    .iter()
                    .zip(&got)
                    .position(|(a, b)| a != b)
                    .unwrap_or(want.len().min(got.len()));
                return Err(found(
                    KsViolationKind::WatchOrder,
                    format!(
                        "a watch on member {member} released {} events through {upto}, the keyspace has {}; first difference at #{at}: released {:?}, expected {:?}",
                        w.released.len(),
                        want.len(),
                        got.get(at),
                        want.get(at)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The committed writes of key `k`, for a violation's detail.
fn key_history(effects: &[(u64, usize, u64, u64, &[Op])], k: Key) -> Vec<String> {
    effects
        .iter()
        .filter(|(.., ops)| ops.iter().any(|o| o.key() == k && o.writes()))
        .map(|(rev, shard, index, id, ops)| {
            format!("op {id} at {rev} (shard {shard} index {index}): {ops:?}")
        })
        .collect()
}

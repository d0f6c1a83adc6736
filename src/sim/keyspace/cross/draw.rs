//! The txns over several shards that the simulated clients draw.

use rand::seq::SliceRandom;
use rand::Rng;

use crate::sim::keyspace::kv::{Compare, GetResult, Key, Op, TxnSpec, KEYS_PER_SHARD};

/// A txn over 2 to 4 of `shards` shards, with compares that hold about
/// half the time: their targets are read off `peek` (some member's state),
/// as a client that read before would write them.
pub(in crate::sim::keyspace) fn draw_txn(
    rng: &mut impl Rng,
    shards: usize,
    peek: impl Fn(Key) -> GetResult,
) -> TxnSpec {
    let k = rng.gen_range(2..=shards.min(4));
    let mut chosen: Vec<usize> = (0..shards).collect();
    chosen.shuffle(rng);
    chosen.truncate(k);
    let key = |rng: &mut dyn rand::RngCore, chosen: &[usize]| {
        let s = chosen[rng.gen_range(0..chosen.len())];
        (s * KEYS_PER_SHARD + rng.gen_range(0..KEYS_PER_SHARD)) as u32
    };
    let compares = (0..rng.gen_range(1..=2))
        .map(|_| {
            let k = key(rng, &chosen);
            let now = peek(k);
            let right = rng.gen_bool(0.7);
            if rng.gen_bool(0.5) {
                let v = if right {
                    now.map_or(0, |x| x.version)
                } else {
                    rng.gen_range(0..3)
                };
                Compare::Version(k, v)
            } else {
                let v = if right { now.map(|x| x.value) } else { None };
                Compare::Value(k, v)
            }
        })
        .collect();
    let ops = |rng: &mut dyn rand::RngCore, n: usize| -> Vec<Op> {
        (0..n)
            .map(|_| {
                let k = key(rng, &chosen);
                match rng.gen_range(0..20) {
                    0..=9 => Op::Put(k),
                    10..=12 => Op::Del(k),
                    _ => Op::Get(k),
                }
            })
            .collect()
    };
    let mut spec = TxnSpec {
        compares,
        success: {
            let n = rng.gen_range(1..=4);
            ops(rng, n)
        },
        failure: {
            let n = rng.gen_range(0..=3);
            ops(rng, n)
        },
    };
    // Over several shards; and most of the time writing more than one
    // on success, so that there is a plan to keep.
    let want_written = if rng.gen_bool(0.7) { 2 } else { 1 };
    for s in chosen {
        if spec.shards().len() >= 2 && spec.written(true).len() >= want_written {
            break;
        }
        if !spec.written(true).contains(&s) {
            let k = (s * KEYS_PER_SHARD + rng.gen_range(0..KEYS_PER_SHARD)) as u32;
            spec.success.push(Op::Put(k));
        }
    }
    spec
}

/// A burst of `n` txns over the same 2 or 3 of `shards` shards, as
/// concurrent clients send them: each names one key of each of those
/// shards (the same slot on each), mostly a slot of its own, so that most
/// may share a batch and some may not.
pub(in crate::sim::keyspace) fn draw_burst(
    rng: &mut impl Rng,
    shards: usize,
    n: usize,
    peek: impl Fn(Key) -> GetResult,
) -> Vec<TxnSpec> {
    let mut chosen: Vec<usize> = (0..shards).collect();
    chosen.shuffle(rng);
    chosen.truncate(rng.gen_range(2..=shards.min(3)));
    chosen.sort_unstable();
    let base = rng.gen_range(0..KEYS_PER_SHARD);
    (0..n)
        .map(|j| {
            let slot = if rng.gen_bool(0.7) {
                (base + j) % KEYS_PER_SHARD
            } else {
                rng.gen_range(0..KEYS_PER_SHARD)
            };
            let key = |s: usize| (s * KEYS_PER_SHARD + slot) as Key;
            let on = key(chosen[rng.gen_range(0..chosen.len())]);
            let now = peek(on);
            let right = rng.gen_bool(0.7);
            let compare = if rng.gen_bool(0.5) {
                Compare::Version(
                    on,
                    if right {
                        now.map_or(0, |x| x.version)
                    } else {
                        rng.gen_range(0..3)
                    },
                )
            } else {
                Compare::Value(on, if right { now.map(|x| x.value) } else { None })
            };
            let mut success = Vec::new();
            for &s in &chosen {
                match rng.gen_range(0..10) {
                    0..=6 => success.push(Op::Put(key(s))),
                    7..=8 => success.extend([Op::Get(key(s)), Op::Put(key(s))]),
                    _ => success.push(Op::Get(key(s))),
                }
            }
            // Most failure branches write too, so that a batch's txns
            // mostly have parts whichever way their compares go.
            let failure = match rng.gen_range(0..20) {
                0..=2 => Vec::new(),
                3..=5 => vec![Op::Get(key(chosen[rng.gen_range(0..chosen.len())]))],
                6..=11 => vec![Op::Put(key(chosen[rng.gen_range(0..chosen.len())]))],
                _ => chosen.iter().map(|&s| Op::Put(key(s))).collect(),
            };
            TxnSpec {
                compares: vec![compare],
                success,
                failure,
            }
        })
        .collect()
}

//! The keys, the ops on them and the replicated state of one shard: what
//! the model's entries carry, and what applying them does.
//!
//! Every shard holds [`KEYS_PER_SHARD`] keys; key `k` lives on shard
//! `k / KEYS_PER_SHARD`. A put by op `id` sets the key's value to `id` (so
//! every value names the op that wrote it) and adds one to its version; a
//! delete removes it (version 0 again). Each key keeps its whole history,
//! so a shard can be read at any revision, as the MVCC store is.
//!
//! # Entry payloads
//! Text, in the style of the rest of the simulator:
//! - `w<id> r<rev> p<key>` / `w<id> r<rev> d<key>`: a single-shard write.
//! - `x<id> r<T> q<member>.<incarnation>.<seq> s<shard> o<ops> P<plan>`: a
//!   part of txn `id` at `T`, proposed by request `q`; `<ops>` is the
//!   shard's ops (`p3,g4,d5`, or `-`), `<plan>` every written shard's ops
//!   (`0=p1,g2/2=p7`), or `-` for a txn that writes one shard (no record).
//! - `X q<member>.<incarnation>.<seq> s<shard> <id>@<T>:<ops>:<plan>;...`:
//!   the parts of a batch's txns on one shard, in one entry, revisions
//!   ascending (`cross_parts`); each is applied at its own revision, as if
//!   it were an entry of its own. A lone part is a `x` entry.
//! - `d r<T> m<more> q<...>`: forget the records of the txns at `T` and at
//!   `<more>` (`5,9`, or `-`), in one entry (no revision).
//! - `c r<C>`: a close: no later entry of the shard is at or below `C`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::Bytes;

/// Keys per shard.
pub const KEYS_PER_SHARD: usize = 3;

pub type Key = u32;

pub fn shard_of(key: Key) -> usize {
    key as usize / KEYS_PER_SHARD
}

/// Keys of `shard`.
pub fn keys_of(shard: usize) -> impl Iterator<Item = Key> {
    (0..KEYS_PER_SHARD).map(move |j| (shard * KEYS_PER_SHARD + j) as Key)
}

/// One op of a txn or a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Put(Key),
    Del(Key),
    Get(Key),
}

impl Op {
    pub fn key(self) -> Key {
        match self {
            Op::Put(k) | Op::Del(k) | Op::Get(k) => k,
        }
    }

    pub fn writes(self) -> bool {
        !matches!(self, Op::Get(_))
    }

    fn code(self) -> String {
        match self {
            Op::Put(k) => format!("p{k}"),
            Op::Del(k) => format!("d{k}"),
            Op::Get(k) => format!("g{k}"),
        }
    }

    fn parse(s: &str) -> Option<Op> {
        let (c, k) = s.split_at(1);
        let k = k.parse().ok()?;
        match c {
            "p" => Some(Op::Put(k)),
            "d" => Some(Op::Del(k)),
            "g" => Some(Op::Get(k)),
            _ => None,
        }
    }
}

fn ops_code(ops: &[Op]) -> String {
    if ops.is_empty() {
        return "-".into();
    }
    ops.iter().map(|o| o.code()).collect::<Vec<_>>().join(",")
}

fn parse_ops(s: &str) -> Option<Vec<Op>> {
    if s == "-" {
        return Some(Vec::new());
    }
    s.split(',').map(Op::parse).collect()
}

/// A compare of a txn, evaluated over the keyspace just before the txn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compare {
    /// The key's version is this (0: absent).
    Version(Key, u64),
    /// The key is present with this value, or (`None`) absent.
    Value(Key, Option<u64>),
}

impl Compare {
    pub fn key(self) -> Key {
        match self {
            Compare::Version(k, _) | Compare::Value(k, _) => k,
        }
    }

    /// The outcome over the key's state `kv`.
    pub fn holds(self, kv: Option<KeyVal>) -> bool {
        match self {
            Compare::Version(_, v) => kv.map_or(0, |x| x.version) == v,
            Compare::Value(_, v) => kv.map(|x| x.value) == v,
        }
    }
}

/// What a client asks of a txn: compares, then the ops of the branch they
/// choose, in order. The model has no nested txns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnSpec {
    pub compares: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl TxnSpec {
    /// Every shard a compare or an op of either branch touches.
    pub fn shards(&self) -> BTreeSet<usize> {
        self.compares
            .iter()
            .map(|c| shard_of(c.key()))
            .chain(
                self.success
                    .iter()
                    .chain(&self.failure)
                    .map(|o| shard_of(o.key())),
            )
            .collect()
    }

    /// Every key a compare or an op of either branch names: the key
    /// ranges a batch compares (`txn_ranges`; each of the model's is one
    /// key).
    pub fn keys(&self) -> BTreeSet<Key> {
        self.compares
            .iter()
            .map(|c| c.key())
            .chain(self.success.iter().chain(&self.failure).map(|o| o.key()))
            .collect()
    }

    /// The txn's size as a batch counts it: its encoded length.
    pub fn encoded_len(&self) -> usize {
        self.to_string().len()
    }

    pub fn branch(&self, succeeded: bool) -> &[Op] {
        if succeeded {
            &self.success
        } else {
            &self.failure
        }
    }

    /// The chosen branch's ops by shard, in the txn's order.
    pub fn ops_by_shard(&self, succeeded: bool) -> BTreeMap<usize, Vec<Op>> {
        let mut out: BTreeMap<usize, Vec<Op>> = BTreeMap::new();
        for op in self.branch(succeeded) {
            out.entry(shard_of(op.key())).or_default().push(*op);
        }
        out
    }

    /// Shards the chosen branch puts or deletes on.
    pub fn written(&self, succeeded: bool) -> BTreeSet<usize> {
        self.branch(succeeded)
            .iter()
            .filter(|o| o.writes())
            .map(|o| shard_of(o.key()))
            .collect()
    }
}

impl fmt::Display for TxnSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "if {:?} then {} else {}",
            self.compares,
            ops_code(&self.success),
            ops_code(&self.failure)
        )
    }
}

/// A key's state: the op that last put it, and how many puts since it was
/// created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyVal {
    pub value: u64,
    pub version: u64,
}

/// The plan of a txn that writes several shards: its id, and every written
/// shard's ops. Each part carries it; the shard keeps it as a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub id: u64,
    pub parts: Vec<(usize, Vec<Op>)>,
}

impl Plan {
    fn code(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(s, ops)| format!("{s}={}", ops_code(ops)))
            .collect();
        parts.join("/")
    }

    fn parse(id: u64, s: &str) -> Option<Plan> {
        let parts = s
            .split('/')
            .map(|p| {
                let (s, ops) = p.split_once('=')?;
                Some((s.parse().ok()?, parse_ops(ops)?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Plan { id, parts })
    }

    pub fn ops_of(&self, shard: usize) -> Option<&[Op]> {
        self.parts
            .iter()
            .find(|(s, _)| *s == shard)
            .map(|(_, o)| o.as_slice())
    }
}

/// Which request of which member incarnation proposed an entry: its
/// proposer answers its waiter when it applies it, as the shard driver
/// answers a request id of its own boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqTag {
    pub member: u64,
    pub incarnation: u64,
    pub seq: u64,
}

impl ReqTag {
    fn code(self) -> String {
        format!("q{}.{}.{}", self.member, self.incarnation, self.seq)
    }

    fn parse(s: &str) -> Option<ReqTag> {
        let mut it = s.strip_prefix('q')?.split('.');
        let t = ReqTag {
            member: it.next()?.parse().ok()?,
            incarnation: it.next()?.parse().ok()?,
            seq: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(t)
    }
}

/// One txn's part in an entry of a batch's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartAt {
    pub id: u64,
    pub rev: u64,
    pub ops: Vec<Op>,
    pub plan: Option<Plan>,
}

impl PartAt {
    fn code(&self) -> String {
        format!(
            "{}@{}:{}:{}",
            self.id,
            self.rev,
            ops_code(&self.ops),
            self.plan.as_ref().map_or("-".to_string(), Plan::code)
        )
    }

    fn parse(s: &str) -> Option<PartAt> {
        let (id, rest) = s.split_once('@')?;
        let id = id.parse().ok()?;
        let mut f = rest.split(':');
        let (rev, ops, plan) = (f.next()?, f.next()?, f.next()?);
        if f.next().is_some() {
            return None;
        }
        Some(PartAt {
            id,
            rev: rev.parse().ok()?,
            ops: parse_ops(ops)?,
            plan: match plan {
                "-" => None,
                text => Some(Plan::parse(id, text)?),
            },
        })
    }
}

/// What an entry of a shard's log carries (besides no-ops and conf
/// changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Write {
        id: u64,
        rev: u64,
        op: Op,
    },
    Part {
        id: u64,
        rev: u64,
        by: ReqTag,
        shard: usize,
        ops: Vec<Op>,
        plan: Option<Plan>,
    },
    /// The parts of two or more txns of a batch on one shard.
    Parts {
        by: ReqTag,
        shard: usize,
        parts: Vec<PartAt>,
    },
    /// Forgets the records at `rev` and at each of `more`.
    Done {
        rev: u64,
        more: Vec<u64>,
        by: ReqTag,
    },
    Close {
        rev: u64,
    },
}

impl Payload {
    pub fn encode(&self) -> Bytes {
        Bytes::from(match self {
            Payload::Write { id, rev, op } => format!("w{id} r{rev} {}", op.code()),
            Payload::Part {
                id,
                rev,
                by,
                shard,
                ops,
                plan,
            } => format!(
                "x{id} r{rev} {} s{shard} o{} P{}",
                by.code(),
                ops_code(ops),
                plan.as_ref().map_or("-".to_string(), Plan::code)
            ),
            Payload::Parts { by, shard, parts } => format!(
                "X {} s{shard} {}",
                by.code(),
                parts.iter().map(PartAt::code).collect::<Vec<_>>().join(";")
            ),
            Payload::Done { rev, more, by } => format!(
                "d r{rev} m{} {}",
                if more.is_empty() {
                    "-".to_string()
                } else {
                    more.iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                },
                by.code()
            ),
            Payload::Close { rev } => format!("c r{rev}"),
        })
    }

    pub fn decode(data: &[u8]) -> Option<Payload> {
        let s = std::str::from_utf8(data).ok()?;
        let f: Vec<&str> = s.split(' ').collect();
        let rev = |x: &str| x.strip_prefix('r')?.parse::<u64>().ok();
        match f.as_slice() {
            [w, r, op] if w.starts_with('w') => Some(Payload::Write {
                id: w[1..].parse().ok()?,
                rev: rev(r)?,
                op: Op::parse(op)?,
            }),
            [x, r, q, s, o, p] if x.starts_with('x') => {
                let id = x[1..].parse().ok()?;
                let plan = match p.strip_prefix('P')? {
                    "-" => None,
                    text => Some(Plan::parse(id, text)?),
                };
                Some(Payload::Part {
                    id,
                    rev: rev(r)?,
                    by: ReqTag::parse(q)?,
                    shard: s.strip_prefix('s')?.parse().ok()?,
                    ops: parse_ops(o.strip_prefix('o')?)?,
                    plan,
                })
            }
            ["X", q, s, parts] => Some(Payload::Parts {
                by: ReqTag::parse(q)?,
                shard: s.strip_prefix('s')?.parse().ok()?,
                parts: parts
                    .split(';')
                    .map(PartAt::parse)
                    .collect::<Option<Vec<_>>>()?,
            }),
            ["d", r, m, q] => Some(Payload::Done {
                rev: rev(r)?,
                more: match m.strip_prefix('m')? {
                    "-" => Vec::new(),
                    list => list
                        .split(',')
                        .map(|x| x.parse().ok())
                        .collect::<Option<Vec<_>>>()?,
                },
                by: ReqTag::parse(q)?,
            }),
            ["c", r] => Some(Payload::Close { rev: rev(r)? }),
            _ => None,
        }
    }

    /// The revision the entry moves its shard to, if any (an entry of
    /// parts: its last part's, as its header says).
    pub fn revision(&self) -> Option<u64> {
        self.stamps().last().map(|(rev, _)| *rev)
    }

    /// The revisions the entry carries, in order, each with the op it is
    /// for: a write's or a txn's id (a close carries another op's
    /// revision, and a done none).
    pub fn stamps(&self) -> Vec<(u64, Option<u64>)> {
        match self {
            Payload::Write { id, rev, .. } | Payload::Part { id, rev, .. } => {
                vec![(*rev, Some(*id))]
            }
            Payload::Parts { parts, .. } => parts.iter().map(|p| (p.rev, Some(p.id))).collect(),
            Payload::Close { rev } => vec![(*rev, None)],
            Payload::Done { .. } => Vec::new(),
        }
    }

    /// The txn parts the entry carries, in order: one, a batch's, or none.
    pub fn parts(&self) -> Vec<(u64, u64, &[Op], Option<&Plan>)> {
        match self {
            Payload::Part {
                id, rev, ops, plan, ..
            } => vec![(*id, *rev, ops.as_slice(), plan.as_ref())],
            Payload::Parts { parts, .. } => parts
                .iter()
                .map(|p| (p.id, p.rev, p.ops.as_slice(), p.plan.as_ref()))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// A change a watcher sees: `key` put by op `value`, or deleted (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub rev: u64,
    pub key: Key,
    pub value: Option<u64>,
}

/// The answer to a get.
pub type GetResult = Option<KeyVal>;

/// Keys with their histories: one shard's store, or (in the checker) the
/// whole keyspace's sequential model.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// Each key's states, oldest first: `(revision, state from then on)`.
    hist: BTreeMap<Key, Vec<(u64, Option<KeyVal>)>>,
    /// The revision the store has reached (writes, parts and closes).
    pub rev: u64,
    /// The plans of txns over several shards a part applied here left,
    /// by revision, until their done entry.
    pub records: BTreeMap<u64, Plan>,
}

impl Store {
    pub fn latest(&self, k: Key) -> Option<KeyVal> {
        self.hist.get(&k).and_then(|h| h.last()).and_then(|x| x.1)
    }

    /// The key's state at revision `at`.
    pub fn get_at(&self, k: Key, at: u64) -> Option<KeyVal> {
        let h = self.hist.get(&k)?;
        let i = h.partition_point(|(r, _)| *r <= at);
        if i == 0 {
            None
        } else {
            h[i - 1].1
        }
    }

    /// Applies `ops` of op `id` at `rev`, in order: the gets' answers, and
    /// the events.
    pub fn apply_ops(&mut self, rev: u64, id: u64, ops: &[Op]) -> (Vec<GetResult>, Vec<Event>) {
        let mut gets = Vec::new();
        let mut events = Vec::new();
        for op in ops {
            match *op {
                Op::Get(k) => gets.push(self.latest(k)),
                Op::Put(k) => {
                    let version = self.latest(k).map_or(0, |x| x.version) + 1;
                    let kv = KeyVal { value: id, version };
                    self.hist.entry(k).or_default().push((rev, Some(kv)));
                    events.push(Event {
                        rev,
                        key: k,
                        value: Some(id),
                    });
                }
                Op::Del(k) => {
                    if self.latest(k).is_some() {
                        self.hist.entry(k).or_default().push((rev, None));
                        events.push(Event {
                            rev,
                            key: k,
                            value: None,
                        });
                    }
                }
            }
        }
        self.rev = self.rev.max(rev);
        (gets, events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let by = ReqTag {
            member: 2,
            incarnation: 3,
            seq: 9,
        };
        let ps = [
            Payload::Write {
                id: 17,
                rev: 42,
                op: Op::Del(4),
            },
            Payload::Part {
                id: 5,
                rev: 77,
                by,
                shard: 1,
                ops: vec![Op::Put(3), Op::Get(4)],
                plan: Some(Plan {
                    id: 5,
                    parts: vec![(0, vec![Op::Put(1)]), (1, vec![Op::Put(3), Op::Get(4)])],
                }),
            },
            Payload::Part {
                id: 6,
                rev: 78,
                by,
                shard: 0,
                ops: vec![],
                plan: None,
            },
            Payload::Parts {
                by,
                shard: 1,
                parts: vec![
                    PartAt {
                        id: 5,
                        rev: 77,
                        ops: vec![Op::Put(3), Op::Get(4)],
                        plan: Some(Plan {
                            id: 5,
                            parts: vec![(0, vec![Op::Put(1)]), (1, vec![Op::Put(3), Op::Get(4)])],
                        }),
                    },
                    PartAt {
                        id: 9,
                        rev: 78,
                        ops: vec![],
                        plan: None,
                    },
                ],
            },
            Payload::Done {
                rev: 77,
                more: vec![],
                by,
            },
            Payload::Done {
                rev: 77,
                more: vec![78, 81],
                by,
            },
            Payload::Close { rev: 80 },
        ];
        for p in ps {
            assert_eq!(Payload::decode(&p.encode()), Some(p.clone()), "{p:?}");
        }
        assert_eq!(Payload::decode(b""), None);
        assert_eq!(Payload::decode(b"lease s1"), None);
    }

    #[test]
    fn a_store_reads_at_any_revision() {
        let mut s = Store::default();
        s.apply_ops(10, 1, &[Op::Put(0)]);
        s.apply_ops(12, 2, &[Op::Put(0), Op::Del(1)]);
        let (gets, ev) = s.apply_ops(15, 3, &[Op::Del(0), Op::Get(0)]);
        assert_eq!(gets, vec![None]);
        assert_eq!(ev.len(), 1);
        assert_eq!(s.get_at(0, 9), None);
        assert_eq!(
            s.get_at(0, 11),
            Some(KeyVal {
                value: 1,
                version: 1
            })
        );
        assert_eq!(
            s.get_at(0, 14),
            Some(KeyVal {
                value: 2,
                version: 2
            })
        );
        assert_eq!(s.get_at(0, 15), None);
        assert_eq!(s.rev, 15);
    }
}

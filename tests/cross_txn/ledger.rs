//! The crash test's txns and their ledger: the keys txn `n` writes (on one
//! shard or on several), what each issued txn's outcome was, and the check
//! that a whole keyspace holds each txn all or nothing.

use std::collections::{BTreeMap, BTreeSet};

use cairn::routing::RoutingTable;

/// Routing prefixes the crash test's txns write under (with keys of no
/// '/', which route by the whole key).
const PREFIXES: [&str; 8] = [
    "acct-a/",
    "acct-b/",
    "acct-c/",
    "acct-d/",
    "/registry/pods/",
    "/registry/nodes/",
    "/registry/secrets/",
    "/registry/leases/",
];
/// Every key the crash test writes has this in it, and no other key does.
pub(crate) const MARK: &str = "xk-";

/// The keys of txn `n`: one in four writes two keys of one routing prefix
/// (one shard); the others write 2, 3 or 4 keys on as many shards as there
/// are, with a key of no '/' among the candidates. Every writer issues both
/// kinds.
pub(crate) fn txn_keys(routing: &RoutingTable, n: u64) -> (Vec<String>, bool) {
    let i = n as usize;
    if n.is_multiple_of(4) {
        let p = PREFIXES[i / 4 % PREFIXES.len()];
        return (
            vec![format!("{p}{MARK}{n}-a"), format!("{p}{MARK}{n}-b")],
            false,
        );
    }
    let want = 2 + i / 4 % 3;
    let mut candidates: Vec<String> = (0..PREFIXES.len())
        .map(|j| format!("{}{MARK}{n}", PREFIXES[(i + j) % PREFIXES.len()]))
        .collect();
    candidates.insert(i % 4, format!("{MARK}{n}"));
    let mut keys: Vec<String> = Vec::new();
    let mut taken = BTreeSet::new();
    for k in &candidates {
        if keys.len() < want && taken.insert(routing.shard_for_key(k.as_bytes())) {
            keys.push(k.clone());
        }
    }
    for k in &candidates {
        if keys.len() < want && !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    (keys, true)
}

pub(super) fn marker(n: u64) -> String {
    format!("txn-{n}")
}

#[derive(Debug)]
pub(crate) enum Outcome {
    /// Answered: applied at this revision.
    Acked(i64),
    /// Not answered; it may have been applied, but wholly or not at all.
    Unknown(String),
}

#[derive(Debug)]
pub(crate) struct Issued {
    pub(crate) n: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) cross: bool,
    pub(crate) outcome: Outcome,
}

#[derive(Default)]
pub(super) struct Ledger {
    pub(super) issued: Vec<Issued>,
    /// Acknowledged txns among `issued`.
    pub(super) acked: usize,
    /// The writers pause once this many txns are acknowledged, until a step
    /// of the test raises it: they are busy at every kill, but do not fill
    /// the store while the test waits for a member to come back.
    pub(super) budget: usize,
    /// Why the test must stop: a valid txn refused or its compares failing.
    pub(super) fatal: Option<String>,
}

/// Checks the crash test's keys in `state` (the whole keyspace at one
/// revision): an acknowledged txn is there whole, at its revision; one
/// without an answer is there whole at one revision or not at all; no
/// other key carries the mark.
pub(crate) fn check_all_or_nothing(
    routing: &RoutingTable,
    issued: &[Issued],
    state: &[(String, String, i64, i64, i64)],
    what: &str,
) {
    let stored: BTreeMap<&str, (&str, i64)> = state
        .iter()
        .filter(|(k, ..)| k.contains(MARK))
        .map(|(k, v, _, m, _)| (k.as_str(), (v.as_str(), *m)))
        .collect();
    let mut expected_keys = BTreeSet::new();
    let mut revisions = BTreeMap::new();
    for t in issued {
        let value = marker(t.n);
        let kind = if t.cross {
            "cross-shard"
        } else {
            "single-shard"
        };
        let got: Vec<Option<(&str, i64)>> = t
            .keys
            .iter()
            .map(|k| stored.get(k.as_str()).copied())
            .collect();
        let shown = || {
            t.keys
                .iter()
                .zip(&got)
                .map(|(k, g)| {
                    let shard = routing.shard_for_key(k.as_bytes());
                    match g {
                        Some((v, m)) => format!("{k} (shard {shard}) = {v} at {m}"),
                        None => format!("{k} (shard {shard}) absent"),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &t.outcome {
            Outcome::Acked(revision) => {
                assert!(
                    got.iter().all(|g| *g == Some((value.as_str(), *revision))),
                    "{what}: {kind} txn {value}, acknowledged at revision {revision}, is not wholly there at it: {}",
                    shown()
                );
            }
            Outcome::Unknown(why) => {
                let revision = got.first().copied().flatten().map(|(_, m)| m);
                let whole = got
                    .iter()
                    .all(|g| *g == revision.map(|m| (value.as_str(), m)));
                assert!(
                    whole,
                    "{what}: {kind} txn {value} (unanswered: {why}) is partly there: {}",
                    shown()
                );
            }
        }
        if let Some(Some((_, m))) = got.first() {
            if let Some(other) = revisions.insert(*m, t.n) {
                panic!(
                    "{what}: txns {} and {value} both stored at revision {m}",
                    marker(other)
                );
            }
        }
        expected_keys.extend(t.keys.iter().map(String::as_str));
    }
    let strays: Vec<&&str> = stored
        .keys()
        .filter(|k| !expected_keys.contains(**k))
        .collect();
    assert!(strays.is_empty(), "{what}: keys no txn wrote: {strays:?}");
}

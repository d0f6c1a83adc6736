//! The bank's accounts, spread over every shard: their opening balances,
//! the transfers acknowledged and the history of balances they leave,
//! reading every account (by one txn of range ops, or by gets at one
//! revision), and the check of what a whole-keyspace watch delivered
//! against the transfers.

use std::collections::{BTreeMap, BTreeSet};

use cairn::routing::RoutingTable;
use etcd_client::{EventType, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::{header_revision, placed, send_txn, text};

/// The accounts: routing prefixes of every shape (a plain name up to its
/// '/', two `/registry/<type>/` prefixes, a key without '/'), which reach
/// both shards of 2, every shard of 4, and five of 8.
pub(crate) const ACCOUNTS: [&str; 7] = [
    "acct-a/x",
    "acct-b/x",
    "acct-c/x",
    "acct-d/x",
    "/registry/pods/p",
    "/registry/nodes/n",
    "plainkey",
];
pub(crate) const OPENING_BALANCE: i64 = 100;
pub(super) const TOTAL: i64 = OPENING_BALANCE * ACCOUNTS.len() as i64;

/// One acknowledged transfer: the revision of its response header and the
/// balances it put (account index, new balance).
#[derive(Debug, Clone)]
pub(crate) struct Transfer {
    pub(crate) client: usize,
    pub(crate) revision: i64,
    pub(crate) puts: [(usize, i64); 2],
}

/// The balances every acknowledged txn leaves, revision by revision.
pub(super) struct History {
    /// (revision, balances after the txn at it), in revision order.
    pub(super) states: Vec<(i64, Vec<i64>)>,
}

impl History {
    pub(super) fn new(opened_at: i64, transfers: &[Transfer]) -> History {
        let mut sorted: Vec<&Transfer> = transfers.iter().collect();
        sorted.sort_by_key(|t| t.revision);
        let mut balances = vec![OPENING_BALANCE; ACCOUNTS.len()];
        let mut states = vec![(opened_at, balances.clone())];
        for t in sorted {
            assert!(
                t.revision > states.last().unwrap().0,
                "two txns acknowledged at revision {}: {t:?} and the one before",
                t.revision
            );
            for &(account, balance) in &t.puts {
                balances[account] = balance;
            }
            states.push((t.revision, balances.clone()));
        }
        History { states }
    }

    /// The balances at `revision` (at or after the opening).
    pub(super) fn at(&self, revision: i64) -> &[i64] {
        let i = self.states.partition_point(|(r, _)| *r <= revision);
        assert!(i > 0, "revision {revision} is before the accounts opened");
        &self.states[i - 1].1
    }
}

/// Balance and mod revision of an account in a range response.
pub(super) fn account_of(kvs: &[KeyValue], key: &str) -> Result<(i64, i64), String> {
    let kv = kvs
        .iter()
        .find(|kv| kv.key() == key.as_bytes())
        .ok_or_else(|| format!("account {key} is missing"))?;
    let balance = text(kv.value())
        .parse()
        .map_err(|_| format!("account {key} holds {:?}", text(kv.value())))?;
    Ok((balance, kv.mod_revision()))
}

/// Every account read by one txn of range ops (one per account, read at
/// `revision` if given): the txn's header revision and the balances.
pub(super) async fn read_by_txn(
    c: &mut etcd_client::Client,
    routing: &RoutingTable,
    revision: Option<i64>,
) -> Result<(i64, Vec<i64>), String> {
    let ops: Vec<TxnOp> = ACCOUNTS
        .iter()
        .map(|k| TxnOp::get(*k, revision.map(|r| GetOptions::new().with_revision(r))))
        .collect();
    let r = send_txn(c, Txn::new().and_then(ops)).await.map_err(|f| {
        format!(
            "a txn of range ops over {}{}: {f}",
            placed(routing, &ACCOUNTS),
            revision.map_or(String::new(), |r| format!(" at revision {r}"))
        )
    })?;
    let mut balances = Vec::with_capacity(ACCOUNTS.len());
    for (key, op) in ACCOUNTS.iter().zip(r.op_responses()) {
        let TxnOpResponse::Get(g) = op else {
            return Err(format!("the range op on {key} answered {op:?}"));
        };
        balances.push(account_of(g.kvs(), key)?.0);
    }
    Ok((header_revision(&r), balances))
}

/// Every account by a get of each at `revision`, serializable (served by
/// the member asked from its own state) when `serializable`.
pub(super) async fn read_by_gets(
    c: &mut etcd_client::Client,
    revision: i64,
    serializable: bool,
) -> Result<Vec<i64>, etcd_client::Error> {
    let mut balances = Vec::with_capacity(ACCOUNTS.len());
    for key in ACCOUNTS {
        let mut options = GetOptions::new().with_revision(revision);
        if serializable {
            options = options.with_serializable();
        }
        let r = c.get(key, Some(options)).await?;
        let (balance, _) =
            account_of(r.kvs(), key).unwrap_or_else(|e| panic!("at {revision}: {e}"));
        balances.push(balance);
    }
    Ok(balances)
}

/// Every account by one serializable range over the whole keyspace (every
/// shard): its header revision and the balances.
pub(super) async fn read_serializable_range(
    c: &mut etcd_client::Client,
) -> Result<(i64, Vec<i64>), String> {
    let r = c
        .get(
            "\0",
            Some(GetOptions::new().with_range("\0").with_serializable()),
        )
        .await
        .map_err(|e| format!("a serializable range over every shard: {e}"))?;
    let revision = r
        .header()
        .expect("a range response has a header")
        .revision();
    let mut balances = Vec::with_capacity(ACCOUNTS.len());
    for key in ACCOUNTS {
        balances.push(
            account_of(r.kvs(), key)
                .map_err(|e| format!("at {revision}: {e}"))?
                .0,
        );
    }
    Ok((revision, balances))
}

/// One event a watch delivered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    pub(crate) revision: i64,
    pub(crate) kind: EventType,
    pub(crate) key: String,
    pub(crate) value: String,
}

/// Checks what the whole-keyspace watch delivered from the opening on:
/// each txn's puts as events of its revision, adjacent (no event of another
/// revision between them) and in the order of its operations (as etcd
/// numbers them), revisions increasing, none missing, nothing that no
/// acknowledged txn wrote; and the balances the events replay to sum to the
/// total after every revision.
pub(crate) fn check_watched(seen: &[Seen], opened_at: i64, transfers: &[Transfer]) {
    let mut expected: BTreeMap<i64, Vec<(String, String)>> = BTreeMap::new();
    expected.insert(
        opened_at,
        ACCOUNTS
            .iter()
            .map(|k| (k.to_string(), OPENING_BALANCE.to_string()))
            .collect(),
    );
    for t in transfers {
        expected.insert(
            t.revision,
            t.puts
                .iter()
                .map(|&(a, b)| (ACCOUNTS[a].to_string(), b.to_string()))
                .collect(),
        );
    }
    // Runs of events of one revision, in arrival order.
    let mut runs: Vec<(i64, Vec<&Seen>)> = Vec::new();
    for e in seen {
        match runs.last_mut() {
            Some((r, events)) if *r == e.revision => events.push(e),
            Some((r, _)) if *r > e.revision => panic!(
                "the watch delivered an event of revision {} after one of revision {r} (a txn's events must be adjacent, in revision order): {e:?}",
                e.revision
            ),
            _ => runs.push((e.revision, vec![e])),
        }
    }
    let mut balances: BTreeMap<String, i64> = BTreeMap::new();
    for (revision, events) in &runs {
        let Some(want) = expected.get(revision) else {
            panic!("the watch delivered events at revision {revision}, where no acknowledged txn wrote: {events:?}");
        };
        let got: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                assert_eq!(e.kind, EventType::Put, "at revision {revision}: {e:?}");
                (e.key.clone(), e.value.clone())
            })
            .collect();
        let as_set = |v: &[(String, String)]| v.iter().cloned().collect::<BTreeSet<_>>();
        assert!(
            got.len() == want.len() && as_set(&got) == as_set(want),
            "the txn acknowledged at revision {revision} put {want:?}; the watch delivered, adjacent at that revision: {got:?}"
        );
        assert_eq!(
            &got, want,
            "the events of the txn at revision {revision} are not in the order of its puts (etcd numbers a txn's changes in operation order)"
        );
        for (k, v) in &got {
            balances.insert(k.clone(), v.parse().unwrap());
        }
        let sum: i64 = balances.values().sum();
        assert_eq!(
            sum, TOTAL,
            "the events up to revision {revision} replay to {balances:?}"
        );
    }
    let delivered: BTreeSet<i64> = runs.iter().map(|(r, _)| *r).collect();
    let missing: Vec<&i64> = expected.keys().filter(|r| !delivered.contains(r)).collect();
    assert!(
        missing.is_empty(),
        "the watch delivered no event for the txns acknowledged at revisions {missing:?}"
    );
}

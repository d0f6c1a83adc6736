//! The list-append transaction workload: clients run multi-key etcd txns
//! that read some keys and append a unique value to others, each through
//! its own proxies, and record every txn with its invoke and complete times.
//! `elle.rs` judges what they recorded.
//!
//! A key holds a list of values, comma-separated decimals. An append is a
//! put of the list the client read just before plus the new value, guarded
//! by a compare on the key's mod revision: the txn writes only if no other
//! write reached the key between that read and the txn, so every key's list
//! only ever grows by appends. A txn's reads run before its puts, over
//! distinct keys. A few keys are active at a time; one whose list a read
//! shows long is retired for a fresh key, so lists stay short however long
//! the run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::cluster::{direct_client, Bench, OP_TIMEOUT};
use super::history::{Ended, History, Log, Logged};
use super::workload::Values;

/// Every txn key is under it (outside the watchers' register prefix).
pub const TXN_PREFIX: &str = "/txn/";

/// Pause after a failed or unknown txn before the next one.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Most micro-operations in one txn.
const MAX_MOPS: usize = 4;

/// A list read this long retires its key.
const RETIRE_AT: usize = 128;

/// The client id of the final reads after the whole-cluster restart.
pub const FINAL_READER: usize = usize::MAX;

pub fn txn_key(i: usize) -> String {
    format!("{TXN_PREFIX}{i}")
}

/// The keys txns work on: a fixed number of active key ids, each replaced
/// by a fresh id once retired.
#[derive(Clone)]
pub struct TxnKeys {
    active: Arc<Mutex<Vec<usize>>>,
    next: Arc<AtomicUsize>,
}

impl TxnKeys {
    pub fn new(slots: usize) -> TxnKeys {
        TxnKeys {
            active: Arc::new(Mutex::new((0..slots).collect())),
            next: Arc::new(AtomicUsize::new(slots)),
        }
    }

    /// Up to `n` distinct active key ids.
    fn pick(&self, rng: &mut SmallRng, n: usize) -> Vec<usize> {
        let active = self.active.lock().unwrap();
        active.choose_multiple(rng, n).copied().collect()
    }

    /// Replaces key `id`, if still active, with a fresh one. Txns already
    /// under way may still use it.
    fn retire(&self, id: usize) {
        let mut active = self.active.lock().unwrap();
        if let Some(slot) = active.iter_mut().find(|k| **k == id) {
            *slot = self.next.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many key ids were ever used: `0..used()`.
    pub fn used(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }
}

/// One micro-operation of a txn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mop {
    /// A read of the key's list: what it returned, None unless the txn
    /// answered (an absent key reads as the empty list).
    Read { key: String, list: Option<Vec<u64>> },
    /// An append of a value unique to the run.
    Append { key: String, value: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// The txn committed (its compares held); its reads are known.
    Ok,
    /// Certainly no effect: the compares failed, or the txn was never sent.
    Failed,
    /// An error or timeout after the txn was sent: it may have committed.
    Unknown,
}

/// One txn of one client.
#[derive(Clone, Debug)]
pub struct TxnRecord {
    pub client: usize,
    pub mops: Vec<Mop>,
    pub invoke_ns: u64,
    /// `u64::MAX` for an unknown outcome: it may take effect at any time.
    pub complete_ns: u64,
    pub outcome: TxnOutcome,
}

impl Logged for TxnRecord {
    fn ended(&self) -> Ended {
        match self.outcome {
            TxnOutcome::Ok => Ended::Ok,
            TxnOutcome::Failed => Ended::Failed,
            TxnOutcome::Unknown => Ended::Unknown,
        }
    }

    fn never_completes(&mut self) {
        self.complete_ns = u64::MAX;
    }

    /// The final reads are the checker's, not a client's.
    fn counted(&self) -> bool {
        self.client != FINAL_READER
    }
}

/// The txns of a run, in the order they completed.
pub type TxnLog = Log<TxnRecord>;

pub fn encode(list: &[u64]) -> String {
    list.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn decode(bytes: &[u8]) -> Result<Vec<u64>, etcd_client::Error> {
    let bad = || etcd_client::Error::InvalidArgs(format!("not a list: {bytes:?}"));
    let s = std::str::from_utf8(bytes).map_err(|_| bad())?;
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|v| v.parse().map_err(|_| bad())).collect()
}

/// Every txn key present, with its list and mod revision, read in one
/// linearizable range get.
async fn read_all(
    c: &mut etcd_client::Client,
) -> Result<HashMap<String, (Vec<u64>, i64)>, etcd_client::Error> {
    let r = c
        .get(TXN_PREFIX, Some(GetOptions::new().with_prefix()))
        .await?;
    r.kvs()
        .iter()
        .map(|kv| {
            Ok((
                kv.key_str()?.to_string(),
                (decode(kv.value())?, kv.mod_revision()),
            ))
        })
        .collect()
}

/// The list and mod revision of each of `keys`, one linearizable get each
/// (an absent key: the empty list at revision 0).
async fn read_each(
    c: &mut etcd_client::Client,
    keys: impl Iterator<Item = &String>,
) -> Result<HashMap<String, (Vec<u64>, i64)>, etcd_client::Error> {
    let mut seen = HashMap::new();
    for key in keys {
        let r = c.get(key.as_str(), None).await?;
        let got = match r.kvs().first() {
            None => (Vec::new(), 0),
            Some(kv) => (decode(kv.value())?, kv.mod_revision()),
        };
        seen.insert(key.clone(), got);
    }
    Ok(seen)
}

/// What one txn client does.
pub struct TxnClient {
    pub id: usize,
    /// Its endpoints (through its proxies), one per member.
    pub endpoints: Vec<String>,
    pub keys: TxnKeys,
    pub values: Values,
    pub clock: History,
    pub log: Arc<TxnLog>,
    pub stop: Arc<AtomicBool>,
    pub seed: u64,
}

impl TxnClient {
    pub async fn run(self) {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let mut at = self.id % self.endpoints.len();
        let mut clients: Vec<Option<etcd_client::Client>> = vec![None; self.endpoints.len()];
        while !self.stop.load(Ordering::Relaxed) {
            if clients[at].is_none() {
                clients[at] = Some(direct_client(&self.endpoints[at]).await);
            }
            let c = clients[at].as_mut().expect("client just made");
            let n = rng.gen_range(1..=MAX_MOPS);
            let mut read_ids = Vec::new();
            let mut reads = Vec::new();
            let mut appends = Vec::new();
            for k in self.keys.pick(&mut rng, n) {
                if rng.gen_bool(0.5) {
                    read_ids.push(k);
                    reads.push(txn_key(k));
                } else {
                    appends.push((txn_key(k), self.values.next()));
                }
            }
            let invoke_ns = self.clock.now_ns();
            let (outcome, mops) = execute(c, &reads, &appends).await;
            let complete_ns = self.clock.now_ns();
            // Reads come first in `mops`.
            for (&k, mop) in read_ids.iter().zip(&mops) {
                if matches!(mop, Mop::Read { list: Some(l), .. } if l.len() >= RETIRE_AT) {
                    self.keys.retire(k);
                }
            }
            if outcome != TxnOutcome::Ok {
                clients[at] = None;
                at = (at + 1) % self.endpoints.len();
                // An error can come at once (a member down): no hot loop.
                tokio::time::sleep(ERROR_BACKOFF).await;
            }
            self.log.push(TxnRecord {
                client: self.id,
                mops,
                invoke_ns,
                complete_ns,
                outcome,
            });
        }
    }
}

/// Runs one txn: reads each key it appends to, then the etcd txn whose
/// compares hold those keys' mod revisions, whose success branch reads
/// `reads` and puts each appended key's list plus its value, and whose
/// failure branch is empty. A compare that fails means no effect.
pub async fn execute(
    c: &mut etcd_client::Client,
    reads: &[String],
    appends: &[(String, u64)],
) -> (TxnOutcome, Vec<Mop>) {
    let mut mops: Vec<Mop> = reads
        .iter()
        .map(|key| Mop::Read {
            key: key.clone(),
            list: None,
        })
        .chain(appends.iter().map(|(key, value)| Mop::Append {
            key: key.clone(),
            value: *value,
        }))
        .collect();
    let seen = if appends.is_empty() {
        HashMap::new()
    } else {
        let keys = appends.iter().map(|(key, _)| key);
        match tokio::time::timeout(OP_TIMEOUT, read_each(c, keys)).await {
            Ok(Ok(seen)) => seen,
            // Nothing was proposed.
            _ => return (TxnOutcome::Failed, mops),
        }
    };
    let compares: Vec<Compare> = appends
        .iter()
        .map(|(key, _)| {
            let rev = seen.get(key).map_or(0, |(_, rev)| *rev);
            Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)
        })
        .collect();
    let mut ops: Vec<TxnOp> = reads
        .iter()
        .map(|key| TxnOp::get(key.as_str(), None))
        .collect();
    for (key, value) in appends {
        let mut list = seen.get(key).map(|(l, _)| l.clone()).unwrap_or_default();
        list.push(*value);
        ops.push(TxnOp::put(key.as_str(), encode(&list), None));
    }
    let txn = Txn::new().when(compares).and_then(ops);
    let answer = match tokio::time::timeout(OP_TIMEOUT, c.txn(txn)).await {
        Ok(Ok(answer)) => answer,
        _ => return (TxnOutcome::Unknown, mops),
    };
    if !answer.succeeded() {
        return (TxnOutcome::Failed, mops);
    }
    let responses = answer.op_responses();
    for (i, mop) in mops.iter_mut().take(reads.len()).enumerate() {
        let list = match responses.get(i) {
            Some(TxnOpResponse::Get(g)) => match g.kvs().first() {
                None => Ok(Vec::new()),
                Some(kv) => decode(kv.value()),
            },
            _ => Err(etcd_client::Error::InvalidArgs("no get answer".into())),
        };
        match (mop, list) {
            (Mop::Read { list: slot, .. }, Ok(list)) => *slot = Some(list),
            // Committed, but what it read is unreadable: its effect stands,
            // its reads are unknown.
            _ => return (TxnOutcome::Unknown, mops),
        }
    }
    (TxnOutcome::Ok, mops)
}

/// Reads every txn key ever used (`0..keys`) after the whole-cluster
/// restart, in one range get through member 0's own port, and records it as
/// a txn of reads (client [`FINAL_READER`]). Panics with the logs if no read
/// succeeds `within`.
pub async fn read_final(
    bench: &Bench,
    clock: &History,
    log: &TxnLog,
    keys: usize,
    within: Duration,
) {
    let mut c = direct_client(&bench.cluster.members[0].endpoint()).await;
    let deadline = Instant::now() + within;
    loop {
        let invoke_ns = clock.now_ns();
        if let Ok(Ok(seen)) = tokio::time::timeout(OP_TIMEOUT, read_all(&mut c)).await {
            let mops = (0..keys)
                .map(|k| {
                    let key = txn_key(k);
                    let list = seen.get(&key).map(|(l, _)| l.clone()).unwrap_or_default();
                    Mop::Read {
                        key,
                        list: Some(list),
                    }
                })
                .collect();
            log.push(TxnRecord {
                client: FINAL_READER,
                mops,
                invoke_ns,
                complete_ns: clock.now_ns(),
                outcome: TxnOutcome::Ok,
            });
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the txn keys unreadable after the restart\n{}",
            bench.cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

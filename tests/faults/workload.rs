//! The register workload: clients reading, writing and compare-and-swapping
//! a few keys, each through its own proxies, recording every operation in
//! the history. A client sticks to one member and moves to the next after an
//! error or a timeout, as etcd's clients fail over.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::cluster::{direct_client, OP_TIMEOUT};
use super::history::{History, Outcome, Record, RegOp, RegOut};

/// Pause after a failed or unknown operation before the next one.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Values are unique across the run: each names the write that made it.
#[derive(Clone, Default)]
pub struct Values(Arc<AtomicU64>);

impl Values {
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

pub fn register_key(i: usize) -> String {
    format!("/reg/{i:02}")
}

/// What one register client does.
pub struct RegisterClient {
    pub id: usize,
    /// Its endpoints (through its proxies), one per member.
    pub endpoints: Vec<String>,
    pub keys: usize,
    pub values: Values,
    pub history: History,
    pub stop: Arc<AtomicBool>,
    pub seed: u64,
    /// Planted bug: reads are served by the member alone (serializable) but
    /// recorded as linearizable ones.
    pub serializable_reads: bool,
}

impl RegisterClient {
    pub async fn run(self) {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let mut at = self.id % self.endpoints.len();
        let mut clients: Vec<Option<etcd_client::Client>> = vec![None; self.endpoints.len()];
        // The last value and mod revision this client saw per key: CAS
        // expects one of them.
        let mut seen: Vec<Option<u64>> = vec![None; self.keys];
        let mut seen_rev: Vec<i64> = vec![0; self.keys];
        while !self.stop.load(Ordering::Relaxed) {
            if clients[at].is_none() {
                clients[at] = Some(direct_client(&self.endpoints[at]).await);
            }
            let c = clients[at].as_mut().expect("client just made");
            let k = rng.gen_range(0..self.keys);
            let key = register_key(k);
            let op = match rng.gen_range(0..10) {
                0..=3 => RegOp::Read,
                4..=6 => RegOp::Write(self.values.next()),
                7 | 8 => match seen[k] {
                    Some(expect) => RegOp::Cas {
                        expect,
                        new: self.values.next(),
                    },
                    None => RegOp::Read,
                },
                _ => match seen_rev[k] {
                    0 => RegOp::Read,
                    expect_rev => RegOp::CasRev {
                        expect_rev,
                        new: self.values.next(),
                    },
                },
            };
            let invoke_ns = self.history.now_ns();
            let outcome = match tokio::time::timeout(
                OP_TIMEOUT,
                execute(c, &key, op, self.serializable_reads),
            )
            .await
            {
                Ok(Ok(out)) => Outcome::Ok(out),
                // A read that failed had no effect; a write may have.
                _ if op == RegOp::Read => Outcome::Fail,
                _ => Outcome::Unknown,
            };
            let complete_ns = self.history.now_ns();
            match outcome {
                Outcome::Ok(
                    RegOut::Read { value, mod_rev } | RegOut::Missed { value, mod_rev },
                ) => {
                    seen[k] = value;
                    seen_rev[k] = mod_rev;
                }
                Outcome::Ok(RegOut::Written { rev } | RegOut::Swapped { rev }) => {
                    seen[k] = op.written();
                    seen_rev[k] = rev;
                }
                Outcome::Fail | Outcome::Unknown => {
                    clients[at] = None;
                    at = (at + 1) % self.endpoints.len();
                    // An error can come at once (a member down): no hot loop.
                    tokio::time::sleep(ERROR_BACKOFF).await;
                }
            }
            self.history.push(Record {
                client: self.id,
                key,
                op,
                invoke_ns,
                complete_ns,
                outcome,
            });
        }
    }
}

fn parse_value(bytes: &[u8]) -> Result<u64, etcd_client::Error> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| etcd_client::Error::InvalidArgs(format!("not a value: {bytes:?}")))
}

fn read_kv(kvs: &[etcd_client::KeyValue]) -> Result<(Option<u64>, i64), etcd_client::Error> {
    match kvs.first() {
        None => Ok((None, 0)),
        Some(kv) => Ok((Some(parse_value(kv.value())?), kv.mod_revision())),
    }
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Result<i64, etcd_client::Error> {
    h.map(|h| h.revision())
        .ok_or_else(|| etcd_client::Error::InvalidArgs("no header".into()))
}

/// Runs one register operation.
pub async fn execute(
    c: &mut etcd_client::Client,
    key: &str,
    op: RegOp,
    serializable: bool,
) -> Result<RegOut, etcd_client::Error> {
    match op {
        RegOp::Read => {
            let options = serializable.then(|| GetOptions::new().with_serializable());
            let r = c.get(key, options).await?;
            let (value, mod_rev) = read_kv(r.kvs())?;
            Ok(RegOut::Read { value, mod_rev })
        }
        RegOp::Write(v) => {
            let r = c.put(key, v.to_string(), None).await?;
            Ok(RegOut::Written {
                rev: header_revision(r.header())?,
            })
        }
        RegOp::Cas { .. } | RegOp::CasRev { .. } => {
            let (compare, new) = match op {
                RegOp::Cas { expect, new } => (
                    Compare::value(key, CompareOp::Equal, expect.to_string()),
                    new,
                ),
                RegOp::CasRev { expect_rev, new } => (
                    Compare::mod_revision(key, CompareOp::Equal, expect_rev),
                    new,
                ),
                _ => unreachable!("a CAS"),
            };
            let txn = Txn::new()
                .when([compare])
                .and_then([TxnOp::put(key, new.to_string(), None)])
                .or_else([TxnOp::get(key, None)]);
            let r = c.txn(txn).await?;
            if r.succeeded() {
                return Ok(RegOut::Swapped {
                    rev: header_revision(r.header())?,
                });
            }
            match r.op_responses().first() {
                Some(TxnOpResponse::Get(g)) => {
                    let (value, mod_rev) = read_kv(g.kvs())?;
                    Ok(RegOut::Missed { value, mod_rev })
                }
                other => Err(etcd_client::Error::InvalidArgs(format!(
                    "CAS else branch answered {other:?}"
                ))),
            }
        }
    }
}

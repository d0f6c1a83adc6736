//! What the tests of txns over several shards share: a cluster started
//! with `--shards`, the shards keys route to, and a txn sent with a bounded
//! wait whose failure is told apart as a refusal or an unknown outcome. The
//! scenarios are in `bank.rs`, `batch.rs` and `kill9.rs`.

pub(crate) mod accounts;
pub(crate) mod bank;
pub(crate) mod batch;
pub(crate) mod kill9;
pub(crate) mod ledger;
pub(crate) mod whole_watch;

use std::collections::BTreeSet;
use std::time::Duration;

use cairn::routing::RoutingTable;
use etcd_client::{Txn, TxnResponse};

use crate::common::Cluster;

/// How long one step (a request, a member catching up, the cluster taking
/// writes again) may take on a busy 2-core machine before the test gives
/// up; steps normally take well under a second.
const STEP_DEADLINE: Duration = Duration::from_secs(60);
/// How long one request may go unanswered before its outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn flags(shards: usize) -> Vec<String> {
    ["--shards", &shards.to_string(), "--cores", "1"]
        .map(String::from)
        .to_vec()
}

fn start(members: usize, shards: usize) -> Cluster {
    let flags = flags(shards);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Cluster::start(members, &flags)
}

/// The keys with the shard each routes to, for a failure's message.
pub(crate) fn placed<K: AsRef<str>>(routing: &RoutingTable, keys: &[K]) -> String {
    keys.iter()
        .map(|k| {
            let k = k.as_ref();
            format!("{k} (shard {})", routing.shard_for_key(k.as_bytes()))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn shards_of<K: AsRef<str>>(routing: &RoutingTable, keys: &[K]) -> BTreeSet<u32> {
    keys.iter()
        .map(|k| routing.shard_for_key(k.as_ref().as_bytes()))
        .collect()
}

/// Why a request failed.
#[derive(Debug)]
enum Failure {
    /// The member answered with a definite refusal (FAILED_PRECONDITION for
    /// keys spanning shards, INVALID_ARGUMENT, ...): nothing was applied,
    /// and a valid request must never get one.
    Refused(String),
    /// No answer, or one that leaves the outcome unknown (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, a broken connection): it may have been applied.
    Unknown(String),
}

impl Failure {
    fn of(e: etcd_client::Error) -> Failure {
        use tonic::Code;
        match e {
            etcd_client::Error::GRpcStatus(s) => {
                let text = format!("{:?}: {}", s.code(), s.message());
                match s.code() {
                    Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Unknown
                    | Code::Cancelled
                    | Code::Aborted
                    | Code::Internal
                    | Code::ResourceExhausted => Failure::Unknown(text),
                    _ => Failure::Refused(text),
                }
            }
            other => Failure::Unknown(other.to_string()),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(why) => write!(f, "refused: {why}"),
            Failure::Unknown(why) => write!(f, "outcome unknown: {why}"),
        }
    }
}

/// Sends `txn` and waits at most [`REQUEST_TIMEOUT`] for its answer.
async fn send_txn(c: &mut etcd_client::Client, txn: Txn) -> Result<TxnResponse, Failure> {
    match tokio::time::timeout(REQUEST_TIMEOUT, c.txn(txn)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(Failure::of(e)),
        Err(_) => Err(Failure::Unknown(format!(
            "no answer within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

fn header_revision(r: &TxnResponse) -> i64 {
    r.header().expect("a txn response has a header").revision()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

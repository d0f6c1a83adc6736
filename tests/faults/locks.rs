//! Lease-based locks, etcd's recipe, and the check that no two clients ever
//! held one at once.
//!
//! A locker grants a lease, creates the lock key with it if the key is absent
//! (the key's create revision is its fencing token), keeps the lease alive
//! while it works, writes under the fence (a txn that compares the lock key's
//! create revision with its token), and releases. It believes it holds the
//! lock from the answer of its acquire until the earliest of: its release,
//! a keep-alive or fenced write that fails, and the send time of its last
//! renewal that succeeded plus the TTL (the server counts from a later
//! moment, so a correct server never expires the lease inside that window).
//! Two holders at once is two such windows with different tokens that
//! overlap; a fenced write that commits after a later token was granted is a
//! broken fence.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::cluster::{direct_client, stream_client, OP_TIMEOUT};
use super::history::History;

pub const LOCK_KEY: &str = "/lock/bench";
const FENCED_KEY: &str = "/fenced/bench";
/// The TTL asked for; the server raises it to its minimum.
const LEASE_TTL_SECS: i64 = 2;
const RENEW_EVERY: Duration = Duration::from_millis(300);

/// One holding of the lock as its locker believed it.
#[derive(Clone, Debug)]
pub struct Hold {
    pub locker: usize,
    pub token: i64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A write made under the fence: the token it compared and its revision.
#[derive(Clone, Debug)]
pub struct Fenced {
    pub locker: usize,
    pub token: i64,
    pub rev: i64,
}

#[derive(Default)]
pub struct LockLog {
    pub holds: Mutex<Vec<Hold>>,
    pub fenced: Mutex<Vec<Fenced>>,
    /// Renewals answered with a TTL, counted per locker, as evidence of work.
    pub renewals: Mutex<Vec<(usize, u64)>>,
}

pub struct Locker {
    pub id: usize,
    /// Its endpoints, one per member it may use.
    pub endpoints: Vec<String>,
    pub history: History,
    pub log: Arc<LockLog>,
    pub stop: Arc<AtomicBool>,
    /// How long it keeps the lock once it has it.
    pub hold: Duration,
}

impl Locker {
    pub async fn run(self) {
        let mut at = self.id % self.endpoints.len();
        while !self.stop.load(Ordering::Relaxed) {
            if !self.once(&self.endpoints[at]).await {
                at = (at + 1) % self.endpoints.len();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One round: grant, try to acquire, hold, release. False when the
    /// member failed to answer (the locker moves to the next one).
    pub async fn once(&self, endpoint: &str) -> bool {
        let mut c = direct_client(endpoint).await;
        let granted_ns = self.history.now_ns();
        let Ok(Ok(grant)) =
            tokio::time::timeout(OP_TIMEOUT, c.lease_grant(LEASE_TTL_SECS, None)).await
        else {
            return false;
        };
        let (lease, ttl_ns) = (grant.id(), grant.ttl() as u64 * 1_000_000_000);
        let mut believed_until = granted_ns + ttl_ns;
        let acquire = Txn::new()
            .when([Compare::create_revision(LOCK_KEY, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                LOCK_KEY,
                self.id.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let token = match tokio::time::timeout(OP_TIMEOUT, c.txn(acquire)).await {
            Ok(Ok(r)) if r.succeeded() => r.header().map(|h| h.revision()).unwrap_or(0),
            Ok(Ok(_)) => {
                let _ = tokio::time::timeout(OP_TIMEOUT, c.lease_revoke(lease)).await;
                return true;
            }
            _ => {
                let _ = tokio::time::timeout(OP_TIMEOUT, c.lease_revoke(lease)).await;
                return false;
            }
        };
        let start_ns = self.history.now_ns();
        let mut healthy = true;
        let mut kc = stream_client(endpoint).await;
        let keep = tokio::time::timeout(OP_TIMEOUT, kc.lease_keep_alive(lease)).await;
        if let Ok(Ok((mut keeper, mut answers))) = keep {
            let until = start_ns + self.hold.as_nanos() as u64;
            while self.history.now_ns() < until && !self.stop.load(Ordering::Relaxed) {
                let sent_ns = self.history.now_ns();
                let renewed = tokio::time::timeout(OP_TIMEOUT, async {
                    keeper.keep_alive().await?;
                    answers.message().await
                })
                .await;
                match renewed {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {
                        believed_until = believed_until.max(sent_ns + ttl_ns);
                        self.log.renewals.lock().unwrap().push((self.id, sent_ns));
                    }
                    _ => {
                        healthy = false;
                        break;
                    }
                }
                if self.history.now_ns() >= believed_until {
                    break;
                }
                let fence = Txn::new()
                    .when([Compare::create_revision(LOCK_KEY, CompareOp::Equal, token)])
                    .and_then([TxnOp::put(FENCED_KEY, format!("{}:{token}", self.id), None)]);
                match tokio::time::timeout(OP_TIMEOUT, c.txn(fence)).await {
                    Ok(Ok(r)) if r.succeeded() => self.log.fenced.lock().unwrap().push(Fenced {
                        locker: self.id,
                        token,
                        rev: r.header().map(|h| h.revision()).unwrap_or(0),
                    }),
                    _ => {
                        healthy = false;
                        break;
                    }
                }
                tokio::time::sleep(RENEW_EVERY).await;
            }
        } else {
            healthy = false;
        }
        let end_ns = self.history.now_ns().min(believed_until);
        self.log.holds.lock().unwrap().push(Hold {
            locker: self.id,
            token,
            start_ns,
            end_ns: end_ns.max(start_ns),
        });
        let release = Txn::new()
            .when([Compare::create_revision(LOCK_KEY, CompareOp::Equal, token)])
            .and_then([TxnOp::delete(LOCK_KEY, None)]);
        let _ = tokio::time::timeout(OP_TIMEOUT, c.txn(release)).await;
        let _ = tokio::time::timeout(OP_TIMEOUT, c.lease_revoke(lease)).await;
        healthy
    }
}

/// Two holders at once, and fenced writes after a later token.
pub fn check(log: &LockLog) -> Vec<String> {
    let mut anomalies = Vec::new();
    let mut holds = log.holds.lock().unwrap().clone();
    holds.sort_by_key(|h| h.start_ns);
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if b.start_ns >= a.end_ns {
                continue;
            }
            if a.token != b.token {
                anomalies.push(format!(
                    "two holders: locker {} (token {}) held {:.3}-{:.3} s, locker {} (token {}) from {:.3} s",
                    a.locker,
                    a.token,
                    secs(a.start_ns),
                    secs(a.end_ns),
                    b.locker,
                    b.token,
                    secs(b.start_ns)
                ));
            }
        }
    }
    let tokens: BTreeSet<i64> = holds.iter().map(|h| h.token).collect();
    for f in log.fenced.lock().unwrap().iter() {
        let later = tokens.range(f.token + 1..).next();
        if f.rev <= f.token || later.is_some_and(|&n| f.rev > n) {
            anomalies.push(format!(
                "broken fence: locker {} wrote under token {} at revision {}, next token {later:?}",
                f.locker, f.token, f.rev
            ));
        }
    }
    anomalies
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
mod tests {
    //! Guards the lock check against missing overlapping holders or a broken
    //! fence, and against flagging holders that follow each other.

    use super::*;

    fn hold(locker: usize, token: i64, start_ns: u64, end_ns: u64) -> Hold {
        Hold {
            locker,
            token,
            start_ns,
            end_ns,
        }
    }

    #[test]
    fn holders_one_after_another_pass() {
        let log = LockLog::default();
        *log.holds.lock().unwrap() = vec![hold(0, 5, 0, 10), hold(1, 9, 10, 20)];
        *log.fenced.lock().unwrap() = vec![
            Fenced {
                locker: 0,
                token: 5,
                rev: 7,
            },
            Fenced {
                locker: 1,
                token: 9,
                rev: 12,
            },
        ];
        assert!(check(&log).is_empty());
    }

    #[test]
    fn overlapping_holders_and_broken_fences_are_caught() {
        let log = LockLog::default();
        *log.holds.lock().unwrap() = vec![hold(0, 5, 0, 15), hold(1, 9, 10, 20)];
        let found = check(&log);
        assert!(found.iter().any(|a| a.contains("two holders")), "{found:?}");

        let log = LockLog::default();
        *log.holds.lock().unwrap() = vec![hold(0, 5, 0, 10), hold(1, 9, 10, 20)];
        *log.fenced.lock().unwrap() = vec![Fenced {
            locker: 0,
            token: 5,
            rev: 11,
        }];
        let found = check(&log);
        assert!(
            found.iter().any(|a| a.contains("broken fence")),
            "{found:?}"
        );
    }
}

//! etcd's calls that require a leader. A call made with the
//! `hasleader: true` metadata (etcd's clientv3 `WithRequireLeader`, which
//! etcdctl and Kubernetes' watches use) is refused with "etcdserver: no
//! leader" while the member knows no leader for some shard, unary or
//! stream ([`LeaderLoss::refuses`], checked by the gRPC server as each call
//! opens). An open Watch, LeaseKeepAlive, Observe or health Watch stream
//! that requires one ends with that status once the member has gone
//! [`NO_LEADER_CHECKS`] election timeouts in a row without one: the client
//! then moves to another member instead of waiting on a member cut off from
//! the cluster. Calls made without it are left alone, as etcd leaves them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::ops::readiness::Readiness;
use crate::server::errors::ApiError;

/// The metadata key and value of a stream that requires a leader.
pub const METADATA_KEY: &str = "hasleader";
pub const METADATA_VALUE: &str = "true";

/// Election timeouts in a row without a leader after which the open streams
/// that require one end (etcd's `maxNoLeaderCnt`).
pub const NO_LEADER_CHECKS: u32 = 3;

/// The member's leader losses, as the streams that require a leader see
/// them. Cheap to clone: one per service.
#[derive(Debug, Clone)]
pub struct LeaderLoss {
    readiness: Arc<Readiness>,
    /// Counts the checks that found the member without a leader for
    /// `NO_LEADER_CHECKS` election timeouts or more.
    losses: watch::Receiver<u64>,
}

/// Checks the member's leaders every election timeout, for [`LeaderLoss`].
pub struct Monitor {
    readiness: Arc<Readiness>,
    losses: watch::Sender<u64>,
    every: Duration,
}

/// One stream's part: resolves [`Stream::lost`] when the member has been
/// without a leader too long, for a stream that requires one.
pub struct Stream(Option<watch::Receiver<u64>>);

impl LeaderLoss {
    /// The losses of the member whose shards' leaders `readiness` knows, and
    /// the monitor to run once, checking every `election_timeout`.
    pub fn new(readiness: Arc<Readiness>, election_timeout: Duration) -> (LeaderLoss, Monitor) {
        let (tx, rx) = watch::channel(0);
        let loss = LeaderLoss {
            readiness: readiness.clone(),
            losses: rx,
        };
        let monitor = Monitor {
            readiness,
            losses: tx,
            every: election_timeout,
        };
        (loss, monitor)
    }

    /// Whether a call made with `headers` is refused now: it requires a
    /// leader and the member knows none (etcd's interceptors' check).
    pub fn refuses(&self, headers: &http::HeaderMap) -> bool {
        requires_leader(headers) && !self.readiness.every_shard_has_leader()
    }

    /// Starts a stream opened with `metadata`: refused while the member
    /// knows no leader, when it requires one.
    pub fn open(&self, metadata: &MetadataMap) -> Result<Stream, Status> {
        if self.refuses(metadata.as_ref()) {
            return Err(no_leader());
        }
        if !requires_leader(metadata.as_ref()) {
            return Ok(Stream(None));
        }
        let mut losses = self.losses.clone();
        losses.borrow_and_update();
        Ok(Stream(Some(losses)))
    }
}

/// Whether a call's `headers` say it requires a leader.
fn requires_leader(headers: &http::HeaderMap) -> bool {
    headers
        .get(METADATA_KEY)
        .is_some_and(|v| v.as_bytes() == METADATA_VALUE.as_bytes())
}

/// The status of a call refused for want of a leader, and of a stream
/// ended by a loss.
pub fn no_leader() -> Status {
    ApiError::NoLeader.into()
}

impl Stream {
    /// Resolves once the member has gone too long without a leader after
    /// the stream opened; never for a stream that does not require one.
    pub async fn lost(&mut self) {
        let changed = match &mut self.0 {
            Some(losses) => losses.changed().await.is_ok(),
            None => false,
        };
        if !changed {
            // None required, or the monitor stopped with the member.
            std::future::pending::<()>().await;
        }
    }
}

impl Monitor {
    /// Checks until `stop` says the member stops.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut misses = 0u32;
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.every) => {}
                _ = stop.changed() => return,
            }
            if self.readiness.every_shard_has_leader() {
                misses = 0;
                continue;
            }
            misses = misses.saturating_add(1);
            if misses >= NO_LEADER_CHECKS {
                tracing::warn!(
                    election_timeouts = misses,
                    "no leader: ending the streams that require one"
                );
                self.losses.send_modify(|n| *n += 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(required: bool) -> MetadataMap {
        let mut m = MetadataMap::new();
        if required {
            m.insert(METADATA_KEY, METADATA_VALUE.parse().unwrap());
        }
        m
    }

    #[tokio::test(start_paused = true)]
    async fn streams_that_require_a_leader_end_after_three_election_timeouts_without_one() {
        let readiness = Readiness::new(&[0, 1]);
        let (loss, monitor) = LeaderLoss::new(readiness.clone(), Duration::from_secs(1));
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(monitor.run(stop));

        // No leader yet: refused if required.
        assert_eq!(
            loss.open(&metadata(true))
                .err()
                .map(|s| s.message().to_string()),
            Some("etcdserver: no leader".to_string())
        );
        readiness.set_shard_has_leader(0, true);
        readiness.set_shard_has_leader(1, true);
        let mut required = loss.open(&metadata(true)).expect("a leader is known");
        let mut plain = loss.open(&metadata(false)).expect("never refused");

        // Shard 1 loses its leader: two timeouts pass, then it has one
        // again; the count starts over.
        readiness.set_shard_has_leader(1, false);
        let lost = |s: &mut Stream| {
            let mut f = Box::pin(s.lost());
            futures::FutureExt::now_or_never(f.as_mut()).is_some()
        };
        tokio::time::sleep(Duration::from_millis(2500)).await;
        readiness.set_shard_has_leader(1, true);
        tokio::time::sleep(Duration::from_millis(3000)).await;
        assert!(!lost(&mut required));

        // Three timeouts without: the required stream ends, the other not.
        readiness.set_shard_has_leader(1, false);
        tokio::time::sleep(Duration::from_millis(3100)).await;
        assert!(lost(&mut required));
        assert!(!lost(&mut plain));
    }
}

//! The revision each shard of this member has applied up to, published by
//! the shards and read by serializable reads over several shards
//! (docs/KEYSPACE.md, "Consistent reads"): such a read is read at the
//! lowest revision its shards have all reached, a cut of the one revision
//! order, without asking any other member; one at a past revision some of
//! its shards have not reached yet waits for them, as long as some shard
//! of this member has.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::routing::ShardId;
use crate::server::errors::ApiError;

/// What each shard of this member has applied up to.
#[derive(Debug)]
pub struct Reached {
    /// Per shard: its store's revision after its last apply (0 until the
    /// shard has started).
    revisions: Vec<AtomicI64>,
    /// Reads waiting for a shard to move; the shards wake them only then.
    waiting: AtomicUsize,
    moved: Notify,
}

impl Reached {
    pub fn new(shards: usize) -> Self {
        Reached {
            revisions: (0..shards).map(|_| AtomicI64::new(0)).collect(),
            waiting: AtomicUsize::new(0),
            moved: Notify::new(),
        }
    }

    /// Shard `shard` has applied everything up to `revision`. Called by the
    /// shard's own thread; revisions only grow.
    pub fn publish(&self, shard: ShardId, revision: i64) {
        let Some(r) = self.revisions.get(shard as usize) else {
            return;
        };
        if r.fetch_max(revision, Ordering::Release) < revision
            && self.waiting.load(Ordering::Acquire) > 0
        {
            self.moved.notify_waiters();
        }
    }

    /// The lowest revision every shard of `shards` has reached; 0 if one
    /// has not started.
    pub fn cut(&self, shards: &[ShardId]) -> i64 {
        shards
            .iter()
            .map(|&s| {
                self.revisions
                    .get(s as usize)
                    .map_or(0, |r| r.load(Ordering::Acquire))
            })
            .min()
            .unwrap_or(0)
    }

    /// The highest revision a shard of this member has reached: the
    /// member's revision, past which a read is in the future.
    pub fn member_revision(&self) -> i64 {
        self.revisions
            .iter()
            .map(|r| r.load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// The highest revision a shard of `shards` has reached: every write
    /// to their keys this member has applied is at or below it.
    pub fn highest(&self, shards: &[ShardId]) -> i64 {
        shards
            .iter()
            .filter_map(|&s| self.revisions.get(s as usize))
            .map(|r| r.load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// Waits until every shard of `shards` has reached `revision`, which
    /// some shard of this member has: an idle shard is moved past it by the
    /// keyspace leader's closes. Refused with [`ApiError::FutureRev`] when
    /// no shard has, and with [`ApiError::Timeout`] after `within`.
    pub async fn wait_for(
        &self,
        shards: &[ShardId],
        revision: i64,
        within: Duration,
    ) -> Result<(), ApiError> {
        if self.cut(shards) >= revision {
            return Ok(());
        }
        if revision > self.member_revision() {
            return Err(ApiError::FutureRev);
        }
        if self.reach(shards, revision, within).await {
            Ok(())
        } else {
            Err(ApiError::Timeout)
        }
    }

    /// Before a write the keyspace leader ran elsewhere is answered here:
    /// waits until `shards` of this member applied it at `revision`, as a
    /// write this member proposes is answered once applied here, so the
    /// client's next serializable read here sees it (etcd's member answers
    /// a write once it applied it). Bounded by `within`: the write is
    /// committed, and a member that far behind answers without it (`what`
    /// names the write in the debug line that says so).
    pub async fn applied_here(
        &self,
        shards: &[ShardId],
        revision: i64,
        within: Duration,
        what: &'static str,
    ) {
        // A txn whose branch wrote nothing has nothing to wait for.
        if !shards.is_empty() && !self.reach(shards, revision, within).await {
            tracing::debug!(revision, what, "answered before this member applied it");
        }
    }

    /// Waits until every shard of `shards` has reached `revision`, whether
    /// or not any shard of this member has yet: false if they have not
    /// after `within`.
    pub async fn reach(&self, shards: &[ShardId], revision: i64, within: Duration) -> bool {
        if self.cut(shards) >= revision {
            return true;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let waited = tokio::time::timeout(within, async {
            loop {
                let moved = self.moved.notified();
                tokio::pin!(moved);
                // Registered before the check, so no move is missed.
                moved.as_mut().enable();
                if self.cut(shards) >= revision {
                    return;
                }
                moved.await;
            }
        })
        .await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        waited.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_is_the_lowest_revision_its_shards_reached() {
        let r = Reached::new(3);
        assert_eq!(r.cut(&[0, 1]), 0);
        r.publish(0, 10);
        r.publish(1, 7);
        r.publish(1, 5);
        assert_eq!(r.cut(&[0, 1]), 7);
        assert_eq!(r.cut(&[0]), 10);
        assert_eq!(r.member_revision(), 10);
        assert_eq!(r.highest(&[1, 2]), 7);
        assert_eq!(r.highest(&[0, 1]), 10);
    }

    #[tokio::test]
    async fn a_read_waits_for_a_shard_behind_the_member_and_not_past_it() {
        let r = std::sync::Arc::new(Reached::new(2));
        r.publish(0, 20);
        r.publish(1, 12);
        assert_eq!(
            r.wait_for(&[1], 21, Duration::from_secs(5)).await,
            Err(ApiError::FutureRev)
        );
        let waiting = {
            let r = r.clone();
            tokio::spawn(async move { r.wait_for(&[0, 1], 18, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "shard 1 is still at 12");
        r.publish(1, 19);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        assert_eq!(
            r.wait_for(&[1], 20, Duration::from_millis(30)).await,
            Err(ApiError::Timeout)
        );
        // A revision no shard has reached yet is waited for all the same.
        let reaching = {
            let r = r.clone();
            tokio::spawn(async move { r.reach(&[0, 1], 25, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        r.publish(0, 25);
        assert!(!reaching.is_finished(), "shard 1 is still at 19");
        r.publish(1, 26);
        assert!(reaching.await.unwrap());
        assert!(!r.reach(&[0], 30, Duration::from_millis(30)).await);
        // A write that touched no shard is not waited for.
        let none = r.applied_here(&[], 99, Duration::from_secs(5), "nothing");
        assert!(tokio::time::timeout(Duration::from_millis(500), none)
            .await
            .is_ok());
    }
}

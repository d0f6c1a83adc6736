//! Which shards the keyspace leader's txns over several shards hold, so that
//! each txn takes all of its shards at once or waits with none.
//!
//! Every hold is asked by this member (the keyspace leader), from any core.
//! Taking holds one shard after another in shard order avoids deadlock, but
//! a txn then holds its first shards while it waits for the last, and every
//! write to those shards waits with it: under load, txns queue behind each
//! other in convoys. Here a txn waits until no earlier waiter and no running
//! txn wants any of its shards, then asks all its holds at once. A shard
//! granted to a txn is never wanted by another running txn, so no two txns
//! wait for each other; and a waiter never lets a later one take a shard it
//! wants first, so none starves.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::routing::ShardId;

/// The shards held by this member's txns over several shards.
#[derive(Debug, Default)]
pub struct HoldTable {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The shards running txns hold.
    held: BTreeSet<ShardId>,
    /// Txns waiting, in arrival order: their shards, and where to say go.
    waiting: VecDeque<(Vec<ShardId>, oneshot::Sender<()>)>,
}

impl State {
    /// Lets go every waiter whose shards are free and wanted by no earlier
    /// waiter still waiting.
    fn grant(&mut self) {
        let mut wanted = BTreeSet::new();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        while let Some((shards, go)) = self.waiting.pop_front() {
            if go.is_closed() {
                // Its txn gave up (its task ended): it takes nothing.
                continue;
            }
            let free = shards
                .iter()
                .all(|s| !self.held.contains(s) && !wanted.contains(s));
            if !free {
                wanted.extend(shards.iter().copied());
                still.push_back((shards, go));
                continue;
            }
            // A waiter gone since the check above takes nothing either.
            if go.send(()).is_ok() {
                self.held.extend(shards.iter().copied());
            }
        }
        self.waiting = still;
    }

    fn put_back(&mut self, shards: &[ShardId]) {
        for s in shards {
            self.held.remove(s);
        }
    }
}

/// Shards taken for one txn; dropping it lets them go.
pub struct Taken {
    table: Arc<HoldTable>,
    shards: Vec<ShardId>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut st = self.table.lock();
        st.put_back(&self.shards);
        st.grant();
    }
}

impl HoldTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `shards` (sorted, no repeats) are all free and wanted by
    /// no earlier waiter, and takes them.
    pub async fn take(self: &Arc<Self>, shards: &[ShardId]) -> Taken {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.lock();
            st.waiting.push_back((shards.to_vec(), tx));
            st.grant();
        }
        let mut waiting = Waiting {
            table: self.clone(),
            shards: shards.to_vec(),
            rx: Some(rx),
        };
        if let Some(rx) = waiting.rx.as_mut() {
            // The sender goes only with the table, which this txn holds.
            let _ = rx.await;
        }
        waiting.rx = None;
        Taken {
            table: self.clone(),
            shards: std::mem::take(&mut waiting.shards),
        }
    }
}

/// A txn waiting for its shards. Dropped while waiting (its task ended), it
/// gives back the shards it may have been granted meanwhile.
struct Waiting {
    table: Arc<HoldTable>,
    shards: Vec<ShardId>,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            if rx.try_recv().is_ok() {
                let mut st = self.table.lock();
                st.put_back(&self.shards);
                st.grant();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn pending(rx: &mut tokio::task::JoinHandle<Taken>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), rx)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn disjoint_txns_run_together_and_overlapping_ones_wait() {
        let t = Arc::new(HoldTable::default());
        let a = t.take(&[0, 1]).await;
        let b = t.take(&[2, 3]).await;
        let t2 = t.clone();
        let mut c = tokio::spawn(async move { t2.take(&[1, 2]).await });
        assert!(pending(&mut c).await, "shards 1 and 2 are held");
        drop(a);
        assert!(pending(&mut c).await, "shard 2 is still held");
        drop(b);
        let c = c.await.unwrap();
        drop(c);
        let _all = t.take(&[0, 1, 2, 3]).await;
    }

    #[tokio::test]
    async fn a_waiter_keeps_its_shards_from_later_ones() {
        let t = Arc::new(HoldTable::default());
        let first = t.take(&[0]).await;
        let t2 = t.clone();
        // Waits for shard 0; wants shard 1 as well.
        let mut wide = tokio::spawn(async move { t2.take(&[0, 1]).await });
        assert!(pending(&mut wide).await);
        let t3 = t.clone();
        // Shard 1 is free, but the earlier waiter wants it first.
        let mut later = tokio::spawn(async move { t3.take(&[1]).await });
        assert!(pending(&mut later).await);
        // A txn wanting neither goes at once.
        let _other = t.take(&[2]).await;
        drop(first);
        let wide = wide.await.unwrap();
        assert!(pending(&mut later).await);
        drop(wide);
        later.await.unwrap();
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_takes_nothing() {
        let t = Arc::new(HoldTable::default());
        let first = t.take(&[0]).await;
        let t2 = t.clone();
        let gone = tokio::spawn(async move { t2.take(&[0, 1]).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        gone.abort();
        let _ = gone.await;
        drop(first);
        // Neither the aborted waiter nor its wish holds any shard.
        let _both = tokio::time::timeout(Duration::from_secs(5), t.take(&[0, 1]))
            .await
            .expect("the shards are free");
    }
}

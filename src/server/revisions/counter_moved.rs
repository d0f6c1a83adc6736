//! Wakes the keyspace leader's shards that stopped their close ticks once
//! the revision counter moves again.
//!
//! A shard the keyspace leader leads checks every
//! [`KEYSPACE_CLOSE_INTERVAL`](crate::server::shard::KEYSPACE_CLOSE_INTERVAL)
//! whether the counter moved past its last entry (then it proposes a close,
//! so merged watches go on). While the keyspace is idle there is nothing to
//! close, and those checks were most of an idle member's CPU (each wake-up
//! of a core is followed by its idle poll). So a shard that finds nothing
//! to close stops checking until the counter moves; the write that moves it
//! pays one load of a flag while no shard waits, and one wake-up when some
//! do.
//!
//! No move is missed: a shard first marks what it has seen, then raises the
//! flag, then (after a sequentially consistent fence) looks at the counter
//! again; a write increments (sequentially consistent), then reads the
//! flag (sequentially consistent). Either
//! the write sees the flag and wakes the shard, or the shard's second look
//! sees the write.
//!
//! Each shard has a channel of its own, woken in shard order: shards
//! sharing one channel would be woken in an order tokio draws at random
//! (its watch spreads receivers over several wake lists), and a simulated
//! member of several shards would then not replay its seed exactly.

use std::sync::atomic::{fence, AtomicBool, Ordering};

use tokio::sync::watch;

#[derive(Debug)]
pub struct CounterMoved {
    /// Some shard waits for the next move.
    waiting: AtomicBool,
    /// Counts the moves some shard waited for, one channel per shard.
    moves: Vec<watch::Sender<u64>>,
}

impl CounterMoved {
    pub fn new(shards: usize) -> Self {
        CounterMoved {
            waiting: AtomicBool::new(false),
            moves: (0..shards).map(|_| watch::Sender::new(0)).collect(),
        }
    }

    /// What `shard` waits on.
    pub fn subscribe(&self, shard: u32) -> watch::Receiver<u64> {
        self.moves[shard as usize].subscribe()
    }

    /// Before a shard stops its close ticks: the next [`moved`](Self::moved)
    /// wakes `seen`. The caller looks at the counter once more afterwards.
    pub fn wait(&self, seen: &mut watch::Receiver<u64>) {
        seen.borrow_and_update();
        self.waiting.store(true, Ordering::SeqCst);
        // The caller's second look at the counter is an acquire load: the
        // fence keeps it after the flag is raised on every architecture.
        fence(Ordering::SeqCst);
    }

    /// The counter moved (called after its increment, which must be
    /// sequentially consistent: then no fence is needed on this, the write
    /// path).
    pub fn moved(&self) {
        if self.waiting.load(Ordering::SeqCst) && self.waiting.swap(false, Ordering::SeqCst) {
            for moves in &self.moves {
                moves.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_shard_is_woken_by_the_next_move_only() {
        let c = CounterMoved::new(2);
        let mut a = c.subscribe(0);
        let mut b = c.subscribe(1);
        // Nobody waits: a move wakes nobody.
        c.moved();
        assert!(!a.has_changed().unwrap());
        c.wait(&mut a);
        c.moved();
        tokio::time::timeout(Duration::from_secs(5), a.changed())
            .await
            .expect("woken")
            .unwrap();
        // One wake-up per wait: the next move passes by.
        c.moved();
        assert!(!a.has_changed().unwrap());
        // A receiver that did not wait sees the move it was not waiting for,
        // which only costs it one early close check.
        assert!(b.has_changed().unwrap());
        b.borrow_and_update();
        c.wait(&mut b);
        c.moved();
        assert!(b.has_changed().unwrap());
    }

    #[test]
    fn a_move_between_wait_and_the_second_look_is_not_lost() {
        let c = CounterMoved::new(1);
        let mut a = c.subscribe(0);
        c.wait(&mut a);
        // The write lands before the shard's second look: the flag was up,
        // so the shard is woken even if its second look missed the write.
        c.moved();
        assert!(a.has_changed().unwrap());
    }
}

//! How a server stream (Watch, LeaseKeepAlive) ends with an error: a
//! request it could not read, or the member's lost leader.
//!
//! The client is told why after the messages already queued for it, so the
//! error goes through the stream's bounded queue. Sent with `try_send`, it
//! was lost whenever a client that had stopped reading left the queue full
//! (the stream then just ended); waited for without a bound, a client that
//! never reads held the stream's task forever. The task first lets go of
//! what it holds (a Watch stream's watchers, the rest of the request
//! body), then waits for room at most [`STREAM_ERROR_WAIT`].
//!
//! Every other message (a Watch stream's events and its answers to
//! creates, cancels and progress requests, a keep-alive's answer) goes
//! with [`send_unless_lost`]: into the queue at once when it has room, as
//! before. Only when the queue is full does the task wait for room and,
//! meanwhile, for the member's lost leader ([`Ending`] keeps what is then
//! left to tell the client). Before, a task waiting for room
//! saw the loss only once its client read again, so a Watch stream whose
//! client had stopped reading held its watches for as long as the client
//! stayed. The message the queue had no room for goes out before the
//! error. While a task waits it takes no more events, so a shard moves its
//! watchers to catch-up: their memory stays bounded.
//!
//! The stream stays a plain queue: a response stream that yields a set-aside
//! error once its queue closes was measured and raised the `watch`
//! workload's event latency (p99 higher in 7 of 7 and 4 of 6 alternating
//! rounds, BENCHMARKS.md), a cost on every event for the sake of the last
//! one.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tonic::Status;

use crate::server::api::require_leader::no_leader;

/// Longest a stream's error waits for room in its queue: a client that
/// reads nothing for this long is not told why its stream ended.
pub const STREAM_ERROR_WAIT: Duration = Duration::from_secs(30);

/// Queues `status` as the last word of the stream `tx` feeds, after what is
/// queued and after `set_aside` (a message the queue had no room for),
/// waiting at most [`STREAM_ERROR_WAIT`] for room in all; false when the
/// client went away or did not read in time.
pub async fn end_with<T>(
    tx: &mpsc::Sender<Result<T, Status>>,
    set_aside: Option<Result<T, Status>>,
    status: Status,
) -> bool {
    let code = status.code();
    let send_all = async {
        if let Some(message) = set_aside {
            tx.send(message).await.ok()?;
        }
        tx.send(Err(status)).await.ok()
    };
    let sent = matches!(
        tokio::time::timeout(STREAM_ERROR_WAIT, send_all).await,
        Ok(Some(()))
    );
    if !sent {
        tracing::debug!(
            ?code,
            "a stream ended without its error: the client went away or did not read"
        );
    }
    sent
}

/// Why a stream ends, when its client is to be told, and the message its
/// full queue had no room for when the member lost its leader.
pub struct Ending<T> {
    status: Option<Status>,
    set_aside: Option<Result<T, Status>>,
}

impl<T> Default for Ending<T> {
    fn default() -> Self {
        Ending {
            status: None,
            set_aside: None,
        }
    }
}

impl<T> Ending<T> {
    /// The stream ends with `status`.
    pub fn set(&mut self, status: Status) {
        self.status = Some(status);
    }

    /// Whether what became of a message ends the stream: its client went
    /// away, or the member lost its leader (the message is kept to go out
    /// first; a refusal is the stream's last word itself).
    pub fn ends(&mut self, sent: Sent<T>) -> bool {
        match sent {
            Sent::Queued => false,
            Sent::Gone => true,
            Sent::LeaderLost(Err(status)) => {
                self.status = Some(status);
                true
            }
            Sent::LeaderLost(message) => {
                self.set_aside = Some(message);
                self.status = Some(no_leader());
                true
            }
        }
    }

    /// Whether the client is to be told why the stream ends.
    pub fn is_set(&self) -> bool {
        self.status.is_some()
    }

    /// Tells the client, as [`end_with`] does; false when there was nothing
    /// to tell or it could not be told.
    pub async fn tell(self, tx: &mpsc::Sender<Result<T, Status>>) -> bool {
        match self.status {
            Some(status) => end_with(tx, self.set_aside, status).await,
            None => false,
        }
    }
}

/// What became of a message given to [`send_unless_lost`].
#[derive(Debug)]
pub enum Sent<T> {
    /// In the stream's queue.
    Queued,
    /// The client went away.
    Gone,
    /// The member lost its leader while the queue was full; the message is
    /// handed back, to go out before the stream's error.
    LeaderLost(Result<T, Status>),
}

/// Queues `message` on `tx`. When the queue is full, waits for room only
/// until `lost` resolves (the stream's `require_leader::Stream::lost`).
pub async fn send_unless_lost<T>(
    tx: &mpsc::Sender<Result<T, Status>>,
    message: Result<T, Status>,
    lost: impl Future<Output = ()>,
) -> Sent<T> {
    let message = match tx.try_send(message) {
        Ok(()) => return Sent::Queued,
        Err(TrySendError::Closed(_)) => return Sent::Gone,
        Err(TrySendError::Full(message)) => message,
    };
    tokio::select! {
        room = tx.reserve() => match room {
            Ok(permit) => {
                permit.send(message);
                Sent::Queued
            }
            Err(_) => Sent::Gone,
        },
        () = lost => Sent::LeaderLost(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_error_follows_every_queued_and_set_aside_message_once_the_client_reads() {
        let (tx, mut rx) = mpsc::channel::<Result<u32, Status>>(2);
        tx.send(Ok(1)).await.unwrap();
        tx.send(Ok(2)).await.unwrap();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut got = Vec::new();
            while let Some(item) = rx.recv().await {
                got.push(item.map_err(|s| s.code()));
            }
            got
        });
        let started = tokio::time::Instant::now();
        assert!(end_with(&tx, Some(Ok(3)), Status::resource_exhausted("too large")).await);
        // It waited for the reader to make room.
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(tx);
        assert_eq!(
            reader.await.unwrap(),
            vec![Ok(1), Ok(2), Ok(3), Err(tonic::Code::ResourceExhausted)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_reads_holds_the_task_for_the_wait_only() {
        let (tx, _rx) = mpsc::channel::<Result<u32, Status>>(1);
        tx.send(Ok(1)).await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(!end_with(&tx, None, Status::unavailable("no leader")).await);
        assert!(started.elapsed() >= STREAM_ERROR_WAIT);
    }

    #[tokio::test]
    async fn a_client_gone_is_not_waited_for() {
        let (tx, rx) = mpsc::channel::<Result<u32, Status>>(1);
        drop(rx);
        assert!(!end_with(&tx, None, Status::unavailable("no leader")).await);
    }

    #[tokio::test]
    async fn a_message_with_room_is_queued_without_waiting() {
        let (tx, mut rx) = mpsc::channel::<Result<u32, Status>>(1);
        let sent = send_unless_lost(&tx, Ok(7), std::future::pending()).await;
        assert!(matches!(sent, Sent::Queued), "{sent:?}");
        assert_eq!(rx.recv().await.map(Result::ok), Some(Some(7)));
    }

    #[tokio::test]
    async fn a_full_queue_is_waited_for_until_the_client_reads() {
        let (tx, mut rx) = mpsc::channel::<Result<u32, Status>>(1);
        tx.send(Ok(1)).await.unwrap();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut got = Vec::new();
            while let Some(m) = rx.recv().await {
                got.push(m.ok());
            }
            got
        });
        let sent = send_unless_lost(&tx, Ok(2), std::future::pending()).await;
        assert!(matches!(sent, Sent::Queued), "{sent:?}");
        drop(tx);
        assert_eq!(reader.await.unwrap(), vec![Some(1), Some(2)]);
    }

    #[tokio::test]
    async fn a_lost_leader_ends_the_wait_for_room_and_hands_the_message_back() {
        let (tx, mut rx) = mpsc::channel::<Result<u32, Status>>(1);
        tx.send(Ok(1)).await.unwrap();
        let (lose, lost) = tokio::sync::oneshot::channel::<()>();
        let sending = tokio::spawn(async move {
            let sent = send_unless_lost(&tx, Ok(2), async {
                let _ = lost.await;
            })
            .await;
            (sent, tx)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sending.is_finished(), "it did not wait for room");
        lose.send(()).unwrap();
        let (sent, tx) = sending.await.unwrap();
        let Sent::LeaderLost(back) = sent else {
            panic!("{sent:?}");
        };
        assert_eq!(back.ok(), Some(2));
        // Nothing was queued meanwhile: the client still has only the first.
        drop(tx);
        assert_eq!(rx.recv().await.map(Result::ok), Some(Some(1)));
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_client_gone_while_waiting_ends_the_wait() {
        let (tx, rx) = mpsc::channel::<Result<u32, Status>>(1);
        tx.send(Ok(1)).await.unwrap();
        let closing = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(rx);
        });
        let sent = send_unless_lost(&tx, Ok(2), std::future::pending()).await;
        assert!(matches!(sent, Sent::Gone), "{sent:?}");
        closing.await.unwrap();
    }
}

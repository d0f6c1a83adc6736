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
//! This bounds the wait for the error only. A stream's task that is
//! sending an ordinary message to a client that does not read waits for
//! room without a bound, and meanwhile reads neither requests nor the
//! leader's loss (its watchers are bounded in memory: a shard moves a
//! watcher whose stream queue is full to catch-up).
//!
//! The stream stays a plain queue: a response stream that yields a set-aside
//! error once its queue closes was measured and raised the `watch`
//! workload's event latency (p99 higher in 7 of 7 and 4 of 6 alternating
//! rounds, BENCHMARKS.md), a cost on every event for the sake of the last
//! one.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Status;

/// Longest a stream's error waits for room in its queue: a client that
/// reads nothing for this long is not told why its stream ended.
pub const STREAM_ERROR_WAIT: Duration = Duration::from_secs(30);

/// Queues `status` as the last word of the stream `tx` feeds, after what is
/// queued, waiting at most [`STREAM_ERROR_WAIT`] for room; false when the
/// client went away or did not read in time.
pub async fn end_with<T>(tx: &mpsc::Sender<Result<T, Status>>, status: Status) -> bool {
    let code = status.code();
    let sent = matches!(
        tokio::time::timeout(STREAM_ERROR_WAIT, tx.send(Err(status))).await,
        Ok(Ok(()))
    );
    if !sent {
        tracing::debug!(
            ?code,
            "a stream ended without its error: the client went away or did not read"
        );
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_error_follows_every_queued_message_once_the_client_reads() {
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
        assert!(end_with(&tx, Status::resource_exhausted("too large")).await);
        // It waited for the reader to make room.
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(tx);
        assert_eq!(
            reader.await.unwrap(),
            vec![Ok(1), Ok(2), Err(tonic::Code::ResourceExhausted)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_reads_holds_the_task_for_the_wait_only() {
        let (tx, _rx) = mpsc::channel::<Result<u32, Status>>(1);
        tx.send(Ok(1)).await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(!end_with(&tx, Status::unavailable("no leader")).await);
        assert!(started.elapsed() >= STREAM_ERROR_WAIT);
    }

    #[tokio::test]
    async fn a_client_gone_is_not_waited_for() {
        let (tx, rx) = mpsc::channel::<Result<u32, Status>>(1);
        drop(rx);
        assert!(!end_with(&tx, Status::unavailable("no leader")).await);
    }
}

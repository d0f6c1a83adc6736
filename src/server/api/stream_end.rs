//! A response stream whose last word needs no room in its queue.
//!
//! A server stream (Watch, LeaseKeepAlive) that ends with an error, a
//! request it could not read or the member's lost leader, must tell the
//! client why, after the messages already queued for it. With the error
//! sent through the stream's bounded queue, a client that stops reading
//! either lost it (the queue was full and the error was not waited for) or
//! held the stream's task, and what the task holds, until it read again.
//! Here the error is set aside ([`StreamEnd::fail`]) and the stream yields
//! it once the queue is drained and closed, so the task ends at once and
//! the error is never dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::Status;

/// The messages of a stream, then the error its task ended it with, if
/// any.
#[derive(Debug)]
pub struct EndingStream<T> {
    items: ReceiverStream<Result<T, Status>>,
    end: Option<oneshot::Receiver<Status>>,
}

/// How a stream's task ends it with an error. Dropped unused, the stream
/// ends without one once its queue is drained.
#[derive(Debug)]
pub struct StreamEnd(oneshot::Sender<Status>);

impl StreamEnd {
    /// Ends the stream with `status` after the messages queued before the
    /// queue's senders are dropped.
    pub fn fail(self, status: Status) {
        // The client went away: no one is left to tell.
        let _ = self.0.send(status);
    }
}

/// A stream of at most `capacity` queued messages: its sender, its end,
/// and the stream the service answers with.
pub fn channel<T>(
    capacity: usize,
) -> (mpsc::Sender<Result<T, Status>>, StreamEnd, EndingStream<T>) {
    let (tx, rx) = mpsc::channel(capacity);
    let (end_tx, end_rx) = oneshot::channel();
    (
        tx,
        StreamEnd(end_tx),
        EndingStream {
            items: ReceiverStream::new(rx),
            end: Some(end_rx),
        },
    )
}

impl<T> Stream for EndingStream<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(item) = ready!(Pin::new(&mut self.items).poll_next(cx)) {
            return Poll::Ready(Some(item));
        }
        let Some(end) = self.end.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = ready!(Pin::new(end).poll(cx));
        self.end = None;
        Poll::Ready(ended.ok().map(Err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn the_error_follows_every_queued_message_even_with_the_queue_full() {
        let (tx, end, mut stream) = channel::<u32>(2);
        tx.send(Ok(1)).await.unwrap();
        tx.send(Ok(2)).await.unwrap();
        assert!(tx.try_send(Ok(3)).is_err(), "the queue is full");
        end.fail(Status::resource_exhausted("too large"));
        drop(tx);
        assert_eq!(stream.next().await.unwrap().unwrap(), 1);
        assert_eq!(stream.next().await.unwrap().unwrap(), 2);
        let e = stream.next().await.unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(stream.next().await.is_none());
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn without_an_error_the_stream_ends_after_its_messages() {
        let (tx, end, mut stream) = channel::<u32>(2);
        tx.send(Ok(7)).await.unwrap();
        drop(end);
        drop(tx);
        assert_eq!(stream.next().await.unwrap().unwrap(), 7);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn the_error_waits_for_the_queue_to_close() {
        let (tx, end, mut stream) = channel::<u32>(2);
        end.fail(Status::unavailable("no leader"));
        // A sender still open: the stream waits for more messages.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), stream.next());
        assert!(waiting.await.is_err());
        tx.send(Ok(4)).await.unwrap();
        drop(tx);
        assert_eq!(stream.next().await.unwrap().unwrap(), 4);
        assert_eq!(
            stream.next().await.unwrap().unwrap_err().code(),
            tonic::Code::Unavailable
        );
    }
}

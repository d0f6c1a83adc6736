//! The receiving end of a shard's commands: one bounded channel from each
//! core of the member (made by the keyspace layer's router,
//! `keyspace::router::command_channels`), taken from in turn by the shard's
//! driver. Below both, so that neither the router nor the driver depends on
//! the other.

use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::server::command::ShardCommand;

/// A shard's commands: one channel from each core, taken from in turn so no
/// core's queue waits behind another's.
#[derive(Debug)]
pub struct CommandInbox {
    from_cores: Vec<mpsc::Receiver<ShardCommand>>,
    /// The channel looked at first next time.
    next: usize,
}

impl CommandInbox {
    pub fn new(from_cores: Vec<mpsc::Receiver<ShardCommand>>) -> CommandInbox {
        CommandInbox {
            from_cores,
            next: 0,
        }
    }

    /// The next command from any core; None once every sender is gone.
    pub async fn recv(&mut self) -> Option<ShardCommand> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<ShardCommand>> {
        let n = self.from_cores.len();
        let mut closed = 0;
        for i in 0..n {
            let k = (self.next + i) % n;
            match self.from_cores[k].poll_recv(cx) {
                Poll::Ready(Some(cmd)) => {
                    self.next = (k + 1) % n;
                    return Poll::Ready(Some(cmd));
                }
                Poll::Ready(None) => closed += 1,
                Poll::Pending => {}
            }
        }
        if closed == n {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    /// A command already queued on any channel, without waiting.
    pub fn try_recv(&mut self) -> Option<ShardCommand> {
        let n = self.from_cores.len();
        for i in 0..n {
            let k = (self.next + i) % n;
            if let Ok(cmd) = self.from_cores[k].try_recv() {
                self.next = (k + 1) % n;
                return Some(cmd);
            }
        }
        None
    }
}

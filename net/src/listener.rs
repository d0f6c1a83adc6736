//! The per-member listener on the peer port.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::handshake::{accept_handshake, AcceptPolicy, Accepted, HandshakeError};

/// Pause after a failed `accept` (say, out of file descriptors) before trying
/// again, so the loop does not spin.
pub const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// Accepts peer connections and runs their handshakes concurrently (a peer
/// that never finishes its greeting holds up no one), at most
/// `max_pending_handshakes` at a time. Returns only connections whose greeting
/// was accepted, as [`Accepted`]: `Send`, not bound to any runtime, so the
/// caller can pass each to the core owning `hello.lane`.
#[derive(Debug)]
pub struct PeerListener {
    listener: TcpListener,
    policy: Arc<AcceptPolicy>,
    pending: JoinSet<Result<Accepted, HandshakeError>>,
}

impl PeerListener {
    /// Binds the peer port.
    pub async fn bind(addr: SocketAddr, policy: AcceptPolicy) -> io::Result<Self> {
        policy
            .config
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(Self::from_listener(TcpListener::bind(addr).await?, policy))
    }

    /// Wraps a listener bound elsewhere (say, passed in by systemd).
    pub fn from_listener(listener: TcpListener, policy: AcceptPolicy) -> Self {
        Self {
            listener,
            policy: Arc::new(policy),
            pending: JoinSet::new(),
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection whose handshake succeeded. Failed and refused
    /// handshakes are logged (once each) and skipped, as are failed accepts.
    /// Cancel-safe.
    pub async fn accept(&mut self) -> Accepted {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (stream, peer_addr) = match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of descriptors or a connection reset before
                            // it was taken: pause, and keep the listener.
                            tracing::warn!(
                                local_member = self.policy.config.member_id,
                                %error,
                                "accepting a peer connection failed; retrying"
                            );
                            tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
                            continue;
                        }
                    };
                    if self.pending.len() >= self.policy.config.max_pending_handshakes {
                        tracing::warn!(
                            local_member = self.policy.config.member_id,
                            %peer_addr,
                            pending = self.pending.len(),
                            "too many handshakes in progress; closing new peer connection"
                        );
                        continue;
                    }
                    let policy = self.policy.clone();
                    self.pending.spawn(async move { accept_handshake(stream, &policy).await });
                }
                Some(joined) = self.pending.join_next(), if !self.pending.is_empty() => {
                    match joined {
                        Ok(Ok(accepted)) => return accepted,
                        Ok(Err(_)) => {} // logged by accept_handshake
                        Err(err) => tracing::error!(
                            local_member = self.policy.config.member_id,
                            error = %err,
                            "peer handshake task failed"
                        ),
                    }
                }
            }
        }
    }
}

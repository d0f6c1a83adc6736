//! The per-member listener on the peer port.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

use bytes::Bytes;
use tokio::io::AsyncReadExt;

use crate::handshake::{
    accept_greeting, accept_handshake, apply_socket_options, AcceptPolicy, Accepted,
    AcceptedStream, HandshakeError,
};
use crate::tls::{OtherStream, PeerSocket, PeerTls, Prefixed};

/// Bytes peeked at the start of a connection to decide whether it is a peer
/// connection or another protocol sharing the port (see
/// [`PeerListener::with_other_protocol`]).
pub const SNIFF_BYTES: usize = 4;

/// What arrived on the peer port.
#[derive(Debug)]
pub enum Incoming {
    /// A peer whose greeting was accepted.
    Peer(Accepted),
    /// A connection the sniffer claimed for another protocol, unread (on a
    /// TLS port: the session, with its first bytes replayed).
    Other {
        stream: OtherStream,
        peer_addr: SocketAddr,
    },
}

/// Decides from a connection's first [`SNIFF_BYTES`] bytes (fewer if the
/// connection ended) whether it speaks another protocol.
pub type Sniffer = fn(&[u8]) -> bool;

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
    pending: JoinSet<Result<Incoming, HandshakeError>>,
    other: Option<Sniffer>,
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
            other: None,
        }
    }

    /// Shares the port with another protocol: connections whose first bytes
    /// `sniffer` claims are returned by [`Self::accept_any`] unread, instead
    /// of being refused as garbage. The sniffing waits at most the handshake
    /// timeout for the first bytes.
    pub fn with_other_protocol(mut self, sniffer: Sniffer) -> Self {
        self.other = Some(sniffer);
        self
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection whose handshake succeeded. Failed and refused
    /// handshakes are logged (once each) and skipped, as are failed accepts.
    /// Cancel-safe.
    pub async fn accept(&mut self) -> Accepted {
        loop {
            if let Incoming::Peer(accepted) = self.accept_any().await {
                return accepted;
            }
        }
    }

    /// The next peer connection whose handshake succeeded, or a connection
    /// for the other protocol (see [`Self::with_other_protocol`]). Cancel-safe.
    pub async fn accept_any(&mut self) -> Incoming {
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
                    let other = self.other;
                    self.pending.spawn(async move {
                        if let Some(tls) = policy.config.tls.clone() {
                            return accept_tls(stream, peer_addr, &policy, &tls, other).await;
                        }
                        if let Some(sniffer) = other {
                            if sniff(&stream, &policy, sniffer).await {
                                let stream = OtherStream::Plain(stream);
                                return Ok(Incoming::Other { stream, peer_addr });
                            }
                        }
                        accept_handshake(stream, &policy).await.map(Incoming::Peer)
                    });
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

/// Peeks at the first bytes of `stream` (without consuming them) and asks
/// `sniffer`. A connection that sends nothing (or too little) within the
/// handshake timeout is left to the handshake, which then refuses or times
/// out and logs it.
async fn sniff(stream: &tokio::net::TcpStream, policy: &AcceptPolicy, sniffer: Sniffer) -> bool {
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(policy.config.handshake_timeout_ms);
    let mut buf = [0u8; SNIFF_BYTES];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) | Err(_) => return false,
        };
        if n == 0 {
            return false;
        }
        if n == SNIFF_BYTES {
            return sniffer(&buf);
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        // Part of the prefix is in: peek returns at once until more arrives.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// How long [`crate::TlsSource::check_accepted`] may take (name lookups
/// against a slow resolver), apart from the handshake's own timeout.
const ACCEPT_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The accept side on a TLS port: the TLS handshake (a connection that is not
/// TLS, or whose certificate the config refuses, ends here), then the first
/// plaintext bytes decide between the peer greeting and the other protocol.
async fn accept_tls(
    stream: tokio::net::TcpStream,
    peer_addr: SocketAddr,
    policy: &AcceptPolicy,
    tls: &PeerTls,
    other: Option<Sniffer>,
) -> Result<Incoming, HandshakeError> {
    let config = &policy.config;
    let io_err = |source| HandshakeError::Io { peer_addr, source };
    apply_socket_options(&stream, config).map_err(io_err)?;
    let timeout = Duration::from_millis(config.handshake_timeout_ms);
    let timed_out = || HandshakeError::Timeout {
        peer_addr,
        timeout_ms: config.handshake_timeout_ms,
    };
    let log = |error: &HandshakeError| {
        tracing::warn!(local_member = config.member_id, %peer_addr, %error, "peer TLS handshake failed");
    };
    let handshake = async {
        let server_config = tls
            .0
            .server_config()
            .map_err(|detail| HandshakeError::Tls { peer_addr, detail })?;
        tokio_rustls::TlsAcceptor::from(server_config)
            .accept(PeerSocket::new(stream))
            .await
            .map_err(|e| HandshakeError::Tls {
                peer_addr,
                detail: e.to_string(),
            })
    };
    let session = match tokio::time::timeout(timeout, handshake).await {
        Ok(result) => result,
        Err(_) => Err(timed_out()),
    }
    .inspect_err(log)?;
    // The source's check of the connection (its certificate against its
    // address), with a bound of its own: it may wait for name lookups.
    let leaf = session
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.clone().into_owned());
    match tokio::time::timeout(ACCEPT_CHECK_TIMEOUT, tls.0.check_accepted(leaf, peer_addr)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(detail)) => Err(HandshakeError::Tls { peer_addr, detail }),
        Err(_) => Err(HandshakeError::Tls {
            peer_addr,
            detail: format!(
                "the check of the peer's certificate took over {} s",
                ACCEPT_CHECK_TIMEOUT.as_secs()
            ),
        }),
    }
    .inspect_err(log)?;
    let started = async {
        let mut session = Box::new(session);
        session
            .get_mut()
            .1
            .set_buffer_limit(Some(crate::tls::SEND_BUFFER_BYTES));
        let mut prefix = [0u8; SNIFF_BYTES];
        let mut n = 0;
        while n < SNIFF_BYTES {
            match session.read(&mut prefix[n..]).await.map_err(io_err)? {
                0 => break,
                read => n += read,
            }
        }
        Ok((session, prefix, n))
    };
    let started = match tokio::time::timeout(timeout, started).await {
        Ok(result) => result,
        Err(_) => Err(timed_out()),
    };
    let (session, prefix, n) = started.inspect_err(log)?;
    if let Some(sniffer) = other {
        if n == SNIFF_BYTES && sniffer(&prefix) {
            let stream = OtherStream::Tls(Prefixed::new(Bytes::copy_from_slice(&prefix), session));
            return Ok(Incoming::Other { stream, peer_addr });
        }
    }
    let mut io = Prefixed::new(Bytes::copy_from_slice(&prefix[..n]), session);
    let hello = accept_greeting(&mut io, peer_addr, policy).await?;
    // The greeting is longer than the replayed prefix, so nothing is left of it.
    let Ok(mut session) = io.into_inner() else {
        return Err(HandshakeError::Malformed {
            peer_addr,
            kind: crate::frame::FrameKind::Hello,
            len_bytes: n,
        });
    };
    session.get_mut().0.detach().map_err(io_err)?;
    Ok(Incoming::Peer(Accepted {
        hello,
        peer_addr,
        stream: AcceptedStream::Tls(session),
    }))
}

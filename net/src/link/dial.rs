//! Dialing and redialing: the peer target, connecting (TCP, TLS, greeting),
//! and the supervisor that reconnects with capped, jittered backoff.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::connection::{run_connection, Connection};
use super::{CloseReason, Counters, Inbound, InboundReceiver, Link, LinkShared};
use crate::config::{Config, ConfigError};
use crate::handshake::{apply_socket_options, dial_greeting};
use crate::tls::PeerSocket;

/// Exponential backoff with a cap and "equal jitter": each delay is uniform in
/// `[d/2, d]` where `d` doubles per failure from `initial_ms` up to `max_ms`,
/// so members that lost each other at once do not redial in lockstep.
#[derive(Debug)]
pub struct Backoff {
    initial_ms: u64,
    max_ms: u64,
    failures: u32,
    rng: SmallRng,
}

/// A connection that lasted this long resets the reconnect backoff.
pub const STABLE_CONNECTION_MS: u64 = 1_000;

/// Doublings after which the delay is certainly at its cap (2^32 x initial).
const BACKOFF_MAX_DOUBLINGS: u32 = 32;

impl Backoff {
    pub fn new(initial_ms: u64, max_ms: u64, seed: u64) -> Self {
        assert!(
            initial_ms > 0 && initial_ms <= max_ms,
            "backoff {initial_ms}..{max_ms} ms"
        );
        Self {
            initial_ms,
            max_ms,
            failures: 0,
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay_ms(&mut self) -> u64 {
        let doublings = self.failures.min(BACKOFF_MAX_DOUBLINGS);
        let ceiling = self
            .initial_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_ms);
        self.failures = self.failures.saturating_add(1);
        self.rng.gen_range(ceiling / 2..=ceiling)
    }

    /// Forget past failures (after a successful connection).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Where a link dials: an address, or a `host:port` looked up again before
/// every connection attempt (a peer's name may not resolve yet when the link
/// starts, and may resolve elsewhere after the peer moves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerTarget {
    Addr(SocketAddr),
    HostPort(String),
}

impl From<SocketAddr> for PeerTarget {
    fn from(addr: SocketAddr) -> Self {
        PeerTarget::Addr(addr)
    }
}

impl std::fmt::Display for PeerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerTarget::Addr(a) => a.fmt(f),
            PeerTarget::HostPort(h) => f.write_str(h),
        }
    }
}

/// Dials `peer_member` at `target` for `lane` and keeps the link up: reconnects
/// with capped, jittered exponential backoff until [`Link::close`] or until the
/// receiver is dropped. Frames queued while disconnected wait (within the
/// queue limits) for the next connection. A host name is looked up off the
/// core's thread, before every attempt.
///
/// Must be called on a `LocalSet` (the core's runtime): the link is `!Send`.
pub fn dial(
    config: &Config,
    peer_member: u64,
    target: impl Into<PeerTarget>,
    lane: u32,
) -> Result<(Link, InboundReceiver), ConfigError> {
    config.validate()?;
    let shared = Rc::new(LinkShared::new(config.clone(), peer_member, lane));
    let (tx, rx) = mpsc::channel(config.inbound_queue_batches);
    tokio::task::spawn_local(supervise(shared.clone(), target.into(), tx));
    Ok((
        Link { shared },
        InboundReceiver {
            rx,
            current: Vec::new().into_iter(),
        },
    ))
}

async fn connect(shared: &LinkShared, target: &PeerTarget) -> Result<Connection, String> {
    let config = &shared.config;
    // tokio resolves a name on its blocking pool and tries each address.
    let connecting = async {
        match target {
            PeerTarget::Addr(a) => TcpStream::connect(a).await,
            PeerTarget::HostPort(h) => TcpStream::connect(h.as_str()).await,
        }
    };
    let mut stream =
        tokio::time::timeout(Duration::from_millis(config.connect_timeout_ms), connecting)
            .await
            .map_err(|_| format!("connect timed out after {} ms", config.connect_timeout_ms))?
            .map_err(|e| format!("connect: {e}"))?;
    apply_socket_options(&stream, config).map_err(|e| format!("socket options: {e}"))?;
    let peer_addr = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let Some(tls) = &config.tls else {
        dial_greeting(
            &mut stream,
            peer_addr,
            config,
            shared.peer_member,
            shared.lane,
        )
        .await
        .map_err(|e| e.to_string())?;
        return Ok(Connection::Plain(stream));
    };
    let server_name = match target {
        PeerTarget::Addr(a) => rustls::pki_types::ServerName::IpAddress(a.ip().into()),
        PeerTarget::HostPort(h) => crate::tls::server_name_of(h)?,
    };
    let client_config = tls.0.client_config()?;
    let handshake = tokio_rustls::TlsConnector::from(client_config)
        .connect(server_name, PeerSocket::new(stream));
    let mut session = tokio::time::timeout(
        Duration::from_millis(config.handshake_timeout_ms),
        handshake,
    )
    .await
    .map_err(|_| {
        format!(
            "TLS handshake timed out after {} ms",
            config.handshake_timeout_ms
        )
    })?
    .map_err(|e| format!("TLS handshake: {e}"))?;
    session
        .get_mut()
        .1
        .set_buffer_limit(Some(crate::tls::SEND_BUFFER_BYTES));
    dial_greeting(
        &mut session,
        peer_addr,
        config,
        shared.peer_member,
        shared.lane,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(Connection::TlsClient(Box::new(session)))
}

async fn supervise(shared: Rc<LinkShared>, target: PeerTarget, tx: mpsc::Sender<Vec<Inbound>>) {
    let seed =
        rand::random::<u64>() ^ shared.config.member_id.rotate_left(17) ^ u64::from(shared.lane);
    let mut backoff = Backoff::new(
        shared.config.backoff_initial_ms,
        shared.config.backoff_max_ms,
        seed,
    );
    let mut ever_connected = false;
    let mut failing = false;
    while !shared.closed.get() {
        match connect(&shared, &target).await {
            Ok(stream) => {
                let addr = stream.peer_addr();
                if ever_connected {
                    Counters::add(&shared.counters.reconnects, 1);
                }
                ever_connected = true;
                failing = false;
                tracing::info!(
                    local_member = shared.config.member_id,
                    peer_member = shared.peer_member,
                    lane = shared.lane,
                    peer = %target,
                    peer_addr = %addr.map_or_else(String::new, |a| a.to_string()),
                    "connected to peer"
                );
                shared.set_connected(true, addr);
                let connected_at = tokio::time::Instant::now();
                let reason = run_connection(&shared, stream, &tx).await;
                shared.set_connected(false, None);
                shared.log_close(&reason);
                // Only a connection that lasted forgives past failures: a peer
                // that accepts and at once drops us (or sends garbage) is
                // redialed with growing delays, not in a tight loop.
                if connected_at.elapsed() >= Duration::from_millis(STABLE_CONNECTION_MS) {
                    backoff.reset();
                }
                if matches!(reason, CloseReason::LocalClose) {
                    break;
                }
            }
            Err(error) => {
                Counters::add(&shared.counters.connect_failures, 1);
                // One line when a streak of failures begins; the rest at debug
                // so a dead peer does not flood the log.
                if failing {
                    tracing::debug!(local_member = shared.config.member_id, peer_member = shared.peer_member, lane = shared.lane, peer = %target, %error, "peer still unreachable");
                } else {
                    tracing::warn!(local_member = shared.config.member_id, peer_member = shared.peer_member, lane = shared.lane, peer = %target, %error, "peer unreachable; retrying with backoff");
                }
                failing = true;
            }
        }
        let delay_ms = backoff.next_delay_ms();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
            _ = wait_closed(&shared) => {}
        }
    }
    shared.close();
}

async fn wait_closed(shared: &LinkShared) {
    while !shared.closed.get() {
        shared.state_wake.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_jitters_and_resets() {
        let mut backoff = Backoff::new(10, 1000, 42);
        let delays: Vec<u64> = (0..12).map(|_| backoff.next_delay_ms()).collect();
        for (i, d) in delays.iter().enumerate() {
            let ceiling = (10u64 << i.min(32)).min(1000);
            assert!(
                *d >= ceiling / 2 && *d <= ceiling,
                "delay {i} = {d}, ceiling {ceiling}"
            );
        }
        assert!(
            delays[11] >= 500,
            "capped delays stay near the cap: {delays:?}"
        );
        backoff.reset();
        assert!(backoff.next_delay_ms() <= 10);
        for _ in 0..100 {
            assert!(backoff.next_delay_ms() <= 1000);
        }
    }
}

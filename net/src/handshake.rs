//! The handshake that opens every connection, and the accept side's hand-off.
//!
//! The dialer sends `Hello` and waits; it sends nothing else until the answer
//! arrives, so the acceptor reads exactly the Hello and no byte beyond it. That
//! is what lets an accepted connection leave the listener's runtime as a plain
//! `std::net::TcpStream` ([`Accepted`]) and be bound to the runtime of the core
//! owning its lane, with nothing left behind in a buffer. Over TLS the same
//! greeting runs inside the session, and the session itself (its state and
//! any buffered bytes) travels with the socket ([`AcceptedStream::Tls`]).

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use socket2::{SockRef, TcpKeepalive};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::Config;
use crate::frame::{
    check_crc, decode_header_any_version, encode_header, header_version, FrameError, FrameKind,
    HEADER_BYTES, VERSION,
};

/// Largest payload of any handshake frame; a greeting announcing more is garbage.
pub const HANDSHAKE_MAX_PAYLOAD_BYTES: u32 = 512;
/// Longest refusal text carried on the wire.
pub const REFUSAL_DETAIL_MAX_BYTES: usize = 256;

const HELLO_CLUSTER_OFFSET: usize = 0;
const HELLO_MEMBER_OFFSET: usize = HELLO_CLUSTER_OFFSET + 8;
const HELLO_TARGET_OFFSET: usize = HELLO_MEMBER_OFFSET + 8;
const HELLO_LANE_OFFSET: usize = HELLO_TARGET_OFFSET + 8;
const HELLO_BYTES: usize = HELLO_LANE_OFFSET + 4;

const ACCEPT_CLUSTER_OFFSET: usize = 0;
const ACCEPT_MEMBER_OFFSET: usize = ACCEPT_CLUSTER_OFFSET + 8;
const ACCEPT_BYTES: usize = ACCEPT_MEMBER_OFFSET + 8;

const REFUSE_REASON_OFFSET: usize = 0;
const REFUSE_MEMBER_OFFSET: usize = REFUSE_REASON_OFFSET + 1;
const REFUSE_DETAIL_OFFSET: usize = REFUSE_MEMBER_OFFSET + 8;

const _: () = assert!(HELLO_BYTES == 28);
const _: () = assert!(
    REFUSE_DETAIL_OFFSET + REFUSAL_DETAIL_MAX_BYTES <= HANDSHAKE_MAX_PAYLOAD_BYTES as usize
);

/// What a dialer announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Wire version of the dialer.
    pub version: u8,
    pub cluster_id: u64,
    /// The dialing member.
    pub member_id: u64,
    /// The member the dialer believes it reached.
    pub target_member_id: u64,
    /// The lane (group of shards on one core) this connection serves.
    pub lane: u32,
}

/// Why an acceptor refused a greeting. Numbers are on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefuseReason {
    WrongCluster,
    UnknownMember,
    WrongTarget,
    VersionMismatch,
    UnknownLane,
    /// A code this build does not know (a newer peer).
    Other(u8),
}

impl RefuseReason {
    fn code(self) -> u8 {
        match self {
            Self::WrongCluster => 1,
            Self::UnknownMember => 2,
            Self::WrongTarget => 3,
            Self::VersionMismatch => 4,
            Self::UnknownLane => 5,
            Self::Other(code) => code,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            1 => Self::WrongCluster,
            2 => Self::UnknownMember,
            3 => Self::WrongTarget,
            4 => Self::VersionMismatch,
            5 => Self::UnknownLane,
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::WrongCluster => f.write_str("wrong cluster id"),
            Self::UnknownMember => f.write_str("unknown member"),
            Self::WrongTarget => f.write_str("connection meant for another member"),
            Self::VersionMismatch => f.write_str("wire version mismatch"),
            Self::UnknownLane => f.write_str("unknown lane"),
            Self::Other(code) => write!(f, "refusal code {code}"),
        }
    }
}

/// Why a handshake failed. The connection is closed in every case.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HandshakeError {
    #[error("handshake with {peer_addr}: {source}")]
    Io {
        peer_addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("handshake with {peer_addr} timed out after {timeout_ms} ms")]
    Timeout {
        peer_addr: SocketAddr,
        timeout_ms: u64,
    },
    #[error("handshake with {peer_addr}: {source}")]
    BadFrame {
        peer_addr: SocketAddr,
        #[source]
        source: FrameError,
    },
    #[error("handshake with {peer_addr}: unexpected {kind:?} frame")]
    UnexpectedKind {
        peer_addr: SocketAddr,
        kind: FrameKind,
    },
    #[error("handshake with {peer_addr}: malformed {kind:?} payload of {len_bytes} bytes")]
    Malformed {
        peer_addr: SocketAddr,
        kind: FrameKind,
        len_bytes: usize,
    },
    /// This member refused the peer's greeting.
    #[error(
        "member {local_member} refused member {peer_member} at {peer_addr}: {reason} ({detail})"
    )]
    RefusedPeer {
        local_member: u64,
        peer_member: u64,
        peer_addr: SocketAddr,
        reason: RefuseReason,
        detail: String,
    },
    /// The peer refused this member's greeting.
    #[error(
        "member {peer_member} at {peer_addr} refused member {local_member}: {reason} ({detail})"
    )]
    RefusedByPeer {
        local_member: u64,
        peer_member: u64,
        peer_addr: SocketAddr,
        reason: RefuseReason,
        detail: String,
    },
    /// The TLS handshake failed (a certificate not signed by the trusted CA,
    /// no certificate where one is required, plaintext on a TLS port, ...).
    #[error("TLS handshake with {peer_addr}: {detail}")]
    Tls {
        peer_addr: SocketAddr,
        detail: String,
    },
    /// The peer accepted but is not who the dialer meant to reach.
    #[error("member {local_member} dialed member {expected_member} at {peer_addr} but reached member {found_member} of cluster {found_cluster}")]
    WrongPeer {
        local_member: u64,
        expected_member: u64,
        found_member: u64,
        found_cluster: u64,
        peer_addr: SocketAddr,
    },
}

/// Members this member accepts connections from. Shared by the listener and
/// whoever applies membership changes; cheap to clone, `Send + Sync`.
#[derive(Debug, Clone, Default)]
pub struct MemberSet {
    inner: Arc<RwLock<HashSet<u64>>>,
}

impl MemberSet {
    pub fn new(members: impl IntoIterator<Item = u64>) -> Self {
        Self {
            inner: Arc::new(RwLock::new(members.into_iter().collect())),
        }
    }

    pub fn insert(&self, member_id: u64) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(member_id);
    }

    pub fn remove(&self, member_id: u64) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&member_id);
    }

    pub fn contains(&self, member_id: u64) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&member_id)
    }
}

/// What the accept side checks a greeting against.
#[derive(Debug, Clone)]
pub struct AcceptPolicy {
    /// Cluster id, member id, timeouts and socket options come from here.
    pub config: Config,
    /// Members allowed to connect.
    pub members: MemberSet,
    /// Lanes this member serves; a greeting for lane `>= lane_count` is refused.
    pub lane_count: u32,
}

/// A connection whose greeting was accepted, not yet bound to any runtime.
/// `Send`: the listener's thread passes it to the core owning `hello.lane`,
/// which turns it into a link with [`crate::serve_accepted`].
#[derive(Debug)]
pub struct Accepted {
    pub hello: Hello,
    pub peer_addr: SocketAddr,
    /// Non-blocking, options set, handshake fully consumed.
    pub stream: AcceptedStream,
}

/// The socket of an [`Accepted`] connection, detached from every runtime.
#[derive(Debug)]
pub enum AcceptedStream {
    Plain(std::net::TcpStream),
    /// A TLS session over a detached [`crate::tls::PeerSocket`]; the core
    /// that takes it attaches the socket to its own runtime.
    Tls(Box<crate::tls::ServerTlsStream>),
}

/// Sets TCP_NODELAY, keepalive and TCP_USER_TIMEOUT as configured.
pub fn apply_socket_options(stream: &TcpStream, config: &Config) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = SockRef::from(stream);
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_millis(config.keepalive_idle_ms))
        .with_interval(Duration::from_millis(config.keepalive_interval_ms))
        .with_retries(config.keepalive_retries);
    sock.set_tcp_keepalive(&keepalive)?;
    sock.set_tcp_user_timeout(Some(Duration::from_millis(config.tcp_user_timeout_ms)))?;
    Ok(())
}

struct RawFrame {
    kind: FrameKind,
    version: u8,
    payload: Bytes,
}

async fn read_handshake_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer_addr: SocketAddr,
) -> Result<RawFrame, HandshakeError> {
    let io_err = |source| HandshakeError::Io { peer_addr, source };
    let mut frame = vec![0u8; HEADER_BYTES];
    stream.read_exact(&mut frame).await.map_err(io_err)?;
    let header_bytes: &[u8; HEADER_BYTES] = frame[..].try_into().expect("header-sized vec");
    let version = header_version(header_bytes);
    // The small handshake maximum is checked before the payload is read, so a
    // stranger cannot make us reserve more than HANDSHAKE_MAX_PAYLOAD_BYTES.
    let header = decode_header_any_version(header_bytes, HANDSHAKE_MAX_PAYLOAD_BYTES, 0)
        .map_err(|source| HandshakeError::BadFrame { peer_addr, source })?;
    frame.resize(HEADER_BYTES + header.payload_len_bytes as usize, 0);
    stream
        .read_exact(&mut frame[HEADER_BYTES..])
        .await
        .map_err(io_err)?;
    check_crc(&header, &frame, 0)
        .map_err(|source| HandshakeError::BadFrame { peer_addr, source })?;
    Ok(RawFrame {
        kind: header.kind,
        version,
        payload: Bytes::from(frame).slice(HEADER_BYTES..),
    })
}

async fn write_handshake_frame<S: AsyncWrite + Unpin>(
    stream: &mut S,
    peer_addr: SocketAddr,
    kind: FrameKind,
    payload: Vec<u8>,
) -> Result<(), HandshakeError> {
    let payload = Bytes::from(payload);
    let header = encode_header(kind, 0, 0, std::slice::from_ref(&payload));
    let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(&payload);
    let io_err = |source| HandshakeError::Io { peer_addr, source };
    stream.write_all(&frame).await.map_err(io_err)?;
    // A TLS session holds written bytes until flushed.
    stream.flush().await.map_err(io_err)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

fn encode_hello(hello: &Hello) -> Vec<u8> {
    let mut out = Vec::with_capacity(HELLO_BYTES);
    out.extend_from_slice(&hello.cluster_id.to_le_bytes());
    out.extend_from_slice(&hello.member_id.to_le_bytes());
    out.extend_from_slice(&hello.target_member_id.to_le_bytes());
    out.extend_from_slice(&hello.lane.to_le_bytes());
    debug_assert_eq!(out.len(), HELLO_BYTES);
    out
}

async fn with_timeout<T>(
    timeout_ms: u64,
    peer_addr: SocketAddr,
    fut: impl std::future::Future<Output = Result<T, HandshakeError>>,
) -> Result<T, HandshakeError> {
    tokio::time::timeout(Duration::from_millis(timeout_ms), fut)
        .await
        .map_err(|_| HandshakeError::Timeout {
            peer_addr,
            timeout_ms,
        })?
}

/// Runs the accept side of the handshake on a freshly accepted socket: reads
/// the greeting, checks cluster id, version, member and lane, answers, and on
/// success returns the socket ready to be handed to the core owning the lane.
/// A refusal is answered on the wire and logged once, naming both members.
pub async fn accept_handshake(
    mut stream: TcpStream,
    policy: &AcceptPolicy,
) -> Result<Accepted, HandshakeError> {
    let peer_addr = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    apply_socket_options(&stream, &policy.config)
        .map_err(|source| HandshakeError::Io { peer_addr, source })?;
    let hello = accept_greeting(&mut stream, peer_addr, policy).await?;
    let stream = stream
        .into_std()
        .map_err(|source| HandshakeError::Io { peer_addr, source })?;
    Ok(Accepted {
        hello,
        peer_addr,
        stream: AcceptedStream::Plain(stream),
    })
}

/// The accept side of the greeting on any stream (plain TCP, or the TLS
/// session on top of it): reads the greeting, checks cluster id, version,
/// member and lane, and answers.
pub(crate) async fn accept_greeting<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer_addr: SocketAddr,
    policy: &AcceptPolicy,
) -> Result<Hello, HandshakeError> {
    let config = &policy.config;
    let hello = with_timeout(config.handshake_timeout_ms, peer_addr, async {
        let raw = read_handshake_frame(stream, peer_addr).await?;
        if raw.kind != FrameKind::Hello {
            return Err(HandshakeError::UnexpectedKind { peer_addr, kind: raw.kind });
        }
        if raw.payload.len() != HELLO_BYTES {
            return Err(HandshakeError::Malformed {
                peer_addr,
                kind: raw.kind,
                len_bytes: raw.payload.len(),
            });
        }
        let p = &raw.payload;
        Ok(Hello {
            version: raw.version,
            cluster_id: u64_at(p, HELLO_CLUSTER_OFFSET),
            member_id: u64_at(p, HELLO_MEMBER_OFFSET),
            target_member_id: u64_at(p, HELLO_TARGET_OFFSET),
            lane: u32_at(p, HELLO_LANE_OFFSET),
        })
    })
    .await
    .inspect_err(|err| {
        tracing::warn!(local_member = config.member_id, %peer_addr, error = %err, "peer handshake failed");
    })?;

    let refusal = if hello.version != VERSION {
        Some((
            RefuseReason::VersionMismatch,
            format!(
                "peer speaks version {}, member {} speaks {VERSION}",
                hello.version, config.member_id
            ),
        ))
    } else if hello.cluster_id != config.cluster_id {
        Some((
            RefuseReason::WrongCluster,
            format!(
                "peer cluster {:#x}, member {} is in cluster {:#x} (members of \
                 one cluster start with the same --initial-cluster, \
                 --initial-cluster-token and --shards)",
                hello.cluster_id, config.member_id, config.cluster_id
            ),
        ))
    } else if hello.target_member_id != config.member_id {
        Some((
            RefuseReason::WrongTarget,
            format!(
                "peer dialed member {}, this is member {}",
                hello.target_member_id, config.member_id
            ),
        ))
    } else if !policy.members.contains(hello.member_id) {
        Some((
            RefuseReason::UnknownMember,
            format!(
                "member {} is not in member {}'s membership",
                hello.member_id, config.member_id
            ),
        ))
    } else if hello.lane >= policy.lane_count {
        Some((
            RefuseReason::UnknownLane,
            format!(
                "lane {} requested, member {} serves {} lanes",
                hello.lane, config.member_id, policy.lane_count
            ),
        ))
    } else {
        None
    };

    if let Some((reason, mut detail)) = refusal {
        tracing::warn!(
            local_member = config.member_id,
            local_cluster = config.cluster_id,
            peer_member = hello.member_id,
            peer_cluster = hello.cluster_id,
            peer_version = hello.version,
            lane = hello.lane,
            %peer_addr,
            %reason,
            detail = %detail,
            "refused peer handshake"
        );
        detail.truncate(floor_char_boundary(&detail, REFUSAL_DETAIL_MAX_BYTES));
        let mut payload = Vec::with_capacity(REFUSE_DETAIL_OFFSET + detail.len());
        payload.push(reason.code());
        payload.extend_from_slice(&config.member_id.to_le_bytes());
        payload.extend_from_slice(detail.as_bytes());
        // Best effort: the refusal is already logged here, and the peer learns
        // of it from the closed connection even if this write fails.
        let _ = with_timeout(
            config.handshake_timeout_ms,
            peer_addr,
            write_handshake_frame(stream, peer_addr, FrameKind::HelloRefuse, payload),
        )
        .await;
        return Err(HandshakeError::RefusedPeer {
            local_member: config.member_id,
            peer_member: hello.member_id,
            peer_addr,
            reason,
            detail,
        });
    }

    let mut payload = Vec::with_capacity(ACCEPT_BYTES);
    payload.extend_from_slice(&config.cluster_id.to_le_bytes());
    payload.extend_from_slice(&config.member_id.to_le_bytes());
    with_timeout(
        config.handshake_timeout_ms,
        peer_addr,
        write_handshake_frame(stream, peer_addr, FrameKind::HelloAccept, payload),
    )
    .await?;
    tracing::debug!(local_member = config.member_id, peer_member = hello.member_id, lane = hello.lane, %peer_addr, "accepted peer connection");
    Ok(hello)
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// Runs the dial side of the handshake: greets `peer_member` for `lane` and
/// waits for the answer. A refusal is logged once, naming both members.
pub async fn dial_handshake(
    stream: &mut TcpStream,
    config: &Config,
    peer_member: u64,
    lane: u32,
) -> Result<(), HandshakeError> {
    let peer_addr = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    dial_greeting(stream, peer_addr, config, peer_member, lane).await
}

/// The dial side of the greeting on any stream (plain TCP, or the TLS
/// session on top of it).
pub(crate) async fn dial_greeting<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    peer_addr: SocketAddr,
    config: &Config,
    peer_member: u64,
    lane: u32,
) -> Result<(), HandshakeError> {
    let hello = Hello {
        version: VERSION,
        cluster_id: config.cluster_id,
        member_id: config.member_id,
        target_member_id: peer_member,
        lane,
    };
    let result = with_timeout(config.handshake_timeout_ms, peer_addr, async {
        write_handshake_frame(stream, peer_addr, FrameKind::Hello, encode_hello(&hello)).await?;
        let raw = read_handshake_frame(stream, peer_addr).await?;
        let p = &raw.payload;
        match raw.kind {
            FrameKind::HelloAccept if p.len() == ACCEPT_BYTES => {
                let found_cluster = u64_at(p, ACCEPT_CLUSTER_OFFSET);
                let found_member = u64_at(p, ACCEPT_MEMBER_OFFSET);
                if found_cluster != config.cluster_id || found_member != peer_member {
                    return Err(HandshakeError::WrongPeer {
                        local_member: config.member_id,
                        expected_member: peer_member,
                        found_member,
                        found_cluster,
                        peer_addr,
                    });
                }
                Ok(())
            }
            FrameKind::HelloRefuse if p.len() >= REFUSE_DETAIL_OFFSET => {
                Err(HandshakeError::RefusedByPeer {
                    local_member: config.member_id,
                    peer_member: u64_at(p, REFUSE_MEMBER_OFFSET),
                    peer_addr,
                    reason: RefuseReason::from_code(p[REFUSE_REASON_OFFSET]),
                    detail: String::from_utf8_lossy(&p[REFUSE_DETAIL_OFFSET..]).into_owned(),
                })
            }
            kind @ (FrameKind::HelloAccept | FrameKind::HelloRefuse) => {
                Err(HandshakeError::Malformed {
                    peer_addr,
                    kind,
                    len_bytes: p.len(),
                })
            }
            kind => Err(HandshakeError::UnexpectedKind { peer_addr, kind }),
        }
    })
    .await;
    if let Err(err) = &result {
        tracing::warn!(
            local_member = config.member_id,
            peer_member,
            lane,
            %peer_addr,
            error = %err,
            "outbound peer handshake failed"
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuse_codes_round_trip() {
        for reason in [
            RefuseReason::WrongCluster,
            RefuseReason::UnknownMember,
            RefuseReason::WrongTarget,
            RefuseReason::VersionMismatch,
            RefuseReason::UnknownLane,
            RefuseReason::Other(77),
        ] {
            assert_eq!(RefuseReason::from_code(reason.code()), reason);
        }
    }

    #[test]
    fn member_set_tracks_changes() {
        let set = MemberSet::new([1, 2]);
        assert!(set.contains(2));
        set.remove(2);
        set.insert(3);
        assert!(!set.contains(2));
        assert!(set.contains(3));
    }

    #[test]
    fn refusal_text_is_cut_on_a_char_boundary() {
        let s = "é".repeat(200);
        let end = floor_char_boundary(&s, REFUSAL_DETAIL_MAX_BYTES);
        assert!(end <= REFUSAL_DETAIL_MAX_BYTES && s.is_char_boundary(end));
    }
}

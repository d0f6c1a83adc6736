//! Cairn's peer transport: framed TCP connections between members, without
//! copying payloads.
//!
//! - [`frame`]: the wire format (`net/FORMAT.md`) and the zero-copy decoder.
//! - [`handshake`]: the greeting that opens each connection (cluster id, member
//!   id, lane), refusals, and the accept side's hand-off of a connection to the
//!   core that owns its lane ([`Accepted`]).
//! - [`link`]: one connection per (peer member, lane): bounded send queue with
//!   immediate refusal when full, vectored coalesced writes, zero-copy reads,
//!   reconnect with capped jittered backoff, counters.
//! - [`stream`]: flow-controlled, checksummed large transfers (snapshots).
//! - [`PeerListener`]: the per-member listener on the peer port.
//! - [`tls`]: the same protocol inside a rustls session ([`Config::tls`]).
//!
//! Links run on one core's single-threaded runtime (current-thread tokio
//! runtime plus `LocalSet`); their internals are `!Send` by design.
//!
//! # How the daemon uses it
//!
//! ```no_run
//! use bytes::Bytes;
//! use cairn_net::{dial, serve_accepted, AcceptPolicy, Config, Inbound, MemberSet, PeerListener};
//!
//! # async fn example(peer_addr: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config { cluster_id: 7, member_id: 1, ..Config::default() };
//! config.validate()?;
//!
//! // The listener thread: one per member on the peer port.
//! let policy = AcceptPolicy { config: config.clone(), members: MemberSet::new([2, 3]), lane_count: 4 };
//! let mut listener = PeerListener::bind("127.0.0.1:2380".parse()?, policy).await?;
//! let accepted = listener.accept().await; // handshake done; `Send`
//! // ... send `accepted` to the core owning `accepted.hello.lane`; there:
//! let (reply_link, mut inbound) = serve_accepted(accepted, &config)?;
//! while let Some(item) = inbound.recv().await {
//!     if let Inbound::Message { shard_id, payload, .. } = item {
//!         // payload: a slice of the receive buffer; decode the Raft message from it
//!         let _ = (shard_id, payload);
//!     }
//! }
//!
//! // Each core: one outbound link per peer for its lane; reconnects by itself.
//! let (link, _replies) = dial(&config, 2, peer_addr, 0)?;
//! match link.send(5, 0, Bytes::from_static(b"raft message")) {
//!     Ok(()) => {}
//!     Err(e) => tracing::debug!(error = %e, "dropped; raft will retry"),
//! }
//! let metrics = link.counters().snapshot();
//! # let _ = (reply_link, metrics); Ok(()) }
//! ```

pub mod config;
pub mod frame;
pub mod handshake;
pub mod link;
pub mod listener;
pub mod stream;
pub mod tls;

pub use config::{Config, ConfigError};
pub use frame::{Frame, FrameDecoder, FrameError, FrameKind, HEADER_BYTES};
pub use handshake::{
    accept_handshake, AcceptPolicy, Accepted, AcceptedStream, HandshakeError, Hello, MemberSet,
    RefuseReason,
};
pub use link::{
    dial, serve_accepted, Backoff, CloseReason, Counters, CountersSnapshot, Inbound,
    InboundReceiver, Link, PeerTarget, SendError, ServeError,
};
pub use listener::{Incoming, PeerListener, Sniffer, SNIFF_BYTES};
pub use stream::{BytesSource, StreamAbortReason, StreamError, StreamReport, StreamSource};
pub use tls::{OtherStream, PeerSocket, PeerTls, Prefixed, TlsSource};

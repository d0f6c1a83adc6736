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
//!
//! Links run on one core's single-threaded runtime (current-thread tokio
//! runtime plus `LocalSet`); their internals are `!Send` by design.

pub mod config;
pub mod frame;
pub mod handshake;
pub mod link;
pub mod listener;
pub mod stream;

pub use config::{Config, ConfigError};
pub use frame::{Frame, FrameDecoder, FrameError, FrameKind, HEADER_BYTES};
pub use handshake::{
    accept_handshake, AcceptPolicy, Accepted, HandshakeError, Hello, MemberSet, RefuseReason,
};
pub use link::{
    dial, serve_accepted, Backoff, CloseReason, Counters, CountersSnapshot, Inbound,
    InboundReceiver, Link, SendError, ServeError,
};
pub use listener::PeerListener;
pub use stream::{BytesSource, StreamAbortReason, StreamError, StreamReport, StreamSource};

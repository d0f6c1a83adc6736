//! Why a member could not start.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the member could not start; each variant keeps the error it came
/// from as its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("data dir {dir}: {reason}")]
    DataDir { dir: PathBuf, reason: String },
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("auth state: {0}")]
    Auth(#[from] crate::server::auth_state::AuthLoadError),
    #[error("metrics registry: {0}")]
    Metrics(#[from] crate::ops::metrics::MetricsError),
    #[error("--listen-metrics-urls: {0}")]
    MetricsListener(#[source] crate::ops::http::HttpError),
    /// A socket, thread or runtime the member needs could not be set up.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("core {core}: opening its WAL: {source}")]
    Wal {
        core: usize,
        #[source]
        source: cairn_wal::OpenError,
    },
    #[error("{0}")]
    Shard(#[from] crate::server::shard::ShardOpenError),
    #[error("member {member:x}: {reason}")]
    Peer { member: u64, reason: String },
}

impl StartError {
    /// An I/O failure while setting up `what`.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> StartError {
        move |source| StartError::Io { what, source }
    }
}

//! Why a member could not start.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the member could not start.
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
    #[error("{0}")]
    Other(String),
}

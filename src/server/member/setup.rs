//! What the member's configuration asks of its parts, built before its
//! cores start: each WAL lane's settings, the TLS sources of its ports, and
//! its listening sockets.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::config::{Config, WalBackendChoice, WalSyncMode};
use crate::server::member::start_error::StartError;

pub(super) fn wal_config(config: &Config, lane: usize) -> cairn_wal::Config {
    let mut wal = cairn_wal::Config::new(config.data_dir.join("wal").join(format!("lane-{lane}")));
    wal.segment_size_bytes = config.wal.segment_size_bytes;
    wal.disk_faults = config.test_disk_faults.clone();
    wal.max_shards = config.shards.max(1);
    wal.max_record_payload_bytes = wal
        .max_record_payload_bytes
        .max(config.max_request_bytes + 64 * 1024);
    let direct = if config.wal.direct_io {
        cairn_wal::DirectIo::Auto
    } else {
        cairn_wal::DirectIo::Off
    };
    let uring = cairn_wal::UringOptions {
        direct,
        sync_mode: match config.wal.sync_mode {
            WalSyncMode::Fdatasync => cairn_wal::SyncMode::Fdatasync,
            WalSyncMode::Linked => cairn_wal::SyncMode::LinkedFdatasync,
            WalSyncMode::Dsync => cairn_wal::SyncMode::RwfDsync,
        },
        ..cairn_wal::UringOptions::default()
    };
    let sync = cairn_wal::SyncOptions {
        direct: config.wal.direct_io,
        ..cairn_wal::SyncOptions::default()
    };
    wal.backend = match config.wal.backend {
        WalBackendChoice::Auto => cairn_wal::BackendChoice::UringOr(uring, sync),
        WalBackendChoice::Sync => cairn_wal::BackendChoice::Sync(sync),
        WalBackendChoice::Uring => cairn_wal::BackendChoice::Uring(uring),
    };
    wal
}

/// The TLS sources of the client and peer ports, loaded (or, with auto TLS,
/// made) before anything else, so a bad certificate or key stops the start
/// with the flag and file named.
pub(super) fn start_tls(
    config: &Config,
) -> Result<
    (
        Option<Arc<crate::tls::CertSource>>,
        Option<cairn_net::PeerTls>,
    ),
    StartError,
> {
    use crate::tls::{port_source, PortUse, Side};
    // One port's source: its listen URLs (https or not, as `https` says)
    // and their addresses, and whether this member dials https:// URLs of
    // that kind.
    let source = |side, tls, https: &[bool], addrs: &[SocketAddr], dials_https| {
        let hosts: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
        let count = |want: bool| https.iter().filter(|&&h| h == want).count();
        port_source(
            side,
            tls,
            &PortUse {
                https_urls: count(true),
                http_urls: count(false),
                dials_https,
                hosts: &hosts,
                data_dir: &config.data_dir,
                cipher_suites: &config.cipher_suites,
            },
        )
    };
    let client = source(
        Side::Client,
        &config.client_tls,
        &config.listen_client_https,
        &config.listen_client_addrs,
        false,
    )?;
    let dials_https = config
        .initial_cluster
        .iter()
        .flat_map(|m| m.peer_urls.iter())
        .chain(config.initial_advertise_peer_urls.iter())
        .any(|u| crate::config::url_is_https(u));
    let peer = source(
        Side::Peer,
        &config.peer_tls,
        &config.listen_peer_https,
        &config.listen_peer_addrs,
        dials_https,
    )?;
    Ok((client, peer.map(cairn_net::PeerTls::from)))
}

/// Fails when another socket listens on `addr`. The cores' listeners share
/// their port through SO_REUSEPORT, which another process of the same user
/// could join as well: the kernel would then spread this member's clients
/// over both processes without a word. A plain bind first, closed at once,
/// finds such a listener (any socket listening on the port, with
/// SO_REUSEPORT or without) and the start is refused instead.
pub(super) fn check_port_free(addr: SocketAddr) -> std::io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    std::net::TcpListener::bind(addr).map(drop)
}

pub(super) fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let domain = if addr.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

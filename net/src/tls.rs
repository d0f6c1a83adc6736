//! TLS on peer connections: the framed protocol runs unchanged inside a
//! rustls session.
//!
//! Where the configs come from is the caller's business ([`TlsSource`]): the
//! daemon re-reads its certificate files when they change, so each handshake
//! asks for the config anew. Both sides of a TLS connection run the TLS
//! handshake first, then the peer handshake (`Hello`) inside it.
//!
//! An accepted connection leaves the listener's runtime for the core owning
//! its lane (see [`crate::Accepted`]). A tokio socket is bound to the runtime
//! that registered it, so the TLS session travels with a [`PeerSocket`] that
//! can be detached from one runtime (as a `std::net::TcpStream`) and attached
//! to another, while rustls's session state (keys, sequence numbers, any
//! buffered bytes) moves along inside the `TlsStream`.
//!
//! Back of the envelope: a record is at most 16 KiB; AES-GCM on a core with
//! AES-NI seals a few GB/s, so the cost over plaintext is mostly one extra
//! copy per side (rustls encrypts into its own buffer, so the vectored,
//! no-copy write of entry data becomes a copy into records) and the per-record
//! overhead (29 bytes in TLS 1.3) on small frames.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Where a member's peer TLS configs come from. Asked once per handshake, so
/// an implementation can re-read certificate files that changed.
pub trait TlsSource: Send + Sync + 'static {
    /// The config for the next accepted connection.
    fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String>;
    /// The config for the next dialed connection.
    fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String>;
    /// Checks an accepted connection once its handshake is done, before
    /// anything is read from it: `leaf` is the certificate the peer
    /// presented (if asked for one), `peer_addr` where it connected from.
    /// An error ends the connection as a failed handshake. By default every
    /// connection the config accepted passes.
    fn check_accepted(
        &self,
        leaf: Option<CertificateDer<'static>>,
        peer_addr: SocketAddr,
    ) -> AcceptCheck {
        let _ = (leaf, peer_addr);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// What [`TlsSource::check_accepted`] decides, perhaps after a lookup.
pub type AcceptCheck = Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Encrypted bytes a session may hold before a write waits for the socket.
/// rustls's default (64 KiB) makes every vectored write of a batch stop at
/// one 64 KiB frame; at 1 MiB one write carries a batch as in clear.
pub const SEND_BUFFER_BYTES: usize = 1 << 20;

/// A shared [`TlsSource`]; two handles are equal when they share the source.
#[derive(Clone)]
pub struct PeerTls(pub Arc<dyn TlsSource>);

impl PeerTls {
    pub fn new(source: impl TlsSource) -> Self {
        PeerTls(Arc::new(source))
    }
}

impl<T: TlsSource> From<Arc<T>> for PeerTls {
    fn from(source: Arc<T>) -> Self {
        PeerTls(source)
    }
}

impl PartialEq for PeerTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PeerTls {}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

/// The name a dialer checks the peer's certificate against: the host of the
/// address it dials (`host:port`, `[v6]:port` or an address), as an HTTPS
/// client checks the host of its URL.
pub fn server_name_of(host_port: &str) -> Result<ServerName<'static>, String> {
    let host = match host_port.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => host_port,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is not a name a certificate can be checked against: {e}"))
}

enum SocketState {
    Bound(TcpStream),
    Detached(std::net::TcpStream),
    Gone,
}

/// A TCP socket that can leave one runtime and join another while a TLS
/// session sits on top of it. Reads and writes work only while attached.
pub struct PeerSocket {
    state: SocketState,
}

impl std::fmt::Debug for PeerSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            SocketState::Bound(_) => "bound",
            SocketState::Detached(_) => "detached",
            SocketState::Gone => "gone",
        };
        f.debug_struct("PeerSocket").field("state", &state).finish()
    }
}

fn not_attached() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "peer socket is not attached to this runtime",
    )
}

impl PeerSocket {
    pub fn new(stream: TcpStream) -> Self {
        PeerSocket {
            state: SocketState::Bound(stream),
        }
    }

    /// Leaves the current runtime: the socket is deregistered and kept as a
    /// plain, non-blocking `std` socket until [`Self::attach`].
    pub fn detach(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.state, SocketState::Gone) {
            SocketState::Bound(s) => {
                self.state = SocketState::Detached(s.into_std()?);
                Ok(())
            }
            other => {
                self.state = other;
                Ok(())
            }
        }
    }

    /// Joins the runtime of the calling thread.
    pub fn attach(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.state, SocketState::Gone) {
            SocketState::Detached(s) => {
                self.state = SocketState::Bound(TcpStream::from_std(s)?);
                Ok(())
            }
            other => {
                self.state = other;
                Ok(())
            }
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match &self.state {
            SocketState::Bound(s) => s.peer_addr(),
            SocketState::Detached(s) => s.peer_addr(),
            SocketState::Gone => Err(not_attached()),
        }
    }

    fn bound(&mut self) -> io::Result<&mut TcpStream> {
        match &mut self.state {
            SocketState::Bound(s) => Ok(s),
            _ => Err(not_attached()),
        }
    }
}

impl AsyncRead for PeerSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().bound() {
            Ok(s) => Pin::new(s).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for PeerSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().bound() {
            Ok(s) => Pin::new(s).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().bound() {
            Ok(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().bound() {
            Ok(s) => Pin::new(s).poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().bound() {
            Ok(s) => Pin::new(s).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// The server side of a peer TLS session.
pub type ServerTlsStream = tokio_rustls::server::TlsStream<PeerSocket>;
/// The client side of a peer TLS session.
pub type ClientTlsStream = tokio_rustls::client::TlsStream<PeerSocket>;

/// A connection that leaves the listener for another protocol sharing the
/// peer port (see [`crate::PeerListener::with_other_protocol`]): plain TCP,
/// unread, or a TLS session whose first plaintext bytes are replayed.
pub enum OtherStream {
    Plain(TcpStream),
    Tls(crate::Prefixed<Box<ServerTlsStream>>),
}

impl std::fmt::Debug for OtherStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OtherStream::Plain(s) => f.debug_tuple("Plain").field(s).finish(),
            OtherStream::Tls(_) => f.write_str("Tls"),
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            OtherStream::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            OtherStream::Tls($s) => {
                let $s = Pin::new($s);
                $e
            }
        }
    };
}

impl AsyncRead for OtherStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for OtherStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

/// A stream whose first bytes were already read: they are replayed before
/// the rest. Writes go straight through.
pub struct Prefixed<S> {
    prefix: bytes::Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: bytes::Bytes, inner: S) -> Self {
        Prefixed { prefix, inner }
    }

    /// The stream, once every replayed byte has been read.
    pub fn into_inner(self) -> Result<S, Self> {
        if self.prefix.is_empty() {
            Ok(self.inner)
        } else {
            Err(self)
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let head = self.prefix.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_dialed_host() {
        assert!(matches!(
            server_name_of("127.0.0.1:2380").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name_of("[::1]:2380").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert_eq!(
            server_name_of("cairn-b.example:2380").unwrap(),
            ServerName::try_from("cairn-b.example").unwrap()
        );
        assert!(server_name_of("bad name:1").is_err());
    }
}

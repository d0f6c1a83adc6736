//! The client port's TLS: the handshake comes first, then the same sniffing
//! as in clear (HTTP/2 to gRPC, anything else to HTTP/1), on the decrypted
//! bytes.
//!
//! A connection that is not TLS (plaintext gRPC, `curl http://`, garbage)
//! fails the handshake and is closed; so does one without the client
//! certificate the port requires, or with one not signed by its CA. At most
//! [`MAX_PENDING_HANDSHAKES`] handshakes run at once per listener, each for at
//! most [`HANDSHAKE_TIMEOUT`]; more connections are closed at once, so a flood
//! of half-open handshakes costs bounded memory and leaves the served
//! connections alone.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tonic::transport::server::Connected;

use super::CertSource;

/// Handshakes in progress at once on one client listener.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// Longest a TLS handshake may take on the client port.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A client connection: in clear or over TLS.
pub enum ClientConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for ClientConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientConn::Plain(s) => f.debug_tuple("Plain").field(s).finish(),
            ClientConn::Tls(s) => f.debug_tuple("Tls").field(s.get_ref().0).finish(),
        }
    }
}

/// The TLS of one client listener.
#[derive(Debug, Clone)]
pub struct ClientPortTls {
    source: Arc<CertSource>,
    pending: Arc<Semaphore>,
}

impl ClientPortTls {
    pub fn new(source: Arc<CertSource>) -> Self {
        ClientPortTls {
            source,
            pending: Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES)),
        }
    }

    /// Runs the server side of the handshake on an accepted connection.
    pub async fn accept(&self, stream: TcpStream) -> Result<ClientConn, String> {
        let Ok(_permit) = self.pending.clone().try_acquire_owned() else {
            return Err(format!(
                "{MAX_PENDING_HANDSHAKES} TLS handshakes already in progress; closing"
            ));
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(self.source.server_config());
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(session)) => Ok(ClientConn::Tls(Box::new(session))),
            Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
            Err(_) => Err(format!(
                "TLS handshake not done within {HANDSHAKE_TIMEOUT:?}"
            )),
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            ClientConn::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            ClientConn::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for ClientConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientConn::Plain(s) => s.is_write_vectored(),
            ClientConn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

/// What the gRPC services learn about a client connection: its address, and
/// with mutual TLS the common name of its verified certificate (the user of
/// requests without a token under `--client-cert-auth`, as in etcd).
#[derive(Debug, Clone)]
pub struct ClientConnInfo {
    pub remote_addr: Option<std::net::SocketAddr>,
    pub common_name: Option<String>,
}

impl Connected for ClientConn {
    type ConnectInfo = ClientConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            ClientConn::Plain(s) => ClientConnInfo {
                remote_addr: s.peer_addr().ok(),
                common_name: None,
            },
            ClientConn::Tls(s) => {
                let (tcp, session) = s.get_ref();
                ClientConnInfo {
                    remote_addr: tcp.peer_addr().ok(),
                    common_name: session
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .and_then(|leaf| super::checks::common_name(leaf.as_ref())),
                }
            }
        }
    }
}

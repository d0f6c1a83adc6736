//! One connection: its socket (plain TCP or TLS), taking over an accepted
//! one, and running its reader and writer until it ends.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;

use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::recv::read_loop;
use super::send::write_loop;
use super::{CloseReason, Inbound, InboundReceiver, Link, LinkShared};
use crate::config::{Config, ConfigError};
use crate::handshake::{Accepted, AcceptedStream};
use crate::stream::{RxStream, StreamAbortReason};
use crate::tls::{ClientTlsStream, ServerTlsStream};

/// Why [`serve_accepted`] could not take over a connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "binding the connection from member {peer_member} at {peer_addr} to this runtime: {source}"
    )]
    Io {
        peer_member: u64,
        peer_addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Takes over a connection accepted (and handshaken) on any thread and runs it
/// on this core. The link does not reconnect: when the connection ends it is
/// closed and the receiver ends; the peer dials again.
///
/// Must be called on a `LocalSet` (the core's runtime).
pub fn serve_accepted(
    accepted: Accepted,
    config: &Config,
) -> Result<(Link, InboundReceiver), ServeError> {
    config.validate()?;
    let peer_member = accepted.hello.member_id;
    let peer_addr = accepted.peer_addr;
    let io_err = |source| ServeError::Io {
        peer_member,
        peer_addr,
        source,
    };
    let stream = match accepted.stream {
        AcceptedStream::Plain(s) => Connection::Plain(TcpStream::from_std(s).map_err(io_err)?),
        AcceptedStream::Tls(mut session) => {
            session.get_mut().0.attach().map_err(io_err)?;
            Connection::TlsServer(session)
        }
    };
    let shared = Rc::new(LinkShared::new(
        config.clone(),
        peer_member,
        accepted.hello.lane,
    ));
    let (tx, rx) = mpsc::channel(config.inbound_queue_batches);
    shared.set_connected(true, Some(peer_addr));
    let task_shared = shared.clone();
    tokio::task::spawn_local(async move {
        let reason = run_connection(&task_shared, stream, &tx).await;
        task_shared.log_close(&reason);
        task_shared.set_connected(false, None);
        task_shared.close();
    });
    Ok((
        Link { shared },
        InboundReceiver {
            rx,
            current: Vec::new().into_iter(),
        },
    ))
}

/// One connection's socket: plain TCP, or a TLS session on top of it.
pub(super) enum Connection {
    Plain(TcpStream),
    TlsClient(Box<ClientTlsStream>),
    TlsServer(Box<ServerTlsStream>),
}

impl Connection {
    pub(super) fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Connection::Plain(s) => s.peer_addr().ok(),
            Connection::TlsClient(s) => s.get_ref().0.peer_addr().ok(),
            Connection::TlsServer(s) => s.get_ref().0.peer_addr().ok(),
        }
    }
}

pub(super) async fn run_connection(
    shared: &Rc<LinkShared>,
    stream: Connection,
    tx: &mpsc::Sender<Vec<Inbound>>,
) -> CloseReason {
    match stream {
        Connection::Plain(s) => {
            let (rd, wr) = s.into_split();
            run_halves(shared, rd, wr, tx).await
        }
        Connection::TlsClient(s) => {
            let (rd, wr) = tokio::io::split(s);
            run_halves(shared, rd, wr, tx).await
        }
        Connection::TlsServer(s) => {
            let (rd, wr) = tokio::io::split(s);
            run_halves(shared, rd, wr, tx).await
        }
    }
}

async fn run_halves<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    shared: &Rc<LinkShared>,
    mut rd: R,
    mut wr: W,
    tx: &mpsc::Sender<Vec<Inbound>>,
) -> CloseReason {
    let mut rx_stream: Option<RxStream> = None;
    let reason = {
        let reader = read_loop(shared, &mut rd, tx, &mut rx_stream);
        let writer = write_loop(shared, &mut wr);
        tokio::select! {
            r = reader => r,
            w = writer => w,
        }
    };
    if let Some(rx) = rx_stream.take() {
        let aborted = Inbound::StreamAborted {
            stream_id: rx.stream_id,
            shard_id: rx.shard_id,
            reason: StreamAbortReason::ConnectionLost,
        };
        let _ = tx.send(vec![aborted]).await;
    }
    // Frames the writer had in hand are gone with the connection (counted in
    // disconnect_drops); queued ones wait for the next connection.
    let _ = wr.shutdown().await;
    reason
}

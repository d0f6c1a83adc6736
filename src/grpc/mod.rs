//! Cairn's own HTTP/2 server for the gRPC client API.
//!
//! The client port's gRPC connections are served here rather than by a
//! general HTTP/2 stack: the hot unary KV calls are decoded and answered by
//! the connection's own task, with one write for all the answers that are
//! ready together ([`conn`]); every other call reaches the same tonic
//! services as before through an `http::Request` ([`dispatch`]).
//!
//! - `cairn_proto::h2`: frame layouts and writers, HPACK.
//! - [`request`]: a request's header fields.
//! - [`send`]: queued answers and the peer's flow-control windows.
//! - [`stream_ids`]: maps keyed by stream id.
//! - [`dispatch`]: the KV fast path and the tonic path.
//! - [`conn`]: one connection's reading, state and writing.

pub mod conn;
pub mod dispatch;
pub mod request;
pub mod send;
pub mod stream_ids;

pub use conn::{serve, ConnError};
pub use dispatch::Handler;

use std::rc::Rc;

use tokio::sync::{mpsc, watch};
use tonic::transport::server::Connected;

use crate::ops::http::SniffedConn;

/// Serves each gRPC connection the client port hands over, on this core,
/// until the port stops handing them. On `shutdown` every connection sends
/// GOAWAY and closes once its open calls have answered.
pub async fn serve_incoming(
    mut incoming: mpsc::Receiver<SniffedConn>,
    handler: Rc<Handler>,
    shutdown: watch::Receiver<bool>,
) {
    while let Some(io) = incoming.recv().await {
        let info = io.get_ref().connect_info();
        let handler = Rc::clone(&handler);
        let mut stop = shutdown.clone();
        tokio::task::spawn_local(async move {
            let stopped = Box::pin(async move {
                if !*stop.borrow_and_update() {
                    let _ = stop.changed().await;
                }
            });
            if let Err(error) = serve(io, handler, info, stopped).await {
                tracing::debug!(%error, "gRPC connection ended with an error");
            }
        });
    }
}

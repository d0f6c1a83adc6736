//! Accepting `:authority: http://host:port` on the client port, as etcd does.
//!
//! etcdctl 3.4 builds a client per endpoint for `endpoint status`, `endpoint
//! health`, `move-leader` and `--cluster`, and when the endpoint is written
//! with its scheme (`--endpoints=http://127.0.0.1:2379`) grpc-go sends that
//! whole URL as the request's `:authority`. etcd's Go server takes any
//! authority. h2 (under hyper and tonic) parses it as a URI authority
//! (`http::uri::Authority`), which stops at the first '/', and resets the
//! stream with PROTOCOL_ERROR: etcdctl prints "stream terminated by
//! RST_STREAM with error code: PROTOCOL_ERROR".
//!
//! [`AuthorityFix`] sits between the connection and hyper's HTTP/2 server and
//! rewrites such an authority to its `host:port` before h2 reads it. It reads
//! the client's frames as they go by; DATA and control frames pass untouched
//! and uncopied. Header blocks are HPACK-decoded ([`cairn_proto::h2::hpack`]),
//! because the client compresses them against a dynamic table only a decoder
//! of every block can follow. A block whose authority carries a scheme is
//! re-encoded as literals that never touch the server's dynamic table; from
//! then on, the server's table no longer mirrors the client's, so every later
//! block of the connection is re-encoded as well.
//!
//! Costs: a connection that never sends such an authority pays the 9-octet
//! frame header look-up per frame and one HPACK decode per request (gRPC
//! clients index their headers, so after the first request a block is a few
//! indexed octets). Measured by the ignored `decode_cost` test:
//! `cargo test --release --lib ops::h2_authority::tests::decode_cost -- --ignored --nocapture`.
//!
//! Broken input: before any rewrite the shim steps aside (passes every octet
//! from then on) and h2 refuses the connection as it would have anyway;
//! after one, the connection is closed with an I/O error.

mod scanner;

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

use scanner::{InPlace, Scanner, ShimError};

/// An HTTP/2 server connection whose client's `:authority` values with a
/// scheme reach the server as `host:port`. Writes pass straight through.
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    scanner: Scanner,
    /// Octets for the server that did not fit the reader's buffer, or that
    /// replace what was read.
    ready: BytesMut,
}

impl<S> AuthorityFix<S> {
    /// `preface_bytes`: octets the stream starts with before its first frame
    /// (the 24-octet connection preface, when the stream still holds it).
    pub fn new(inner: S, preface_bytes: usize) -> Self {
        AuthorityFix {
            inner,
            scanner: Scanner::new(preface_bytes),
            ready: BytesMut::new(),
        }
    }
}

fn invalid(error: ShimError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            // The caller's buffer takes the read either way; what the
            // scanner keeps is cut back out of it.
            let start = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let fresh = &buf.filled()[start..];
            if this.scanner.is_holding() {
                if fresh.is_empty() {
                    this.scanner.release(&mut this.ready);
                    if this.ready.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                    continue;
                }
                this.scanner.feed(fresh, &mut this.ready).map_err(invalid)?;
                buf.set_filled(start);
                continue;
            }
            if fresh.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match this.scanner.scan_in_place(fresh).map_err(invalid)? {
                InPlace::All => return Poll::Ready(Ok(())),
                InPlace::Split {
                    pass,
                    replacement,
                    rest_from,
                } => {
                    if let Some(replacement) = replacement {
                        this.ready.extend_from_slice(&replacement);
                    }
                    this.scanner
                        .feed(&fresh[rest_from..], &mut this.ready)
                        .map_err(invalid)?;
                    buf.set_filled(start + pass);
                    if pass > 0 {
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
    }
}

super::write_through_to_inner!(AuthorityFix);

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;

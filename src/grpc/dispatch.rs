//! What a request becomes once its head (and, for a unary KV call, its one
//! message) has arrived.
//!
//! - **The KV calls** (Range, Put, DeleteRange, Txn) are decoded here and call
//!   [`KvService`] directly, and their answer is framed here: no per-request
//!   HTTP types, no router, no body channels. They are most of the traffic.
//! - **Everything else** (Watch, LeaseKeepAlive, Snapshot and every other
//!   unary call, a compressed or otherwise unusual KV call) goes to the same
//!   tonic services the member has always mounted, as an `http::Request`
//!   whose body the connection feeds ([`RecvBody`]); its response body is
//!   copied into the stream as it comes ([`spawn_generic`]).
//!
//! Both paths answer the same way: what tonic would have answered, status
//! codes and messages included; a KV call's body that is not exactly one
//! uncompressed message is handed to tonic whole, so even its errors match.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use cairn_proto::etcdserverpb::kv_server::Kv;
use cairn_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest};
use futures::future::LocalBoxFuture;
use http::header::HeaderMap;
use http_body_util::BodyExt;
use prost::Message;
use tokio::sync::mpsc;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tower_service::Service;

use super::request::RequestHead;
use super::send::{Out, Outbox};
use crate::ops::server_metrics::CoreRecorder;
use crate::server::api::call_gate::CallGate;
use crate::server::api::kv::KvService;
use crate::tls::ClientConnInfo;
use cairn_proto::h2::hpack::{self, Block, Field};

/// What one core's connections serve.
pub struct Handler {
    pub kv: KvService,
    /// Every service, for the calls not decoded here.
    pub routes: tonic::service::Routes,
    /// Largest request message of any call, as etcd's gRPC server caps
    /// every service's (`--max-request-bytes` plus 512 KiB).
    pub max_message: usize,
    /// The calls refused before they start.
    pub gate: CallGate,
    /// The core's metrics: how long each KV call took.
    pub recorder: CoreRecorder,
    /// Most streams open at once on a connection (`--max-concurrent-streams`),
    /// announced in SETTINGS; more are refused (REFUSED_STREAM). `None`: no
    /// limit, and none announced.
    pub max_streams: Option<u32>,
}

/// The KV calls decoded here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCall {
    Range,
    Put,
    DeleteRange,
    Txn,
}

impl KvCall {
    /// The call a path names, when it is decoded here.
    pub fn of(head: &RequestHead, path: &[u8]) -> Option<KvCall> {
        if head.compressed {
            return None;
        }
        match path {
            b"/etcdserverpb.KV/Range" => Some(KvCall::Range),
            b"/etcdserverpb.KV/Put" => Some(KvCall::Put),
            b"/etcdserverpb.KV/DeleteRange" => Some(KvCall::DeleteRange),
            b"/etcdserverpb.KV/Txn" => Some(KvCall::Txn),
            _ => None,
        }
    }
}

/// `:status: 200` and `content-type: application/grpc`, as HPACK octets: an
/// indexed static entry (8) and a literal without indexing whose name is
/// static entry 31.
const RESPONSE_HEAD: &[u8] = b"\x88\x0f\x10\x10application/grpc";
/// Trailers `grpc-status: 0`, a literal without indexing with a literal name.
const OK_TRAILERS: &[u8] = b"\x00\x0bgrpc-status\x010";

/// The status of a call that outlives its `grpc-timeout`: the code a gRPC
/// client gives a call past its deadline, so a client sees the same answer
/// whichever side's clock fires first (tonic's server answers Cancelled).
/// A stream is not ended at its deadline here.
fn timeout_status() -> Status {
    Status::deadline_exceeded("context deadline exceeded")
}

/// etcd's gRPC server's answer (grpc-go's) to a message over the limit,
/// named by its length prefix: clients that back off on `ResourceExhausted`
/// do so here too.
pub fn too_large(len: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({len} vs. {limit})"
    ))
}

/// The pieces of a successful unary response.
fn unary_ok(message: Bytes, metadata: &MetadataMap) -> Vec<Out> {
    let head = if metadata.is_empty() {
        Bytes::from_static(RESPONSE_HEAD)
    } else {
        let mut b = BytesMut::from(RESPONSE_HEAD);
        encode_fields(&mut b, &metadata.clone().into_headers());
        b.freeze()
    };
    vec![
        Out::Headers {
            block: head,
            end: false,
        },
        Out::Data {
            bytes: message,
            end: false,
        },
        Out::Headers {
            block: Bytes::from_static(OK_TRAILERS),
            end: true,
        },
    ]
}

/// A trailers-only response carrying `status`.
pub fn status_only(status: &Status) -> Vec<Out> {
    let mut b = BytesMut::from(RESPONSE_HEAD);
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        // A message that cannot be a header value: keep the code.
        trailers.clear();
        let _ = Status::new(status.code(), "").add_header(&mut trailers);
    }
    encode_fields(&mut b, &trailers);
    vec![Out::Headers {
        block: b.freeze(),
        end: true,
    }]
}

/// Appends header fields as literals that leave the peer's table alone.
fn encode_fields(out: &mut BytesMut, headers: &HeaderMap) {
    let block = Block {
        table_size_updates: Vec::new(),
        fields: headers
            .iter()
            .map(|(name, value)| Field {
                name: Bytes::copy_from_slice(name.as_str().as_bytes()),
                value: Bytes::copy_from_slice(value.as_bytes()),
                never_indexed: value.is_sensitive(),
            })
            .collect(),
    };
    hpack::encode_literals(&block, out);
}

/// A message framed for gRPC: uncompressed flag, length, octets. A message
/// over 4 GiB cannot be framed (tonic answers ResourceExhausted too).
fn frame_message<M: Message>(message: &M) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let Ok(len32) = u32::try_from(len) else {
        return Err(Status::resource_exhausted(format!(
            "an answer of {len} bytes is over gRPC's 4 GiB"
        )));
    };
    let mut b = BytesMut::with_capacity(5 + len);
    b.put_u8(0);
    b.put_u32(len32);
    message.encode_raw(&mut b);
    Ok(b.freeze())
}

/// The one message of a unary body: exactly one uncompressed gRPC message,
/// or `None` (tonic then answers the body).
fn one_message(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let message = rest.get(4..)?;
    (flag == 0 && message.len() == len).then_some(message)
}

/// A unary KV call, decoded and called here; `None` when the body is not one
/// well-formed message (the caller hands it to tonic, `head` untouched).
/// Otherwise the call takes `head`'s fields as its metadata.
pub fn kv_call(
    handler: &Rc<Handler>,
    call: KvCall,
    head: &mut RequestHead,
    info: &ClientConnInfo,
    body: &[u8],
) -> Option<LocalBoxFuture<'static, Vec<Out>>> {
    let message = one_message(body)?;
    let timeout = head.timeout;
    // One count on the handler, not a copy of the service's handles.
    let handler = Rc::clone(handler);
    macro_rules! call {
        ($req:ty, $method:ident) => {{
            let request = tonic_request(head, info, <$req>::decode(message).ok()?);
            Box::pin(async move {
                let started = Instant::now();
                let answer = with_timeout(timeout, handler.kv.$method(request)).await;
                handler.recorder.kv_request(started.elapsed());
                match answer {
                    Ok(resp) => {
                        let (metadata, message, _) = resp.into_parts();
                        match frame_message(&message) {
                            Ok(framed) => unary_ok(framed, &metadata),
                            Err(status) => status_only(&status),
                        }
                    }
                    Err(status) => status_only(&status),
                }
            }) as LocalBoxFuture<'static, Vec<Out>>
        }};
    }
    Some(match call {
        KvCall::Range => call!(RangeRequest, range),
        KvCall::Put => call!(PutRequest, put),
        KvCall::DeleteRange => call!(DeleteRangeRequest, delete_range),
        KvCall::Txn => call!(TxnRequest, txn),
    })
}

/// A decoded message as the services take it: the head's fields as
/// metadata, the connection's [`ClientConnInfo`] as an extension (as tonic's
/// server inserts it).
fn tonic_request<T>(
    head: &mut RequestHead,
    info: &ClientConnInfo,
    message: T,
) -> tonic::Request<T> {
    let mut extensions = http::Extensions::new();
    extensions.insert(info.clone());
    let metadata = MetadataMap::from_headers(std::mem::take(&mut head.headers));
    tonic::Request::from_parts(metadata, extensions, message)
}

async fn with_timeout<T>(
    timeout: Option<Duration>,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match timeout {
        None => call.await,
        Some(t) => tokio::time::timeout(t, call)
            .await
            .unwrap_or_else(|_| Err(timeout_status())),
    }
}

/// The body of a request served by tonic: the DATA the connection receives,
/// in order. Each chunk taken is reported back (`consumed`), so the
/// connection opens the stream's window only as the service reads. A
/// message whose length prefix is over `max_message` ends the body with
/// etcd's refusal before any of it reaches the service.
pub struct RecvBody {
    pub stream: u32,
    pub data: mpsc::UnboundedReceiver<Bytes>,
    pub consumed: mpsc::UnboundedSender<(u32, usize)>,
    pub frames: MessageFrames,
    /// The refusal of a message over the cap, given once the messages
    /// before it in the same chunk have gone to the service.
    pub refused: Option<Status>,
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(status) = self.refused.take() {
            return Poll::Ready(Some(Err(status)));
        }
        match self.data.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                let _ = self.consumed.send((self.stream, chunk.len()));
                if let Some((len, before)) = self.frames.over_limit(&chunk) {
                    // Nothing of this body reaches the service after it.
                    self.data.close();
                    let status = too_large(len, self.frames.limit);
                    if before == 0 {
                        return Poll::Ready(Some(Err(status)));
                    }
                    self.refused = Some(status);
                    return Poll::Ready(Some(Ok(http_body::Frame::data(chunk.slice(..before)))));
                }
                Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Follows the gRPC messages of a request body (each a 1-octet flag and a
/// 4-octet big-endian length, then that many octets) across the chunks it
/// arrives in, to see each length as soon as its prefix is whole.
#[derive(Debug)]
pub struct MessageFrames {
    limit: usize,
    /// Octets of the current message still to come, after its prefix.
    left: usize,
    prefix: [u8; 5],
    /// Octets of the next prefix seen so far.
    filled: usize,
}

impl MessageFrames {
    pub fn new(limit: usize) -> MessageFrames {
        MessageFrames {
            limit,
            left: 0,
            prefix: [0; 5],
            filled: 0,
        }
    }

    /// Takes the next `chunk` of the body. For a message over the limit
    /// whose prefix completes here: its declared length, and how many
    /// octets of `chunk` come before its prefix (the whole messages before
    /// it, and the end of one begun earlier).
    pub fn over_limit(&mut self, chunk: &[u8]) -> Option<(usize, usize)> {
        let mut at = 0;
        while at < chunk.len() {
            if self.left > 0 {
                let n = self.left.min(chunk.len() - at);
                self.left -= n;
                at += n;
                continue;
            }
            let starts_at = at - self.filled.min(at);
            let n = (5 - self.filled).min(chunk.len() - at);
            self.prefix[self.filled..self.filled + n].copy_from_slice(&chunk[at..at + n]);
            self.filled += n;
            at += n;
            if self.filled == 5 {
                self.filled = 0;
                let p = &self.prefix;
                let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
                if len > self.limit {
                    return Some((len, starts_at));
                }
                self.left = len;
            }
        }
        None
    }
}

/// Starts a call served by tonic: its response goes into `outbox` as it
/// comes, each piece waiting for room. `None` when it is answered at once
/// (no task to abort).
pub fn spawn_generic(
    handler: &Rc<Handler>,
    stream: u32,
    head: RequestHead,
    info: &ClientConnInfo,
    body: RecvBody,
    outbox: Rc<RefCell<Outbox>>,
) -> Option<tokio::task::AbortHandle> {
    let mut request = http::Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.version_mut() = http::Version::HTTP_2;
    let path = head.path.unwrap_or_default();
    match http::Uri::from_maybe_shared(Bytes::from(path)) {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => {
            // The path cannot be a URI: no service has such a name.
            let mut outbox = outbox.borrow_mut();
            for piece in status_only(&Status::new(Code::Unimplemented, "")) {
                outbox.push(stream, piece);
            }
            return None;
        }
    }
    *request.headers_mut() = head.headers;
    request.extensions_mut().insert(info.clone());
    let mut routes = handler.routes.clone();
    let timeout = head.timeout;
    let task = async move {
        let mut guard = EndGuard {
            stream,
            outbox,
            ended: false,
        };
        let answer = with_timeout(timeout, async {
            Ok(match routes.call(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            })
        })
        .await;
        let response = match answer {
            Ok(r) => r,
            Err(status) => {
                guard.push_all(status_only(&status));
                return;
            }
        };
        let (parts, mut body) = response.into_parts();
        let mut head = BytesMut::new();
        let status = hpack::Block {
            table_size_updates: Vec::new(),
            fields: vec![Field {
                name: Bytes::from_static(b":status"),
                value: Bytes::copy_from_slice(parts.status.as_str().as_bytes()),
                never_indexed: false,
            }],
        };
        hpack::encode_literals(&status, &mut head);
        encode_fields(&mut head, &parts.headers);
        if http_body::Body::is_end_stream(&body) {
            guard.push(Out::Headers {
                block: head.freeze(),
                end: true,
            });
            return;
        }
        if !guard.push(Out::Headers {
            block: head.freeze(),
            end: false,
        }) {
            return;
        }
        loop {
            let piece = match body.frame().await {
                None => Out::Data {
                    bytes: Bytes::new(),
                    end: true,
                },
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(bytes) => Out::Data { bytes, end: false },
                    Err(frame) => {
                        let mut block = BytesMut::new();
                        if let Ok(trailers) = frame.into_trailers() {
                            encode_fields(&mut block, &trailers);
                        }
                        Out::Headers {
                            block: block.freeze(),
                            end: true,
                        }
                    }
                },
                Some(Err(status)) => {
                    let mut block = BytesMut::new();
                    let mut trailers = HeaderMap::new();
                    let _ = status.add_header(&mut trailers);
                    encode_fields(&mut block, &trailers);
                    Out::Headers {
                        block: block.freeze(),
                        end: true,
                    }
                }
            };
            let last = matches!(piece, Out::Data { end: true, .. } | Out::Headers { .. });
            if !guard.push(piece) || last {
                return;
            }
            if !guard.room().await {
                return;
            }
        }
    };
    Some(tokio::task::spawn_local(task).abort_handle())
}

/// A streaming call's hold on its stream: when the task ends without having
/// ended the stream (it panicked), the stream ends with status Internal
/// rather than hanging.
struct EndGuard {
    stream: u32,
    outbox: Rc<RefCell<Outbox>>,
    ended: bool,
}

impl EndGuard {
    fn push(&mut self, piece: Out) -> bool {
        if matches!(
            piece,
            Out::Headers { end: true, .. } | Out::Data { end: true, .. }
        ) {
            self.ended = true;
        }
        self.outbox.borrow_mut().push(self.stream, piece)
    }

    fn push_all(&mut self, pieces: Vec<Out>) {
        for piece in pieces {
            self.push(piece);
        }
    }

    /// Waits until the stream has room; false when it is gone.
    async fn room(&self) -> bool {
        std::future::poll_fn(|cx| self.outbox.borrow_mut().poll_room(self.stream, cx)).await
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Ok(mut outbox) = self.outbox.try_borrow_mut() {
            if outbox.is_open(self.stream) {
                let status = Status::internal("the call ended without an answer");
                for piece in status_only(&status) {
                    outbox.push(self.stream, piece);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(len: usize) -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&(len as u32).to_be_bytes());
        v.extend(std::iter::repeat_n(7u8, len));
        v
    }

    #[test]
    fn message_frames_see_each_length_across_chunks() {
        // Messages within the limit, back to back, cut at every offset:
        // none is over, and a later one over the limit is still seen.
        let mut body = framed(10);
        body.extend(framed(0));
        body.extend(framed(16));
        body.extend_from_slice(&framed(17)[..5]);
        // Where the over-limit message's prefix starts.
        let at = body.len() - 5;
        for cut in 0..body.len() {
            let mut f = MessageFrames::new(16);
            assert_eq!(f.over_limit(&body[..cut]), None, "cut at {cut}");
            let before = at.saturating_sub(cut);
            assert_eq!(
                f.over_limit(&body[cut..]),
                Some((17, before)),
                "cut at {cut}"
            );
        }
        // Byte by byte, the prefix split in five: it began before the
        // chunk that completes it.
        let mut f = MessageFrames::new(16);
        let seen: Vec<_> = body.iter().filter_map(|b| f.over_limit(&[*b])).collect();
        assert_eq!(seen, vec![(17, 0)]);
        // A message's own bytes are never read as a prefix.
        let mut f = MessageFrames::new(16);
        let mut inner = vec![0u8, 0, 0, 0, 11];
        inner.extend([0u8, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0]);
        assert_eq!(f.over_limit(&inner), None);
    }

    #[test]
    fn one_message_takes_exactly_one_uncompressed_message() {
        assert_eq!(one_message(b"\0\0\0\0\x02ab"), Some(&b"ab"[..]));
        assert_eq!(one_message(b"\0\0\0\0\0"), Some(&b""[..]));
        assert_eq!(one_message(b""), None);
        assert_eq!(one_message(b"\0\0\0\0"), None);
        assert_eq!(one_message(b"\x01\0\0\0\x02ab"), None, "compressed");
        assert_eq!(one_message(b"\0\0\0\0\x02abc"), None, "two messages");
        assert_eq!(one_message(b"\0\0\0\0\x03ab"), None, "short");
    }

    #[test]
    fn the_constant_blocks_decode_to_the_response_fields() {
        let mut d = hpack::Decoder::default();
        let mut block = Block::default();
        let mut all = BytesMut::from(RESPONSE_HEAD);
        all.extend_from_slice(OK_TRAILERS);
        d.decode(&all, &mut block).unwrap();
        let fields: Vec<(&[u8], &[u8])> = block
            .fields
            .iter()
            .map(|f| (&f.name[..], &f.value[..]))
            .collect();
        assert_eq!(
            fields,
            vec![
                (&b":status"[..], &b"200"[..]),
                (b"content-type", b"application/grpc"),
                (b"grpc-status", b"0"),
            ]
        );
    }

    #[test]
    fn a_status_becomes_trailers_only_with_an_encoded_message() {
        let pieces = status_only(&Status::invalid_argument("etcdserver: key is not provided"));
        let [Out::Headers { block, end: true }] = &pieces[..] else {
            panic!("{pieces:?}");
        };
        let mut d = hpack::Decoder::default();
        let mut decoded = Block::default();
        d.decode(block, &mut decoded).unwrap();
        let get = |n: &[u8]| {
            decoded
                .fields
                .iter()
                .find(|f| &f.name[..] == n)
                .map(|f| f.value.clone())
        };
        assert_eq!(get(b"grpc-status").unwrap(), "3");
        // Percent-encoded, as gRPC's HTTP/2 mapping says.
        assert_eq!(
            get(b"grpc-message").unwrap(),
            "etcdserver:%20key%20is%20not%20provided"
        );
        assert_eq!(get(b":status").unwrap(), "200");
    }
}

//! Calls into the member's own gRPC services in-process, as etcd's gateway
//! and its Lock and Election services call etcd's gRPC server: the request is
//! framed as gRPC (five-byte header, then the encoded message) and handed to
//! the same tonic service stack the client port serves, and the response's
//! frames and status are read back. Nothing crosses a socket, and every
//! check, limit and error of the gRPC API (request size, auth, unimplemented
//! services) applies to these calls unchanged.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use cairn_proto::etcdserverpb::{watch_request, WatchCreateRequest, WatchRequest, WatchResponse};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderMap, CONTENT_TYPE, TE};
use hyper::{Method, Request};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Code, Status};
use tower_service::Service;

use crate::tls::ClientConnInfo;

/// Length of a gRPC message frame's header: compressed flag, then a
/// big-endian u32 length.
pub const FRAME_HEADER_BYTES: usize = 1 + std::mem::size_of::<u32>();

/// One uncompressed gRPC frame holding `message`.
pub fn frame(message: &[u8]) -> Bytes {
    let len = u32::try_from(message.len()).expect("a request body is bounded far below 4 GiB");
    let mut out = BytesMut::with_capacity(FRAME_HEADER_BYTES + message.len());
    out.put_u8(0);
    out.put_u32(len);
    out.put_slice(message);
    out.freeze()
}

/// Starts one call of `grpc_path` with `body` as its request stream and
/// `metadata` (the gateway's, or a client's call's), as the connection `conn`
/// (a client certificate's name stands for its user) when given, and
/// returns its response, whose first
/// frames may still be on their way.
pub async fn call<B>(
    routes: &Routes,
    grpc_path: &str,
    metadata: &HeaderMap,
    conn: Option<&ClientConnInfo>,
    body: B,
) -> Result<ResponseFrames, Status>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(grpc_path)
        .header(CONTENT_TYPE, "application/grpc")
        .header(TE, "trailers");
    for (name, value) in metadata {
        request = request.header(name, value.clone());
    }
    let mut request = request
        .body(body)
        .map_err(|e| Status::internal(format!("building a call of {grpc_path}: {e}")))?;
    if let Some(conn) = conn {
        request.extensions_mut().insert(conn.clone());
    }
    let mut routes = routes.clone();
    let Ok(()) =
        std::future::poll_fn(|cx| Service::<Request<B>>::poll_ready(&mut routes, cx)).await;
    let Ok(response) = routes.call(request).await;
    let (parts, body) = response.into_parts();
    // A call that fails before its first message answers with headers only.
    if let Some(status) = status_of(&parts.headers) {
        if status.code() != Code::Ok {
            return Err(status);
        }
    }
    Ok(ResponseFrames {
        body,
        buf: BytesMut::new(),
        done: false,
    })
}

fn status_of(headers: &HeaderMap) -> Option<Status> {
    headers.contains_key("grpc-status").then(|| {
        Status::from_header_map(headers)
            .unwrap_or_else(|| Status::unknown("a grpc-status that does not parse"))
    })
}

/// The messages of one call's response, in order, then its status.
pub struct ResponseFrames {
    body: tonic::body::Body,
    buf: BytesMut,
    done: bool,
}

impl ResponseFrames {
    /// The next message; `None` once the call ended well; the call's status
    /// when it failed.
    pub async fn next(&mut self) -> Result<Option<Bytes>, Status> {
        loop {
            if let Some(message) = self.take_message()? {
                return Ok(Some(message));
            }
            if self.done {
                return Ok(None);
            }
            let Some(frame) = self.body.frame().await else {
                return Err(Status::internal("the call ended without a status"));
            };
            let frame = frame.map_err(|e| Status::internal(format!("reading the call: {e}")))?;
            match frame.into_data() {
                Ok(data) => self.buf.extend_from_slice(&data),
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    match status_of(&trailers) {
                        Some(status) if status.code() != Code::Ok => return Err(status),
                        _ => self.done = true,
                    }
                }
            }
        }
    }

    fn take_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buf.len() < FRAME_HEADER_BYTES {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Status::internal(
                "a compressed response frame was not asked for",
            ));
        }
        let len = u32::from_be_bytes(self.buf[1..FRAME_HEADER_BYTES].try_into().expect("4 bytes"))
            as usize;
        if self.buf.len() < FRAME_HEADER_BYTES + len {
            return Ok(None);
        }
        self.buf.advance(FRAME_HEADER_BYTES);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

/// The metadata keys a call made on a client's behalf carries over from the
/// client's own call: its credentials (`token`, or `authorization` as the
/// gateway passes them). Not `hasleader`: as etcd's, the client's call is
/// checked for a leader where it arrives, and the calls made for it wait
/// for one as any call does.
const CARRIED_METADATA: &[&str] = &["token", "authorization"];

/// Calls of the member's own services made on behalf of one client's call,
/// with that call's credentials: the services built on the others (Lock and
/// Election) act with the caller's permissions, as etcd's do through its
/// in-process client, and pass refusals on as etcd's do
/// ([`as_etcd_answers`]).
#[derive(Clone)]
pub struct Caller {
    routes: Routes,
    metadata: HeaderMap,
    /// The client's connection: its certificate's name, when auth takes
    /// the user from it.
    conn: Option<ClientConnInfo>,
}

/// The request stream of an in-process streaming call: kept open while the
/// call runs.
type StreamedRequests = StreamBody<ReceiverStream<Result<Frame<Bytes>, Status>>>;

impl Caller {
    /// Calls of `routes` on behalf of `request`.
    pub fn new<T>(routes: Routes, request: &tonic::Request<T>) -> Caller {
        let headers = request.metadata().clone().into_headers();
        let mut carried = HeaderMap::new();
        for key in CARRIED_METADATA {
            for value in headers.get_all(*key) {
                carried.append(*key, value.clone());
            }
        }
        Caller {
            routes,
            metadata: carried,
            conn: request.extensions().get::<ClientConnInfo>().cloned(),
        }
    }

    /// Calls of `routes` the member makes for itself (automatic compaction):
    /// no token, no certificate.
    pub fn internal(routes: Routes) -> Caller {
        Caller {
            routes,
            metadata: HeaderMap::new(),
            conn: None,
        }
    }

    /// One unary call of `grpc_path`: its answer, or its status.
    pub async fn unary<Q: Message, A: Message + Default>(
        &self,
        grpc_path: &str,
        request: &Q,
    ) -> Result<A, Status> {
        let body = Full::new(frame(&request.encode_to_vec()));
        let mut frames = call(
            &self.routes,
            grpc_path,
            &self.metadata,
            self.conn.as_ref(),
            body,
        )
        .await
        .map_err(as_etcd_answers)?;
        let Some(message) = frames.next().await.map_err(as_etcd_answers)? else {
            return Err(Status::internal(format!("{grpc_path} answered nothing")));
        };
        // The status that follows the answer.
        while frames.next().await.map_err(as_etcd_answers)?.is_some() {}
        A::decode(message).map_err(|e| Status::internal(format!("{grpc_path} answer: {e}")))
    }

    /// Opens a Watch stream with the one watch `create` asks for.
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<WatchEvents, Status> {
        let (requests, rx) = mpsc::channel(1);
        let first = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        requests
            .try_send(Ok(Frame::data(frame(&first.encode_to_vec()))))
            .expect("a new channel has room for one message");
        let body: StreamedRequests = StreamBody::new(ReceiverStream::new(rx));
        let frames = call(
            &self.routes,
            WATCH_PATH,
            &self.metadata,
            self.conn.as_ref(),
            body,
        )
        .await
        .map_err(as_etcd_answers)?;
        Ok(WatchEvents {
            _requests: requests,
            frames,
        })
    }
}

/// A refusal of a call made on a client's behalf, as etcd's Lock and
/// Election services pass it on: their in-process client turns an etcd error
/// (`etcdserver: ...`) into a plain error, which gRPC answers with code
/// Unknown and the same message; other statuses keep their code.
pub fn as_etcd_answers(status: Status) -> Status {
    if status.code() != tonic::Code::Unknown && status.message().starts_with("etcdserver: ") {
        return Status::unknown(status.message());
    }
    status
}

/// The Watch service's gRPC path.
const WATCH_PATH: &str = "/etcdserverpb.Watch/Watch";

/// The answers of a Watch stream opened by [`Caller::watch`]; dropping it
/// ends the stream and its watch.
pub struct WatchEvents {
    /// Held so the stream's request side stays open.
    _requests: mpsc::Sender<Result<Frame<Bytes>, Status>>,
    frames: ResponseFrames,
}

impl WatchEvents {
    /// The stream's next answer; `None` once it ended.
    pub async fn next(&mut self) -> Result<Option<WatchResponse>, Status> {
        let Some(message) = self.frames.next().await.map_err(as_etcd_answers)? else {
            return Ok(None);
        };
        WatchResponse::decode(message)
            .map(Some)
            .map_err(|e| Status::internal(format!("watch answer: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_are_passed_on_as_etcds_services_do() {
        let denied = as_etcd_answers(Status::permission_denied("etcdserver: permission denied"));
        assert_eq!(denied.code(), tonic::Code::Unknown);
        assert_eq!(denied.message(), "etcdserver: permission denied");
        let other = as_etcd_answers(Status::deadline_exceeded("context deadline exceeded"));
        assert_eq!(other.code(), tonic::Code::DeadlineExceeded);
    }

    #[test]
    fn a_caller_carries_its_clients_credentials_and_certificate_name_only() {
        let mut request = tonic::Request::new(());
        for (key, value) in [("token", "t.1"), ("hasleader", "true"), ("other", "x")] {
            request.metadata_mut().insert(key, value.parse().unwrap());
        }
        request.extensions_mut().insert(ClientConnInfo {
            remote_addr: None,
            common_name: Some("alice".into()),
        });
        let caller = Caller::new(Routes::default(), &request);
        let carried: Vec<&str> = caller.metadata.keys().map(|k| k.as_str()).collect();
        assert_eq!(carried, ["token"]);
        let name = caller.conn.as_ref().and_then(|c| c.common_name.as_deref());
        assert_eq!(name, Some("alice"));
    }

    #[test]
    fn frames_carry_their_length() {
        let f = frame(b"abc");
        assert_eq!(&f[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(frame(b"").len(), FRAME_HEADER_BYTES);
    }
}

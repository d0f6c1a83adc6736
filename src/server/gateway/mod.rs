//! etcd's HTTP/JSON gateway on the client port: every etcd v3 RPC as
//! `POST /v3/<service>/<call>` (and under `/v3beta/`) with a JSON body, and
//! `GET /version`, for clients that do not speak gRPC (curl, Patroni,
//! OpenStack's etcd3gw).
//!
//! One generic path serves every call, written from the compiled protobuf
//! descriptors: the JSON body becomes the method's request message
//! ([`json`]), the member's own gRPC services answer it in-process
//! ([`grpc`]), and the response message goes back as JSON; streams go line by
//! line ([`stream`]); failures carry etcd's JSON error body and HTTP status
//! ([`errors`]). Which path calls which method is [`routes`]. HTTP/1
//! connections reach the gateway through the client port's sniffing (see
//! `ops::http`), so gRPC connections never pass through it; etcd serves its
//! gateway over HTTP/1.1 only as well (HTTP/2 on its client port is gRPC).

pub mod errors;
pub mod grpc;
pub mod json;
pub mod json_split;
pub mod routes;
pub mod stream;

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tonic::service::Routes;
use tonic::Code;

use crate::ops::http::{ConnectionCut, FallbackBody, Http1Fallback};
use crate::server::api::call_gate::CallGate;
use crate::server::api::in_process;
use routes::{Route, RouteTable};
use stream::{FirstMessageError, JsonMessages};

/// The version `GET /version` reports for the cluster, as etcd 3.4 does.
pub const CLUSTER_VERSION: &str = "3.4.0";

/// The headers etcd's client port adds to every HTTP answer.
const CORS_HEADERS: &[(&str, &str)] = &[
    (
        "access-control-allow-headers",
        "accept, content-type, authorization",
    ),
    (
        "access-control-allow-methods",
        "POST, GET, OPTIONS, PUT, DELETE",
    ),
    ("access-control-allow-origin", "*"),
];

fn table() -> &'static RouteTable {
    static TABLE: OnceLock<RouteTable> = OnceLock::new();
    TABLE.get_or_init(RouteTable::build)
}

/// The gateway of one client listener: the same gRPC services it serves.
#[derive(Clone)]
pub struct Gateway {
    routes: Routes,
    max_body_bytes: usize,
    /// The gRPC message cap: a body whose message is larger is refused
    /// as etcd's gRPC server refuses it.
    max_message_bytes: usize,
    /// The calls refused before they start, through the gateway as over
    /// gRPC (a learner's, and those that require a leader through a
    /// `Grpc-Metadata-Hasleader` header while the member knows none).
    gate: CallGate,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// `routes`: the gRPC services; `max_message_bytes`: their message cap.
    /// A JSON body (or unparsed stream text) longer than [`max_body_bytes`]
    /// is not read, and is refused with gRPC's `ResourceExhausted`, as
    /// etcd's gateway refuses a message over gRPC's cap; so is a shorter
    /// body whose message is over the cap.
    pub fn new(routes: Routes, max_message_bytes: usize, gate: CallGate) -> Gateway {
        // Decode the schema now, not on the first request.
        let _ = table();
        Gateway {
            routes,
            max_body_bytes: max_body_bytes(max_message_bytes),
            max_message_bytes,
            gate,
        }
    }

    /// Answers one HTTP/1 request that is not an operator endpoint.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<FallbackBody> {
        let mut response = self.answer(req).await;
        // etcd's default CORS policy (`--cors '*'`), on every answer, so browser
        // pages that call etcd's gateway call Cairn's alike.
        let headers = response.headers_mut();
        for (name, value) in CORS_HEADERS {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        response
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<FallbackBody> {
        let path = req.uri().path();
        if path == "/version" {
            return version(req.method());
        }
        let Some(route) = table().get(path) else {
            return if RouteTable::is_gateway_path(path) {
                plain(StatusCode::NOT_FOUND, "Not Found\n")
            } else {
                plain(StatusCode::NOT_FOUND, "404 page not found\n")
            };
        };
        if req.method() != Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
        }
        // grpc-gateway's deadline: a `Grpc-Timeout` header in gRPC's form.
        let deadline = match req.headers().get("grpc-timeout") {
            None => None,
            Some(value) => match crate::grpc::request::parse_timeout(value.as_bytes()) {
                Some(timeout) => Some(timeout),
                None => {
                    let value = String::from_utf8_lossy(value.as_bytes());
                    return error(
                        Code::InvalidArgument,
                        &format!("invalid grpc-timeout: {value}"),
                    );
                }
            },
        };
        let metadata = grpc::call_metadata(req.headers());
        if let Some(status) = self.gate.refusal(route.grpc_path.as_bytes(), &metadata) {
            return error(status.code(), status.message());
        }
        if route.client_streaming {
            return self.streaming_call(route, req, &metadata).await;
        }
        let call = self.unary_request_call(route, req, &metadata);
        match deadline {
            // A call whose answer is one message ends at its deadline with
            // the code a gRPC client's own deadline gives.
            Some(timeout) if !route.server_streaming => tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| error(Code::DeadlineExceeded, "context deadline exceeded")),
            _ => call.await,
        }
    }

    /// A call whose request is one message (its response may stream).
    async fn unary_request_call(
        &self,
        route: &Route,
        req: Request<Incoming>,
        metadata: &hyper::HeaderMap,
    ) -> Response<FallbackBody> {
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, self.max_body_bytes).collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return self.too_large();
            }
            Err(e) => return error(Code::InvalidArgument, &e.to_string()),
        };
        let message = match json::request_from_json(&route.input, &body) {
            Ok(message) => message,
            Err(e) => return error(Code::InvalidArgument, &e.to_string()),
        };
        if message.len() > self.max_message_bytes {
            let status = crate::grpc::dispatch::too_large(message.len(), self.max_message_bytes);
            return error(status.code(), status.message());
        }
        let frames = match in_process::call(
            &self.routes,
            &route.grpc_path,
            metadata,
            None,
            Full::new(in_process::frame(&message)),
        )
        .await
        {
            Ok(frames) => frames,
            Err(status) => return error(status.code(), status.message()),
        };
        if route.server_streaming {
            let cut = parts.extensions.get::<ConnectionCut>().cloned();
            return streamed(stream::stream_response(frames, route.output.clone(), cut));
        }
        unary_response(frames, route).await
    }

    /// A call whose request streams: its first message is read before the
    /// call starts (bad text there fails the whole request, as with etcd);
    /// the rest are forwarded as they arrive.
    async fn streaming_call(
        &self,
        route: &Route,
        req: Request<Incoming>,
        metadata: &hyper::HeaderMap,
    ) -> Response<FallbackBody> {
        let (parts, body) = req.into_parts();
        let mut messages = JsonMessages::new(
            body,
            route.input.clone(),
            self.max_body_bytes,
            self.max_message_bytes,
        );
        let first = match messages.next().await {
            Ok(first) => first,
            // etcd's gateway fails a stream's first message with gRPC's Unknown.
            Err(FirstMessageError::Json(e)) => return error(Code::Unknown, &e.to_string()),
            Err(FirstMessageError::TooLarge) => return self.too_large(),
            Err(FirstMessageError::MessageTooLarge(len)) => {
                let status = crate::grpc::dispatch::too_large(len, self.max_message_bytes);
                return error(status.code(), status.message());
            }
        };
        let body = stream::forward_requests(messages, first);
        let frames =
            match in_process::call(&self.routes, &route.grpc_path, metadata, None, body).await {
                Ok(frames) => frames,
                Err(status) => return error(status.code(), status.message()),
            };
        let cut = parts.extensions.get::<ConnectionCut>().cloned();
        streamed(stream::stream_response(frames, route.output.clone(), cut))
    }

    fn too_large(&self) -> Response<FallbackBody> {
        error(
            Code::ResourceExhausted,
            &format!(
                "gateway: request body larger than max ({} bytes)",
                self.max_body_bytes
            ),
        )
    }
}

impl Http1Fallback for Gateway {
    fn serve(&self, req: Request<Incoming>) -> BoxFuture<'static, Response<FallbackBody>> {
        let gateway = self.clone();
        Box::pin(async move { gateway.handle(req).await })
    }
}

/// Reads the one response message and the call's status.
async fn unary_response(
    mut frames: in_process::ResponseFrames,
    route: &Route,
) -> Response<FallbackBody> {
    let message = match frames.next().await {
        Ok(Some(message)) => message,
        Ok(None) => return error(Code::Internal, "the call answered no message"),
        Err(status) => return error(status.code(), status.message()),
    };
    if let Err(status) = frames.next().await {
        return error(status.code(), status.message());
    }
    let mut out = Vec::with_capacity(message.len() * 2 + 16);
    if let Err(e) = json::response_to_json(&route.output, &message, &mut out) {
        return error(Code::Internal, &e.to_string());
    }
    json_response(StatusCode::OK, Bytes::from(out))
}

/// `GET /version`, as etcd answers it: the server's and the cluster's version.
fn version(method: &Method) -> Response<FallbackBody> {
    if method != Method::GET && method != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    }
    let body = serde_json::json!({
        "etcdserver": crate::server::api::maintenance::ETCD_API_VERSION,
        "etcdcluster": CLUSTER_VERSION,
    });
    let response = json_response(StatusCode::OK, Bytes::from(body.to_string()));
    if method == Method::HEAD {
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, empty());
    }
    response
}

fn error(code: Code, message: &str) -> Response<FallbackBody> {
    json_response(
        errors::http_status(code),
        Bytes::from(errors::error_body(code, message)),
    )
}

fn empty() -> FallbackBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

fn json_response(status: StatusCode, body: Bytes) -> Response<FallbackBody> {
    let mut r = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn streamed<B>(body: B) -> Response<FallbackBody>
where
    B: hyper::body::Body<Data = Bytes, Error = stream::StreamError> + Send + Sync + 'static,
{
    let mut r = Response::new(BodyExt::boxed(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn plain(status: StatusCode, text: &'static str) -> Response<FallbackBody> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The longest JSON body the gateway reads for a gRPC message cap of
/// `max_message_bytes`: room for base64 (4/3) and the JSON around it.
pub fn max_body_bytes(max_message_bytes: usize) -> usize {
    max_message_bytes / 3 * 4 + 64 * 1024
}

/// Builds the gateway answering on a listener whose gRPC services are
/// `routes`, with a message cap of `max_message_bytes`.
pub fn fallback(
    routes: Routes,
    max_message_bytes: usize,
    gate: CallGate,
) -> Arc<dyn Http1Fallback> {
    Arc::new(Gateway::new(routes, max_message_bytes, gate))
}

//! Calls into the member's own gRPC services in-process, as etcd's gateway
//! calls etcd's gRPC server: the request is framed as gRPC (five-byte header,
//! then the encoded message) and handed to the same tonic service stack the
//! client port serves, and the response's frames and status are read back.
//! Nothing crosses a socket, and every check, limit and error of the gRPC
//! API (request size, learner refusals, unimplemented services) applies to
//! gateway calls unchanged.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE, TE};
use hyper::{Method, Request};
use tonic::service::Routes;
use tonic::{Code, Status};
use tower_service::Service;

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

/// The gRPC metadata of a call made through the gateway, as etcd's gateway
/// (grpc-gateway) makes it from the HTTP request's headers: `Authorization`,
/// and every `Grpc-Metadata-<key>` header as `<key>` (so
/// `Grpc-Metadata-Hasleader: true` requires a leader, as etcd's clients ask
/// with `hasleader`). Keys that gRPC reserves for itself (`grpc-*`, `te`,
/// `content-type`, `user-agent`) and HTTP's own (hop-by-hop and framing
/// headers) are not taken.
pub fn call_metadata(headers: &HeaderMap) -> HeaderMap {
    let mut metadata = HeaderMap::new();
    if let Some(token) = headers.get(AUTHORIZATION) {
        metadata.insert(AUTHORIZATION, token.clone());
    }
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        if key.starts_with("grpc-") || NOT_METADATA.contains(&key) {
            continue;
        }
        if let Ok(key) = http::HeaderName::from_bytes(key.as_bytes()) {
            metadata.append(key, value.clone());
        }
    }
    metadata
}

/// Keys never taken as metadata: gRPC's and HTTP's own.
const NOT_METADATA: &[&str] = &[
    "te",
    "content-type",
    "user-agent",
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
];

/// grpc-gateway's prefix of the HTTP headers it passes on as metadata
/// (header names arrive lower-cased).
const METADATA_HEADER_PREFIX: &str = "grpc-metadata-";

/// Starts one call of `grpc_path` with `body` as its request stream and
/// `metadata` ([`call_metadata`]), and returns its response, whose first
/// frames may still be on their way.
pub async fn call<B>(
    routes: &Routes,
    grpc_path: &str,
    metadata: &HeaderMap,
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
    let request = request
        .body(body)
        .map_err(|e| Status::internal(format!("building a call of {grpc_path}: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_length() {
        let f = frame(b"abc");
        assert_eq!(&f[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(frame(b"").len(), FRAME_HEADER_BYTES);
    }

    #[test]
    fn metadata_is_taken_from_grpc_gateways_headers() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "token.1"),
            ("grpc-metadata-hasleader", "true"),
            ("grpc-metadata-token", "token.2"),
            ("grpc-metadata-grpc-timeout", "1S"),
            ("grpc-metadata-te", "x"),
            ("grpc-metadata-content-length", "7"),
            ("grpc-metadata-host", "elsewhere"),
            ("content-type", "application/json"),
            ("user-agent", "curl"),
        ] {
            headers.insert(
                http::HeaderName::from_static(name),
                http::HeaderValue::from_static(value),
            );
        }
        let metadata = call_metadata(&headers);
        let mut got: Vec<(&str, &str)> = metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("authorization", "token.1"),
                ("hasleader", "true"),
                ("token", "token.2")
            ]
        );
    }
}

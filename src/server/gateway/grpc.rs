//! The metadata of a gateway call: which HTTP headers become gRPC metadata,
//! as etcd's gateway (grpc-gateway) passes them on. The call itself is made
//! in-process ([`crate::server::api::in_process`]).

use hyper::header::{HeaderMap, AUTHORIZATION};

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

#[cfg(test)]
mod tests {
    use super::*;

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

//! `put --gateway`: the put workload sent as JSON to etcd's HTTP/JSON gateway
//! (`POST /v3/kv/put`, key and value in base64) over HTTP/1.1, one keep-alive
//! connection per client (HTTP/1.1 carries one request at a time, so
//! `--conns` does not apply). The same driver, warm-up and figures as the
//! gRPC workloads, so the two rates compare directly on one cluster.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tonic::{Code, Status};

use crate::config::{GlobalOpts, KeyOpts};
use crate::runner::{warm_up_and_measure, Requester};
use crate::stats::{Recorder, Report};
use crate::workload::{value_of_size, KeyGen};
use crate::BenchError;

/// One client: its connection, its keys, and the value already in base64.
pub struct GatewayPut {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    keys: KeyGen,
    value_b64: String,
    timeout: Duration,
}

impl GatewayPut {
    async fn connect(
        endpoint: &str,
        keys: KeyGen,
        value: &[u8],
        timeout: Duration,
    ) -> Result<GatewayPut, Status> {
        let host = endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let stream = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&host))
            .await
            .map_err(|_| Status::deadline_exceeded(format!("connecting to {host}")))?
            .map_err(|e| Status::unavailable(format!("connecting to {host}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Status::unavailable(format!("HTTP/1.1 to {host}: {e}")))?;
        tokio::spawn(connection);
        Ok(GatewayPut {
            sender,
            host,
            keys,
            value_b64: base64(value),
            timeout,
        })
    }

    async fn put(&mut self) -> Result<(), Status> {
        let (_, key) = self.keys.next_key();
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            base64(&key),
            self.value_b64
        );
        let request = Request::builder()
            .method(Method::POST)
            .uri("/v3/kv/put")
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Status::internal(e.to_string()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection to {}: {e}", self.host)))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| Status::unavailable(format!("put to {}: {e}", self.host)))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Status::unavailable(format!("reading from {}: {e}", self.host)))?
            .to_bytes();
        if status.is_success() {
            return Ok(());
        }
        // etcd's error body: {"error", "message", "code"}.
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let code = parsed["code"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok())
            .map_or(Code::Unknown, Code::from_i32);
        let message = parsed["message"]
            .as_str()
            .map_or_else(|| format!("HTTP {status}"), str::to_string);
        Err(Status::new(code, message))
    }
}

impl Requester for GatewayPut {
    async fn issue(&mut self, _rec: &mut Recorder) -> Result<(), Status> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.put()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer within {timeout:?}"
            ))),
        }
    }
}

/// Runs `put --gateway`: setup, warm-up, measured phase.
pub async fn run(
    global: &GlobalOpts,
    keys: &KeyOpts,
    progress: bool,
) -> Result<Report, BenchError> {
    let value = value_of_size(keys.val_size);
    let mut clients = Vec::with_capacity(global.clients);
    for i in 0..global.clients {
        let endpoint = &global.endpoints[i % global.endpoints.len()];
        let client = GatewayPut::connect(
            endpoint,
            KeyGen::new(keys, i, global.clients),
            &value,
            global.timeout,
        )
        .await
        .map_err(|status| BenchError::Setup {
            workload: "put-gateway",
            endpoint: endpoint.clone(),
            status: Box::new(status),
        })?;
        clients.push(client);
    }
    let (measured, warmup_requests) =
        warm_up_and_measure(global, "put-gateway", clients, progress).await?;
    Ok(Report {
        workload: "put-gateway".to_owned(),
        system: None,
        clients: global.clients,
        conns: global.clients,
        target_rate_per_sec: global.rate,
        elapsed: measured.elapsed,
        warmup: global.warmup(),
        warmup_requests,
        recorder: measured.recorder,
        server_cpu_us_per_op: None,
    })
}

/// Standard base64 with padding, as the protobuf JSON mapping writes bytes.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_as_rfc_4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}

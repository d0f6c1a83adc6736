//! How the gateway reports a failed call, as etcd 3.4's gateway (grpc-gateway
//! v1) does: the gRPC status picks the HTTP status, and the body is
//! `{"error": message, "message": message, "code": grpc code}`, with empty
//! strings left out as the protobuf JSON mapping leaves out defaults. In a
//! stream, an error after the first message is one more line,
//! `{"error": {"grpc_code", "http_code", "message", "http_status"}}`.

use hyper::StatusCode;
use serde_json::{json, Map, Value};
use tonic::Code;

/// The HTTP status grpc-gateway v1 gives a gRPC code.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The body of a failed call.
pub fn error_body(code: Code, message: &str) -> Vec<u8> {
    let mut body = Map::new();
    if !message.is_empty() {
        body.insert("error".into(), json!(message));
        body.insert("message".into(), json!(message));
    }
    if code != Code::Ok {
        body.insert("code".into(), json!(code as i32));
    }
    serde_json::to_vec(&Value::Object(body)).expect("a JSON map serializes")
}

/// One stream line saying the stream failed, newline included.
pub fn stream_error_line(code: Code, message: &str) -> Vec<u8> {
    let status = http_status(code);
    let mut error = Map::new();
    if code != Code::Ok {
        error.insert("grpc_code".into(), json!(code as i32));
    }
    error.insert("http_code".into(), json!(status.as_u16()));
    if !message.is_empty() {
        error.insert("message".into(), json!(message));
    }
    error.insert(
        "http_status".into(),
        json!(status.canonical_reason().unwrap_or("")),
    );
    let mut line = serde_json::to_vec(&json!({ "error": error })).expect("JSON serializes");
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_leave_out_empty_fields() {
        let body: Value = serde_json::from_slice(&error_body(Code::Unimplemented, "")).unwrap();
        assert_eq!(body, json!({"code": 12}));
        let body: Value =
            serde_json::from_slice(&error_body(Code::InvalidArgument, "bad")).unwrap();
        assert_eq!(body, json!({"error": "bad", "message": "bad", "code": 3}));
        assert_eq!(http_status(Code::FailedPrecondition).as_u16(), 412);
        assert_eq!(http_status(Code::ResourceExhausted).as_u16(), 429);
        let line = stream_error_line(Code::NotFound, "gone");
        assert!(line.ends_with(b"\n"));
        let line: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            line,
            json!({"error": {"grpc_code": 5, "http_code": 404, "message": "gone", "http_status": "Not Found"}})
        );
    }
}

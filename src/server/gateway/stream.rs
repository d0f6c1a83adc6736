//! Streaming calls over HTTP/1.1, as etcd's gateway streams them: the request
//! body is a sequence of JSON messages (`{"create_request": ...}{"cancel_request":
//! ...}`), each forwarded as it arrives; the response is chunked, one line per
//! message, `{"result": message}`, and a failure after the first message is a
//! last line `{"error": {...}}`.
//!
//! Memory is bounded on both sides. Unparsed request text is capped at the
//! gateway's body limit. Response lines wait in a queue of
//! [`STREAM_QUEUE_MESSAGES`]; when a reader stops reading and the queue stays
//! full for [`STALLED_READER_TIMEOUT`], the connection is cut and the call
//! dropped, which ends the watch or keep-alive stream behind it (the gRPC
//! services keep their own bounded buffers per stream).

use std::time::Duration;
use tonic::Status;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use prost_reflect::MessageDescriptor;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::SendTimeoutError;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::errors::stream_error_line;
use super::json::{message_from_value, response_to_json, JsonError};
use super::json_split::JsonSplitter;
use crate::ops::http::ConnectionCut;
use crate::server::api::in_process::{frame, ResponseFrames};

/// Response lines queued for a slow reader before it counts as stalled.
pub const STREAM_QUEUE_MESSAGES: usize = 64;
/// How long a full queue may wait for its reader before the connection is cut.
pub const STALLED_READER_TIMEOUT: Duration = Duration::from_secs(10);
/// Request messages queued towards the service while it is busy.
pub const REQUEST_QUEUE_MESSAGES: usize = 16;

/// Error type of a streamed response body: a cut ends the connection.
pub type StreamError = Box<dyn std::error::Error + Send + Sync>;

type RequestSender = mpsc::Sender<Result<Frame<Bytes>, Status>>;

/// The body of the gRPC call behind a streamed request: its frames as they are
/// read from the HTTP body, ended by a refusal for a message over the cap.
pub type RequestBody = StreamBody<ReceiverStream<Result<Frame<Bytes>, Status>>>;

/// Why a streamed request could not start.
#[derive(Debug)]
pub enum FirstMessageError {
    /// Its text is not a message of the expected type.
    Json(JsonError),
    /// More unparsed text than the body limit.
    TooLarge,
    /// A message over gRPC's cap (its encoded length).
    MessageTooLarge(usize),
}

/// Reads JSON messages off a request body one at a time, never holding more
/// than `max_pending_bytes` of unparsed text.
pub struct JsonMessages {
    body: Incoming,
    desc: MessageDescriptor,
    pending: JsonSplitter,
    ended: bool,
    max_pending_bytes: usize,
    /// gRPC's message cap, which etcd's gateway meets on every message.
    pub max_message_bytes: usize,
}

impl JsonMessages {
    pub fn new(
        body: Incoming,
        desc: MessageDescriptor,
        max_pending_bytes: usize,
        max_message_bytes: usize,
    ) -> Self {
        JsonMessages {
            body,
            desc,
            pending: JsonSplitter::default(),
            ended: false,
            max_pending_bytes,
            max_message_bytes,
        }
    }

    /// The next message, encoded; `None` at the end of the body (or when the
    /// client went away).
    pub async fn next(&mut self) -> Result<Option<Bytes>, FirstMessageError> {
        loop {
            if let Some(value) = self.pending.next_value(self.ended) {
                return match value {
                    Ok(value) => match message_from_value(&self.desc, value) {
                        Ok(m) if m.len() > self.max_message_bytes => {
                            Err(FirstMessageError::MessageTooLarge(m.len()))
                        }
                        Ok(m) => Ok(Some(m)),
                        Err(e) => Err(FirstMessageError::Json(e)),
                    },
                    Err(e) => Err(FirstMessageError::Json(JsonError::from_serde(&e))),
                };
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if self.pending.unparsed_len() + data.len() > self.max_pending_bytes {
                            return Err(FirstMessageError::TooLarge);
                        }
                        self.pending.push(&data);
                    }
                }
                // A client that went away ends its stream like one that closed it.
                Some(Err(_)) | None => self.ended = true,
            }
        }
    }
}

/// Opens the request side of a streaming call: returns the body to call the
/// service with, and forwards every later message into it from a task. A
/// message that does not parse ends the request stream (the service then
/// finishes as after the client's last message), as etcd's gateway does.
pub fn forward_requests(mut messages: JsonMessages, first: Option<Bytes>) -> RequestBody {
    let (tx, rx) = mpsc::channel(REQUEST_QUEUE_MESSAGES);
    tokio::spawn(async move {
        let Some(first) = first else { return };
        if !send_request(&tx, &first).await {
            return;
        }
        loop {
            match messages.next().await {
                Ok(Some(message)) => {
                    if !send_request(&tx, &message).await {
                        return;
                    }
                }
                Ok(None) => return,
                Err(FirstMessageError::MessageTooLarge(len)) => {
                    // The call ends with etcd's refusal, as over gRPC.
                    let status = crate::grpc::dispatch::too_large(len, messages.max_message_bytes);
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                Err(error) => {
                    tracing::debug!(?error, "gateway stream request ended by bad input");
                    return;
                }
            }
        }
    });
    StreamBody::new(ReceiverStream::new(rx))
}

async fn send_request(tx: &RequestSender, message: &[u8]) -> bool {
    tx.send(Ok(Frame::data(frame(message)))).await.is_ok()
}

/// Streams a call's response messages as `{"result": ...}` lines into a body,
/// cutting the connection when its reader stalls.
pub fn stream_response(
    mut frames: ResponseFrames,
    output: MessageDescriptor,
    cut: Option<ConnectionCut>,
) -> StreamBody<ReceiverStream<Result<Frame<Bytes>, StreamError>>> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, StreamError>>(STREAM_QUEUE_MESSAGES);
    tokio::spawn(async move {
        loop {
            let (line, last) = match frames.next().await {
                Ok(Some(message)) => match result_line(&output, &message) {
                    Ok(line) => (line, false),
                    Err(e) => (stream_error_line(Code::Internal, &e.to_string()), true),
                },
                Ok(None) => return,
                Err(status) => (stream_error_line(status.code(), status.message()), true),
            };
            match tx
                .send_timeout(Ok(Frame::data(Bytes::from(line))), STALLED_READER_TIMEOUT)
                .await
            {
                Ok(()) if !last => {}
                Ok(()) => return,
                Err(SendTimeoutError::Timeout(_)) => {
                    tracing::info!(
                        queued = STREAM_QUEUE_MESSAGES,
                        timeout = ?STALLED_READER_TIMEOUT,
                        "gateway stream reader stopped reading; cutting its connection"
                    );
                    if let Some(cut) = &cut {
                        cut.cut();
                    }
                    return;
                }
                // The reader went away: dropping the call ends the stream behind it.
                Err(SendTimeoutError::Closed(_)) => return,
            }
        }
    });
    StreamBody::new(ReceiverStream::new(rx))
}

/// `{"result": message}` and a newline.
pub fn result_line(output: &MessageDescriptor, message: &[u8]) -> Result<Vec<u8>, JsonError> {
    let mut line = Vec::with_capacity(message.len() * 2 + 16);
    line.extend_from_slice(b"{\"result\":");
    response_to_json(output, message, &mut line)?;
    line.extend_from_slice(b"}\n");
    Ok(line)
}

impl JsonError {
    fn from_serde(e: &serde_json::Error) -> JsonError {
        JsonError::new(e.to_string())
    }
}

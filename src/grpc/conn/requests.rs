//! A connection's requests: HEADERS (and CONTINUATION) that open streams,
//! DATA that carries their bodies, and the start of each call.

use std::panic::AssertUnwindSafe;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures::future::{AbortHandle, Abortable};
use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use super::{protocol, Conn, ConnError, PendingBlock, Recv, Stream};
use super::{CONN_WINDOW, MAX_HEADER_BLOCK_BYTES, MAX_HELD_BYTES, STREAM_WINDOW};
use crate::grpc::dispatch::{self, KvCall, RecvBody};
use crate::grpc::request::RequestHead;
use cairn_proto::h2::frame::{self, ErrorCode, Head};

impl<IO: AsyncRead + AsyncWrite + Unpin> Conn<IO> {
    /// Strips the padding of a PADDED frame.
    pub(super) fn unpad(head: Head, payload: &[u8]) -> Result<&[u8], ConnError> {
        match frame::unpadded(&head, payload) {
            Ok(data) => Ok(&payload[data]),
            Err(frame::PaddingError::NoPadLength) => Err(protocol(
                ErrorCode::FrameSize,
                "PADDED frame without a pad length",
            )),
            Err(frame::PaddingError::TooLong) => Err(protocol(
                ErrorCode::Protocol,
                "padding longer than the frame",
            )),
        }
    }

    pub(super) fn on_data(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(protocol(ErrorCode::Protocol, "DATA on stream 0"));
        }
        let data = Self::unpad(head, payload)?;
        // Flow control counts the whole payload, padding included; the
        // connection's window is given back at once, a stream's as its
        // request is taken.
        self.conn_unacked += head.len;
        if self.conn_unacked >= CONN_WINDOW / 2 {
            frame::put_window_update(&mut self.out, 0, self.conn_unacked);
            self.conn_unacked = 0;
        }
        let end = head.has(frame::FLAG_END_STREAM);
        let Some(stream) = self.streams.get_mut(&head.stream) else {
            if head.stream > self.last_stream {
                return Err(protocol(ErrorCode::Protocol, "DATA on an idle stream"));
            }
            // A stream that ended or that we reset: what the client sent
            // before it learned so is dropped (RFC 9113 §5.1).
            return Ok(());
        };
        let padding = head.len as usize - data.len();
        let adds = match stream.recv {
            Recv::Body { .. } => head.len as usize,
            Recv::Unary { .. } => data.len(),
            Recv::Done | Recv::Discard => 0,
        };
        if self.held + adds > MAX_HELD_BYTES {
            tracing::debug!(
                stream = head.stream,
                held = self.held,
                "request bodies over the connection's budget; stream reset"
            );
            frame::put_rst_stream(&mut self.out, head.stream, ErrorCode::EnhanceYourCalm);
            self.drop_stream(head.stream);
            return Ok(());
        }
        self.held += adds;
        match &mut stream.recv {
            Recv::Done => {
                // DATA after END_STREAM.
                frame::put_rst_stream(&mut self.out, head.stream, ErrorCode::StreamClosed);
                self.drop_stream(head.stream);
            }
            Recv::Discard => {}
            Recv::Body {
                data: tx,
                in_flight,
            } => {
                *in_flight += head.len as usize;
                if *in_flight > STREAM_WINDOW as usize {
                    frame::put_rst_stream(&mut self.out, head.stream, ErrorCode::FlowControl);
                    self.drop_stream(head.stream);
                    return Ok(());
                }
                if !data.is_empty() {
                    let _ = tx.send(Bytes::copy_from_slice(data));
                }
                if padding > 0 {
                    let _ = self.consumed_tx.send((head.stream, padding));
                }
                if end {
                    // What is still in flight is the call's now.
                    self.held = self.held.saturating_sub(*in_flight);
                    stream.recv = Recv::Done;
                }
            }
            Recv::Unary { body, unacked, .. } => {
                body.extend_from_slice(data);
                *unacked += head.len;
                let limit = self.handler.max_message;
                let declared = body
                    .get(1..5)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
                if let Some(len) = declared.filter(|&len| len > limit) {
                    // etcd's answer, as soon as the length prefix shows it.
                    self.held = self.held.saturating_sub(body.len());
                    stream.recv = Recv::Discard;
                    let status = dispatch::too_large(len, limit);
                    let mut outbox = self.outbox.borrow_mut();
                    for piece in dispatch::status_only(&status) {
                        outbox.push(head.stream, piece);
                    }
                    return Ok(());
                }
                if body.len() > limit + 5 + frame::DEFAULT_MAX_FRAME as usize {
                    // More than one message's worth: tonic decides (it may be
                    // several messages); nothing more is buffered.
                    return self.start_unary(head.stream, true);
                }
                if end {
                    return self.start_unary(head.stream, false);
                }
                if *unacked >= STREAM_WINDOW / 2 {
                    frame::put_window_update(&mut self.out, head.stream, *unacked);
                    *unacked = 0;
                }
            }
        }
        Ok(())
    }

    /// A KV call's body is complete (or too long to hold): call it.
    pub(super) fn start_unary(&mut self, id: u32, overlong: bool) -> Result<(), ConnError> {
        let Some(stream) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        let Recv::Unary {
            call,
            mut head,
            body,
            ..
        } = std::mem::replace(
            &mut stream.recv,
            if overlong { Recv::Discard } else { Recv::Done },
        )
        else {
            return Ok(());
        };
        self.held = self.held.saturating_sub(body.len());
        if !overlong {
            if let Some(fut) = dispatch::kv_call(&self.handler, call, &mut head, &self.info, &body)
            {
                let (abort, registration) = AbortHandle::new_pair();
                if let Some(stream) = self.streams.get_mut(&id) {
                    stream.call = Some(abort);
                }
                self.unary.push(Box::pin(async move {
                    let call = Abortable::new(AssertUnwindSafe(fut).catch_unwind(), registration);
                    match call.await {
                        Ok(Ok(pieces)) => (id, pieces),
                        Ok(Err(_panic)) => {
                            tracing::error!(stream = id, "a KV call panicked");
                            let status = tonic::Status::internal("the call failed");
                            (id, dispatch::status_only(&status))
                        }
                        // Reset by the client: nothing to answer.
                        Err(_aborted) => (id, Vec::new()),
                    }
                }));
                return Ok(());
            }
        }
        // Not one plain message: tonic reads it and answers as it would.
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(body.freeze());
        drop(tx);
        self.start_generic(id, *head, rx);
        Ok(())
    }

    pub(super) fn start_generic(
        &mut self,
        id: u32,
        head: RequestHead,
        data: mpsc::UnboundedReceiver<Bytes>,
    ) {
        let body = RecvBody {
            stream: id,
            data,
            consumed: self.consumed_tx.clone(),
            frames: dispatch::MessageFrames::new(self.handler.max_message),
            refused: None,
        };
        let task = dispatch::spawn_generic(
            &self.handler,
            id,
            head,
            &self.info,
            body,
            Rc::clone(&self.outbox),
        );
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.task = task;
        }
    }

    /// A streaming call took `n` octets of its body: the client may send
    /// that much more.
    pub(super) fn body_consumed(&mut self, id: u32, n: usize) {
        let Some(Stream {
            recv: Recv::Body { in_flight, .. },
            ..
        }) = self.streams.get_mut(&id)
        else {
            return;
        };
        let n = n.min(*in_flight);
        *in_flight -= n;
        self.held = self.held.saturating_sub(n);
        if n > 0 {
            frame::put_window_update(&mut self.out, id, n as u32);
        }
    }

    pub(super) fn on_headers(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(protocol(ErrorCode::Protocol, "HEADERS on stream 0"));
        }
        let mut fragment = Self::unpad(head, payload)?;
        if head.has(frame::FLAG_PRIORITY) {
            fragment = fragment.get(5..).ok_or_else(|| {
                protocol(ErrorCode::FrameSize, "HEADERS too short for its priority")
            })?;
        }
        let end_stream = head.has(frame::FLAG_END_STREAM);
        if head.has(frame::FLAG_END_HEADERS) {
            return self.on_header_block(head.stream, end_stream, fragment);
        }
        self.pending_block = Some(PendingBlock {
            stream: head.stream,
            end_stream,
            block: fragment.to_vec(),
        });
        Ok(())
    }

    pub(super) fn on_continuation(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let Some(pending) = &mut self.pending_block else {
            return Err(protocol(
                ErrorCode::Protocol,
                "CONTINUATION without HEADERS",
            ));
        };
        pending.block.extend_from_slice(payload);
        if pending.block.len() > MAX_HEADER_BLOCK_BYTES {
            return Err(protocol(
                ErrorCode::EnhanceYourCalm,
                "header block over 64 KiB",
            ));
        }
        if !head.has(frame::FLAG_END_HEADERS) {
            return Ok(());
        }
        let Some(pending) = self.pending_block.take() else {
            return Ok(());
        };
        self.on_header_block(pending.stream, pending.end_stream, &pending.block)
    }

    pub(super) fn on_header_block(
        &mut self,
        id: u32,
        end_stream: bool,
        block: &[u8],
    ) -> Result<(), ConnError> {
        // Every block is decoded, even of a stream that is refused: the
        // dynamic table must follow the client's.
        self.decoder
            .decode(block, &mut self.block)
            .map_err(|e| protocol(ErrorCode::Compression, e.to_string()))?;
        if let Some(stream) = self.streams.get_mut(&id) {
            // Trailers of a request: they end its body.
            if !end_stream {
                frame::put_rst_stream(&mut self.out, id, ErrorCode::Protocol);
                self.drop_stream(id);
                return Ok(());
            }
            match &stream.recv {
                Recv::Unary { .. } => return self.start_unary(id, false),
                Recv::Body { in_flight, .. } => {
                    self.held = self.held.saturating_sub(*in_flight);
                    stream.recv = Recv::Done;
                }
                Recv::Done | Recv::Discard => {}
            }
            return Ok(());
        }
        if !id.is_multiple_of(2) && id <= self.last_stream {
            // A stream that ended or that we reset (trailers crossing our
            // answer): ignored, its block decoded above.
            return Ok(());
        }
        if id.is_multiple_of(2) || id <= self.last_stream {
            return Err(protocol(
                ErrorCode::Protocol,
                format!("HEADERS opening stream {id} after {}", self.last_stream),
            ));
        }
        self.last_stream = id;
        if self.going_away {
            frame::put_rst_stream(&mut self.out, id, ErrorCode::RefusedStream);
            return Ok(());
        }
        let full = |limit: u32| self.streams.len() >= limit as usize;
        if self.handler.max_streams.is_some_and(full) {
            frame::put_rst_stream(&mut self.out, id, ErrorCode::RefusedStream);
            return Ok(());
        }
        let head = RequestHead::of(&self.block);
        let head_bytes = head.held_bytes();
        if self.held + head_bytes > MAX_HELD_BYTES {
            tracing::debug!(
                stream = id,
                held = self.held,
                "request header lists and bodies over the connection's budget; stream reset"
            );
            frame::put_rst_stream(&mut self.out, id, ErrorCode::EnhanceYourCalm);
            return Ok(());
        }
        let (call, refusal) = match head.validate() {
            Ok(path) => (
                KvCall::of(&head, path),
                self.handler.gate.refusal(path, &head.headers),
            ),
            Err(why) => {
                tracing::debug!(stream = id, why, "malformed request refused");
                frame::put_rst_stream(&mut self.out, id, ErrorCode::Protocol);
                return Ok(());
            }
        };
        self.outbox.borrow_mut().open(id);
        self.held += head_bytes;
        if let Some(status) = refusal {
            // Refused before it starts: its body is dropped.
            let recv = if end_stream {
                Recv::Done
            } else {
                Recv::Discard
            };
            self.streams.insert(id, Stream::new(recv, head_bytes));
            let mut outbox = self.outbox.borrow_mut();
            for piece in dispatch::status_only(&status) {
                outbox.push(id, piece);
            }
            return Ok(());
        }
        match call {
            Some(call) => {
                self.streams.insert(
                    id,
                    Stream::new(
                        Recv::Unary {
                            call,
                            head: Box::new(head),
                            body: BytesMut::new(),
                            unacked: 0,
                        },
                        head_bytes,
                    ),
                );
                if end_stream {
                    self.start_unary(id, false)?;
                }
            }
            None => {
                let (tx, rx) = mpsc::unbounded_channel();
                let recv = if end_stream {
                    Recv::Done
                } else {
                    Recv::Body {
                        data: tx,
                        in_flight: 0,
                    }
                };
                self.streams.insert(id, Stream::new(recv, head_bytes));
                self.start_generic(id, head, rx);
            }
        }
        Ok(())
    }
}

//! The receive side: the read loop that decodes frames in place in the
//! receive buffer, and what each kind of frame does.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::{CloseReason, Counters, Inbound, LinkShared};
use crate::frame::{Frame, FrameDecoder, FrameKind};
use crate::stream::{self, RxStream, StreamAbortReason};

pub(super) async fn read_loop<R: AsyncRead + Unpin>(
    shared: &LinkShared,
    rd: &mut R,
    tx: &mpsc::Sender<Vec<Inbound>>,
    rx_stream: &mut Option<RxStream>,
) -> CloseReason {
    let config = &shared.config;
    let mut decoder = FrameDecoder::new(config.max_frame_payload_bytes, config.read_buffer_bytes);
    let stall = Duration::from_millis(config.stall_timeout_ms);
    loop {
        decoder.prepare_read();
        let buffered_bytes = decoder.buffered_bytes();
        // Reads are capped below the buffer size so the bytes of each read are
        // still in cache when the CRC pass over them runs.
        let mut limited = (&mut *rd).take(config.read_chunk_bytes as u64);
        let read = limited.read_buf(decoder.buffer_mut());
        let n = if buffered_bytes > 0 {
            match tokio::time::timeout(stall, read).await {
                Ok(r) => r,
                Err(_) => {
                    return CloseReason::Stalled {
                        stall_timeout_ms: config.stall_timeout_ms,
                        buffered_bytes,
                    }
                }
            }
        } else {
            read.await
        };
        match n {
            Ok(0) if buffered_bytes > 0 => return CloseReason::EofMidFrame { buffered_bytes },
            Ok(0) => return CloseReason::PeerClosed,
            Ok(n) => Counters::add(&shared.counters.bytes_received, n as u64),
            Err(err) => return CloseReason::Io(err),
        }
        let mut batch = Vec::new();
        let mut failure = None;
        let mut decoded_frames = 0u64;
        loop {
            match decoder.decode() {
                Ok(Some(frame)) => {
                    decoded_frames += 1;
                    if let Err(reason) = handle_frame(shared, frame, &mut batch, rx_stream) {
                        failure = Some(reason);
                        break;
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    failure = Some(CloseReason::BadInput(err));
                    break;
                }
            }
        }
        // One atomic add per read, not per frame.
        Counters::add(&shared.counters.frames_received, decoded_frames);
        let frames = batch.len();
        // Frames that arrived whole before a bad one are still delivered. A
        // dropped receiver means inbound frames are not wanted (a send-only
        // link); they are discarded and the link keeps sending.
        if frames > 0 {
            let _ = tx.send(batch).await;
        }
        if let Some(reason) = failure {
            return reason;
        }
        // Credit only what the consumer has taken in: the send above returned.
        if let Some(rx) = rx_stream.as_mut() {
            if rx.chunks > rx.acked_chunks {
                rx.acked_chunks = rx.chunks;
                // A full control queue only delays the sender until the next ack.
                let _ = shared.enqueue(
                    FrameKind::StreamAck,
                    0,
                    rx.shard_id,
                    stream::encode_ack(rx.stream_id, rx.chunks),
                    Vec::new(),
                    true,
                );
            }
        }
    }
}

fn violation(kind: FrameKind, len: usize) -> CloseReason {
    CloseReason::ProtocolViolation(format!("malformed {kind:?} payload of {len} bytes"))
}

fn handle_frame(
    shared: &LinkShared,
    frame: Frame,
    batch: &mut Vec<Inbound>,
    rx_stream: &mut Option<RxStream>,
) -> Result<(), CloseReason> {
    let Frame {
        kind,
        flags,
        shard_id,
        payload,
    } = frame;
    match kind {
        FrameKind::Message => batch.push(Inbound::Message {
            shard_id,
            flags,
            payload,
        }),
        FrameKind::StreamStart => {
            let (stream_id, attempt) =
                stream::decode_start(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            if let Some(old) = rx_stream.take() {
                batch.push(Inbound::StreamAborted {
                    stream_id: old.stream_id,
                    shard_id: old.shard_id,
                    reason: StreamAbortReason::Superseded,
                });
            }
            *rx_stream = Some(RxStream::new(stream_id, shard_id));
            batch.push(Inbound::StreamStart {
                stream_id,
                shard_id,
                attempt,
            });
        }
        FrameKind::StreamChunk => {
            let (stream_id, data) =
                stream::decode_chunk(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            // Chunks of an attempt that was given up are dropped quietly.
            if let Some(rx) = rx_stream.as_mut().filter(|rx| rx.stream_id == stream_id) {
                rx.hasher.update(&data);
                rx.total_bytes += data.len() as u64;
                rx.chunks += 1;
                batch.push(Inbound::StreamChunk {
                    stream_id,
                    shard_id: rx.shard_id,
                    data,
                });
            }
        }
        FrameKind::StreamEnd => {
            let (stream_id, total_bytes, crc) =
                stream::decode_end(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            let ok = match rx_stream.take() {
                Some(rx) if rx.stream_id == stream_id => {
                    let ok = rx.total_bytes == total_bytes && rx.hasher.finalize() == crc;
                    batch.push(if ok {
                        Inbound::StreamEnd {
                            stream_id,
                            shard_id: rx.shard_id,
                            total_bytes,
                        }
                    } else {
                        Inbound::StreamAborted {
                            stream_id,
                            shard_id: rx.shard_id,
                            reason: StreamAbortReason::ChecksumMismatch,
                        }
                    });
                    ok
                }
                other => {
                    *rx_stream = other;
                    false
                }
            };
            let _ = shared.enqueue(
                FrameKind::StreamResult,
                0,
                shard_id,
                stream::encode_result(stream_id, ok),
                Vec::new(),
                true,
            );
        }
        FrameKind::StreamAck => {
            let (stream_id, chunks) =
                stream::decode_ack(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            shared.on_stream_ack(stream_id, chunks);
        }
        FrameKind::StreamResult => {
            let (stream_id, ok) =
                stream::decode_result(&payload).ok_or_else(|| violation(kind, payload.len()))?;
            shared.on_stream_result(stream_id, ok);
        }
        FrameKind::Hello | FrameKind::HelloAccept | FrameKind::HelloRefuse => {
            return Err(CloseReason::ProtocolViolation(format!(
                "{kind:?} frame after the handshake"
            )));
        }
    }
    Ok(())
}

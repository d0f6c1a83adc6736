//! Streams out: a large transfer sent as chunks within the peer's window,
//! started over from the first byte when its connection fails.

use std::io;
use std::time::Duration;

use super::Link;
use crate::frame::FrameKind;
use crate::stream::{self, StreamAbortReason, StreamError, StreamReport, StreamSource, TxStream};

impl Link {
    /// Sends a large transfer as a flow-controlled stream of chunks, starting
    /// over from the first byte on failure (see [`crate::stream`]). One stream
    /// at a time per link; concurrent callers wait their turn. While the peer
    /// is unreachable a dialed link waits for it to come back (attempts are
    /// spent only on connections that fail mid-stream), so wrap the call in a
    /// timeout if the transfer has a deadline.
    pub async fn send_stream(
        &self,
        shard_id: u32,
        source: &mut dyn StreamSource,
    ) -> Result<StreamReport, StreamError> {
        let shared = &self.shared;
        let closed = || StreamError::Closed {
            shard_id,
            peer_member: shared.peer_member,
        };
        let _slot = shared.stream_slot.acquire().await.map_err(|_| closed())?;
        let mut last = StreamAbortReason::ConnectionLost;
        for attempt in 1..=shared.config.stream_max_attempts {
            let epoch = self.wait_connected_epoch().await.map_err(|_| closed())?;
            source.rewind().map_err(|source| StreamError::Source {
                shard_id,
                peer_member: shared.peer_member,
                source,
            })?;
            let stream_id = shared.next_stream_id.get();
            shared.next_stream_id.set(stream_id + 1);
            *shared.tx_stream.borrow_mut() = Some(TxStream {
                stream_id,
                ..TxStream::default()
            });
            let outcome = self
                .stream_attempt(shard_id, stream_id, attempt, epoch, source)
                .await;
            *shared.tx_stream.borrow_mut() = None;
            match outcome {
                Ok(report) => return Ok(report),
                Err(AttemptError::Source(source)) => {
                    return Err(StreamError::Source {
                        shard_id,
                        peer_member: shared.peer_member,
                        source,
                    })
                }
                Err(AttemptError::Aborted(reason)) => {
                    if shared.closed.get() {
                        return Err(closed());
                    }
                    tracing::warn!(
                        local_member = shared.config.member_id,
                        peer_member = shared.peer_member,
                        shard = shard_id,
                        stream_id,
                        attempt,
                        %reason,
                        "stream attempt failed; starting over"
                    );
                    last = reason;
                }
            }
        }
        Err(StreamError::AttemptsExhausted {
            shard_id,
            peer_member: shared.peer_member,
            attempts: shared.config.stream_max_attempts,
            last,
        })
    }

    async fn stream_attempt(
        &self,
        shard_id: u32,
        stream_id: u64,
        attempt: u32,
        epoch: u64,
        source: &mut dyn StreamSource,
    ) -> Result<StreamReport, AttemptError> {
        let shared = &self.shared;
        let lost = |_| AttemptError::Aborted(StreamAbortReason::ConnectionLost);
        let chunk_max_bytes = shared.config.stream_chunk_bytes;
        let window = shared.config.stream_window_chunks as u64;
        let prefix = stream::encode_chunk_prefix(stream_id);
        shared
            .enqueue_wait(
                FrameKind::StreamStart,
                shard_id,
                stream::encode_start(stream_id, attempt),
                Vec::new(),
                Some(epoch),
            )
            .await
            .map_err(lost)?;
        let mut hasher = crc32fast::Hasher::new();
        let mut total_bytes = 0u64;
        let mut chunks = 0u64;
        while let Some(mut data) = source
            .next_chunk(chunk_max_bytes)
            .map_err(AttemptError::Source)?
        {
            while !data.is_empty() {
                let piece = data.split_to(data.len().min(chunk_max_bytes));
                loop {
                    if shared.epoch.get() != epoch || shared.closed.get() {
                        return Err(AttemptError::Aborted(StreamAbortReason::ConnectionLost));
                    }
                    let acked = shared
                        .tx_stream
                        .borrow()
                        .as_ref()
                        .map_or(0, |t| t.acked_chunks);
                    if chunks - acked < window {
                        break;
                    }
                    shared.state_wake.notified().await;
                }
                hasher.update(&piece);
                total_bytes += piece.len() as u64;
                chunks += 1;
                shared
                    .enqueue_wait(
                        FrameKind::StreamChunk,
                        shard_id,
                        prefix.clone(),
                        vec![piece],
                        Some(epoch),
                    )
                    .await
                    .map_err(lost)?;
            }
        }
        let crc = hasher.finalize();
        shared
            .enqueue_wait(
                FrameKind::StreamEnd,
                shard_id,
                stream::encode_end(stream_id, total_bytes, crc),
                Vec::new(),
                Some(epoch),
            )
            .await
            .map_err(lost)?;
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(shared.config.stream_result_timeout_ms);
        loop {
            // The verdict first: it may arrive in the same read as the close.
            let verdict = shared.tx_stream.borrow().as_ref().and_then(|t| t.result);
            if verdict.is_none() && (shared.epoch.get() != epoch || shared.closed.get()) {
                return Err(AttemptError::Aborted(StreamAbortReason::ConnectionLost));
            }
            match verdict {
                Some(true) => {
                    return Ok(StreamReport {
                        stream_id,
                        total_bytes,
                        chunks,
                        attempts: attempt,
                        crc,
                    })
                }
                Some(false) => {
                    return Err(AttemptError::Aborted(StreamAbortReason::ChecksumMismatch))
                }
                None => {}
            }
            if tokio::time::timeout_at(deadline, shared.state_wake.notified())
                .await
                .is_err()
            {
                return Err(AttemptError::Aborted(StreamAbortReason::ResultTimeout));
            }
        }
    }
}

enum AttemptError {
    Source(io::Error),
    Aborted(StreamAbortReason),
}

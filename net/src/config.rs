//! Transport settings, every limit named and checked by [`Config::validate`].

use thiserror::Error;

use crate::frame::{HEADER_BYTES, MAX_PAYLOAD_LIMIT_BYTES, MIN_PAYLOAD_LIMIT_BYTES};
use crate::stream::STREAM_CHUNK_PREFIX_BYTES;

/// Most slices one vectored write may carry (Linux `IOV_MAX`).
pub const IOV_MAX_SLICES: usize = 1024;
/// Fewest slices a vectored write must be allowed: one header and one payload.
pub const MIN_WRITEV_SLICES: usize = 2;
/// Smallest receive buffer worth reading into.
pub const MIN_READ_BUFFER_BYTES: usize = 4096;
/// Largest receive buffer a connection may hold beyond its largest frame.
pub const MAX_READ_BUFFER_BYTES: usize = 64 << 20;
/// Largest stream window: bounds receiver-side acks and sender-side memory.
pub const MAX_STREAM_WINDOW_CHUNKS: usize = 4096;

const _: () = assert!(MIN_WRITEV_SLICES <= IOV_MAX_SLICES);
const _: () = assert!(MIN_READ_BUFFER_BYTES >= HEADER_BYTES);
const _: () = assert!(STREAM_CHUNK_PREFIX_BYTES < MIN_PAYLOAD_LIMIT_BYTES as usize);

/// Settings for one member's transport: identity and every limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Cluster this member belongs to; a peer naming another is refused.
    pub cluster_id: u64,
    /// This member's id, sent in every handshake.
    pub member_id: u64,
    /// Largest payload sent or accepted; a larger announced length closes the
    /// connection before any buffer is reserved for it.
    pub max_frame_payload_bytes: u32,
    /// Size of a receive buffer: payloads are slices of it, so one buffer is
    /// freed only when every payload it holds has been dropped.
    pub read_buffer_bytes: usize,
    /// Most bytes taken in by one `read` call: small enough that what was just
    /// read is still in cache for the CRC check (measured: 128 KiB beats 1 MiB
    /// by a quarter at 64 KiB frames), large enough to amortise the call.
    pub read_chunk_bytes: usize,
    /// Most bytes (headers included) queued or in flight per connection.
    pub send_queue_max_bytes: usize,
    /// Most frames queued or in flight per connection.
    pub send_queue_max_frames: usize,
    /// Most slices in one vectored write.
    pub writev_max_slices: usize,
    /// Decoded batches (one per socket read) buffered for the consumer before
    /// the reader stops reading and TCP pushes back on the peer.
    pub inbound_queue_batches: usize,
    /// Time a handshake may take, either side.
    pub handshake_timeout_ms: u64,
    /// Time a peer may leave a frame half sent before the connection closes.
    pub stall_timeout_ms: u64,
    /// Time a TCP connect may take.
    pub connect_timeout_ms: u64,
    /// First reconnect delay; doubles per failure up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    /// Cap of the reconnect delay.
    pub backoff_max_ms: u64,
    /// Idle time before TCP keepalive probes start.
    pub keepalive_idle_ms: u64,
    /// Time between keepalive probes.
    pub keepalive_interval_ms: u64,
    /// Unanswered probes before the kernel declares the peer dead.
    pub keepalive_retries: u32,
    /// TCP_USER_TIMEOUT: how long sent data may stay unacknowledged.
    pub tcp_user_timeout_ms: u64,
    /// Payload bytes per stream chunk.
    pub stream_chunk_bytes: usize,
    /// Chunks a stream sender may have unacknowledged.
    pub stream_window_chunks: usize,
    /// Attempts (each from the first byte) before a stream transfer fails.
    pub stream_max_attempts: u32,
    /// Time to wait for the receiver's verdict after the end marker.
    pub stream_result_timeout_ms: u64,
    /// Handshakes a listener runs at once; more connections are closed at once.
    pub max_pending_handshakes: usize,
    /// TLS for this member's connections: when set, the listener accepts
    /// only TLS (then the greeting inside it) and [`crate::dial`] speaks TLS,
    /// checking the peer's certificate against the dialed host.
    pub tls: Option<crate::tls::PeerTls>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_id: 0,
            member_id: 0,
            max_frame_payload_bytes: crate::frame::DEFAULT_MAX_PAYLOAD_BYTES,
            read_buffer_bytes: 1 << 20,
            read_chunk_bytes: 128 << 10,
            send_queue_max_bytes: 64 << 20,
            send_queue_max_frames: 64 * 1024,
            writev_max_slices: IOV_MAX_SLICES,
            inbound_queue_batches: 64,
            handshake_timeout_ms: 5_000,
            stall_timeout_ms: 10_000,
            connect_timeout_ms: 3_000,
            backoff_initial_ms: 50,
            backoff_max_ms: 5_000,
            keepalive_idle_ms: 10_000,
            keepalive_interval_ms: 2_000,
            keepalive_retries: 5,
            tcp_user_timeout_ms: 30_000,
            stream_chunk_bytes: 1 << 20,
            stream_window_chunks: 8,
            stream_max_attempts: 5,
            stream_result_timeout_ms: 30_000,
            max_pending_handshakes: 256,
            tls: None,
        }
    }
}

/// A setting out of range, named with its value and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("net config: {field} = {value} is invalid: {rule}")]
    Invalid {
        field: &'static str,
        value: u64,
        rule: &'static str,
    },
}

fn check(field: &'static str, value: u64, ok: bool, rule: &'static str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid { field, value, rule })
    }
}

impl Config {
    /// Checks every limit and the relations between them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let max_payload = self.max_frame_payload_bytes;
        check(
            "max_frame_payload_bytes",
            max_payload.into(),
            (MIN_PAYLOAD_LIMIT_BYTES..=MAX_PAYLOAD_LIMIT_BYTES).contains(&max_payload),
            "must be within 4 KiB..=1 GiB",
        )?;
        check(
            "read_buffer_bytes",
            self.read_buffer_bytes as u64,
            (MIN_READ_BUFFER_BYTES..=MAX_READ_BUFFER_BYTES).contains(&self.read_buffer_bytes),
            "must be within 4 KiB..=64 MiB",
        )?;
        check(
            "read_chunk_bytes",
            self.read_chunk_bytes as u64,
            (MIN_READ_BUFFER_BYTES..=self.read_buffer_bytes).contains(&self.read_chunk_bytes),
            "must be within 4 KiB..=read_buffer_bytes",
        )?;
        let largest_frame = HEADER_BYTES + max_payload as usize;
        check(
            "send_queue_max_bytes",
            self.send_queue_max_bytes as u64,
            self.send_queue_max_bytes >= largest_frame,
            "must hold at least one frame of max_frame_payload_bytes plus its header",
        )?;
        check(
            "send_queue_max_frames",
            self.send_queue_max_frames as u64,
            self.send_queue_max_frames >= 1,
            "must be at least 1",
        )?;
        check(
            "writev_max_slices",
            self.writev_max_slices as u64,
            (MIN_WRITEV_SLICES..=IOV_MAX_SLICES).contains(&self.writev_max_slices),
            "must be within 2..=1024 (IOV_MAX)",
        )?;
        check(
            "inbound_queue_batches",
            self.inbound_queue_batches as u64,
            self.inbound_queue_batches >= 1,
            "must be at least 1",
        )?;
        for (field, value) in [
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("stall_timeout_ms", self.stall_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("backoff_initial_ms", self.backoff_initial_ms),
            ("keepalive_idle_ms", self.keepalive_idle_ms),
            ("keepalive_interval_ms", self.keepalive_interval_ms),
            ("tcp_user_timeout_ms", self.tcp_user_timeout_ms),
            ("stream_result_timeout_ms", self.stream_result_timeout_ms),
        ] {
            check(field, value, value > 0, "must be positive")?;
        }
        check(
            "backoff_max_ms",
            self.backoff_max_ms,
            self.backoff_max_ms >= self.backoff_initial_ms,
            "must be at least backoff_initial_ms",
        )?;
        check(
            "keepalive_retries",
            self.keepalive_retries.into(),
            self.keepalive_retries >= 1,
            "must be at least 1",
        )?;
        check(
            "stream_chunk_bytes",
            self.stream_chunk_bytes as u64,
            self.stream_chunk_bytes >= 1
                && self.stream_chunk_bytes + STREAM_CHUNK_PREFIX_BYTES <= max_payload as usize,
            "must be positive and, with its 8-byte stream id, fit max_frame_payload_bytes",
        )?;
        check(
            "stream_window_chunks",
            self.stream_window_chunks as u64,
            (1..=MAX_STREAM_WINDOW_CHUNKS).contains(&self.stream_window_chunks)
                && self.stream_window_chunks < self.send_queue_max_frames.max(2),
            "must be within 1..=4096 and below send_queue_max_frames",
        )?;
        check(
            "stream_max_attempts",
            self.stream_max_attempts.into(),
            self.stream_max_attempts >= 1,
            "must be at least 1",
        )?;
        check(
            "max_pending_handshakes",
            self.max_pending_handshakes as u64,
            self.max_pending_handshakes >= 1,
            "must be at least 1",
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn oversize_limit_is_refused_with_its_name() {
        let config = Config {
            max_frame_payload_bytes: MAX_PAYLOAD_LIMIT_BYTES + 1,
            ..Config::default()
        };
        let err = config.validate().unwrap_err();
        assert!(err.to_string().contains("max_frame_payload_bytes"), "{err}");
    }

    #[test]
    fn queue_smaller_than_a_frame_is_refused() {
        let config = Config {
            send_queue_max_bytes: 1024,
            ..Config::default()
        };
        assert!(config
            .validate()
            .unwrap_err()
            .to_string()
            .contains("send_queue_max_bytes"));
    }
}

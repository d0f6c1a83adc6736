//! Guards a member against peers that send what they should not, before and
//! after the handshake: garbage, bad magic, bad CRC, oversize lengths, unknown
//! kinds, frames left half sent, handshake frames out of place and malformed
//! stream control. Each must close only that connection, with exactly one log
//! line naming the peer address and the reason, never a panic, and never a
//! buffer reserved for an attacker-chosen length.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_net::frame::{encode_frame, FrameKind, HEADER_BYTES};
use cairn_net::handshake::dial_handshake;
use cairn_net::{
    accept_handshake, serve_accepted, AcceptPolicy, HandshakeError, Inbound, InboundReceiver, Link,
    MemberSet,
};
use common::{config, listener, run_local, LogCapture};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A raw client that completed a real handshake, and the link serving it.
async fn established() -> (TcpStream, Link, InboundReceiver) {
    let mut listener = listener(1, &[2], 1).await;
    let mut raw = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let dialer_config = config(2);
    let (accepted, dialed) = tokio::join!(
        listener.accept(),
        dial_handshake(&mut raw, &dialer_config, 1, 0)
    );
    dialed.unwrap();
    let (link, rx) = serve_accepted(accepted, &config(1)).unwrap();
    (raw, link, rx)
}

/// Sends `bytes`, then checks the connection closes with one log line that
/// names the client's address and contains `reason`. Returns the messages
/// delivered before the close and how long the close took.
fn closes_with(bytes: Vec<u8>, then_shutdown: bool, reason: &str) -> (Vec<Bytes>, Duration) {
    let logs = LogCapture::start();
    let (delivered, took, link) = run_local(async {
        let (mut raw, link, mut rx) = established().await;
        let client_addr = raw.local_addr().unwrap();
        raw.write_all(&bytes).await.unwrap();
        if then_shutdown {
            raw.shutdown().await.unwrap();
        }
        let started = Instant::now();
        let mut delivered = Vec::new();
        while let Some(item) = rx.recv().await {
            match item {
                Inbound::Message { payload, .. } => delivered.push(payload),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(link.is_closed());
        (delivered, started.elapsed(), (link, client_addr))
    });
    let (link, client_addr) = link;
    let lines = logs.lines_with("closing peer connection");
    assert_eq!(lines.len(), 1, "exactly one close line: {lines:#?}");
    assert!(
        lines[0].contains(&client_addr.to_string()),
        "names the peer address: {}",
        lines[0]
    );
    assert!(
        lines[0].contains("peer_member=2"),
        "names the peer member: {}",
        lines[0]
    );
    assert!(
        lines[0].contains(reason),
        "names the reason {reason:?}: {}",
        lines[0]
    );
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert_eq!(link.counters().snapshot().bad_input_closes, 1);
    (delivered, took)
}

#[test]
fn garbage_closes_the_connection() {
    let (delivered, _) = closes_with(
        b"\x16\x03\x01 not a cairn frame at all".to_vec(),
        false,
        "bad magic",
    );
    assert!(delivered.is_empty());
}

#[test]
fn bad_magic_after_good_frames_closes_after_delivering_them() {
    let mut bytes = encode_frame(FrameKind::Message, 0, 1, b"good");
    let mut bad = encode_frame(FrameKind::Message, 0, 1, b"bad");
    bad[..4].copy_from_slice(b"HTTP");
    bytes.extend_from_slice(&bad);
    let (delivered, _) = closes_with(bytes, false, "bad magic");
    assert_eq!(delivered, vec![Bytes::from_static(b"good")]);
}

#[test]
fn bad_crc_closes_the_connection() {
    let mut bytes = encode_frame(FrameKind::Message, 0, 1, b"payload");
    *bytes.last_mut().unwrap() ^= 0x40;
    closes_with(bytes, false, "crc mismatch");
}

#[test]
fn oversize_length_closes_at_once_without_reserving_it() {
    let mut header = encode_frame(FrameKind::Message, 0, 1, b"")[..HEADER_BYTES].to_vec();
    let announced = config(1).max_frame_payload_bytes + 1;
    header[12..16].copy_from_slice(&announced.to_le_bytes());
    // No payload follows: the close must not wait for one (nor for the stall
    // timeout), since the length alone is refused.
    let (_, took) = closes_with(header, false, "exceeds the maximum");
    assert!(
        took < Duration::from_millis(250),
        "closed on the header alone, took {took:?}"
    );
}

#[test]
fn unknown_kind_closes_the_connection() {
    let mut bytes = encode_frame(FrameKind::Message, 0, 1, b"x");
    bytes[5] = 0xEE;
    closes_with(bytes, false, "unknown frame kind 238");
}

#[test]
fn a_frame_stalled_midway_closes_after_the_stall_timeout() {
    let frame = encode_frame(FrameKind::Message, 0, 1, &[7; 1000]);
    let (_, took) = closes_with(frame[..500].to_vec(), false, "stalled mid-frame");
    assert!(
        took >= Duration::from_millis(250),
        "waited for the stall timeout, took {took:?}"
    );
}

#[test]
fn eof_mid_frame_is_reported_as_such() {
    let frame = encode_frame(FrameKind::Message, 0, 1, &[7; 1000]);
    closes_with(frame[..30].to_vec(), true, "middle of a frame");
}

#[test]
fn handshake_frame_after_the_handshake_closes() {
    closes_with(
        encode_frame(FrameKind::Hello, 0, 0, &[0; 28]),
        false,
        "protocol violation",
    );
}

#[test]
fn malformed_stream_control_closes() {
    closes_with(
        encode_frame(FrameKind::StreamAck, 0, 0, &[1, 2, 3]),
        false,
        "malformed StreamAck",
    );
}

fn policy() -> AcceptPolicy {
    AcceptPolicy {
        config: config(1),
        members: MemberSet::new([2]),
        lane_count: 1,
    }
}

/// Runs `client` against a bare `accept_handshake` and returns its error.
async fn handshake_error_for(bytes: Vec<u8>) -> HandshakeError {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = tokio::task::spawn_local(async move {
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(&bytes).await.unwrap();
        // Hold the socket open so only the acceptor's checks end it.
        tokio::time::sleep(Duration::from_secs(3)).await;
    });
    let (stream, _) = listener.accept().await.unwrap();
    let mut short = policy();
    short.config.handshake_timeout_ms = 300;
    let err = accept_handshake(stream, &short).await.unwrap_err();
    client.abort();
    err
}

#[test]
fn garbage_instead_of_a_greeting_is_refused() {
    let logs = LogCapture::start();
    let err = run_local(handshake_error_for(
        b"GET / HTTP/1.1\r\nHost: cairn\r\n\r\n".to_vec(),
    ));
    assert!(matches!(err, HandshakeError::BadFrame { .. }), "{err}");
    assert_eq!(logs.lines_with("peer handshake failed").len(), 1);
}

#[test]
fn oversize_greeting_is_refused_before_reading_it() {
    let mut header = encode_frame(FrameKind::Hello, 0, 0, b"")[..HEADER_BYTES].to_vec();
    header[12..16].copy_from_slice(&(64u32 << 20).to_le_bytes());
    let err = run_local(handshake_error_for(header));
    assert!(err.to_string().contains("exceeds the maximum 512"), "{err}");
}

#[test]
fn silent_client_times_out_of_the_handshake() {
    let err = run_local(handshake_error_for(Vec::new()));
    assert!(
        matches!(
            err,
            HandshakeError::Timeout {
                timeout_ms: 300,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn listener_keeps_accepting_after_a_bad_client() {
    run_local(async {
        let mut listener = listener(1, &[2], 1).await;
        let addr = listener.local_addr().unwrap();
        let mut bad = TcpStream::connect(addr).await.unwrap();
        bad.write_all(b"garbage garbage garbage").await.unwrap();
        let mut good = TcpStream::connect(addr).await.unwrap();
        let dialer_config = config(2);
        let (accepted, dialed) = tokio::join!(
            listener.accept(),
            dial_handshake(&mut good, &dialer_config, 1, 0)
        );
        dialed.unwrap();
        assert_eq!(accepted.hello.member_id, 2);
    });
}

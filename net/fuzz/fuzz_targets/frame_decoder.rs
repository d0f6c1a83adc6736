//! Fuzzes the frame decoder with arbitrary byte streams delivered in arbitrary
//! pieces: it must never panic, never hold more than the bytes it was given
//! plus its bounded buffers, never return a payload over the maximum, and after
//! an error keep returning that error.

#![no_main]

use cairn_net::frame::{encode_frame, FrameDecoder, FrameKind, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

/// Small limits so the fuzzer reaches the length checks and buffer turnover.
const MAX_PAYLOAD_BYTES: u32 = 4096;
const READ_BUFFER_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    // The first byte chooses how the rest is cut into reads, so the fuzzer
    // explores split points as well as contents.
    let Some((&cut_seed, stream)) = data.split_first() else {
        return;
    };
    let piece_bytes = usize::from(cut_seed % 64) + 1;
    // With the top bit set, the input describes frames that are encoded with
    // valid CRCs (then one byte may be flipped), so the fuzzer reaches the
    // paths past the CRC check that random bytes almost never pass.
    let encoded;
    let stream = if cut_seed & 0x80 != 0 {
        encoded = encode_described_frames(stream);
        &encoded[..]
    } else {
        stream
    };
    let mut decoder = FrameDecoder::new(MAX_PAYLOAD_BYTES, READ_BUFFER_BYTES);
    let mut held = Vec::new();
    let mut fed = 0usize;
    for piece in stream.chunks(piece_bytes) {
        decoder.prepare_read();
        decoder.extend_from_slice(piece);
        fed += piece.len();
        loop {
            match decoder.decode() {
                Ok(Some(frame)) => {
                    assert!(frame.payload.len() <= MAX_PAYLOAD_BYTES as usize);
                    // Keep some payloads alive so buffers are retired, pooled
                    // and reused while slices of them are still held.
                    if held.len() < 8 {
                        held.push(frame.payload);
                    } else {
                        held.clear();
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    assert_eq!(decoder.decode().unwrap_err(), err);
                    return;
                }
            }
        }
        assert!(decoder.buffered_bytes() <= fed);
        assert!(decoder.buffered_bytes() < HEADER_BYTES + MAX_PAYLOAD_BYTES as usize);
        assert!(decoder.buffer_mut().capacity() <= 8 * (READ_BUFFER_BYTES + HEADER_BYTES));
    }
});

/// Reads `[kind, flags, shard, len, payload[len]]*` (one byte each for the
/// header fields), encodes each as a frame, and flips the byte named by the
/// first two input bytes if they ask for it.
fn encode_described_frames(spec: &[u8]) -> Vec<u8> {
    let (flip, mut rest) = match spec {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    while let [kind, flags, shard, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let kind = FrameKind::from_u8(kind % 10).unwrap_or(FrameKind::Message);
        let flags = if kind == FrameKind::Message {
            u16::from(*flags)
        } else {
            0
        };
        out.extend_from_slice(&encode_frame(kind, flags, u32::from(*shard), &tail[..len]));
        rest = &tail[len..];
    }
    if flip & 0x8000 != 0 && !out.is_empty() {
        let at = usize::from(flip & 0x7fff) % out.len();
        out[at] ^= 0x5a;
    }
    out
}

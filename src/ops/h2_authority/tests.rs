//! The shim read through its real `poll_read`, with the client's bytes cut
//! into reads of every size: authorities with a scheme reach the server as
//! `host:port` however they were compressed (Huffman, dynamic table,
//! CONTINUATION frames), and everything else reaches it byte for byte.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::scanner::{
    CONTINUATION, END_HEADERS, END_STREAM, FRAME_HEADER_BYTES, HEADERS, MAX_FRAME_PAYLOAD_BYTES,
    PADDED, PRIORITY,
};
use super::*;
use cairn_proto::h2::hpack::huffman::encode as huffman;
use cairn_proto::h2::hpack::{encode_integer, Block, Decoder};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;

/// Octets from hex digits.
fn hex(s: &str) -> Vec<u8> {
    let digit = |i: usize| u8::from_str_radix(&s[i..i + 2], 16).unwrap();
    (0..s.len()).step_by(2).map(digit).collect()
}

/// A reader that hands out its chunks one per read (split further when the
/// reader's buffer is smaller).
struct Chunks(VecDeque<Vec<u8>>);

impl AsyncRead for Chunks {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(mut chunk) = self.0.pop_front() {
            let n = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..n]);
            if n < chunk.len() {
                self.0.push_front(chunk.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Everything the server reads, with the input cut into `chunk`-octet reads
/// and the server reading `read_size` at a time.
async fn through(input: &[u8], chunk: usize, read_size: usize) -> std::io::Result<Vec<u8>> {
    let chunks = input.chunks(chunk).map(<[u8]>::to_vec).collect();
    let mut fix = AuthorityFix::new(Chunks(chunks), PREFACE.len());
    let mut out = Vec::new();
    let mut buf = vec![0u8; read_size];
    loop {
        let n = fix.read(&mut buf).await?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// The same output whatever the read sizes; returns it.
async fn through_all_cuts(input: &[u8]) -> Vec<u8> {
    let whole = through(input, input.len(), 64 * 1024).await.unwrap();
    for chunk in [1, 2, 3, 7, 9, 10, 24, 33, 100, 4096] {
        for read_size in [1, 5, 9, 64, 16 * 1024] {
            let out = through(input, chunk, read_size).await.unwrap();
            assert_eq!(out, whole, "chunk {chunk}, read size {read_size}");
        }
    }
    whole
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_uint(payload.len() as u64, 3);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
    out.put_slice(payload);
    out.to_vec()
}

/// HPACK by hand, as a client would write it.
#[derive(Default)]
struct Hpack(BytesMut);

impl Hpack {
    fn indexed(mut self, index: usize) -> Self {
        encode_integer(&mut self.0, 0x80, 7, index);
        self
    }

    /// Literal with incremental indexing and an indexed name.
    fn insert(mut self, name_index: usize, value: &str, huffman_coded: bool) -> Self {
        encode_integer(&mut self.0, 0x40, 6, name_index);
        self.string(value, huffman_coded)
    }

    fn string(mut self, value: &str, huffman_coded: bool) -> Self {
        if huffman_coded {
            let coded = huffman(value.as_bytes());
            encode_integer(&mut self.0, 0x80, 7, coded.len());
            self.0.put_slice(&coded);
        } else {
            encode_integer(&mut self.0, 0, 7, value.len());
            self.0.put_slice(value.as_bytes());
        }
        self
    }

    fn bytes(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

/// What the server sees: each frame as (type, flags, stream), and each
/// header block decoded with the server's own table.
#[derive(Debug, Default)]
struct Seen {
    frames: Vec<(u8, u8, u32)>,
    blocks: Vec<Vec<(String, String)>>,
    server_table_entries: usize,
}

fn server_view(stream: &[u8]) -> Seen {
    assert_eq!(&stream[..PREFACE.len()], PREFACE);
    let mut at = PREFACE.len();
    let mut seen = Seen::default();
    let mut decoder = Decoder::default();
    let mut fragment = Vec::new();
    while at < stream.len() {
        let h = &stream[at..at + FRAME_HEADER_BYTES];
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        assert!(len <= MAX_FRAME_PAYLOAD_BYTES, "frame of {len}");
        let (kind, flags) = (h[3], h[4]);
        let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
        let mut payload = &stream[at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + len];
        at += FRAME_HEADER_BYTES + len;
        seen.frames.push((kind, flags, id));
        if kind == HEADERS || kind == CONTINUATION {
            if kind == HEADERS {
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = usize::from(payload[0]);
                    payload = &payload[1..];
                }
                if flags & PRIORITY != 0 {
                    payload = &payload[5..];
                }
                payload = &payload[..payload.len() - pad];
            }
            fragment.extend_from_slice(payload);
            if flags & END_HEADERS != 0 {
                let mut block = Block::default();
                decoder.decode(&fragment, &mut block).unwrap();
                seen.blocks.push(block.pairs());
                fragment.clear();
            }
        }
    }
    seen.server_table_entries = decoder.dynamic_entries();
    seen
}

fn authority(block: &[(String, String)]) -> Option<&str> {
    block
        .iter()
        .find(|(n, _)| n == ":authority")
        .map(|(_, v)| v.as_str())
}

fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for f in frames {
        out.extend_from_slice(f);
    }
    out
}

/// The header block etcdctl 3.4.23 sent for `endpoint status` with
/// `--endpoints=http://127.0.0.1:48796`, captured on the wire.
const ETCDCTL_STATUS_BLOCK: &str = "8386459760a924882d9dcb6571afa066a925a87510ac6e48d36a3f41909d29aee30c044eae05c0b86e34f3afb95f8b1d75d0620d263d4c4d65647a8b9acac8b4c7602bb2caecff40027465864d833505b11f40899acac8b24d494f6a7f8669f784cb8d5b408d25062d495875996ee5b1063d5f03332e34";

#[tokio::test]
async fn etcdctl_endpoint_status_block_is_rewritten() {
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &hex(ETCDCTL_STATUS_BLOCK)),
        frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]),
    ]);
    let seen = server_view(&through_all_cuts(&input).await);
    assert_eq!(seen.blocks.len(), 1);
    let block = &seen.blocks[0];
    assert_eq!(authority(block), Some("127.0.0.1:48796"));
    let path = block.iter().find(|(n, _)| n == ":path").unwrap();
    assert_eq!(path.1, "/etcdserverpb.Maintenance/Status");
    assert!(block.contains(&("te".into(), "trailers".into())));
    assert_eq!(
        seen.server_table_entries, 0,
        "the server's table is never used"
    );
    assert_eq!(
        seen.frames,
        vec![
            (SETTINGS, 0, 0),
            (HEADERS, END_HEADERS, 1),
            (DATA, END_STREAM, 1)
        ]
    );
}

/// A gRPC client's first request: method and scheme indexed, path and
/// authority inserted into the dynamic table.
fn grpc_first(path: &str, authority: &str) -> Hpack {
    Hpack::default()
        .indexed(3)
        .indexed(6)
        .insert(4, path, true)
        .insert(1, authority, true)
}

/// A later request of the same client: method and scheme indexed, then the
/// `inserted` entries the first request added, by index (oldest first).
fn grpc_again(inserted: usize) -> Vec<u8> {
    // Dynamic index 62 (just past the static table) is the newest entry.
    (62..62 + inserted)
        .rev()
        .fold(Hpack::default().indexed(3).indexed(6), Hpack::indexed)
        .bytes()
}

#[tokio::test]
async fn good_authorities_pass_byte_for_byte() {
    let first = grpc_first("/etcdserverpb.KV/Range", "127.0.0.1:2379").bytes();
    let second = grpc_again(2);
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(DATA, END_STREAM, 1, &vec![0; 16_000]),
        frame(HEADERS, END_HEADERS | END_STREAM, 3, &second),
    ]);
    assert_eq!(through_all_cuts(&input).await, input);
}

/// The first request inserts the bad authority into the client's dynamic
/// table; the second only names its index.
#[tokio::test]
async fn dynamic_table_entries_are_followed_across_requests() {
    let first = grpc_first("/etcdserverpb.Maintenance/Status", "http://127.0.0.1:2379").bytes();
    let second = grpc_again(2);
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &first),
        frame(DATA, END_STREAM, 1, &[0; 5]),
        frame(HEADERS, END_HEADERS, 3, &second),
        frame(DATA, END_STREAM, 3, &[0; 5]),
    ]);
    let seen = server_view(&through_all_cuts(&input).await);
    assert_eq!(seen.blocks.len(), 2);
    for block in &seen.blocks {
        assert_eq!(authority(block), Some("127.0.0.1:2379"));
        assert!(block.contains(&(":path".into(), "/etcdserverpb.Maintenance/Status".into())));
    }
    assert_eq!(seen.server_table_entries, 0);
}

/// A connection's first blocks pass as they are and fill the server's table;
/// after a rewrite, later blocks that name those entries still decode to what
/// the client meant.
#[tokio::test]
async fn blocks_after_the_first_rewrite_are_rewritten_too() {
    let good = Hpack::default()
        .indexed(3)
        .insert(4, "/etcdserverpb.KV/Range", false)
        .insert(1, "127.0.0.1:2379", false)
        .bytes();
    let bad = Hpack::default()
        .indexed(3)
        .indexed(63)
        .insert(1, "https://h:1/x", false)
        .bytes();
    let again = Hpack::default().indexed(3).indexed(64).indexed(63).bytes();
    let input = connection(&[
        frame(HEADERS, END_HEADERS | END_STREAM, 1, &good),
        frame(HEADERS, END_HEADERS | END_STREAM, 3, &bad),
        frame(HEADERS, END_HEADERS | END_STREAM, 5, &again),
    ]);
    let seen = server_view(&through_all_cuts(&input).await);
    let authorities: Vec<_> = seen.blocks.iter().map(|b| authority(b)).collect();
    assert_eq!(
        authorities,
        vec![Some("127.0.0.1:2379"), Some("h:1"), Some("127.0.0.1:2379")]
    );
    assert!(seen.blocks[2].contains(&(":path".into(), "/etcdserverpb.KV/Range".into())));
}

#[tokio::test]
async fn continuation_frames_padding_and_priority() {
    let block = Hpack::default()
        .indexed(3)
        .indexed(6)
        .insert(4, "/etcdserverpb.KV/Put", true)
        .insert(1, "http://127.0.0.1:2379", true)
        .bytes();
    let (a, rest) = block.split_at(3);
    let (b, c) = rest.split_at(10);
    let mut first = vec![4u8]; // pad length
    first.extend_from_slice(&[0x80, 0, 0, 1, 15]); // exclusive on stream 1, weight 16
    first.extend_from_slice(a);
    first.extend_from_slice(&[0; 4]);
    let input = connection(&[
        frame(HEADERS, PADDED | PRIORITY | END_STREAM, 3, &first),
        frame(CONTINUATION, 0, 3, b),
        frame(CONTINUATION, END_HEADERS, 3, c),
    ]);
    let out = through_all_cuts(&input).await;
    let seen = server_view(&out);
    assert_eq!(authority(&seen.blocks[0]), Some("127.0.0.1:2379"));
    assert_eq!(
        seen.frames,
        vec![
            (SETTINGS, 0, 0),
            (HEADERS, PRIORITY | END_STREAM | END_HEADERS, 3)
        ]
    );
    let headers_at = PREFACE.len() + FRAME_HEADER_BYTES;
    let priority = &out[headers_at + FRAME_HEADER_BYTES..][..5];
    assert_eq!(priority, [0x80, 0, 0, 1, 15]);
}

#[tokio::test]
async fn a_large_rewritten_block_is_split_into_continuations() {
    let mut block = Hpack::default()
        .indexed(3)
        .insert(1, "http://127.0.0.1:2379", false);
    for i in 0..3 {
        encode_integer(&mut block.0, 0, 4, 0);
        block = block
            .string(&format!("x-big-{i}"), false)
            .string(&"v".repeat(10_000), true);
    }
    let block = block.bytes();
    let input = connection(&[frame(HEADERS, END_HEADERS | END_STREAM, 1, &block)]);
    let seen = server_view(&through(&input, 1000, 4096).await.unwrap());
    assert_eq!(
        seen.frames,
        vec![
            (SETTINGS, 0, 0),
            (HEADERS, END_STREAM, 1),
            (CONTINUATION, END_HEADERS, 1)
        ]
    );
    assert_eq!(authority(&seen.blocks[0]), Some("127.0.0.1:2379"));
    assert_eq!(seen.blocks[0].len(), 5);
}

#[tokio::test]
async fn broken_hpack_before_a_rewrite_passes_through_for_h2_to_refuse() {
    // Index 70 names no entry.
    let bad = Hpack::default().indexed(3).indexed(70).bytes();
    let later = Hpack::default()
        .insert(1, "http://127.0.0.1:2379", false)
        .bytes();
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &bad),
        frame(HEADERS, END_HEADERS, 3, &later),
    ]);
    assert_eq!(through_all_cuts(&input).await, input);
}

#[tokio::test]
async fn broken_hpack_after_a_rewrite_closes_the_connection() {
    let good = Hpack::default()
        .insert(1, "http://127.0.0.1:2379", false)
        .bytes();
    let bad = Hpack::default().indexed(3).indexed(70).bytes();
    let input = connection(&[
        frame(HEADERS, END_HEADERS, 1, &good),
        frame(HEADERS, END_HEADERS, 3, &bad),
    ]);
    let error = through(&input, 7, 64).await.unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert!(error.to_string().contains("HPACK"), "{error}");
}

#[tokio::test]
async fn a_truncated_block_at_eof_is_released() {
    let block = Hpack::default()
        .insert(1, "http://127.0.0.1:2379", false)
        .bytes();
    let mut input = connection(&[frame(HEADERS, END_HEADERS, 1, &block)]);
    input.truncate(input.len() - 3);
    assert_eq!(through_all_cuts(&input).await, input);
}

#[test]
fn scheme_is_stripped_to_host_and_port() {
    let mut scanner = Scanner::new(0);
    let mut out = BytesMut::new();
    for (sent, want) in [
        ("http://127.0.0.1:2379", Some("127.0.0.1:2379")),
        ("unix://sock:0/a/b", Some("sock:0")),
        ("http://", None),
        ("127.0.0.1:2379", Some("127.0.0.1:2379")),
    ] {
        // The last one is re-encoded only because the earlier ones were.
        let block = Hpack::default().indexed(3).insert(1, sent, false).bytes();
        let input = frame(HEADERS, END_HEADERS, 1, &block);
        out.clear();
        scanner.feed(&input, &mut out).unwrap();
        let seen = server_view(&[PREFACE, &out[..]].concat());
        assert_eq!(authority(seen.blocks.last().unwrap()), want, "{sent}");
    }
}

/// The cost of the fast path, printed: decoding a gRPC client's usual block
/// (all indexed) and passing its DATA frame. A measurement, not a check, so
/// it runs on demand (release build, see the module doc of `h2_authority`).
#[test]
#[ignore = "a measurement: cargo test --release --lib ops::h2_authority::tests::decode_cost -- --ignored --nocapture"]
fn decode_cost() {
    const REQUESTS: usize = 200_000;
    let first = grpc_first("/etcdserverpb.KV/Range", "127.0.0.1:2379")
        .insert(31, "application/grpc", true)
        .insert(58, "grpc-go/1.26.0", true)
        .bytes();
    let steady = grpc_again(4);
    let requests: Vec<Vec<u8>> = (0..REQUESTS)
        .map(|i| {
            let block = if i == 0 { &first } else { &steady };
            let id = 1 + 2 * i as u32;
            let mut request = frame(HEADERS, END_HEADERS, id, block);
            request.extend(frame(DATA, END_STREAM, id, &[0; 30]));
            request
        })
        .collect();
    let mut scanner = Scanner::new(0);
    let started = std::time::Instant::now();
    for request in &requests {
        assert_eq!(scanner.scan_in_place(request).unwrap(), InPlace::All);
    }
    let per_request_ns = started.elapsed().as_nanos() as f64 / REQUESTS as f64;
    println!("h2_authority decode_cost per_request_ns={per_request_ns:.0}");
}

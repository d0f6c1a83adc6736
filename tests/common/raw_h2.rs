//! A raw HTTP/2 connection to a member's client port, for tests that send
//! frames no client library would: what the server answers, frame by frame.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use cairn_proto::h2::frame;
use cairn_proto::h2::hpack::{self, Block};
use prost::Message;

/// How long a read waits for the server.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A raw HTTP/2 connection to the client port.
pub struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

/// One frame the server sent.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Raw {
    /// Connects, sends the preface and an empty SETTINGS.
    pub fn open(port: u16) -> Raw {
        let mut raw = Raw::preface_only(port);
        raw.send(frame::SETTINGS, 0, 0, &[]);
        raw
    }

    /// Connects and sends the preface alone: the next frame is the caller's.
    pub fn preface_only(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut raw = Raw { s, buf: Vec::new() };
        raw.send_bytes(cairn::ops::http::HTTP2_PREFACE);
        raw
    }

    pub fn send_bytes(&mut self, b: &[u8]) {
        // The server may have closed already; what it answered is still read.
        let _ = self.s.write_all(b);
    }

    pub fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut b = BytesMut::new();
        frame::put_head(&mut b, payload.len(), kind, flags, stream);
        b.put_slice(payload);
        self.send_bytes(&b);
    }

    /// The next frame, or `None` at the end of the connection.
    pub fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(h) = frame::Head::parse(&self.buf) {
                let total = frame::HEADER_LEN + h.len as usize;
                if self.buf.len() >= total {
                    let payload = self.buf[frame::HEADER_LEN..total].to_vec();
                    self.buf.drain(..total);
                    return Some(Frame {
                        kind: h.kind,
                        flags: h.flags,
                        stream: h.stream,
                        payload,
                    });
                }
            }
            let mut chunk = [0u8; 16384];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Skips frames until one of `kind` (on `stream`, when given).
    pub fn until(&mut self, kind: u8, stream: Option<u32>) -> Option<Frame> {
        while let Some(f) = self.next() {
            if f.kind == kind && stream.is_none_or(|s| s == f.stream) {
                return Some(f);
            }
        }
        None
    }

    /// The GOAWAY error code the server closed with.
    pub fn goaway_code(&mut self) -> u32 {
        let f = self.until(frame::GOAWAY, None).expect("GOAWAY");
        u32::from_be_bytes(f.payload[4..8].try_into().unwrap())
    }

    /// True when the server closes the connection (rather than leaving it
    /// open) after what it has sent.
    pub fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 16384];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        }
    }

    /// Sends a PING with `payload` and returns the frames the server sent
    /// before its answer, or `None` if the connection ended first.
    pub fn frames_before_ping(&mut self, payload: &[u8; 8]) -> Option<Vec<Frame>> {
        self.send(frame::PING, 0, 0, payload);
        let mut before = Vec::new();
        while let Some(f) = self.next() {
            if f.kind == frame::PING && f.flags == frame::FLAG_ACK && &f.payload[..] == payload {
                return Some(before);
            }
            before.push(f);
        }
        None
    }

    pub fn ping_answered(&mut self) -> bool {
        self.frames_before_ping(b"pingpong").is_some()
    }

    /// Sends `frames`, then a PING, and returns the streams reset (with
    /// their codes) among what the server sent before answering the PING.
    pub fn resets_before_ping(&mut self, frames: &[u8]) -> Vec<(u32, u32)> {
        self.send_bytes(frames);
        let before = self
            .frames_before_ping(b"budget!!")
            .expect("the connection stays open");
        before
            .into_iter()
            .filter(|f| f.kind == frame::RST_STREAM)
            .map(|f| {
                (
                    f.stream,
                    u32::from_be_bytes(f.payload[..4].try_into().unwrap()),
                )
            })
            .collect()
    }
}

/// A header block of literal `fields`.
pub fn header_block(fields: &[(&str, &str)]) -> BytesMut {
    let mut out = BytesMut::new();
    hpack::encode_literals(&Block::literals(fields.iter().copied()), &mut out);
    out
}

/// The header fields of a gRPC call to `path`.
pub fn request_fields(path: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "http://127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

/// The header block of a gRPC call to `path`.
pub fn request_head(path: &str) -> BytesMut {
    header_block(&request_fields(path))
}

/// `m` framed as one gRPC message.
pub fn grpc_message(m: &impl Message) -> Vec<u8> {
    let body = m.encode_to_vec();
    let mut v = vec![0u8];
    v.extend_from_slice(&(body.len() as u32).to_be_bytes());
    v.extend_from_slice(&body);
    v
}

//! A plain HTTP/1.1 client for the gateway tests: one request per connection,
//! bodies read whole (Content-Length or chunked) or line by line from a
//! stream, every read bounded by a timeout so a stuck server fails the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Longest wait for any single read of a response.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A response read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    /// Every header, names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// An open response whose body is read as it comes.
pub struct Streamed {
    pub status: u16,
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes of the current chunk not read yet.
    chunk_left: usize,
}

/// POSTs JSON text and returns the status, or `None` when the server cannot
/// be reached (yet).
pub fn try_post_status(endpoint: &str, path: &str, body: &str) -> Option<u16> {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(READ_TIMEOUT)).ok()?;
    send(&mut stream, "POST", path, body.as_bytes(), &[]);
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn connect(endpoint: &str) -> TcpStream {
    let addr = endpoint.trim_start_matches("http://");
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
}

fn send(stream: &mut TcpStream, method: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer a body it refuses (too large) from the head alone
    // and close: the rest of the body then meets a closed socket, and the
    // answer is still there to read.
    if let Err(e) = stream.write_all(body) {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        assert!(
            matches!(e.kind(), BrokenPipe | ConnectionReset),
            "sending the body: {e}"
        );
    }
}

/// Reads the status line and headers of the answer to `what` (the request,
/// named in a failure), sent at `sent`.
fn read_head(
    reader: &mut BufReader<TcpStream>,
    what: &str,
    sent: std::time::Instant,
) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    if let Err(e) = reader.read_line(&mut line) {
        panic!(
            "{what}: no status line {:?} after the request was sent: {e}",
            sent.elapsed()
        );
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Sends one request and reads the whole answer.
pub fn request(endpoint: &str, method: &str, path: &str, body: &[u8]) -> Answer {
    request_with(endpoint, method, path, body, &[])
}

pub fn request_with(
    endpoint: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Answer {
    let mut stream = connect(endpoint);
    send(&mut stream, method, path, body, headers);
    let sent = std::time::Instant::now();
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader, &format!("{method} {endpoint}{path}"), sent);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let content_type = header("content-type").unwrap_or_default();
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut s = Streamed {
            status,
            reader,
            chunked: true,
            chunk_left: 0,
        };
        while let Some(b) = s.read_some() {
            body.extend_from_slice(&b);
        }
    } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).expect("body");
    } else {
        let _ = reader.read_to_end(&mut body);
    }
    Answer {
        status,
        content_type,
        headers,
        body,
    }
}

/// POSTs JSON text.
pub fn post(endpoint: &str, path: &str, body: &str) -> Answer {
    request(endpoint, "POST", path, body.as_bytes())
}

/// Opens a streaming call: sends `body` and returns the response to read.
pub fn open_stream(endpoint: &str, path: &str, body: &str) -> Streamed {
    open_stream_with(endpoint, path, body, &[])
}

/// [`open_stream`] with extra request headers.
pub fn open_stream_with(
    endpoint: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Streamed {
    let mut stream = connect(endpoint);
    send(&mut stream, "POST", path, body.as_bytes(), headers);
    let sent = std::time::Instant::now();
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader, &format!("POST {endpoint}{path}"), sent);
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    Streamed {
        status,
        reader,
        chunked,
        chunk_left: 0,
    }
}

impl Streamed {
    /// The next bytes of the body; `None` at its end (or a closed connection).
    pub fn read_some(&mut self) -> Option<Vec<u8>> {
        if !self.chunked {
            let mut buf = vec![0; 8192];
            let n = self.reader.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            buf.truncate(n);
            return Some(buf);
        }
        if self.chunk_left == 0 {
            let mut size = String::new();
            if self.reader.read_line(&mut size).ok()? == 0 {
                return None;
            }
            if size.trim().is_empty() {
                // The CRLF closing the previous chunk.
                size.clear();
                if self.reader.read_line(&mut size).ok()? == 0 {
                    return None;
                }
            }
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                return None;
            }
            self.chunk_left = n;
        }
        let mut buf = vec![0; self.chunk_left.min(65536)];
        let n = self.reader.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        buf.truncate(n);
        self.chunk_left -= n;
        Some(buf)
    }

    /// Reads `count` newline-ended JSON lines (within [`READ_TIMEOUT`] each).
    pub fn lines(&mut self, count: usize) -> Vec<serde_json::Value> {
        let mut pending = Vec::new();
        let mut out = Vec::new();
        let deadline = Instant::now() + READ_TIMEOUT * 2;
        while out.len() < count {
            while let Some(pos) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=pos).collect();
                out.push(serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!(
                        "stream line is not JSON ({e}): {}",
                        String::from_utf8_lossy(&line)
                    )
                }));
                if out.len() == count {
                    return out;
                }
            }
            assert!(
                Instant::now() < deadline,
                "stream gave {} of {count} lines",
                out.len()
            );
            match self.read_some() {
                Some(b) => pending.extend_from_slice(&b),
                None => panic!(
                    "stream ended after {} of {count} lines: {:?}",
                    out.len(),
                    String::from_utf8_lossy(&pending)
                ),
            }
        }
        out
    }
}

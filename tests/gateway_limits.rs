//! The HTTP/JSON gateway under hostile or careless clients: a watch reader that
//! stops reading is cut off once its bounded buffer stays full (the member
//! does not hold an ever-growing backlog for it, and writers go on), and bad
//! input of every kind (garbage bytes, broken HTTP, malformed, oversize or
//! endless JSON bodies, abandoned streams) gets an error or a closed
//! connection while the member keeps serving. Guards against a gateway that
//! can be made to hold memory without bound or to stop the member.

use crate::common;
use crate::gateway_http;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use gateway_http::{open_stream, post, try_post_status};

fn wait_serving(endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while try_post_status(endpoint, "/v3/kv/put", r#"{"key":"cmVhZHk="}"#) != Some(200) {
        assert!(Instant::now() < deadline, "{endpoint} never served a put");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A raw connection with a small receive buffer, so a reader that stops
/// reading stalls the server quickly.
fn small_buffer_connection(port: u16) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket
        .connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    socket.into()
}

#[test]
fn stalled_watch_reader_is_cut_off() {
    let cluster = common::Cluster::start(1, &[]);
    let member = &cluster.members[0];
    let endpoint = member.endpoint();
    wait_serving(&endpoint);

    // A watcher on /s that reads its first line, then never again.
    let mut stalled = small_buffer_connection(member.client_port);
    let body = r#"{"create_request":{"key":"L3M=","range_end":"L3Q="}}"#;
    write!(
        stalled,
        "POST /v3/watch HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = [0u8; 256];
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let n = stalled.read(&mut head).unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );

    // Far more events than its buffers hold: 300 values of 48 KiB (64 KiB as
    // base64 in each line). Writers are not held up by the stalled reader.
    let value = "eHh4".repeat(16 * 1024);
    let started = Instant::now();
    let events = 300;
    for i in 0..events {
        let put = format!(
            r#"{{"key":"{}","value":"{value}"}}"#,
            b64(&format!("/s/{i}"))
        );
        let answer = post(&endpoint, "/v3/kv/put", &put);
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let produced_bytes = events * value.len();
    eprintln!("{events} puts in {:?}", started.elapsed());

    // The member cuts the connection once the buffer stayed full: its log says
    // so, and the reader then finds the end of the stream after what was
    // already in flight, well short of every event.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !member
        .log_text()
        .contains("gateway stream reader stopped reading")
    {
        assert!(
            Instant::now() < deadline,
            "no cut-off logged:\n{}",
            member.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut received = 0usize;
    let mut buf = vec![0u8; 65536];
    loop {
        match stalled.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the stalled stream was not closed ({received} bytes read): {e}"),
        }
    }
    assert!(
        received < produced_bytes / 2,
        "the reader got {received} of {produced_bytes} bytes: it was not cut off"
    );

    // The member serves on, watches included.
    wait_serving(&endpoint);
    let mut watch = open_stream(
        &endpoint,
        "/v3/watch",
        r#"{"create_request":{"key":"L3M="}}"#,
    );
    assert_eq!(watch.lines(1)[0]["result"]["created"], true);
}

fn b64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Sends raw bytes and reads whatever comes back until the server closes or
/// goes quiet; returns the answer's text.
fn raw(port: u16, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn bad_input_never_stops_the_member() {
    let cluster = common::Cluster::start(1, &[]);
    let member = &cluster.members[0];
    let endpoint = member.endpoint();
    let port = member.client_port;
    wait_serving(&endpoint);

    // Not HTTP at all, or broken HTTP: closed, or refused with a 4xx.
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    raw(port, &garbage);
    raw(
        port,
        b"POST /v3/kv/put HTTP/1.1\r\nContent-Length: nope\r\n\r\n{}",
    );
    let answer = raw(
        port,
        b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{\"key\":",
    );
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    let chunked_forever = format!(
        "POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        "10000\r\n".to_string() + &"x".repeat(0x10000) + "\r\n"
    )
    .repeat(64);
    // Refused: 429 once past the gateway's body limit, 400 when the client's
    // end of the unfinished body is seen first, or a reset connection when the
    // refusal raced the client's writes.
    let answer = raw(port, chunked_forever.as_bytes());
    assert!(
        answer.is_empty()
            || answer.starts_with("HTTP/1.1 429")
            || answer.starts_with("HTTP/1.1 400"),
        "{}",
        &answer[..answer.len().min(200)]
    );

    // Malformed JSON of every shape on every kind of call: errors, no crash.
    let deep = "{\"a\":".repeat(10_000);
    let nested = "[".repeat(10_000);
    for path in [
        "/v3/kv/put",
        "/v3/kv/txn",
        "/v3/lease/grant",
        "/v3/cluster/member/add",
        "/v3/maintenance/status",
        "/v3/auth/user/add",
    ] {
        for body in [
            "{",
            "}",
            "\"\"",
            "1e999",
            "[1,2]",
            "\u{0}\u{1}",
            &deep,
            &nested,
        ] {
            let answer = post(&endpoint, path, body);
            assert!(answer.status >= 400, "{path} {body:.40}: {}", answer.text());
            let json = answer.json();
            assert!(json["code"].is_number(), "{path}: {json}");
        }
    }
    for body in [
        r#"{"compare":[{"key":"eA==","target":"NOPE"}]}"#,
        r#"{"success":[{"request_put":{"key":"%%%"}}]}"#,
    ] {
        let answer = post(&endpoint, "/v3/kv/txn", body);
        assert_eq!(answer.status, 400, "{body}: {}", answer.text());
    }

    // Streams opened and abandoned: a watch whose client leaves at once, a
    // keep-alive stream cut mid-message.
    let request = |path: &str, body: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    for _ in 0..20 {
        raw(
            port,
            request("/v3/watch", r#"{"create_request":{"key":"eA=="}}"#).as_bytes(),
        );
        let cut = request("/v3/lease/keepalive", r#"{"ID":1}"#);
        raw(port, &cut.as_bytes()[..cut.len() - 2]);
    }

    // Still serving, over the gateway and over gRPC alike.
    wait_serving(&endpoint);
    let answer = post(&endpoint, "/v3/kv/range", r#"{"key":"cmVhZHk="}"#);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["count"], "1");
    let (ok, out) = if common::require_tool("etcdctl") {
        common::etcdctl(&endpoint, &["put", "after", "bad-input"])
    } else {
        (true, String::new())
    };
    assert!(ok, "{out}");
}

//! The client connection against a scripted server: frames in, frames out.

use super::*;

/// A frame the client wrote.
#[derive(Debug)]
struct Out {
    head: Head,
    payload: Bytes,
}

/// Takes every frame out of `conn.out` (after the preface, if there).
fn written(conn: &mut Connection) -> Vec<Out> {
    let mut buf = std::mem::take(&mut conn.out);
    if buf.starts_with(PREFACE) {
        buf.advance(PREFACE.len());
    }
    let mut frames = Vec::new();
    while let Some(head) = Head::parse(&buf) {
        buf.advance(frame::HEADER_LEN);
        let payload = buf.split_to(head.len as usize).freeze();
        frames.push(Out { head, payload });
    }
    assert!(buf.is_empty(), "a partial frame was written");
    frames
}

fn of_kind(frames: &[Out], kind: u8) -> Vec<&Out> {
    frames.iter().filter(|f| f.head.kind == kind).collect()
}

fn call(method: Method, body: &[u8]) -> (Call, oneshot::Receiver<Result<Bytes, Status>>) {
    let (reply, rx) = oneshot::channel();
    let call = Call {
        method,
        body: Bytes::copy_from_slice(body),
        reply: Reply::Unary(reply),
    };
    (call, rx)
}

fn answer(rx: &mut oneshot::Receiver<Result<Bytes, Status>>) -> Result<Bytes, Status> {
    rx.try_recv().expect("the call is answered")
}

/// Frames the server sends.
#[derive(Default)]
struct Server(BytesMut);

impl Server {
    fn frame(mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Self {
        frame::put_head(&mut self.0, payload.len(), kind, flags, stream);
        self.0.put_slice(payload);
        self
    }

    fn settings(mut self, settings: &[(u16, u32)]) -> Self {
        frame::put_settings(&mut self.0, settings);
        self
    }

    fn headers(self, stream: u32, end_stream: bool, block: &[u8]) -> Self {
        let flags = frame::FLAG_END_HEADERS
            | if end_stream {
                frame::FLAG_END_STREAM
            } else {
                0
            };
        self.frame(frame::HEADERS, flags, stream, block)
    }

    fn message(self, stream: u32, message: &[u8]) -> Self {
        let mut data = vec![0];
        data.extend_from_slice(&(message.len() as u32).to_be_bytes());
        data.extend_from_slice(message);
        self.frame(frame::DATA, 0, stream, &data)
    }

    /// A whole successful answer: `:status 200`, `message`, grpc-status 0.
    fn ok(self, stream: u32, message: &[u8]) -> Self {
        self.headers(stream, false, &Block::default().indexed(STATUS_200).0)
            .message(stream, message)
            .headers(
                stream,
                true,
                &Block::default().literal("grpc-status", "0").0,
            )
    }

    fn window_update(self, stream: u32, increment: u32) -> Self {
        self.frame(frame::WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
    }

    fn into_conn(self, conn: &mut Connection) -> Result<(), Broken> {
        let mut input = self.0;
        let result = conn.receive(&mut input);
        if result.is_ok() {
            assert!(input.is_empty(), "every whole frame is taken");
        }
        result
    }
}

/// Header blocks as a server's encoder writes them.
#[derive(Default)]
struct Block(BytesMut);

impl Block {
    /// A literal with incremental indexing, new name: enters the table.
    fn indexing(mut self, name: &str, value: &str) -> Self {
        self.0.put_u8(0x40);
        self.string(name).string(value)
    }

    /// A literal without indexing, new name.
    fn literal(mut self, name: &str, value: &str) -> Self {
        self.0.put_u8(0x00);
        self.string(name).string(value)
    }

    fn indexed(mut self, index: usize) -> Self {
        hpack::encode_integer(&mut self.0, 0x80, 7, index);
        self
    }

    fn string(mut self, s: &str) -> Self {
        hpack::encode_integer(&mut self.0, 0, 7, s.len());
        self.0.put_slice(s.as_bytes());
        self
    }
}

/// `:status: 200` (static index 8).
const STATUS_200: usize = 8;

#[test]
fn a_call_goes_out_whole_and_its_answer_comes_back() {
    let mut conn = Connection::new("127.0.0.1:2379", Some("tok"));
    let (c, mut rx) = call(Method::Put, b"\0\0\0\0\x03abc");
    conn.start(c);
    let frames = written(&mut conn);
    let kinds: Vec<u8> = frames.iter().map(|f| f.head.kind).collect();
    assert_eq!(
        kinds,
        [
            frame::SETTINGS,
            frame::WINDOW_UPDATE,
            frame::HEADERS,
            frame::DATA
        ]
    );
    let headers = &frames[2];
    assert_eq!(headers.head.stream, 1);
    assert!(headers.head.has(frame::FLAG_END_HEADERS));
    let mut decoded = hpack::Block::default();
    hpack::Decoder::default()
        .decode(&headers.payload, &mut decoded)
        .unwrap();
    let got = |name: &str| field(&decoded, name).map(|v| String::from_utf8_lossy(v).into_owned());
    assert_eq!(got(":path").as_deref(), Some("/etcdserverpb.KV/Put"));
    assert_eq!(got(":method").as_deref(), Some("POST"));
    assert_eq!(got(":authority").as_deref(), Some("127.0.0.1:2379"));
    assert_eq!(got("content-type").as_deref(), Some("application/grpc"));
    assert_eq!(got("te").as_deref(), Some("trailers"));
    assert_eq!(got("token").as_deref(), Some("tok"));
    let data = &frames[3];
    assert!(data.head.has(frame::FLAG_END_STREAM));
    assert_eq!(&data.payload[..], b"\0\0\0\0\x03abc");

    // The server's encoder puts content-type in its table on the first
    // answer and refers to it on the second.
    Server::default()
        .settings(&[(frame::SETTINGS_MAX_CONCURRENT_STREAMS, 100)])
        .headers(
            1,
            false,
            &Block::default()
                .indexed(STATUS_200)
                .indexing("content-type", "application/grpc")
                .0,
        )
        .message(1, b"answer")
        .headers(1, true, &Block::default().literal("grpc-status", "0").0)
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(&answer(&mut rx).unwrap()[..], b"answer");
    let acks = written(&mut conn);
    assert!(acks
        .iter()
        .any(|f| f.head.kind == frame::SETTINGS && f.head.has(frame::FLAG_ACK)));

    let (c, mut rx) = call(Method::Range, b"\0\0\0\0\0");
    conn.start(c);
    let frames = written(&mut conn);
    assert_eq!(of_kind(&frames, frame::HEADERS)[0].head.stream, 3);
    Server::default()
        .headers(
            3,
            false,
            &Block::default().indexed(STATUS_200).indexed(62).0,
        )
        .message(3, b"")
        .headers(3, true, &Block::default().literal("grpc-status", "0").0)
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(&answer(&mut rx).unwrap()[..], b"");
}

#[test]
fn bodies_wait_for_the_servers_windows_and_streams_take_turns() {
    let mut conn = Connection::new("h:1", None);
    written(&mut conn);
    Server::default()
        .settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 10)])
        .into_conn(&mut conn)
        .unwrap();
    written(&mut conn);
    let (a, _ra) = call(Method::Put, &[b'a'; 25]);
    let (b, _rb) = call(Method::Put, &[b'b'; 5]);
    conn.start(a);
    conn.start(b);
    let data: Vec<(u32, usize, bool)> = of_kind(&written(&mut conn), frame::DATA)
        .iter()
        .map(|f| {
            let end = f.head.has(frame::FLAG_END_STREAM);
            (f.head.stream, f.payload.len(), end)
        })
        .collect();
    assert_eq!(data, [(1, 10, false), (3, 5, true)]);

    // A larger initial window applies to open streams; a stream's own
    // update adds to it.
    Server::default()
        .settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 14)])
        .into_conn(&mut conn)
        .unwrap();
    let sent: Vec<usize> = of_kind(&written(&mut conn), frame::DATA)
        .iter()
        .map(|f| f.payload.len())
        .collect();
    assert_eq!(sent, [4]);
    Server::default()
        .window_update(1, 100)
        .into_conn(&mut conn)
        .unwrap();
    let last = written(&mut conn);
    let last = of_kind(&last, frame::DATA);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].payload.len(), 11);
    assert!(last[0].head.has(frame::FLAG_END_STREAM));
}

#[test]
fn the_servers_stream_limit_queues_calls() {
    let mut conn = Connection::new("h:1", None);
    Server::default()
        .settings(&[(frame::SETTINGS_MAX_CONCURRENT_STREAMS, 1)])
        .into_conn(&mut conn)
        .unwrap();
    let (a, mut ra) = call(Method::Put, b"\0\0\0\0\0");
    let (b, _rb) = call(Method::Put, b"\0\0\0\0\0");
    conn.start(a);
    conn.start(b);
    let headers = of_kind(&written(&mut conn), frame::HEADERS).len();
    assert_eq!(headers, 1, "the second call waits");
    Server::default()
        .headers(
            1,
            true,
            &Block::default()
                .indexed(STATUS_200)
                .literal("grpc-status", "0")
                .0,
        )
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(
        answer(&mut ra).unwrap_err().message(),
        "the answer carries no message"
    );
    let frames = written(&mut conn);
    let opened = of_kind(&frames, frame::HEADERS);
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].head.stream, 3);
}

/// Opens one call on a fresh connection and returns its answer to
/// `server`'s frames on stream 1, and what the client wrote after them.
fn answered(server: Server) -> (Result<Bytes, Status>, Vec<Out>) {
    let mut conn = Connection::new("h:1", None);
    let (c, mut rx) = call(Method::Txn, b"\0\0\0\0\0");
    conn.start(c);
    written(&mut conn);
    server.into_conn(&mut conn).unwrap();
    (answer(&mut rx), written(&mut conn))
}

#[test]
fn errors_become_the_statuses_tonic_gives() {
    let ok = Block::default().indexed(STATUS_200);
    let (r, _) = answered(
        Server::default().headers(
            1,
            true,
            &ok.indexing("grpc-status", "5")
                .literal("grpc-message", "key%20not%20found%")
                .0,
        ),
    );
    let e = r.unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::NotFound, "key not found%"));

    let refused = 0x7u32.to_be_bytes();
    let (r, after) = answered(Server::default().frame(frame::RST_STREAM, 0, 1, &refused));
    assert_eq!(r.unwrap_err().code(), Code::Unavailable);
    assert!(after.is_empty(), "a reset stream is not reset again");

    let (r, after) = answered(Server::default().headers(
        1,
        false,
        &Block::default().literal(":status", "503").0,
    ));
    assert_eq!(r.unwrap_err().code(), Code::Unavailable);
    assert_eq!(of_kind(&after, frame::RST_STREAM).len(), 1);

    let ok = || Block::default().indexed(STATUS_200).0;
    let (r, _) = answered(Server::default().headers(1, false, &ok()).frame(
        frame::DATA,
        frame::FLAG_END_STREAM,
        1,
        b"\0\0\0\0\0",
    ));
    assert_eq!(
        r.unwrap_err().message(),
        "the server ended the answer without trailers"
    );

    let compressed = Server::default()
        .headers(1, false, &ok())
        .frame(frame::DATA, 0, 1, b"\x01\0\0\0\0")
        .headers(1, true, &Block::default().literal("grpc-status", "0").0);
    let (r, _) = answered(compressed);
    assert_eq!(r.unwrap_err().code(), Code::Internal);

    let short = Server::default()
        .headers(1, false, &ok())
        .frame(frame::DATA, 0, 1, b"\0\0\0\0\x09abc")
        .headers(1, true, &Block::default().literal("grpc-status", "0").0);
    let (r, _) = answered(short);
    assert_eq!(
        r.unwrap_err().message(),
        "the answer's message says 9 bytes but 3 arrived"
    );

    // An answer past the largest message: the call fails and the stream is
    // reset, in 16 KiB frames as the server must send it.
    let mut big = Server::default().headers(1, false, &ok());
    let chunk = vec![0u8; frame::DEFAULT_MAX_FRAME as usize];
    for _ in 0..=(MAX_MESSAGE_BYTES / chunk.len()) {
        big = big.frame(frame::DATA, 0, 1, &chunk);
    }
    let (r, after) = answered(big);
    assert_eq!(r.unwrap_err().code(), Code::OutOfRange);
    assert_eq!(of_kind(&after, frame::RST_STREAM).len(), 1);
}

#[test]
fn an_early_answer_stops_the_request_body() {
    let mut conn = Connection::new("h:1", None);
    Server::default()
        .settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 5)])
        .into_conn(&mut conn)
        .unwrap();
    let (c, mut rx) = call(Method::Put, &[0u8; 20]);
    conn.start(c);
    written(&mut conn);
    Server::default()
        .headers(
            1,
            true,
            &Block::default()
                .indexed(STATUS_200)
                .literal("grpc-status", "8")
                .literal("grpc-message", "too large")
                .0,
        )
        .window_update(1, 100)
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(answer(&mut rx).unwrap_err().code(), Code::ResourceExhausted);
    let after = written(&mut conn);
    assert_eq!(of_kind(&after, frame::RST_STREAM).len(), 1);
    assert!(of_kind(&after, frame::DATA).is_empty(), "no more body");
}

#[test]
fn goaway_fails_the_calls_it_did_not_take_and_drains_the_rest() {
    let mut conn = Connection::new("h:1", None);
    let (a, mut ra) = call(Method::Put, b"\0\0\0\0\0");
    let (b, mut rb) = call(Method::Put, b"\0\0\0\0\0");
    conn.start(a);
    conn.start(b);
    written(&mut conn);
    let mut goaway = 1u32.to_be_bytes().to_vec();
    goaway.extend_from_slice(&0u32.to_be_bytes());
    Server::default()
        .frame(frame::GOAWAY, 0, 0, &goaway)
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(answer(&mut rb).unwrap_err().code(), Code::Unavailable);
    assert!(!conn.accepting());
    assert!(!conn.drained(), "stream 1 is still answered");
    Server::default().ok(1, b"x").into_conn(&mut conn).unwrap();
    assert_eq!(&answer(&mut ra).unwrap()[..], b"x");
    assert!(conn.drained());
}

#[test]
fn a_call_given_up_is_reset_and_its_answer_still_read() {
    let mut conn = Connection::new("h:1", None);
    let (a, ra) = call(Method::Put, b"\0\0\0\0\0");
    let (b, mut rb) = call(Method::Put, b"\0\0\0\0\0");
    conn.start(a);
    conn.start(b);
    written(&mut conn);
    drop(ra);
    conn.cancel_abandoned();
    let resets = written(&mut conn);
    let resets = of_kind(&resets, frame::RST_STREAM);
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0].head.stream, 1);
    assert_eq!(
        &resets[0].payload[..],
        &(ErrorCode::Cancel as u32).to_be_bytes()
    );
    // The answer to the reset call enters an entry in the table, which the
    // next answer refers to.
    Server::default()
        .headers(
            1,
            false,
            &Block::default()
                .indexed(STATUS_200)
                .indexing("grpc-status", "0")
                .0,
        )
        .headers(3, false, &Block::default().indexed(STATUS_200).0)
        .message(3, b"y")
        .headers(3, true, &Block::default().indexed(62).0)
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(&answer(&mut rb).unwrap()[..], b"y");
}

#[test]
fn frames_split_anywhere_are_put_back_together() {
    let mut conn = Connection::new("h:1", None);
    let (c, mut rx) = call(Method::Range, b"\0\0\0\0\0");
    conn.start(c);
    written(&mut conn);
    // A padded HEADERS with priority, continued; a padded DATA.
    let block = Block::default()
        .indexed(STATUS_200)
        .literal("content-type", "application/grpc")
        .0;
    let (first, rest) = block.split_at(3);
    let mut headers = vec![2u8];
    headers.extend_from_slice(&[0, 0, 0, 0, 16]);
    headers.extend_from_slice(first);
    headers.extend_from_slice(&[0, 0]);
    let mut data = vec![4u8, 0, 0, 0, 0, 2, b'o', b'k'];
    data.extend_from_slice(&[0; 4]);
    let wire = Server::default()
        .frame(
            frame::HEADERS,
            frame::FLAG_PADDED | frame::FLAG_PRIORITY,
            1,
            &headers,
        )
        .frame(frame::CONTINUATION, frame::FLAG_END_HEADERS, 1, rest)
        .frame(frame::DATA, frame::FLAG_PADDED, 1, &data)
        .headers(1, true, &Block::default().literal("grpc-status", "0").0)
        .0;
    let mut input = BytesMut::new();
    for &octet in wire.iter() {
        input.put_u8(octet);
        conn.receive(&mut input).unwrap();
    }
    assert_eq!(&answer(&mut rx).unwrap()[..], b"ok");
}

#[test]
fn protocol_breaches_break_the_connection() {
    let breaches: Vec<(&str, Server)> = vec![
        (
            "over the 16384",
            Server::default().frame(frame::DATA, 0, 1, &vec![0; 16_385]),
        ),
        (
            "CONTINUATION without",
            Server::default().frame(frame::CONTINUATION, frame::FLAG_END_HEADERS, 1, b""),
        ),
        (
            "interrupted",
            Server::default()
                .frame(frame::HEADERS, 0, 1, b"")
                .frame(frame::PING, 0, 0, &[0; 8]),
        ),
        (
            "PUSH_PROMISE",
            Server::default().frame(frame::PUSH_PROMISE, 0, 1, &[0; 4]),
        ),
        ("of 0", Server::default().window_update(0, 0)),
        (
            "past 2^31-1",
            Server::default().window_update(0, 0x7fff_ffff),
        ),
        (
            "multiple of 6",
            Server::default().frame(frame::SETTINGS, 0, 0, &[0; 5]),
        ),
        (
            "maximum frame size",
            Server::default().settings(&[(frame::SETTINGS_MAX_FRAME_SIZE, 100)]),
        ),
        (
            "not 8 octets",
            Server::default().frame(frame::PING, 0, 0, &[0; 7]),
        ),
        (
            "under 8 octets",
            Server::default().frame(frame::GOAWAY, 0, 0, &[0; 7]),
        ),
        (
            "on stream 0",
            Server::default().frame(frame::DATA, 0, 0, b""),
        ),
        (
            "header block",
            Server::default().headers(1, true, &Block::default().indexed(0).0),
        ),
        (
            "padding longer",
            Server::default().frame(frame::DATA, frame::FLAG_PADDED, 1, &[9, 0]),
        ),
    ];
    for (reason, server) in breaches {
        let mut conn = Connection::new("h:1", None);
        let (c, _rx) = call(Method::Put, b"\0\0\0\0\0");
        conn.start(c);
        let Err(Broken(why)) = server.into_conn(&mut conn) else {
            panic!("{reason}: accepted");
        };
        assert!(why.contains(reason), "{reason}: {why}");
    }
}

#[test]
fn pings_are_answered_and_data_refills_the_connection_window() {
    let mut conn = Connection::new("h:1", None);
    let (c, _rx) = call(Method::Range, b"\0\0\0\0\0");
    conn.start(c);
    written(&mut conn);
    let mut server = Server::default()
        .frame(frame::PING, 0, 0, b"12345678")
        .headers(1, false, &Block::default().indexed(STATUS_200).0);
    // Frames for a stream already gone still count against the window.
    let chunk = vec![0u8; frame::DEFAULT_MAX_FRAME as usize];
    for _ in 0..(WINDOW_REFILL as usize / chunk.len()) {
        server = server.frame(frame::DATA, 0, 7, &chunk);
    }
    server.into_conn(&mut conn).unwrap();
    let frames = written(&mut conn);
    let pong = of_kind(&frames, frame::PING);
    assert_eq!(pong.len(), 1);
    assert!(pong[0].head.has(frame::FLAG_ACK));
    assert_eq!(&pong[0].payload[..], b"12345678");
    let updates = of_kind(&frames, frame::WINDOW_UPDATE);
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].head.stream, 0);
    assert_eq!(&updates[0].payload[..], &WINDOW_REFILL.to_be_bytes());
}

#[test]
fn spent_stream_ids_drain_the_connection_and_hand_back_waiting_calls() {
    let mut conn = Connection::new("h:1", None);
    conn.next_stream = MAX_STREAM_ID;
    Server::default()
        .settings(&[(frame::SETTINGS_MAX_CONCURRENT_STREAMS, 1)])
        .into_conn(&mut conn)
        .unwrap();
    let (a, mut ra) = call(Method::Put, b"\0\0\0\0\0");
    let (b, mut rb) = call(Method::Put, b"\0\0\0\0\0");
    conn.start(a);
    conn.start(b);
    assert!(!conn.accepting(), "the last stream id is taken");
    let opened = written(&mut conn);
    let opened = of_kind(&opened, frame::HEADERS);
    assert_eq!(opened.len(), 1);
    assert_eq!(opened[0].head.stream, MAX_STREAM_ID);
    Server::default()
        .ok(MAX_STREAM_ID, b"z")
        .into_conn(&mut conn)
        .unwrap();
    assert_eq!(&answer(&mut ra).unwrap()[..], b"z");
    assert!(conn.drained());
    let carried = conn.take_waiting();
    assert_eq!(
        carried.len(),
        1,
        "the waiting call goes to the next connection"
    );
    assert!(rb.try_recv().is_err(), "and is not answered here");
}

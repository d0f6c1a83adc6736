//! Cairn's own HTTP/2 gRPC server (`src/grpc`), against real `cairn`
//! processes:
//! - the etcd client's calls (unary KV, Watch, LeaseKeepAlive) and answers
//!   larger than the client's flow-control windows;
//! - the same errors, code and message, as the tonic server it replaced
//!   (`--grpc-server tonic`), member beside member;
//! - raw frames that break the protocol: each closes its connection with the
//!   GOAWAY code RFC 9113 names, or resets only its stream, and the member
//!   goes on serving;
//! - how many streams one connection may open (`--max-concurrent-streams`),
//!   their header lists counted in the connection's budget, and many
//!   long-lived calls cancelled at once.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use cairn_proto::h2::frame;
use cairn_proto::h2::hpack::{self, Block};
use common::{client, status_of, wait_writable, Cluster};
use etcd_client::{EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use prost::Message;

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_clients_calls_and_large_answers_go_through() {
    let cluster = Cluster::start(1, &[]);
    let ep = &cluster.endpoints()[0];
    let mut c = client(ep).await;
    wait_writable(&mut c, "/ready").await;

    // Unary KV calls, many at once on one connection.
    let mut calls = Vec::new();
    for i in 0..200 {
        let mut c = c.clone();
        calls.push(tokio::spawn(async move {
            c.put(format!("/many/{i:03}"), format!("v{i}"), None)
                .await
                .unwrap()
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
    let r = c
        .get("/many/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(r.kvs().len(), 200);
    assert_eq!(r.kvs()[7].value(), b"v7");
    let t = c
        .txn(Txn::new().and_then(vec![
            TxnOp::put("/txn/a", "1", None),
            TxnOp::get("/many/001", None),
        ]))
        .await
        .unwrap();
    assert!(t.succeeded());
    let d = c
        .delete(
            "/many/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(d.deleted(), 200);

    // An answer of about 3 MB: far past the client's initial windows
    // (64 KiB), so it only arrives if the server follows WINDOW_UPDATEs.
    let big = vec![b'b'; 1_000_000];
    for i in 0..3 {
        c.put(format!("/big/{i}"), big.clone(), None).await.unwrap();
    }
    let r = c
        .get("/big/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(r.kvs().len(), 3);
    assert!(r.kvs().iter().all(|kv| kv.value() == &big[..]));

    // A watch stream sees a put made after it started.
    let mut events = c
        .watch("/w/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    c.put("/w/k", "1", None).await.unwrap();
    let (watch_id, got) = tokio::time::timeout(TIMEOUT, async {
        loop {
            let resp = events.message().await.unwrap().unwrap();
            if let Some(e) = resp.events().first() {
                return (
                    resp.watch_id(),
                    (e.event_type(), e.kv().unwrap().key().to_vec()),
                );
            }
        }
    })
    .await
    .expect("watch event");
    assert_eq!(got, (EventType::Put, b"/w/k".to_vec()));
    events.cancel(watch_id).await.unwrap();

    // A lease kept alive over its bidirectional stream.
    let lease = c.lease_grant(30, None).await.unwrap().id();
    let (mut keeper, mut acks) = c.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let ack = tokio::time::timeout(TIMEOUT, acks.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ack.id(), lease);
    assert!(ack.ttl() > 0);
    c.put("/leased", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
}

/// The same refusals from both servers, member beside member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_the_same_as_the_tonic_servers() {
    let own = Cluster::start(1, &[]);
    let tonic_server = Cluster::start(1, &["--grpc-server", "tonic"]);
    let mut answers = Vec::new();
    for cluster in [&own, &tonic_server] {
        let mut c = client(&cluster.endpoints()[0]).await;
        wait_writable(&mut c, "/ready").await;
        let mut got = Vec::new();
        // Past etcd's request limit, within gRPC's message limit.
        let e = status_of(
            c.put("/big", vec![b'x'; 1_600_000], None)
                .await
                .unwrap_err(),
        );
        got.push((e.code(), e.message().to_string()));
        // Past the gRPC message limit (the request limit plus 512 KiB).
        let e = status_of(
            c.put("/huge", vec![b'x'; 2_200_000], None)
                .await
                .unwrap_err(),
        );
        got.push((e.code(), e.message().to_string()));
        let e = status_of(c.put("", "v", None).await.unwrap_err());
        got.push((e.code(), e.message().to_string()));
        let e = status_of(
            c.get("/k", Some(GetOptions::new().with_revision(1 << 50)))
                .await
                .unwrap_err(),
        );
        got.push((e.code(), e.message().to_string()));
        answers.push(got);
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][0].1, "etcdserver: request is too large");
    assert!(
        answers[0][1]
            .1
            .starts_with("Error, decoded message length too large"),
        "{:?}",
        answers[0][1]
    );
}

/// What a raw connection sends to break the protocol.
type Breach = Box<dyn Fn(&mut Raw)>;

/// A raw HTTP/2 connection to the client port.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Raw {
    /// Connects, sends the preface and an empty SETTINGS.
    fn open(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut raw = Raw { s, buf: Vec::new() };
        raw.send_bytes(cairn::ops::http::HTTP2_PREFACE);
        raw.send(frame::SETTINGS, 0, 0, &[]);
        raw
    }

    fn send_bytes(&mut self, b: &[u8]) {
        // The server may have closed already; what it answered is still read.
        let _ = self.s.write_all(b);
    }

    fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut b = BytesMut::new();
        frame::put_head(&mut b, payload.len(), kind, flags, stream);
        b.put_slice(payload);
        self.send_bytes(&b);
    }

    /// The next frame, or `None` at the end of the connection.
    fn next(&mut self) -> Option<Frame> {
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
    fn until(&mut self, kind: u8, stream: Option<u32>) -> Option<Frame> {
        while let Some(f) = self.next() {
            if f.kind == kind && stream.is_none_or(|s| s == f.stream) {
                return Some(f);
            }
        }
        None
    }

    /// The GOAWAY error code the server closed with.
    fn goaway_code(&mut self) -> u32 {
        let f = self.until(frame::GOAWAY, None).expect("GOAWAY");
        u32::from_be_bytes(f.payload[4..8].try_into().unwrap())
    }

    /// True when the server closes the connection (rather than leaving it
    /// open) after what it has sent.
    fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 16384];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        }
    }

    fn ping_answered(&mut self) -> bool {
        self.send(frame::PING, 0, 0, b"pingpong");
        matches!(self.until(frame::PING, None), Some(f) if f.flags == frame::FLAG_ACK && f.payload == b"pingpong")
    }
}

fn header_block(fields: &[(&str, &str)]) -> BytesMut {
    let mut out = BytesMut::new();
    hpack::encode_literals(&Block::literals(fields.iter().copied()), &mut out);
    out
}

fn request_head(path: &str) -> BytesMut {
    header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "http://127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

fn grpc_message(m: &impl Message) -> Vec<u8> {
    let body = m.encode_to_vec();
    let mut v = vec![0u8];
    v.extend_from_slice(&(body.len() as u32).to_be_bytes());
    v.extend_from_slice(&body);
    v
}

fn decoded(decoder: &mut hpack::Decoder, payload: &[u8]) -> Vec<(String, String)> {
    let mut block = Block::default();
    decoder.decode(payload, &mut block).unwrap();
    block.pairs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_frames_close_their_connection_and_nothing_else() {
    use cairn_proto::etcdserverpb::{PutRequest, RangeRequest, RangeResponse};
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    c.put("/raw/k", "raw value", None).await.unwrap();
    let port = cluster.members[0].client_port;
    let codes = tokio::task::spawn_blocking(move || {
        let mut codes = Vec::new();
        // A unary call written by hand: headers, message, trailers.
        let mut raw = Raw::open(port);
        raw.send(
            frame::HEADERS,
            frame::FLAG_END_HEADERS,
            1,
            &request_head("/etcdserverpb.KV/Range"),
        );
        let req = RangeRequest {
            key: Bytes::from_static(b"/raw/k"),
            ..Default::default()
        };
        raw.send(frame::DATA, frame::FLAG_END_STREAM, 1, &grpc_message(&req));
        let mut decoder = hpack::Decoder::default();
        let head = raw.until(frame::HEADERS, Some(1)).unwrap();
        let fields = decoded(&mut decoder, &head.payload);
        assert!(
            fields.contains(&(":status".into(), "200".into())),
            "{fields:?}"
        );
        let data = raw.until(frame::DATA, Some(1)).unwrap();
        let resp = RangeResponse::decode(&data.payload[5..]).unwrap();
        assert_eq!(&resp.kvs[0].value[..], b"raw value");
        let trailers = raw.until(frame::HEADERS, Some(1)).unwrap();
        assert_ne!(trailers.flags & frame::FLAG_END_STREAM, 0);
        let fields = decoded(&mut decoder, &trailers.payload);
        assert!(
            fields.contains(&("grpc-status".into(), "0".into())),
            "{fields:?}"
        );

        // A malformed request resets its stream only.
        let mut bad = request_head("/etcdserverpb.KV/Range");
        bad.extend_from_slice(&header_block(&[("Upper-Case", "x")]));
        raw.send(frame::HEADERS, frame::FLAG_END_HEADERS, 3, &bad);
        let rst = raw.until(frame::RST_STREAM, Some(3)).unwrap();
        assert_eq!(rst.payload, 1u32.to_be_bytes(), "PROTOCOL_ERROR");
        // A call reset by the client mid-body is dropped; the connection goes on.
        raw.send(
            frame::HEADERS,
            frame::FLAG_END_HEADERS,
            5,
            &request_head("/etcdserverpb.KV/Put"),
        );
        raw.send(frame::RST_STREAM, 0, 5, &8u32.to_be_bytes());
        assert!(raw.ping_answered());
        // A put split over DATA frames with padding arrives whole.
        raw.send(
            frame::HEADERS,
            frame::FLAG_END_HEADERS,
            7,
            &request_head("/etcdserverpb.KV/Put"),
        );
        let put = grpc_message(&PutRequest {
            key: Bytes::from_static(b"/raw/split"),
            value: Bytes::from(vec![b's'; 40_000]),
            ..Default::default()
        });
        let (a, b) = put.split_at(20_000);
        for (part, flags) in [(a, 0), (b, frame::FLAG_END_STREAM)] {
            for (i, chunk) in part.chunks(10_000).enumerate() {
                let last = i == part.chunks(10_000).count() - 1;
                let mut padded = vec![3u8];
                padded.extend_from_slice(chunk);
                padded.extend_from_slice(&[0, 0, 0]);
                let f = if last { flags } else { 0 };
                raw.send(frame::DATA, f | frame::FLAG_PADDED, 7, &padded);
            }
        }
        let trailers = loop {
            let f = raw.until(frame::HEADERS, Some(7)).unwrap();
            if f.flags & frame::FLAG_END_STREAM != 0 {
                break f;
            }
        };
        let fields = decoded(&mut decoder, &trailers.payload);
        assert!(
            fields.contains(&("grpc-status".into(), "0".into())),
            "{fields:?}"
        );

        // Connection errors, each on a connection of its own.
        let cases: Vec<(&str, Breach)> = vec![
            (
                "frame over 16 KiB",
                Box::new(|r: &mut Raw| r.send(frame::DATA, 0, 1, &vec![0u8; 20_000])),
            ),
            (
                "HEADERS on stream 0",
                Box::new(|r: &mut Raw| {
                    r.send(
                        frame::HEADERS,
                        frame::FLAG_END_HEADERS,
                        0,
                        &request_head("/x"),
                    )
                }),
            ),
            (
                "HPACK index 0",
                Box::new(|r: &mut Raw| r.send(frame::HEADERS, frame::FLAG_END_HEADERS, 1, &[0x80])),
            ),
            (
                "WINDOW_UPDATE of 0",
                Box::new(|r: &mut Raw| r.send(frame::WINDOW_UPDATE, 0, 0, &[0, 0, 0, 0])),
            ),
            (
                "PING of 7 octets",
                Box::new(|r: &mut Raw| r.send(frame::PING, 0, 0, &[0; 7])),
            ),
            (
                "even stream id",
                Box::new(|r: &mut Raw| {
                    r.send(
                        frame::HEADERS,
                        frame::FLAG_END_HEADERS,
                        2,
                        &request_head("/x"),
                    )
                }),
            ),
            (
                "interrupted header block",
                Box::new(|r: &mut Raw| {
                    r.send(frame::HEADERS, 0, 1, &request_head("/x"));
                    r.send(frame::PING, 0, 0, &[0; 8]);
                }),
            ),
            (
                "connection window over 2^31-1",
                Box::new(|r: &mut Raw| {
                    r.send(frame::WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes())
                }),
            ),
        ];
        for (what, case) in cases {
            let mut raw = Raw::open(port);
            case(&mut raw);
            codes.push((what, raw.goaway_code()));
            assert!(raw.closed(), "{what}: the connection stays open");
        }
        // Not a SETTINGS frame first.
        let mut raw = Raw {
            s: TcpStream::connect(("127.0.0.1", port)).unwrap(),
            buf: Vec::new(),
        };
        raw.s.set_read_timeout(Some(TIMEOUT)).unwrap();
        raw.send_bytes(cairn::ops::http::HTTP2_PREFACE);
        raw.send(frame::PING, 0, 0, &[0; 8]);
        codes.push(("PING before SETTINGS", raw.goaway_code()));
        codes
    })
    .await
    .unwrap();
    assert_eq!(
        codes,
        vec![
            ("frame over 16 KiB", 0x6),
            ("HEADERS on stream 0", 0x1),
            ("HPACK index 0", 0x9),
            ("WINDOW_UPDATE of 0", 0x1),
            ("PING of 7 octets", 0x6),
            ("even stream id", 0x1),
            ("interrupted header block", 0x1),
            ("connection window over 2^31-1", 0x3),
            ("PING before SETTINGS", 0x1),
        ]
    );
    // The member served on through all of it.
    let r = c.get("/raw/split", None).await.unwrap();
    assert_eq!(r.kvs()[0].value().len(), 40_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_clients_are_stopped_and_cost_bounded_work() {
    use cairn_proto::etcdserverpb::{PutRequest, RangeRequest};
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let port = cluster.members[0].client_port;
    tokio::task::spawn_blocking(move || {
        // DATA after a stream's END_STREAM resets that stream only.
        let mut raw = Raw::open(port);
        let range = grpc_message(&RangeRequest {
            key: Bytes::from_static(b"/x"),
            ..Default::default()
        });
        raw.send(
            frame::HEADERS,
            frame::FLAG_END_HEADERS,
            1,
            &request_head("/etcdserverpb.Watch/Watch"),
        );
        raw.send(frame::DATA, frame::FLAG_END_STREAM, 1, &range);
        raw.send(frame::DATA, 0, 1, &range);
        let rst = raw.until(frame::RST_STREAM, Some(1)).unwrap();
        assert_eq!(rst.payload, 5u32.to_be_bytes(), "STREAM_CLOSED");
        assert!(raw.ping_answered());

        // Calls reset as soon as they are sent: more than 10,000 within 10 s
        // close the connection with ENHANCE_YOUR_CALM.
        let mut raw = Raw::open(port);
        let put = grpc_message(&PutRequest {
            key: Bytes::from_static(b"/reset"),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        });
        let head = request_head("/etcdserverpb.KV/Put");
        for i in 0..10_100u32 {
            let id = 2 * i + 1;
            raw.send(frame::HEADERS, frame::FLAG_END_HEADERS, id, &head);
            raw.send(frame::DATA, frame::FLAG_END_STREAM, id, &put);
            raw.send(frame::RST_STREAM, 0, id, &8u32.to_be_bytes());
        }
        assert_eq!(raw.goaway_code(), 0xb);
        assert!(raw.closed());

        // A flood of SETTINGS changing the initial window: closed the same way.
        let mut raw = Raw::open(port);
        for i in 0..1100u32 {
            let mut s = Vec::new();
            s.extend_from_slice(&frame::SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes());
            s.extend_from_slice(&(65_535 + i % 2).to_be_bytes());
            raw.send(frame::SETTINGS, 0, 0, &s);
        }
        assert_eq!(raw.goaway_code(), 0xb);

        // Request bodies held past 64 MiB on one connection: the stream that
        // would pass it is reset, the others and the connection go on.
        let mut raw = Raw::open(port);
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&1_500_000u32.to_be_bytes());
        let chunk = vec![b'h'; 16_000];
        let mut reset = None;
        for i in 0..70u32 {
            let id = 2 * i + 1;
            raw.send(frame::HEADERS, frame::FLAG_END_HEADERS, id, &head);
            raw.send(frame::DATA, 0, id, &prefix);
            for _ in 0..62 {
                raw.send(frame::DATA, 0, id, &chunk);
            }
            if i == 69 {
                raw.send(frame::PING, 0, 0, b"heldheld");
            }
        }
        while let Some(f) = raw.next() {
            if f.kind == frame::RST_STREAM && reset.is_none() {
                assert_eq!(f.payload, 0xbu32.to_be_bytes());
                reset = Some(f.stream);
            }
            if f.kind == frame::PING && f.payload == b"heldheld" {
                break;
            }
        }
        let reset = reset.expect("a stream reset over the budget");
        // 992,005 bytes a stream: the 68th (id 135) is the first past 64 MiB.
        assert_eq!(reset, 135);
    })
    .await
    .unwrap();
    // The member served on.
    c.put("/after", "abuse", None).await.unwrap();
}

/// The SETTINGS_MAX_CONCURRENT_STREAMS a fresh connection announces, if any.
fn announced_stream_limit(raw: &mut Raw) -> Option<u32> {
    let settings = raw.until(frame::SETTINGS, Some(0)).expect("SETTINGS");
    assert_eq!(
        settings.flags & frame::FLAG_ACK,
        0,
        "the server's own SETTINGS first"
    );
    settings.payload.chunks_exact(6).find_map(|entry| {
        let id = u16::from_be_bytes([entry[0], entry[1]]);
        (id == frame::SETTINGS_MAX_CONCURRENT_STREAMS)
            .then(|| u32::from_be_bytes(entry[2..6].try_into().unwrap()))
    })
}

/// As etcd, a member lets a client open any number of streams on one
/// connection (watchers of many contexts, each its own stream): 5,000 watch
/// streams on one connection all see a put. `--max-concurrent-streams` caps
/// them: the cap is announced, a stream past it is refused, and an etcd
/// client queues its next call until one of its streams ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_one_connection_are_unlimited_unless_capped() {
    const STREAMS: usize = 5_000;
    let open = Cluster::start(1, &[]);
    let capped = Cluster::start(1, &["--max-concurrent-streams", "2"]);
    let tonic = Cluster::start(
        1,
        &["--max-concurrent-streams", "3", "--grpc-server", "tonic"],
    );
    let mut c = client(&open.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let mut capped_client = client(&capped.endpoints()[0]).await;
    wait_writable(&mut capped_client, "/ready").await;
    wait_writable(&mut client(&tonic.endpoints()[0]).await, "/ready").await;
    let (open_port, capped_port) = (open.members[0].client_port, capped.members[0].client_port);
    let tonic_port = tonic.members[0].client_port;
    let announced = tokio::task::spawn_blocking(move || {
        [open_port, capped_port, tonic_port].map(|p| announced_stream_limit(&mut Raw::open(p)))
    })
    .await
    .unwrap();
    assert_eq!(announced, [None, Some(2), Some(3)], "tonic's server too");

    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let mut c = c.clone();
        // Open once the member has created its watcher: the put below
        // must find every one.
        opening.spawn(async move {
            let mut events = c.watch("/streams/k", None).await?;
            while !events.message().await?.expect("stream open").created() {}
            Ok::<_, etcd_client::Error>(events)
        });
    }
    let mut streams = Vec::with_capacity(STREAMS);
    tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(opened) = opening.join_next().await {
            streams.push(opened.unwrap().unwrap());
        }
    })
    .await
    .expect("every watch stream opens");
    c.put("/streams/k", "v", None).await.unwrap();
    for (i, events) in streams.iter_mut().enumerate() {
        let got = tokio::time::timeout(TIMEOUT, async {
            loop {
                let resp = events.message().await.unwrap().expect("stream open");
                if let Some(e) = resp.events().first() {
                    return e.kv().unwrap().value().to_vec();
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("stream {i} saw no event"));
        assert_eq!(got, b"v");
    }
    drop(streams);

    // The capped member, by hand: two watch streams open, a third refused.
    let refused = tokio::task::spawn_blocking(move || {
        let mut raw = Raw::open(capped_port);
        for stream in [1, 3, 5] {
            raw.send(
                frame::HEADERS,
                frame::FLAG_END_HEADERS,
                stream,
                &request_head("/etcdserverpb.Watch/Watch"),
            );
        }
        let rst = raw.until(frame::RST_STREAM, None).expect("a reset");
        (rst.stream, rst.payload)
    })
    .await
    .unwrap();
    assert_eq!(refused, (5, 7u32.to_be_bytes().to_vec()), "REFUSED_STREAM");

    // Through an etcd client: a third call waits for a free stream.
    let mut c = capped_client;
    let first = c.watch("/capped/k", None).await.unwrap();
    let _second = c.watch("/capped/k", None).await.unwrap();
    let mut third = tokio::spawn({
        let mut c = c.clone();
        async move { c.put("/capped/k", "3", None).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut third)
            .await
            .is_err(),
        "a third call waits while two streams are open"
    );
    drop(first);
    tokio::time::timeout(TIMEOUT, third)
        .await
        .expect("the third call goes once a stream ended")
        .unwrap()
        .unwrap();
}

/// A client that cancels more calls at once than the reset limit allows
/// (`MAX_RESETS` within `RESET_PERIOD`), every one opened before that
/// period, keeps its connection: only calls opened and reset within one
/// period count, as a client cancelling its long-lived watches does not
/// open calls only to reset them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_many_long_lived_calls_together_keeps_the_connection() {
    use cairn::grpc::conn::{MAX_RESETS, RESET_PERIOD};
    let calls = MAX_RESETS + 100;
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let port = cluster.members[0].client_port;
    let alive = tokio::task::spawn_blocking(move || {
        let mut raw = Raw::open(port);
        // Range calls whose bodies never come: open, and cheap to hold.
        let head = request_head("/etcdserverpb.KV/Range");
        let ids: Vec<u32> = (0..calls).map(|i| 2 * i + 1).collect();
        let mut frames = BytesMut::new();
        for &id in &ids {
            frame::put_header_block(
                &mut frames,
                id,
                &head,
                false,
                frame::DEFAULT_MAX_FRAME as usize,
            );
        }
        raw.send_bytes(&frames);
        assert!(raw.ping_answered(), "every call opened");
        // The connection's first reset period has ended: the resets below
        // begin the next one.
        std::thread::sleep(RESET_PERIOD + Duration::from_secs(1));
        let mut resets = BytesMut::new();
        for &id in &ids {
            frame::put_rst_stream(&mut resets, id, frame::ErrorCode::Cancel);
        }
        raw.send_bytes(&resets);
        raw.ping_answered()
    })
    .await
    .unwrap();
    assert!(alive, "the connection stays open");
    c.put("/after-cancels", "v", None).await.unwrap();
}

/// Sends `frames`, then a PING, and returns the streams reset (with their
/// codes) among what the server sent before answering the PING.
fn resets_before_ping(raw: &mut Raw, frames: &[u8]) -> Vec<(u32, u32)> {
    raw.send_bytes(frames);
    raw.send(frame::PING, 0, 0, b"budget!!");
    let mut resets = Vec::new();
    loop {
        let f = raw.next().expect("the connection stays open");
        if f.kind == frame::RST_STREAM {
            resets.push((
                f.stream,
                u32::from_be_bytes(f.payload[..4].try_into().unwrap()),
            ));
        }
        if f.kind == frame::PING && f.flags == frame::FLAG_ACK && f.payload == b"budget!!" {
            return resets;
        }
    }
}

/// The header lists of a connection's open streams count toward its budget
/// of held request bytes (`MAX_HELD_BYTES`, 64 MiB), as bodies do: watch
/// streams that stay open, each with a header list near the 64 KiB a list
/// may have, are accepted up to the budget, the next one is reset with
/// ENHANCE_YOUR_CALM, the connection and the member go on, and a stream that
/// ends makes room for one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_header_lists_count_toward_the_connections_budget() {
    use cairn::grpc::conn::MAX_HELD_BYTES;
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let port = cluster.members[0].client_port;
    tokio::task::spawn_blocking(move || {
        let pad = "p".repeat(60_000);
        let fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/etcdserverpb.Watch/Watch"),
            (":authority", "http://127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-pad", pad.as_str()),
        ];
        let list = Block::literals(fields).list_bytes();
        let head = header_block(&fields);
        let fits = (MAX_HELD_BYTES / list) as u32;
        let open = |frames: &mut BytesMut, id: u32| {
            frame::put_header_block(frames, id, &head, false, frame::DEFAULT_MAX_FRAME as usize)
        };
        let mut raw = Raw::open(port);
        let mut resets = Vec::new();
        for batch in (0..=fits).collect::<Vec<_>>().chunks(64) {
            let mut frames = BytesMut::new();
            for &i in batch {
                open(&mut frames, 2 * i + 1);
            }
            resets.extend(resets_before_ping(&mut raw, &frames));
        }
        let refused = 2 * fits + 1;
        assert_eq!(
            resets,
            [(refused, 0xb)],
            "{fits} lists of {list} bytes fit in {MAX_HELD_BYTES}; the next is ENHANCE_YOUR_CALM"
        );
        // The first stream ends: one more fits, and no more than one.
        let mut frames = BytesMut::new();
        frame::put_rst_stream(&mut frames, 1, frame::ErrorCode::Cancel);
        open(&mut frames, refused + 2);
        assert_eq!(resets_before_ping(&mut raw, &frames), []);
        let mut frames = BytesMut::new();
        open(&mut frames, refused + 4);
        assert_eq!(resets_before_ping(&mut raw, &frames), [(refused + 4, 0xb)]);
    })
    .await
    .unwrap();
    c.put("/after-headers", "v", None).await.unwrap();
}

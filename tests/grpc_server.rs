//! Cairn's own HTTP/2 gRPC server (`src/grpc`), against real `cairn`
//! processes:
//! - the etcd client's calls (unary KV, Watch, LeaseKeepAlive) and answers
//!   larger than the client's flow-control windows;
//! - the same errors, code and message, as the tonic server it replaced
//!   (`--grpc-server tonic`), member beside member, but for a message over
//!   gRPC's limit, refused as etcd refuses it, by every service (compared
//!   with a real etcd);
//! - a Watch stream's error delivered after what its client left queued;
//! - etcd's gauges of Watch streams and live watches;
//! - raw frames that break the protocol: each closes its connection with the
//!   GOAWAY code RFC 9113 names, or resets only its stream, and the member
//!   goes on serving (what one connection may hold: `grpc_limits.rs`).

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use cairn_proto::h2::frame;
use cairn_proto::h2::hpack::{self, Block};
use common::raw_h2::{grpc_message, header_block, request_head, Raw};
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

    // A watch stream sees a put made after it started. The client's watch()
    // returns before the member has created the watcher, so the watch
    // starts at the next revision: the put is seen however late the
    // watcher is created.
    let next = c
        .get("/w/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
        + 1;
    let mut events = c
        .watch(
            "/w/",
            Some(WatchOptions::new().with_prefix().with_start_revision(next)),
        )
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

/// The same refusals from both servers, member beside member, but for a
/// message over gRPC's limit, which Cairn's server refuses as etcd's does.
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
    // A message over the gRPC limit: etcd's (grpc-go's) answer from
    // Cairn's own server, tonic's from tonic's.
    let own_huge = answers[0].remove(1);
    let tonic_huge = answers[1].remove(1);
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][0].1, "etcdserver: request is too large");
    assert_eq!(own_huge.0, tonic::Code::ResourceExhausted, "{own_huge:?}");
    assert!(
        own_huge
            .1
            .starts_with("grpc: received message larger than max (")
            && own_huge.1.ends_with(" vs. 2097152)"),
        "{own_huge:?}"
    );
    assert!(
        tonic_huge
            .1
            .starts_with("Error, decoded message length too large"),
        "{tonic_huge:?}"
    );
}

/// The first error of a watch created with `key`: at its start (etcd's
/// server sends no headers before it) or as its stream's first message
/// (Cairn's Watch service answers its headers before reading).
async fn watch_error(c: &mut etcd_client::Client, key: Vec<u8>) -> (tonic::Code, String) {
    let status = match c.watch(key, None).await {
        Err(e) => status_of(e),
        Ok(mut stream) => {
            let first = tokio::time::timeout(TIMEOUT, stream.message())
                .await
                .expect("an answer in time");
            status_of(first.expect_err("a watch whose create is over the cap"))
        }
    };
    (status.code(), status.message().to_string())
}

/// Every service caps a request message as etcd's gRPC server does
/// (`--max-request-bytes` plus 512 KiB), not only KV: a unary Auth call and
/// a Watch stream are refused with etcd's answer, compared with a real
/// etcd; tonic's server applies the same cap with its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_caps_messages_as_etcds() {
    if !common::require_tool("etcd") {
        return;
    }
    let etcd = common::Etcd::start();
    let own = Cluster::start(1, &[]);
    let tonic_server = Cluster::start(1, &["--grpc-server", "tonic"]);
    let huge = vec![b'n'; 2_200_000];
    let huge_name = "n".repeat(2_200_000);
    let mut answers = Vec::new();
    for endpoint in [etcd.endpoint.clone(), own.endpoints()[0].clone()] {
        let mut c = client(&endpoint).await;
        wait_writable(&mut c, "/ready").await;
        let added = c.user_add(huge_name.clone(), "pw", None).await;
        let e = status_of(added.expect_err("a user over the cap"));
        let watched = watch_error(&mut c, huge.clone()).await;
        answers.push(vec![(e.code(), e.message().to_string()), watched]);
        // The connection serves on.
        c.put("/after", "v", None).await.expect("a put after");
    }
    assert_eq!(answers[0], answers[1], "etcd's answers, then Cairn's");
    assert_eq!(answers[1][0].0, tonic::Code::ResourceExhausted);
    assert!(
        answers[1][0].1.ends_with(" vs. 2097152)"),
        "{:?}",
        answers[1]
    );
    let mut c = client(&tonic_server.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let e = status_of(c.user_add(huge_name.clone(), "pw", None).await.unwrap_err());
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    assert!(
        e.message().ends_with("the limit is: 2097152 bytes"),
        "{e:?}"
    );
    let watched = watch_error(&mut c, huge).await;
    assert_eq!(watched.0, tonic::Code::OutOfRange, "{watched:?}");
}

/// A Watch stream whose client stopped reading while events filled its
/// queue, then sent a create over the message cap: reading again, the
/// client gets the events queued and then the stream's error, never a
/// stream that just ends (the error waits for room in the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_streams_error_follows_what_a_client_that_stopped_reading_left_queued() {
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let mut stream = c
        .watch("/full/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let created = tokio::time::timeout(TIMEOUT, stream.message())
        .await
        .expect("created in time")
        .unwrap()
        .expect("a created answer");
    assert!(created.created(), "{created:?}");
    // Far more than the stream's queue (256 answers) and the connection's
    // flow-control windows hold, each put its own answer.
    let value = vec![b'v'; 64 * 1024];
    for i in 0..600 {
        c.put(format!("/full/{i:04}"), value.clone(), None)
            .await
            .unwrap();
    }
    stream
        .watch(vec![b'n'; 2_200_000], None)
        .await
        .expect("the create is sent");
    // The create's bytes reach the member while nothing is read; then a
    // slow reader, one answer at a time, so the stream's task meets the
    // create's error while the queue is full again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut events = 0;
    let mut answers = 0;
    let status = loop {
        answers += 1;
        if answers <= 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match tokio::time::timeout(TIMEOUT, stream.message())
            .await
            .expect("an answer in time")
        {
            Ok(Some(resp)) => events += resp.events().len(),
            Ok(None) => panic!("the stream ended without its error, after {events} events"),
            Err(e) => break status_of(e),
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(events > 0, "no event before the error");
    // The connection serves on.
    c.put("/after", "v", None).await.expect("a put after");
}

/// etcd's `etcd_debugging_mvcc_watch_stream_total` and
/// `etcd_debugging_mvcc_watcher_total` count a member's open Watch streams
/// and their live watches: up with each create, down with a cancel and with
/// the end of a stream, whatever it still had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_watch_gauges_count_streams_and_live_watches() {
    let cluster = Cluster::start(1, &[]);
    let port = cluster.members[0].client_port;
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    assert_eq!(common::watch_gauges(port), (Some(0.0), Some(0.0)));
    let created = |resp: Option<etcd_client::WatchResponse>| {
        let resp = resp.expect("an answer");
        assert!(resp.created(), "{resp:?}");
        resp.watch_id()
    };
    let mut first = c.watch("/gauge/a", None).await.unwrap();
    let a = created(first.message().await.unwrap());
    first.watch("/gauge/b", None).await.unwrap();
    created(first.message().await.unwrap());
    let mut second = c
        .watch("/gauge/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    created(second.message().await.unwrap());
    assert_eq!(common::watch_gauges(port), (Some(2.0), Some(3.0)));
    first.cancel(a).await.unwrap();
    let cancelled = first.message().await.unwrap().expect("an answer");
    assert!(cancelled.canceled(), "{cancelled:?}");
    assert_eq!(common::watch_gauges(port), (Some(2.0), Some(2.0)));
    // The client goes away: its streams end with whatever they had.
    drop((first, second, c));
    common::eventually("the streams' ends counted", TIMEOUT, || async {
        match common::watch_gauges(port) {
            (Some(0.0), Some(0.0)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// What a raw connection sends to break the protocol.
type Breach = Box<dyn Fn(&mut Raw)>;

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
        let mut raw = Raw::preface_only(port);
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

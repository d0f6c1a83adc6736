//! How much one client connection may hold on Cairn's own gRPC server
//! (`src/grpc/conn`), against real `cairn` processes:
//! - abusive clients (calls reset as soon as sent, SETTINGS floods, request
//!   bodies past the connection's budget) are stopped, and the member goes
//!   on serving;
//! - how many streams one connection may open (`--max-concurrent-streams`),
//!   their header lists counted in the connection's budget, and many
//!   long-lived calls cancelled at once.

use crate::common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use cairn_proto::h2::frame;
use common::raw_h2::{grpc_message, header_block, request_fields, request_head, Raw};
use common::{client, wait_writable, Cluster};

const TIMEOUT: Duration = Duration::from_secs(30);

/// One member ready for writes, a client of it, and its client port.
async fn one_member() -> (Cluster, etcd_client::Client, u16) {
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let port = cluster.members[0].client_port;
    (cluster, c, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_clients_are_stopped_and_cost_bounded_work() {
    use cairn_proto::etcdserverpb::{PutRequest, RangeRequest};
    let (_cluster, mut c, port) = one_member().await;
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
    let (_cluster, mut c, port) = one_member().await;
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

/// The header lists of a connection's open streams count toward its budget
/// of held request bytes (`MAX_HELD_BYTES`, 64 MiB) at the memory their
/// decoded heads hold (`RequestHead::held_bytes`), as bodies do: watch
/// streams that stay open, each with a header list near the 64 KiB a list
/// may have, are accepted up to the budget, the next one is reset with
/// ENHANCE_YOUR_CALM, the connection and the member go on, and a stream that
/// ends makes room for one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_header_lists_count_toward_the_connections_budget() {
    use cairn::grpc::conn::MAX_HELD_BYTES;
    use cairn::grpc::request::RequestHead;
    use cairn_proto::h2::hpack::Block;
    let (_cluster, mut c, port) = one_member().await;
    tokio::task::spawn_blocking(move || {
        let pad = "p".repeat(60_000);
        let mut fields = request_fields("/etcdserverpb.Watch/Watch");
        fields.push(("x-pad", pad.as_str()));
        // What the member counts for each stream: the head it decodes.
        let list = RequestHead::of(&Block::literals(fields.iter().copied())).held_bytes();
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
            resets.extend(raw.resets_before_ping(&frames));
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
        assert_eq!(raw.resets_before_ping(&frames), []);
        let mut frames = BytesMut::new();
        open(&mut frames, refused + 4);
        assert_eq!(raw.resets_before_ping(&frames), [(refused + 4, 0xb)]);
    })
    .await
    .unwrap();
    c.put("/after-headers", "v", None).await.unwrap();
}

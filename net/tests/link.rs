//! Guards the links between members over real loopback sockets: frames must
//! arrive intact, in order, coalesced into few writes and as slices of the
//! receive buffer; a dialer must reconnect after its peer restarts, and look a
//! peer's host name up before each attempt without holding up its core; a full
//! queue must be refused at once without a dead peer holding up others; and
//! streams must arrive verified, starting over after a lost connection.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_net::{
    dial, serve_accepted, BytesSource, Config, Inbound, InboundReceiver, Link, PeerTarget,
    SendError, HEADER_BYTES,
};
use common::{config, listener, listener_with, run_local};

/// Dials member 1 from member 2 on `lane` and returns both ends.
async fn connected_pair(lane: u32) -> (Link, InboundReceiver, Link, InboundReceiver) {
    let mut listener = listener(1, &[2], 4).await;
    let addr = listener.local_addr().unwrap();
    let (client, client_rx) = dial(&config(2), 1, addr, lane).unwrap();
    let accepted = listener.accept().await;
    assert_eq!(accepted.hello.member_id, 2);
    assert_eq!(accepted.hello.lane, lane);
    let (server, server_rx) = serve_accepted(accepted, &config(1)).unwrap();
    client.wait_connected().await.unwrap();
    (client, client_rx, server, server_rx)
}

fn message(payload: &Inbound) -> (u32, u16, &Bytes) {
    match payload {
        Inbound::Message {
            shard_id,
            flags,
            payload,
        } => (*shard_id, *flags, payload),
        other => panic!("expected a message, got {other:?}"),
    }
}

#[test]
fn messages_round_trip_both_ways() {
    run_local(async {
        let (client, mut client_rx, server, mut server_rx) = connected_pair(3).await;
        let sizes = [0usize, 1, 19, 20, 21, 255, 4096, 100_000, 1 << 20];
        for (i, size) in sizes.iter().enumerate() {
            let payload = Bytes::from((0..*size).map(|b| (b + i) as u8).collect::<Vec<u8>>());
            client.send_wait(i as u32, i as u16, payload).await.unwrap();
        }
        // A message of several parts arrives as one payload.
        client
            .send_parts(
                99,
                0,
                vec![
                    Bytes::from_static(b"head:"),
                    Bytes::from_static(b"entry-data"),
                ],
            )
            .unwrap();
        for (i, size) in sizes.iter().enumerate() {
            let item = server_rx.recv().await.unwrap();
            let (shard, flags, payload) = message(&item);
            assert_eq!((shard, flags, payload.len()), (i as u32, i as u16, *size));
            assert!(payload.iter().enumerate().all(|(b, v)| *v == (b + i) as u8));
        }
        let item = server_rx.recv().await.unwrap();
        assert_eq!(&message(&item).2[..], b"head:entry-data");

        server.send(7, 0, Bytes::from_static(b"reply")).unwrap();
        let item = client_rx.recv().await.unwrap();
        assert_eq!(message(&item), (7, 0, &Bytes::from_static(b"reply")));

        let sent = client.counters().snapshot();
        let received = server.counters().snapshot();
        assert_eq!(sent.frames_sent, sizes.len() as u64 + 1);
        assert_eq!(received.frames_received, sent.frames_sent);
        assert_eq!(received.bytes_received, sent.bytes_sent);
    });
}

#[test]
fn queued_frames_coalesce_into_one_write_and_arrive_as_buffer_slices() {
    run_local(async {
        let (client, _client_rx, _server, mut server_rx) = connected_pair(0).await;
        let before = client.counters().snapshot();
        const FRAMES: usize = 200;
        const PAYLOAD_BYTES: usize = 40;
        // Queued without yielding, as a core queues one Ready's messages.
        for i in 0..FRAMES {
            client
                .send(1, 0, Bytes::from(vec![i as u8; PAYLOAD_BYTES]))
                .unwrap();
        }
        let mut payloads = Vec::new();
        let mut batches = Vec::new();
        while payloads.len() < FRAMES {
            let batch = server_rx.recv_batch().await.unwrap();
            batches.push(batch.len());
            for item in batch {
                payloads.push(message(&item).2.clone());
            }
        }
        let after = client.counters().snapshot();
        assert_eq!(after.frames_sent - before.frames_sent, FRAMES as u64);
        assert_eq!(
            after.writes - before.writes,
            1,
            "200 queued frames go out in one writev"
        );
        // Frames that arrived in one read are consecutive slices of one buffer:
        // each payload starts right after the previous payload and a header.
        let mut index = 0;
        for batch_len in batches {
            for pair in payloads[index..index + batch_len].windows(2) {
                assert_eq!(
                    pair[1].as_ptr() as usize,
                    pair[0].as_ptr() as usize + PAYLOAD_BYTES + HEADER_BYTES,
                    "payloads are slices of the receive buffer, not copies"
                );
            }
            index += batch_len;
        }
        for (i, payload) in payloads.iter().enumerate() {
            assert_eq!(&payload[..], &vec![i as u8; PAYLOAD_BYTES][..]);
        }
    });
}

#[test]
fn dialer_reconnects_after_the_peer_restarts() {
    run_local(async {
        let mut first = listener(1, &[2], 1).await;
        let addr = first.local_addr().unwrap();
        let (client, _client_rx) = dial(&config(2), 1, addr, 0).unwrap();
        let (server, mut server_rx) = serve_accepted(first.accept().await, &config(1)).unwrap();
        client.send(1, 0, Bytes::from_static(b"before")).unwrap();
        assert_eq!(&message(&server_rx.recv().await.unwrap()).2[..], b"before");

        // The peer goes away: connection and listener both.
        server.close();
        drop(first);
        assert!(server_rx.recv().await.is_none());
        while client.is_connected() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Let a few dials fail against the closed port.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(client.counters().snapshot().connect_failures >= 1);
        // Queued while down, delivered once the peer is back.
        client
            .send(1, 0, Bytes::from_static(b"while-down"))
            .unwrap();

        let mut second = common::listener_at(addr, 1, &[2], 1).await;
        let (_server, mut server_rx) = serve_accepted(second.accept().await, &config(1)).unwrap();
        client.wait_connected().await.unwrap();
        client.send(1, 0, Bytes::from_static(b"after")).unwrap();
        assert_eq!(
            &message(&server_rx.recv().await.unwrap()).2[..],
            b"while-down"
        );
        assert_eq!(&message(&server_rx.recv().await.unwrap()).2[..], b"after");
        assert_eq!(client.counters().snapshot().reconnects, 1);
    });
}

#[test]
fn full_queue_is_refused_at_once_and_a_dead_peer_blocks_no_one() {
    run_local(async {
        // A peer that completes the handshake and then never reads.
        let mut dead = listener(1, &[2], 1).await;
        let dead_addr = dead.local_addr().unwrap();
        let small_queue = Config {
            max_frame_payload_bytes: 64 * 1024,
            send_queue_max_bytes: 256 * 1024,
            send_queue_max_frames: 64,
            stream_chunk_bytes: 32 * 1024,
            ..config(2)
        };
        let (to_dead, _rx) = dial(&small_queue, 1, dead_addr, 0).unwrap();
        let _dead_conn = dead.accept().await; // held open, never read
        to_dead.wait_connected().await.unwrap();

        let (to_live, _live_rx, _live_server, mut live_rx) = connected_pair(0).await;

        let payload = Bytes::from(vec![0xAB; 60 * 1024]);
        let mut refused = None;
        for i in 0..10_000 {
            let started = Instant::now();
            match to_dead.send(0, 0, payload.clone()) {
                Ok(()) => {}
                Err(err) => {
                    assert!(
                        started.elapsed() < Duration::from_millis(5),
                        "refusal must be immediate"
                    );
                    refused = Some(err);
                    break;
                }
            }
            if i % 4 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let refused = refused.expect("the queue to a peer that never reads must fill");
        assert!(
            matches!(refused, SendError::QueueFull { peer_member: 1, .. }),
            "{refused}"
        );
        assert!(to_dead.queued_bytes() <= 256 * 1024);
        assert!(to_dead.counters().snapshot().queue_full_drops >= 1);

        // The other peer is unaffected.
        for i in 0..100u32 {
            to_live.send(i, 0, Bytes::from(vec![1; 1000])).unwrap();
        }
        for i in 0..100u32 {
            assert_eq!(message(&live_rx.recv().await.unwrap()).0, i);
        }
    });
}

#[test]
fn stream_arrives_verified_and_in_order() {
    run_local(async {
        let stream_config = Config {
            stream_chunk_bytes: 64 * 1024,
            stream_window_chunks: 4,
            ..config(2)
        };
        let mut listener = listener(1, &[2], 1).await;
        let (client, _client_rx) =
            dial(&stream_config, 1, listener.local_addr().unwrap(), 0).unwrap();
        let (_server, mut server_rx) = serve_accepted(listener.accept().await, &config(1)).unwrap();
        let data = Bytes::from(
            (0..3_000_000u32)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<u8>>(),
        );
        let expected = data.clone();
        let receiver = tokio::task::spawn_local(async move {
            let mut got = Vec::new();
            loop {
                match server_rx.recv().await.unwrap() {
                    Inbound::StreamStart {
                        attempt, shard_id, ..
                    } => assert_eq!((attempt, shard_id), (1, 5)),
                    Inbound::StreamChunk { data, .. } => got.extend_from_slice(&data),
                    Inbound::StreamEnd { total_bytes, .. } => {
                        assert_eq!(total_bytes, got.len() as u64);
                        return got;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        });
        let report = client
            .send_stream(5, &mut BytesSource::new(data))
            .await
            .unwrap();
        assert_eq!(report.attempts, 1);
        assert_eq!(report.total_bytes, 3_000_000);
        assert_eq!(report.chunks, 3_000_000u64.div_ceil(64 * 1024));
        assert_eq!(receiver.await.unwrap(), expected);
        // A message sent after the stream still flows.
        client
            .send(1, 0, Bytes::from_static(b"after-stream"))
            .unwrap();
    });
}

#[test]
fn stream_starts_over_after_the_connection_is_lost() {
    run_local(async {
        let stream_config = Config {
            stream_chunk_bytes: 16 * 1024,
            stream_window_chunks: 2,
            ..config(2)
        };
        let mut listener = listener(1, &[2], 1).await;
        let (client, _client_rx) =
            dial(&stream_config, 1, listener.local_addr().unwrap(), 0).unwrap();
        let data = Bytes::from(
            (0..500_000u32)
                .map(|i| (i % 253) as u8)
                .collect::<Vec<u8>>(),
        );
        let expected = data.clone();
        let receiver = tokio::task::spawn_local(async move {
            // First connection: take two chunks, then drop the connection.
            let (server, mut rx) = serve_accepted(listener.accept().await, &config(1)).unwrap();
            let mut chunks = 0;
            while chunks < 2 {
                if let Inbound::StreamChunk { .. } = rx.recv().await.unwrap() {
                    chunks += 1;
                }
            }
            server.close();
            drop(rx);
            // Second connection: the stream starts over from byte 0.
            // (The link is returned so it outlives the sender's wait for the
            // verdict: dropping the last handle closes it.)
            let (server, mut rx) = serve_accepted(listener.accept().await, &config(1)).unwrap();
            let mut got = Vec::new();
            loop {
                match rx.recv().await.unwrap() {
                    Inbound::StreamStart { attempt, .. } => {
                        assert!(attempt >= 2, "a fresh attempt after the loss");
                        got.clear();
                    }
                    Inbound::StreamChunk { data, .. } => got.extend_from_slice(&data),
                    Inbound::StreamEnd { .. } => return (got, server),
                    other => panic!("unexpected {other:?}"),
                }
            }
        });
        let report = client
            .send_stream(9, &mut BytesSource::new(data))
            .await
            .unwrap();
        assert!(report.attempts >= 2, "{report:?}");
        assert_eq!(receiver.await.unwrap().0, expected);
        assert!(client.counters().snapshot().reconnects >= 1);
    });
}

#[test]
fn config_is_validated_before_dialing() {
    run_local(async {
        let bad = Config {
            send_queue_max_frames: 0,
            ..config(2)
        };
        let err = dial(
            &bad,
            1,
            "127.0.0.1:1".parse::<std::net::SocketAddr>().unwrap(),
            0,
        )
        .unwrap_err();
        assert!(err.to_string().contains("send_queue_max_frames"), "{err}");
        let _ = listener_with(config(1), &[], 1).await;
    });
}

#[test]
fn a_send_only_link_keeps_working_with_its_receiver_dropped() {
    run_local(async {
        let (client, client_rx, server, mut server_rx) = connected_pair(0).await;
        drop(client_rx);
        // Inbound traffic to the send-only side is discarded, not fatal.
        for _ in 0..10 {
            server.send(0, 0, Bytes::from_static(b"ignored")).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(client.is_connected());
        client
            .send(4, 0, Bytes::from_static(b"still-here"))
            .unwrap();
        assert_eq!(
            &message(&server_rx.recv().await.unwrap()).2[..],
            b"still-here"
        );
        // Stream acks are handled inside the link, so streams work too.
        let drain = tokio::task::spawn_local(async move {
            while let Some(item) = server_rx.recv().await {
                if let Inbound::StreamEnd { total_bytes, .. } = item {
                    return (total_bytes, server);
                }
            }
            panic!("link closed before the stream ended");
        });
        let report = client
            .send_stream(4, &mut BytesSource::new(Bytes::from(vec![3u8; 5 << 20])))
            .await
            .unwrap();
        assert_eq!(drain.await.unwrap().0, 5 << 20);
        assert_eq!(report.attempts, 1);
    });
}

#[test]
fn dropping_the_last_handle_closes_the_link() {
    run_local(async {
        let (client, _client_rx, _server, mut server_rx) = connected_pair(0).await;
        let counters = client.counters();
        drop(client);
        assert!(
            server_rx.recv().await.is_none(),
            "the peer sees the connection end"
        );
        assert_eq!(counters.snapshot().reconnects, 0);
    });
}

/// A receiver that says the first attempt's checksum did not match: the
/// sender must start over from byte 0 on the same connection.
#[test]
fn stream_starts_over_when_the_receiver_reports_a_mismatch() {
    use cairn_net::frame::{encode_frame, FrameDecoder, FrameKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    run_local(async {
        let mut listener = listener(1, &[2], 1).await;
        let stream_config = Config {
            stream_chunk_bytes: 8 * 1024,
            stream_window_chunks: 1000,
            ..config(2)
        };
        let (client, _client_rx) =
            dial(&stream_config, 1, listener.local_addr().unwrap(), 0).unwrap();
        let accepted = listener.accept().await;
        let peer = tokio::task::spawn_local(async move {
            let cairn_net::AcceptedStream::Plain(socket) = accepted.stream else {
                panic!("a TLS connection on a plain port");
            };
            let mut socket = tokio::net::TcpStream::from_std(socket).unwrap();
            let mut decoder = FrameDecoder::new(1 << 20, 64 * 1024);
            let mut starts = Vec::new();
            let mut bytes_per_attempt = Vec::new();
            loop {
                decoder.prepare_read();
                if socket.read_buf(decoder.buffer_mut()).await.unwrap() == 0 {
                    return (starts, bytes_per_attempt);
                }
                while let Some(frame) = decoder.decode().unwrap() {
                    let id = u64::from_le_bytes(frame.payload[..8].try_into().unwrap());
                    match frame.kind {
                        FrameKind::StreamStart => {
                            starts
                                .push(u32::from_le_bytes(frame.payload[8..12].try_into().unwrap()));
                            bytes_per_attempt.push(0usize);
                        }
                        FrameKind::StreamChunk => {
                            *bytes_per_attempt.last_mut().unwrap() += frame.payload.len() - 8
                        }
                        FrameKind::StreamEnd => {
                            let ok = starts.len() > 1;
                            let mut result = id.to_le_bytes().to_vec();
                            result.push(u8::from(ok));
                            let reply =
                                encode_frame(FrameKind::StreamResult, 0, frame.shard_id, &result);
                            socket.write_all(&reply).await.unwrap();
                            if ok {
                                return (starts, bytes_per_attempt);
                            }
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        });
        let data = Bytes::from(vec![9u8; 100_000]);
        let report = client
            .send_stream(2, &mut BytesSource::new(data))
            .await
            .unwrap();
        assert_eq!(report.attempts, 2);
        let (starts, bytes_per_attempt) = peer.await.unwrap();
        assert_eq!(starts, vec![1, 2]);
        assert_eq!(
            bytes_per_attempt,
            vec![100_000, 100_000],
            "each attempt sends everything from byte 0"
        );
        assert_eq!(
            client.counters().snapshot().reconnects,
            0,
            "same connection"
        );
    });
}

#[test]
fn oversize_send_is_refused_without_queueing() {
    run_local(async {
        let (client, _rx, _server, _server_rx) = connected_pair(0).await;
        let max = config(2).max_frame_payload_bytes as usize;
        let err = client
            .send(3, 0, Bytes::from(vec![0u8; max + 1]))
            .unwrap_err();
        assert!(
            matches!(err, SendError::TooLarge { shard_id: 3, .. }),
            "{err}"
        );
        assert_eq!(client.queued_frames(), 0);
        client.send(3, 0, Bytes::from(vec![0u8; max])).unwrap();
    });
}

#[test]
fn refused_dialer_keeps_retrying_with_backoff_and_never_connects() {
    let logs = common::LogCapture::start();
    run_local(async {
        let mut listener = listener(1, &[2], 1).await;
        let addr = listener.local_addr().unwrap();
        let stranger = Config {
            cluster_id: common::CLUSTER_ID ^ 0xFF,
            ..config(2)
        };
        let (link, _rx) = dial(&stranger, 1, addr, 0).unwrap();
        let accepting = tokio::task::spawn_local(async move {
            // Never returns: every greeting is refused.
            listener.accept().await
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!link.is_connected());
        let failures = link.counters().snapshot().connect_failures;
        // 10 ms doubling to a 100 ms cap: a handful of attempts, not hundreds.
        assert!(
            (2..=15).contains(&failures),
            "{failures} attempts in 400 ms"
        );
        link.send(0, 0, Bytes::from_static(b"queued while refused"))
            .unwrap();
        accepting.abort();
    });
    let refusals = logs.lines_with("refused peer handshake");
    assert!(!refusals.is_empty());
    assert!(refusals[0].contains("local_member=1") && refusals[0].contains("peer_member=2"));
    let refused = logs.lines_with("outbound peer handshake failed");
    assert!(refused[0].contains("wrong cluster id"), "{}", refused[0]);
}

#[test]
fn a_port_shared_with_another_protocol_hands_over_its_connections_unread() {
    run_local(async {
        let mut listener = listener(1, &[2], 4)
            .await
            .with_other_protocol(|prefix| prefix == b"GET ");
        let addr = listener.local_addr().unwrap();
        // Another protocol's connection comes back unread.
        let mut other = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut other, b"GET /x HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        match listener.accept_any().await {
            cairn_net::Incoming::Other {
                stream: cairn_net::OtherStream::Plain(stream),
                ..
            } => {
                let mut buf = [0u8; 6];
                stream.peek(&mut buf).await.unwrap();
                assert_eq!(&buf, b"GET /x");
            }
            cairn_net::Incoming::Peer(a) => panic!("a peer from {}", a.peer_addr),
            cairn_net::Incoming::Other { stream, .. } => panic!("{stream:?} on a plain port"),
        }
        // A peer still gets through, and garbage is still refused.
        let mut garbage = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut garbage, b"\x00\x01\x02\x03garbage")
            .await
            .unwrap();
        let (client, _client_rx) = dial(&config(2), 1, addr, 0).unwrap();
        let accepted = match listener.accept_any().await {
            cairn_net::Incoming::Peer(a) => a,
            cairn_net::Incoming::Other { .. } => panic!("garbage was claimed"),
        };
        assert_eq!(accepted.hello.member_id, 2);
        let (_server, _server_rx) = serve_accepted(accepted, &config(1)).unwrap();
        client.wait_connected().await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::io::AsyncReadExt::read(&mut garbage, &mut buf);
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), read)
            .await
            .expect("the garbage connection is left open")
            .unwrap_or(0);
        assert_eq!(n, 0, "the garbage connection is closed");
    });
}

#[test]
fn a_peer_named_by_host_is_looked_up_off_the_core_before_each_attempt() {
    run_local(async {
        // A name that resolves: the link connects to the listener behind it.
        let mut listener = listener(1, &[2], 1).await;
        let port = listener.local_addr().unwrap().port();
        let (client, _client_rx) = dial(
            &config(2),
            1,
            PeerTarget::HostPort(format!("localhost:{port}")),
            0,
        )
        .unwrap();
        let accepted = listener.accept().await;
        let (_server, _server_rx) = serve_accepted(accepted, &config(1)).unwrap();
        client.wait_connected().await.unwrap();
        assert_eq!(client.peer_addr().map(|a| a.port()), Some(port));

        // A name that does not resolve (yet): the link keeps trying, and the
        // lookups never hold up the core's thread.
        let (unresolved, _rx) = dial(
            &config(2),
            1,
            PeerTarget::HostPort("cairn-peer.invalid:2380".into()),
            0,
        )
        .unwrap();
        let started = Instant::now();
        let mut ticks = 0u32;
        let mut interval = tokio::time::interval(Duration::from_millis(10));
        while unresolved.counters().snapshot().connect_failures < 2 {
            interval.tick().await;
            ticks += 1;
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no failed attempt reported"
            );
        }
        let expected = (started.elapsed().as_millis() / 10) as u32;
        assert!(
            ticks + 5 >= expected / 2,
            "the core's timers ran {ticks} times in {:?}",
            started.elapsed()
        );
        assert!(!unresolved.is_connected());
        unresolved.close();
    });
}

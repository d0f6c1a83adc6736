//! Guards the handshake: a connection from another cluster, from a member not
//! in the membership, meant for another member, for a lane this member does not
//! serve, or from another wire version must be refused on both ends, with one
//! log line on the refusing side naming both members; and an accepted
//! connection must be handed to another thread's runtime and work there.

mod common;

use bytes::Bytes;
use cairn_net::frame::{encode_header, FrameKind, HEADER_BYTES};
use cairn_net::handshake::dial_handshake;
use cairn_net::{
    accept_handshake, serve_accepted, AcceptPolicy, Config, HandshakeError, Inbound, MemberSet,
    RefuseReason,
};
use common::{config, run_local, LogCapture, CLUSTER_ID};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn policy() -> AcceptPolicy {
    AcceptPolicy {
        config: config(1),
        members: MemberSet::new([2, 3]),
        lane_count: 4,
    }
}

/// Dials member `target` on `lane` with `dialer` against member 1 running
/// [`policy`], and returns (acceptor result, dialer result).
async fn handshake(
    dialer: Config,
    target: u64,
    lane: u32,
) -> (Result<(), HandshakeError>, Result<(), HandshakeError>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, _) = listener.accept().await.unwrap();
    let policy = policy();
    let (accepted, dialed) = tokio::join!(
        accept_handshake(stream, &policy),
        dial_handshake(&mut client, &dialer, target, lane)
    );
    (accepted.map(|_| ()), dialed)
}

fn assert_refused(dialer: Config, target: u64, lane: u32, expected: RefuseReason) {
    let logs = LogCapture::start();
    let dialer_member = dialer.member_id;
    let (accepted, dialed) = run_local(handshake(dialer, target, lane));
    match accepted.unwrap_err() {
        HandshakeError::RefusedPeer {
            local_member,
            peer_member,
            reason,
            ..
        } => assert_eq!(
            (local_member, peer_member, reason),
            (1, dialer_member, expected)
        ),
        other => panic!("acceptor: expected a refusal, got {other}"),
    }
    match dialed.unwrap_err() {
        HandshakeError::RefusedByPeer {
            local_member,
            peer_member,
            reason,
            ..
        } => assert_eq!(
            (local_member, peer_member, reason),
            (dialer_member, 1, expected)
        ),
        other => panic!("dialer: expected a refusal, got {other}"),
    }
    let lines = logs.lines_with("refused peer handshake");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("local_member=1"), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("peer_member={dialer_member}")),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(&format!("reason={expected}")),
        "{}",
        lines[0]
    );
}

#[test]
fn wrong_cluster_is_refused() {
    let dialer = Config {
        cluster_id: CLUSTER_ID + 1,
        ..config(2)
    };
    assert_refused(dialer, 1, 0, RefuseReason::WrongCluster);
}

#[test]
fn unknown_member_is_refused() {
    assert_refused(config(9), 1, 0, RefuseReason::UnknownMember);
}

#[test]
fn connection_meant_for_another_member_is_refused() {
    assert_refused(config(2), 5, 0, RefuseReason::WrongTarget);
}

#[test]
fn unknown_lane_is_refused() {
    assert_refused(config(3), 1, 4, RefuseReason::UnknownLane);
}

#[test]
fn known_member_is_accepted() {
    let (accepted, dialed) = run_local(handshake(config(3), 1, 3));
    accepted.unwrap();
    dialed.unwrap();
}

#[test]
fn member_removed_from_membership_is_refused() {
    let logs = LogCapture::start();
    run_local(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let policy = policy();
        policy.members.remove(2);
        let dialer_config = config(2);
        let (accepted, _) = tokio::join!(
            accept_handshake(stream, &policy),
            dial_handshake(&mut client, &dialer_config, 1, 0)
        );
        assert!(matches!(
            accepted,
            Err(HandshakeError::RefusedPeer {
                reason: RefuseReason::UnknownMember,
                ..
            })
        ));
    });
    assert_eq!(logs.lines_with("refused peer handshake").len(), 1);
}

#[test]
fn other_wire_version_is_refused_and_named() {
    let logs = LogCapture::start();
    run_local(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        // A Hello from a future version 2 (header and Hello layout are frozen).
        let mut payload = Vec::new();
        payload.extend_from_slice(&CLUSTER_ID.to_le_bytes());
        payload.extend_from_slice(&2u64.to_le_bytes());
        payload.extend_from_slice(&1u64.to_le_bytes());
        payload.extend_from_slice(&0u32.to_le_bytes());
        let payload = Bytes::from(payload);
        let mut header = encode_header(FrameKind::Hello, 0, 0, std::slice::from_ref(&payload));
        header[4] = 2;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&header[..16]);
        hasher.update(&payload);
        header[16..20].copy_from_slice(&hasher.finalize().to_le_bytes());
        client.write_all(&header).await.unwrap();
        client.write_all(&payload).await.unwrap();

        let policy = policy();
        let err = accept_handshake(stream, &policy).await.unwrap_err();
        assert!(
            matches!(
                err,
                HandshakeError::RefusedPeer {
                    reason: RefuseReason::VersionMismatch,
                    peer_member: 2,
                    ..
                }
            ),
            "{err}"
        );
        // The refusal arrives in this build's version, reason code 4.
        let mut reply = [0u8; HEADER_BYTES + 1];
        client.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[5], FrameKind::HelloRefuse as u8);
        assert_eq!(reply[HEADER_BYTES], 4);
    });
    let lines = logs.lines_with("refused peer handshake");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("peer_version=2") && lines[0].contains("peer_member=2"),
        "{}",
        lines[0]
    );
}

#[test]
fn accepted_connection_moves_to_another_threads_runtime() {
    let (to_core, on_core) = std::sync::mpsc::channel::<cairn_net::Accepted>();
    // The "core": its own thread, current-thread runtime and LocalSet.
    let core = std::thread::spawn(move || {
        run_local(async move {
            let accepted = on_core.recv().unwrap();
            assert_eq!((accepted.hello.member_id, accepted.hello.lane), (2, 3));
            let (_link, mut rx) = serve_accepted(accepted, &config(1)).unwrap();
            match rx.recv().await.unwrap() {
                Inbound::Message {
                    payload, shard_id, ..
                } => (shard_id, payload),
                other => panic!("unexpected {other:?}"),
            }
        })
    });
    // The "listener thread" accepts and hands off; the dialer runs here too.
    run_local(async move {
        let mut listener = common::listener(1, &[2], 4).await;
        let (link, _rx) =
            cairn_net::dial(&config(2), 1, listener.local_addr().unwrap(), 3).unwrap();
        to_core.send(listener.accept().await).unwrap();
        link.wait_connected().await.unwrap();
        link.send(11, 0, Bytes::from_static(b"to the lane's core"))
            .unwrap();
        // Keep this runtime alive until the core has it.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    });
    let (shard, payload) = core.join().unwrap();
    assert_eq!((shard, &payload[..]), (11, &b"to the lane's core"[..]));
}

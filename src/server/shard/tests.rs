//! The snapshot stream a follower receives restores the store it was read from.

use super::snapshots::StoreSnapshotSource;
use super::*;
use cairn_net::StreamSource as _;

fn store_with_keys(dir: &std::path::Path, n: usize) -> mvcc::Store {
    let mut store = mvcc::Store::open(dir, 0, mvcc::Config::default()).unwrap();
    for i in 0..n {
        let put = pb::PutRequest {
            key: Bytes::from(format!("/k/{i:05}")),
            value: Bytes::from(vec![b'v'; 300]),
            ..Default::default()
        };
        store
            .apply(i as u64 + 1, &mvcc::Op::Put(convert::put_from_pb(&put)))
            .unwrap();
    }
    store.commit().unwrap();
    store
}

#[test]
fn a_snapshot_read_as_it_is_sent_restores_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_keys(&dir.path().join("a"), 3_000);
    let msg = raft::Message {
        msg_type: raft::MessageType::MsgSnap as i32,
        to: 2,
        from: 1,
        term: 3,
        ..Default::default()
    };
    let mut source = StoreSnapshotSource {
        message: Some(Bytes::from(msg.encode_to_vec())),
        stream: store.snapshot_stream(),
        pending: None,
        started: false,
        bytes: 0,
        progress: Rc::new(std::cell::Cell::new(Instant::now())),
    };
    source.rewind().unwrap();
    let mut parts = Vec::new();
    while let Some(b) = source.next_chunk(64 * 1024).unwrap() {
        parts.push(b);
    }
    // Once read from, it cannot start over: the transfer fails instead.
    assert!(source.rewind().is_err());
    assert_eq!(
        source.bytes,
        parts.iter().map(|p| p.len() as u64).sum::<u64>()
    );
    let (got, chunks) = decode_snapshot_stream(parts).unwrap();
    assert_eq!(got, msg);
    let restored =
        mvcc::Store::restore(&dir.path().join("b"), 0, mvcc::Config::default(), chunks).unwrap();
    assert_eq!(restored.applied_index(), 3_000);
    assert_eq!(
        restored.hash_kv(0).unwrap().hash,
        store.hash_kv(0).unwrap().hash
    );
}

#[test]
fn a_truncated_snapshot_stream_is_an_error() {
    let msg = raft::Message::default().encode_to_vec();
    let mut whole = (msg.len() as u32).to_le_bytes().to_vec();
    whole.extend_from_slice(&msg);
    whole.extend_from_slice(&100u32.to_le_bytes());
    whole.extend_from_slice(b"short");
    let err = decode_snapshot_stream(vec![Bytes::from(whole)]).unwrap_err();
    assert!(err.contains("store chunk"), "{err}");
}

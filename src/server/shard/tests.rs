//! The snapshot stream a follower receives, spooled to a file as the
//! transport hands it over, restores the store it was read from.

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

/// Cuts `parts` into pieces of `piece_bytes` (the last one shorter), as the
/// transport may hand them: boundaries unrelated to the store's chunks.
fn recut(parts: &[Bytes], piece_bytes: usize) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    let mut piece = bytes::BytesMut::new();
    for part in parts {
        let mut part = part.clone();
        while !part.is_empty() {
            let take = (piece_bytes - piece.len()).min(part.len());
            piece.extend_from_slice(&part.split_to(take));
            if piece.len() == piece_bytes {
                pieces.push(piece.split().freeze());
            }
        }
    }
    if !piece.is_empty() {
        pieces.push(piece.freeze());
    }
    pieces
}

#[tokio::test]
async fn a_snapshot_read_as_it_is_sent_restores_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = store_with_keys(&dir.path().join("a"), 3_000);
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
    // Spooled by a writer thread of its own, as the daemon does, and on
    // the appending thread, as the simulation does: the same store.
    for (n, writer) in [
        spool::SpoolWriterThread::Own,
        spool::SpoolWriterThread::Caller,
    ]
    .into_iter()
    .enumerate()
    {
        let spool_dir = dir.path().join(format!("spool-{n}"));
        std::fs::create_dir(&spool_dir).unwrap();
        let mut spool =
            spool::StreamSpool::start(&spool_dir, 0, 1, 7, 1, u64::MAX, writer).unwrap();
        let pieces = recut(&parts, 100_003);
        assert!(pieces.len() > 3, "the store spans several pieces");
        for piece in pieces {
            spool.append(piece).await.unwrap();
        }
        let (got, chunks) = spool.finish().await.unwrap().into_parts();
        assert_eq!(got, msg);
        let mut reader = chunks.reader();
        let mut restored = mvcc::Store::restore(
            &dir.path().join(format!("b-{n}")),
            0,
            mvcc::Config::default(),
            &mut reader,
        )
        .unwrap();
        assert!(reader.into_error().is_none());
        assert_eq!(restored.applied_index(), 3_000);
        assert_eq!(
            restored.hash_kv(0).unwrap().hash,
            store.hash_kv(0).unwrap().hash
        );
    }
}

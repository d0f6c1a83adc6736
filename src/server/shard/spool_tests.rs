//! A received snapshot's spool file: damaged or cut-short content is an error
//! that names the file, never a panic or an allocation of what a corrupt
//! length announces; streams that do not complete, and files a crash left,
//! leave nothing on disk.

use std::time::{Duration, Instant};

use super::*;

fn message() -> Vec<u8> {
    raft::Message {
        msg_type: raft::MessageType::MsgSnap as i32,
        from: 1,
        to: 2,
        term: 3,
        ..Default::default()
    }
    .encode_to_vec()
}

fn len(n: usize) -> [u8; 4] {
    (n as u32).to_le_bytes()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Waits for the writer thread to delete what it was writing.
fn wait_until_empty(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !files(dir).is_empty() {
        assert!(Instant::now() < deadline, "left behind: {:?}", files(dir));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The store chunks of a spooled stream, and why they ended early if they did.
fn read_back(spooled: SpooledSnapshot) -> (Vec<Vec<u8>>, Option<SpoolError>) {
    let (_, chunks) = spooled.into_parts();
    let mut reader = chunks.reader();
    let got = reader.by_ref().collect();
    (got, reader.into_error())
}

#[test]
fn store_chunks_come_back_one_at_a_time_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let msg = message();
    let spooled = spool_for_test(
        dir.path(),
        "whole",
        &[
            &len(msg.len()),
            &msg,
            &len(3),
            b"abc",
            &len(0),
            &len(2),
            b"de",
        ],
    )
    .unwrap();
    let (chunks, error) = read_back(spooled);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(chunks, vec![b"abc".to_vec(), Vec::new(), b"de".to_vec()]);
}

#[test]
fn a_store_chunk_cut_short_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let msg = message();
    let spooled = spool_for_test(
        dir.path(),
        "short",
        &[&len(msg.len()), &msg, &len(3), b"abc", &len(100), b"short"],
    )
    .unwrap();
    let (chunks, error) = read_back(spooled);
    assert_eq!(chunks, vec![b"abc".to_vec()]);
    let error = error.expect("the cut is reported").to_string();
    assert!(
        error.contains("ends inside the store chunk (100 bytes announced)")
            && error.contains("snapshot-incoming-short"),
        "{error}"
    );
    // A cut inside a chunk's length too.
    let spooled = spool_for_test(dir.path(), "cut", &[&len(msg.len()), &msg, &[1, 0]]).unwrap();
    let error = read_back(spooled)
        .1
        .expect("the cut is reported")
        .to_string();
    assert!(
        error.contains("inside the length of the store chunk"),
        "{error}"
    );
}

#[test]
fn a_corrupt_length_is_an_error_before_anything_is_allocated_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let msg = message();
    let huge = (u32::MAX - 1).to_le_bytes();
    let spooled =
        spool_for_test(dir.path(), "huge", &[&len(msg.len()), &msg, &huge, b"x"]).unwrap();
    let error = read_back(spooled).1.expect("refused").to_string();
    assert!(error.contains("over the limit"), "{error}");
    // Within the limit, but past the end of the file.
    let spooled = spool_for_test(
        dir.path(),
        "past",
        &[&len(msg.len()), &msg, &len(1 << 20), b"x"],
    )
    .unwrap();
    let error = read_back(spooled).1.expect("refused").to_string();
    assert!(error.contains("1048576 bytes announced"), "{error}");
    // At the head: the message itself.
    let error = spool_for_test(dir.path(), "head", &[&huge, &msg])
        .unwrap_err()
        .to_string();
    assert!(error.contains("message of"), "{error}");
    let error = spool_for_test(dir.path(), "garbage", &[&len(3), &[0xff, 0xff, 0xff]])
        .unwrap_err()
        .to_string();
    assert!(error.contains("does not decode"), "{error}");
    // Refused at the head: not handed on, so deleted at once.
    assert_eq!(files(dir.path()), Vec::<String>::new());
}

#[test]
fn a_restore_from_a_cut_stream_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let msg = message();
    let spooled = spool_for_test(
        dir.path(),
        "restore",
        &[&len(msg.len()), &msg, &len(50), b"x"],
    )
    .unwrap();
    let (_, chunks) = spooled.into_parts();
    let mut reader = chunks.reader();
    let restored = mvcc::Store::restore(
        &dir.path().join("store"),
        0,
        mvcc::Config::default(),
        &mut reader,
    );
    assert!(restored.is_err());
    assert!(reader.into_error().is_some());
}

#[tokio::test]
async fn an_aborted_stream_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool =
        StreamSpool::start(dir.path(), 0, 1, 9, 1, u64::MAX, SpoolWriterThread::Own).unwrap();
    for _ in 0..4 {
        spool.append(Bytes::from(vec![7u8; 4096])).await.unwrap();
    }
    drop(spool);
    wait_until_empty(dir.path());
}

#[tokio::test]
async fn a_stream_over_its_limit_is_refused_as_it_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool =
        StreamSpool::start(dir.path(), 0, 1, 9, 1, 10_000, SpoolWriterThread::Own).unwrap();
    spool.append(Bytes::from(vec![7u8; 6_000])).await.unwrap();
    let error = spool.append(Bytes::from(vec![7u8; 6_000])).await;
    assert!(
        matches!(
            error,
            Err(SpoolError::OverLimit {
                limit_bytes: 10_000
            })
        ),
        "{error:?}"
    );
    drop(spool);
    wait_until_empty(dir.path());
}

#[tokio::test]
async fn a_spool_file_that_cannot_be_written_drops_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-shard");
    let mut spool =
        StreamSpool::start(&missing, 0, 1, 9, 1, u64::MAX, SpoolWriterThread::Own).unwrap();
    // The writer stops at once; the link learns it at the latest at the end.
    let mut dropped = false;
    for _ in 0..2 * SPOOL_QUEUE_CHUNKS {
        if spool.append(Bytes::from_static(b"data")).await.is_err() {
            dropped = true;
            break;
        }
    }
    if !dropped {
        assert!(matches!(
            spool.finish().await,
            Err(SpoolError::WriterGone { .. })
        ));
    }
    assert_eq!(files(dir.path()), Vec::<String>::new());
}

#[test]
fn leftover_spool_files_are_removed_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "snapshot-incoming-2-5-1-0000abcd",
        "snapshot-incoming-x",
        "store.db",
    ] {
        std::fs::write(dir.path().join(name), b"data").unwrap();
    }
    assert_eq!(remove_leftovers(dir.path()).unwrap(), 2);
    assert_eq!(files(dir.path()), vec!["store.db".to_string()]);
}

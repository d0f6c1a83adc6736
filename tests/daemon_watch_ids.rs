//! Watch ids a client chooses, against a real member: an id may be used
//! again on its stream once its watch is cancelled, and the new watch is
//! sent its own events only, never one of the cancelled watch's that were
//! still queued on their way to the stream.

use crate::common;

use std::time::Duration;

use common::{client, wait_writable, Cluster};
use etcd_client::{WatchOptions, WatchResponse, WatchStream};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Puts to the first watch's key while the stream is not read, of
/// `VALUE_BYTES` each: more than the client's flow-control window and the
/// stream's queues hold, so batches wait in the queues when it is
/// cancelled.
const OLD_PUTS: usize = 8000;
const VALUE_BYTES: usize = 512;
/// Clients writing them at once.
const WRITERS: usize = 8;
const ID: i64 = 7;

async fn next(stream: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(TIMEOUT, stream.message())
        .await
        .expect("a watch response within 30 s")
        .expect("the watch stream")
        .expect("the watch stream open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_id_used_again_after_its_cancel_is_sent_only_its_own_events() {
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;

    let mut stream = c
        .watch("old", Some(WatchOptions::new().with_watch_id(ID)))
        .await
        .expect("a watch stream");
    let created = next(&mut stream).await;
    assert!(created.created() && created.watch_id() == ID, "{created:?}");
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut c = c.clone();
        writers.push(tokio::spawn(async move {
            for i in (w..OLD_PUTS).step_by(WRITERS) {
                let value = format!("{i:0width$}", width = VALUE_BYTES);
                c.put("old", value, None).await.expect("put old");
            }
        }));
    }
    for w in writers {
        w.await.expect("a writer");
    }
    // Cancel and create again with the same id, the stream still unread.
    stream.cancel(ID).await.expect("cancel sent");
    stream
        .watch("new", Some(WatchOptions::new().with_watch_id(ID)))
        .await
        .expect("create sent");

    // The stream's responses in order: the old watch's events, its
    // cancellation, the new watch's creation, then only "new" events: no
    // event of the old watch after its cancellation.
    let (mut old_events, mut cancelled, mut recreated) = (0, false, false);
    loop {
        let resp = next(&mut stream).await;
        assert_eq!(resp.watch_id(), ID, "{resp:?}");
        if resp.canceled() {
            assert!(!cancelled && !recreated, "cancelled twice: {resp:?}");
            cancelled = true;
            continue;
        }
        if resp.created() {
            assert!(cancelled && !recreated, "created out of turn: {resp:?}");
            recreated = true;
            // Written once the new watch exists: its event comes after
            // anything still queued for the stream.
            c.put("new", "1", None).await.expect("put new");
            continue;
        }
        let keys: Vec<&[u8]> = resp
            .events()
            .iter()
            .map(|e| e.kv().expect("an event's kv").key())
            .collect();
        if !cancelled {
            assert!(keys.iter().all(|k| *k == b"old"), "{keys:?}");
            old_events += keys.len();
        } else {
            assert!(
                keys.iter().all(|k| *k == b"new"),
                "after its cancel, watch {ID} was sent the cancelled watch's events: {:?}",
                String::from_utf8_lossy(keys[0])
            );
            if !keys.is_empty() {
                break;
            }
        }
    }
    eprintln!("the old watch was sent {old_events} of {OLD_PUTS} events before its cancel");
}

/// The creates etcd refuses before a watch has an id are answered as etcd
/// answers them (id -1, its reason, the member's revision) and use up no
/// id Cairn assigns; an empty key watches the smallest key, `\0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_creates_are_answered_as_etcd_answers_them_and_use_no_id() {
    let cluster = Cluster::start(1, &[]);
    let mut c = client(&cluster.endpoints()[0]).await;
    wait_writable(&mut c, "/ready").await;
    let revision = c
        .put("/ids/k", "v", None)
        .await
        .expect("put")
        .header()
        .expect("a header")
        .revision();

    let mut stream = c
        .watch("b", Some(WatchOptions::new().with_range("a")))
        .await
        .expect("a watch stream");
    let empty = next(&mut stream).await;
    assert_eq!(
        (empty.watch_id(), empty.created(), empty.canceled()),
        (-1, true, true),
        "{empty:?}"
    );
    assert_eq!(empty.cancel_reason(), "mvcc: watcher range is empty");
    assert!(
        empty.header().expect("a header").revision() >= revision,
        "{empty:?}"
    );

    stream
        .watch("a", Some(WatchOptions::new().with_watch_id(1)))
        .await
        .expect("create sent");
    let taken = next(&mut stream).await;
    assert!(taken.created() && !taken.canceled() && taken.watch_id() == 1);
    stream
        .watch("a", Some(WatchOptions::new().with_watch_id(1)))
        .await
        .expect("create sent");
    let duplicate = next(&mut stream).await;
    assert_eq!((duplicate.watch_id(), duplicate.canceled()), (-1, true));
    assert_eq!(
        duplicate.cancel_reason(),
        "mvcc: duplicate watch ID provided on the WatchStream"
    );

    // The first id Cairn assigns is 0: the refusals took none.
    stream.watch("", None).await.expect("create sent");
    let smallest = next(&mut stream).await;
    assert!(smallest.created() && !smallest.canceled(), "{smallest:?}");
    assert_eq!(smallest.watch_id(), 0);
    c.put("\0", "smallest", None).await.expect("put \\0");
    let event = next(&mut stream).await;
    assert_eq!(event.watch_id(), 0);
    assert_eq!(
        event.events()[0].kv().expect("a kv").key(),
        b"\0",
        "{event:?}"
    );
}

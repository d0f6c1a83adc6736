//! A watch over the whole keyspace, drained by a task as it comes so that
//! the member never holds events back for the test, and read up to a
//! revision: a marker key is put after the writes, and events are read
//! until its event, so every event up to the revision has been delivered
//! whatever messages they came in.

use etcd_client::WatchOptions;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use super::accounts::Seen;
use super::{text, STEP_DEADLINE};
use crate::common::client;

/// The key put to mark the end of what a test waits for.
const MARKER: &str = "~whole-watch-marker";

pub(crate) struct WholeWatch {
    events: UnboundedReceiver<Result<Vec<Seen>, String>>,
    drain: JoinHandle<()>,
}

impl WholeWatch {
    /// Watches every key ("\0" to "\0") through `endpoint` from revision
    /// `from` on.
    pub(crate) async fn start(endpoint: &str, from: i64, what: &str) -> WholeWatch {
        let mut w = client(endpoint).await;
        let mut stream = w
            .watch(
                "\0",
                Some(
                    WatchOptions::new()
                        .with_range("\0")
                        .with_start_revision(from),
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: watching the whole keyspace: {e}"));
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        let drain = tokio::spawn(async move {
            // The client lives as long as its stream.
            let _client = w;
            loop {
                let message = match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => {
                        Err(format!("cancelled: {}", resp.cancel_reason()))
                    }
                    Ok(Some(resp)) => Ok(resp
                        .events()
                        .iter()
                        .map(|e| {
                            let kv = e.kv().expect("an event has a kv");
                            Seen {
                                revision: kv.mod_revision(),
                                kind: e.event_type(),
                                key: text(kv.key()),
                                value: text(kv.value()),
                            }
                        })
                        .collect::<Vec<_>>()),
                    Ok(None) => Err("the stream ended".to_string()),
                    Err(e) => Err(e.to_string()),
                };
                let end = message.is_err();
                if events_tx.send(message).is_err() || end {
                    return;
                }
            }
        });
        WholeWatch { events, drain }
    }

    /// Every event the watch delivers up to `last`, which every write the
    /// caller waits for is at or below: puts the marker through `c`, whose
    /// revision is above them all, and reads until its event.
    pub(crate) async fn through(
        mut self,
        c: &mut etcd_client::Client,
        last: i64,
        what: &str,
    ) -> Vec<Seen> {
        let marked = c
            .put(MARKER, "", None)
            .await
            .unwrap_or_else(|e| panic!("{what}: putting the watch's marker: {e}"))
            .header()
            .expect("a put response has a header")
            .revision();
        assert!(
            marked > last,
            "{what}: the marker at {marked}, not above {last}"
        );
        let mut seen: Vec<Seen> = Vec::new();
        while !seen.iter().any(|e| e.key == MARKER) {
            let message = tokio::time::timeout(STEP_DEADLINE, self.events.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{what}: the whole-keyspace watch delivered nothing for \
                         {STEP_DEADLINE:?} after {:?}, waiting for revision {marked}",
                        seen.last()
                    )
                })
                .expect("the watch task ended without saying why");
            seen.extend(
                message.unwrap_or_else(|e| panic!("{what}: the whole-keyspace watch: {e}")),
            );
        }
        self.drain.abort();
        seen.retain(|e| e.revision <= last);
        seen
    }
}

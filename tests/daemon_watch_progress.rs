//! etcd's progress notifications (`progress_notify` on a watch,
//! `--experimental-watch-progress-notify-interval`), asked of a real etcd
//! 3.4 and of Cairn with the same flags through the `etcd-client` crate.
//! Kubernetes' API server sets `progress_notify` on its watches and keeps
//! its watch cache's revision fresh from these notifications. Guards
//! against a watch that is never told the revision it reached, against
//! notifications to watches that did not ask for them, and against a
//! notification claiming a revision the watch has not been sent.

use crate::common;

use std::time::Duration;

use common::{client, wait_writable, Cluster, Etcd};
use etcd_client::{Client, WatchOptions, WatchStream};

/// What one watch got: its events, the revisions of its progress
/// notifications, and the revision it was created at.
type Got = (usize, Vec<i64>, i64);

/// The revision of the last put, and what each watch got.
type Run = (i64, Got, Got);

/// What one watch stream got in `within`: (events, progress revisions).
async fn collect(stream: &mut WatchStream, within: Duration) -> Got {
    let mut events = 0;
    let mut progress = Vec::new();
    let mut created = 0;
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(message) = tokio::time::timeout_at(deadline, stream.message()).await {
        let resp = message.expect("the watch stream").expect("open");
        if resp.created() {
            created = resp.header().expect("a header").revision();
            continue;
        }
        if resp.canceled() {
            continue;
        }
        if resp.events().is_empty() {
            let header = resp.header().expect("a header");
            progress.push(header.revision());
        } else {
            events += resp.events().len();
        }
    }
    (events, progress, created)
}

/// The steps, the same for both servers: a watch with progress_notify and
/// one without, a put to each, then a quiet spell. Returns the revision of
/// the last put and what each watch got.
async fn steps(c: &mut Client) -> Run {
    wait_writable(c, "/ready").await;
    let notified = WatchOptions::new().with_progress_notify();
    let mut asked = c.watch("/pn/a", Some(notified)).await.expect("watch");
    let mut plain = c.watch("/pn/b", None).await.expect("watch");
    c.put("/pn/a", "1", None).await.expect("put");
    let last = c.put("/pn/b", "1", None).await.expect("put");
    let last = last.header().expect("header").revision();
    let spell = Duration::from_secs(4);
    let (a, b) = tokio::join!(collect(&mut asked, spell), collect(&mut plain, spell));
    (last, a, b)
}

/// What a run must show: the asking watch got its event and then, in the
/// quiet spell, notifications at the last revision (which it has been sent:
/// its own event is older, the other key's put is the last); the other
/// watch got its event and no notification.
fn check(who: &str, (last, asked, plain): &Run) {
    assert_eq!(asked.0, 1, "{who}: events of the watch that asked");
    // A tick on a slow machine may come before a put: the revisions told
    // never go back, never pass the last, start no lower than the watch's
    // creation, and end at the last once the writes stopped.
    let (told, created) = (&asked.1, asked.2);
    assert!(
        told.last() == Some(last)
            && told.iter().all(|r| *r >= created && r <= last)
            && told.windows(2).all(|w| w[0] <= w[1]),
        "{who}: progress notifications {told:?}, created at {created}, last revision {last}"
    );
    assert_eq!(plain.0, 1, "{who}: events of the other watch");
    assert!(
        plain.1.is_empty(),
        "{who}: notified without asking: {:?}",
        plain.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_asked_is_told_its_revision_as_by_etcd() {
    if !(common::require_tool("etcd")) {
        return;
    }
    let flags = ["--experimental-watch-progress-notify-interval", "500ms"];
    let etcd = Etcd::start_with("http", &flags.map(String::from));
    let cluster = Cluster::start(1, &flags);
    let mut at_etcd = client(&etcd.endpoint).await;
    let mut at_cairn = client(&cluster.endpoints()[0]).await;
    let etcd_run = steps(&mut at_etcd).await;
    let cairn_run = steps(&mut at_cairn).await;
    check("etcd 3.4", &etcd_run);
    check("Cairn", &cairn_run);
}

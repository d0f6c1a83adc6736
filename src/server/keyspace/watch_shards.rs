//! One watch over the shards its key range covers, as a watch stream holds
//! it (docs/KEYSPACE.md, "Watches"): registered on each of those shards
//! through the router, and with several shards their batches put in one
//! revision order by a [`Merge`]. The Watch service (`api::watch`) runs one
//! per watch of a stream; the driver simulation (`sim::driver::watchers`)
//! runs its watch sessions through the same code.

use cairn_proto::mvccpb::Event;
use tokio::sync::mpsc;

use crate::routing::ShardId;
use crate::server::command::{ShardCommand, WatchBatch, WatchSpec, WatchWindow, WatcherKey};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::keyspace::watch_merge::Merge;
use crate::server::revisions::KeyspaceMutation;

/// How many revisions past what a watch over several shards has released
/// its shards may send it (`WatchWindow`): a few hundred milliseconds of
/// writes at full speed, where shards that keep up differ by the keyspace's
/// close interval (a few milliseconds of writes).
pub const WATCH_WINDOW_REVISIONS: i64 = 4096;

/// A watch registered on every shard of its range.
#[derive(Debug)]
pub struct ShardsWatch {
    shards: Vec<ShardId>,
    /// With several shards (and a keyspace): their events waiting to be
    /// released in one revision order, and the window the shards send
    /// within.
    merge: Option<(Merge, WatchWindow)>,
}

/// What a shard's batch becomes on the watch's stream.
#[derive(Debug, PartialEq)]
pub enum Delivery {
    /// Events to send, in this order, under the header revision `revision`.
    Events { revision: i64, events: Vec<Event> },
    /// A shard found the watch's next revision compacted away: the watch
    /// ends.
    Compacted {
        revision: i64,
        compact_revision: i64,
    },
}

impl ShardsWatch {
    /// Registers the watch `key` of `spec` from `start_revision` (0: from
    /// now) on every shard its range covers, each sending its batches to
    /// `tx`. With several shards each shard also says how far it has sent
    /// when nothing of the range changed (`spec.progress` is set here).
    ///
    /// Answers the watch and the highest revision a shard answered with: the
    /// created response's header revision. A watch from now is sent the
    /// events above that revision only, as etcd's is: a shard that was
    /// behind the others when asked (a follower's shards apply at their own
    /// pace) goes on from its own next revision, and the merge drops its
    /// events at or below the header's.
    ///
    /// With several shards, no shard sends an event more than
    /// `window_revisions` past what the merge has released (`WatchWindow`).
    /// A watch from now is sent no event until the created revision is
    /// known: what its shards apply meanwhile they read back from the
    /// store.
    ///
    /// When a shard refuses, the watch is cancelled on every shard (also
    /// where the create is still queued: the cancel comes after it), since
    /// a watch missing a shard would miss its events and a merge would wait
    /// for them for ever, and the refusal is answered.
    pub async fn create(
        router: &Router,
        key: WatcherKey,
        spec: WatchSpec,
        start_revision: i64,
        tx: mpsc::Sender<WatchBatch>,
        window_revisions: i64,
    ) -> Result<(ShardsWatch, i64), ApiError> {
        let shards = router.routing.shards_for_range(&spec.key, &spec.range_end);
        let merged = shards.len() > 1 && router.keyspace.is_some();
        let mutated = |m| {
            router
                .keyspace
                .as_ref()
                .is_some_and(|k| k.counter.mutated(m))
        };
        let unmerged = mutated(KeyspaceMutation::WatchNoMerge);
        let window = (merged && !unmerged).then(|| {
            let released = match start_revision {
                0 => i64::MIN,
                from => from - 1,
            };
            WatchWindow::new(released, window_revisions)
        });
        let spec = WatchSpec {
            progress: merged,
            window: window.clone(),
            ..spec
        };
        let early = start_revision == 0 && mutated(KeyspaceMutation::WatchFromNowEarly);
        let mut revision = 0;
        // Each shard's answer, kept for the planted bug only.
        let mut answered_by_shard = Vec::new();
        for &s in &shards {
            let answered = router
                .ask(s, |reply| ShardCommand::Watch {
                    key,
                    spec: spec.clone(),
                    start_revision,
                    tx: tx.clone(),
                    reply,
                })
                .await;
            match answered {
                Ok(rev) => {
                    revision = revision.max(rev);
                    if early {
                        answered_by_shard.push((s, rev));
                    }
                }
                Err(e) => {
                    cancel_on(router, &shards, key).await;
                    return Err(e);
                }
            }
        }
        // The merge counts every event up to the revision before the watch's
        // first as sent, on every shard: from now, the header's revision.
        let sent_through = match start_revision {
            0 => revision,
            from => from - 1,
        };
        let merge = window.map(|window| {
            let merge = if !early {
                Merge::new(&shards, sent_through)
            } else {
                // Planted: each shard starts past its own revision, so one
                // that was behind sends what lies at or below the header's.
                let mut m = Merge::new(&shards, start_revision - 1);
                for &(s, rev) in &answered_by_shard {
                    let _ = m.push(s, rev, Vec::new(), &[]);
                }
                m
            };
            window.set_released(merge.released());
            (merge, window)
        });
        Ok((ShardsWatch { shards, merge }, revision))
    }

    /// Cancels the watch (`key`) on every shard it is registered on.
    pub async fn cancel(&self, router: &Router, key: WatcherKey) {
        cancel_on(router, &self.shards, key).await;
    }

    /// The shards the watch is registered on.
    pub fn shards(&self) -> &[ShardId] {
        &self.shards
    }

    /// With several shards, the revision up to which every event has been
    /// released; None for a watch of one shard.
    pub fn released(&self) -> Option<i64> {
        self.merge.as_ref().map(|(m, _)| m.released())
    }

    /// With several shards, the highest revision of an event its shards
    /// may send now (the window only moves up, so a batch with an event
    /// past it now was sent past it).
    pub fn event_limit(&self) -> Option<i64> {
        self.merge.as_ref().map(|(_, w)| w.limit())
    }

    /// The events the watch holds back for its shards to catch up with one
    /// another.
    pub fn held_events(&self) -> usize {
        self.merge.as_ref().map_or(0, |(m, _)| m.held_events())
    }

    /// What `batch`, from one of the watch's shards, becomes on the stream:
    /// a cancellation when its shard compacted the watch's position; for a
    /// watch over several shards, the events its merge releases (None while
    /// it holds them back); else the shard's events as they are.
    pub fn take(&mut self, batch: WatchBatch) -> Option<Delivery> {
        if let Some(compact_revision) = batch.compact_revision {
            return Some(Delivery::Compacted {
                revision: batch.revision,
                compact_revision,
            });
        }
        let Some((merge, window)) = &mut self.merge else {
            return Some(Delivery::Events {
                revision: batch.revision,
                events: batch.events,
            });
        };
        let released = merge.push(batch.shard, batch.through, batch.events, &batch.subs);
        window.set_released(merge.released());
        let (revision, events) = released?;
        Some(Delivery::Events { revision, events })
    }
}

/// Cancels watcher `key` on each of `shards`, each answering once it has
/// dropped it (also where its create is still queued: the cancel comes
/// after it).
async fn cancel_on(router: &Router, shards: &[ShardId], key: WatcherKey) {
    for &s in shards {
        let _ = router
            .ask(s, |reply| ShardCommand::CancelWatch { key, reply })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::keyspace::test_router::{batch, router, shards_answer};
    use crate::server::shard_inbox::CommandInbox;

    fn revisions(delivery: Option<Delivery>) -> Option<(i64, Vec<i64>)> {
        match delivery? {
            Delivery::Events { revision, events } => Some((
                revision,
                events
                    .iter()
                    .map(|e| e.kv.as_ref().unwrap().mod_revision)
                    .collect(),
            )),
            Delivery::Compacted { .. } => panic!("nothing was compacted"),
        }
    }

    #[tokio::test]
    async fn a_watch_from_now_over_several_shards_sends_only_what_follows_its_created_revision() {
        let (router, mut inboxes) = router(2, true);
        let (tx, _rx) = mpsc::channel(4);
        let create = ShardsWatch::create(
            &router,
            (1, 0),
            WatchSpec::every_change(b"\0", b"\0"),
            0,
            tx,
            WATCH_WINDOW_REVISIONS,
        );
        let (created, seen) = tokio::join!(
            create,
            shards_answer(&mut inboxes, &[(0, Ok(10)), (1, Ok(12))])
        );
        // Each shard asked to say how far it sent.
        assert_eq!(seen, [(0, "watch", true), (1, "watch", true)]);
        let (mut watch, revision) = created.expect("created");
        assert_eq!((revision, watch.shards()), (12, &[0, 1][..]));
        // From now: every event above the created response's revision, 12,
        // and none at or below it, though shard 0 was behind at 10 and goes
        // on from 11.
        assert_eq!(watch.released(), Some(12));
        assert_eq!(revisions(watch.take(batch(1, 14, &[13, 14]))), None);
        let released = revisions(watch.take(batch(0, 13, &[11, 12])));
        assert_eq!(released, Some((13, vec![13])));
        assert_eq!(watch.released(), Some(13));
    }

    /// Answers the watch command each of `inboxes` holds with `revision`;
    /// answers the window each was given.
    async fn windows_given(inboxes: &mut [CommandInbox], revision: i64) -> Vec<WatchWindow> {
        let mut windows = Vec::new();
        for inbox in inboxes {
            match inbox.recv().await.expect("a command") {
                ShardCommand::Watch { spec, reply, .. } => {
                    windows.push(spec.window.expect("a merged watch has a window"));
                    let _ = reply.send(Ok(revision));
                }
                _ => panic!("only watches are sent"),
            }
        }
        windows
    }

    #[tokio::test]
    async fn the_window_of_a_watch_over_several_shards_moves_with_what_its_merge_releases() {
        let (router, mut inboxes) = router(2, true);
        let (tx, _rx) = mpsc::channel(4);
        let every = WatchSpec::every_change(b"\0", b"\0");
        let create = ShardsWatch::create(&router, (1, 0), every.clone(), 5, tx.clone(), 10);
        let (created, windows) = tokio::join!(create, windows_given(&mut inboxes, 20));
        let (mut watch, _) = created.expect("created");
        // One window for both shards, released through the revision before
        // the watch's first: events up to ten past it may be sent.
        assert!(windows.iter().all(|w| (w.released(), w.limit()) == (4, 14)));
        // Shard 0 sends through 9; shard 1 has sent nothing: nothing is
        // released, four events are held, the window stays.
        assert_eq!(revisions(watch.take(batch(0, 9, &[5, 6, 8, 9]))), None);
        assert_eq!((watch.held_events(), watch.event_limit()), (4, Some(14)));
        // Shard 1 sends through 7: released through 7, events to 17.
        let released = revisions(watch.take(batch(1, 7, &[7])));
        assert_eq!(released, Some((7, vec![5, 6, 7])));
        assert_eq!((watch.held_events(), watch.event_limit()), (2, Some(17)));
        assert_eq!(windows[1].limit(), 17);
        // A shard says it has sent far past the window when it had nothing
        // there (revisions that jump to a new epoch): the window follows.
        assert_eq!(
            revisions(watch.take(batch(1, 1 << 40, &[]))),
            Some((9, vec![8, 9]))
        );
        assert_eq!(watch.event_limit(), Some(19));
        assert_eq!(revisions(watch.take(batch(0, 1 << 40, &[]))), None);
        assert_eq!(watch.event_limit(), Some((1 << 40) + 10));

        // From now: no event until the created revision is known; then ten
        // past it.
        let create = ShardsWatch::create(&router, (1, 1), every, 0, tx, 10);
        let shards = async {
            let mut windows = Vec::new();
            for inbox in inboxes.iter_mut() {
                let ShardCommand::Watch { spec, reply, .. } = inbox.recv().await.unwrap() else {
                    panic!("only watches are sent");
                };
                let window = spec.window.expect("a window");
                assert!(window.limit() < 0);
                let _ = reply.send(Ok(30));
                windows.push(window);
            }
            windows
        };
        let (created, windows) = tokio::join!(create, shards);
        let (watch, revision) = created.expect("created");
        assert_eq!((revision, watch.released()), (30, Some(30)));
        assert!(windows.iter().all(|w| w.limit() == 40));
    }

    #[tokio::test]
    async fn a_watch_refused_by_one_shard_is_cancelled_on_every_shard() {
        let (router, mut inboxes) = router(3, true);
        let (tx, _rx) = mpsc::channel(4);
        let create = ShardsWatch::create(
            &router,
            (1, 0),
            WatchSpec::every_change(b"\0", b"\0"),
            5,
            tx,
            WATCH_WINDOW_REVISIONS,
        );
        let answers = [
            (0, Ok(10)),
            (1, Err(ApiError::NoLeader)),
            (0, Ok(0)),
            (1, Ok(0)),
            (2, Ok(0)),
        ];
        let (created, seen) = tokio::join!(create, shards_answer(&mut inboxes, &answers));
        assert!(matches!(created, Err(ApiError::NoLeader)), "{created:?}");
        // Shard 2 was never asked to watch, and is told to cancel all the
        // same.
        let asked: Vec<_> = seen.iter().map(|(s, what, _)| (*s, *what)).collect();
        assert_eq!(
            asked,
            [
                (0, "watch"),
                (1, "watch"),
                (0, "cancel"),
                (1, "cancel"),
                (2, "cancel")
            ]
        );
    }

    #[tokio::test]
    async fn a_watch_of_one_shard_passes_its_batches_on_as_they_come() {
        // One key's watch with several shards, and a whole-keyspace watch
        // of a member with one shard: no merge.
        for (shards, keyspace, range_end) in [(2, true, &b""[..]), (1, false, &b"\0"[..])] {
            let (router, mut inboxes) = router(shards, keyspace);
            let (tx, _rx) = mpsc::channel(4);
            let create = ShardsWatch::create(
                &router,
                (1, 0),
                WatchSpec::every_change(b"k", range_end),
                3,
                tx,
                WATCH_WINDOW_REVISIONS,
            );
            let shard = router.routing.shard_for_key(b"k");
            let answers = [(shard, Ok(7))];
            let (created, seen) = tokio::join!(create, shards_answer(&mut inboxes, &answers));
            assert_eq!(seen, [(shard, "watch", false)]);
            let (mut watch, revision) = created.expect("created");
            assert_eq!((revision, watch.released()), (7, None));
            assert_eq!(
                revisions(watch.take(batch(shard, 9, &[8, 9]))),
                Some((9, vec![8, 9]))
            );
            let compacted = WatchBatch {
                compact_revision: Some(20),
                ..batch(shard, 9, &[])
            };
            assert_eq!(
                watch.take(compacted),
                Some(Delivery::Compacted {
                    revision: 9,
                    compact_revision: 20
                })
            );
        }
    }
}

//! The watches of one Watch stream, by the ids its client knows them by.
//!
//! A watch's watchers are registered on its shards under a number of the
//! stream's own (the second part of their `WatcherKey`), not under its id.
//! Numbers only grow on a stream, so a batch a shard queued for a watch
//! that was cancelled meanwhile names a number no live watch has, and is
//! dropped; a new watch that takes the cancelled one's id, as a client that
//! chooses its ids may, never receives it.
//!
//! A watch cancelled because its shard compacted its next revision keeps
//! its id, as etcd's does, until the client cancels it: that cancel is
//! answered, and a create with the id meanwhile is a duplicate.

use std::collections::{HashMap, HashSet};

use tokio::sync::mpsc;

use crate::ops::server_metrics::CoreRecorder;
use crate::routing::ShardId;
use crate::server::command::{WatchBatch, WatchSpec};
use crate::server::errors::ApiError;
use crate::server::keyspace::router::Router;
use crate::server::keyspace::watch_shards::{Delivery, ShardsWatch};

/// A create refused before any shard is asked.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// A live watch of the stream has the id the client chose.
    DuplicateId,
}

/// One stream's live watches.
pub struct StreamWatches {
    stream: u64,
    /// By watch id: the number its watchers are registered under, and the
    /// watch on its shards.
    by_id: HashMap<i64, (i64, ShardsWatch)>,
    /// Watch id by that number.
    id_of: HashMap<i64, i64>,
    /// Ids of watches ended as compacted that the client has not cancelled.
    compacted: HashSet<i64>,
    /// The number the next watch is registered under.
    next_number: i64,
    /// The id Cairn assigns next when a create names none.
    next_id: i64,
    counted: Counted,
}

impl StreamWatches {
    /// The watches of stream `stream`, counted on `metrics`: the stream
    /// (`etcd_debugging_mvcc_watch_stream_total`) while this lives, its
    /// live watches (`etcd_debugging_mvcc_watcher_total`), and what their
    /// merges hold (`cairn_core_watch_merge_held_events`).
    pub fn new(stream: u64, metrics: Option<CoreRecorder>) -> StreamWatches {
        if let Some(m) = &metrics {
            m.watch_streams(1);
        }
        StreamWatches {
            stream,
            by_id: HashMap::new(),
            id_of: HashMap::new(),
            compacted: HashSet::new(),
            next_number: 0,
            next_id: 0,
            counted: Counted {
                metrics,
                held: 0,
                watches: 0,
            },
        }
    }

    /// The id a create that asked for `asked` gets (0: one Cairn assigns,
    /// the lowest free one not assigned before, as etcd does).
    pub fn id_for(&mut self, asked: i64) -> Result<i64, Refused> {
        if asked != 0 {
            if self.taken(asked) {
                return Err(Refused::DuplicateId);
            }
            return Ok(asked);
        }
        while self.taken(self.next_id) {
            self.next_id += 1;
        }
        self.next_id += 1;
        Ok(self.next_id - 1)
    }

    fn taken(&self, id: i64) -> bool {
        self.by_id.contains_key(&id) || self.compacted.contains(&id)
    }

    /// Registers watch `id` of `spec` from `start_revision` on its shards
    /// (`ShardsWatch::create`), their batches going to `tx`; answers the
    /// created response's header revision.
    pub async fn create(
        &mut self,
        router: &Router,
        id: i64,
        spec: WatchSpec,
        start_revision: i64,
        tx: mpsc::Sender<WatchBatch>,
        window_revisions: i64,
    ) -> Result<i64, ApiError> {
        assert!(
            !self.taken(id),
            "watch id {id} is taken: ids come from id_for"
        );
        let number = self.next_number;
        self.next_number += 1;
        let key = (self.stream, number);
        let (watch, revision) =
            ShardsWatch::create(router, key, spec, start_revision, tx, window_revisions).await?;
        self.by_id.insert(id, (number, watch));
        self.id_of.insert(number, id);
        self.counted.watches_changed(1);
        Ok(revision)
    }

    /// The client cancels watch `id`: on its shards, if it is live; false
    /// if the stream has no such watch (as etcd, not answered).
    pub async fn cancel(&mut self, router: &Router, id: i64) -> bool {
        self.compacted.remove(&id) || self.end(router, id).await
    }

    /// Ends live watch `id` on its shards; false if there is none.
    async fn end(&mut self, router: &Router, id: i64) -> bool {
        let Some((number, watch)) = self.by_id.remove(&id) else {
            return false;
        };
        self.id_of.remove(&number);
        self.counted.changed(watch.held_events(), 0);
        self.counted.watches_changed(-1);
        watch.cancel(router, (self.stream, number)).await;
        true
    }

    /// What a shard's `batch` becomes on the stream, with the id of its
    /// watch: nothing for a watch cancelled meanwhile; a compacted watch
    /// is cancelled on its other shards too and ends.
    pub async fn take(&mut self, router: &Router, batch: WatchBatch) -> Option<(i64, Delivery)> {
        let id = *self.id_of.get(&batch.watcher)?;
        let (_, watch) = self.by_id.get_mut(&id)?;
        let before = watch.held_events();
        let delivery = watch.take(batch);
        self.counted.changed(before, watch.held_events());
        let delivery = delivery?;
        if let Delivery::Compacted { .. } = delivery {
            self.end(router, id).await;
            self.compacted.insert(id);
        }
        Some((id, delivery))
    }

    /// The shards any watch of the stream is registered on, each once.
    pub fn shards(&self) -> Vec<ShardId> {
        let mut shards: Vec<ShardId> = self
            .by_id
            .values()
            .flat_map(|(_, w)| w.shards().iter().copied())
            .collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }

    /// The lowest revision up to which the stream's watches over several
    /// shards have released every event; None without such a watch.
    pub fn released(&self) -> Option<i64> {
        self.by_id.values().filter_map(|(_, w)| w.released()).min()
    }
}

/// One stream's share of its core's watch gauges, given back when it ends:
/// the stream itself, its live watches, and what its watches over several
/// shards hold (`cairn_core_watch_merge_held_events`).
struct Counted {
    metrics: Option<CoreRecorder>,
    held: i64,
    watches: i64,
}

impl Counted {
    /// The stream's live watches went up or down by `delta`.
    fn watches_changed(&mut self, delta: i64) {
        self.watches += delta;
        if let Some(m) = &self.metrics {
            m.watchers(delta);
        }
    }

    /// A watch's held events went from `before` to `after`.
    fn changed(&mut self, before: usize, after: usize) {
        let delta = after as i64 - before as i64;
        if delta != 0 {
            self.held += delta;
            if let Some(m) = &self.metrics {
                m.watch_merge_held(delta);
            }
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.changed(self.held as usize, 0);
        self.watches_changed(-self.watches);
        if let Some(m) = &self.metrics {
            m.watch_streams(-1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::command::ShardCommand;
    use crate::server::keyspace::test_router::{batch, router, shards_answer};
    use crate::server::keyspace::watch_shards::WATCH_WINDOW_REVISIONS;
    use crate::server::shard_inbox::CommandInbox;

    /// Creates watch `id` of `key` from revision 5, each shard of its range
    /// answering 10 in `inboxes`; answers the number it was registered
    /// under on the first shard asked.
    async fn create(
        watches: &mut StreamWatches,
        router: &Router,
        inboxes: &mut [CommandInbox],
        id: i64,
        spec: WatchSpec,
    ) -> i64 {
        let (tx, _rx) = mpsc::channel(4);
        let shards = router.routing.shards_for_range(&spec.key, &spec.range_end);
        let create = watches.create(router, id, spec, 5, tx, WATCH_WINDOW_REVISIONS);
        let answer = async {
            let mut number = None;
            for s in shards {
                match inboxes[s as usize].recv().await.expect("a command") {
                    ShardCommand::Watch { key, reply, .. } => {
                        number.get_or_insert(key.1);
                        let _ = reply.send(Ok(10));
                    }
                    _ => panic!("only a watch is sent"),
                }
            }
            number.expect("a shard asked")
        };
        let (created, number) = tokio::join!(create, answer);
        assert_eq!(created, Ok(10));
        number
    }

    #[tokio::test]
    async fn a_batch_of_a_cancelled_watch_never_reaches_a_new_watch_with_its_id() {
        let (router, mut inboxes) = router(1, false);
        let mut watches = StreamWatches::new(1, None);
        let spec = || WatchSpec::every_change(b"k", b"");
        assert_eq!(watches.id_for(7), Ok(7));
        let old = create(&mut watches, &router, &mut inboxes, 7, spec()).await;
        assert_eq!(watches.id_for(7), Err(Refused::DuplicateId));

        let cancel = watches.cancel(&router, 7);
        let (cancelled, seen) = tokio::join!(cancel, shards_answer(&mut inboxes, &[(0, Ok(0))]));
        assert!(cancelled);
        assert_eq!(seen, [(0, "cancel", false)]);
        assert!(!watches.cancel(&router, 7).await, "cancelled once only");

        assert_eq!(watches.id_for(7), Ok(7));
        let new = create(&mut watches, &router, &mut inboxes, 7, spec()).await;
        assert_ne!(old, new);
        // A batch the shard queued for the old watch before its cancel.
        let stale = WatchBatch {
            watcher: old,
            ..batch(0, 9, &[8, 9])
        };
        assert_eq!(watches.take(&router, stale).await, None);
        let own = WatchBatch {
            watcher: new,
            ..batch(0, 9, &[9])
        };
        let (id, delivery) = watches.take(&router, own).await.expect("delivered");
        assert_eq!(id, 7);
        assert!(
            matches!(delivery, Delivery::Events { revision: 9, ref events } if events.len() == 1)
        );
    }

    #[tokio::test]
    async fn assigned_ids_skip_the_ones_clients_chose_and_only_grow() {
        let (router, mut inboxes) = router(1, false);
        let mut watches = StreamWatches::new(1, None);
        let spec = || WatchSpec::every_change(b"k", b"");
        create(&mut watches, &router, &mut inboxes, 1, spec()).await;
        assert_eq!(watches.id_for(0), Ok(0));
        assert_eq!(watches.id_for(0), Ok(2), "1 is taken");
        let cancel = watches.cancel(&router, 1);
        let (cancelled, _) = tokio::join!(cancel, shards_answer(&mut inboxes, &[(0, Ok(0))]));
        assert!(cancelled);
        assert_eq!(
            watches.id_for(0),
            Ok(3),
            "an assigned id is not assigned again"
        );
    }

    #[tokio::test]
    async fn streams_watches_and_what_their_merges_hold_are_counted_and_given_back_on_every_end() {
        let (registry, cores) =
            crate::ops::server_metrics::server_metrics(1, &[(0, 0), (1, 0)]).unwrap();
        let gauge = |name: &str| {
            let text = registry.render();
            let line = text
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .to_string();
            line.rsplit(' ').next().unwrap().parse::<i64>().unwrap()
        };
        let held = || gauge("cairn_core_watch_merge_held_events{");
        // etcd's names, for the member.
        let live = || {
            (
                gauge("etcd_debugging_mvcc_watch_stream_total "),
                gauge("etcd_debugging_mvcc_watcher_total "),
            )
        };
        assert_eq!(live(), (0, 0));
        let (router, mut inboxes) = router(2, true);
        let mut watches = StreamWatches::new(1, Some(cores[0].clone()));
        let every = || WatchSpec::every_change(b"\0", b"\0");
        // Shard 1 sends through 8; shard 0 has sent nothing: held.
        let holding = |number| WatchBatch {
            watcher: number,
            ..batch(1, 8, &[6, 7, 8])
        };
        assert_eq!(live(), (1, 0));
        let first = create(&mut watches, &router, &mut inboxes, 1, every()).await;
        assert_eq!(live(), (1, 1));
        assert_eq!(watches.take(&router, holding(first)).await, None);
        assert_eq!(held(), 3);
        // A client's cancel gives them back.
        let cancel = watches.cancel(&router, 1);
        let (_, _) = tokio::join!(
            cancel,
            shards_answer(&mut inboxes, &[(0, Ok(0)), (1, Ok(0))])
        );
        assert_eq!(held(), 0);
        assert_eq!(live(), (1, 0));
        // So does a compaction found by the other shard.
        let second = create(&mut watches, &router, &mut inboxes, 2, every()).await;
        assert_eq!(watches.take(&router, holding(second)).await, None);
        assert_eq!(held(), 3);
        let compacted = WatchBatch {
            watcher: second,
            compact_revision: Some(9),
            ..batch(0, 4, &[])
        };
        let take = watches.take(&router, compacted);
        let (taken, _) = tokio::join!(take, shards_answer(&mut inboxes, &[(0, Ok(0)), (1, Ok(0))]));
        assert!(
            matches!(taken, Some((2, Delivery::Compacted { .. }))),
            "{taken:?}"
        );
        assert_eq!(held(), 0);
        assert_eq!(live(), (1, 0), "a watch a compaction ended is not live");
        // And the stream's end.
        let third = create(&mut watches, &router, &mut inboxes, 3, every()).await;
        assert_eq!(watches.take(&router, holding(third)).await, None);
        assert_eq!(held(), 3);
        assert_eq!(live(), (1, 1));
        drop(watches);
        assert_eq!(held(), 0);
        assert_eq!(live(), (0, 0));
    }

    #[tokio::test]
    async fn a_watch_one_shard_finds_compacted_is_cancelled_on_its_other_shards() {
        let (router, mut inboxes) = router(3, true);
        let mut watches = StreamWatches::new(1, None);
        let number = create(
            &mut watches,
            &router,
            &mut inboxes,
            4,
            WatchSpec::every_change(b"\0", b"\0"),
        )
        .await;
        assert_eq!(watches.shards(), [0, 1, 2]);
        let compacted = WatchBatch {
            watcher: number,
            compact_revision: Some(20),
            ..batch(1, 30, &[])
        };
        let take = watches.take(&router, compacted);
        let answers = [(0, Ok(0)), (1, Ok(0)), (2, Ok(0))];
        let (taken, seen) = tokio::join!(take, shards_answer(&mut inboxes, &answers));
        assert_eq!(
            taken,
            Some((
                4,
                Delivery::Compacted {
                    revision: 30,
                    compact_revision: 20
                }
            ))
        );
        assert_eq!(
            seen,
            [
                (0, "cancel", false),
                (1, "cancel", false),
                (2, "cancel", false)
            ]
        );
        assert!(watches.shards().is_empty());
        let late = WatchBatch {
            watcher: number,
            ..batch(0, 31, &[31])
        };
        assert_eq!(watches.take(&router, late).await, None);
        // Its id stays taken until the client cancels it, which is answered
        // without asking the shards again.
        assert_eq!(watches.id_for(4), Err(Refused::DuplicateId));
        assert_eq!(watches.id_for(0), Ok(0));
        assert!(watches.cancel(&router, 4).await);
        assert!(!watches.cancel(&router, 4).await);
        assert_eq!(watches.id_for(4), Ok(4));
    }
}

//! A watch over every shard, merged as `src/server/keyspace/watch_merge.rs` merges
//! it (docs/KEYSPACE.md, "Watches"): each shard streams its events in its
//! own apply order and says how far it has applied (its store's revision,
//! which closes move on idle shards); the watch releases an event only once
//! every shard has passed its revision, events of one revision in shard
//! order.
//!
//! Every member runs one such watch from revision 0 in each incarnation
//! (a restart replays the log, as a reconnecting client catches up from the
//! store). What the run checks of it: as it goes, that no shard sends an
//! event at or below what the watch already released (the property the
//! merge relies on) and that released revisions never go down; at the end
//! (`history.rs`), that the released stream is exactly the keyspace's
//! events up to the revision it released through, in revision order.

use super::kv::Event;

#[derive(Debug, Clone)]
pub(super) struct Watcher {
    /// Per shard: the revision it has applied through.
    through: Vec<u64>,
    /// Per shard: events received, not yet released, in arrival order.
    pending: Vec<Vec<Event>>,
    /// `(shard, event)` in the order released.
    pub released: Vec<(usize, Event)>,
    /// Every event at or below this was released.
    pub released_through: u64,
}

impl Watcher {
    pub fn new(shards: usize) -> Self {
        Watcher {
            through: vec![0; shards],
            pending: vec![Vec::new(); shards],
            released: Vec::new(),
            released_through: 0,
        }
    }

    fn last_released(&self) -> u64 {
        self.released.last().map_or(0, |(_, e)| e.rev)
    }

    /// `shard` applied an entry that took it to revision `through`, with
    /// `events`. `merge` false is the planted bug: events are released as
    /// they arrive. An error says what broke the watch's order.
    pub fn on_apply(
        &mut self,
        shard: usize,
        through: u64,
        events: &[Event],
        merge: bool,
    ) -> Result<(), String> {
        for e in events {
            if merge && e.rev <= self.released_through {
                return Err(format!(
                    "shard {shard} sent an event at revision {} after the watch released everything through {}",
                    e.rev, self.released_through
                ));
            }
        }
        self.through[shard] = self.through[shard].max(through);
        if !merge {
            for e in events {
                let last = self.last_released();
                if e.rev < last {
                    return Err(format!(
                        "released shard {shard}'s event at revision {} after one at {last}",
                        e.rev
                    ));
                }
                self.released.push((shard, *e));
            }
            self.released_through = self.through.iter().copied().min().unwrap_or(0);
            return Ok(());
        }
        self.pending[shard].extend_from_slice(events);
        let upto = self.through.iter().copied().min().unwrap_or(0);
        if upto <= self.released_through {
            return Ok(());
        }
        let mut batch = Vec::new();
        for (s, p) in self.pending.iter_mut().enumerate() {
            let n = p.partition_point(|e| e.rev <= upto);
            batch.extend(p.drain(..n).map(|e| (s, e)));
        }
        // Stable: one shard's events of one revision stay in apply order.
        batch.sort_by_key(|(s, e)| (e.rev, *s));
        if let Some((s, e)) = batch.first() {
            let last = self.last_released();
            if e.rev < last {
                return Err(format!(
                    "released shard {s}'s event at revision {} after one at {last}",
                    e.rev
                ));
            }
        }
        self.released.extend(batch);
        self.released_through = upto;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(rev: u64, key: u32) -> Event {
        Event {
            rev,
            key,
            value: Some(rev),
        }
    }

    #[test]
    fn events_wait_for_every_shard_to_pass_them() {
        let mut w = Watcher::new(2);
        w.on_apply(1, 10, &[ev(10, 3)], true).unwrap();
        assert!(w.released.is_empty(), "shard 0 has not passed 10");
        w.on_apply(0, 9, &[ev(9, 0)], true).unwrap();
        assert_eq!(w.released, vec![(0, ev(9, 0))]);
        w.on_apply(0, 12, &[], true).unwrap();
        assert_eq!(w.released.len(), 2);
        assert_eq!(w.released_through, 10);
        assert!(w.on_apply(0, 13, &[ev(8, 1)], true).is_err());
    }

    #[test]
    fn without_the_merge_the_order_breaks() {
        let mut w = Watcher::new(2);
        w.on_apply(1, 10, &[ev(10, 3)], false).unwrap();
        assert!(w.on_apply(0, 9, &[ev(9, 0)], false).is_err());
    }
}

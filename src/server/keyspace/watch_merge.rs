//! One revision order for a watch over several shards (docs/KEYSPACE.md,
//! "Watches").
//!
//! Each shard sends the watch its events in its own log order, which is
//! revision order, and says with every batch how far it has sent
//! (`WatchBatch::through`), also when nothing it holds changed: idle shards
//! move forward on the closed revisions the keyspace leader writes into
//! their logs. An event is released once every shard of the watch has sent
//! through its revision: no shard can send one below it afterwards, so the
//! released events are in revision order and each is released once.

use std::collections::BTreeMap;

use cairn_proto::mvccpb::Event;

use crate::routing::ShardId;
use crate::server::keyspace::cross_plan::OP_SUB_SHIFT;

/// The events of one watch waiting for the other shards to catch up.
#[derive(Debug)]
pub struct Merge {
    /// Each shard of the watch, and the revision it has sent through.
    through: Vec<(ShardId, i64)>,
    /// Events by (revision, op, shard, arrival): one revision's events in
    /// the order of the txn's ops (the high half of the sub revision, see
    /// `cross_plan::OP_SUB_SHIFT`), one op's shard after shard (the deletes
    /// of one delete over several shards in key order), and one shard's in
    /// its order.
    pending: BTreeMap<(i64, i64, ShardId, u64), Event>,
    arrivals: u64,
    /// Every event up to here has been released.
    released: i64,
    /// The revision before the watch's first.
    start: i64,
}

impl Merge {
    /// A merge over `shards`, each having sent through `start` (the revision
    /// before the watch's first).
    pub fn new(shards: &[ShardId], start: i64) -> Merge {
        Merge {
            through: shards.iter().map(|&s| (s, start)).collect(),
            pending: BTreeMap::new(),
            arrivals: 0,
            released: start,
            start,
        }
    }

    /// Every event up to this revision has been released.
    pub fn released(&self) -> i64 {
        self.released
    }

    /// Events waiting for the other shards to send as far.
    pub fn held_events(&self) -> usize {
        self.pending.len()
    }

    /// Takes `shard`'s batch: `events` in its order, and every event of the
    /// shard up to `through` sent. Answers the events now released, in
    /// revision order, with the revision through which every event has been
    /// released; None when none is. Events at or below the merge's start are
    /// not the watch's and are dropped: a watch from now starts above the
    /// highest revision its shards had, and a shard that was behind the
    /// others then sends the events above its own.
    pub fn push(
        &mut self,
        shard: ShardId,
        through: i64,
        events: Vec<Event>,
        subs: &[i64],
    ) -> Option<(i64, Vec<Event>)> {
        for (i, e) in events.into_iter().enumerate() {
            let revision = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            if revision <= self.start {
                continue;
            }
            let op = subs.get(i).map_or(0, |s| s >> OP_SUB_SHIFT);
            self.arrivals += 1;
            self.pending.insert((revision, op, shard, self.arrivals), e);
        }
        if let Some(t) = self.through.iter_mut().find(|(s, _)| *s == shard) {
            t.1 = t.1.max(through);
        }
        let all_through = self.through.iter().map(|(_, t)| *t).min()?;
        if all_through <= self.released {
            return None;
        }
        self.released = all_through;
        let later = self.pending.split_off(&(all_through + 1, i64::MIN, 0, 0));
        let released = std::mem::replace(&mut self.pending, later);
        let mut out = Vec::with_capacity(released.len());
        let mut group: Vec<(ShardId, Event)> = Vec::new();
        let mut at = None;
        for ((revision, op, shard, _), e) in released {
            if at != Some((revision, op)) {
                flush_op(&mut group, &mut out);
                at = Some((revision, op));
            }
            group.push((shard, e));
        }
        flush_op(&mut group, &mut out);
        (!out.is_empty()).then_some((all_through, out))
    }
}

/// Moves one op's events (of one revision, shard after shard) to `out`. The
/// deletes of one delete whose range spans shards go in key order, as etcd
/// gives them: when every event is a delete, from more than one shard, and
/// each shard's are in key order. Anything else keeps its order.
fn flush_op(group: &mut Vec<(ShardId, Event)>, out: &mut Vec<Event>) {
    fn key(e: &Event) -> &[u8] {
        e.kv.as_ref().map_or(&[], |kv| kv.key.as_ref())
    }
    let spanning_delete = group.first().is_some_and(|(first, _)| {
        group.iter().any(|(s, _)| s != first)
            && group
                .iter()
                .all(|(_, e)| e.r#type == cairn_proto::mvccpb::event::EventType::Delete as i32)
            && group
                .windows(2)
                .all(|w| w[0].0 != w[1].0 || key(&w[0].1) <= key(&w[1].1))
    });
    if spanning_delete {
        group.sort_by(|(_, a), (_, b)| key(a).cmp(key(b)));
    }
    out.extend(group.drain(..).map(|(_, e)| e));
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::mvccpb::KeyValue;

    fn event(key: &str, revision: i64) -> Event {
        Event {
            kv: Some(KeyValue {
                key: key.as_bytes().to_vec().into(),
                mod_revision: revision,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn revisions(events: &[Event]) -> Vec<i64> {
        events
            .iter()
            .map(|e| e.kv.as_ref().unwrap().mod_revision)
            .collect()
    }

    #[test]
    fn events_are_released_in_revision_order_once_every_shard_has_sent_past_them() {
        let mut m = Merge::new(&[0, 1, 2], 10);
        assert_eq!(
            m.push(0, 15, vec![event("a", 12), event("a", 15)], &[]),
            None
        );
        assert_eq!(
            m.push(1, 13, vec![event("b", 11), event("b", 13)], &[]),
            None
        );
        // Shard 2 closes 14: everything up to 13 can go.
        let (through, out) = m.push(2, 14, vec![], &[]).unwrap();
        assert_eq!((through, revisions(&out)), (13, vec![11, 12, 13]));
        assert_eq!(m.released(), 13);
        // Nothing new below the others' positions.
        assert_eq!(m.push(1, 20, vec![event("b", 18)], &[]), None);
        assert_eq!(m.released(), 14);
        let (through, out) = m.push(2, 30, vec![event("c", 16)], &[]).unwrap();
        assert_eq!((through, revisions(&out)), (15, vec![15]));
        let (through, out) = m.push(0, 40, vec![], &[]).unwrap();
        assert_eq!((through, revisions(&out)), (20, vec![16, 18]));
    }

    #[test]
    fn events_at_or_below_the_start_are_not_the_watchs() {
        // A watch from now above 12: shard 0 was at 10 when asked.
        let mut m = Merge::new(&[0, 1], 12);
        assert_eq!(m.push(1, 14, vec![event("b", 13)], &[]), None);
        let (through, out) = m
            .push(0, 13, vec![event("a", 11), event("a", 12)], &[])
            .unwrap();
        assert_eq!((through, revisions(&out)), (13, vec![13]));
    }

    #[test]
    fn one_revision_of_one_shard_keeps_its_order_and_late_positions_do_not_go_back() {
        let mut m = Merge::new(&[3, 5], 0);
        let txn = vec![event("x", 7), event("y", 7), event("a", 7)];
        assert_eq!(m.push(3, 7, txn, &[]), None);
        let (_, out) = m.push(5, 9, vec![], &[]).unwrap();
        let keys: Vec<_> = out
            .iter()
            .map(|e| e.kv.as_ref().unwrap().key.clone())
            .collect();
        assert_eq!(keys, vec!["x".as_bytes(), b"y", b"a"]);
        // A batch that says less than before changes nothing.
        assert_eq!(m.push(3, 2, vec![], &[]), None);
        assert_eq!(m.released(), 7);
    }

    #[test]
    fn one_revisions_events_from_several_shards_come_in_the_order_of_the_txns_ops() {
        let mut m = Merge::new(&[0, 1], 10);
        let op = |i: i64| i << OP_SUB_SHIFT;
        // Shard 0 wrote ops 1 and 2 of the txn at 11, shard 1 ops 0 and 3.
        assert_eq!(
            m.push(0, 11, vec![event("b", 11), event("c", 11)], &[op(1), op(2)]),
            None
        );
        let (_, out) = m
            .push(1, 11, vec![event("a", 11), event("d", 11)], &[op(0), op(3)])
            .unwrap();
        let keys: Vec<&[u8]> = out
            .iter()
            .map(|e| e.kv.as_ref().unwrap().key.as_ref())
            .collect();
        assert_eq!(keys, vec![b"a" as &[u8], b"b", b"c", b"d"]);
    }

    fn deleted(key: &str, revision: i64) -> Event {
        Event {
            r#type: cairn_proto::mvccpb::event::EventType::Delete as i32,
            ..event(key, revision)
        }
    }

    fn keys(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| String::from_utf8_lossy(&e.kv.as_ref().unwrap().key).into_owned())
            .collect()
    }

    #[test]
    fn the_deletes_of_one_delete_over_several_shards_come_in_key_order() {
        let mut m = Merge::new(&[0, 1], 10);
        assert_eq!(
            m.push(1, 11, vec![deleted("b", 11), deleted("d", 11)], &[0, 1]),
            None
        );
        let (_, out) = m
            .push(
                0,
                11,
                vec![deleted("a", 11), deleted("c", 11), deleted("e", 11)],
                &[0, 1, 2],
            )
            .unwrap();
        assert_eq!(keys(&out), ["a", "b", "c", "d", "e"]);
        // Deletes of one shard keep their order, as do an op's events that
        // are not all deletes.
        let mut m = Merge::new(&[0, 1], 10);
        m.push(0, 11, vec![deleted("z", 11), deleted("a", 11)], &[]);
        let (_, out) = m.push(1, 11, vec![], &[]).unwrap();
        assert_eq!(keys(&out), ["z", "a"]);
        let mut m = Merge::new(&[0, 1], 10);
        m.push(0, 11, vec![event("c", 11)], &[]);
        let (_, out) = m.push(1, 11, vec![deleted("a", 11)], &[]).unwrap();
        assert_eq!(keys(&out), ["c", "a"]);
    }
}

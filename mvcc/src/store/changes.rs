//! Changes captured as they are applied, for a consumer (the shard's
//! watchers) that wants each write once, in revision order, without reading
//! it back from the store.
//!
//! Capture is off until asked for; while on, every record an apply adds is
//! shared (not copied) into the capture list until taken. A consumer that
//! stops taking must turn capture off, or the list grows with every write.

use std::rc::Rc;

use super::Store;
use crate::record::Record;
use crate::types::{EventKind, KeyValue, Revision};

/// One applied put or delete, shared with the store's pending batch.
#[derive(Debug, Clone)]
pub struct Change(pub(crate) Rc<Record>);

impl Change {
    pub fn kind(&self) -> EventKind {
        if self.0.tombstone {
            EventKind::Delete
        } else {
            EventKind::Put
        }
    }

    /// The key-value written; for a delete, the key with `mod_revision` the
    /// delete's revision.
    pub fn kv(&self) -> &KeyValue {
        &self.0.kv
    }

    pub fn revision(&self) -> Revision {
        self.0.rev
    }
}

impl Store {
    /// Starts (or stops, dropping what was captured) capturing applied changes.
    pub fn capture_changes(&mut self, on: bool) {
        match (on, self.captured.is_some()) {
            (true, false) => self.captured = Some((self.current_rev, Vec::new())),
            (false, true) => self.captured = None,
            _ => {}
        }
    }

    pub fn is_capturing_changes(&self) -> bool {
        self.captured.is_some()
    }

    /// The changes applied since the last take, in revision order (none while
    /// capture is off).
    pub fn take_changes(&mut self) -> Vec<Change> {
        let current = self.current_rev;
        self.captured
            .as_mut()
            .map(|(since, changes)| {
                *since = current;
                std::mem::take(changes)
            })
            .unwrap_or_default()
    }

    /// The store's revision when the changes the next take returns began to
    /// be captured (capture turned on, or the last take): with revisions
    /// that skip numbers (`apply_at`), what tells a consumer whether the
    /// capture covers everything since the revision it last saw. None while
    /// capture is off.
    pub fn captured_since(&self) -> Option<i64> {
        self.captured.as_ref().map(|(since, _)| *since)
    }

    pub(super) fn capture(&mut self, rec: &Rc<Record>) {
        if let Some((_, c)) = &mut self.captured {
            c.push(Change(Rc::clone(rec)));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::types::*;
    use crate::{Config, Store};

    fn put(key: &str, value: &str) -> Op {
        Op::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        })
    }

    #[test]
    fn captured_changes_are_the_events_the_store_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
        store.apply(1, &put("a", "1")).unwrap();
        assert!(store.take_changes().is_empty(), "capture is off by default");
        store.capture_changes(true);
        store.apply(2, &put("b", "2")).unwrap();
        store.apply(3, &put("c", "3")).unwrap();
        store
            .apply(
                4,
                &Op::DeleteRange(DeleteRangeRequest {
                    key: b"a".to_vec(),
                    range_end: b"c".to_vec(),
                    prev_kv: false,
                }),
            )
            .unwrap();
        let taken = store.take_changes();
        let read_back = store.events(3, 100).unwrap();
        let as_events: Vec<Event> = taken
            .iter()
            .map(|c| Event {
                kind: c.kind(),
                kv: c.kv().clone(),
                revision: c.revision(),
            })
            .collect();
        assert_eq!(as_events, read_back);
        assert_eq!(as_events.len(), 4, "b, c, and the delete of a and b");
        assert!(store.take_changes().is_empty(), "taken once");
        store.capture_changes(false);
        store.apply(5, &put("d", "4")).unwrap();
        store.capture_changes(true);
        assert!(store.take_changes().is_empty(), "nothing kept while off");
    }

    #[test]
    fn a_capture_says_from_which_revision_it_holds_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 0, Config::default()).unwrap();
        store.apply_at(1, 10, &put("a", "1")).unwrap();
        assert_eq!(store.captured_since(), None);
        store.capture_changes(true);
        assert_eq!(store.captured_since(), Some(10));
        // Revisions that skip numbers, and entries that move the revision
        // with no change: the window still starts where the last take left.
        store.apply_at(2, 14, &put("b", "2")).unwrap();
        store.close_at(3, 20).unwrap();
        let taken = store.take_changes();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].revision().main, 14);
        assert_eq!(store.current_revision(), 20);
        assert_eq!(store.captured_since(), Some(20));
        // A close below the store's revision leaves it there.
        store.close_at(4, 15).unwrap();
        assert_eq!(store.current_revision(), 20);
        assert_eq!(store.applied_index(), 4);
        assert!(store.close_at(4, 30).is_err(), "index 4 was applied");
        store.apply_at(5, 21, &put("c", "3")).unwrap();
        assert_eq!(store.take_changes().len(), 1);
        assert_eq!(store.captured_since(), Some(21));
    }
}

//! A compaction's pass over the key index, in steps. Compacting drops, for
//! every key, the revisions no read at or after the compaction's revision can
//! reach: a visit of every key, about 150 ns a key (`cargo test --release -p
//! cairn-mvcc --test read_costs compact_cost -- --ignored --nocapture`: 150 ms
//! for a million keys in one pass). Done at once it would hold the applying
//! thread, a shard's core shared by every shard on it, for as long.
//!
//! So the compaction takes effect at once where reads can tell (reads below
//! its revision are refused from the entry that applies it on), and its pass
//! over the index goes on in steps of [`Config::compact_step_keys`] keys: the
//! first step inline (a small store is done there), the rest when the owner
//! calls [`Store::compaction_step`]. Keys the pass has not reached answer
//! every read it allows exactly as compacted keys do (see
//! `Index::compact_keys`). The revisions the pass drops reach the pending
//! deletes, and so the revision tree's next commit, when it ends: the set
//! of pending deletes is shared with the readers that began before (snapshot
//! streams, HashKVs), so it changes once per pass, not at every step. A
//! HashKV must not start while a pass runs ([`Store::hash_kv_stream`]
//! finishes it first), as it hashes what the tree holds less what
//! compaction removed; a snapshot stream sends what the pass has not yet
//! handed over, and the store built from it drops that when it opens.
//!
//! A compaction applied while a pass runs restarts it from the first key at
//! the newer revision, which drops a superset of what the older one would;
//! what the older one dropped already is kept. So that compactions arriving
//! faster than a pass cannot keep it from ever ending (HashKVs, defragments
//! and `physical` compactions wait for it), a pass that has visited
//! [`MAX_LAPS`] times as many keys as the index holds takes the rest of its
//! work in its next step.
//! A restart runs the whole pass when the store is opened.
//!
//! [`Config::compact_step_keys`]: super::Config::compact_step_keys

use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::steps::Step;
use super::Store;
use crate::index::IKey;
use crate::types::Revision;

/// How many times over a pass may visit the index's keys, restarts
/// included, before its next step finishes it.
pub(crate) const MAX_LAPS: usize = 3;

/// A compaction's pass over the key index, under way.
#[derive(Debug)]
pub(crate) struct IndexPass {
    /// The revision compacted at.
    at: i64,
    /// The last key compacted; `None` before the first.
    after: Option<IKey>,
    /// What it has dropped from the index so far.
    removed: BTreeSet<Revision>,
    /// Keys visited so far, restarts included (at most the step's size each
    /// step).
    visited: usize,
    /// Time spent in its steps so far.
    spent: Duration,
}

impl Store {
    /// Begins the index pass of a compaction at `at` and takes its first step.
    pub(super) fn start_compaction(&mut self, at: i64) {
        let (removed, visited, spent) = match self.compaction.take() {
            Some(older) => (older.removed, older.visited, older.spent),
            None => (BTreeSet::new(), 0, Duration::ZERO),
        };
        self.compaction = Some(IndexPass {
            at,
            after: None,
            removed,
            visited,
            spent,
        });
        self.compact_keys(self.cfg.compact_step_keys);
    }

    /// Whether a compaction's index pass is under way: the owner calls
    /// [`Store::compaction_step`] until it is not.
    pub fn compaction_running(&self) -> bool {
        self.compaction.is_some()
    }

    /// Carries the running compaction's index pass on by
    /// [`Config::compact_step_keys`](super::Config::compact_step_keys) keys;
    /// `None` when none runs.
    pub fn compaction_step(&mut self) -> Option<Step> {
        self.compaction.as_ref()?;
        Some(self.compact_keys(self.cfg.compact_step_keys))
    }

    /// The highest compaction revision whose dropped records are all out of
    /// the revision tree: its pass (or a later one's, which drops a superset)
    /// has ended and a commit since has removed what it dropped. What etcd's
    /// "physical" compaction waits for; compactions applied meanwhile do not
    /// hold it back.
    pub fn compacted_out_through(&self) -> i64 {
        if self.pending_deletes.is_empty()
            && self.running.as_ref().is_none_or(|r| r.deletes.is_empty())
        {
            self.handed_over_at
        } else {
            self.removed_through
        }
    }

    /// Takes the running index pass's remaining steps at once.
    pub fn finish_compaction(&mut self) {
        if self.compaction.is_some() {
            self.compact_keys(usize::MAX);
        }
    }

    /// Adds a pass's dropped revisions to the pending deletes. Readers may
    /// hold the pending set: it is replaced, not changed. Usually it is empty
    /// (the last pass's drops committed) and the pass's set takes its place;
    /// otherwise the smaller set goes into the larger one where the store
    /// owns both (a slow disk put the commit off).
    fn hand_over(&mut self, mine: BTreeSet<Revision>) {
        if self.pending_deletes.is_empty() {
            self.pending_deletes = Rc::new(mine);
            return;
        }
        let merged = match Rc::try_unwrap(std::mem::take(&mut self.pending_deletes)) {
            Ok(mut pending) if pending.len() >= mine.len() => {
                pending.extend(mine);
                pending
            }
            Ok(pending) => {
                let mut mine = mine;
                mine.extend(pending);
                mine
            }
            Err(shared) => {
                let mut mine = mine;
                mine.extend(shared.iter().copied());
                mine
            }
        };
        self.pending_deletes = Rc::new(merged);
    }

    fn compact_keys(&mut self, max_keys: usize) -> Step {
        let started = Instant::now();
        let pass = self
            .compaction
            .as_mut()
            .expect("a compaction step needs a running pass");
        let keys = self.index.borrow().len();
        let max_keys = if pass.visited > keys.saturating_mul(MAX_LAPS) {
            usize::MAX
        } else {
            max_keys
        };
        pass.visited = pass.visited.saturating_add(max_keys.min(keys));
        let mut removed = Vec::new();
        let next = self.index.borrow_mut().compact_keys(
            pass.at,
            pass.after.as_ref(),
            max_keys,
            &mut removed,
        );
        pass.removed.extend(removed);
        let took = started.elapsed();
        pass.spent += took;
        let done = match next {
            Some(key) => {
                pass.after = Some(key);
                None
            }
            None => {
                let mut pass = self.compaction.take().expect("checked above");
                self.hand_over(std::mem::take(&mut pass.removed));
                self.handed_over_at = pass.at;
                tracing::debug!(
                    file = %self.file,
                    revision = pass.at,
                    spent_us = pass.spent.as_micros() as u64,
                    "compaction's index pass done"
                );
                Some(pass.spent)
            }
        };
        Step { took, done }
    }
}

//! The commit and sync path: writing the pending batch to the copy-on-write
//! file, the background syncer's interplay (deferred commits, waits for
//! durability and for pages freed by commits still syncing), growth (ahead
//! of need on the syncer, or inline), remap and shrink of the file.

use std::rc::Rc;
use std::time::Instant;

use super::{storage_err, Store};
use crate::error::{CommitError, IoOp};
use crate::page::{Meta, META_PAGES, PAGE_SIZE_BYTES};
use crate::pager::PageSource;

/// Pages any commit may take beyond its records: the roots and the paths
/// down to the leaves it touches.
const LEAST_COMMIT_PAGES: u64 = 16;

impl Store {
    /// Waits until every commit so far is durable.
    pub fn sync(&mut self) -> Result<(), CommitError> {
        if let Err(e) = self.meta_writer.wait_durable(self.committed.txn) {
            self.poisoned = true;
            return Err(e.into());
        }
        self.release_durable_pages();
        Ok(())
    }

    /// Frees the pages that commits now durable gave up and no snapshot reads.
    pub(super) fn release_durable_pages(&mut self) {
        let oldest = self.oldest_snapshot();
        let durable = self.meta_writer.durable_txn();
        self.pager.release_pending(oldest, durable);
    }

    /// Refuses to go on once a commit failed: the store stays poisoned
    /// until reopened.
    pub(super) fn unpoisoned(&self) -> Result<(), CommitError> {
        if self.poisoned {
            return Err(CommitError::Poisoned {
                file: self.file.to_string(),
            });
        }
        Ok(())
    }

    pub(super) fn has_changes(&self) -> bool {
        !self.pending.is_empty()
            || !self.pending_deletes.is_empty()
            || !self.lease_dirty.is_empty()
            || !self.txn_dirty.is_empty()
            || self.applied_index != self.committed.applied_index
            || self.current_rev != self.committed.current_rev
            || self.compact_rev.get() != self.committed.compact_rev
    }

    /// Writes everything applied since the last commit to the file: pages, sync,
    /// then the meta page, sync. Returns whether anything was written. A
    /// commit running in steps is finished first, and so is a compaction's
    /// pass over the key index, so that what it drops leaves the tree.
    pub fn commit(&mut self) -> Result<bool, CommitError> {
        self.unpoisoned()?;
        self.finish_running()?;
        self.finish_compaction();
        self.take_up_grown_file()?;
        if !self.has_changes() {
            return Ok(false);
        }
        self.commit_with(None, 0)?;
        Ok(true)
    }

    /// Like [`Store::commit`], but when committing now would wait for the
    /// background syncer (its queue full, or the pages this commit needs
    /// freed only once an earlier commit is durable), leaves the changes
    /// pending and answers `Ok(false)`, so a slow disk does not stop the
    /// thread that applies. Reads see pending changes as before. Once the
    /// pending changes reach half of `max_batch_bytes` it commits, waiting
    /// if it must, so memory stays bounded. While a defragment step waits
    /// for the syncer (its queue full, or pages still syncing), it leaves
    /// its changes pending until the step has gone ahead: its commits would
    /// otherwise take every turn the syncer gives on a slow disk.
    ///
    /// The file grows the same way: when the room left runs short, the
    /// syncer is asked to grow it, and a commit that needs the room before
    /// the grow is done waits for a later turn rather than grow it here.
    ///
    /// A commit running in steps is finished first, and so is a
    /// compaction's pass over the key index, as [`Store::commit`] does.
    pub fn commit_unless_busy(&mut self) -> Result<bool, CommitError> {
        self.finish_running()?;
        self.finish_compaction();
        if !self.commit_may_begin()? {
            return Ok(false);
        }
        self.commit_with(None, 0)?;
        Ok(true)
    }

    /// Whether a commit may begin now without waiting for the syncer, as
    /// [`Store::commit_unless_busy`] decides; counts a commit left for later.
    pub(super) fn commit_may_begin(&mut self) -> Result<bool, CommitError> {
        self.take_up_grown_file()?;
        self.unpoisoned()?;
        if !self.has_changes() {
            return Ok(false);
        }
        if !self.meta_writer.has_failed() && self.pending_bytes < self.cfg.max_batch_bytes / 2 {
            let defrag_asks = self
                .defrag_waiting
                .is_some_and(|t| t.elapsed() < super::DEFRAG_PRIORITY);
            if self.commit_would_wait() || defrag_asks {
                self.stats.deferred += 1;
                return Ok(false);
            }
            self.grow_ahead_if_short();
            if self.meta_writer.growing() && self.pages_available() < self.pages_needed() {
                self.stats.deferred += 1;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether a commit now would wait for the background syncer.
    pub(super) fn commit_would_wait(&self) -> bool {
        let durable = self.meta_writer.durable_txn();
        self.meta_writer
            .would_wait(self.committed.txn.saturating_sub(durable))
            || self.must_wait_for_free_pages(durable)
    }

    /// Whether this commit may need more pages than are free now while
    /// pages freed by commits still syncing would give them back.
    pub(super) fn must_wait_for_free_pages(&self, durable: u64) -> bool {
        self.pages_available() < self.pages_needed()
            && self
                .pager
                .pending_free
                .front()
                .is_some_and(|(t, _)| *t > durable)
    }

    /// About how many pages committing what is pending takes.
    fn pages_needed(&self) -> u64 {
        // A delete may rewrite a leaf of its own (a compaction's deletes are
        // spread over the tree), but no more leaves than there are.
        (self.pending_bytes / (PAGE_SIZE_BYTES / 2)
            + self
                .pending_deletes
                .len()
                .min(self.pager.used_pages() as usize)
            + self.lease_dirty.len()
            + self.txn_dirty.len()) as u64
            + LEAST_COMMIT_PAGES
    }

    /// Pages a commit may take without growing the file: the free ones and
    /// the room past the highest page in use.
    fn pages_available(&self) -> u64 {
        self.pager.free.len() as u64 + (self.pager.file_pages - self.pager.high_water)
    }

    /// By how many pages the file grows from `cur`: a sixteenth, so remaps
    /// are few and the overshoot small.
    fn grow_step_pages(&self, cur: u64) -> u64 {
        (cur * PAGE_SIZE_BYTES as u64 / 16).clamp(self.cfg.grow_min_bytes, self.cfg.grow_max_bytes)
            / PAGE_SIZE_BYTES as u64
    }

    /// Asks the syncer to grow the file when the room left is under a
    /// quarter of a step beyond what is pending, so the grow is usually done
    /// before a commit needs it. Without a syncer, commits grow the file.
    pub(super) fn grow_ahead_if_short(&mut self) {
        if self.meta_writer.growing()
            || self
                .grow_failed
                .is_some_and(|t| t.elapsed() < super::GROW_RETRY_AFTER)
        {
            return;
        }
        let cur = self.pager.file_pages;
        let step = self.grow_step_pages(cur);
        let needed = self.pages_needed();
        if self.pages_available() >= needed + step / 4 {
            return;
        }
        let pages = cur + step.max(needed);
        if self.meta_writer.grow_ahead(pages * PAGE_SIZE_BYTES as u64) {
            tracing::debug!(file = %self.file, from_pages = cur, to_pages = pages, "growing the store file ahead");
        }
    }

    /// Takes up the file's new length once the syncer has grown it: the
    /// pages past the old end become room, and the map covers them. A grow
    /// that failed is left to the commit that needs the room, which grows
    /// the file itself and fails with the disk's error if it must.
    pub(super) fn take_up_grown_file(&mut self) -> Result<(), CommitError> {
        match self.meta_writer.take_grown() {
            Some(Ok(len)) => self.take_up_length(len),
            Some(Err(_)) => {
                self.grow_failed = Some(Instant::now());
                Ok(())
            }
            None => Ok(()),
        }
    }

    pub(super) fn take_up_length(&mut self, len: u64) -> Result<(), CommitError> {
        let pages = len / PAGE_SIZE_BYTES as u64;
        if pages > self.pager.file_pages {
            if let Err(e) = self.remap() {
                self.poisoned = true;
                return Err(e);
            }
            self.pager.file_pages = pages;
            self.stats.grown_ahead += 1;
        }
        Ok(())
    }

    pub(crate) fn oldest_snapshot(&self) -> Option<u64> {
        self.snapshots.borrow().keys().next().copied()
    }

    /// A whole commit, at once; `relocate` moves pages at or past a limit
    /// (defragment).
    pub(crate) fn commit_with(
        &mut self,
        relocate: Option<(u64, usize)>,
        flags: u32,
    ) -> Result<(), CommitError> {
        self.finish_running()?;
        self.begin(relocate, flags)?;
        self.finish_running()
    }

    /// Writes the commit the pager built, under `meta`, and retires replaced
    /// pages (a snapshot's restore, which builds its trees itself).
    pub(crate) fn commit_meta(&mut self, meta: Meta) -> Result<(), CommitError> {
        let (pages, remap) = self.take_pages()?;
        let count = pages.len() as u64;
        self.write_pages(&mut pages.into_iter(), usize::MAX)?;
        self.seal(meta, count, remap, 0, 0)
    }

    /// Hands `meta` to the syncer once the commit's `pages` pages are
    /// written, and makes it the committed state: the first `records`
    /// pending records (`bytes` of `pending_bytes`) are now in its tree, and
    /// the pages it replaced are freed once it is durable and no snapshot
    /// reads them. `remap`: the commit grew the file.
    pub(super) fn seal(
        &mut self,
        meta: Meta,
        pages: u64,
        remap: bool,
        records: usize,
        bytes: usize,
    ) -> Result<(), CommitError> {
        let sync_us = self.meta_writer.commit(&self.pager.storage, meta)?;
        self.stats.last_sync_us = self.meta_writer.last_sync_us().unwrap_or(sync_us);
        self.stats.pages_written += pages + 1;
        self.stats.bytes_written += (pages + 1) * PAGE_SIZE_BYTES as u64;
        if remap {
            self.remap()?;
        }
        self.pending.drain(..records);
        self.pending_bytes -= bytes;
        self.committed = meta;
        let freed = std::mem::take(&mut self.pager.freed_now);
        self.pager.pending_free.push_back((meta.txn, freed));
        let oldest = self.oldest_snapshot();
        let durable = self.meta_writer.durable_txn();
        self.pager.release_pending(oldest, durable);
        if self.shrink_wanted {
            self.shrink()?;
        }
        self.grow_ahead_if_short();
        Ok(())
    }

    /// Takes the pages the commit being built wrote, in id order, growing
    /// the file first if they reach past its end; returns them and whether
    /// the file grew here (the map must then be renewed once they are
    /// written).
    pub(super) fn take_pages(&mut self) -> Result<(super::steps::Pages, bool), CommitError> {
        let file = self.file.clone();
        let need = self.pager.high_water;
        let mut remap = false;
        if need > self.pager.file_pages {
            // The room a grow in flight brings may be enough.
            if let Some(Ok(len)) = self.meta_writer.wait_grown() {
                self.take_up_length(len)?;
            }
        }
        if need > self.pager.file_pages {
            let cur = self.pager.file_pages;
            let new_pages = need.max(cur + self.grow_step_pages(cur));
            let len = new_pages * PAGE_SIZE_BYTES as u64;
            self.pager
                .storage
                .borrow_mut()
                .set_len(len)
                .map_err(storage_err(&file, IoOp::Grow, len))?;
            self.pager.file_pages = new_pages;
            self.stats.grown_inline += 1;
            remap = true;
        }
        let dirty = std::mem::take(&mut self.pager.dirty);
        self.pager.source.forget(dirty.keys().copied());
        Ok((dirty.into_iter().collect(), remap))
    }

    pub(super) fn remap(&mut self) -> Result<(), CommitError> {
        let src = PageSource::new(&self.pager.storage, &self.file, Some(&self.pager.source))
            .map_err(storage_err(&self.file, IoOp::Map, 0))?;
        self.pager.source = Rc::new(src);
        Ok(())
    }

    /// Cuts free pages off the end of the file. Only pages in the free set go:
    /// no meta and no live snapshot can reach them.
    ///
    /// The cut is not synced here: this runs on the applying thread, which
    /// must not wait for the disk. The next commit's data sync (on the
    /// syncer) makes the new length durable; a crash before it leaves the
    /// longer file, whose tail no meta reaches, so an open treats it as free.
    ///
    /// While the syncer grows the file, the cut waits for a later commit:
    /// the two would race on the file's length.
    pub(super) fn shrink(&mut self) -> Result<(), CommitError> {
        if self.meta_writer.growing() {
            return Ok(());
        }
        let mut hw = self.pager.high_water;
        while hw > META_PAGES && self.pager.free.contains(&(hw - 1)) {
            hw -= 1;
            self.pager.free.remove(&hw);
        }
        self.pager.high_water = hw;
        // Room for the next commits stays, so the cut does not make the
        // syncer grow the file again at once (a quarter step, the room
        // under which a grow ahead is asked for, and a commit's least need).
        let keep = hw + self.grow_step_pages(hw) / 4 + LEAST_COMMIT_PAGES;
        if keep < self.pager.file_pages {
            let len = keep * PAGE_SIZE_BYTES as u64;
            let file = self.file.clone();
            let mut st = self.pager.storage.borrow_mut();
            st.set_len(len)
                .map_err(storage_err(&file, IoOp::Shrink, len))?;
            drop(st);
            self.pager.file_pages = keep;
            self.remap()?;
        }
        if self.pager.pending_free.is_empty() {
            self.shrink_wanted = false;
        }
        Ok(())
    }
}

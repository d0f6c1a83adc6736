//! Defragmenting: live pages moved from the end of the file towards the
//! start, a bounded step per commit, then the file cut.
//!
//! A caller that must not wait for the disk (a core thread driving other
//! shards) runs it in steps: [`Store::defragment_start`], then
//! [`Store::defragment_step`] now and then, applying and committing as usual
//! in between. A step that would wait for the store's syncer (the previous
//! step not yet durable) does nothing and says so; while it waits for the
//! syncer's queue or for pages still syncing, the owner's
//! [`Store::commit_unless_busy`] holds back, so on a slow disk the owner's
//! commits cannot take every turn the syncer gives. One that moves pages
//! writes at most the pages it is given. [`Store::defragment`] runs the same
//! steps, waiting for each to be durable.

use super::{DefragReport, Store};
use crate::error::DefragError;
use crate::page::META_PAGES;

/// A defragment in progress, between steps.
#[derive(Debug)]
pub struct DefragRun {
    report: DefragReport,
    /// A step found no page left to move (snapshots hold the old copies at
    /// the end, which a later commit cuts): the run ends at its next step.
    stalled: bool,
    /// The commit of the run's last step: the next step waits until it is
    /// durable, so the pages it freed can take the next step's pages.
    last_txn: Option<u64>,
}

/// What one [`Store::defragment_step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefragProgress {
    /// Committed a step of moved pages (or the changes pending before it).
    Moved,
    /// Did nothing: the previous commit is not durable yet. Step again later.
    Waiting,
    /// Finished: the file is cut to its live pages (those a live snapshot
    /// still reads are cut by a later commit).
    Done(DefragReport),
}

/// Most steps one run takes: each moves up to its page budget, so this bounds
/// a run that keeps finding pages to move while writes keep adding them.
const MAX_STEPS: u64 = 1 << 16;

impl Store {
    /// Copies live pages from the end of the file into free pages nearer the
    /// start, a bounded step per commit, then cuts the file. Snapshots keep
    /// reading throughout; pages they still see are cut by a later commit.
    /// Waits for each step to be durable. A compaction's pass over the key
    /// index is finished first: the records it drops are not moved.
    pub fn defragment(&mut self) -> Result<DefragReport, DefragError> {
        self.finish_compaction();
        let mut run = self.defragment_start();
        self.finish_running()?;
        loop {
            self.sync()?;
            if let Some(Ok(len)) = self.meta_writer.wait_grown() {
                self.take_up_length(len)?;
            }
            let pages = self.cfg.defrag_step_pages;
            if let DefragProgress::Done(report) = self.defragment_step(&mut run, pages)? {
                return Ok(report);
            }
        }
    }

    /// Starts a defragment run, to be carried out by
    /// [`Store::defragment_step`].
    pub fn defragment_start(&self) -> DefragRun {
        DefragRun {
            report: DefragReport {
                file_bytes_before: self.size_bytes(),
                ..DefragReport::default()
            },
            stalled: false,
            last_txn: None,
        }
    }

    /// One step of `run`: commits the pending changes with up to `pages` live
    /// pages moved from the end of the file, or finishes the run. Never waits
    /// for the disk; [`DefragProgress::Waiting`] when it would have to.
    pub fn defragment_step(
        &mut self,
        run: &mut DefragRun,
        pages: usize,
    ) -> Result<DefragProgress, DefragError> {
        self.unpoisoned()?;
        // Commits made between steps (the caller's own) need not be durable:
        // only the run's last step, whose freed pages the next one fills. A
        // grow the syncer is making is taken up first: the file's end must
        // hold still for the cut. (No grow starts while the run wants a cut.)
        self.take_up_grown_file().map_err(DefragError::from)?;
        // A commit running in steps ends first (the owner carries it on);
        // meanwhile no new one begins.
        let syncer_busy =
            self.running.is_some() || self.commit_would_wait() || self.meta_writer.growing();
        self.defrag_waiting = syncer_busy.then(std::time::Instant::now);
        if syncer_busy
            || run
                .last_txn
                .is_some_and(|t| self.meta_writer.durable_txn() < t)
        {
            return Ok(DefragProgress::Waiting);
        }
        self.release_durable_pages();
        if run.last_txn.is_none() && self.has_changes() {
            // The changes applied before the run first, as their own commit,
            // so the live page count below is the whole store's.
            self.commit()?;
            run.last_txn = Some(self.committed.txn);
            return Ok(DefragProgress::Moved);
        }
        let live = self.pager.used_pages() - META_PAGES - self.pager.pending_free_pages() as u64;
        let target = META_PAGES + live + live / 64 + 8;
        if self.pager.high_water <= target || run.stalled || run.report.steps >= MAX_STEPS {
            self.shrink_wanted = true;
            if self.pager.pending_free.is_empty() {
                self.shrink().map_err(DefragError::from)?;
            }
            run.report.file_bytes_after = self.size_bytes();
            let report = run.report;
            tracing::info!(file = %self.file, before = report.file_bytes_before, after = report.file_bytes_after, steps = report.steps, "defragmented");
            return Ok(DefragProgress::Done(report));
        }
        self.shrink_wanted = true;
        self.commit_with(Some((target, pages.max(1))), 0)?;
        run.last_txn = Some(self.committed.txn);
        run.report.steps += 1;
        // Commits between steps cut the file too, so progress is counted in
        // pages moved, not in the file's end.
        run.stalled = self.relocated_pages == 0;
        Ok(DefragProgress::Moved)
    }
}

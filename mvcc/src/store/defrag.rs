//! Defragmenting: live pages moved from the end of the file towards the
//! start, a bounded step per commit, then the file cut.

use super::{DefragReport, Store};
use crate::error::DefragError;
use crate::page::META_PAGES;

impl Store {
    /// Copies live pages from the end of the file into free pages nearer the
    /// start, a bounded step per commit, then cuts the file. Snapshots keep
    /// reading throughout; pages they still see are cut by a later commit.
    pub fn defragment(&mut self) -> Result<DefragReport, DefragError> {
        let mut report = DefragReport {
            file_bytes_before: self.size_bytes(),
            ..DefragReport::default()
        };
        self.commit()?;
        self.sync()?;
        loop {
            let live =
                self.pager.used_pages() - META_PAGES - self.pager.pending_free_pages() as u64;
            let target = META_PAGES + live + live / 64 + 8;
            if self.pager.high_water <= target {
                break;
            }
            let before_hw = self.pager.high_water;
            self.shrink_wanted = true;
            self.commit_with(Some((target, self.cfg.defrag_step_pages)), 0)?;
            self.sync()?;
            report.steps += 1;
            if self.pager.high_water >= before_hw || report.steps > 1024 {
                // Nothing more moved (readers hold the old pages); later commits finish.
                break;
            }
        }
        self.shrink_wanted = true;
        if self.pager.pending_free.is_empty() {
            self.shrink().map_err(DefragError::from)?;
        }
        report.file_bytes_after = self.size_bytes();
        tracing::info!(file = %self.file, before = report.file_bytes_before, after = report.file_bytes_after, steps = report.steps, "defragmented");
        Ok(report)
    }
}

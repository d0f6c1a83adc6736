//! A commit in steps. A commit's work on the applying thread (encoding the
//! records, building the trees' new pages, writing them to the file) grows
//! with its batch: several hundred microseconds for a few hundred puts. Done
//! at once it holds every request that arrives meanwhile; done in steps, each
//! of a bounded number of records or page bytes ([`Config::commit_step_records`],
//! [`Config::commit_step_bytes`]), the owner serves what arrived between two
//! steps.
//!
//! While a commit runs, nothing else changes the trees: the records it takes
//! (the pending ones when it began) stay pending, and readable from memory,
//! until its meta is handed to the syncer; records applied meanwhile queue
//! behind them for the next commit. The trees' new pages go to free pages,
//! which no meta and no snapshot reaches, so reads of the committed trees
//! are untouched until the commit ends. A crash before then reopens the
//! last commit, as a crash before any commit would.
//!
//! [`Config::commit_step_records`]: super::Config::commit_step_records
//! [`Config::commit_step_bytes`]: super::Config::commit_step_bytes

use std::collections::BTreeSet;
use std::ops::Bound;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::{encode_lease, storage_err, Store};
use crate::btree::{self, Mutation};
use crate::error::{CommitError, IoOp, StorageError};
use crate::page::{Meta, META_PAGES, PAGE_SIZE_BYTES};
use crate::types::Revision;

/// Longest run of adjacent pages written with one call.
const MAX_RUN_BYTES: usize = 1024 * 1024;

/// A commit's written pages by id, in id order.
pub(super) type Pages = Vec<(u64, Vec<u8>)>;

/// The commit being carried out.
pub(crate) struct Running {
    /// The meta it will write; the roots move as the trees are built.
    meta: Meta,
    /// Moves pages at or past a limit, at most so many (defragment).
    relocate: Option<(u64, usize)>,
    /// `pending[..records]` are this commit's records, `pending[..next]`
    /// already in the tree; `bytes` is their share of `pending_bytes`.
    records: usize,
    next: usize,
    bytes: usize,
    /// Revisions compaction removed, taken from `pending_deletes`; reads
    /// skip them until the commit ends. Those at or below `deleted_to` are
    /// out of the tree already.
    pub(super) deletes: Rc<BTreeSet<Revision>>,
    /// The compaction revision whose drops `deletes` completes.
    removes_through: i64,
    deleted_to: Option<Revision>,
    lease_muts: Vec<Mutation>,
    txn_muts: Vec<Mutation>,
    /// The pages to write, in id order, once the trees are built.
    pages: Option<std::vec::IntoIter<(u64, Vec<u8>)>>,
    page_count: u64,
    remap: bool,
    /// Time spent in its steps so far.
    spent: Duration,
}

/// What one step of work carried out in steps did: of a commit, or of a
/// compaction's pass over the key index (`store/compaction.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// How long the step took.
    pub took: Duration,
    /// Once the work is done: how long its steps took in all.
    pub done: Option<Duration>,
}

/// Most work one step may do.
#[derive(Clone, Copy)]
pub(super) struct StepLimits {
    pub records: usize,
    pub bytes: usize,
}

impl StepLimits {
    pub(super) const WHOLE: StepLimits = StepLimits {
        records: usize::MAX,
        bytes: usize::MAX,
    };
}

impl Store {
    /// Whether a commit is part-way through its steps.
    pub fn commit_running(&self) -> bool {
        self.running.is_some()
    }

    /// Begins a commit of everything applied so far, to be carried out by
    /// [`Store::commit_step`], unless one is running already or it would
    /// wait for the background syncer, as [`Store::commit_unless_busy`]
    /// decides (once the pending changes reach half of `max_batch_bytes` it
    /// begins anyway, waiting if it must). Returns whether a commit is
    /// running afterwards.
    pub fn commit_begin_unless_busy(&mut self) -> Result<bool, CommitError> {
        if self.running.is_some() {
            return Ok(true);
        }
        if !self.commit_may_begin()? {
            return Ok(false);
        }
        self.begin(None, 0)?;
        Ok(true)
    }

    /// Carries the running commit on by one step; `None` when no commit
    /// runs. The commit is done once its pages are written and its meta
    /// handed to the syncer (durable once the syncer has synced it; see
    /// [`Store::durable_index`]).
    pub fn commit_step(&mut self) -> Result<Option<Step>, CommitError> {
        let limits = StepLimits {
            records: self.cfg.commit_step_records,
            bytes: self.cfg.commit_step_bytes,
        };
        self.step(limits)
    }

    /// Carries the running commit, if any, to its end.
    pub(super) fn finish_running(&mut self) -> Result<(), CommitError> {
        while self.running.is_some() {
            self.step(StepLimits::WHOLE)?;
        }
        Ok(())
    }

    /// Starts a commit; `relocate` moves pages at or past a limit (defragment).
    pub(super) fn begin(
        &mut self,
        relocate: Option<(u64, usize)>,
        flags: u32,
    ) -> Result<(), CommitError> {
        debug_assert!(self.running.is_none(), "a commit is running already");
        self.unpoisoned()?;
        // Pages freed by commits still syncing become reusable once those are
        // durable. When this commit may need more than is free now, wait for
        // that rather than grow the file for good.
        if self.must_wait_for_free_pages(self.meta_writer.durable_txn()) {
            if let Err(e) = self.meta_writer.wait_durable(self.committed.txn) {
                return Err(self.failed(e.into()));
            }
            self.release_durable_pages();
        }
        let txn = self.committed.txn + 1;
        self.pager.txn = txn;
        // The tree orders leases by the id's bits as u64: a negative id sorts
        // after every positive one, unlike the signed order of `lease_dirty`.
        let mut lease_muts: Vec<Mutation> = std::mem::take(&mut self.lease_dirty)
            .into_iter()
            .map(|id| ((id as u64, 0), self.leases.get(&id).map(encode_lease)))
            .collect();
        lease_muts.sort_unstable_by_key(|m| m.0);
        let txn_muts = self.txn_record_mutations();
        self.running = Some(Box::new(Running {
            meta: Meta {
                txn,
                applied_index: self.applied_index,
                current_rev: self.current_rev,
                compact_rev: self.compact_rev.get(),
                flags,
                ..self.committed
            },
            relocate,
            records: self.pending.len(),
            next: 0,
            bytes: self.pending_bytes,
            deletes: std::mem::take(&mut self.pending_deletes),
            removes_through: self.handed_over_at,
            deleted_to: None,
            lease_muts,
            txn_muts,
            pages: None,
            page_count: 0,
            remap: false,
            spent: Duration::ZERO,
        }));
        Ok(())
    }

    fn step(&mut self, limits: StepLimits) -> Result<Option<Step>, CommitError> {
        let Some(mut run) = self.running.take() else {
            return Ok(None);
        };
        let started = Instant::now();
        let done = match self.step_inner(&mut run, limits) {
            Ok(done) => done,
            Err(e) => return Err(self.failed(e)),
        };
        let took = started.elapsed();
        run.spent += took;
        if !done {
            self.running = Some(run);
            return Ok(Some(Step { took, done: None }));
        }
        self.removed_through = self.removed_through.max(run.removes_through);
        let spent_us = run.spent.as_micros() as u64;
        self.stats.commits += 1;
        self.stats.last_commit_us = spent_us;
        self.stats.max_commit_us = self.stats.max_commit_us.max(spent_us);
        self.stats.total_commit_us += spent_us;
        Ok(Some(Step {
            took,
            done: Some(run.spent),
        }))
    }

    /// A commit failed part-way: the store is poisoned until reopened (the
    /// file's last meta still reaches everything committed before).
    fn failed(&mut self, e: CommitError) -> CommitError {
        self.running = None;
        self.poisoned = true;
        tracing::error!(file = %self.file, applied_index = self.applied_index, error = %e, "commit failed; store poisoned until reopened");
        e
    }

    /// One step; true once the commit is done.
    fn step_inner(&mut self, run: &mut Running, limits: StepLimits) -> Result<bool, CommitError> {
        if run.pages.is_none() {
            let muts = self.next_mutations(run, limits.records);
            run.meta.rev_root = btree::apply(&mut self.pager, run.meta.rev_root, muts)?;
            if run.next < run.records || self.deletes_left(run) {
                return Ok(false);
            }
            self.finish_trees(run)?;
            return Ok(false);
        }
        let pages = run.pages.as_mut().expect("pages taken");
        if !self.write_pages(pages, limits.bytes)? {
            return Ok(false);
        }
        self.seal(run.meta, run.page_count, run.remap, run.records, run.bytes)?;
        Ok(true)
    }

    fn deletes_left(&self, run: &Running) -> bool {
        match run.deleted_to {
            None => !run.deletes.is_empty(),
            Some(to) => run.deletes.last().is_some_and(|l| *l > to),
        }
    }

    /// The next mutations of the revision tree, in key order: up to `limit`
    /// of the commit's records and deletes. A record both applied and
    /// compacted away inside the batch is never stored.
    fn next_mutations(&self, run: &mut Running, limit: usize) -> Vec<Mutation> {
        let from = match run.deleted_to {
            None => Bound::Unbounded,
            Some(to) => Bound::Excluded(to),
        };
        let mut deletes = run.deletes.range((from, Bound::Unbounded)).peekable();
        let mut muts: Vec<Mutation> = Vec::with_capacity(limit.min(run.records - run.next + 64));
        while muts.len() < limit {
            let rec = self.pending[..run.records].get(run.next);
            match (rec, deletes.peek()) {
                (None, None) => break,
                (Some(r), Some(d)) if r.rev == **d => {
                    run.deleted_to = Some(**d);
                    deletes.next();
                    run.next += 1;
                }
                (Some(r), d) if d.is_none_or(|d| r.rev < **d) => {
                    muts.push(((r.rev.main as u64, r.rev.sub as u64), Some(r.encode())));
                    run.next += 1;
                }
                (_, Some(d)) => {
                    muts.push(((d.main as u64, d.sub as u64), None));
                    run.deleted_to = Some(**d);
                    deletes.next();
                }
                (_, None) => unreachable!("a record is matched above"),
            }
        }
        muts
    }

    /// Builds the lease and txn trees, relocates (defragment), and takes the
    /// pages the commit wrote, growing the file first if they reach past it.
    fn finish_trees(&mut self, run: &mut Running) -> Result<(), CommitError> {
        let lease_muts = std::mem::take(&mut run.lease_muts);
        run.meta.lease_root = btree::apply(&mut self.pager, run.meta.lease_root, lease_muts)?;
        let txn_muts = std::mem::take(&mut run.txn_muts);
        run.meta.txn_root = btree::apply(&mut self.pager, run.meta.txn_root, txn_muts)?;
        self.relocated_pages = 0;
        if let Some((limit, pages)) = run.relocate {
            let mut budget = pages;
            let m = &mut run.meta;
            m.rev_root = btree::relocate(&mut self.pager, m.rev_root, limit, &mut budget)?;
            m.lease_root = btree::relocate(&mut self.pager, m.lease_root, limit, &mut budget)?;
            m.txn_root = btree::relocate(&mut self.pager, m.txn_root, limit, &mut budget)?;
            self.relocated_pages = pages - budget;
        }
        let (pages, remap) = self.take_pages()?;
        run.page_count = pages.len() as u64;
        run.pages = Some(pages.into_iter());
        run.remap = remap;
        Ok(())
    }

    /// Writes the next of `pages` (in id order), runs of adjacent ones
    /// together, until about `limit` bytes are written; true once all are.
    pub(super) fn write_pages(
        &mut self,
        pages: &mut std::vec::IntoIter<(u64, Vec<u8>)>,
        limit: usize,
    ) -> Result<bool, StorageError> {
        let file = self.file.clone();
        let file_pages = self.pager.file_pages;
        let mut st = self.pager.storage.borrow_mut();
        let mut write = |bytes: &[u8], start: u64| -> Result<(), StorageError> {
            let off = start * PAGE_SIZE_BYTES as u64;
            st.write_at(bytes, off)
                .map_err(storage_err(&file, IoOp::Write, off))
        };
        let mut written = 0usize;
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        while written < limit {
            let Some((id, page)) = pages.next() else {
                break;
            };
            assert!(
                id >= META_PAGES && id < file_pages,
                "{file}: dirty page {id} outside the file",
                file = self.file
            );
            let run_next = run_start + (run.len() / PAGE_SIZE_BYTES) as u64;
            if !run.is_empty() && (id != run_next || run.len() >= MAX_RUN_BYTES) {
                write(&run, run_start)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = id;
            }
            run.extend_from_slice(&page);
            written += PAGE_SIZE_BYTES;
        }
        if !run.is_empty() {
            write(&run, run_start)?;
        }
        Ok(pages.as_slice().is_empty())
    }
}

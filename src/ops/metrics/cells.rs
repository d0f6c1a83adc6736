//! The cells metrics live in: one slab of `AtomicU64` per core, on cache lines
//! only that core writes.

use std::sync::atomic::{AtomicU64, Ordering};

use super::MAX_HISTOGRAM_BUCKETS;

const CELLS_PER_LINE: usize = 16;
const CACHE_LINE_BYTES: usize = 128;
const _: () = assert!(CELLS_PER_LINE * std::mem::size_of::<AtomicU64>() == CACHE_LINE_BYTES);
const _: () = assert!(MAX_HISTOGRAM_BUCKETS < CELLS_PER_LINE * 8);

#[repr(align(128))]
#[derive(Debug)]
struct CacheLine([AtomicU64; CELLS_PER_LINE]);

const _: () = assert!(std::mem::align_of::<CacheLine>() == CACHE_LINE_BYTES);

/// One core's cells: the core block, then one block per shard the core owns.
#[derive(Debug)]
pub(super) struct Slab {
    lines: Box<[CacheLine]>,
}

impl Slab {
    pub(super) fn new(slots: usize) -> Self {
        let lines = slots.div_ceil(CELLS_PER_LINE).max(1);
        Slab {
            lines: (0..lines)
                .map(|_| CacheLine(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    #[inline]
    pub(super) fn cell(&self, slot: usize) -> &AtomicU64 {
        &self.lines[slot / CELLS_PER_LINE].0[slot % CELLS_PER_LINE]
    }

    #[inline]
    pub(super) fn add(&self, slot: usize, n: u64) {
        self.cell(slot).fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn store(&self, slot: usize, v: u64) {
        self.cell(slot).store(v, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn load(&self, slot: usize) -> u64 {
        self.cell(slot).load(Ordering::Relaxed)
    }

    #[inline]
    pub(super) fn observe(&self, base: usize, thresholds: &[u64], value: u64) {
        let bucket = thresholds
            .iter()
            .position(|&t| value <= t)
            .unwrap_or(thresholds.len());
        self.add(base + bucket, 1);
        self.add(base + thresholds.len() + 1, value);
    }
}

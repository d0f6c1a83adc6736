//! Page-aligned buffers (O_DIRECT needs aligned memory) filled with a pattern that
//! the read-back check can recognise.

use std::alloc::{self, Layout};

/// Alignment of every buffer: a page, which satisfies O_DIRECT on any disk whose
/// logical block is at most 4 KiB.
pub const BUF_ALIGN_BYTES: usize = 4096;

/// A heap buffer aligned to [`BUF_ALIGN_BYTES`].
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>), so moving it
// to another thread moves that ownership with it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` > 0).
    pub fn zeroed(len: usize) -> AlignedBuf {
        assert!(len > 0, "an aligned buffer needs at least one byte");
        let layout =
            Layout::from_size_align(len, BUF_ALIGN_BYTES).expect("buffer size overflows a Layout");
        // SAFETY: the layout has a non-zero size, checked above.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len initialised (zeroed) bytes owned
        // by self, borrowed immutably for the lifetime of &self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BUF_ALIGN_BYTES)
            .expect("layout was valid at allocation");
        // SAFETY: ptr was allocated by alloc_zeroed with exactly this layout and is
        // freed once, here.
        unsafe { alloc::dealloc(self.ptr, layout) };
    }
}

// SAFETY: the pointer stays valid and unmoved while the buffer is owned by an
// in-flight tokio-uring operation (the heap allocation does not move with the
// struct), and all `len` bytes are initialised.
unsafe impl tokio_uring::buf::IoBuf for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }

    fn bytes_init(&self) -> usize {
        self.len
    }

    fn bytes_total(&self) -> usize {
        self.len
    }
}

/// Bytes at the start of each block holding its sequence number (little-endian).
const SEQ_BYTES: usize = std::mem::size_of::<u64>();

/// Fills a block with the pattern of append number `seq`: the sequence number as a
/// little-endian u64, then its low byte repeated.
pub fn fill_pattern(block: &mut [u8], seq: u64) {
    let head = SEQ_BYTES.min(block.len());
    block[..head].copy_from_slice(&seq.to_le_bytes()[..head]);
    block[head..].fill(seq as u8);
}

/// Whether a block read back holds the pattern of append `seq`.
pub fn matches_pattern(block: &[u8], seq: u64) -> bool {
    let head = SEQ_BYTES.min(block.len());
    block[..head] == seq.to_le_bytes()[..head] && block[head..].iter().all(|&b| b == seq as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trips_and_detects_other_sequence() {
        let mut buf = AlignedBuf::zeroed(4096);
        assert_eq!(buf.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        fill_pattern(buf.as_mut_slice(), 77);
        assert!(matches_pattern(buf.as_slice(), 77));
        assert!(!matches_pattern(buf.as_slice(), 78));
        buf.as_mut_slice()[4000] ^= 1;
        assert!(!matches_pattern(buf.as_slice(), 77));
    }
}

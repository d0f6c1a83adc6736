//! Block-aligned byte buffers, the unit of every WAL write.
//!
//! O_DIRECT requires the memory address, the file offset and the length of a
//! transfer to be multiples of the device's logical block size. Cairn aligns
//! everything to [`BLOCK_BYTES`] (4 KiB), which covers 512-byte and 4 KiB devices.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment and granularity of every WAL write, in bytes.
pub const BLOCK_BYTES: usize = 4096;

/// A heap buffer whose start address is aligned to [`BLOCK_BYTES`] and whose
/// capacity is a whole number of blocks. Bytes between `len` and capacity are
/// always zero, so padding a buffer to a block boundary never exposes stale memory.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (like `Vec<u8>`); no
// aliasing pointer survives a move, so sending it to another thread is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of initialised bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer with room for at least `capacity` bytes (rounded up to blocks).
    pub fn with_capacity(capacity: usize) -> AlignedBuf {
        let capacity = align_up(capacity.max(BLOCK_BYTES), BLOCK_BYTES);
        let layout = Self::layout(capacity);
        // SAFETY: the layout has a non-zero size (at least one block).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len: 0,
            capacity,
        }
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, BLOCK_BYTES)
            .unwrap_or_else(|e| panic!("aligned buffer of {capacity} bytes: {e}"))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Makes room for `additional` more bytes, moving to a larger allocation if needed.
    pub fn reserve(&mut self, additional: usize) {
        let needed = self.len + additional;
        if needed <= self.capacity {
            return;
        }
        let mut grown = AlignedBuf::with_capacity(needed.max(self.capacity * 2));
        grown.extend_from_slice(self);
        *self = grown;
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        // SAFETY: `reserve` guarantees `len + bytes.len() <= capacity`; the source
        // cannot overlap our allocation because we hold `&mut self`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.len),
                bytes.len(),
            );
        }
        self.len += bytes.len();
    }

    /// Extends with `count` zero bytes.
    pub fn extend_zeros(&mut self, count: usize) {
        self.reserve(count);
        // The tail beyond `len` is kept zeroed (see `truncate`), so growing is free.
        self.len += count;
    }

    /// Shortens the buffer, re-zeroing the dropped bytes to keep the tail invariant.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let dropped = self.len - len;
        // SAFETY: `len..self.len` lies within the allocation.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(len), 0, dropped) };
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Sets the length to `len` bytes, all of which must already be initialised
    /// (the allocation is zeroed, so any `len <= capacity` is initialised).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "aligned buffer length {len} beyond capacity {}",
            self.capacity
        );
        if len < self.len {
            self.truncate(len);
        } else {
            self.len = len;
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `capacity >= len` initialised (zeroed or
        // written) bytes, and we hand out a shared borrow tied to `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, with exclusivity from `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `with_capacity` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

pub(crate) const fn align_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}

pub(crate) const fn align_down(value: usize, align: usize) -> usize {
    value / align * align
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed_after_truncate() {
        let mut b = AlignedBuf::with_capacity(10);
        assert_eq!(b.capacity(), BLOCK_BYTES);
        assert_eq!(b.as_ptr() as usize % BLOCK_BYTES, 0);
        b.extend_from_slice(&[7; 100]);
        b.truncate(10);
        b.extend_zeros(90);
        assert!(b[10..].iter().all(|&x| x == 0));
        b.extend_from_slice(&[1; 5000]);
        assert_eq!(b.as_ptr() as usize % BLOCK_BYTES, 0);
        assert_eq!(b.len(), 5100);
        assert_eq!(&b[..10], &[7; 10]);
    }
}

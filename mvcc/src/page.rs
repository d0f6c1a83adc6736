//! Page layout shared by every page of a store file.
//!
//! All integers on disk are little-endian. Every page starts with the same
//! 24-byte header; its CRC32 covers the rest of the page (meta pages: the rest of
//! the meta record), so a torn or misdirected write is caught on read.

use std::fmt;

/// Size of every page of the file. Fixed by the format so that both meta pages
/// can be found before either has been read.
pub const PAGE_SIZE_BYTES: usize = 4096;
/// Pages 0 and 1 hold the two meta records; tree pages start after them.
pub const META_PAGES: u64 = 2;

pub(crate) const CRC_OFFSET: usize = 0;
pub(crate) const KIND_OFFSET: usize = CRC_OFFSET + size_of::<u32>();
pub(crate) const FLAGS_OFFSET: usize = KIND_OFFSET + size_of::<u8>();
pub(crate) const COUNT_OFFSET: usize = FLAGS_OFFSET + size_of::<u8>();
pub(crate) const PAGE_ID_OFFSET: usize = COUNT_OFFSET + size_of::<u16>();
pub(crate) const TXN_OFFSET: usize = PAGE_ID_OFFSET + size_of::<u64>();
pub(crate) const HEADER_BYTES: usize = TXN_OFFSET + size_of::<u64>();

pub(crate) const KIND_META: u8 = 1;
pub(crate) const KIND_BRANCH: u8 = 2;
pub(crate) const KIND_LEAF: u8 = 3;
pub(crate) const KIND_OVERFLOW: u8 = 4;

// Leaf slots are u16 offsets into the page.
const _: () = assert!(PAGE_SIZE_BYTES <= u16::MAX as usize + 1);
const _: () = assert!(PAGE_SIZE_BYTES.is_multiple_of(512));
const _: () = assert!(HEADER_BYTES == 24);

/// Bytes of a page available after the header.
pub(crate) const BODY_BYTES: usize = PAGE_SIZE_BYTES - HEADER_BYTES;

// Branch entry: first key (main u64, sub u64) then child page id u64.
pub(crate) const BRANCH_ENTRY_BYTES: usize = 3 * size_of::<u64>();
// Leaf entry: u16 slot + key (16) + value length u16, then the value.
pub(crate) const LEAF_SLOT_BYTES: usize = size_of::<u16>();
pub(crate) const LEAF_ENTRY_FIXED_BYTES: usize = 2 * size_of::<u64>() + size_of::<u16>();
/// A leaf value (after its one-byte kind) longer than this goes to overflow pages.
pub(crate) const INLINE_VALUE_MAX_BYTES: usize = 1024;
// At least three maximal inline entries fit one leaf, so a split always makes progress.
const _: () = assert!(
    3 * (LEAF_SLOT_BYTES + LEAF_ENTRY_FIXED_BYTES + 1 + INLINE_VALUE_MAX_BYTES) <= BODY_BYTES
);
pub(crate) const OVERFLOW_NEXT_OFFSET: usize = HEADER_BYTES;
pub(crate) const OVERFLOW_LEN_OFFSET: usize = OVERFLOW_NEXT_OFFSET + size_of::<u64>();
pub(crate) const OVERFLOW_DATA_OFFSET: usize = OVERFLOW_LEN_OFFSET + size_of::<u32>();
pub(crate) const OVERFLOW_DATA_BYTES: usize = PAGE_SIZE_BYTES - OVERFLOW_DATA_OFFSET;

// Meta record, after the common header.
pub(crate) const MAGIC: [u8; 8] = *b"CAIRNMV1";
/// The format this build writes. Format 2 added the txn record tree: its
/// root follows the format 1 fields, and the meta CRC covers it.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The previous format, still opened: no txn record tree, and a meta record
/// that ends (and whose CRC ends) at `META_END_V1`.
pub(crate) const FORMAT_VERSION_V1: u32 = 1;
pub(crate) const MAGIC_OFFSET: usize = HEADER_BYTES;
pub(crate) const VERSION_OFFSET: usize = MAGIC_OFFSET + MAGIC.len();
pub(crate) const META_PAGE_SIZE_OFFSET: usize = VERSION_OFFSET + size_of::<u32>();
pub(crate) const REV_ROOT_OFFSET: usize = META_PAGE_SIZE_OFFSET + size_of::<u32>();
pub(crate) const LEASE_ROOT_OFFSET: usize = REV_ROOT_OFFSET + size_of::<u64>();
pub(crate) const APPLIED_INDEX_OFFSET: usize = LEASE_ROOT_OFFSET + size_of::<u64>();
pub(crate) const CURRENT_REV_OFFSET: usize = APPLIED_INDEX_OFFSET + size_of::<u64>();
pub(crate) const COMPACT_REV_OFFSET: usize = CURRENT_REV_OFFSET + size_of::<i64>();
pub(crate) const META_FLAGS_OFFSET: usize = COMPACT_REV_OFFSET + size_of::<i64>();
/// End of a format 1 meta record, and of its CRC range.
pub(crate) const META_END_V1: usize = META_FLAGS_OFFSET + size_of::<u32>();
pub(crate) const TXN_ROOT_OFFSET: usize = META_END_V1;
pub(crate) const META_END: usize = TXN_ROOT_OFFSET + size_of::<u64>();
// Files of format 1 exist: its fields may not move.
const _: () = assert!(META_END_V1 == 84);
const _: () = assert!(META_END <= 512, "a meta record must fit one sector");

/// Meta flag: the file is being filled by a snapshot restore and is not a store yet.
pub(crate) const META_FLAG_RESTORING: u32 = 1;

pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}
pub(crate) fn get_i64(b: &[u8], off: usize) -> i64 {
    get_u64(b, off) as i64
}
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Why a page was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageFault {
    /// The page lies beyond the end of the file.
    BeyondEnd,
    /// The stored CRC32 does not match the page contents.
    Checksum,
    /// The page records another page id: a misdirected or stale write.
    WrongId(u64),
    /// The page is not of the kind the tree expected here.
    WrongKind { expected: &'static str, found: u8 },
    /// A length or count inside the page is impossible.
    Malformed(&'static str),
    /// The page could not be read.
    Io(String),
}

impl fmt::Display for PageFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageFault::BeyondEnd => write!(f, "beyond the end of the file"),
            PageFault::Checksum => write!(f, "checksum mismatch"),
            PageFault::WrongId(id) => write!(f, "page records id {id}"),
            PageFault::WrongKind { expected, found } => {
                write!(f, "expected a {expected} page, found kind {found}")
            }
            PageFault::Malformed(what) => write!(f, "malformed: {what}"),
            PageFault::Io(e) => write!(f, "read failed: {e}"),
        }
    }
}

/// A page that failed its check, named by file and page number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: page {page}: {fault}")]
pub struct CorruptPage {
    pub file: String,
    pub page: u64,
    pub fault: PageFault,
}

/// Seals a page: writes kind, count, id and txn, then the CRC over the rest.
pub(crate) fn seal(page: &mut [u8], kind: u8, count: u16, id: u64, txn: u64) {
    debug_assert_eq!(page.len(), PAGE_SIZE_BYTES);
    page[KIND_OFFSET] = kind;
    page[FLAGS_OFFSET] = 0;
    put_u16(page, COUNT_OFFSET, count);
    put_u64(page, PAGE_ID_OFFSET, id);
    put_u64(page, TXN_OFFSET, txn);
    let crc = crc32fast::hash(&page[KIND_OFFSET..]);
    put_u32(page, CRC_OFFSET, crc);
}

/// Checks CRC and id of a tree page; returns its kind.
pub(crate) fn verify(page: &[u8], id: u64) -> Result<u8, PageFault> {
    if page.len() != PAGE_SIZE_BYTES {
        return Err(PageFault::BeyondEnd);
    }
    if crc32fast::hash(&page[KIND_OFFSET..]) != get_u32(page, CRC_OFFSET) {
        return Err(PageFault::Checksum);
    }
    let found = get_u64(page, PAGE_ID_OFFSET);
    if found != id {
        return Err(PageFault::WrongId(found));
    }
    crate::btree::check_node(page)?;
    Ok(page[KIND_OFFSET])
}

pub(crate) fn count(page: &[u8]) -> usize {
    get_u16(page, COUNT_OFFSET) as usize
}

/// The decoded meta record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub txn: u64,
    pub rev_root: u64,
    pub lease_root: u64,
    /// Root of the txn record tree; 0 in a format 1 file, which has none.
    pub txn_root: u64,
    pub applied_index: u64,
    pub current_rev: i64,
    pub compact_rev: i64,
    pub flags: u32,
}

impl Meta {
    /// Encodes the record for meta page `slot` (0 or 1). Commits alternate
    /// slots, so the newest durable meta is never overwritten.
    pub(crate) fn encode(&self, slot: u64) -> Vec<u8> {
        assert!(slot < META_PAGES, "meta slot {slot}");
        let mut b = vec![0u8; PAGE_SIZE_BYTES];
        b[KIND_OFFSET] = KIND_META;
        put_u64(&mut b, PAGE_ID_OFFSET, slot);
        put_u64(&mut b, TXN_OFFSET, self.txn);
        b[MAGIC_OFFSET..MAGIC_OFFSET + MAGIC.len()].copy_from_slice(&MAGIC);
        put_u32(&mut b, VERSION_OFFSET, FORMAT_VERSION);
        put_u32(&mut b, META_PAGE_SIZE_OFFSET, PAGE_SIZE_BYTES as u32);
        put_u64(&mut b, REV_ROOT_OFFSET, self.rev_root);
        put_u64(&mut b, LEASE_ROOT_OFFSET, self.lease_root);
        put_u64(&mut b, APPLIED_INDEX_OFFSET, self.applied_index);
        put_u64(&mut b, CURRENT_REV_OFFSET, self.current_rev as u64);
        put_u64(&mut b, COMPACT_REV_OFFSET, self.compact_rev as u64);
        put_u32(&mut b, META_FLAGS_OFFSET, self.flags);
        put_u64(&mut b, TXN_ROOT_OFFSET, self.txn_root);
        let crc = crc32fast::hash(&b[KIND_OFFSET..META_END]);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    /// Decodes the meta record in `b` (a page read from slot `slot`), of
    /// this format or the previous one. A format 1 record has no txn record
    /// tree, and its CRC ends with its last field, so the version (not yet
    /// checked) chooses the range the CRC is checked over; a version this
    /// build does not know is refused as such.
    pub(crate) fn decode(b: &[u8], slot: u64) -> Result<Meta, PageFault> {
        if b.len() < META_END {
            return Err(PageFault::BeyondEnd);
        }
        let version = get_u32(b, VERSION_OFFSET);
        let end = match version {
            FORMAT_VERSION => META_END,
            FORMAT_VERSION_V1 => META_END_V1,
            _ => return Err(PageFault::Malformed("unknown format version")),
        };
        if crc32fast::hash(&b[KIND_OFFSET..end]) != get_u32(b, CRC_OFFSET) {
            return Err(PageFault::Checksum);
        }
        if b[KIND_OFFSET] != KIND_META {
            return Err(PageFault::WrongKind {
                expected: "meta",
                found: b[KIND_OFFSET],
            });
        }
        if b[MAGIC_OFFSET..MAGIC_OFFSET + MAGIC.len()] != MAGIC {
            return Err(PageFault::Malformed("bad magic"));
        }
        if get_u32(b, META_PAGE_SIZE_OFFSET) as usize != PAGE_SIZE_BYTES {
            return Err(PageFault::Malformed("unsupported page size"));
        }
        let meta = Meta {
            txn: get_u64(b, TXN_OFFSET),
            rev_root: get_u64(b, REV_ROOT_OFFSET),
            lease_root: get_u64(b, LEASE_ROOT_OFFSET),
            txn_root: match version {
                FORMAT_VERSION_V1 => 0,
                _ => get_u64(b, TXN_ROOT_OFFSET),
            },
            applied_index: get_u64(b, APPLIED_INDEX_OFFSET),
            current_rev: get_i64(b, CURRENT_REV_OFFSET),
            compact_rev: get_i64(b, COMPACT_REV_OFFSET),
            flags: get_u32(b, META_FLAGS_OFFSET),
        };
        if get_u64(b, PAGE_ID_OFFSET) != slot {
            return Err(PageFault::WrongId(get_u64(b, PAGE_ID_OFFSET)));
        }
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_rejects_a_flipped_bit() {
        let m = Meta {
            txn: 7,
            rev_root: 3,
            lease_root: 0,
            txn_root: 5,
            applied_index: 99,
            current_rev: 12,
            compact_rev: 4,
            flags: 0,
        };
        let mut b = m.encode(1);
        assert_eq!(Meta::decode(&b, 1).unwrap(), m);
        assert!(Meta::decode(&b, 0).is_err());
        b[APPLIED_INDEX_OFFSET] ^= 1;
        assert_eq!(Meta::decode(&b, 1), Err(PageFault::Checksum));
        // The CRC covers the txn root, the field format 2 added.
        b[APPLIED_INDEX_OFFSET] ^= 1;
        b[TXN_ROOT_OFFSET] ^= 1;
        assert_eq!(Meta::decode(&b, 1), Err(PageFault::Checksum));
    }

    /// The record format 1 wrote for `m`: no txn root, CRC over 4..84.
    fn encode_v1(m: &Meta, slot: u64) -> Vec<u8> {
        assert_eq!(m.txn_root, 0, "format 1 has no txn record tree");
        let mut b = m.encode(slot);
        put_u32(&mut b, VERSION_OFFSET, FORMAT_VERSION_V1);
        b[META_END_V1..META_END].fill(0);
        let crc = crc32fast::hash(&b[KIND_OFFSET..META_END_V1]);
        put_u32(&mut b, CRC_OFFSET, crc);
        b
    }

    #[test]
    fn a_format_1_meta_decodes_with_no_txn_tree_and_other_versions_are_refused() {
        let m = Meta {
            txn: 3,
            rev_root: 9,
            lease_root: 4,
            txn_root: 0,
            applied_index: 20,
            current_rev: 17,
            compact_rev: 2,
            flags: 0,
        };
        let mut b = encode_v1(&m, 0);
        assert_eq!(Meta::decode(&b, 0).unwrap(), m);
        // Bytes past a format 1 record are not part of it.
        b[TXN_ROOT_OFFSET] = 0x77;
        assert_eq!(Meta::decode(&b, 0).unwrap(), m);
        b[COMPACT_REV_OFFSET] ^= 1;
        assert_eq!(Meta::decode(&b, 0), Err(PageFault::Checksum));

        let mut b = m.encode(0);
        put_u32(&mut b, VERSION_OFFSET, FORMAT_VERSION + 1);
        assert_eq!(
            Meta::decode(&b, 0),
            Err(PageFault::Malformed("unknown format version"))
        );
    }

    #[test]
    fn sealed_page_verifies_only_under_its_own_id() {
        let mut p = vec![0u8; PAGE_SIZE_BYTES];
        p[HEADER_BYTES] = 42;
        seal(&mut p, KIND_LEAF, 0, 9, 1);
        assert_eq!(verify(&p, 9), Ok(KIND_LEAF));
        assert_eq!(verify(&p, 8), Err(PageFault::WrongId(9)));
        p[100] ^= 0x80;
        assert_eq!(verify(&p, 9), Err(PageFault::Checksum));
    }
}

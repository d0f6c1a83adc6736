//! The simulators' own small hash: a trace or a log check means the same
//! thing on every build.

use crate::raft::Entry;

/// FNV-1a over `bytes`, continuing from `h` (the routing table's hash).
pub(crate) use crate::routing::fnv1a64_update as fnv1a;

use crate::routing::FNV1A64_OFFSET as FNV_OFFSET;

/// What identifies an entry's content: its type and its payload.
pub(crate) fn entry_digest(e: &Entry) -> u64 {
    let h = fnv1a(FNV_OFFSET, &e.entry_type.to_le_bytes());
    fnv1a(h, &e.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_differing_in_type_or_payload_differ() {
        let e = |t: i32, d: &'static [u8]| Entry {
            entry_type: t,
            data: d.to_vec().into(),
            ..Default::default()
        };
        assert_eq!(entry_digest(&e(0, b"a")), entry_digest(&e(0, b"a")));
        assert_ne!(entry_digest(&e(0, b"a")), entry_digest(&e(0, b"b")));
        assert_ne!(entry_digest(&e(0, b"a")), entry_digest(&e(1, b"a")));
        assert_eq!(fnv1a(FNV_OFFSET, b""), FNV_OFFSET);
    }
}

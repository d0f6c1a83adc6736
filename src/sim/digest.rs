//! The simulators' own small hash: a trace or a log check means the same
//! thing on every build.

use crate::raft::Entry;

/// FNV-1a over `bytes`, continuing from `h`.
pub(crate) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

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

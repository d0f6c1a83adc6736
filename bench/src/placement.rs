//! Where Cairn puts a key when a member runs several shards, so the txn
//! workloads can pick keys on one shard (`txn-one`) or on different shards
//! (`txn-cross`) without linking the server.
//!
//! A copy of Cairn's routing rule 2 (`src/routing.rs`, `ROUTING_VERSION` 2):
//! a key that starts with '/' routes by its first two path segments, any
//! other key by itself up to its first '/'; the shard is FNV-1a (64-bit) of
//! that prefix modulo the shard count. If the server's rule changes, the
//! txns stay valid and measured; only the spread of `txn-cross`'s keys over
//! the shards changes, which `cross_prefixes_reach_as_many_shards_as_they_can`
//! pins.

/// Routing prefixes `txn-cross` writes under, in the order a txn of k keys
/// takes them: for every shard count from 2 to [`SPREAD_CHECKED_UP_TO_SHARDS`],
/// the first k fall on min(k, shards) different shards. Found by search
/// over `/bench/x<i>/`.
pub const CROSS_PREFIXES: [&str; 8] = [
    "/bench/x0/",
    "/bench/x7/",
    "/bench/x100/",
    "/bench/x165/",
    "/bench/x43/",
    "/bench/x31/",
    "/bench/x185/",
    "/bench/x124/",
];

/// The routing prefix every key of a `txn-one` txn shares.
pub const ONE_PREFIX: &str = "/bench/one/";

/// The largest shard count [`CROSS_PREFIXES`] is checked to spread over.
pub const SPREAD_CHECKED_UP_TO_SHARDS: u64 = 16;

/// The part of a key that decides its shard.
pub fn routing_prefix(key: &[u8]) -> &[u8] {
    let wanted = if key.first() == Some(&b'/') { 3 } else { 1 };
    let mut slashes = 0;
    for (i, &b) in key.iter().enumerate() {
        if b == b'/' {
            slashes += 1;
            if slashes == wanted {
                return &key[..=i];
            }
        }
    }
    key
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The shard of `shards` that holds `key`.
pub fn shard_for_key(key: &[u8], shards: u64) -> u64 {
    assert!(shards >= 1, "no shards");
    fnv1a64(routing_prefix(key)) % shards
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_rule_matches_the_servers() {
        // Placements src/routing.rs gives (tests/daemon_cross_txn.rs and
        // tests/etcdctl_recipes.rs print them in their messages).
        let cases: [(&str, [u64; 3]); 5] = [
            ("acct-a/x", [1, 1, 1]),
            ("acct-b/x", [0, 2, 6]),
            ("/registry/pods/p", [1, 3, 3]),
            ("/registry/nodes/n", [0, 0, 4]),
            ("plainkey", [0, 2, 6]),
        ];
        for (key, want) in cases {
            let got = [2, 4, 8].map(|n| shard_for_key(key.as_bytes(), n));
            assert_eq!(got, want, "{key} at 2, 4 and 8 shards");
        }
        assert_eq!(routing_prefix(b"/registry/pods/ns/x"), b"/registry/pods/");
        assert_eq!(routing_prefix(b"mylock/694d"), b"mylock/");
        assert_eq!(routing_prefix(b"plain"), b"plain");
    }

    #[test]
    fn cross_prefixes_reach_as_many_shards_as_they_can() {
        for shards in 2..=SPREAD_CHECKED_UP_TO_SHARDS {
            for k in 1..=CROSS_PREFIXES.len() {
                let reached: BTreeSet<u64> = CROSS_PREFIXES[..k]
                    .iter()
                    .map(|p| shard_for_key(format!("{p}00000001").as_bytes(), shards))
                    .collect();
                assert_eq!(
                    reached.len(),
                    k.min(shards as usize),
                    "the first {k} prefixes at {shards} shards"
                );
            }
        }
    }

    #[test]
    fn one_prefix_keys_share_a_shard() {
        for j in 0..CROSS_PREFIXES.len() {
            let key = format!("{ONE_PREFIX}{j}/00000001");
            assert_eq!(routing_prefix(key.as_bytes()), ONE_PREFIX.as_bytes());
        }
    }
}

//! Key routing: which shard a key belongs to, which shards a range touches, and
//! which core owns a shard.
//!
//! A key belongs to the shard chosen by a hash of its routing prefix. A key that
//! starts with '/' routes by its first two path segments, up to and including
//! its third '/' (`/registry/pods/default/x` routes by `/registry/pods/`), so
//! Kubernetes' resource types, each under `/registry/<type>/`, spread over the
//! shards. Any other key routes by itself up to and including its first '/'
//! (`mylock/694d7f4b` by `mylock/`, so etcd's lock and election recipes keep a
//! name's keys together). A key with fewer separators routes by the whole key. Keys that share a routing prefix share a shard, so prefix
//! listings of one resource type and txns over one resource type stay on one
//! Raft group.
//!
//! A data directory of several shards holds every key on the shard this rule
//! gave it, so the rule is versioned ([`ROUTING_VERSION`], recorded in
//! `member.toml` and in backups) and never changes under existing data.
//!
//! The table is immutable once built and copied to every core, so lookups take no
//! lock.

/// Shard identifier; shards are numbered 0..shards.
pub type ShardId = u32;

/// The routing rule of this build. Version 1 routed every key up to its
/// second '/', so all of Kubernetes' `/registry/...` keys shared a shard and
/// `mylock/<lease>` did not share one with `mylock/`.
pub const ROUTING_VERSION: u32 = 2;

/// The separators a routing prefix of `key` ends with: three for a key that
/// starts with '/' (its leading separator and two path segments), one for
/// any other.
fn prefix_separators(key: &[u8]) -> usize {
    if key.first() == Some(&b'/') {
        3
    } else {
        1
    }
}

/// The part of a key that decides its shard.
pub fn routing_prefix(key: &[u8]) -> &[u8] {
    let wanted = prefix_separators(key);
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

/// True when `key` has a full routing prefix, so every key that starts with
/// `key` routes the same way.
fn has_full_prefix(key: &[u8]) -> bool {
    key.iter().filter(|&&b| b == b'/').count() >= prefix_separators(key)
}

/// FNV-1a, 64-bit: stable across builds and platforms, which the routing of data
/// already on disk (and member ids) requires (a std `Hasher` may change between
/// Rust releases).
pub(crate) const FNV1A64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Continues an FNV-1a hash `h` over `bytes`.
pub(crate) fn fnv1a64_update(mut h: u64, bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_update(FNV1A64_OFFSET, bytes)
}

/// The smallest key greater than every key that starts with `prefix`, as etcd's
/// `--prefix` computes it; empty when no such key exists (prefix of all 0xff).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new()
}

/// The keyspace's partition into shards and their placement on this member's cores.
#[derive(Debug, Clone)]
pub struct RoutingTable {
    shards: u32,
    cores: u32,
}

impl RoutingTable {
    pub fn new(shards: usize, cores: usize) -> RoutingTable {
        assert!(shards >= 1 && cores >= 1, "shards {shards} cores {cores}");
        RoutingTable {
            shards: u32::try_from(shards).expect("shard count fits u32"),
            cores: u32::try_from(cores).expect("core count fits u32"),
        }
    }

    pub fn shard_count(&self) -> usize {
        self.shards as usize
    }

    pub fn shard_ids(&self) -> impl Iterator<Item = ShardId> {
        0..self.shards
    }

    /// The shard that owns `key`.
    pub fn shard_for_key(&self, key: &[u8]) -> ShardId {
        (fnv1a64(routing_prefix(key)) % u64::from(self.shards)) as ShardId
    }

    /// The core of this member that runs `shard`. Shards are dealt round-robin so
    /// each core carries the same number, give or take one.
    pub fn core_for_shard(&self, shard: ShardId) -> usize {
        assert!(shard < self.shards, "shard {shard} out of {}", self.shards);
        (shard % self.cores) as usize
    }

    /// The shards a range request touches, in the etcd convention: an empty
    /// `range_end` is the single key `key`; `range_end` "\0" means every key from
    /// `key` on; otherwise the half-open range `[key, range_end)`.
    ///
    /// A range stays on one shard when every key in it must share `key`'s routing
    /// prefix; any other range may touch every shard.
    pub fn shards_for_range(&self, key: &[u8], range_end: &[u8]) -> Vec<ShardId> {
        if range_end.is_empty() {
            return vec![self.shard_for_key(key)];
        }
        if has_full_prefix(key) && range_end != b"\0" {
            let end_of_prefix = prefix_end(routing_prefix(key));
            if !end_of_prefix.is_empty() && range_end <= end_of_prefix.as_slice() {
                return vec![self.shard_for_key(key)];
            }
        }
        self.shard_ids().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_prefix_is_two_path_segments_or_up_to_the_first_slash() {
        assert_eq!(
            routing_prefix(b"/registry/pods/default/x"),
            b"/registry/pods/"
        );
        assert_eq!(routing_prefix(b"/registry/pods/"), b"/registry/pods/");
        assert_eq!(routing_prefix(b"/registry/pods"), b"/registry/pods");
        assert_eq!(routing_prefix(b"/locks/y"), b"/locks/y");
        assert_eq!(routing_prefix(b"a/b/c"), b"a/");
        assert_eq!(routing_prefix(b"mylock/694d7f4b"), b"mylock/");
        assert_eq!(routing_prefix(b"locks-x/694d7f4b"), b"locks-x/");
        assert_eq!(routing_prefix(b"/locks/y/694d7f4b"), b"/locks/y/");
        assert_eq!(routing_prefix(b"/one"), b"/one");
        assert_eq!(routing_prefix(b"plain"), b"plain");
        assert_eq!(routing_prefix(b""), b"");
    }

    #[test]
    fn keys_with_the_same_prefix_share_a_shard() {
        let t = RoutingTable::new(16, 2);
        let s = t.shard_for_key(b"/registry/pods/a");
        for k in [
            &b"/registry/pods/"[..],
            b"/registry/pods/b/c",
            b"/registry/pods/ns/x",
        ] {
            assert_eq!(t.shard_for_key(k), s, "{}", String::from_utf8_lossy(k));
        }
        let s = t.shard_for_key(b"mylock/");
        assert_eq!(t.shard_for_key(b"mylock/694d7f4b"), s);
        assert_eq!(t.shard_for_key(b"mylock/b/c"), s);
    }

    #[test]
    fn kubernetes_resource_types_spread_over_the_shards() {
        let t = RoutingTable::new(8, 2);
        let types = [
            "pods",
            "services",
            "endpoints",
            "configmaps",
            "secrets",
            "deployments",
            "replicasets",
            "events",
            "leases",
            "nodes",
            "namespaces",
            "serviceaccounts",
            "statefulsets",
            "daemonsets",
            "jobs",
            "cronjobs",
        ];
        let shards: std::collections::BTreeSet<ShardId> = types
            .iter()
            .map(|ty| t.shard_for_key(format!("/registry/{ty}/default/x").as_bytes()))
            .collect();
        assert!(
            shards.len() >= 5,
            "16 resource types on {shards:?} of 8 shards"
        );
    }

    #[test]
    fn keys_spread_over_all_shards() {
        let t = RoutingTable::new(8, 2);
        let mut seen = [0usize; 8];
        for i in 0..4000 {
            seen[t.shard_for_key(format!("/k{i}/v").as_bytes()) as usize] += 1;
        }
        for (s, n) in seen.iter().enumerate() {
            assert!((300..700).contains(n), "shard {s} got {n} of 4000");
        }
    }

    #[test]
    fn range_shards() {
        let t = RoutingTable::new(8, 2);
        let one = t.shard_for_key(b"/registry/pods/");
        assert_eq!(t.shards_for_range(b"/registry/pods/", b""), vec![one]);
        // A prefix listing inside one routing prefix stays on its shard.
        assert_eq!(
            t.shards_for_range(b"/registry/pods/", &prefix_end(b"/registry/pods/")),
            vec![one]
        );
        assert_eq!(
            t.shards_for_range(b"/registry/pods/ns/", &prefix_end(b"/registry/pods/ns/")),
            vec![one]
        );
        // etcd's lock recipe: `mylock/<lease>` and a listing of `mylock/`.
        let lock = t.shard_for_key(b"mylock/694d7f4b");
        assert_eq!(
            t.shards_for_range(b"mylock/", &prefix_end(b"mylock/")),
            vec![lock]
        );
        let lock = t.shard_for_key(b"/locks/y/694d7f4b");
        assert_eq!(
            t.shards_for_range(b"/locks/y/", &prefix_end(b"/locks/y/")),
            vec![lock]
        );
        // A prefix shorter than a routing prefix (every resource type under
        // `/registry/`), from-key, or a range crossing prefixes may touch
        // every shard.
        assert_eq!(
            t.shards_for_range(b"/registry/", &prefix_end(b"/registry/"))
                .len(),
            8
        );
        assert_eq!(t.shards_for_range(b"/reg", &prefix_end(b"/reg")).len(), 8);
        assert_eq!(t.shards_for_range(b"/registry/a", b"\0").len(), 8);
        assert_eq!(t.shards_for_range(b"/registry/a", b"/z").len(), 8);
        assert_eq!(t.shards_for_range(b"\0", b"\0").len(), 8);
    }

    #[test]
    fn prefix_end_matches_etcd() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"");
    }

    #[test]
    fn shards_are_dealt_round_robin_over_cores() {
        let t = RoutingTable::new(5, 2);
        let cores: Vec<usize> = t.shard_ids().map(|s| t.core_for_shard(s)).collect();
        assert_eq!(cores, vec![0, 1, 0, 1, 0]);
    }

    #[test]
    fn hash_is_stable() {
        // Data on disk is placed by this hash: it must never change.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

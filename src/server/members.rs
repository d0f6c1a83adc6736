//! Cluster membership: member and cluster ids, and the table of members with
//! their peer and client URLs.
//!
//! Ids are derived as etcd derives them, from what an operator gives at bootstrap:
//! a member's id from its sorted peer URLs and the cluster token, the cluster id
//! from the sorted member ids and the token. So every member computes the same ids
//! without talking, and two clusters bootstrapped with different tokens never
//! accept each other's traffic.

use crate::config::{Config, InitialMember};
use crate::routing::{fnv1a64_update, FNV1A64_OFFSET};

/// FNV-1a 64 over `parts` (routing's hash): stable across builds; ids are
/// persisted and exchanged on the wire.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(FNV1A64_OFFSET, |h, part| {
        // A separator after each part, so ("ab","c") and ("a","bc") differ.
        fnv1a64_update(fnv1a64_update(h, part), &[0xff])
    })
}

/// Raft reserves 0 for "nobody"; an id is never 0.
fn nonzero(h: u64) -> u64 {
    if h == 0 {
        1
    } else {
        h
    }
}

pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let joined = urls.join(",");
    nonzero(fnv1a64(&[joined.as_bytes(), token.as_bytes()]))
}

pub fn cluster_id(member_ids: &[u64], token: &str) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    nonzero(fnv1a64(&[&bytes, token.as_bytes()]))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// The members of the cluster as this member knows them.
#[derive(Debug, Clone)]
pub struct Membership {
    pub cluster_id: u64,
    pub local_id: u64,
    pub members: Vec<Member>,
}

impl Membership {
    /// The membership a new cluster starts with, from `--initial-cluster`. Client
    /// URLs of other members are learnt when they first answer; this member's own
    /// are its advertised ones.
    pub fn bootstrap(config: &Config) -> Membership {
        let members: Vec<Member> = config
            .initial_cluster
            .iter()
            .map(|m: &InitialMember| Member {
                id: member_id(&m.peer_urls, &config.initial_cluster_token),
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                client_urls: if m.name == config.name {
                    config.advertise_client_urls.clone()
                } else {
                    Vec::new()
                },
                is_learner: false,
            })
            .collect();
        let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
        let local_id = member_id(
            &config.initial_advertise_peer_urls,
            &config.initial_cluster_token,
        );
        Membership {
            cluster_id: cluster_id(&ids, &config.initial_cluster_token),
            local_id,
            members,
        }
    }

    pub fn voter_ids(&self) -> Vec<u64> {
        self.members
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect()
    }

    pub fn get(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// Member ids in a fixed order (sorted), used to spread shard leadership: shard
    /// `s` prefers the member at position `s % members`.
    pub fn preferred_leader(&self, shard: u32) -> u64 {
        let mut ids = self.voter_ids();
        ids.sort_unstable();
        ids[shard as usize % ids.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Flags};
    use clap::Parser;

    fn config(name: &str, port: u16) -> Config {
        Config::from_flags(
            Flags::try_parse_from([
                "cairn",
                "--name",
                name,
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{port}"),
                "--initial-cluster",
                "a=http://127.0.0.1:12380,b=http://127.0.0.1:22380,c=http://127.0.0.1:32380",
            ])
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn every_member_computes_the_same_ids() {
        let a = Membership::bootstrap(&config("a", 12380));
        let b = Membership::bootstrap(&config("b", 22380));
        assert_eq!(a.cluster_id, b.cluster_id);
        assert_eq!(a.voter_ids(), b.voter_ids());
        assert_ne!(a.local_id, b.local_id);
        assert!(a.voter_ids().contains(&a.local_id));
        assert!(b.voter_ids().contains(&b.local_id));
    }

    #[test]
    fn the_token_changes_every_id() {
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        assert_ne!(member_id(&urls, "one"), member_id(&urls, "two"));
        assert_ne!(cluster_id(&[1, 2], "one"), cluster_id(&[1, 2], "two"));
        assert_eq!(cluster_id(&[2, 1], "t"), cluster_id(&[1, 2], "t"));
    }

    #[test]
    fn leadership_preference_spreads_over_members() {
        let m = Membership::bootstrap(&config("a", 12380));
        let prefs: std::collections::BTreeSet<u64> =
            (0..3).map(|s| m.preferred_leader(s)).collect();
        assert_eq!(prefs.len(), 3);
    }
}

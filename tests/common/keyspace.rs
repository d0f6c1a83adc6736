//! Which member is the keyspace leader (it leads every shard), read from
//! the members' metrics (parsed by `ops_promtext.rs`, declared as
//! `promtext`).

use crate::common::{http_get, Cluster};
use crate::promtext;

/// The member (index) that leads every one of `shards` shards, if one does.
pub fn keyspace_leader(cluster: &Cluster, shards: usize) -> Option<usize> {
    cluster.members.iter().position(|m| {
        if !m.is_running() {
            return false;
        }
        let (code, body) = http_get(m.client_port, "/metrics");
        let Ok(parsed) = promtext::parse(&body) else {
            return false;
        };
        code == 200
            && (0..shards).all(|s| {
                let s = s.to_string();
                parsed.value("cairn_shard_is_leader", &[("shard", s.as_str())]) == Some(1.0)
            })
    })
}

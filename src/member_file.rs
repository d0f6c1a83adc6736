//! `member.toml`, the file of a member's data directory that says who the
//! member is, how its data directory is laid out, and the member table as last
//! applied ([format](../docs/DATA_DIR.md)). Read by the config (a restart takes
//! its layout from it) and kept by the member table.

use std::path::Path;

use cairn_proto::cairnpb::MemberInfo;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    #[serde(default)]
    pub client_urls: Vec<String>,
    #[serde(default)]
    pub is_learner: bool,
}

impl Member {
    pub fn to_info(&self) -> MemberInfo {
        MemberInfo {
            id: self.id,
            name: self.name.clone(),
            peer_urls: self.peer_urls.clone(),
            client_urls: self.client_urls.clone(),
            is_learner: self.is_learner,
        }
    }

    pub fn from_info(info: &MemberInfo) -> Member {
        Member {
            id: info.id,
            name: info.name.clone(),
            peer_urls: info.peer_urls.clone(),
            client_urls: info.client_urls.clone(),
            is_learner: info.is_learner,
        }
    }
}

pub const MEMBER_FILE: &str = "member.toml";

fn first_routing_version() -> u32 {
    1
}
pub const LAYOUT_VERSION: u32 = 1;

/// What `member.toml` records: this member's identity, the data directory's
/// layout, and the member table as last applied.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemberFile {
    pub layout_version: u32,
    pub name: String,
    pub member_id: u64,
    pub cluster_id: u64,
    pub shards: u32,
    /// The routing rule the shards' keys were placed by
    /// ([`crate::routing::ROUTING_VERSION`]); files written before it was
    /// recorded were placed by rule 1.
    #[serde(default = "first_routing_version")]
    pub routing_version: u32,
    pub wal_lanes: u32,
    /// Set once this member learnt it was removed from the cluster: it must not
    /// start again with this data directory.
    #[serde(default)]
    pub removed: bool,
    /// The voters every shard's log started with at the cluster's creation:
    /// a shard whose log was never compacted starts from them (never from the
    /// table, which moves with changes applied in other shards).
    #[serde(default)]
    pub bootstrap_voters: Vec<u64>,
    pub members: Vec<Member>,
}

impl MemberFile {
    /// The member `dir` holds: `None` when it holds none yet, an error naming
    /// the file and the reason when it cannot be read or parsed.
    pub fn load(dir: &Path) -> Result<Option<MemberFile>, String> {
        let text = match std::fs::read_to_string(dir.join(MEMBER_FILE)) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{MEMBER_FILE}: {e}")),
        };
        toml::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{MEMBER_FILE}: {e}"))
    }

    /// Writes the file atomically and durably (see [`crate::durable_file`]).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let text = toml::to_string(self)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        crate::durable_file::write(dir, MEMBER_FILE, text.as_bytes(), 0o644)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_from_before_the_routing_rule_was_recorded_reads_as_rule_1() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(MEMBER_FILE),
            "layout_version = 1\nname = \"a\"\nmember_id = 1\ncluster_id = 2\n\
             shards = 2\nwal_lanes = 1\nmembers = []\n",
        )
        .unwrap();
        let file = MemberFile::load(dir.path()).unwrap().unwrap();
        assert_eq!(file.routing_version, 1);
    }
}

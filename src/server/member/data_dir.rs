//! The data directory a member starts on: created, joined to a cluster, or
//! restored from a backup, and checked against the flags.
//!
//! ```text
//! <data-dir>/member.toml        identity, layout and the member table
//! <data-dir>/wal/lane-<i>/      the WAL of core i (shards s with s % lanes == i)
//! <data-dir>/shard-<s>/         shard s: its store file and raft-snapshot metadata
//! <data-dir>/shard-<s>/snapshot-incoming-*
//!                               a snapshot being received or waiting to be
//!                               installed (deleted when the shard opens)
//! ```
//! The layout (shard count, WAL lanes) is fixed when the member is created: a
//! restart without `--shards` and `--cores` takes it from `member.toml` (see
//! `Config::from_flags`), and one with other values is refused with a message
//! saying what the directory holds.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{ClusterState, Config};
use crate::routing::ShardId;
use crate::server::member::start_error::StartError;
use crate::server::members::{Member, MemberFile, Membership, LAYOUT_VERSION, MEMBER_FILE};

/// The directory of shard `shard`'s store, in the member's data directory.
pub fn shard_dir(data_dir: &Path, shard: ShardId) -> PathBuf {
    data_dir.join(format!("shard-{shard}"))
}

fn data_dir_error(dir: &Path, reason: impl Into<String>) -> StartError {
    StartError::DataDir {
        dir: dir.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads `member.toml`, or creates it for a new member (bootstrapping a new
/// cluster, or joining a running one with `--initial-cluster-state existing`).
/// Checks that the directory's layout matches the flags; a new member given no
/// `--shards` takes the running cluster's or the backup's shard count.
/// `peer_tls`: how this member reaches https:// peers when joining.
pub fn prepare_data_dir(
    config: &mut Config,
    peer_tls: Option<cairn_net::PeerTls>,
) -> Result<MemberFile, StartError> {
    let dir = &config.data_dir.clone();
    std::fs::create_dir_all(dir).map_err(|e| data_dir_error(dir, e.to_string()))?;
    match MemberFile::load(dir).map_err(|e| data_dir_error(dir, e))? {
        Some(file) => {
            check_member_file(config, &file)?;
            if config.restore_snapshot.is_some() {
                tracing::warn!(
                    "--restore-snapshot ignored: the data directory already holds a member"
                );
            }
            Ok(file)
        }
        None => {
            let file = if config.initial_cluster_state == ClusterState::Existing {
                join_cluster(config, peer_tls)?
            } else {
                let mut m = Membership::bootstrap(config);
                if let Some(path) = config.restore_snapshot.clone() {
                    restore_snapshot(config, &path, &m.voter_ids())?;
                    // The backup's shard count is now the member's, and the
                    // cluster id names it (member ids do not depend on it).
                    m = Membership::bootstrap(config);
                }
                new_member_file(config, m.local_id, m.cluster_id, m.voter_ids(), m.members)
            };
            file.write(dir)
                .map_err(|e| data_dir_error(dir, format!("writing {MEMBER_FILE}: {e}")))?;
            Ok(file)
        }
    }
}

/// A new member given no `--shards` takes the count it must have (`source`
/// says whose it is); one given `--shards` keeps it, for the caller to check.
fn adopt_shards(config: &mut Config, shards: u32, source: &str) {
    if !config.shards_from_flag && config.shards != shards as usize {
        tracing::info!(
            shards,
            "{source} {shards} shards; using that count (no --shards given)"
        );
        config.shards = shards as usize;
    }
}

/// Says at every start how a member of several shards numbers revisions, the
/// one thing an etcd client sees differently (README, "How the keyspace is
/// split").
pub(super) fn log_sharding(shards: usize) {
    if shards > 1 {
        tracing::info!(
            shards,
            "running {shards} shards: revisions start at 2^40 (each keyspace \
             leader numbers from its shard 0 term x 2^40) and response headers \
             a shard did not produce carry shard 0's Raft term; writes (txns \
             over any keys included) follow one revision order, and reads, \
             watches and compactions are consistent with it; --shards 1 keeps \
             etcd's numbering from 1"
        );
    }
}

/// Builds a new member's shards from a backup file (`--restore-snapshot`).
fn restore_snapshot(config: &mut Config, path: &Path, voters: &[u64]) -> Result<(), StartError> {
    let dir = &config.data_dir.clone();
    let restore_error = |e: String| data_dir_error(dir, format!("--restore-snapshot: {e}"));
    let backup = crate::server::backup::read_backup(path).map_err(restore_error)?;
    adopt_shards(config, backup.shards, "the backup holds");
    if backup.shards as usize != config.shards {
        return Err(restore_error(format!(
            "{} holds {} shards; start with --shards {}",
            path.display(),
            backup.shards,
            backup.shards
        )));
    }
    tracing::info!(
        file = %path.display(),
        shards = backup.shards,
        from_cluster = format_args!("{:x}", backup.cluster_id),
        "restoring the stores from a snapshot"
    );
    let store_config = cairn_mvcc::Config::default();
    crate::server::member::restore::restore_into(backup, dir, &store_config, voters)
        .map_err(restore_error)
}

fn check_member_file(config: &Config, file: &MemberFile) -> Result<(), StartError> {
    let dir = &config.data_dir;
    if file.layout_version != LAYOUT_VERSION {
        return Err(data_dir_error(
            dir,
            format!(
                "layout version {} is not {LAYOUT_VERSION}, the one this build reads",
                file.layout_version
            ),
        ));
    }
    if file.shards > 1 && file.routing_version != crate::routing::ROUTING_VERSION {
        return Err(data_dir_error(
            dir,
            format!(
                "its {} shards hold their keys by routing rule {}, and this build routes by rule {}: \
                 copy its keys into a new cluster with the build that wrote it \
                 (`etcdctl make-mirror`)",
                file.shards,
                file.routing_version,
                crate::routing::ROUTING_VERSION
            ),
        ));
    }
    if file.shards as usize != config.shards {
        return Err(data_dir_error(
            dir,
            format!(
                "holds {} shards; start with --shards {} (the shard count is fixed when a member is created)",
                file.shards, file.shards
            ),
        ));
    }
    if file.wal_lanes as usize != config.cores {
        return Err(data_dir_error(
            dir,
            format!(
                "was created with --cores {}; start with --cores {}",
                file.wal_lanes, file.wal_lanes
            ),
        ));
    }
    if file.name != config.name {
        return Err(data_dir_error(
            dir,
            format!("belongs to member {:?}, not {:?}", file.name, config.name),
        ));
    }
    if file.removed {
        return Err(data_dir_error(
            dir,
            format!(
                "member {:?} ({:x}) was removed from the cluster and cannot start with this \
                 directory again; to rejoin, `member add` it and start it with an empty --data-dir",
                file.name, file.member_id
            ),
        ));
    }
    Ok(())
}

/// How long a joining member keeps asking the cluster's members for the table.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a joining member keeps asking once members answer without it.
const JOIN_UNKNOWN_SETTLE: Duration = Duration::from_secs(3);

/// Learns the running cluster from the members named in `--initial-cluster`
/// (their peer ports' `GET /cairn/members`), and finds this member in it by its
/// advertised peer URLs: it must have been added with `member add` first.
fn join_cluster(
    config: &mut Config,
    peer_tls: Option<cairn_net::PeerTls>,
) -> Result<MemberFile, StartError> {
    let dir = &config.data_dir.clone();
    let own = &config.initial_advertise_peer_urls.clone();
    let peers: Vec<String> = config
        .initial_cluster
        .iter()
        .filter(|m| !crate::server::members::same_urls(&m.peer_urls, own))
        .flat_map(|m| m.peer_urls.iter().cloned())
        .collect();
    if peers.is_empty() {
        return Err(data_dir_error(
            dir,
            "--initial-cluster-state existing needs --initial-cluster to name the running \
             cluster's members besides this one",
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::io("runtime for joining"))?;
    let deadline = std::time::Instant::now() + JOIN_TIMEOUT;
    // A member that has not applied the `member add` yet answers without
    // this member: ask again (any member) until one knows it, or time runs out.
    let has_me = |t: &cairn_proto::cairnpb::MemberTable| {
        t.members
            .iter()
            .any(|m| crate::server::members::same_urls(&m.peer_urls, own))
    };
    let table = rt.block_on(async {
        let client = crate::server::peer_client::PeerClient::new(peer_tls);
        let mut errors = Vec::new();
        let mut without_me: Option<(std::time::Instant, _)> = None;
        loop {
            for url in &peers {
                match client.fetch_members(url).await {
                    Ok(t) if has_me(&t) => return Ok(t),
                    Ok(t) => {
                        let since = without_me.map_or_else(std::time::Instant::now, |(s, _)| s);
                        without_me = Some((since, t));
                    }
                    Err(e) => errors.push(e),
                }
            }
            // The cluster answers but does not know this member: a lagging
            // member catches up within moments, so that answer stands soon.
            let settled = without_me
                .as_ref()
                .is_some_and(|(since, _)| since.elapsed() >= JOIN_UNKNOWN_SETTLE);
            if settled || std::time::Instant::now() >= deadline {
                return without_me.map(|(_, t)| t).ok_or(errors);
            }
            errors.clear();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let table = table.map_err(|errors| {
        data_dir_error(
            dir,
            format!(
                "joining an existing cluster: no member answered ({})",
                errors.join("; ")
            ),
        )
    })?;
    adopt_shards(config, table.shards, "the cluster runs");
    if table.shards as usize != config.shards {
        return Err(data_dir_error(
            dir,
            format!(
                "the cluster runs {} shards; start with --shards {}",
                table.shards, table.shards
            ),
        ));
    }
    let members: Vec<Member> = table.members.iter().map(Member::from_info).collect();
    let Some(me) = members
        .iter()
        .find(|m| crate::server::members::same_urls(&m.peer_urls, own))
    else {
        return Err(data_dir_error(
            dir,
            format!(
                "the cluster has no member with peer URLs {own:?}: add it first \
                 (etcdctl member add {} --peer-urls={})",
                config.name,
                own.join(",")
            ),
        ));
    };
    tracing::info!(
        member_id = format_args!("{:x}", me.id),
        cluster_id = format_args!("{:x}", table.cluster_id),
        learner = me.is_learner,
        "joining the cluster"
    );
    Ok(new_member_file(
        config,
        me.id,
        table.cluster_id,
        table.bootstrap_voters.clone(),
        members,
    ))
}

/// The `member.toml` of a member created now, with the flags' layout.
fn new_member_file(
    config: &Config,
    member_id: u64,
    cluster_id: u64,
    bootstrap_voters: Vec<u64>,
    members: Vec<Member>,
) -> MemberFile {
    MemberFile {
        layout_version: LAYOUT_VERSION,
        name: config.name.clone(),
        member_id,
        cluster_id,
        shards: config.shards as u32,
        routing_version: crate::routing::ROUTING_VERSION,
        wal_lanes: config.cores as u32,
        removed: false,
        bootstrap_voters,
        members,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::Flags;

    fn config(dir: &Path, shards: &str) -> Config {
        let dir = dir.to_str().unwrap();
        let flags = Flags::try_parse_from(["cairn", "--data-dir", dir, "--shards", shards]);
        Config::from_flags(flags.unwrap()).unwrap()
    }

    #[test]
    fn shards_placed_by_another_routing_rule_refuse_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let two = config(dir.path(), "2");
        let mut file = new_member_file(&two, 1, 2, vec![1], Vec::new());
        assert_eq!(file.routing_version, crate::routing::ROUTING_VERSION);
        assert!(check_member_file(&two, &file).is_ok());
        file.routing_version = 1;
        let err = check_member_file(&two, &file).unwrap_err().to_string();
        assert!(err.contains("routing rule 1"), "{err}");
        // One shard holds every key whatever the rule.
        let one = config(dir.path(), "1");
        let mut file = new_member_file(&one, 1, 2, vec![1], Vec::new());
        file.routing_version = 1;
        assert!(check_member_file(&one, &file).is_ok());
    }
}

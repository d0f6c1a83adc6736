//! Building a new member's shards from a backup (`--restore-snapshot`; the
//! file's format is `server/backup.rs`).

use std::path::Path;

use cairn_mvcc as mvcc;

use crate::raft::{ConfState, SnapshotMetadata};
use crate::server::backup::Backup;

/// Builds every shard of a new member in `data_dir` from `backup`: the store,
/// and the Raft log's starting point (after the store's applied index, term
/// 1, with `voters`).
pub fn restore_into(
    backup: Backup,
    data_dir: &Path,
    store_config: &mvcc::Config,
    voters: &[u64],
) -> Result<(), String> {
    if !backup.auth.is_empty() {
        use prost::Message as _;
        let mut state = cairn_proto::cairnpb::AuthState::decode(backup.auth.as_slice())
            .map_err(|e| format!("the auth state does not decode: {e}"))?;
        // The new cluster's shard 0 log starts after the restored store's
        // index: every change it will carry comes after that.
        state.applied_index = backup
            .parts
            .first()
            .map_or(0, |p| p.applied_index)
            .min(state.applied_index);
        crate::durable_file::write_checked(
            data_dir,
            crate::server::auth_state::AUTH_FILE,
            &state.encode_to_vec(),
        )
        .map_err(|e| format!("writing {}: {e}", crate::server::auth_state::AUTH_FILE))?;
    }
    for part in backup.parts {
        let dir = data_dir.join(format!("shard-{}", part.shard));
        // Leftovers of an earlier attempt that failed before the member was
        // written.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let store = mvcc::Store::restore(&dir, part.shard, store_config.clone(), part.chunks)
            .map_err(|e| format!("shard {}: restoring its store: {e}", part.shard))?;
        if store.applied_index() != part.applied_index {
            return Err(format!(
                "shard {}: the restored store has applied index {}, the snapshot says {}",
                part.shard,
                store.applied_index(),
                part.applied_index
            ));
        }
        drop(store);
        let md = SnapshotMetadata {
            conf_state: Some(ConfState {
                voters: voters.to_vec(),
                learners: Vec::new(),
            }),
            index: part.applied_index,
            term: 1,
        };
        crate::server::shard::write_snapshot_meta(&dir, &md)
            .map_err(|e| format!("shard {}: writing its log start: {e}", part.shard))?;
    }
    let wal = data_dir.join("wal");
    if wal.exists() {
        std::fs::remove_dir_all(&wal).map_err(|e| format!("{}: {e}", wal.display()))?;
    }
    Ok(())
}

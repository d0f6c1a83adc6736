//! Snapshots: the log's snapshot metadata on disk, the store streamed to a
//! follower that is behind, and a received one installed in place of the store.

use std::path::Path;

use super::spool::{SpoolError, SpooledChunks};
use super::store_swap;
use super::*;
use crate::durable_file::sync_dir;

/// Snapshot metadata of the shard's log: the index and term the log starts
/// after, and the membership then. Kept in `<shard dir>/raft-snapshot`, written
/// atomically (temporary file, sync, rename) whenever the log is compacted or a
/// snapshot installed, since the WAL has no entry at that index to give its term.
pub(super) fn snapshot_meta_path(dir: &Path) -> PathBuf {
    dir.join("raft-snapshot")
}

/// The member table that came with a snapshot installed in shard 0, kept in
/// the new store's directory until `member.toml` is rewritten from it: it is
/// swapped in with the store, so a crash between the swap and the rewrite
/// finds it at the next start (see [`apply_pending_table`]).
fn pending_table_path(dir: &Path) -> PathBuf {
    dir.join("member-table.pending")
}

pub(super) fn read_snapshot_meta(
    shard: ShardId,
    dir: &Path,
) -> Result<Option<SnapshotMetadata>, ShardOpenError> {
    let path = snapshot_meta_path(dir);
    let bad = |reason: String| ShardOpenError::SnapshotMeta {
        shard,
        path: path.clone(),
        reason,
    };
    match crate::durable_file::read_checked(&path).map_err(bad)? {
        Some(body) => SnapshotMetadata::decode(body.as_slice())
            .map(Some)
            .map_err(|e| bad(e.to_string())),
        None => Ok(None),
    }
}

pub(crate) fn write_snapshot_meta(dir: &Path, md: &SnapshotMetadata) -> std::io::Result<()> {
    crate::durable_file::write_checked(dir, "raft-snapshot", &md.encode_to_vec())
}

/// Rewrites `member.toml` from the member table a snapshot install left in
/// `dir`, then removes it; says whether there was one. Run by the install
/// itself and, after a crash that came between the swap and the rewrite, by
/// the next start.
pub(super) fn apply_pending_table(
    dir: &Path,
    members: &crate::server::members::MemberRegistry,
    auth: Option<&crate::server::auth_state::AuthReplica>,
) -> Result<Option<cairn_proto::cairnpb::MemberTable>, String> {
    let path = pending_table_path(dir);
    let Some(body) =
        crate::durable_file::read_checked(&path).map_err(|e| format!("{}: {e}", path.display()))?
    else {
        return Ok(None);
    };
    let table = cairn_proto::cairnpb::MemberTable::decode(body.as_slice())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    members
        .replace_table(&table)
        .map_err(|e| format!("writing member.toml: {e}"))?;
    // Shard 0's snapshot carries the auth state as of its sender's apply.
    if let (Some(auth), Some(state)) = (auth, &table.auth) {
        auth.install(state)
            .map_err(|e| format!("writing the snapshot's auth state: {e}"))?;
    }
    std::fs::remove_file(&path)
        .and_then(|()| sync_dir(dir))
        .map_err(|e| format!("removing {}: {e}", path.display()))?;
    Ok(Some(table))
}

/// How long a snapshot transfer to a follower may go without sending a chunk
/// (waiting for the follower to be reachable included). Raft is then told it
/// failed, and sends a fresh snapshot when the follower next answers.
pub const SNAPSHOT_SEND_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a snapshot Raft accepted could not be installed: the shard fails.
#[derive(Debug, thiserror::Error)]
pub(super) enum InstallError {
    #[error("{0}")]
    NotHeld(String),
    #[error("restoring the store from a snapshot: {0}")]
    Restore(#[source] mvcc::SnapshotError),
    #[error("reading the received snapshot: {0}")]
    Spool(#[source] SpoolError),
    #[error("the snapshot's store has applied index {store}, its metadata says {metadata}")]
    AppliedIndex { store: u64, metadata: u64 },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("WAL append failed: {0}")]
    Wal(#[source] cairn_wal::AppendError),
    #[error("installing the snapshot's member table: {0}")]
    MemberTable(String),
    #[error("the snapshot install's worker failed: {0}")]
    Worker(String),
}

impl InstallError {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> InstallError {
        move |source| InstallError::Io { what, source }
    }
}

/// Runs a step of an install off the core (`OffCoreJobs`) and waits for it
/// there, leaving the core to its other shards.
async fn off_core<T: Send + 'static>(
    jobs: &super::OffCoreJobs,
    step: impl FnOnce() -> Result<T, InstallError> + Send + 'static,
) -> Result<T, InstallError> {
    jobs.spawn(step)
        .await
        .unwrap_or_else(|e| Err(InstallError::Worker(e.to_string())))
}

/// Builds and syncs, in `new_dir` beside the shard's directory, the store a
/// received snapshot carries, its snapshot metadata and (shard 0) the member
/// table that came with it; deletes the spool file once read.
fn build_store(
    new_dir: &Path,
    shard: ShardId,
    cfg: mvcc::Config,
    md: &SnapshotMetadata,
    incoming: IncomingSnapshot,
) -> Result<mvcc::Restored, InstallError> {
    let IncomingSnapshot { chunks, members } = incoming;
    let _ = std::fs::remove_dir_all(new_dir);
    // One store chunk at a time from the spool file. A chunk that cannot be
    // read ends the stream early, which the restore refuses too; the spool's
    // error says why.
    let mut reader = chunks.reader();
    let restored = mvcc::Store::restore_detached(new_dir, shard, cfg, &mut reader);
    if let Some(e) = reader.into_error() {
        return Err(InstallError::Spool(e));
    }
    let store = restored.map_err(InstallError::Restore)?;
    // Deleted before the directories are swapped, so that nothing else
    // touches the shard's directory during the swap.
    chunks.remove();
    if store.applied_index() != md.index {
        return Err(InstallError::AppliedIndex {
            store: store.applied_index(),
            metadata: md.index,
        });
    }
    write_snapshot_meta(new_dir, md).map_err(InstallError::io("writing snapshot metadata"))?;
    if let (0, Some(table)) = (shard, &members) {
        // The table as of the snapshot's index (see applied_conf_change).
        crate::durable_file::write_checked(new_dir, "member-table.pending", &table.encode_to_vec())
            .map_err(InstallError::io("writing the snapshot's member table"))?;
    }
    Ok(store)
}

/// A snapshot received from a leader, waiting for Raft to accept it.
/// Dropping it deletes its spool file.
pub(super) struct IncomingSnapshot {
    pub(super) chunks: SpooledChunks,
    pub(super) members: Option<cairn_proto::cairnpb::MemberTable>,
}

/// A snapshot stream read from the store as it is sent: the length-prefixed
/// `MsgSnap`, then each store chunk length-prefixed (the layout of a spool
/// file, see [`super::spool`]). The store snapshot it reads from never
/// blocks the shard's writes. It cannot start over once read from: a transfer
/// that fails part way fails, and Raft asks for a fresh snapshot.
pub(super) struct StoreSnapshotSource {
    pub(super) message: Option<Bytes>,
    pub(super) stream: mvcc::SnapshotStream,
    /// The data of a chunk whose length prefix went out last.
    pub(super) pending: Option<Bytes>,
    pub(super) started: bool,
    pub(super) bytes: u64,
    /// When the transfer last took a chunk.
    pub(super) progress: Rc<std::cell::Cell<Instant>>,
}

impl cairn_net::StreamSource for StoreSnapshotSource {
    fn rewind(&mut self) -> std::io::Result<()> {
        if self.started {
            return Err(std::io::Error::other(
                "a store snapshot cannot start over; a fresh one is sent instead",
            ));
        }
        Ok(())
    }

    fn next_chunk(&mut self, _max_bytes: usize) -> std::io::Result<Option<Bytes>> {
        self.started = true;
        self.progress.set(Instant::now());
        if let Some(m) = self.message.take() {
            let mut out = Vec::with_capacity(4 + m.len());
            out.extend_from_slice(&(m.len() as u32).to_le_bytes());
            out.extend_from_slice(&m);
            self.bytes += out.len() as u64;
            return Ok(Some(Bytes::from(out)));
        }
        if let Some(data) = self.pending.take() {
            self.bytes += data.len() as u64;
            return Ok(Some(data));
        }
        match self.stream.next() {
            None => Ok(None),
            Some(Err(e)) => Err(std::io::Error::other(format!(
                "reading the store for a snapshot: {e}"
            ))),
            Some(Ok(chunk)) => {
                self.bytes += 4;
                let prefix = Bytes::copy_from_slice(&(chunk.len() as u32).to_le_bytes());
                self.pending = Some(Bytes::from(chunk));
                Ok(Some(prefix))
            }
        }
    }
}

impl Shard {
    /// Streams the store to a follower that is behind the log. The snapshot
    /// Raft asked for covers up to the compaction index; the store has applied
    /// further, so the message is restamped with the store's applied index and
    /// its term: the follower then resumes the log right after what it got.
    pub(super) fn send_snapshot(&mut self, mut m: raft::Message) {
        let to = m.to;
        self.reap_snapshot_sends();
        if self.snapshots_in_flight.contains(&to) {
            return;
        }
        if !self.peers.has_link(self.id, to) {
            self.node.report_snapshot(to, raft::SnapshotStatus::Failure);
            return;
        }
        let stream = self.store.snapshot_stream();
        let index = stream.applied_index();
        let Some(term) = self.node.term_of(index) else {
            tracing::warn!(
                shard = self.id,
                index,
                "no term for the store's applied index; snapshot not sent"
            );
            self.node.report_snapshot(to, raft::SnapshotStatus::Failure);
            return;
        };
        // The member table rides along: a member that catches up by snapshot
        // may have missed the changes that added members.
        let mut table = self.members.table();
        if self.id == 0 {
            table.auth = self.auth.as_ref().map(|a| a.snapshot());
        }
        m.context = Bytes::from(table.encode_to_vec());
        m.snapshot = Some(Snapshot {
            data: Bytes::new(),
            metadata: Some(SnapshotMetadata {
                conf_state: Some(self.node.status().conf_state),
                index,
                term,
            }),
        });
        tracing::info!(shard = self.id, to, index, "sending snapshot");
        self.snapshots_in_flight.insert(to);
        let reports = self.snapshot_reports_tx.clone();
        let peers = self.peers.clone();
        let shard = self.id;
        let progress = Rc::new(std::cell::Cell::new(Instant::now()));
        let mut source = StoreSnapshotSource {
            message: Some(Bytes::from(m.encode_to_vec())),
            stream,
            pending: None,
            started: false,
            bytes: 0,
            progress: progress.clone(),
        };
        let task = self.snapshot_sends.spawn_local(async move {
            let stalled = async {
                loop {
                    let idle = progress.get().elapsed();
                    if idle >= SNAPSHOT_SEND_IDLE_TIMEOUT {
                        return;
                    }
                    tokio::time::sleep(SNAPSHOT_SEND_IDLE_TIMEOUT - idle).await;
                }
            };
            let Some(transfer) = peers.send_snapshot(shard, to, &mut source) else {
                tracing::warn!(shard, to, "no link to the member; snapshot not sent");
                let _ = reports.send((to, raft::SnapshotStatus::Failure));
                return;
            };
            // Biased: the same order every time, so a simulated run
            // replays exactly.
            let sent = tokio::select! {
                biased;
                r = transfer => Ok(r),
                () = stalled => Err(()),
            };
            let status = match sent {
                Ok(Ok(())) => {
                    tracing::info!(shard, to, index, bytes = source.bytes, "snapshot sent");
                    raft::SnapshotStatus::Finish
                }
                Ok(Err(e)) => {
                    tracing::warn!(shard, to, error = %e, "snapshot transfer failed");
                    raft::SnapshotStatus::Failure
                }
                Err(_) => {
                    tracing::warn!(
                        shard,
                        to,
                        idle_s = SNAPSHOT_SEND_IDLE_TIMEOUT.as_secs(),
                        "snapshot transfer made no progress; abandoned"
                    );
                    raft::SnapshotStatus::Failure
                }
            };
            let _ = reports.send((to, status));
        });
        self.snapshot_send_to.insert(task.id(), to);
    }

    /// Forgets the snapshot sends that ended. One that panicked sent no
    /// report: Raft hears of its failure here, so the follower gets a fresh
    /// snapshot later.
    fn reap_snapshot_sends(&mut self) {
        while let Some(ended) = self.snapshot_sends.try_join_next_with_id() {
            let (id, failed) = match ended {
                Ok((id, ())) => (id, false),
                Err(e) => (e.id(), true),
            };
            let Some(to) = self.snapshot_send_to.remove(&id) else {
                continue;
            };
            if failed {
                tracing::error!(
                    shard = self.id,
                    to,
                    "a snapshot send stopped without a report"
                );
                self.snapshots_in_flight.remove(&to);
                self.node.report_snapshot(to, raft::SnapshotStatus::Failure);
            }
        }
    }

    /// Replaces the store with the snapshot Raft accepted, as one crash-atomic
    /// step. The commit point is the rename of the new store's directory into
    /// place; around it:
    /// 1. The new store, its snapshot metadata and (shard 0) the member table
    ///    that came with it are built and synced beside the old store.
    /// 2. A Truncate record past the snapshot's index is made durable in the
    ///    WAL: the entries it drops are not in the leader's log (Raft installs
    ///    a snapshot only when this log lacks its index and term), so they
    ///    were never committed, and an old store restarting with them gone
    ///    simply catches up again. Without it, a store swapped in before the
    ///    WAL says so would restart behind a log tail of older terms, and this
    ///    member would vote as if its log ended there.
    /// 3. The directories are swapped and the parent directory synced.
    /// 4. `member.toml` is rewritten from the table, which is then removed; a
    ///    crash before that finds the table at the next start.
    ///
    /// The caller then makes the Ready's hard state (its commit is the
    /// snapshot's index) and entries durable.
    pub(super) async fn install_snapshot(
        &mut self,
        snapshot: &Snapshot,
    ) -> Result<(), InstallError> {
        let md = snapshot.metadata.clone().unwrap_or_default();
        // A compaction's metadata write in flight ends before the directory
        // it writes into is swapped away.
        self.finish_compaction().await;
        let incoming = self
            .held_snapshot
            .take(md.index)
            .map_err(InstallError::NotHeld)?;
        tracing::info!(
            shard = self.id,
            index = md.index,
            bytes = incoming.chunks.len_bytes(),
            "installing snapshot"
        );
        let new_dir = store_swap::swap_dir(&self.dir, "new");
        let (id, cfg, meta) = (self.id, self.store_config.clone(), md.clone());
        // Reading gigabytes from the spool, writing and syncing the new store
        // and its files: on the blocking pool, so the core's other shards go
        // on while this one waits.
        let store = off_core(&self.off_core, move || {
            build_store(&new_dir, id, cfg, &meta, incoming)
        })
        .await?
        .into_store();
        crate::server::crash_point::reached("snapshot-built");
        let truncate = [cairn_wal::Record::Truncate {
            shard: u64::from(self.id),
            index: md.index + 1,
        }];
        self.last_queued_lsn = self
            .wal
            .append(&truncate)
            .await
            .map_err(InstallError::Wal)?;
        crate::server::crash_point::reached("snapshot-truncated");
        // The replaced store's queued syncs finish on its own thread: what it
        // holds is superseded, and waiting for them here would stop the core.
        std::mem::replace(&mut self.store, store).discard();
        self.publish_revision();
        if let Some(defrag) = self.defrag.take() {
            // The store it was shrinking is gone; the new one is compact.
            for reply in defrag.into_replies() {
                let _ = reply.send(Ok(()));
            }
        }
        let dir = self.dir.clone();
        let (members, auth) = (self.members.clone(), self.auth.clone());
        let shard0 = self.id == 0;
        off_core(&self.off_core, move || {
            store_swap::swap_in(&mut store_swap::RealFs, &dir)
                .map_err(InstallError::io("swapping in the snapshot's store"))?;
            crate::server::crash_point::reached("snapshot-swapped");
            if shard0 {
                apply_pending_table(&dir, &members, auth.as_deref())
                    .map_err(InstallError::MemberTable)?;
            }
            Ok(())
        })
        .await?;
        self.snapshot_meta = md.clone();
        self.conf_history.clear();
        let cs = md.conf_state.clone().unwrap_or_default();
        self.membership_changed(&cs);
        for id in cs.voters.iter().chain(&cs.learners) {
            if *id == self.member_id {
                continue;
            }
            if let Some(m) = self.members.get(*id) {
                self.peers.connect(self.id, *id, &m.peer_urls);
            }
        }
        tracing::info!(
            shard = self.id,
            index = md.index,
            term = md.term,
            "snapshot installed"
        );
        Ok(())
    }
}

//! Applying committed entries to the shard's store, and what follows from it:
//! store commits, quota, defragment and log compaction.

use super::*;

/// Applied bytes after which the store commits at once rather than on the next
/// tick. A commit builds its pages on the core (the sync is the syncer's): at
/// 16 MiB a commit of 100 ms of puts held the core 4-6 ms (up to 16), the tail
/// of every request behind it. 256 KiB (about 700 puts of 256 B) keeps a
/// commit near half a millisecond, which it takes in steps between the core's
/// other work (`Shard::store_commit_step`).
pub const STORE_COMMIT_PENDING_BYTES: usize = 256 * 1024;

/// Applied bytes, those of a running store commit included, at which that
/// commit's remaining steps are taken at once rather than when the core has
/// nothing else to do: applies outrunning the steps end there.
pub const STORE_COMMIT_FINISH_BYTES: usize = 2 * STORE_COMMIT_PENDING_BYTES;

/// Longest time applied entries wait for a store commit; also how much a
/// restart may have to replay from the WAL.
pub const STORE_COMMIT_INTERVAL: Duration = Duration::from_millis(100);

/// A defragment in progress and the clients waiting for it.
pub(super) struct Defrag {
    run: mvcc::DefragRun,
    replies: Vec<Reply<()>>,
    started: Instant,
}

impl Defrag {
    pub(super) fn into_replies(self) -> Vec<Reply<()>> {
        self.replies
    }
}

impl Shard {
    pub(super) fn apply(&mut self, entries: &[raft::Entry]) {
        if entries.is_empty() {
            return;
        }
        for e in entries {
            if self.failed.is_some() {
                return;
            }
            match EntryType::try_from(e.entry_type) {
                Ok(EntryType::EntryConfChange) => {
                    match ConfChange::decode(e.data.clone()) {
                        Ok(cc) => {
                            let cs = self.node.apply_conf_change(&cc);
                            self.applied_conf_change(&cc, &cs);
                            self.conf_history.push((e.index, cs));
                        }
                        Err(err) => self.fail(format!(
                            "conf change entry {} does not decode: {err}",
                            e.index
                        )),
                    }
                    self.store.set_applied_index(e.index);
                }
                _ => self.apply_normal(e),
            }
        }
        if self.store.pending_bytes() >= STORE_COMMIT_PENDING_BYTES {
            self.commit_store();
        }
        self.check_quota();
        self.watchers.notify(self.id, &mut self.store);
    }

    /// Begins a commit of what was applied so far to the store file, carried
    /// out in steps ([`Shard::store_commit_step`]) when the core has nothing
    /// else to do, so a request that arrives meanwhile waits for one step,
    /// not the whole commit. Off the write path: the WAL already made every
    /// applied entry durable, so a commit only bounds how much a restart
    /// replays. While the store's syncer is behind (a slow disk), the commit
    /// is left for a later turn rather than wait on this core, where every
    /// other shard of the core would wait too.
    pub(super) fn commit_store(&mut self) {
        if self.store.commit_running() {
            if self.store.pending_bytes() < STORE_COMMIT_FINISH_BYTES {
                return;
            }
            // Applies outran the steps (the core had no turn to spare): the
            // running commit ends now, and the next begins.
            self.finish_store_commit();
        }
        if self.failed.is_some() || self.files_behind() {
            return;
        }
        match self.store.commit_begin_unless_busy() {
            Ok(true) => self.store_commit_step(),
            Ok(false) => {}
            Err(e) => self.fail(format!("store commit failed: {e}")),
        }
    }

    /// Carries the running store commit on by one step.
    pub(super) fn store_commit_step(&mut self) {
        match self.store.commit_step() {
            Ok(Some(step)) => {
                let Some(m) = &self.metrics else {
                    return;
                };
                m.backend_commit_step(step.took);
                let Some(spent) = step.done else {
                    return;
                };
                m.backend_commit(spent);
                m.set_db_size(self.store.size_bytes(), self.store.size_in_use_bytes());
            }
            Ok(None) => {}
            Err(e) => self.fail(format!("store commit failed: {e}")),
        }
    }

    /// Carries a compaction's pass over the key index on by a step.
    pub(super) fn store_compaction_step(&mut self) {
        let Some(step) = self.store.compaction_step() else {
            return;
        };
        self.compaction_stepped_at = Instant::now();
        if let Some(m) = &self.metrics {
            m.compaction_index_step(step.took);
        }
        if step.done.is_some() {
            // Its dropped records leave the tree at the next commit.
            self.commit_store();
        }
    }

    /// Takes the running store commit's remaining steps at once.
    fn finish_store_commit(&mut self) {
        while self.store.commit_running() && self.failed.is_none() {
            self.store_commit_step();
        }
    }

    /// Commits everything applied so far at once (the shard is stopping):
    /// the running commit, then the rest; a restart then replays less.
    pub(super) fn commit_store_now(&mut self) {
        self.finish_store_commit();
        self.commit_store();
        self.finish_store_commit();
    }

    /// Whether the store must not commit yet: a membership change is still
    /// being written to `member.toml`, or (shard 0) an auth change it
    /// applied to `auth.state`. A commit past it would keep the log from
    /// replaying it after a crash: shard 0's apply writes the table, and
    /// every shard's apply of a change links the shard to a member added (a
    /// restart dials only the members the file names). A file that cannot
    /// be written fails the shard, as a failed store commit does.
    fn files_behind(&mut self) -> bool {
        let auth = match self.auth.as_ref().filter(|_| self.id == 0) {
            Some(a) => a.unwritten(),
            None => Ok(false),
        };
        match auth.and_then(|a| Ok(a || self.members.unwritten()?)) {
            Ok(behind) => behind,
            Err(reason) => {
                self.fail(reason);
                true
            }
        }
    }

    /// Starts defragmenting the store (or joins the run in progress); the
    /// reply goes out when the run is done. The run goes on in steps on the
    /// ticks ([`Shard::defragment_steps`]), so the core never waits for the
    /// store's disk and other shards' ticks keep their pace.
    pub(super) fn defragment(&mut self, reply: Reply<()>) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(self.storage_error(reason.clone())));
            return;
        }
        match &mut self.defrag {
            Some(run) => run.replies.push(reply),
            None => {
                self.defrag = Some(Defrag {
                    run: self.store.defragment_start(),
                    replies: vec![reply],
                    started: Instant::now(),
                })
            }
        }
        self.defragment_steps();
    }

    /// Carries the defragment in progress on for up to [`DEFRAG_TURN`]: steps
    /// of [`DEFRAG_STEP_PAGES`], each written here and synced by the store's
    /// syncer; a step that would wait for a sync ends the turn.
    pub(super) fn defragment_steps(&mut self) {
        // A compaction's pass over the key index goes first, so that the
        // defragment moves none of the records it drops.
        if self.defrag.is_none() || self.store.compaction_running() || self.files_behind() {
            return;
        }
        let Some(mut defrag) = self.defrag.take() else {
            return;
        };
        let turn = Instant::now();
        let outcome = loop {
            match self
                .store
                .defragment_step(&mut defrag.run, DEFRAG_STEP_PAGES)
            {
                Ok(mvcc::DefragProgress::Moved) if turn.elapsed() < DEFRAG_TURN => continue,
                Ok(mvcc::DefragProgress::Moved | mvcc::DefragProgress::Waiting) => {
                    self.defrag = Some(defrag);
                    return;
                }
                Ok(mvcc::DefragProgress::Done(report)) => break Ok(report),
                Err(e) => break Err(e),
            }
        };
        let result = match outcome {
            Ok(report) => {
                tracing::info!(
                    shard = self.id,
                    before_bytes = report.file_bytes_before,
                    after_bytes = report.file_bytes_after,
                    steps = report.steps,
                    took_ms = defrag.started.elapsed().as_millis() as u64,
                    "store defragmented"
                );
                if let Some(m) = &self.metrics {
                    m.set_db_size(self.store.size_bytes(), self.store.size_in_use_bytes());
                }
                Ok(())
            }
            Err(e) => {
                // The store may be part way through moving pages: like a
                // failed commit, nothing more is trusted until restart.
                let reason = format!("defragment failed: {e}");
                self.fail(reason.clone());
                Err(self.storage_error(reason))
            }
        };
        for reply in defrag.replies {
            let _ = reply.send(result.clone());
        }
    }

    pub(super) fn check_quota(&mut self) {
        if !self.nospace_alarm && self.store.size_in_use_bytes() > self.quota_backend_bytes {
            tracing::warn!(
                shard = self.id,
                size_bytes = self.store.size_in_use_bytes(),
                quota_bytes = self.quota_backend_bytes,
                "backend quota exceeded: NOSPACE alarm raised; compact, then disarm the alarm"
            );
            self.nospace_alarm = true;
            if let Some(r) = &self.readiness {
                r.set_alarm(crate::ops::readiness::Alarm::NoSpace, true);
            }
        }
    }

    pub(super) fn apply_normal(&mut self, e: &raft::Entry) {
        if self.store.pending_bytes() >= STORE_COMMIT_PENDING_BYTES {
            self.commit_store();
        }
        if e.data.is_empty() {
            self.store.set_applied_index(e.index);
            return;
        }
        let mut req = match ShardRequest::decode(e.data.clone()) {
            Ok(r) => r,
            Err(err) => {
                self.fail(format!("entry {} does not decode: {err}", e.index));
                return;
            }
        };
        let request = match entry::known_request(&mut req, self.id, e.index) {
            Ok(r) => r,
            Err(why) => {
                self.fail(why);
                return;
            }
        };
        let mine = req.member == self.member_id;
        let physical = match &request {
            shard_request::Request::Compaction(c) if c.physical => Some(c.revision),
            _ => None,
        };
        let result = self.apply_request(e.index, req.revision, request);
        if mine {
            if let Some(w) = self.waiters.remove(&req.id) {
                if let Some(m) = &self.metrics {
                    m.proposal_applied(w.since.elapsed());
                }
                match physical {
                    Some(revision)
                        if result.is_ok() && self.store.compacted_out_through() < revision =>
                    {
                        self.physical_compactions.push((revision, w.reply, result));
                    }
                    _ => {
                        // Published before the answer, which may leave
                        // before the step ends: a read the client sends
                        // next must find the shard at this revision.
                        if self.failed.is_none() {
                            self.publish_revision();
                        }
                        let _ = w.reply.send(result);
                    }
                }
            }
        }
    }

    /// Answers what waits for compaction, once it can be, after every turn
    /// (a pass ends in a step, its records leave in a commit, an installed
    /// snapshot replaces the store): the HashKVs that arrived during a pass
    /// over the key index, and the compactions asked with etcd's `physical`
    /// once what they dropped is out of the store's revision tree.
    pub(super) fn answer_compaction_waiters(&mut self) {
        if !self.hashes_waiting.is_empty() && !self.store.compaction_running() {
            for (revision, reply) in std::mem::take(&mut self.hashes_waiting) {
                self.serve_hash_kv(revision, reply);
            }
        }
        if !self.physical_compactions.is_empty() {
            let through = self.store.compacted_out_through();
            let (done, waiting) = std::mem::take(&mut self.physical_compactions)
                .into_iter()
                .partition(|(revision, _, _)| *revision <= through);
            self.physical_compactions = waiting;
            for (_, reply, result) in done {
                let _ = reply.send(result);
            }
        }
    }

    pub(super) fn apply_error(&mut self, e: mvcc::ApplyError) -> ApiError {
        match e {
            mvcc::ApplyError::Compacted { .. } => ApiError::Compacted,
            mvcc::ApplyError::FutureRevision { .. } => ApiError::FutureRev,
            mvcc::ApplyError::EmptyKey => ApiError::EmptyKey,
            mvcc::ApplyError::KeyNotFound => ApiError::KeyNotFound,
            mvcc::ApplyError::LeaseNotFound { .. } => ApiError::LeaseNotFound,
            mvcc::ApplyError::LeaseExists { .. } => ApiError::LeaseExist,
            mvcc::ApplyError::ValueProvided => ApiError::ValueProvided,
            mvcc::ApplyError::LeaseProvided => ApiError::LeaseProvided,
            mvcc::ApplyError::DuplicateKey => ApiError::DuplicateKey,
            mvcc::ApplyError::RequestTooLarge { .. } => ApiError::RequestTooLarge,
            mvcc::ApplyError::Read(r) => self.read_error(r),
            other if other.is_request_error() => self.storage_error(other.to_string()),
            other => {
                let reason = other.to_string();
                self.fail(reason.clone());
                self.storage_error(reason)
            }
        }
    }

    /// Applies one request at `revision` (0: the store's next revision, as
    /// with one shard).
    pub(super) fn apply_request(
        &mut self,
        index: u64,
        revision: i64,
        r: shard_request::Request,
    ) -> Result<WriteResult, ApiError> {
        use shard_request::Request as R;
        // The leader's lease clock follows the grants and revokes it applies.
        let lease_change = match &r {
            R::LeaseGrant(g) => Some((g.id, Some(g.ttl))),
            R::LeaseRevoke(g) => Some((g.id, None)),
            _ => None,
        };
        let op = match r {
            R::Put(p) => mvcc::Op::Put(convert::put_from_pb(&p)),
            R::DeleteRange(d) => mvcc::Op::DeleteRange(convert::delete_from_pb(&d)),
            R::Txn(t) => mvcc::Op::Txn(convert::txn_from_pb(&t)),
            R::Compaction(c) => mvcc::Op::Compact(mvcc::CompactionRequest {
                revision: c.revision,
            }),
            R::LeaseGrant(g) => mvcc::Op::LeaseGrant {
                id: g.id,
                ttl_secs: g.ttl,
            },
            R::LeaseRevoke(g) => mvcc::Op::LeaseRevoke { id: g.id },
            R::CrossPart(part) => return self.apply_cross_part(index, revision, part),
            R::CrossParts(parts) => return self.apply_cross_parts(index, parts),
            R::CrossDone(done) => return Ok(self.apply_cross_done(index, done)),
            R::Close(_) => {
                return match self.store.close_at(index, revision) {
                    Ok(()) => Ok(WriteResult::Applied {
                        revision: self.store.current_revision(),
                    }),
                    Err(e) => Err(self.apply_error(e)),
                };
            }
            R::Alarm(a) => {
                self.store.set_applied_index(index);
                if a.alarm == pb::AlarmType::Nospace as i32 {
                    match pb::alarm_request::AlarmAction::try_from(a.action) {
                        Ok(pb::alarm_request::AlarmAction::Activate) => self.nospace_alarm = true,
                        Ok(pb::alarm_request::AlarmAction::Deactivate) => {
                            self.nospace_alarm = false
                        }
                        _ => {}
                    }
                }
                return Ok(WriteResult::Applied {
                    revision: self.store.current_revision(),
                });
            }
            R::Auth(change) => {
                self.store.set_applied_index(index);
                let applied = match &self.auth {
                    Some(auth) if self.id == 0 => auth.apply(index, &change),
                    _ => Err(ApiError::Unsupported("auth changes outside shard 0")),
                };
                return applied.map(|()| WriteResult::Applied {
                    revision: self.store.current_revision(),
                });
            }
            R::ConfChange(_) => {
                // Conf changes arrive as conf change entries; one inside a
                // normal entry is a proposer bug, recorded and skipped.
                tracing::error!(
                    shard = self.id,
                    index,
                    "conf change inside a normal entry skipped"
                );
                self.store.set_applied_index(index);
                return Err(ApiError::Unsupported("conf change as a normal entry"));
            }
        };
        let applied = if revision > 0 {
            self.store.apply_at(index, revision, &op)
        } else {
            self.store.apply(index, &op)
        };
        if let Some((id, ttl)) = lease_change {
            match (ttl, &applied) {
                (Some(ttl), Ok(_)) => self.lease_clock.granted(id, ttl, Instant::now()),
                (Some(_), Err(_)) => {}
                (None, _) => self.lease_clock.revoked(id),
            }
        }
        match applied {
            Ok(result) => {
                let header = self.header(0);
                Ok(match result {
                    mvcc::OpResult::Put(r) => WriteResult::Put(convert::put_to_pb(r, header)),
                    mvcc::OpResult::DeleteRange(r) => {
                        WriteResult::DeleteRange(convert::delete_to_pb(r, header))
                    }
                    mvcc::OpResult::Txn(r) => WriteResult::Txn(convert::txn_to_pb(r, header)),
                    mvcc::OpResult::Compact(r) => WriteResult::Compaction(pb::CompactionResponse {
                        header: Some(self.header(r.revision)),
                    }),
                    mvcc::OpResult::LeaseGrant { revision }
                    | mvcc::OpResult::LeaseRevoke { revision, .. }
                    | mvcc::OpResult::LeaseCheckpoint { revision } => {
                        WriteResult::Applied { revision }
                    }
                })
            }
            // A request error still consumed the entry; the store recorded it
            // applied.
            Err(e) => Err(self.apply_error(e)),
        }
    }

    /// The membership as of entry `index` (at or after the log's snapshot
    /// metadata, at or before the applied index): a restart rebuilds the
    /// membership from the metadata plus the conf changes of the log after
    /// it, so the metadata must hold the membership at its own index.
    fn conf_state_at(&self, index: u64) -> ConfState {
        conf_state_at(&self.conf_history, &self.snapshot_meta, index)
    }

    /// Compacts the in-memory log once enough entries are applied, keeping
    /// [`CATCH_UP_ENTRIES`] for slow followers, and lets the WAL release the
    /// segments the shard no longer needs. The snapshot metadata that records
    /// the compaction is written and synced on a blocking thread, off the
    /// core; [`Shard::finish_compaction`] compacts once it is durable.
    pub(super) fn maybe_compact_log(&mut self) {
        if self.compaction.is_some() {
            return;
        }
        let applied = self.node.applied_index();
        // A small --snapshot-count also keeps fewer entries for slow followers.
        let keep = CATCH_UP_ENTRIES.min(self.snapshot_count);
        // Saturating: a --snapshot-count near u64::MAX means never.
        let due = self
            .snapshot_meta
            .index
            .saturating_add(self.snapshot_count)
            .saturating_add(keep);
        if applied < due {
            return;
        }
        let compact_to = applied - keep;
        // The store must have the entries up to compact_to durably applied
        // before the WAL may drop them: its commit finishes in the background,
        // so compaction goes only as far as the store has proven durable, and
        // waits for a later turn otherwise.
        self.commit_store();
        if self.failed.is_some() {
            return;
        }
        let compact_to = compact_to.min(self.store.durable_index());
        if compact_to <= self.snapshot_meta.index {
            return;
        }
        let Some(term) = self.node.term_of(compact_to) else {
            return;
        };
        let md = SnapshotMetadata {
            conf_state: Some(self.conf_state_at(compact_to)),
            index: compact_to,
            term,
        };
        let dir = self.dir.clone();
        let written = md.clone();
        let faults = self.store_config.sync_faults.clone();
        let write = self.off_core.spawn(move || {
            if let Some(control) = &faults {
                let name = dir.file_name().unwrap_or_default().to_string_lossy();
                mvcc::fault::SyncFault::before_sync(control, &format!("{name}/raft-snapshot"))?;
            }
            write_snapshot_meta(&dir, &written)
        });
        self.compaction = Some((md, write));
    }

    /// Waits for the snapshot metadata being written, if any, and compacts
    /// the log up to it.
    pub(super) async fn finish_compaction(&mut self) {
        if self.compaction.is_some() {
            let (md, written) = compaction_written(&mut self.compaction).await;
            self.compacted(md, written);
        }
    }

    /// Compacts the log up to `md` once its metadata write ended well.
    pub(super) fn compacted(
        &mut self,
        md: SnapshotMetadata,
        written: Result<std::io::Result<()>, tokio::task::JoinError>,
    ) {
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(shard = self.id, error = %e, "writing snapshot metadata failed; log not compacted");
                return;
            }
            Err(e) => {
                tracing::warn!(shard = self.id, error = %e, "the snapshot metadata writer stopped; log not compacted");
                return;
            }
        }
        // A snapshot installed meanwhile moved the log past this point.
        if md.index <= self.snapshot_meta.index || self.failed.is_some() {
            return;
        }
        let compact_to = md.index;
        let conf_state = md.conf_state.clone().unwrap_or_default();
        if let Err(e) = self
            .node
            .store_mut()
            .create_snapshot(compact_to, conf_state, Bytes::new())
        {
            tracing::warn!(shard = self.id, error = %e, "recording the log snapshot failed; log not compacted");
            return;
        }
        if let Err(e) = self.node.store_mut().compact(compact_to) {
            tracing::warn!(shard = self.id, error = %e, "in-memory log compaction failed");
            return;
        }
        self.snapshot_meta = md;
        self.conf_history.retain(|(index, _)| *index > compact_to);
        self.wal.release(u64::from(self.id), compact_to);
        tracing::info!(shard = self.id, index = compact_to, "raft log compacted");
    }
}

/// A log compaction whose snapshot metadata is being written off the core.
pub(super) type Compaction = (
    SnapshotMetadata,
    super::off_core::OffCoreJob<std::io::Result<()>>,
);

/// Waits for the metadata write of the compaction in `c` and takes it.
/// Borrows only that field, so the shard's loop can wait on it beside its
/// other inputs; dropped before the write ends, it leaves the compaction in
/// place.
pub(super) async fn compaction_written(
    c: &mut Option<Compaction>,
) -> (
    SnapshotMetadata,
    Result<std::io::Result<()>, tokio::task::JoinError>,
) {
    let written = match c.as_mut() {
        Some((_, write)) => write.await,
        None => std::future::pending().await,
    };
    let (md, _) = c.take().expect("the compaction awaited above");
    (md, written)
}

/// The membership after the last conf change at or before `index`, else the
/// one recorded with the log's snapshot metadata.
fn conf_state_at(history: &[(u64, ConfState)], meta: &SnapshotMetadata, index: u64) -> ConfState {
    history
        .iter()
        .rev()
        .find(|(i, _)| *i <= index)
        .map(|(_, cs)| cs.clone())
        .or_else(|| meta.conf_state.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(voters: &[u64], learners: &[u64]) -> ConfState {
        ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
        }
    }

    #[test]
    fn compaction_records_the_membership_at_its_own_index() {
        let meta = SnapshotMetadata {
            conf_state: Some(cs(&[1, 2, 3], &[])),
            index: 100,
            term: 2,
        };
        // A learner added at 150 and promoted at 180; applied up to 200.
        let history = vec![(150, cs(&[1, 2, 3], &[4])), (180, cs(&[1, 2, 3, 4], &[]))];
        assert_eq!(conf_state_at(&history, &meta, 120), cs(&[1, 2, 3], &[]));
        assert_eq!(conf_state_at(&history, &meta, 150), cs(&[1, 2, 3], &[4]));
        assert_eq!(conf_state_at(&history, &meta, 179), cs(&[1, 2, 3], &[4]));
        assert_eq!(conf_state_at(&history, &meta, 200), cs(&[1, 2, 3, 4], &[]));
    }
}

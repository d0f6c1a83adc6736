//! Opening a shard: its store, its Raft log rebuilt from the snapshot
//! metadata and the WAL, and its Raft node.

use super::*;

impl Shard {
    /// Opens the shard's store, rebuilds its Raft log from the snapshot
    /// metadata and the WAL, and starts its Raft node.
    pub fn open(setup: &mut ShardSetup) -> Result<Shard, ShardOpenError> {
        let shard = setup.shard;
        store_swap::finish_interrupted_swap(&mut store_swap::RealFs, &setup.dir).map_err(|e| {
            ShardOpenError::Recovery {
                shard,
                what: format!(
                    "finishing an interrupted snapshot install in {}: {e}",
                    setup.dir.display()
                ),
            }
        })?;
        std::fs::create_dir_all(&setup.dir).map_err(|e| ShardOpenError::Recovery {
            shard,
            what: format!("creating {}: {e}", setup.dir.display()),
        })?;
        // Snapshots being received when the member stopped: Raft sends a
        // fresh one if this member still needs it.
        let removed =
            spool::remove_leftovers(&setup.dir).map_err(|e| ShardOpenError::Recovery {
                shard,
                what: format!(
                    "removing snapshot spool files left in {}: {e}",
                    setup.dir.display()
                ),
            })?;
        if removed > 0 {
            tracing::info!(
                shard,
                files = removed,
                "removed unfinished snapshot spool files"
            );
        }
        if shard == 0 {
            // A snapshot install that a crash interrupted after its swap left
            // the member table it came with: member.toml follows it now.
            let table = apply_pending_table(&setup.dir, &setup.members, setup.auth.as_deref())
                .map_err(|what| ShardOpenError::Recovery { shard, what })?;
            for m in table.iter().flat_map(|t| &t.members) {
                if m.id != setup.member_id {
                    setup.peers.connect(shard, m.id, &m.peer_urls);
                }
            }
        }
        // Request limits are the API's (checked before proposing): apply
        // must not depend on this member's flags.
        let store_cfg = mvcc::Config {
            sync_faults: setup.disk_faults.clone(),
            background_sync: setup.store_sync_thread,
            ..mvcc::Config::default()
        };
        let (snapshot_reports_tx, snapshot_reports) = mpsc::unbounded_channel();
        let store = mvcc::Store::open(&setup.dir, shard, store_cfg.clone()).map_err(|source| {
            ShardOpenError::Store {
                shard,
                dir: setup.dir.clone(),
                source,
            }
        })?;
        let applied = store.applied_index();

        let meta = read_snapshot_meta(shard, &setup.dir)?;
        let snapshot_meta = meta.unwrap_or_else(|| SnapshotMetadata {
            conf_state: Some(ConfState {
                voters: setup.initial_voters.clone(),
                learners: Vec::new(),
            }),
            index: 0,
            term: 0,
        });
        let conf_state = snapshot_meta.conf_state.clone().unwrap_or_default();
        let mut storage = MemStorage::new_with_conf_state(conf_state);
        if snapshot_meta.index > 0 {
            storage
                .apply_snapshot(Snapshot {
                    data: Bytes::new(),
                    metadata: Some(snapshot_meta.clone()),
                })
                .map_err(|e| ShardOpenError::Recovery {
                    shard,
                    what: format!("installing snapshot metadata: {e}"),
                })?;
        }
        let recovered = std::mem::take(&mut setup.recovered);
        let mut entries = Vec::with_capacity(recovered.entries.len());
        for e in recovered.entries {
            if e.index > snapshot_meta.index {
                entries.push(entry::from_wal(shard, e)?);
            }
        }
        if let Some(first) = entries.first() {
            if first.index != snapshot_meta.index + 1 {
                return Err(ShardOpenError::Recovery {
                    shard,
                    what: format!(
                        "the WAL's entries start at {} but the log is compacted only to {}: \
                         entries in between are missing",
                        first.index, snapshot_meta.index
                    ),
                });
            }
        }
        // Terms never go down along a log. A tail of an older term behind the
        // snapshot is one the snapshot replaced, left by an install whose
        // Truncate did not reach the WAL before its store: this member would
        // vote as if its log ended there.
        let mut prev = (snapshot_meta.index, snapshot_meta.term);
        for e in &entries {
            if e.term < prev.1 {
                return Err(ShardOpenError::Recovery {
                    shard,
                    what: format!(
                        "the WAL's entry {} has term {}, below the term {} of index {}: \
                         a log tail that a snapshot or a newer leader replaced was not truncated",
                        e.index, e.term, prev.1, prev.0
                    ),
                });
            }
            prev = (e.index, e.term);
        }
        if applied < snapshot_meta.index {
            return Err(ShardOpenError::Recovery {
                shard,
                what: format!(
                    "the store has applied index {applied} but the log is compacted to {}: \
                     entries in between are gone",
                    snapshot_meta.index
                ),
            });
        }
        let last_index = entries.last().map_or(snapshot_meta.index, |e| e.index);
        if applied > last_index {
            return Err(ShardOpenError::Recovery {
                shard,
                what: format!(
                    "the store has applied index {applied} but the log ends at {last_index}: \
                     the WAL lost entries the store had applied"
                ),
            });
        }
        storage.append(&entries);
        let mut hs = recovered
            .hard_state
            .map(|h| HardState {
                term: h.term,
                vote: h.vote,
                commit: h.commit,
            })
            .unwrap_or_default();
        // Commit-only hard states are not synced on their own; whatever the store
        // applied was committed.
        hs.commit = hs
            .commit
            .max(applied)
            .max(snapshot_meta.index)
            .min(last_index);
        storage.set_hard_state(hs);

        let mut cfg = raft::Config::new(setup.member_id);
        cfg.group_id = u64::from(shard);
        cfg.election_timeout_ticks = setup.election_ticks;
        cfg.heartbeat_timeout_ticks = 1;
        cfg.applied_index = applied.max(snapshot_meta.index);
        let seed = setup
            .seed
            .unwrap_or_else(|| crate::server::clock::now_ms() ^ rand::random::<u64>());
        cfg.seed = setup.member_id ^ (u64::from(shard) << 32) ^ seed;
        #[cfg(feature = "raft-mutations")]
        {
            cfg.mutation = setup.mutation;
        }
        cfg.async_append = true;
        // The keyspace leader's lease counts on followers ignoring
        // candidates, also right after they restart.
        cfg.vote_hold_after_start = setup.keyspace.as_ref().is_some_and(|k| {
            !k.mutated(crate::server::revisions::KeyspaceMutation::NoRestartVoteHold)
        });
        cfg.max_committed_size_per_ready_bytes = APPLY_BYTES_PER_TURN as u64;
        if let Some(bytes) = setup.max_append_bytes {
            cfg.max_size_per_msg_bytes = bytes;
        }
        let boot_nonce: u64 = match setup.seed {
            Some(seed) => (seed.rotate_left(17) ^ cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1,
            None => rand::random::<u64>() | 1,
        };
        let mut node =
            RawNode::new(&cfg, storage).map_err(|source| ShardOpenError::Raft { shard, source })?;
        // The membership recorded with the log's start misses the changes
        // applied since: those entries are not applied again, so their changes
        // are taken in here (the ones past the applied index are applied as
        // usual once committed).
        let mut conf_history = Vec::new();
        for e in &entries {
            if e.index > applied {
                break;
            }
            if e.entry_type == EntryType::EntryConfChange as i32 {
                let cc =
                    ConfChange::decode(e.data.clone()).map_err(|err| ShardOpenError::Recovery {
                        shard,
                        what: format!("conf change entry {} does not decode: {err}", e.index),
                    })?;
                conf_history.push((e.index, node.apply_conf_change(&cc)));
            }
        }
        let conf_state = node.status().conf_state;
        let is_learner = conf_state.learners.contains(&setup.member_id);
        tracing::info!(
            shard,
            applied,
            last_index,
            term = hs.term,
            commit = hs.commit,
            "shard recovered"
        );
        Ok(Shard {
            id: shard,
            member_id: setup.member_id,
            node,
            store,
            dir: setup.dir.clone(),
            wal: setup.wal.clone(),
            peers: setup.peers.clone(),
            waiters: BTreeMap::new(),
            // Ids stay unique across restarts: a random high half per start.
            next_request_id: (boot_nonce & 0xffff_ffff_0000_0000) | 1,
            reads_this_turn: Vec::new(),
            renewals_this_turn: Vec::new(),
            points_this_turn: Vec::new(),
            leaderless_writes: std::collections::VecDeque::new(),
            leaderless_write_bytes: 0,
            leaderless_reads: Vec::new(),
            read_rounds: BTreeMap::new(),
            next_read_ctx: 1,
            confirmed_reads: BTreeMap::new(),
            confirmed_renewals: BTreeMap::new(),
            unsynced_hard_state: None,
            durable: setup.wal.durable_watch(),
            in_flight: std::collections::VecDeque::new(),
            last_queued_lsn: 0,
            snapshot_meta,
            quota_backend_bytes: setup.quota_backend_bytes,
            snapshot_count: setup.snapshot_count,
            keyspace: setup.keyspace.clone(),
            keyspace_ready_at: None,
            cross: cross::Cross::default(),
            handover_tried: None,
            closed_revision: 0,
            closed_at: Instant::now(),
            lease_round_wanted: false,
            lease_span: {
                // A follower ignores candidates for at least this long after
                // it heard the round (its election timer counts whole ticks).
                let span = setup.tick * (setup.election_ticks.saturating_sub(1) as u32);
                span - span / KEYSPACE_LEASE_DRIFT_DIVISOR
            },
            lease_blocked_until: None,
            lease_transfer_block: setup.tick * (2 * setup.election_ticks as u32),
            nospace_alarm: false,
            failed: None,
            held_snapshot: HeldSnapshot::default(),
            conf_history,
            snapshot_reports_tx,
            snapshot_reports,
            snapshots_in_flight: std::collections::BTreeSet::new(),
            snapshot_sends: tokio::task::JoinSet::new(),
            snapshot_send_to: HashMap::new(),
            compaction: None,
            term_out: setup.term_out.clone(),
            revision_out: setup.revision_out.clone(),
            store_config: store_cfg,
            metrics: setup.metrics.clone(),
            readiness: setup.readiness.clone(),
            reported_caught_up: false,
            pending_reported: 0,
            watchers: watchers::ShardWatchers::default(),
            boot_nonce,
            members: setup.members.clone(),
            auth: setup.auth.clone(),
            conf_change_queue: std::collections::VecDeque::new(),
            is_learner,
            strict_reconfig: setup.strict_reconfig,
            peer_heard: HashMap::new(),
            peer_heard_within: setup.tick * (setup.election_ticks as u32),
            lease_clock: LeaseClock::new(setup.tick, setup.election_ticks),
            defrag: None,
            hashes_waiting: Vec::new(),
            physical_compactions: Vec::new(),
            compaction_stepped_at: Instant::now(),
            off_core: setup.off_core.clone(),
        })
    }
}

//! Starting, crashing and restarting a member's shard driver, one at a
//! time per member (a [`Turn`]).

use super::*;

impl World {
    /// Waits until nobody starts or stops member `id`, then takes the turn;
    /// it ends when the returned guard goes, also when the task holding it
    /// is dropped.
    pub(super) async fn take_turn(&self, id: u64) -> Turn<'_> {
        loop {
            {
                let mut members = self.members.borrow_mut();
                let m = &mut members[index(id)];
                if !m.busy {
                    m.busy = true;
                    return Turn { world: self, id };
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Starts member `id`'s shard driver on its disks, unless it runs.
    pub async fn start(self: &Rc<Self>, id: u64) -> Result<(), String> {
        let _turn = self.take_turn(id).await;
        self.start_turn(id).await
    }

    pub(super) async fn start_turn(self: &Rc<Self>, id: u64) -> Result<(), String> {
        let (dir, disks, timers, incarnation) = {
            let mut members = self.members.borrow_mut();
            let m = &mut members[index(id)];
            if m.running.is_some() || !m.in_group || self.over.get() {
                return Ok(());
            }
            m.incarnation += 1;
            (
                m.dir.clone(),
                m.disks.clone(),
                m.timers.clone(),
                m.incarnation,
            )
        };
        let mut wals = Vec::with_capacity(disks.len());
        for (shard, disk) in disks.into_iter().enumerate() {
            let storage = Rc::new(SlowDisk::new(disk, Rc::downgrade(self), id));
            let wal_dir = match shard {
                0 => dir.join("wal"),
                _ => dir.join(format!("wal-{shard}")),
            };
            let (wal, recovered) = cairn_wal::Wal::open_with_storage(wal_config(wal_dir), storage)
                .await
                .map_err(|e| format!("member {id}: the WAL of shard {shard} does not open: {e}"))?;
            wals.push((Rc::new(wal), recovered));
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let founders = self.founders();
        // member.toml is written on this thread, so that a seed replays
        // exactly (shard 0's store commits wait for the file).
        let registry = MemberRegistry::new(
            &dir,
            member_file(id, &founders, &self.ids(), self.cfg.shards),
            WriterThread::Caller,
        );
        // Jobs run on this thread after a seeded wait, so that a seed
        // replays exactly.
        let jobs = OffCoreJobs::simulated(
            self.cfg.seed ^ (id << 48) ^ (incarnation << 40) ^ 0x6a6f_6273,
            OFF_CORE_JOB_LONGEST,
        );
        let shards = self.cfg.shards;
        // With several shards, one revision counter for the member's
        // shards, as the daemon makes one for its cores.
        let keyspace = (shards > 1).then(|| {
            #[allow(unused_mut)]
            let mut counter = RevisionCounter::new(shards);
            #[cfg(feature = "raft-mutations")]
            {
                counter.mutation = self.cfg.keyspace_mutation;
            }
            Arc::new(Keyspace::new(Arc::new(counter)))
        });
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let registry = Arc::new(registry);
        let peers: Rc<SimPeers> = Rc::new(SimPeers {
            from: id,
            world: Rc::downgrade(self),
        });
        let mut commands = Vec::with_capacity(shards);
        let mut inbound = Vec::with_capacity(shards);
        let mut drivers = Vec::with_capacity(shards);
        for (shard, (wal, mut recovered)) in (0..shards as ShardId).zip(wals) {
            let (commands_tx, commands_rx) = mpsc::channel(COMMAND_QUEUE);
            let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
            commands.push(commands_tx);
            inbound.push(inbound_tx);
            let mut setup = ShardSetup {
                shard,
                member_id: id,
                // A member that joins later starts from the same bootstrap
                // voters and learns the changes since from the log or a
                // snapshot, as a joining daemon does.
                initial_voters: founders.clone(),
                dir: dir.join(format!("shard-{shard}")),
                wal,
                recovered: recovered
                    .shards
                    .remove(&u64::from(shard))
                    .unwrap_or_default(),
                peers: peers.clone(),
                commands: CommandInbox::new(vec![commands_rx]),
                inbound: inbound_rx,
                tick: TICK,
                election_ticks: ELECTION_TICKS,
                quota_backend_bytes: 1 << 30,
                snapshot_count: self.snapshot_count,
                shutdown: shutdown_rx.clone(),
                metrics: None,
                readiness: None,
                members: registry.clone(),
                auth: None,
                disk_faults: None,
                store_sync_thread: false,
                term_out: None,
                revision_out: None,
                keyspace: keyspace.as_ref().map(|k| k.counter.clone()),
                seed: Some(
                    self.cfg.seed ^ (id << 48) ^ (incarnation << 40) ^ (u64::from(shard) << 32),
                ),
                // The scripted adversary leaves followers hundreds of entries
                // behind; sent one by one and reordered, they would cost a
                // storm of refusals to catch up.
                max_append_bytes: (self.figure8 && self.figure8_script.is_none()).then_some(1),
                strict_reconfig: false,
                off_core: jobs.clone(),
                timer_faults: Some(timers[shard as usize].clone()),
                #[cfg(feature = "raft-mutations")]
                mutation: self.cfg.mutation,
            };
            let driver = Shard::open(&mut setup)
                .map_err(|e| format!("member {id} does not restart: shard {shard}: {e}"))?;
            drivers.push((driver, setup));
        }
        self.note(|| format!("member {id} starts (incarnation {incarnation})"));
        let mut tasks: Vec<JoinHandle<()>> = drivers
            .into_iter()
            .map(|(driver, setup)| tokio::task::spawn_local(driver.run(setup)))
            .collect();
        let router = Router::new(self.routing.clone(), commands.clone(), keyspace.clone());
        if keyspace.is_some() {
            // What the daemon's core 0 runs beside its shards.
            use crate::server::keyspace::cross_txn;
            tasks.push(tokio::task::spawn_local(
                cross_txn::finish_at_every_opening(router.clone()),
            ));
            tasks.push(tokio::task::spawn_local(cross_txn::revoke_expired_leases(
                router.clone(),
            )));
        }
        self.members.borrow_mut()[index(id)].running = Some(Running {
            tasks,
            inbound,
            commands,
            router,
            registry,
            jobs,
            _shutdown: shutdown_tx,
        });
        Ok(())
    }

    /// Cuts member `id`'s power: its driver stops between two steps, its
    /// WAL keeps what was synced (and, at random, some sectors written
    /// since). Its store is dropped: every commit already handed to the
    /// store's sync thread becomes durable (the thread finishes its queue),
    /// which is kinder than a power cut and than a `kill -9`.
    pub async fn crash(&self, id: u64) -> Result<(), String> {
        let _turn = self.take_turn(id).await;
        self.crash_turn(id).await
    }

    /// [`World::crash`], unless the faults have ended by the time the turn
    /// is taken. Returns whether it crashed the member.
    pub async fn crash_in_chaos(&self, id: u64) -> Result<bool, String> {
        let _turn = self.take_turn(id).await;
        if !self.in_chaos() || !self.is_up(id) {
            return Ok(false);
        }
        self.crash_turn(id).await.map(|()| true)
    }

    pub(super) async fn crash_turn(&self, id: u64) -> Result<(), String> {
        let torn: Vec<Option<u64>> = (0..self.cfg.shards)
            .map(|_| self.chance(700).then(|| self.gen_range(0..u64::MAX)))
            .collect();
        let running = {
            let mut members = self.members.borrow_mut();
            let m = &mut members[index(id)];
            let Some(running) = m.running.take() else {
                return Ok(());
            };
            for (disk, torn) in m.disks.iter_mut().zip(torn) {
                let after = disk.after_crash(torn);
                // Whatever the old WAL still tries to sync fails.
                disk.crash_at_sync(disk.syncs() + 1);
                *disk = after;
            }
            for timer in &m.timers {
                timer.crashed();
            }
            running
        };
        self.note(|| format!("member {id} crashes"));
        if let Some(k) = &running.router.keyspace {
            self.keyspace_openings
                .set(self.keyspace_openings.get() + k.counter.times_opened());
            self.txns_batched
                .set(self.txns_batched.get() + k.batches.joined());
        }
        for task in &running.tasks {
            task.abort();
        }
        // The drivers (and their stores) are gone before anything restarts.
        let mut panicked = None;
        for task in running.tasks {
            if let Err(e) = task.await {
                if e.is_panic() && panicked.is_none() {
                    panicked = Some(e.into_panic());
                }
            }
        }
        // So are its jobs off the core, which a dead process would
        // have taken with it: the crash is then just after the last of them.
        // The tasks it aborted on its way out (snapshot sends reading its
        // store) end once the scheduler has run them, so it runs once more.
        loop {
            tokio::task::yield_now().await;
            if running.jobs.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        match panicked {
            Some(payload) => Err(format!(
                "member {id}'s driver panicked: {}",
                super::super::panic_text(payload)
            )),
            None => Ok(()),
        }
    }
}

/// A member's turn to be started or stopped.
pub(super) struct Turn<'a> {
    world: &'a World,
    id: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.world.members.borrow_mut()[index(self.id)].busy = false;
    }
}

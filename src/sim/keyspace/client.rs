//! Clients and the keyspace leader's duties: writes, txns over several
//! shards and reads over several shards sent to members and retried,
//! revisions handed out under the guard, lease rounds, closes, pulling
//! every shard's leadership to shard 0's leader, and the liveness probes.

use rand::seq::SliceRandom;
use rand::Rng;

use super::checker::{Check, OpKind};
use super::cross::{draw_burst, draw_txn, RunEnd};
use super::kv::{Op, Payload, TxnSpec, KEYS_PER_SHARD};
use super::member::{encode_lease_ctx, Refusal};
use super::world::World;
use super::{ELECTION_TIMEOUT_TICKS, MAX_CLIENT_RETRY_TICKS, MAX_PENDING_CLIENT_WRITES};
use crate::raft::StateRole;

/// What a client asks.
#[derive(Debug, Clone)]
pub(super) enum ClientKind {
    Write { shard: usize, op: Op },
    Txn { spec: TxnSpec },
    Read { shards: Vec<usize> },
}

/// A client op not yet settled.
#[derive(Debug, Clone)]
pub(super) struct ClientWrite {
    pub id: u64,
    pub kind: ClientKind,
    pub invoked_tick: u64,
    /// A member runs it now (a txn or a read): no new attempt meanwhile.
    pub in_flight: bool,
    /// Proposed by a member (the client now only waits for the answer),
    /// answered, or given up.
    pub settled: bool,
}

/// Ticks between two requests to pull one shard's leadership.
const TRANSFER_RETRY_TICKS: u64 = ELECTION_TIMEOUT_TICKS / 2;

impl World {
    /// The tick's new client ops: writes to random keys, txns over several
    /// shards, reads over random shards.
    pub fn draw_writes(&mut self) {
        let n = self.rng.gen_range(0..=self.plan.max_writes_per_tick);
        for _ in 0..n {
            let shard = self.rng.gen_range(0..self.shard_count);
            self.invoke_write(shard);
        }
        // Not once the faults stop: a shard's holds pass from txn to txn
        // while any waits (`cross_release`), so a steady stream of txns
        // keeps single-shard writes out of it, and the liveness goal is
        // about recovering from faults.
        if self.shard_count >= 2
            && !self.calm
            && self.rng.gen_range(0..1000) < self.plan.txn_per_mille
        {
            {
                let peek_at = self.running().choose(&mut self.rng).copied();
                let members = &self.members;
                let spec = draw_txn(&mut self.rng, self.shard_count, |k| {
                    peek_at.and_then(|m| members[m].shards[super::kv::shard_of(k)].store.latest(k))
                });
                self.invoke(ClientKind::Txn { spec });
            }
        }
        if self.shard_count >= 2
            && !self.calm
            && self.rng.gen_range(0..1000) < self.plan.burst_per_mille
        {
            let n = self.rng.gen_range(2..=self.plan.max_burst_txns);
            let peek_at = self.running().choose(&mut self.rng).copied();
            let members = &self.members;
            let specs = draw_burst(&mut self.rng, self.shard_count, n, |k| {
                peek_at.and_then(|m| members[m].shards[super::kv::shard_of(k)].store.latest(k))
            });
            for spec in specs {
                self.invoke(ClientKind::Txn { spec });
            }
        }
        if self.rng.gen_range(0..1000) < self.plan.read_per_mille {
            let mut shards: Vec<usize> = (0..self.shard_count).collect();
            shards.shuffle(&mut self.rng);
            shards.truncate(self.rng.gen_range(1..=self.shard_count));
            shards.sort_unstable();
            self.invoke(ClientKind::Read { shards });
        }
        let tick = self.tick;
        for c in &mut self.clients {
            if !c.in_flight && tick - c.invoked_tick > MAX_CLIENT_RETRY_TICKS {
                c.settled = true;
            }
        }
    }

    /// A client invokes a write to a random key of `shard`; returns its id.
    pub fn invoke_write(&mut self, shard: usize) -> Option<u64> {
        let key = (shard * KEYS_PER_SHARD + self.rng.gen_range(0..KEYS_PER_SHARD)) as u32;
        let op = if self.rng.gen_range(0..5) == 0 {
            Op::Del(key)
        } else {
            Op::Put(key)
        };
        self.invoke(ClientKind::Write { shard, op })
    }

    /// A client invokes an op; returns its id.
    fn invoke(&mut self, kind: ClientKind) -> Option<u64> {
        if self.clients.len() >= MAX_PENDING_CLIENT_WRITES {
            return None;
        }
        self.next_write += 1;
        let id = self.next_write;
        let (checked, what) = match &kind {
            ClientKind::Write { shard, op } => {
                self.stats.writes_invoked += 1;
                (
                    OpKind::Write { op: *op },
                    format!("w{id} {op:?} on shard {shard}"),
                )
            }
            ClientKind::Txn { spec } => {
                self.stats.txns_invoked += 1;
                (
                    OpKind::Txn { spec: spec.clone() },
                    format!("txn x{id}: {spec}"),
                )
            }
            ClientKind::Read { shards } => {
                self.stats.reads_invoked += 1;
                (
                    OpKind::Read {
                        shards: shards.clone(),
                    },
                    format!("read q{id} of shards {shards:?}"),
                )
            }
        };
        self.begin_step(|| format!("client invokes {what}"));
        self.checker
            .invoked(id, checked, self.tick, self.stats.steps);
        self.clients.push(ClientWrite {
            id,
            kind,
            invoked_tick: self.tick,
            in_flight: false,
            settled: false,
        });
        Some(id)
    }

    /// The member running op `op` for its client is done with it.
    pub fn client_run_ended(&mut self, op: u64, how: RunEnd) {
        if let Some(c) = self.clients.iter_mut().find(|c| c.id == op) {
            c.in_flight = false;
            if how != RunEnd::Retry {
                c.settled = true;
            }
        }
    }

    /// One attempt of client op `c`: sent to a member that believes it
    /// leads shard 0 half the time, else to any running member. A member
    /// that does not assign revisions refuses a write or a txn (the real
    /// one forwards it, or holds it; the client's retry stands for both).
    pub fn client_attempt(&mut self, c: usize) -> Check {
        let Some(cw) = self.clients.get(c).cloned() else {
            return Ok(());
        };
        if cw.settled || cw.in_flight {
            return Ok(());
        }
        let running = self.running();
        let believers: Vec<usize> = running
            .iter()
            .copied()
            .filter(|i| self.members[*i].leads_shard0())
            .collect();
        let target = if !believers.is_empty() && self.rng.gen_bool(0.5) {
            believers.choose(&mut self.rng).copied()
        } else {
            running.choose(&mut self.rng).copied()
        };
        let Some(idx) = target else {
            return Ok(());
        };
        let w = cw.id;
        match cw.kind {
            ClientKind::Write { shard, op } => self.attempt_write(c, idx, w, shard, op),
            ClientKind::Txn { spec } => {
                // A member that does not lead shard 0 forwards the txn to
                // the one it believes does, over the peer port (`POST
                // /cairn/txn`).
                let lead = self.members[idx].shards[0]
                    .node
                    .as_ref()
                    .map_or(0, |n| n.leader_id());
                let via = idx;
                let idx = match lead {
                    0 => idx,
                    l => {
                        let l = l as usize - 1;
                        let (a, b) = (self.members[via].id, self.members[l].id);
                        let reachable = a == b
                            || !self.nets[0].is_blocked(a, b) && !self.nets[0].is_blocked(b, a);
                        if reachable && self.members[l].is_running() {
                            l
                        } else {
                            idx
                        }
                    }
                };
                self.begin_step(|| {
                    format!("client sends txn x{w} to n{}, run by n{}", via + 1, idx + 1)
                });
                match self.members[idx].assigns(self.guard) {
                    Err(why) => self.note(|| format!("  refused: {why:?}")),
                    Ok(()) => {
                        let run = self.enter_batch(idx, w, spec);
                        self.note(|| format!("  run {run}"));
                        self.clients[c].in_flight = true;
                    }
                }
                self.end_step()
            }
            ClientKind::Read { shards } => {
                let lead = self.members[idx].shards[0]
                    .node
                    .as_ref()
                    .map_or(0, |n| n.leader_id());
                self.begin_step(|| {
                    format!(
                        "client sends read q{w} to n{}, which asks n{lead} for a point",
                        idx + 1
                    )
                });
                if lead != 0 {
                    let l = lead as usize - 1;
                    self.start_read(w, idx, l, shards);
                    self.clients[c].in_flight = true;
                } else {
                    self.note(|| "  refused: no shard 0 leader known".into());
                }
                self.end_step()
            }
        }
    }

    fn attempt_write(&mut self, c: usize, idx: usize, w: u64, shard: usize, op: Op) -> Check {
        self.begin_step(|| format!("client sends w{w} (shard {shard}) to n{}", idx + 1));
        let refusal = self.members[idx].assigns(self.guard).err().or_else(|| {
            self.members[idx].shards[shard]
                .holder
                .is_some()
                .then_some(Refusal::Held)
        });
        match refusal {
            Some(why) => {
                if why == Refusal::NoLease {
                    self.stats.lease_refusals += 1;
                }
                self.note(|| format!("  refused: {why:?}"));
            }
            None => {
                let tick = self.tick;
                let m = &mut self.members[idx];
                let rev = m.next_revision();
                m.shards[shard].proposed_revision(rev, tick);
                let payload = Payload::Write { id: w, rev, op };
                let res = m.shards[shard]
                    .node
                    .as_mut()
                    .expect("running")
                    .propose(payload.encode());
                match res {
                    Ok(()) => {
                        m.proposed.insert(w, shard);
                        self.clients[c].settled = true;
                        self.stats.writes_proposed += 1;
                        self.note(|| format!("  proposed w{w} at revision {rev}"));
                    }
                    Err(e) => {
                        self.note(|| format!("  revision {rev} skipped, proposal refused: {e}"))
                    }
                }
                self.pump(idx, shard)?;
            }
        }
        self.end_step()
    }

    /// The keyspace leader closes the revisions an idle shard will never
    /// use (`maybe_close_revision`): once the counter is past the shard's
    /// last entry and nothing was proposed on it this tick, an entry saying
    /// no later one is at or below the counter.
    fn close_idle_shards(&mut self, idx: usize) -> Check {
        if self.members[idx].assigns(self.guard).is_err() {
            return Ok(());
        }
        let tick = self.tick;
        for shard in 0..self.shard_count {
            let m = &mut self.members[idx];
            let counter = m.counter;
            let s = &mut m.shards[shard];
            let n = s.node.as_mut().expect("running");
            if s.holder.is_some()
                || n.lead_transferee() != 0
                || s.proposed_at_tick >= tick
                || counter <= s.closed_revision
                || counter <= s.store.rev
            {
                continue;
            }
            if n.propose(Payload::Close { rev: counter }.encode()).is_ok() {
                s.closed_revision = counter;
                s.proposed_at_tick = tick;
                self.stats.closes_proposed += 1;
                self.pump(idx, shard)?;
            }
        }
        Ok(())
    }

    /// What a running member does each tick besides ticking: a lease round
    /// on every shard it leads, and, as shard 0's leader, asking the
    /// leaders of other shards to hand them over once it is caught up.
    pub fn keyspace_duties(&mut self, idx: usize) -> Check {
        let tick = self.tick;
        let m = &mut self.members[idx];
        let id = m.id;
        let clock = m.clock_mticks;
        let leads0 = m.leads_shard0();
        let mut seq = m.lease_seq;
        for shard in 0..m.shards.len() {
            let s = &mut m.shards[shard];
            let node = s.node.as_mut().expect("running");
            if node.role() == StateRole::Leader {
                if s.last_lease_round_tick != Some(tick) && node.lead_transferee() == 0 {
                    seq += 1;
                    let ctx = encode_lease_ctx(shard, node.term(), clock, seq);
                    if node.read_index(ctx).is_ok() {
                        s.last_lease_round_tick = Some(tick);
                    }
                }
                continue;
            }
            let lead = node.leader_id();
            let caught_up = s.sm.applied_index >= node.committed_index();
            let due = s
                .last_transfer_request_tick
                .is_none_or(|t| tick - t >= TRANSFER_RETRY_TICKS);
            if leads0 && shard != 0 && lead != 0 && lead != id && caught_up && due {
                s.last_transfer_request_tick = Some(tick);
                self.stats.transfers_requested += 1;
                let _ = node.transfer_leader(id);
                if self.trace_on {
                    let line = format!(
                        "[t{tick} s{}]   n{id} asks n{lead} for shard {shard}",
                        self.stats.steps
                    );
                    self.trace.push(line);
                }
            }
        }
        m.lease_seq = seq;
        self.close_idle_shards(idx)
    }

    /// After the faults stop: every election timeout, a probe write to each
    /// shard that has none acknowledged yet.
    pub fn liveness_round(&mut self) {
        if self
            .live
            .last_probe_tick
            .is_some_and(|t| self.tick - t < ELECTION_TIMEOUT_TICKS)
        {
            return;
        }
        self.live.last_probe_tick = Some(self.tick);
        for shard in 0..self.shard_count {
            if self.live.done[shard] {
                continue;
            }
            if let Some(id) = self.invoke_write(shard) {
                self.live.probes[shard].push(id);
            }
        }
    }
}

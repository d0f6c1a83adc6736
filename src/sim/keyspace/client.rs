//! Clients and the keyspace leader's duties: writes sent to members and
//! retried, revisions handed out under the guard, lease rounds, pulling
//! every shard's leadership to shard 0's leader, and the liveness probes.

use rand::seq::SliceRandom;
use rand::Rng;

use super::checker::Check;
use super::member::{encode_lease_ctx, encode_write, Refusal};
use super::world::World;
use super::{ELECTION_TIMEOUT_TICKS, MAX_CLIENT_RETRY_TICKS, MAX_PENDING_CLIENT_WRITES};
use crate::raft::StateRole;

/// A client write not yet accepted by a member.
#[derive(Debug, Clone)]
pub(super) struct ClientWrite {
    pub id: u64,
    pub shard: usize,
    pub invoked_tick: u64,
    /// Proposed by a member (the client now only waits for the answer),
    /// or given up.
    pub settled: bool,
}

/// Ticks between two requests to pull one shard's leadership.
const TRANSFER_RETRY_TICKS: u64 = ELECTION_TIMEOUT_TICKS / 2;

impl World {
    /// The tick's new client writes, each to a random shard.
    pub fn draw_writes(&mut self) {
        let n = self.rng.gen_range(0..=self.plan.max_writes_per_tick);
        for _ in 0..n {
            let shard = self.rng.gen_range(0..self.shard_count);
            self.invoke_write(shard);
        }
        let tick = self.tick;
        for c in &mut self.clients {
            if tick - c.invoked_tick > MAX_CLIENT_RETRY_TICKS {
                c.settled = true;
            }
        }
    }

    /// A client invokes a write; returns its id.
    pub fn invoke_write(&mut self, shard: usize) -> Option<u64> {
        if self.clients.len() >= MAX_PENDING_CLIENT_WRITES {
            return None;
        }
        self.next_write += 1;
        let id = self.next_write;
        self.begin_step(|| format!("client invokes w{id} on shard {shard}"));
        self.checker.invoked(id, shard, self.tick, self.stats.steps);
        self.stats.writes_invoked += 1;
        self.clients.push(ClientWrite {
            id,
            shard,
            invoked_tick: self.tick,
            settled: false,
        });
        Some(id)
    }

    /// One attempt of client write `c`: sent to a member that believes it
    /// leads shard 0 half the time, else to any running member.
    pub fn client_attempt(&mut self, c: usize) -> Check {
        let Some(cw) = self.clients.get(c).cloned() else {
            return Ok(());
        };
        if cw.settled {
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
        let (w, shard) = (cw.id, cw.shard);
        self.begin_step(|| format!("client sends w{w} (shard {shard}) to n{}", idx + 1));
        match self.members[idx].may_assign(self.guard, self.tick) {
            Err(why) => {
                if why == Refusal::NoLease {
                    self.stats.lease_refusals += 1;
                }
                self.note(|| format!("  refused: {why:?}"));
            }
            Ok(()) => {
                let m = &mut self.members[idx];
                let rev = m.next_revision();
                let res = m.shards[shard]
                    .node
                    .as_mut()
                    .expect("running")
                    .propose(encode_write(w, rev));
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

    /// What a running member does each tick besides ticking: a lease round
    /// on every shard it leads, and, as shard 0's leader, asking the
    /// leaders of other shards to hand them over once it is caught up.
    pub fn keyspace_duties(&mut self, idx: usize) -> Check {
        let tick = self.tick;
        let m = &mut self.members[idx];
        let id = m.id;
        let leads0 = m.leads_shard0();
        let mut seq = m.lease_seq;
        for shard in 0..m.shards.len() {
            let s = &mut m.shards[shard];
            let node = s.node.as_mut().expect("running");
            if node.role() == StateRole::Leader {
                if s.last_lease_round_tick != Some(tick) && node.lead_transferee() == 0 {
                    seq += 1;
                    let ctx = encode_lease_ctx(shard, node.term(), tick, seq);
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
        Ok(())
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

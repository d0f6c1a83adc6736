//! Each member's driver, keeping the Ready contract literally: starting and
//! crashing members, taking Readies, completing their disk writes, applying
//! committed entries and serving reads once applied.

use prost::Message as _;
use rand::Rng;

use super::checks::check_immediate;
use super::liveness::{Liveness, PROBE_READ_PREFIX, PROBE_WRITE_PREFIX};
use super::Sim;
use crate::raft::{ConfChange, Entry, EntryType, RawNode, Storage};
use crate::sim::checker::{found, Check, Checker, Found, ViolationKind};
use crate::sim::member::{entry_digest, Member, PendingWrite, StateMachine};
use crate::sim::SimStats;

impl Sim {
    pub(super) fn start_member(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let mut storage = m.disk.clone();
        let snap = storage.snapshot(0).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {}: snapshot unreadable on restart: {e}", m.id),
            )
        })?;
        let md = snap.metadata.clone().unwrap_or_default();
        let sm = StateMachine::decode(&md, &snap.data).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {}: {e}", m.id),
            )
        })?;
        // The state machine restarts from the snapshot and replays the log,
        // so Raft must resume from the membership in force at the snapshot.
        storage.set_conf_state(sm.conf_state());
        let mut cfg = self.raft_template.clone();
        cfg.id = m.id;
        cfg.seed = self.rng.gen();
        cfg.applied_index = md.index;
        let node = RawNode::new(&cfg, storage).map_err(|e| {
            found(
                ViolationKind::PersistenceContract,
                format!("member {} cannot restart from its durable state: {e}", m.id),
            )
        })?;
        m.last_role = (node.role(), node.term());
        m.node = Some(node);
        m.sm = sm;
        m.pending.clear();
        m.reads.clear();
        m.seen_commit = 0;
        m.lc_cursor = 0;
        m.lc_term = 0;
        m.restart_at_tick = None;
        m.incarnation += 1;
        self.pump(idx)
    }

    pub(super) fn crash(&mut self, idx: usize) {
        let down = self.rng.gen_range(1..=self.plan.max_down_ticks);
        let m = &mut self.members[idx];
        let Some(node) = m.node.take() else {
            return;
        };
        // Only what reached MemStorage survives: pending writes are lost.
        m.disk = node.store().clone();
        m.pending.clear();
        m.reads.clear();
        m.restart_at_tick = Some(self.tick + down);
        self.stats.crashes += 1;
    }

    /// Takes a Ready if none is outstanding (pipelined: whenever there is
    /// one): immediate messages leave now, the rest waits for the write.
    /// Pipelined, committed entries are applied at once: Raft hands out only
    /// entries already durable here.
    pub(super) fn pump(&mut self, idx: usize) -> Check {
        let pipelined = self.raft_template.async_append;
        let late = self.rng.gen_range(0..1000) < self.plan.late_write_per_mille;
        let m = &mut self.members[idx];
        let id = m.id;
        let Some(node) = m.node.as_mut() else {
            return Ok(());
        };
        if (!pipelined && !m.pending.is_empty()) || !node.has_ready() {
            return Ok(());
        }
        let mut rd = node.ready();
        for msg in &rd.messages {
            check_immediate(node.store(), id, msg)?;
        }
        if let Some(first) = rd.entries.first() {
            let mut prev = node.term_of(first.index - 1);
            for e in &rd.entries {
                self.checker
                    .log_entry(id, e.index, e.term, entry_digest(e), prev)?;
                prev = Some(e.term);
            }
        }
        let msgs = std::mem::take(&mut rd.messages);
        let n_entries = rd.entries.len();
        let hs = rd.hard_state;
        let snap = rd
            .snapshot
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map(|md| md.index);
        // Writes finish in order: never before the one queued ahead.
        let done_at_tick =
            (self.tick + u64::from(late)).max(m.pending.back().map_or(0, |p| p.done_at_tick));
        let committed = if pipelined {
            std::mem::take(&mut rd.committed_entries)
        } else {
            Vec::new()
        };
        let mut reads = if pipelined {
            std::mem::take(&mut rd.read_states)
        } else {
            Vec::new()
        };
        m.pending.push_back(PendingWrite { rd, done_at_tick });
        self.stats.max_writes_in_flight =
            self.stats.max_writes_in_flight.max(m.pending.len() as u64);
        self.note(|| {
            format!(
                "  n{id} ready: {n_entries} entries, hs {:?}, snapshot {snap:?}, {} msgs now",
                hs.map(|h| (h.term, h.vote, h.commit)),
                msgs.len()
            )
        });
        for msg in msgs {
            self.send(msg)?;
        }
        if !pipelined {
            return Ok(());
        }
        self.apply_committed(idx, &committed)?;
        let m = &mut self.members[idx];
        m.reads.append(&mut reads);
        if let Some(node) = m.node.as_mut() {
            node.on_entries_applied(&committed);
        }
        self.serve_reads(idx)?;
        self.pump(idx)
    }

    /// Applies committed entries on member `idx`, noting each membership
    /// change it applies.
    fn apply_committed(&mut self, idx: usize, entries: &[Entry]) -> Check {
        let id = self.members[idx].id;
        let m = &mut self.members[idx];
        let mut applied_changes = Vec::new();
        for e in entries {
            if let Some(change) =
                apply_entry(m, &mut self.checker, &mut self.stats, &mut self.live, e)?
            {
                applied_changes.push(change);
            }
        }
        for change in applied_changes {
            self.note(|| format!("  n{id} applied {change}"));
        }
        Ok(())
    }

    /// The disk write of the outstanding Ready completed: persist, apply,
    /// release the messages that waited, advance.
    pub(super) fn complete_write(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let id = m.id;
        let Some(pw) = m.pending.pop_front() else {
            return Ok(());
        };
        let mut rd = pw.rd;
        let node = m
            .node
            .as_mut()
            .expect("a member with a pending write is up");
        if let Some(snap) = &rd.snapshot {
            node.store_mut().apply_snapshot(snap.clone()).map_err(|e| {
                found(
                    ViolationKind::PersistenceContract,
                    format!("member {id}: snapshot from Ready refused by storage: {e}"),
                )
            })?;
        }
        node.store_mut().append(&rd.entries);
        if let Some(hs) = &rd.hard_state {
            node.store_mut().set_hard_state(*hs);
        }
        if let Some(snap) = &rd.snapshot {
            let md = snap.metadata.clone().unwrap_or_default();
            let sm = StateMachine::decode(&md, &snap.data).map_err(|e| {
                found(
                    ViolationKind::StateMachineSafety,
                    format!("member {id}: {e}"),
                )
            })?;
            if sm.applied_index < m.sm.applied_index {
                return Err(found(
                    ViolationKind::StateMachineSafety,
                    format!(
                        "member {id} restored a snapshot at {} over applied state at {}",
                        sm.applied_index, m.sm.applied_index
                    ),
                ));
            }
            self.checker
                .snapshot_state(id, md.index, md.term, sm.chain_hash)?;
            self.checker.observe_commit_index(md.index);
            m.sm = sm;
            self.stats.snapshots_installed += 1;
        }
        self.apply_committed(idx, &rd.committed_entries)?;
        let m = &mut self.members[idx];
        let persisted = std::mem::take(&mut rd.persisted_messages);
        m.reads.append(&mut rd.read_states);
        m.node.as_mut().expect("up").advance(rd);
        for msg in persisted {
            self.send(msg)?;
        }
        self.serve_reads(idx)?;
        self.pump(idx)
    }

    fn serve_reads(&mut self, idx: usize) -> Check {
        let m = &mut self.members[idx];
        let applied = m.sm.applied_index;
        let mut waiting = Vec::new();
        for rs in std::mem::take(&mut m.reads) {
            if rs.index > applied {
                waiting.push(rs);
                continue;
            }
            if self
                .checker
                .read_served(m.id, &rs.request_ctx, rs.index, applied)?
            {
                self.stats.reads_served += 1;
                if rs.request_ctx.starts_with(PROBE_READ_PREFIX) && self.calm {
                    self.live.read_done = true;
                }
            }
        }
        m.reads = waiting;
        Ok(())
    }
}

/// Applies one committed entry to `m`'s state machine and checks it against
/// every other member's. Returns a description of an applied membership
/// change, for the trace.
fn apply_entry(
    m: &mut Member,
    checker: &mut Checker,
    stats: &mut SimStats,
    live: &mut Liveness,
    e: &Entry,
) -> Result<Option<String>, Found> {
    let id = m.id;
    let mut change = None;
    if e.index != m.sm.applied_index + 1 {
        return Err(found(
            ViolationKind::StateMachineSafety,
            format!(
                "member {id} was handed index {} to apply after applying {}",
                e.index, m.sm.applied_index
            ),
        ));
    }
    if e.entry_type == EntryType::EntryConfChange as i32 {
        let cc = ConfChange::decode(e.data.clone()).map_err(|err| {
            found(
                ViolationKind::StateMachineSafety,
                format!(
                    "member {id}: committed conf change at {} undecodable: {err}",
                    e.index
                ),
            )
        })?;
        let node = m.node.as_mut().expect("applying member is up");
        // The node may have restored a snapshot past this entry while the
        // Ready carrying it was being written; its membership already
        // includes the change, and applying it again would rewind it.
        let behind_snapshot = e.index < node.status().first_index;
        if m.sm.conf_change_valid(&cc) {
            m.sm.apply_conf_change(&cc);
            stats.conf_changes_applied += 1;
            change = Some(format!(
                "{:?} {} at index {} (voters {:?} learners {:?})",
                cc.change_type(),
                cc.node_id,
                e.index,
                m.sm.voters,
                m.sm.learners
            ));
            if !behind_snapshot {
                let cs = node.apply_conf_change(&cc);
                let mut voters = cs.voters.clone();
                voters.sort_unstable();
                let mut learners = cs.learners.clone();
                learners.sort_unstable();
                let want = m.sm.conf_state();
                if voters != want.voters || learners != want.learners {
                    return Err(found(
                        ViolationKind::StateMachineSafety,
                        format!(
                            "member {id} after conf change at {}: raft has voters {voters:?} learners {learners:?}, applied membership is {:?} {:?}",
                            e.index, want.voters, want.learners
                        ),
                    ));
                }
            }
        }
    } else if !e.data.is_empty() {
        stats.writes_applied += 1;
        if e.data.starts_with(PROBE_WRITE_PREFIX) {
            live.probe_index.entry(e.data.clone()).or_insert(e.index);
        }
    }
    m.sm.apply(e);
    checker.apply(id, e.index, e.term, entry_digest(e), m.sm.chain_hash)?;
    Ok(change)
}

//! Every shard's Ready contract in the keyspace simulation: a Ready's
//! messages leave when it is taken, its entries and hard state reach the
//! disk when the simulated write completes; then its committed entries are
//! applied to the shard's store and watch, the lease rounds and read points
//! that came back are taken, and the messages that waited for the disk are
//! sent.

use prost::Message as _;
use rand::Rng;

use super::World;
use crate::raft::{ConfChange, Entry, EntryType};
use crate::sim::keyspace::checker::{found, Answer, Check, KsViolationKind};
use crate::sim::keyspace::kv::{Payload, ReqTag};
use crate::sim::keyspace::member::{decode_lease_ctx, decode_point_ctx};
use crate::sim::keyspace::{Bug, ELECTION_TIMEOUT_TICKS, LEASE_MARGIN_TICKS, MTICKS_PER_TICK};
use crate::sim::member::{entry_digest, PendingWrite};

impl World {
    /// Takes a Ready if none is outstanding: its messages leave now, the
    /// rest waits for the disk write.
    pub fn pump(&mut self, idx: usize, shard: usize) -> Check {
        let late = self.rng.gen_range(0..1000) < self.plan.late_write_per_mille;
        let tick = self.tick;
        let m = &mut self.members[idx];
        if m.is_paused() {
            return Ok(());
        }
        let id = m.id;
        let s = &mut m.shards[shard];
        let Some(node) = s.node.as_mut() else {
            return Ok(());
        };
        if s.pending.is_some() || !node.has_ready() {
            return Ok(());
        }
        let mut rd = node.ready();
        if rd.snapshot.is_some() {
            return Err(found(
                KsViolationKind::StateMachineSafety,
                format!("member {id} shard {shard} was handed a snapshot, but no log is compacted"),
            ));
        }
        let msgs = std::mem::take(&mut rd.messages);
        let n_entries = rd.entries.len();
        s.pending = Some(PendingWrite {
            rd,
            done_at_tick: tick + u64::from(late),
        });
        self.note(|| {
            format!(
                "  n{id} s{shard} ready: {n_entries} entries, {} msgs now",
                msgs.len()
            )
        });
        for msg in msgs {
            self.send(shard, msg);
        }
        Ok(())
    }

    /// The disk write of a shard's outstanding Ready completed: persist,
    /// apply, take the lease rounds that came back, release the messages
    /// that waited, advance.
    pub(super) fn complete_write(&mut self, idx: usize, shard: usize) -> Check {
        let m = &mut self.members[idx];
        let id = m.id;
        let Some(pw) = m.shards[shard].pending.take() else {
            return Ok(());
        };
        let mut rd = pw.rd;
        {
            let node = m.shards[shard].node.as_mut().expect("pending means up");
            node.store_mut().append(&rd.entries);
            if let Some(hs) = &rd.hard_state {
                node.store_mut().set_hard_state(*hs);
            }
        }
        // `advance` learns the applied index from the Ready's committed
        // entries, so they stay in it.
        let committed = rd.committed_entries.clone();
        for e in &committed {
            self.apply_entry(idx, shard, e)?;
        }
        let tick = self.tick;
        let m = &mut self.members[idx];
        let s = &mut m.shards[shard];
        let mut renewed = Vec::new();
        let mut points = Vec::new();
        for rs in std::mem::take(&mut rd.read_states) {
            if let Some((sh, term, start)) = decode_lease_ctx(&rs.request_ctx) {
                if sh == shard && s.lease_round_returned(term, start) {
                    renewed.push(start);
                }
            } else if let Some(ask) = decode_point_ctx(&rs.request_ctx) {
                points.push((ask, rs.index));
            }
        }
        let persisted = std::mem::take(&mut rd.persisted_messages);
        s.node.as_mut().expect("up").advance(rd);
        let clock = m.clock_mticks;
        if let Some(start) = renewed.last() {
            let until = start + (ELECTION_TIMEOUT_TICKS - LEASE_MARGIN_TICKS) * MTICKS_PER_TICK;
            self.note(|| {
                format!(
                    "  n{id} s{shard} lease from round of {start}m, until {until}m (now {clock}m, t{tick})"
                )
            });
        }
        for (ask, index) in points {
            self.point_round_returned(idx, shard, ask, index);
        }
        for msg in persisted {
            self.send(shard, msg);
        }
        self.pump(idx, shard)
    }

    fn apply_entry(&mut self, idx: usize, shard: usize, e: &Entry) -> Check {
        let step = self.stats.steps;
        let merge = self.bug != Bug::WatchNoMerge;
        let m = &mut self.members[idx];
        let id = m.id;
        let s = &mut m.shards[shard];
        let mut payload = None;
        if e.entry_type == EntryType::EntryConfChange as i32 {
            let cc = ConfChange::decode(e.data.clone()).map_err(|err| {
                found(
                    KsViolationKind::StateMachineSafety,
                    format!(
                        "member {id} shard {shard}: conf change at {} undecodable: {err}",
                        e.index
                    ),
                )
            })?;
            if s.sm.conf_change_valid(&cc) {
                s.sm.apply_conf_change(&cc);
                s.node.as_mut().expect("up").apply_conf_change(&cc);
            }
        } else if !e.data.is_empty() {
            payload = Some(Payload::decode(&e.data).ok_or_else(|| {
                found(
                    KsViolationKind::StateMachineSafety,
                    format!(
                        "member {id} shard {shard}: entry {} is neither a no-op nor a payload: {:?}",
                        e.index,
                        String::from_utf8_lossy(&e.data)
                    ),
                )
            })?);
        }
        s.sm.apply(e);
        s.applied_term = e.term;
        let first = self.checker.applied(
            id,
            shard,
            e.index,
            e.term,
            entry_digest(e),
            payload.as_ref(),
            &mut s.cursor,
        )?;
        let Some(payload) = payload else {
            return Ok(());
        };
        let incarnation = m.incarnation;
        let mine = |by: &ReqTag| by.member == id && by.incarnation == incarnation;
        let events = match &payload {
            Payload::Write { id: w, rev, op } => {
                let (_, events) = s.store.apply_ops(*rev, *w, std::slice::from_ref(op));
                if first > 0 {
                    self.stats.writes_applied += 1;
                }
                events
            }
            Payload::Part { by, .. } | Payload::Parts { by, .. } => {
                // Each part at its own revision (`apply_parts_at`); the
                // planted bug applies a batch's at the entry's header
                // revision, its last part's.
                let header = payload.revision().expect("parts carry revisions");
                let mut answers = Vec::new();
                let mut events = Vec::new();
                for (x, rev, ops, plan) in payload.parts() {
                    let at = if self.bug == Bug::BatchOneRevision {
                        header
                    } else {
                        rev
                    };
                    let (gets, ev) = s.store.apply_ops(at, x, ops);
                    if let Some(plan) = plan {
                        s.store.records.insert(rev, plan.clone());
                    }
                    answers.push(gets);
                    events.extend(ev);
                }
                if mine(by) {
                    m.answers.insert(by.seq, answers);
                }
                self.stats.txns_applied += first as u64;
                events
            }
            Payload::Done { rev, more, by } => {
                s.store.records.remove(rev);
                for r in more {
                    s.store.records.remove(r);
                }
                if mine(by) {
                    m.answers.insert(by.seq, Vec::new());
                }
                Vec::new()
            }
            Payload::Close { rev } => {
                s.store.rev = s.store.rev.max(*rev);
                Vec::new()
            }
        };
        if payload.revision().is_some() {
            let through = s.store.rev;
            m.watcher
                .on_apply(shard, through, &events, merge)
                .map_err(|why| {
                    found(
                        KsViolationKind::WatchOrder,
                        format!("member {id}'s watch: {why}"),
                    )
                })?;
        }
        let Payload::Write { id: w, rev, .. } = payload else {
            return Ok(());
        };
        let m = &mut self.members[idx];
        if m.proposed.remove(&w).is_some() && self.checker.acked(w, step, Answer::Write)? {
            self.stats.writes_acked += 1;
            self.note(|| format!("  n{id} acknowledges w{w} (shard {shard}) at revision {rev}"));
            if self.calm {
                for (sh, probes) in self.live.probes.iter().enumerate() {
                    if probes.contains(&w) {
                        self.live.done[sh] = true;
                    }
                }
            }
        }
        Ok(())
    }
}

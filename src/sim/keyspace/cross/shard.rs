//! The shard's side of a txn over several shards
//! (`src/server/shard/cross.rs`): whether the shard is led here and ready,
//! its hold and the txns queued behind it, the release and the fence that
//! ends every hold, and proposing on the shard.

use crate::sim::keyspace::checker::Check;
use crate::sim::keyspace::kv::{Payload, ReqTag};
use crate::sim::keyspace::member::Holder;
use crate::sim::keyspace::world::World;

/// Why a shard refused a call of a txn or an opening.
type Refused = &'static str;

impl World {
    /// `cross_led`: this member leads the shard and has applied its no-op
    /// (the shard's `cross.ready`).
    pub(super) fn cross_led(&self, idx: usize, shard: usize) -> Result<(), Refused> {
        let m = &self.members[idx];
        let s = &m.shards[shard];
        let Some(n) = s.node.as_ref() else {
            return Err("down");
        };
        if n.leader_id() != m.id {
            return Err("not leader");
        }
        if s.ready_term != Some(n.term()) {
            return Err("no-op not applied");
        }
        Ok(())
    }

    /// `cross_hold`: Ok(true) held, Ok(false) queued.
    pub(super) fn cross_hold(
        &mut self,
        idx: usize,
        shard: usize,
        run: u64,
    ) -> Result<bool, Refused> {
        self.cross_led(idx, shard)?;
        if self.members[idx].assigns(self.guard).is_err() {
            return Err("counter closed");
        }
        let s = &mut self.members[idx].shards[shard];
        if s.holder.is_some() {
            s.hold_waiting.push_back(run);
            return Ok(false);
        }
        let index = s.node.as_ref().expect("led").last_index();
        s.holder = Some(Holder { run, index });
        Ok(true)
    }

    /// The holder's index if `run` holds the shard.
    pub(super) fn holder_index(&self, idx: usize, shard: usize, run: u64) -> Result<u64, Refused> {
        match self.members[idx].shards[shard].holder {
            Some(h) if h.run == run => Ok(h.index),
            _ => Err("hold gone"),
        }
    }

    /// `cross_release`: ends `run`'s hold, asks the waiting read points
    /// again and hands the hold to the next txn waiting; or takes `run`
    /// out of the queue.
    pub fn cross_release(&mut self, idx: usize, shard: usize, run: u64) -> Check {
        let s = &mut self.members[idx].shards[shard];
        if s.holder.is_some_and(|h| h.run == run) {
            s.holder = None;
            let points = std::mem::take(&mut s.points_waiting);
            for ask in points {
                self.shard_read_point(idx, shard, ask)?;
            }
            if let Some(next) = self.members[idx].shards[shard].hold_waiting.pop_front() {
                // As the real code: a refusal answers that txn only; the
                // ones queued behind it stay queued.
                let _ = self.cross_hold(idx, shard, next);
            }
        } else {
            s.hold_waiting.retain(|r| *r != run);
        }
        Ok(())
    }

    /// `end_holds`: every hold and wait ends (the waiting txns see their
    /// hold gone), and the waiting read points are asked again.
    pub fn end_holds(&mut self, idx: usize, shard: usize) -> Check {
        let s = &mut self.members[idx].shards[shard];
        s.holder = None;
        s.hold_waiting.clear();
        let points = std::mem::take(&mut s.points_waiting);
        for ask in points {
            self.shard_read_point(idx, shard, ask)?;
        }
        Ok(())
    }

    /// Proposes `payload` on the shard of member `idx`; false when Raft
    /// refuses it.
    pub fn propose_payload(&mut self, idx: usize, shard: usize, payload: &Payload) -> bool {
        let res = self.members[idx].shards[shard]
            .node
            .as_mut()
            .map(|n| n.propose(payload.encode()));
        match res {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                self.note(|| format!("  n{} s{shard} refused {payload:?}: {e}", idx + 1));
                false
            }
            None => false,
        }
    }

    pub(super) fn tag(&mut self, idx: usize) -> ReqTag {
        let m = &mut self.members[idx];
        let seq = m.next_req();
        ReqTag {
            member: m.id,
            incarnation: m.incarnation,
            seq,
        }
    }
}

//! Linearizable reads over several shards at one read point, modelled on
//! `Router::read_point`, `Shard::read_point` and `Shard::read_at`
//! (docs/KEYSPACE.md, "Consistent reads").
//!
//! A client sends its read to any member, `F`, which asks the member it
//! believes leads shard 0, `L`, for a read point (over the peer port, so
//! not across a cut link). `L` reads its counter, `R` (only while the
//! counter is open), then asks each shard the read touches for its point:
//! the shard's leader notes its log's last index and starts a ReadIndex
//! round, and answers the larger of the two once the round comes back,
//! with the term of the entry at that index in its log; a shard held by a
//! txn over several shards queues the ask until the hold ends. `F` then
//! reads each shard at `R` once it has applied the shard's index, if the
//! entry at that index in its own log has the point's term. Each of those
//! calls is one step.
//!
//! # Why the term
//! The last index a shard's leader answers may be an entry not yet
//! committed, such as a txn's part at a revision below `R`. If that leader
//! loses the shard before the entry commits, a new leader's entries take
//! its index, and a member that applied the index would serve the read
//! without the part, which a later opening then finishes below `R`: half a
//! txn. Raft's log matching (paper 5.3: an entry with the same index and
//! term means the same log up to it) makes the point's term the proof that
//! `F`'s log holds every entry the leader had when it answered. When the
//! terms differ, the read is refused as "leader changed", and its client
//! asks for a new point.

use rand::seq::SliceRandom;

use super::checker::{Answer, Check, ReadAnswer};
use super::kv::{keys_of, GetResult, Key};
use super::member::encode_point_ctx;
use super::world::World;
use super::{Bug, MAX_TXN_TICKS};
use crate::raft::StateRole;

/// Where one shard's read point ask stands, at `L`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PointState {
    /// Waiting for the txn holding the shard to let go.
    Queued,
    /// A ReadIndex round started in `term`, when the log ended at
    /// `last_index`.
    Round {
        term: u64,
        last_index: u64,
    },
    /// The point's index, and the term of the entry there in the leader's
    /// log when it answered.
    Answered(IndexTerm),
    Failed,
}

/// A shard's part of a read point: an index, and the term of the entry
/// at it in the log of the shard's leader that answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexTerm {
    pub index: u64,
    pub term: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct PointAsk {
    pub idx: usize,
    pub incarnation: u64,
    pub shard: usize,
    pub state: PointState,
}

#[derive(Debug, Clone)]
pub(super) enum ReadStage {
    /// `F` asks `L` for the point.
    Point,
    /// `L` asks each shard; `asks[i]` for `shards[i]`.
    Indexes { rev: u64, asks: Vec<Option<u64>> },
    /// `F` reads each shard at `rev` once applied through its index, if
    /// the entry there has the point's term.
    Serve {
        rev: u64,
        points: Vec<IndexTerm>,
        values: Vec<Option<Vec<(Key, GetResult)>>>,
    },
}

#[derive(Debug, Clone)]
pub(super) struct ReadRun {
    pub op: u64,
    pub f: usize,
    pub f_incarnation: u64,
    pub l: usize,
    pub l_incarnation: u64,
    /// `L`'s count of openings when it read `R`.
    pub l_opened: u64,
    pub shards: Vec<usize>,
    pub started_tick: u64,
    pub stage: ReadStage,
}

impl World {
    /// `Shard::read_point` on member `idx`: a new ask, or one asked again
    /// when a hold ended.
    pub fn shard_read_point(&mut self, idx: usize, shard: usize, ask: u64) -> Check {
        let Some(a) = self.point_asks.get(&ask).copied() else {
            return Ok(());
        };
        let m = &mut self.members[idx];
        if a.idx != idx || a.incarnation != m.incarnation {
            return Ok(());
        }
        let id = m.id;
        let s = &mut m.shards[shard];
        let state = match s.node.as_mut() {
            Some(n) if n.leader_id() == id => {
                if s.holder.is_some() {
                    s.points_waiting.push(ask);
                    PointState::Queued
                } else {
                    let last_index = n.last_index();
                    let term = n.term();
                    m.lease_seq += 1;
                    let ctx = encode_point_ctx(ask, m.lease_seq);
                    match m.shards[shard].node.as_mut().expect("up").read_index(ctx) {
                        Ok(()) => PointState::Round { term, last_index },
                        Err(_) => PointState::Failed,
                    }
                }
            }
            _ => PointState::Failed,
        };
        self.note(|| format!("  n{id} s{shard} read point ask {ask}: {state:?}"));
        if let Some(a) = self.point_asks.get_mut(&ask) {
            a.state = state;
        }
        if matches!(state, PointState::Round { .. }) {
            self.pump(idx, shard)?;
        }
        Ok(())
    }

    /// A read point round of `ask` came back on member `idx` at `index`.
    pub fn point_round_returned(&mut self, idx: usize, shard: usize, ask: u64, index: u64) {
        let m = &self.members[idx];
        let Some(a) = self.point_asks.get_mut(&ask) else {
            return;
        };
        if a.idx != idx || a.incarnation != m.incarnation || a.shard != shard {
            return;
        }
        let PointState::Round { term, last_index } = a.state else {
            return;
        };
        // A round survives no role change (the driver drains them).
        let index = index.max(last_index);
        let point = m.shards[shard]
            .node
            .as_ref()
            .filter(|n| n.role() == StateRole::Leader && n.term() == term)
            .and_then(|n| n.term_of(index))
            .map(|entry_term| IndexTerm {
                index,
                term: entry_term,
            });
        a.state = point.map_or(PointState::Failed, PointState::Answered);
    }

    /// Starts a read of every key of `shards` for client op `op`, served by
    /// member `f`, which asks `l` for the point.
    pub fn start_read(&mut self, op: u64, f: usize, l: usize, shards: Vec<usize>) -> u64 {
        self.next_run += 1;
        let id = self.next_run;
        let r = ReadRun {
            op,
            f,
            f_incarnation: self.members[f].incarnation,
            l,
            l_incarnation: self.members[l].incarnation,
            l_opened: 0,
            shards,
            started_tick: self.tick,
            stage: ReadStage::Point,
        };
        self.reads.insert(id, r);
        id
    }

    fn end_read(&mut self, id: u64, answer: Option<ReadAnswer>, why: &str) -> Check {
        let Some(r) = self.reads.remove(&id) else {
            return Ok(());
        };
        if let ReadStage::Indexes { asks, .. } = &r.stage {
            for a in asks.iter().flatten() {
                self.point_asks.remove(a);
            }
        }
        self.note(|| format!("  read q{} ends: {why}", r.op));
        let how = if let Some(answer) = answer {
            let step = self.stats.steps;
            self.note(|| format!("  acknowledges read q{} at {}", r.op, answer.rev));
            if self.checker.acked(r.op, step, Answer::Read(answer))? {
                self.stats.reads_acked += 1;
            }
            super::cross::RunEnd::Acked
        } else {
            super::cross::RunEnd::Retry
        };
        self.client_run_ended(r.op, how);
        Ok(())
    }

    /// One step of read `id`.
    pub fn step_read(&mut self, id: u64) -> Check {
        let Some(r) = self.reads.get(&id).cloned() else {
            return Ok(());
        };
        let (f, l) = (&self.members[r.f], &self.members[r.l]);
        let (f_id, l_id) = (f.id, l.id);
        let (f_paused, l_paused) = (f.is_paused(), l.is_paused());
        let l_gone = l.incarnation != r.l_incarnation || !l.is_up();
        if f.incarnation != r.f_incarnation || !f.is_up() {
            return self.end_read(id, None, "F restarted");
        }
        if self.tick - r.started_tick > MAX_TXN_TICKS {
            self.begin_step(|| format!("read q{} times out", r.op));
            self.end_read(id, None, "timed out")?;
            return self.end_step();
        }
        match r.stage {
            ReadStage::Point => {
                if f_paused || l_paused {
                    return Ok(());
                }
                self.begin_step(|| {
                    format!(
                        "read q{}: n{} asks n{} for a read point",
                        r.op,
                        r.f + 1,
                        r.l + 1
                    )
                });
                let reachable = r.f == r.l
                    || !self.nets[0].is_blocked(f_id, l_id) && !self.nets[0].is_blocked(l_id, f_id);
                if !reachable || l_gone {
                    self.end_read(id, None, "leader unreachable")?;
                    return self.end_step();
                }
                if let Err(why) = self.members[r.l].assigns(self.guard) {
                    self.end_read(id, None, &format!("refused: {why:?}"))?;
                    return self.end_step();
                }
                let rev = self.members[r.l].counter;
                let opened = self.members[r.l].opened;
                self.note(|| format!("  R = {rev}"));
                if let Some(x) = self.reads.get_mut(&id) {
                    x.l_opened = opened;
                    x.stage = ReadStage::Indexes {
                        rev,
                        asks: vec![None; r.shards.len()],
                    };
                }
                self.end_step()
            }
            ReadStage::Indexes { rev, mut asks } => {
                let l = &self.members[r.l];
                if l.incarnation != r.l_incarnation || !l.is_up() {
                    return self.end_read(id, None, "L restarted");
                }
                if l.is_paused() {
                    return Ok(());
                }
                let mut unasked: Vec<usize> =
                    (0..asks.len()).filter(|i| asks[*i].is_none()).collect();
                if let Some(&i) = unasked.choose(&mut self.rng) {
                    unasked.clear();
                    let shard = r.shards[i];
                    self.begin_step(|| {
                        format!(
                            "read q{}: n{} shard {shard} asked for its point",
                            r.op,
                            r.l + 1
                        )
                    });
                    self.next_run += 1;
                    let ask = self.next_run;
                    self.point_asks.insert(
                        ask,
                        PointAsk {
                            idx: r.l,
                            incarnation: r.l_incarnation,
                            shard,
                            state: PointState::Failed,
                        },
                    );
                    asks[i] = Some(ask);
                    if let Some(x) = self.reads.get_mut(&id) {
                        x.stage = ReadStage::Indexes {
                            rev,
                            asks: asks.clone(),
                        };
                    }
                    self.shard_read_point(r.l, shard, ask)?;
                    return self.end_step();
                }
                let states: Vec<PointState> = asks
                    .iter()
                    .map(|a| self.point_asks[&a.expect("asked")].state)
                    .collect();
                if states.contains(&PointState::Failed) {
                    self.begin_step(|| format!("read q{}: a shard refused its point", r.op));
                    self.end_read(id, None, "point refused")?;
                    return self.end_step();
                }
                let points: Option<Vec<IndexTerm>> = states
                    .iter()
                    .map(|s| match s {
                        PointState::Answered(p) => Some(*p),
                        _ => None,
                    })
                    .collect();
                let Some(points) = points else {
                    return Ok(());
                };
                self.begin_step(|| {
                    let at: Vec<String> = points
                        .iter()
                        .map(|p| format!("{}@t{}", p.index, p.term))
                        .collect();
                    format!("read q{}: point {rev} at indexes {at:?}", r.op)
                });
                for a in asks.iter().flatten() {
                    self.point_asks.remove(a);
                }
                let l = &self.members[r.l];
                if self.protocol.checks_point_opening() && (!l.open || l.opened != r.l_opened) {
                    // The fix: an opening since `R` was read may have
                    // finished a txn at or below `R` after its shards
                    // answered.
                    if let Some(x) = self.reads.get_mut(&id) {
                        x.stage = ReadStage::Point;
                    }
                    self.end_read(id, None, "the counter reopened since R")?;
                    return self.end_step();
                }
                if let Some(x) = self.reads.get_mut(&id) {
                    x.stage = ReadStage::Serve {
                        rev,
                        values: vec![None; points.len()],
                        points,
                    };
                }
                self.end_step()
            }
            ReadStage::Serve {
                rev,
                points,
                mut values,
            } => {
                if self.members[r.f].is_paused() {
                    return Ok(());
                }
                let mut open: Vec<usize> =
                    (0..values.len()).filter(|i| values[*i].is_none()).collect();
                open.shuffle(&mut self.rng);
                for i in open {
                    let shard = r.shards[i];
                    let point = points[i];
                    let s = &self.members[r.f].shards[shard];
                    let applied = s.sm.applied_index;
                    let waits = applied < point.index;
                    if waits && self.bug != Bug::SkipReadWait {
                        continue;
                    }
                    let entry_term = s.node.as_ref().and_then(|n| n.term_of(point.index));
                    self.begin_step(|| {
                        format!(
                            "read q{}: n{} reads shard {shard} at {rev} (applied {applied}, point {}@t{}, entry's term here {entry_term:?})",
                            r.op,
                            r.f + 1,
                            point.index,
                            point.term
                        )
                    });
                    // Log matching: the entry at the point's index holds the
                    // leader's log up to it only if its term is the point's.
                    if !waits && entry_term != Some(point.term) {
                        if self.bug != Bug::SkipReadTerm {
                            self.stats.reads_leader_changed += 1;
                            self.end_read(id, None, "leader changed")?;
                            return self.end_step();
                        }
                        self.note(|| "  the entry's term is not the point's: served anyway".into());
                    }
                    let s = &self.members[r.f].shards[shard];
                    values[i] = Some(
                        keys_of(shard)
                            .map(|k| (k, s.store.get_at(k, rev)))
                            .collect(),
                    );
                    if values.iter().all(Option::is_some) {
                        let mut all: Vec<(Key, GetResult)> =
                            values.into_iter().flatten().flatten().collect();
                        all.sort_by_key(|(k, _)| *k);
                        self.end_read(id, Some(ReadAnswer { rev, values: all }), "served")?;
                    } else if let Some(x) = self.reads.get_mut(&id) {
                        x.stage = ReadStage::Serve {
                            rev,
                            points,
                            values,
                        };
                    }
                    return self.end_step();
                }
                Ok(())
            }
        }
    }
}

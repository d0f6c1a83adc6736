//! A shard's side of a txn over several shards (docs/KEYSPACE.md,
//! "Transactions over several shards"): the keyspace leader holds each shard
//! the txn touches (in shard order), reads their compares and checks their
//! ops while no entry of theirs can get a revision, takes the txn's revision,
//! and has every shard it writes propose its part at that revision. A part
//! carries the whole plan, which the shard's store keeps until every part is
//! applied, so that a later keyspace leader can finish a txn whose leader
//! failed between parts.

use std::collections::VecDeque;

use cairn_proto::cairnpb::{CrossTxnDone, CrossTxnPart};

use super::in_flight::InFlight;
use super::*;
use crate::server::command::{CrossHeld, CrossRecords};

/// A part Raft took.
struct ProposedPart {
    last: bool,
}

/// A txn asking to hold the shard (see `ShardCommand::CrossHold`).
struct HoldAsk {
    txn: u64,
    txns: u32,
    compares: Vec<pb::Compare>,
    keys: Vec<(Bytes, Bytes)>,
    reply: Reply<CrossHeld>,
}

/// The txns over several shards this shard takes part in.
#[derive(Default)]
pub(super) struct Cross {
    /// The txn holding the shard, if any.
    holder: Option<Holder>,
    /// Txns waiting to hold it, first come first served.
    waiting: VecDeque<HoldAsk>,
    /// Compares waiting for the entries proposed before the hold to apply.
    /// The holder's ask, with the index to apply before it is answered.
    compares: Vec<(u64, HoldAsk)>,
    /// What this leader's entries not yet applied touch.
    pub(super) in_flight: InFlight,
    /// Read points asked while held: asked again once the hold ends, so
    /// that a point taken after the txn's revision covers its part.
    points: Vec<Reply<u64>>,
    /// Records asked by an opening keyspace leader, answered once the
    /// entries proposed before the ask (the index) are applied.
    records: Vec<(u64, Reply<CrossRecords>)>,
    /// The holder's parts Raft did not take yet (too many uncommitted
    /// entries), in revision order: proposed again on the next close tick.
    unproposed: VecDeque<Unproposed>,
    /// Led here, with every entry of earlier terms applied (the keyspace
    /// was told): a part of an earlier leader's txn may be proposed.
    pub(super) ready: bool,
}

/// A part waiting for Raft to take it.
struct Unproposed {
    data: Bytes,
    id: u64,
    revision: i64,
    /// The last part of the holder's batch here: its hold ends once it is
    /// proposed.
    last: bool,
    reply: Reply<WriteResult>,
}

struct Holder {
    txn: u64,
    /// Every entry proposed before the hold is at or below this index.
    index: u64,
    /// Once the compares are asked: the index to apply before the state
    /// here is that of the keyspace just before the txn, for its keys.
    ready_at: Option<u64>,
}

impl Cross {
    /// Whether a txn holds the shard: its entries get no revision meanwhile.
    pub(super) fn is_held(&self) -> bool {
        self.holder.is_some()
    }
}

impl Shard {
    pub(super) fn handle_cross(&mut self, cmd: ShardCommand) {
        match cmd {
            ShardCommand::CrossHold {
                txn,
                txns,
                compares,
                keys,
                reply,
            } => self.cross_hold(HoldAsk {
                txn,
                txns,
                compares,
                keys,
                reply,
            }),
            ShardCommand::CrossCheck {
                txn,
                ops,
                revision,
                reply,
            } => {
                let answer = self.cross_check(txn, &ops, revision);
                let _ = reply.send(answer);
            }
            ShardCommand::CrossHasLease { txn, id, reply } => {
                let answer = self
                    .holder_ready(txn)
                    .map(|()| self.store.lease(id).is_some());
                let _ = reply.send(answer);
            }
            ShardCommand::CrossPropose {
                txn,
                revision,
                part,
                last,
                reply,
            } => self.cross_propose(txn, revision, part, last, reply),
            ShardCommand::CrossRelease { txn } => self.cross_release(txn),
            ShardCommand::CrossForget { revisions, reply } => self.cross_forget(revisions, reply),
            ShardCommand::CrossRecords { reply } => self.cross_records(reply),
            other => unreachable!("not a cross-shard command: {other:?}"),
        }
    }

    /// Keeps the entries just proposed here (encoded), for the txns over
    /// several shards that hold the shard later to tell what they touch.
    pub(super) fn note_proposed(&mut self, data: impl Iterator<Item = Bytes>) {
        if self.keyspace.is_some() {
            self.cross
                .in_flight
                .proposed(self.node.last_index(), data.collect());
        }
    }

    /// Ok where this member leads the shard and has applied every entry of
    /// earlier terms; the error to answer otherwise.
    fn cross_led(&self) -> Result<(), ApiError> {
        if let Some(reason) = &self.failed {
            return Err(self.storage_error(reason.clone()));
        }
        match self.node.leader_id() {
            raft::NONE => Err(ApiError::NoLeader),
            leader if leader != self.member_id => Err(ApiError::NotLeader { leader }),
            _ if !self.cross.ready => Err(ApiError::NoLeader),
            _ => Ok(()),
        }
    }

    fn cross_hold(&mut self, ask: HoldAsk) {
        if let Err(e) = self.cross_led() {
            let _ = ask.reply.send(Err(e));
            return;
        }
        if self.keyspace.as_ref().is_none_or(|k| !k.is_open()) {
            let _ = ask.reply.send(Err(ApiError::NoLeader));
            return;
        }
        if self.cross.holder.is_some() {
            self.cross.waiting.push_back(ask);
            return;
        }
        if let Some(m) = &self.metrics {
            m.cross_hold(u64::from(ask.txns));
        }
        let index = self.node.last_index();
        // Only the entries before the hold that touch the txn's keys must
        // be applied before its compares are read.
        let ready_at = self.cross.in_flight.last_touching(index, &ask.keys);
        self.cross.holder = Some(Holder {
            txn: ask.txn,
            index,
            ready_at: Some(ready_at),
        });
        if ready_at <= self.store.applied_index() {
            self.answer_hold(ask);
        } else {
            self.cross.compares.push((ready_at, ask));
        }
    }

    fn answer_hold(&self, ask: HoldAsk) {
        let answer = self.compares_here(&ask.compares).map(|compares| CrossHeld {
            compares,
            no_space: self.nospace_alarm,
        });
        let _ = ask.reply.send(answer);
    }

    /// The hold of `txn`, or the error to answer when it is gone (leadership
    /// changed since).
    fn holder_index(&self, txn: u64) -> Result<u64, ApiError> {
        match &self.cross.holder {
            Some(h) if h.txn == txn => Ok(h.index),
            _ => Err(ApiError::LeaderChanged),
        }
    }

    /// Ok when `txn` holds the shard and its compares were answered (so
    /// its keys are as of just before the txn here); the error otherwise.
    fn holder_ready(&self, txn: u64) -> Result<(), ApiError> {
        match &self.cross.holder {
            Some(h)
                if h.txn == txn && h.ready_at.is_some_and(|r| r <= self.store.applied_index()) =>
            {
                Ok(())
            }
            _ => Err(ApiError::LeaderChanged),
        }
    }

    fn compares_here(&self, compares: &[pb::Compare]) -> Result<Vec<Option<bool>>, ApiError> {
        let compares: Vec<mvcc::Compare> = compares.iter().map(convert::compare_from_pb).collect();
        self.store
            .compare_present(&compares)
            .map_err(|e| self.read_error(e))
    }

    /// Answers the compares and record asks whose entries have applied;
    /// called after apply.
    pub(super) fn cross_after_apply(&mut self) {
        let applied = self.store.applied_index();
        if !self.cross.records.is_empty() {
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.cross.records)
                .into_iter()
                .partition(|(index, _)| *index <= applied);
            self.cross.records = later;
            for (_, reply) in due {
                let _ = reply.send(Ok(self.records_here()));
            }
        }
        self.cross.in_flight.applied(applied);
        if self.cross.compares.iter().all(|(at, _)| *at > applied) {
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.cross.compares)
            .into_iter()
            .partition(|(at, _)| *at <= applied);
        self.cross.compares = later;
        for (_, ask) in due {
            self.answer_hold(ask);
        }
    }

    fn records_here(&self) -> CrossRecords {
        CrossRecords {
            revision: self.store.current_revision(),
            records: self.store.txn_records(),
        }
    }

    /// An opening keyspace leader asks for the records. First a fence: every
    /// hold ends, so no txn started before can propose a part here any
    /// more; then the answer waits for the parts already proposed to apply,
    /// so that it holds every record a txn of an earlier opening can leave.
    fn cross_records(&mut self, reply: Reply<CrossRecords>) {
        if let Err(e) = self.cross_led() {
            let _ = reply.send(Err(e));
            return;
        }
        self.end_holds(ApiError::LeaderChanged);
        let index = self.node.last_index();
        if index <= self.store.applied_index() {
            let _ = reply.send(Ok(self.records_here()));
        } else {
            self.cross.records.push((index, reply));
        }
    }

    /// Ends every hold and wait of a txn, which is answered `err`.
    fn end_holds(&mut self, err: ApiError) {
        self.cross.holder = None;
        for part in self.cross.unproposed.drain(..) {
            let _ = part.reply.send(Err(err.clone()));
        }
        for ask in self.cross.waiting.drain(..) {
            let _ = ask.reply.send(Err(err.clone()));
        }
        for (_, ask) in self.cross.compares.drain(..) {
            let _ = ask.reply.send(Err(err.clone()));
        }
        for reply in std::mem::take(&mut self.cross.points) {
            self.read_point(reply);
        }
    }

    fn cross_check(
        &mut self,
        txn: u64,
        ops: &[pb::RequestOp],
        revision: i64,
    ) -> Result<(), ApiError> {
        // The compares were answered first, which waits for the entries
        // touching the txn's keys.
        self.holder_ready(txn)?;
        if self.nospace_alarm
            && ops
                .iter()
                .any(|op| matches!(op.request, Some(pb::request_op::Request::RequestPut(_))))
        {
            return Err(ApiError::NoSpace);
        }
        let txn = convert::txn_from_pb(&pb::TxnRequest {
            success: ops.to_vec(),
            ..Default::default()
        });
        match self.store.check_ops(&txn.success, revision - 1) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.apply_error(e)),
        }
    }

    /// Proposes a part at `revision`. A txn's parts (the parts of every txn
    /// of a batch, in revision order) arrive while it holds the shard; the
    /// hold ends once the `last` one is proposed.
    fn cross_propose(
        &mut self,
        txn: u64,
        revision: i64,
        part: CrossTxnPart,
        last: bool,
        reply: Reply<WriteResult>,
    ) {
        if txn == 0 {
            // Finishing an earlier leader's txn: only before this member
            // assigns revisions, and only where the part is missing.
            if let Err(e) = self.cross_led() {
                let _ = reply.send(Err(e));
                return;
            }
            if self.store.current_revision() >= revision {
                let _ = reply.send(Ok(WriteResult::Applied {
                    revision: self.store.current_revision(),
                }));
                return;
            }
        } else if let Err(e) = self.holder_index(txn) {
            let _ = reply.send(Err(e));
            return;
        }
        self.next_request_id += 1;
        let id = self.next_request_id;
        let data = Bytes::from(
            ShardRequest {
                id,
                member: self.member_id,
                request: Some(shard_request::Request::CrossPart(part)),
                revision,
            }
            .encode_to_vec(),
        );
        let part = Unproposed {
            data,
            id,
            revision,
            last: last || txn == 0,
            reply,
        };
        if txn != 0 && !self.cross.unproposed.is_empty() {
            // An earlier part waits for Raft: this one goes after it.
            self.cross.unproposed.push_back(part);
            return;
        }
        if let Some(proposed) = self.propose_part(part) {
            if txn != 0 && proposed.last {
                self.cross_release(txn);
            }
        }
    }

    /// Proposes a part; a part Raft does not take now for too many
    /// uncommitted entries waits in `unproposed` (the hold stays) and is
    /// proposed again on the next close tick. A part Raft refuses otherwise
    /// (a transfer under way) may leave its txn applied on other shards
    /// only: see [`Shard::part_refused`]. Some(what it was) once proposed.
    fn propose_part(&mut self, part: Unproposed) -> Option<ProposedPart> {
        match self.node.propose(part.data.clone()) {
            Ok(()) => {
                self.proposed_revision(part.revision);
                self.proposed(part.id, part.reply, part.data);
                Some(ProposedPart { last: part.last })
            }
            Err(raft::RaftError::UncommittedLimit { .. }) => {
                self.cross.unproposed.push_front(part);
                None
            }
            Err(e) => {
                let _ = part.reply.send(Err(self.refused(e)));
                self.part_refused();
                None
            }
        }
    }

    /// A part was not proposed after its txn took its revision: other shards
    /// may hold theirs. The shard stops being ready (the counter closes at
    /// once, before anything else here can take a revision past the part's)
    /// and is ready again once it has applied what it has: the opening that
    /// follows finishes the txn from the other parts' records before any
    /// revision is handed out.
    fn part_refused(&mut self) {
        if let Some(k) = &self.keyspace {
            k.shard_not_ready(self.id);
        }
        self.cross.ready = false;
        if self.node.leader_id() == self.member_id {
            self.keyspace_ready_at = Some(self.node.last_index());
        }
        self.end_holds(ApiError::LeaderChanged);
    }

    /// Proposes again, in order, the parts Raft did not take (see
    /// `propose_part`).
    pub(super) fn retry_cross_part(&mut self) {
        while let Some(part) = self.cross.unproposed.pop_front() {
            let Some(proposed) = self.propose_part(part) else {
                return;
            };
            if proposed.last && self.cross.unproposed.is_empty() {
                if let Some(txn) = self.cross.holder.as_ref().map(|h| h.txn) {
                    self.cross_release(txn);
                }
            }
        }
    }

    fn cross_release(&mut self, txn: u64) {
        if self.cross.holder.as_ref().is_some_and(|h| h.txn == txn) {
            if !self.cross.unproposed.is_empty() {
                // Its parts still wait to be proposed: the hold stays.
                return;
            }
            self.cross.holder = None;
            for (_, ask) in std::mem::take(&mut self.cross.compares) {
                let _ = ask.reply.send(Err(ApiError::LeaderChanged));
            }
            for reply in std::mem::take(&mut self.cross.points) {
                self.read_point(reply);
            }
            // The writes that waited go first, so that a stream of txns
            // over this shard cannot starve them.
            self.release_leaderless();
            while self.cross.holder.is_none() {
                let Some(next) = self.cross.waiting.pop_front() else {
                    break;
                };
                self.cross_hold(next);
            }
        } else {
            self.cross.waiting.retain(|ask| ask.txn != txn);
        }
    }

    /// A read point asked while a txn holds the shard waits for the hold to
    /// end; handed back when no txn holds it.
    pub(super) fn hold_read_point(&mut self, reply: Reply<u64>) -> Result<(), Reply<u64>> {
        if self.cross.holder.is_some() {
            self.cross.points.push(reply);
            Ok(())
        } else {
            Err(reply)
        }
    }

    /// Has the records of the txns at `revisions` forgotten, in one entry.
    fn cross_forget(&mut self, revisions: Vec<i64>, reply: Reply<()>) {
        if let Err(e) = self.cross_led() {
            let _ = reply.send(Err(e));
            return;
        }
        let Some((&revision, more)) = revisions.split_first() else {
            let _ = reply.send(Ok(()));
            return;
        };
        self.next_request_id += 1;
        let id = self.next_request_id;
        let data = ShardRequest {
            id,
            member: self.member_id,
            request: Some(shard_request::Request::CrossDone(CrossTxnDone {
                revision,
                more: more.to_vec(),
            })),
            revision: 0,
        }
        .encode_to_vec();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let data = Bytes::from(data);
        match self.node.propose(data.clone()) {
            Ok(()) => self.proposed(id, tx, data),
            Err(e) => {
                let _ = tx.send(Err(self.refused(e)));
            }
        }
        tokio::task::spawn_local(async move {
            let answer = match rx.await {
                Ok(r) => r.map(|_| ()),
                Err(_) => Err(ApiError::Stopped),
            };
            let _ = reply.send(answer);
        });
    }

    /// Leadership changed: every hold and wait ends. A txn that had not
    /// proposed every part is finished by the next keyspace leader, from
    /// the records of the parts that were applied.
    pub(super) fn cross_role_changed(&mut self, leader: u64) {
        self.cross.ready = false;
        self.cross.in_flight.clear();
        self.end_holds(ApiError::LeaderChanged);
        for (_, reply) in self.cross.records.drain(..) {
            let _ = reply.send(Err(ApiError::NotLeader { leader }));
        }
    }

    /// Applies this shard's part of a txn over several shards at `revision`,
    /// keeping its plan until every part is applied.
    pub(super) fn apply_cross_part(
        &mut self,
        index: u64,
        revision: i64,
        part: CrossTxnPart,
    ) -> Result<WriteResult, ApiError> {
        let revoke = part.revoke_lease;
        let applied = if revoke != 0 {
            self.store
                .apply_at(index, revision, &mvcc::Op::LeaseRevoke { id: revoke })
        } else {
            let ops = mvcc::Op::Txn(convert::txn_from_pb(&part.ops.unwrap_or_default()));
            self.store.apply_part_at(index, revision, &ops, &part.subs)
        };
        if !part.plan.is_empty() && !matches!(&applied, Err(e) if !e.is_request_error()) {
            self.store.put_txn_record(revision, &part.plan);
        }
        if revoke != 0 {
            self.lease_clock.revoked(revoke);
        }
        match applied {
            Ok(mvcc::OpResult::Txn(r)) => {
                Ok(WriteResult::Txn(convert::txn_to_pb(r, self.header(0))))
            }
            Ok(mvcc::OpResult::LeaseRevoke { revision, .. }) => {
                Ok(WriteResult::Applied { revision })
            }
            Ok(_) => Err(self.storage_error("a txn part answered another kind".to_string())),
            // A lease already gone here (a part an opening leader proposed
            // again, say) deletes nothing.
            Err(mvcc::ApplyError::LeaseNotFound { .. }) if revoke != 0 => {
                Ok(WriteResult::Applied { revision })
            }
            Err(e) => {
                if e.is_request_error() {
                    // Checked while the shard was held: a part must never be
                    // refused here after another shard applied its own.
                    tracing::error!(shard = self.id, index, revision, error = %e, "a part of a txn over several shards was refused");
                }
                Err(self.apply_error(e))
            }
        }
    }

    pub(super) fn apply_cross_done(&mut self, index: u64, done: CrossTxnDone) -> WriteResult {
        self.store.remove_txn_record(done.revision);
        for revision in done.more {
            self.store.remove_txn_record(revision);
        }
        self.store.set_applied_index(index);
        WriteResult::Applied {
            revision: self.store.current_revision(),
        }
    }
}

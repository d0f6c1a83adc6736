//! A shard's side of a txn over several shards (docs/KEYSPACE.md,
//! "Transactions over several shards"): the keyspace leader holds every
//! shard the txn touches (all at once, through the member's hold table) and
//! has them answer its compares with the hold; while no entry of those
//! shards can get a revision it takes the txn's revision, checks the ops,
//! and has every shard it writes propose its part at that revision. A part
//! carries the whole plan, which the shard's store keeps until every part is
//! applied, so that a later keyspace leader can finish a txn whose leader
//! failed between parts.

use std::collections::VecDeque;

use cairn_proto::cairnpb::{CrossTxnDone, CrossTxnPart, CrossTxnPartAt, CrossTxnParts};

use super::in_flight::InFlight;
use super::*;
use crate::server::command::{CrossHeld, CrossRecords};

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
    points: Vec<Reply<ShardPoint>>,
    /// Records asked by an opening keyspace leader, answered once the
    /// entries proposed before the ask (the index) are applied.
    records: Vec<(u64, Reply<CrossRecords>)>,
    /// The holder's entry of parts, when Raft did not take it (too many
    /// uncommitted entries): proposed again on the next close tick.
    unproposed: Option<PartsEntry>,
    /// Led here, with every entry of earlier terms applied (the keyspace
    /// was told): a part of an earlier leader's txn may be proposed.
    pub(super) ready: bool,
}

impl Cross {
    /// An entry of parts waits to be proposed again on the close ticks.
    pub(super) fn unproposed_waits(&self) -> bool {
        self.unproposed.is_some()
    }
}

/// An entry of parts (one, or a batch's) to propose.
struct PartsEntry {
    data: Bytes,
    id: u64,
    /// Its (last) part's revision.
    revision: i64,
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
            ShardCommand::CrossPropose { txn, parts, reply } => {
                self.cross_propose(txn, parts, reply)
            }
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
        if let Some(part) = self.cross.unproposed.take() {
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

    /// Proposes the holder's parts here (revisions ascending) in one entry,
    /// and ends the hold.
    fn cross_propose(
        &mut self,
        txn: u64,
        mut parts: Vec<(i64, CrossTxnPart)>,
        reply: Reply<WriteResult>,
    ) {
        let Some(&(revision, _)) = parts.last() else {
            let _ = reply.send(Err(
                self.storage_error(String::from("a proposal of no parts"))
            ));
            return;
        };
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
        let request = match parts.pop() {
            Some((_, part)) if parts.is_empty() => shard_request::Request::CrossPart(part),
            last => shard_request::Request::CrossParts(CrossTxnParts {
                parts: parts
                    .into_iter()
                    .chain(last)
                    .map(|(revision, part)| CrossTxnPartAt {
                        revision,
                        part: Some(part),
                    })
                    .collect(),
            }),
        };
        let data = Bytes::from(
            ShardRequest {
                id,
                member: self.member_id,
                request: Some(request),
                revision,
            }
            .encode_to_vec(),
        );
        let entry = PartsEntry {
            data,
            id,
            revision,
            reply,
        };
        if self.propose_part(entry) && txn != 0 {
            self.cross_release(txn);
        }
    }

    /// Proposes an entry of parts; one Raft does not take now for too many
    /// uncommitted entries waits in `unproposed` (the hold stays) and is
    /// proposed again on the next close tick. One Raft refuses otherwise (a
    /// transfer under way) may leave its txns applied on other shards only:
    /// see [`Shard::part_refused`]. Whether it was proposed.
    fn propose_part(&mut self, entry: PartsEntry) -> bool {
        match self.node.propose(entry.data.clone()) {
            Ok(()) => {
                self.proposed_revision(entry.revision);
                self.proposed(entry.id, entry.reply, entry.data);
                true
            }
            Err(raft::RaftError::UncommittedLimit { .. }) => {
                self.cross.unproposed = Some(entry);
                false
            }
            Err(e) => {
                let _ = entry.reply.send(Err(self.refused(e)));
                self.part_refused();
                false
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

    /// Proposes again the entry of parts Raft did not take (see
    /// `propose_part`).
    pub(super) fn retry_cross_part(&mut self) {
        let Some(entry) = self.cross.unproposed.take() else {
            return;
        };
        if self.propose_part(entry) {
            if let Some(txn) = self.cross.holder.as_ref().map(|h| h.txn) {
                self.cross_release(txn);
            }
        }
    }

    fn cross_release(&mut self, txn: u64) {
        if self.cross.holder.as_ref().is_some_and(|h| h.txn == txn) {
            if self.cross.unproposed.is_some() {
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
    pub(super) fn hold_read_point(
        &mut self,
        reply: Reply<ShardPoint>,
    ) -> Result<(), Reply<ShardPoint>> {
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
        let (tx, rx) = crate::server::command::Reply::channel();
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
        let op = part_op(&part);
        let applied = self.store.apply_part_at(index, revision, &op, &part.subs);
        self.part_applied(index, revision, &part, applied)
    }

    /// Applies the parts of a batch's txns proposed in one entry, each at
    /// its own revision, as [`Shard::apply_cross_part`] applies one.
    pub(super) fn apply_cross_parts(
        &mut self,
        index: u64,
        entry: CrossTxnParts,
    ) -> Result<WriteResult, ApiError> {
        let parts: Vec<(i64, CrossTxnPart)> = entry
            .parts
            .into_iter()
            .map(|p| (p.revision, p.part.unwrap_or_default()))
            .collect();
        let ops: Vec<mvcc::Op> = parts.iter().map(|(_, p)| part_op(p)).collect();
        let each: Vec<(i64, &mvcc::Op, &[i64])> = parts
            .iter()
            .zip(&ops)
            .map(|((revision, p), op)| (*revision, op, p.subs.as_slice()))
            .collect();
        let applied = match self.store.apply_parts_at(index, &each) {
            Ok(applied) => applied,
            Err(e) => return Err(self.apply_error(e)),
        };
        let answers = parts
            .iter()
            .zip(applied)
            .map(|((revision, part), a)| self.part_applied(index, *revision, part, a))
            .collect();
        Ok(WriteResult::Parts(answers))
    }

    /// After a part was applied (or refused): its record kept, its lease
    /// revoked from the lease clock, and its answer.
    fn part_applied(
        &mut self,
        index: u64,
        revision: i64,
        part: &CrossTxnPart,
        applied: Result<mvcc::OpResult, mvcc::ApplyError>,
    ) -> Result<WriteResult, ApiError> {
        let revoke = part.revoke_lease;
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

/// What a part runs on the store: its lease's revoke, or its ops.
fn part_op(part: &CrossTxnPart) -> mvcc::Op {
    if part.revoke_lease != 0 {
        return mvcc::Op::LeaseRevoke {
            id: part.revoke_lease,
        };
    }
    match &part.ops {
        Some(ops) => mvcc::Op::Txn(convert::txn_from_pb(ops)),
        None => mvcc::Op::Txn(convert::txn_from_pb(&Default::default())),
    }
}

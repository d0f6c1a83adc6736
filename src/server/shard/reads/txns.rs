//! etcd's read-only txns (every op of both branches a range), read as a
//! range is read rather than applied through the log: etcd serves them so,
//! linearizable after a ReadIndex round unless every range is serializable.
//!
//! The compares are read at once, at one revision; the ranges of the branch
//! they choose are checked first, as etcd checks them (a revision past the
//! txn's or compacted refuses the txn), then read at that revision as
//! ranges are (`ranges`): in chunks, so that a txn of long ranges does not
//! hold the core every shard on it shares. Ranges are started at once while
//! the keys they walked (counted or read) come to less than a chunk's (a
//! txn of a few small ranges is answered in the turn it arrived, as
//! before); the rest are read from a snapshot taken then, a chunk a turn,
//! by a task on the core's `LocalSet`. Every range names the txn's revision
//! or an earlier one, so a write applied meanwhile is never seen, and a
//! compaction past it fails the txn with etcd's "compacted".

use std::collections::VecDeque;

use cairn_mvcc as mvcc;
use cairn_proto::etcdserverpb::{
    self as pb, request_op, response_op, RangeRequest, TxnRequest, TxnResponse,
};

use super::ranges::{
    from_snapshot, read_error_to_api, start_range, store_revision, ChunkedRange, RangeStart, Step,
};
use crate::routing::ShardId;
use crate::server::command::Reply;
use crate::server::convert;
use crate::server::errors::ApiError;
use crate::server::shard::Shard;

/// What serving a txn's compares and first ranges gave.
pub(in crate::server::shard) enum TxnStart {
    Answered(Result<TxnResponse, ApiError>),
    /// Ranges are left to read by [`read_txn_rest`].
    Chunked(Box<ChunkedTxn>),
}

/// A read-only txn whose ranges are part read.
pub(in crate::server::shard) struct ChunkedTxn {
    /// The store when the txn was served, for the ranges not started yet
    /// (None when there are none).
    snap: Option<mvcc::Snapshot>,
    /// The range being read.
    current: Option<Box<ChunkedRange>>,
    /// The ranges after it, each naming its revision.
    rest: VecDeque<RangeRequest>,
    /// The answers so far.
    done: Vec<pb::RangeResponse>,
    succeeded: bool,
    /// The revision of the answer and of each range's header.
    revision: i64,
    header: pb::ResponseHeader,
    chunk_keys: usize,
    shard: ShardId,
}

impl Shard {
    /// Reads `request` at the store's revision, or at `point` (several
    /// shards): then at the point's revision, or at the store's own when
    /// the point is past it (see [`store_revision`]), and the answer's
    /// revision is the point's.
    pub(in crate::server::shard) fn serve_txn(
        &self,
        request: &TxnRequest,
        reply: Reply<TxnResponse>,
        point: Option<i64>,
    ) {
        let chunk_keys = self.store.config().range_chunk_keys;
        match start_txn(
            &self.store,
            request,
            point,
            self.header(0),
            chunk_keys,
            self.id,
        ) {
            TxnStart::Answered(answer) => {
                let _ = reply.send(answer);
            }
            TxnStart::Chunked(txn) => {
                tokio::task::spawn_local(read_txn_rest(txn, reply));
            }
        }
    }
}

impl Shard {
    /// Reads `compares` over this shard's keys (see
    /// [`mvcc::Store::compare_present_at`]) at the store's revision, or at
    /// `point`, as [`Shard::serve_txn`] reads its compares: the compares of
    /// a read-only txn over several shards, whose answers decide its branch.
    pub(in crate::server::shard) fn serve_compares(
        &self,
        compares: &[pb::Compare],
        reply: Reply<Vec<Option<bool>>>,
        point: Option<i64>,
    ) {
        let revision = point.map_or(0, |point| {
            store_revision(point, self.store.current_revision())
        });
        let compares: Vec<mvcc::Compare> = compares.iter().map(convert::compare_from_pb).collect();
        let answer = self
            .store
            .compare_present_at(&compares, revision)
            .map_err(|e| read_error_to_api(self.id, e));
        let _ = reply.send(answer);
    }
}

/// Reads the compares of `request` from `store`, and its ranges as far as
/// a chunk's keys go; see the module's doc.
pub(in crate::server::shard) fn start_txn(
    store: &mvcc::Store,
    request: &TxnRequest,
    point: Option<i64>,
    header: pb::ResponseHeader,
    chunk_keys: usize,
    shard: ShardId,
) -> TxnStart {
    // Copied only to be changed for a point.
    let mut request = std::borrow::Cow::Borrowed(request);
    let revision = point.map_or(0, |point| {
        read_at_point(request.to_mut(), point, store.current_revision())
    });
    let (at, succeeded) = match store.txn_branch(&convert::txn_from_pb(&request), revision) {
        Ok(branch) => branch,
        Err(e) => return TxnStart::Answered(Err(read_error_to_api(shard, e))),
    };
    let ops = if succeeded {
        &request.success
    } else {
        &request.failure
    };
    // Each range reads at the txn's revision unless it names its own.
    let mut rest: VecDeque<RangeRequest> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(request_op::Request::RequestRange(r)) => Some(RangeRequest {
                revision: if r.revision == 0 { at } else { r.revision },
                ..r.clone()
            }),
            _ => None,
        })
        .collect();
    let revision = point.unwrap_or(at);
    let mut done = Vec::with_capacity(rest.len());
    let mut current = None;
    let mut keys_read = 0;
    while keys_read < chunk_keys && current.is_none() {
        let Some(range) = rest.pop_front() else {
            break;
        };
        match start_range(store, &range, convert::OP_HEADER, chunk_keys, shard) {
            RangeStart::Answered(Ok(r)) => {
                // A count, or a sorted range read whole, walked every key
                // it counted.
                keys_read += usize::try_from(r.count)
                    .unwrap_or(0)
                    .max(r.kvs.len())
                    .max(1);
                done.push(r);
            }
            RangeStart::Answered(Err(e)) => return TxnStart::Answered(Err(e)),
            RangeStart::Chunked(range) => current = Some(range),
        }
    }
    let answered = current.is_none() && rest.is_empty();
    let mut txn = ChunkedTxn {
        // Taken only for ranges not started yet: it copies the store's
        // open batch.
        snap: (!rest.is_empty()).then(|| store.snapshot()),
        current,
        rest,
        done,
        succeeded,
        revision,
        header,
        chunk_keys,
        shard,
    };
    if answered {
        return TxnStart::Answered(Ok(txn.answer()));
    }
    TxnStart::Chunked(Box::new(txn))
}

/// The revision a txn read at `point` reads the store at (see
/// [`store_revision`]), its ranges' revisions changed to match: one up to
/// the point names the store's state when it is past the store's, as the
/// point does.
pub(in crate::server::shard) fn read_at_point(
    request: &mut TxnRequest,
    point: i64,
    current: i64,
) -> i64 {
    for op in request.success.iter_mut().chain(request.failure.iter_mut()) {
        if let Some(request_op::Request::RequestRange(r)) = &mut op.request {
            if r.revision <= point {
                r.revision = store_revision(r.revision, current);
            }
        }
    }
    store_revision(point, current)
}

impl ChunkedTxn {
    /// The answer, once every range is read.
    fn answer(&mut self) -> TxnResponse {
        let mut r = TxnResponse {
            header: Some(self.header),
            succeeded: self.succeeded,
            responses: std::mem::take(&mut self.done)
                .into_iter()
                .map(|range| pb::ResponseOp {
                    response: Some(response_op::Response::ResponseRange(range)),
                })
                .collect(),
        };
        convert::set_txn_revision(&mut r, self.revision);
        r
    }

    /// Reads a chunk of the current range, or starts the next one from the
    /// snapshot (reading its first chunk): Some(answer) once the txn is
    /// answered.
    fn step(&mut self) -> Option<Result<TxnResponse, ApiError>> {
        let range = match self.current.as_mut() {
            Some(range) => match range.read_chunk() {
                Step::More => return None,
                Step::Answered(answer) => {
                    self.current = None;
                    answer
                }
            },
            None => {
                let Some(request) = self.rest.pop_front() else {
                    return Some(Ok(self.answer()));
                };
                // The last range takes the snapshot itself.
                let snap = if self.rest.is_empty() {
                    self.snap.take()
                } else {
                    self.snap.clone()
                };
                let Some(snap) = snap else {
                    return Some(Err(ApiError::Storage {
                        shard: self.shard,
                        reason: "a read-only txn lost its snapshot".into(),
                    }));
                };
                match from_snapshot(
                    snap,
                    &request,
                    convert::OP_HEADER,
                    self.chunk_keys,
                    self.shard,
                ) {
                    RangeStart::Answered(answer) => answer,
                    RangeStart::Chunked(range) => {
                        self.current = Some(range);
                        return None;
                    }
                }
            }
        };
        match range {
            Ok(r) => {
                self.done.push(r);
                None
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// Reads the rest of `txn`'s ranges, yielding to the core's other tasks
/// before each chunk, and answers `reply`. A client that gave up stops the
/// reading.
pub(in crate::server::shard) async fn read_txn_rest(
    mut txn: Box<ChunkedTxn>,
    reply: Reply<TxnResponse>,
) {
    loop {
        tokio::task::yield_now().await;
        if reply.is_closed() {
            tracing::debug!(
                shard = txn.shard,
                ranges = txn.done.len(),
                chunks = txn.current.as_ref().map_or(0, |r| r.chunks()),
                "read-only txn abandoned by its client"
            );
            return;
        }
        if let Some(answer) = txn.step() {
            let _ = reply.send(answer);
            return;
        }
    }
}

#[cfg(test)]
mod tests;

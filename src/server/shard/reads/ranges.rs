//! Ranges served from a read snapshot in bounded chunks, so that a range over
//! many keys does not hold the core that every shard on it shares.
//!
//! A range is read at the store's revision when it is served (for a
//! linearizable read, once the index its ReadIndex round confirmed is
//! applied). One that the store reads in about one chunk's work (one key, or
//! a range of at most a chunk's keys) is read from the store at once, as
//! before. A longer one is read from an [`mvcc::Snapshot`] taken then: first
//! its `count` (etcd's, of every key in the range however small the `limit`)
//! a step of [`COUNT_CHUNKS_PER_STEP`] chunks' worth of keys at a time, then
//! its keys a chunk at a time; the first step (and, if it counted every key,
//! the first chunk) at once, and, if there is more, the rest in a task on
//! the core's `LocalSet` that yields to the runtime between them, so ticks,
//! heartbeats, applies and other clients' requests run in between. Writes applied meanwhile are not seen:
//! the snapshot pins its revision and never blocks the writer. A compaction
//! past that revision applied before the answer is complete fails the read
//! with etcd's "compacted" error, whether it comes during the keys or during
//! the count (which etcd, counting at once, would have answered).
//!
//! Each chunk is converted to protobuf as it is read, so the store's
//! materialised range never exists beside the protobuf answer.
//!
//! etcd's sorts by version, create or mod revision, or value need every key
//! before the first can be answered; the store refuses to stream them, and
//! they are materialised whole on the core as before.
//!
//! # Back of the envelope, and measured
//! Reading and converting one key of a hundred bytes costs about 1 µs, so a
//! chunk of 1,000 keys (the store's `range_chunk_keys`) should hold the core
//! for about 1 ms, well within a tick, where a range over 200,000 keys read in
//! one go holds it for about 0.2 s. Counting a key (etcd's `count`) walks the
//! in-memory index only, a twentieth or less of reading it; the key index
//! keeps each key's history, so a count taken in steps is that of the
//! snapshot's revision. Whether a range is long is learned by counting at
//! most one chunk's keys and one more.
//!
//! `cargo test --release --lib range_figures -- --ignored --nocapture` (a
//! quiet 2-core VM, two runs each), 200,000 keys of 100 B: read whole, the
//! core was held 116-129 ms. Chunked, the inline start took 0.5 ms (10.3-11.6
//! when it counted the whole range, twice), a page of 500 keys with its count
//! 0.4-0.7 ms (5.5 when counted inline) and a count alone 0.4-0.7 ms (4.8-5.4),
//! and another task on the core waited at most 1.5-2.0 ms between turns
//! (1.4-1.9 before). A one-key or 100-key read is answered inline either way,
//! at the same cost.

use cairn_mvcc as mvcc;
use cairn_proto::etcdserverpb::{self as pb, RangeRequest, RangeResponse};
use cairn_proto::mvccpb;

use crate::routing::ShardId;
use crate::server::command::Reply;
use crate::server::convert;
use crate::server::errors::ApiError;
use crate::server::shard::Shard;

/// A step of a range's count covers this many chunks' worth of keys: a key
/// counted costs about a sixteenth of one read and converted.
pub(in crate::server::shard) const COUNT_CHUNKS_PER_STEP: usize = 16;

/// What serving the first chunk of a range gave.
pub(in crate::server::shard) enum RangeStart {
    /// The whole answer: the range fitted in one chunk, failed, or had to be
    /// read whole.
    Answered(Result<RangeResponse, ApiError>),
    /// The first step of the count did not count every key, or the first
    /// chunk was full: the rest is counted and read by [`read_rest`].
    Chunked(Box<ChunkedRange>),
}

/// A range part-read (or part-counted) from its snapshot, with the protobuf
/// answer built so far.
pub(in crate::server::shard) struct ChunkedRange {
    stream: mvcc::RangeStream,
    kvs: Vec<mvccpb::KeyValue>,
    /// etcd's `count` of the range, once counted: the first thing done, so
    /// that `kvs` is given room for every key the answer can hold (`count`,
    /// or `limit` if fewer) and a long answer is not copied as it grows.
    count: Option<i64>,
    /// Whether keys of the range may be left out (a count alone, revision
    /// filters): then `kvs` grows as they pass.
    may_leave_out: bool,
    header: pb::ResponseHeader,
    /// The request's `limit`; 0 for none.
    limit: usize,
    chunk_keys: usize,
    shard: ShardId,
    /// Chunks read so far, for the log of an abandoned range.
    chunks: usize,
    /// The header's revision when not the snapshot's (a read point).
    header_revision: Option<i64>,
}

impl Shard {
    /// Answers `request` from a snapshot of the store taken now: at once when
    /// it fits in one chunk and one step of its count, otherwise from a task
    /// that reads the rest a chunk at a time, and counts it a step at a time,
    /// between the core's other work.
    ///
    /// With a read `point` (several shards; this shard has applied every
    /// entry with a revision up to it), the range is read at the point, or at
    /// the request's revision if it names an earlier one, and the header
    /// carries the point: entries applied since with later revisions are
    /// left out, and where the store has reached no revision past the read's
    /// its current state is that of the read's revision.
    pub(in crate::server::shard) fn serve_range(
        &self,
        request: &RangeRequest,
        reply: Reply<RangeResponse>,
        point: Option<i64>,
    ) {
        let chunk_keys = self.store.config().range_chunk_keys;
        let at_point;
        let request = match point {
            Some(point) if request.revision > point => {
                let _ = reply.send(Err(ApiError::FutureRev));
                return;
            }
            Some(point) => {
                let revision = if request.revision > 0 {
                    request.revision
                } else {
                    point
                };
                at_point = RangeRequest {
                    revision: store_revision(revision, self.store.current_revision()),
                    ..request.clone()
                };
                &at_point
            }
            None => request,
        };
        match start_range(&self.store, request, self.header(0), chunk_keys, self.id) {
            RangeStart::Answered(mut answer) => {
                if let (Some(point), Ok(r)) = (point, &mut answer) {
                    if let Some(h) = r.header.as_mut() {
                        h.revision = point;
                    }
                }
                let _ = reply.send(answer);
            }
            RangeStart::Chunked(mut range) => {
                range.header_revision = point;
                tokio::task::spawn_local(read_rest(range, reply));
            }
        }
    }
}

/// The revision a read at a point reads the store at: `revision`, or the
/// store's own (0) when `revision` is at or past it. The shard has applied
/// everything up to the point, so no write of it lies between its revision
/// and the point's.
pub(in crate::server::shard) fn store_revision(revision: i64, current: i64) -> i64 {
    if revision >= current {
        0
    } else {
        revision
    }
}

/// The client-facing error for a store read error: etcd's for a compacted
/// or future revision or an empty key, a storage error of `shard` otherwise.
pub(in crate::server::shard) fn read_error_to_api(shard: ShardId, e: mvcc::ReadError) -> ApiError {
    match e {
        mvcc::ReadError::Compacted { .. } => ApiError::Compacted,
        mvcc::ReadError::FutureRevision { .. } => ApiError::FutureRev,
        mvcc::ReadError::EmptyKey => ApiError::EmptyKey,
        other => ApiError::Storage {
            shard,
            reason: other.to_string(),
        },
    }
}

/// Serves `request` from `store` as it is now, reading chunks of at most
/// `chunk_keys` keys from a snapshot until one is full. `header` is the
/// response header but for its revision, which is the store's (the
/// snapshot's).
pub(in crate::server::shard) fn start_range(
    store: &mvcc::Store,
    request: &RangeRequest,
    header: pb::ResponseHeader,
    chunk_keys: usize,
    shard: ShardId,
) -> RangeStart {
    assert!(chunk_keys > 0, "shard {shard}: a range chunk of no keys");
    let req = convert::range_from_pb(request);
    if reads_at_most_one_chunk(store, &req, chunk_keys) {
        return RangeStart::Answered(read_whole(store, &req, header, shard));
    }
    // Nothing is applied between the snapshot and a read of the store.
    from_snapshot(store.snapshot(), request, header, chunk_keys, shard)
}

/// Serves `request` from `snap` as [`start_range`] does from a store: its
/// first chunk at once, the rest by [`read_rest`]. A range that cannot be
/// streamed (sorted by anything but the key) is read whole from `snap`.
pub(in crate::server::shard) fn from_snapshot(
    snap: mvcc::Snapshot,
    request: &RangeRequest,
    header: pb::ResponseHeader,
    chunk_keys: usize,
    shard: ShardId,
) -> RangeStart {
    let req = convert::range_from_pb(request);
    if !req.streamable() {
        return RangeStart::Answered(
            snap.range(&req)
                .map(|r| convert::range_to_pb(r, header))
                .map_err(|e| read_error_to_api(shard, e)),
        );
    }
    let limit = usize::try_from(req.limit).unwrap_or(0);
    let may_leave_out = req.count_only || has_revision_filters(&req);
    let stream = match snap.range_stream(req, chunk_keys) {
        Ok(stream) => stream,
        Err(e) => return RangeStart::Answered(Err(read_error_to_api(shard, e))),
    };
    let mut range = ChunkedRange {
        stream,
        kvs: Vec::new(),
        count: None,
        may_leave_out,
        header,
        limit,
        chunk_keys,
        shard,
        chunks: 0,
        header_revision: None,
    };
    match range.read_chunk() {
        Step::Answered(answer) => RangeStart::Answered(answer),
        Step::More => RangeStart::Chunked(Box::new(range)),
    }
}

/// Whether the store reads `req` whole in about one chunk's work, so that it
/// is read from the store as it is: the same answer as from a snapshot taken
/// now, without the snapshot's copy of the store's open batch (a few ns a
/// record, 10,000 records under a heavy write load: tens of times the cost of
/// a one-key read).
fn reads_at_most_one_chunk(
    store: &mvcc::Store,
    req: &mvcc::RangeRequest,
    chunk_keys: usize,
) -> bool {
    // One key, or none.
    if req.range_end.is_empty() {
        return true;
    }
    // Otherwise the store counts every key of the range, and may read each:
    // a range of at most a chunk's keys. A request the count refuses is
    // refused the same way read whole.
    store
        .range_holds_more_than(req, chunk_keys)
        .map_or(true, |long| !long)
}

/// Whether keys of the range may be left out of the answer by their mod or
/// create revision.
fn has_revision_filters(req: &mvcc::RangeRequest) -> bool {
    req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

/// `req` read whole from the store, as one answer.
fn read_whole(
    store: &mvcc::Store,
    req: &mvcc::RangeRequest,
    header: pb::ResponseHeader,
    shard: ShardId,
) -> Result<RangeResponse, ApiError> {
    store
        .range(req)
        .map(|r| convert::range_to_pb(r, header))
        .map_err(|e| read_error_to_api(shard, e))
}

/// What reading one chunk gave.
pub(in crate::server::shard) enum Step {
    Answered(Result<RangeResponse, ApiError>),
    More,
}

impl ChunkedRange {
    /// Counts a step of the range's keys until all are counted, then (in the
    /// same turn as the last step) reads a chunk. When a chunk leaves nothing
    /// to read (it is short of `chunk_keys`, or reached `limit`) the stream
    /// is asked again, which then reads nothing and makes its `more` final.
    pub(in crate::server::shard) fn read_chunk(&mut self) -> Step {
        let count = match self.count {
            Some(count) => count,
            None => match self
                .stream
                .count_step(self.chunk_keys.saturating_mul(COUNT_CHUNKS_PER_STEP))
            {
                Ok(Some(count)) => {
                    self.count = Some(count);
                    if !self.may_leave_out {
                        let count = usize::try_from(count).unwrap_or(0);
                        let room = match self.limit {
                            0 => count,
                            limit => limit.min(count),
                        };
                        self.kvs.reserve_exact(room);
                    }
                    count
                }
                Ok(None) => return Step::More,
                Err(e) => return Step::Answered(Err(read_error_to_api(self.shard, e))),
            },
        };
        loop {
            match self.stream.next_chunk() {
                Ok(Some(chunk)) => {
                    self.chunks += 1;
                    let full = chunk.len() >= self.chunk_keys;
                    self.kvs.extend(chunk.into_iter().map(convert::kv_to_pb));
                    if full && !self.limit_reached() {
                        return Step::More;
                    }
                }
                Ok(None) => return Step::Answered(Ok(self.response(count))),
                // Never a partial answer: what was read is dropped.
                Err(e) => return Step::Answered(Err(read_error_to_api(self.shard, e))),
            }
        }
    }

    /// Chunks read so far.
    pub(in crate::server::shard) fn chunks(&self) -> usize {
        self.chunks
    }

    /// Whether the answer holds the `limit` keys asked for, so that nothing
    /// is left to read (a limit reached in the first chunk takes no task).
    fn limit_reached(&self) -> bool {
        self.limit > 0 && self.kvs.len() >= self.limit
    }

    /// The answer, once the stream is exhausted (its `more` is final then)
    /// and `count` counted.
    fn response(&mut self, count: i64) -> RangeResponse {
        RangeResponse {
            header: Some(pb::ResponseHeader {
                revision: self.header_revision.unwrap_or(self.stream.revision()),
                ..self.header
            }),
            kvs: std::mem::take(&mut self.kvs),
            more: self.stream.more(),
            count,
        }
    }
}

/// Reads and counts the rest of `range`, yielding to the core's other tasks
/// before each chunk or step, and answers `reply`. A client that gave up
/// stops the reading.
pub(in crate::server::shard) async fn read_rest(
    mut range: Box<ChunkedRange>,
    reply: Reply<RangeResponse>,
) {
    loop {
        tokio::task::yield_now().await;
        if reply.is_closed() {
            tracing::debug!(
                shard = range.shard,
                chunks = range.chunks,
                "range abandoned by its client"
            );
            return;
        }
        if let Step::Answered(answer) = range.read_chunk() {
            let _ = reply.send(answer);
            return;
        }
    }
}

#[cfg(test)]
mod tests;

//! HashKV served in steps from a snapshot of the store, as long ranges are
//! (`ranges`): hashing is a pass over every record the store keeps, which
//! for a large store holds a core for seconds, and with it the ticks,
//! heartbeats and applies of every shard on that core. The first step is
//! taken at once (a small store answers from it); the rest run in a task on
//! the core's `LocalSet` that yields to the runtime between steps. The
//! snapshot pins the state being hashed: writes applied meanwhile are not
//! in the hash, and the writer never waits for it.
//!
//! A record costs about 0.1 µs to find and hash: `cargo test --release -p
//! cairn-mvcc --test read_costs hash_kv_cost -- --ignored --nocapture` hashed
//! 200,000 records of 100 B in 22 ms in one pass, and in steps of
//! [`HASH_RECORDS_PER_STEP`] records the longest step took 0.52 ms.

use cairn_mvcc as mvcc;

use crate::routing::ShardId;
use crate::server::command::{Reply, ShardHash};
use crate::server::errors::ApiError;
use crate::server::shard::reads::ranges::read_error_to_api;
use crate::server::shard::Shard;

/// Records hashed per turn of the core.
pub(in crate::server::shard) const HASH_RECORDS_PER_STEP: usize = 4_096;

/// What the first step of a HashKV gave.
pub(in crate::server::shard) enum HashStart {
    /// The answer: every record was hashed, or the request failed.
    Answered(Result<ShardHash, ApiError>),
    /// Records are left: [`hash_rest`] hashes them.
    Stepping(Box<mvcc::HashKvStream>),
}

impl Shard {
    /// Answers a HashKV at `revision` (0: the current one): at once for a
    /// store hashed in one step, otherwise from a task that hashes a step
    /// at a time between the core's other work.
    /// A HashKV that arrives while a compaction's pass over the key index
    /// runs waits for it to end: the hash leaves out what compaction drops.
    pub(in crate::server::shard) fn serve_hash_kv(
        &mut self,
        revision: i64,
        reply: Reply<ShardHash>,
    ) {
        if self.store.compaction_running() {
            self.hashes_waiting.push((revision, reply));
            return;
        }
        match start_hash_kv(&mut self.store, revision, self.id, HASH_RECORDS_PER_STEP) {
            HashStart::Answered(answer) => {
                let _ = reply.send(answer);
            }
            HashStart::Stepping(stream) => {
                tokio::task::spawn_local(hash_rest(stream, self.id, HASH_RECORDS_PER_STEP, reply));
            }
        }
    }
}

/// Starts a HashKV of `store` at `revision` and takes its first step of at
/// most `per_step` records.
pub(in crate::server::shard) fn start_hash_kv(
    store: &mut mvcc::Store,
    revision: i64,
    shard: ShardId,
    per_step: usize,
) -> HashStart {
    let mut stream = match store.hash_kv_stream(revision) {
        Ok(stream) => stream,
        Err(e) => return HashStart::Answered(Err(read_error_to_api(shard, e))),
    };
    match step(&mut stream, shard, per_step) {
        Some(answer) => HashStart::Answered(answer),
        None => HashStart::Stepping(Box::new(stream)),
    }
}

/// Hashes the rest of a started HashKV, a step a turn, and sends the answer;
/// stops when the client has gone.
pub(in crate::server::shard) async fn hash_rest(
    mut stream: Box<mvcc::HashKvStream>,
    shard: ShardId,
    per_step: usize,
    reply: Reply<ShardHash>,
) {
    let mut steps = 1usize;
    loop {
        tokio::task::yield_now().await;
        if reply.is_closed() {
            tracing::debug!(shard, steps, "HashKV abandoned by its client");
            return;
        }
        steps += 1;
        if let Some(answer) = step(&mut stream, shard, per_step) {
            let _ = reply.send(answer);
            return;
        }
    }
}

/// One step: the answer once every record is hashed.
fn step(
    stream: &mut mvcc::HashKvStream,
    shard: ShardId,
    per_step: usize,
) -> Option<Result<ShardHash, ApiError>> {
    match stream.step(per_step) {
        Ok(None) => None,
        Ok(Some(h)) => Some(Ok(ShardHash {
            hash: h.hash,
            revision: h.hash_revision,
            compact_revision: h.compact_revision,
        })),
        Err(e) => Some(Err(read_error_to_api(shard, e))),
    }
}

#[cfg(test)]
mod tests;

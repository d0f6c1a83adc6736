//! Txns over several shards, modelled on `src/server/keyspace/txn_batch.rs` (the
//! batches), `src/server/keyspace/cross_txn.rs` (the coordinator and
//! `finish_earlier`) and `src/server/shard/cross.rs` (the shard's side),
//! step for step where the simulator allows.
//!
//! Each call the real code makes from one core to another (hold, compare,
//! check, propose, release, records, forget) is one step here, taken when
//! the run's actor is picked among the tick's events, so that messages,
//! disk writes, crashes and other txns interleave with it as they would
//! with the real calls. A call the real code answers later (a compare once
//! the entries from before the hold are applied, a part once applied) is
//! answered at the first step after the condition holds.
//!
//! # The batch ([`TxnRun`]), on the keyspace leader
//! 0. A txn joins the last batch over the same shards still taking its
//!    holds when no key it names is named by a txn of the batch, and the
//!    batch has fewer than `MAX_BATCH_TXNS` txns and stays within
//!    `MAX_BATCH_BYTES` with it; else it leads a new batch (`batch.rs`).
//!    A batch whose leading txn ends before the holds tells the joined
//!    ones to retry.
//! 1. Hold every shard of the batch in shard order, once for all its txns
//!    (`cross_hold`: the shard must be led here with its no-op applied,
//!    and the counter open; a held shard queues the batch). The holder
//!    remembers the shard's last index. Holding every shard closes the
//!    batch.
//! 2. Take a revision for each txn, in join order.
//! 3. Each shard answers the compares of every txn on its keys once it has
//!    applied through the holder's index: the keyspace before the batch,
//!    which for each txn is the keyspace before its own revision, since no
//!    other txn of the batch names its keys.
//! 4. Each shard some txn writes checks its hold still stands.
//! 5. Each txn's gets on shards its branch does not write are read at its
//!    revision less one. The shards no txn writes are released; each
//!    written shard proposes the parts of every txn that writes it in one
//!    entry (`x` alone, `X` for several, revisions ascending), each part
//!    with its txn's plan when the txn writes more than one shard;
//!    proposing (or failing to) releases the shard.
//! 6. Once every entry is applied here (or the stage times out), each txn
//!    whose parts all applied, or that writes nothing, is answered; each
//!    shard forgets the records of those in one entry. A txn with a part
//!    failed or unanswered is told "unknown" (etcd's timeout); before the
//!    parts, every txn of the batch may retry.
//!
//! # The opening ([`Opening`]), on every member whose shards all became ready
//! The counter stays closed until `finish_earlier` has run: each shard is
//! asked for its records (`cross_records`: first the fence, which ends
//! every hold; then the answer waits until the log's last index is
//! applied, and carries the records and the store's revision); every part
//! of each record whose shard has not reached `T` is proposed at `T` and
//! awaited, then each record is forgotten; then the counter opens at the
//! largest of what it handed out, the shards' revisions at readiness and
//! the epoch's start. A failure starts the finishing again.
//!
//! # Where each part is
//! `shard.rs` is the shard's side (holds, releases, proposing);
//! `batch.rs` joining and leading batches; `coordinator.rs` a batch's state
//! and its steps up to the checks of the holds, `parts.rs` the steps after
//! them (the gets at `T - 1`, the entries of parts, the forgets, the
//! clients' answers); `opening.rs` readiness and the opening; `draw.rs`
//! the txns the clients draw.

mod batch;
mod coordinator;
mod draw;
mod opening;
mod parts;
mod shard;

pub(super) use coordinator::{PartState, RunEnd, RunStage, TxnRun};
pub(super) use draw::{draw_burst, draw_txn};
pub(super) use opening::Opening;

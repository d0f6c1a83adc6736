//! Txns over several shards, modelled on `src/server/cross_txn.rs` (the
//! coordinator and `finish_earlier`) and `src/server/shard/cross.rs` (the
//! shard's side), step for step where the simulator allows.
//!
//! Each call the real code makes from one core to another (hold, compare,
//! check, propose, release, records, forget) is one step here, taken when
//! the run's actor is picked among the tick's events, so that messages,
//! disk writes, crashes and other txns interleave with it as they would
//! with the real calls. A call the real code answers later (a compare once
//! the entries from before the hold are applied, a part once applied) is
//! answered at the first step after the condition holds.
//!
//! # The coordinator ([`TxnRun`]), on the keyspace leader
//! 1. Hold every touched shard in shard order (`cross_hold`: the shard must
//!    be led here with its no-op applied, and the counter open; a held
//!    shard queues the txn). The holder remembers the shard's last index.
//! 2. Take `T` from the counter.
//! 3. Each shard answers the compares on its keys once it has applied
//!    through the holder's index; a compare's key lives on one shard.
//! 4. Each written shard checks its hold still stands.
//! 5. Gets on shards the chosen branch does not write are read at `T - 1`;
//!    with no written shard the txn is answered there. Else the shards not
//!    written are released, and each written shard proposes its part at
//!    `T`, with the whole plan when more than one is written; proposing
//!    (or failing to) releases the shard.
//! 6. Once every part is applied here, the written shards are told to
//!    forget the record and the client is answered. A part that failed, or
//!    a timeout after a part was proposed, answers "unknown" (etcd's
//!    timeout); before that, the client may retry.
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
//! `coordinator.rs` a run's state and its steps up to the checks of the
//! holds, `parts.rs` the steps after them (the gets at `T - 1`, the parts,
//! the client's answer); `opening.rs` readiness and the opening; `draw.rs`
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

//! The keyspace layer: requests routed to shards and answers merged
//! (`router`, `merge`, watches over several shards in `watch_shards` and
//! `watch_merge`), txns over several shards (`cross_plan`, `cross_txn`,
//! `txn_batch`, `hold_table`) and read-only ones (`cross_read`), on the revision counter below the shards
//! ([`crate::server::revisions`]).
//!
//! One [`Keyspace`] per member, shared by its cores, when it runs several
//! shards.

pub mod cross_plan;
pub mod cross_read;
pub mod cross_txn;
pub mod hold_table;
pub mod merge;
pub mod router;
#[cfg(test)]
pub mod test_router;
pub mod txn_batch;
pub mod watch_merge;
pub mod watch_shards;

use std::sync::Arc;

use crate::server::revisions::RevisionCounter;

/// What the member's cores share to run requests over several shards.
#[derive(Debug)]
pub struct Keyspace {
    /// The revision counter, shared with the member's shards.
    pub counter: Arc<RevisionCounter>,
    /// The shards this member's txns over several shards hold.
    pub holds: Arc<hold_table::HoldTable>,
    /// Txns over several shards gathered while they wait for the holds.
    pub batches: Arc<txn_batch::Batches>,
}

impl Keyspace {
    pub fn new(counter: Arc<RevisionCounter>) -> Self {
        Keyspace {
            counter,
            holds: Default::default(),
            batches: Default::default(),
        }
    }
}

//! Raft consensus as a pure state machine: no clock, no I/O, no threads, and
//! randomness only from a seed in the `Config`.
//!
//! Time enters as [`RawNode::tick`], peer messages as [`RawNode::step`],
//! client intents as [`RawNode::propose`], [`RawNode::propose_conf_change`],
//! [`RawNode::read_index`] and [`RawNode::transfer_leader`]. Everything the
//! outside world must do leaves in a [`Ready`]; see [`raw_node`] for the driver
//! loop and the persistence contract.
//!
//! Layers: the private `core::Raft` (roles, elections, replication), the
//! synchronous [`RawNode`], and the per-shard driver (outside this module)
//! that owns all I/O. The log the driver persists is read back through the
//! [`Storage`] trait; [`MemStorage`] implements it in memory.
//!
//! Features and where the Raft paper / thesis describes them:
//! - elections with randomized timeouts (paper 5.2), pre-vote (thesis 9.6),
//!   check-quorum and leader stickiness (thesis 6.2, 4.2.3);
//! - replication with per-member progress (probe / replicate / snapshot), an
//!   in-flight window by count and bytes, pipelining (thesis 10.2), fast
//!   backtracking (paper 5.3), commit only of current-term entries (paper
//!   5.4.2) and the leader writing in parallel with sending (thesis 10.2.1);
//! - proposal forwarding, refusal with a clear error when there is no leader
//!   or a transfer runs, a limit on uncommitted bytes;
//! - ReadIndex and lease reads, batched and forwarded (thesis 6.4);
//! - leader transfer with a timeout (thesis 3.10);
//! - learners and single-member changes, one at a time (thesis 4.1, 4.2.1);
//! - snapshots and log compaction (paper 7, thesis 5).

pub mod config;
mod core;
mod log;
pub mod progress;
pub mod raw_node;
mod read_only;
pub mod storage;

pub use cairn_proto::raftpb::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, MessageType,
    Snapshot, SnapshotMetadata,
};
pub use config::{Config, ConfigError, ReadOnlyOption, SafetyMutation};
pub use core::StateRole;
pub use progress::ProgressState;
pub use raw_node::{PeerStatus, RawNode, ReadState, Ready, SnapshotStatus, SoftState, Status};
pub use storage::{MemStorage, RaftState, Storage, StorageError};

/// No member: no leader known, no vote cast.
pub const NONE: u64 = 0;

/// Why Raft refused an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RaftError {
    #[error("invalid raft config: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// No leader is known in `term`; retry once one is elected.
    #[error("proposal dropped: no leader known in term {term}")]
    NoLeader { term: u64 },
    /// This follower does not forward proposals.
    #[error("proposal dropped: forwarding to leader {leader} is disabled")]
    ForwardingDisabled { leader: u64 },
    /// Leadership is being handed to `transferee`; retry on the new leader.
    #[error("proposal dropped: leadership is being transferred to {transferee}")]
    TransferInProgress { transferee: u64 },
    /// Too many proposed bytes await commit.
    #[error(
        "proposal dropped: {uncommitted_bytes} uncommitted bytes reach the limit of {limit_bytes}"
    )]
    UncommittedLimit {
        uncommitted_bytes: u64,
        limit_bytes: u64,
    },
    /// A previous membership change (at `pending_index`) is not yet applied.
    #[error(
        "conf change dropped: change at index {pending_index} not yet applied (applied {applied_index})"
    )]
    ConfChangePending {
        pending_index: u64,
        applied_index: u64,
    },
    #[error("conf change refused: {0}")]
    BadConfChange(String),
    /// This member is no longer part of the group.
    #[error("proposal dropped: member {id} is not in the membership")]
    NotMember { id: u64 },
    #[error("proposal has no entries")]
    EmptyProposal,
    /// A peer sent a message type only the local driver may produce.
    #[error("message {msg_type:?} from {from} is local-only and may not come from a peer")]
    LocalMessage { msg_type: MessageType, from: u64 },
    #[error("message type {msg_type} from {from} is unknown")]
    UnknownMessageType { msg_type: i32, from: u64 },
}

#[cfg(test)]
mod tests;

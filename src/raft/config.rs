//! Configuration of one Raft member, with every limit named and checked.

/// How a leader answers linearizable reads (Raft thesis 6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadOnlyOption {
    /// ReadIndex: the leader confirms it is still leader by a heartbeat round
    /// with a quorum before answering. Safe whatever the clocks do.
    #[default]
    Safe,
    /// Lease: the leader answers from its commit index without a round,
    /// relying on check-quorum and on followers ignoring candidates while they
    /// hear from a leader. Correct only if clock drift and message delay stay
    /// well below the election timeout (thesis 6.4.1).
    LeaseBased,
}

/// A Raft safety rule to switch off, so that tests can show the simulator
/// catches the resulting violations. Only a build with the `raft-mutations`
/// feature (test builds, through the package's dev-dependency on itself)
/// can set one: a release build's [`Config`] has no such knob.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafetyMutation {
    /// Commit an entry of a previous term by counting replicas (breaks
    /// Raft paper 5.4.2).
    CommitPreviousTermByCount,
    /// Grant votes without the up-to-date log check (breaks Raft paper 5.4.1).
    VoteWithoutLogCheck,
}

/// Largest in-flight window a member may be given, in messages.
pub const MAX_INFLIGHT_MSGS_LIMIT: usize = 1 << 16;
/// Smallest sensible election timeout relative to the heartbeat.
pub const MIN_ELECTION_TO_HEARTBEAT_RATIO: u64 = 2;

const _: () = assert!(MIN_ELECTION_TO_HEARTBEAT_RATIO >= 2);

#[derive(Debug, Clone)]
pub struct Config {
    /// This member's id; never 0.
    pub id: u64,
    /// Raft group (shard) id, used only as a field in log lines.
    pub group_id: u64,
    /// A follower that hears nothing from a leader for a random number of
    /// ticks in `[election_timeout_ticks, 2 * election_timeout_ticks)`
    /// campaigns (Raft paper 5.2).
    pub election_timeout_ticks: u64,
    pub heartbeat_timeout_ticks: u64,
    /// Index the state machine has applied up to, on restart. Everything up
    /// to it is taken as committed.
    pub applied_index: u64,
    /// Entries per append message are limited to this encoded size (at
    /// least one entry is always sent).
    pub max_size_per_msg_bytes: u64,
    /// Committed entries per `Ready` are limited to this encoded size.
    pub max_committed_size_per_ready_bytes: u64,
    /// Proposals are refused while the leader's uncommitted entries exceed
    /// this many payload bytes.
    pub max_uncommitted_entries_size_bytes: u64,
    /// In-flight window per follower in replicate state, in messages.
    pub max_inflight_msgs: usize,
    /// In-flight window per follower in replicate state, in bytes.
    pub max_inflight_bytes: u64,
    /// A leader that has not heard from a quorum within an election timeout
    /// steps down, and followers that hear from a leader ignore candidates.
    pub check_quorum: bool,
    /// Campaign first with a pre-vote that changes no term (thesis 9.6).
    pub pre_vote: bool,
    /// With `check_quorum`: a member that just started ignores vote and
    /// pre-vote requests (but a leader transfer's) for one election timeout,
    /// as if it had just heard from a leader. A restarted member forgets the
    /// leader it heard before it stopped; without the hold it could vote at
    /// once and help elect a new leader while the old one still counts on
    /// its lease (docs/KEYSPACE.md, "Leader leases").
    pub vote_hold_after_start: bool,
    pub read_only_option: ReadOnlyOption,
    /// Followers refuse proposals instead of forwarding them to the leader.
    pub disable_proposal_forwarding: bool,
    /// A leader transfer that has not completed after this many ticks is
    /// aborted and proposals are accepted again (thesis 3.10).
    pub leader_transfer_timeout_ticks: u64,
    /// Seed of the election timeout randomisation.
    pub seed: u64,
    /// The driver may take the next `Ready` while earlier ones are still
    /// being written (see the raw node's docs): committed entries are then
    /// handed out only up to this member's durable log, so whatever the
    /// driver applies is already durable here.
    pub async_append: bool,
    #[cfg(feature = "raft-mutations")]
    #[doc(hidden)]
    pub mutation: Option<SafetyMutation>,
}

impl Config {
    /// Defaults for member `id`: 10-tick election, 1-tick heartbeat, pre-vote
    /// and check-quorum on.
    pub fn new(id: u64) -> Self {
        Config {
            id,
            group_id: 0,
            election_timeout_ticks: 10,
            heartbeat_timeout_ticks: 1,
            applied_index: 0,
            max_size_per_msg_bytes: 1 << 20,
            max_committed_size_per_ready_bytes: 16 << 20,
            max_uncommitted_entries_size_bytes: 64 << 20,
            max_inflight_msgs: 256,
            max_inflight_bytes: 32 << 20,
            check_quorum: true,
            pre_vote: true,
            vote_hold_after_start: false,
            read_only_option: ReadOnlyOption::Safe,
            disable_proposal_forwarding: false,
            leader_transfer_timeout_ticks: 10,
            seed: id,
            async_append: false,
            #[cfg(feature = "raft-mutations")]
            mutation: None,
        }
    }

    /// The safety rule a test switched off; always None in a build without
    /// the `raft-mutations` feature.
    pub fn mutation(&self) -> Option<SafetyMutation> {
        #[cfg(feature = "raft-mutations")]
        return self.mutation;
        #[cfg(not(feature = "raft-mutations"))]
        None
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::ZeroId);
        }
        if self.heartbeat_timeout_ticks == 0 {
            return Err(ConfigError::ZeroHeartbeat);
        }
        if self.election_timeout_ticks
            < MIN_ELECTION_TO_HEARTBEAT_RATIO * self.heartbeat_timeout_ticks
        {
            return Err(ConfigError::ElectionTooShort {
                election_timeout_ticks: self.election_timeout_ticks,
                heartbeat_timeout_ticks: self.heartbeat_timeout_ticks,
            });
        }
        if self.max_inflight_msgs == 0 || self.max_inflight_msgs > MAX_INFLIGHT_MSGS_LIMIT {
            return Err(ConfigError::InflightMsgs {
                max_inflight_msgs: self.max_inflight_msgs,
            });
        }
        if self.max_inflight_bytes == 0 {
            return Err(ConfigError::ZeroLimit("max_inflight_bytes"));
        }
        if self.max_size_per_msg_bytes == 0 {
            return Err(ConfigError::ZeroLimit("max_size_per_msg_bytes"));
        }
        if self.max_committed_size_per_ready_bytes == 0 {
            return Err(ConfigError::ZeroLimit("max_committed_size_per_ready_bytes"));
        }
        if self.max_uncommitted_entries_size_bytes == 0 {
            return Err(ConfigError::ZeroLimit("max_uncommitted_entries_size_bytes"));
        }
        if self.leader_transfer_timeout_ticks == 0 {
            return Err(ConfigError::ZeroLimit("leader_transfer_timeout_ticks"));
        }
        if self.read_only_option == ReadOnlyOption::LeaseBased && !self.check_quorum {
            return Err(ConfigError::LeaseWithoutCheckQuorum);
        }
        Ok(())
    }
}

/// A configuration Raft refuses to run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("raft member id must not be 0")]
    ZeroId,
    #[error("raft heartbeat_timeout_ticks must be positive")]
    ZeroHeartbeat,
    #[error(
        "raft election_timeout_ticks ({election_timeout_ticks}) must be at least \
         {MIN_ELECTION_TO_HEARTBEAT_RATIO} x heartbeat_timeout_ticks ({heartbeat_timeout_ticks})"
    )]
    ElectionTooShort {
        election_timeout_ticks: u64,
        heartbeat_timeout_ticks: u64,
    },
    #[error(
        "raft max_inflight_msgs ({max_inflight_msgs}) must be in 1..={MAX_INFLIGHT_MSGS_LIMIT}"
    )]
    InflightMsgs { max_inflight_msgs: usize },
    #[error("raft {0} must be positive")]
    ZeroLimit(&'static str),
    #[error("raft lease-based reads need check_quorum")]
    LeaseWithoutCheckQuorum,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        Config::new(1).validate().unwrap();
    }

    // Raft thesis 6.4.1: a lease is only sound when the leader steps down without a quorum.
    #[test]
    fn lease_reads_require_check_quorum() {
        let mut c = Config::new(1);
        c.read_only_option = ReadOnlyOption::LeaseBased;
        c.check_quorum = false;
        assert_eq!(c.validate(), Err(ConfigError::LeaseWithoutCheckQuorum));
    }

    #[test]
    fn rejects_bad_limits() {
        let mut c = Config::new(0);
        assert_eq!(c.validate(), Err(ConfigError::ZeroId));
        c.id = 1;
        c.election_timeout_ticks = 1;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::ElectionTooShort { .. })
        ));
    }
}

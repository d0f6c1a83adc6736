//! The errors the client API returns, with etcd's gRPC codes and messages for the
//! same conditions, so that clients which match on them (etcdctl, clientv3's
//! retry logic, Kubernetes' storage layer) behave as they do against etcd.

use tonic::{Code, Status};

/// A request failed; each variant maps to the status etcd returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// A put with `ignore_value` or `ignore_lease` of a key that does not
    /// exist, or a txn op with no request in it.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRev,
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExist,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: member ID already exist")]
    MemberExist,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExist,
    #[error("etcdserver: given member URLs are invalid")]
    MemberBadUrls,
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    /// This member does not lead the shard a membership change needs; the
    /// change is carried to `leader` (0: none known yet).
    #[error("etcdserver: not leader")]
    NotLeader { leader: u64 },
    #[error("etcdserver: rpc not supported for learner")]
    NotSupportedForLearner,
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
    /// A membership change that would leave fewer started members (ones
    /// that have published their name) than a quorum.
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStartedMembers,
    /// A membership change that the members' connections could not carry
    /// without risking the quorum.
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
    /// A write whose outcome this member cannot tell: it was proposed, and
    /// leadership changed before it was seen applied (etcd's answer when a
    /// leader fails under a request). A txn over several shards is then
    /// applied whole or not at all; a read tells which.
    #[error("etcdserver: request timed out, possibly due to previous leader failure")]
    TimeoutLeaderFail,
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    #[error("cairn: {0} is not supported")]
    Unsupported(&'static str),
    /// The local store failed (I/O error, poisoned after a failed sync): the member
    /// stops serving writes on that shard until restarted.
    #[error("cairn: shard {shard}: storage failure: {reason}")]
    Storage { shard: u32, reason: String },
}

impl ApiError {
    /// The gRPC code etcd uses for the same condition.
    pub fn code(&self) -> Code {
        use ApiError::*;
        match self {
            EmptyKey | KeyNotFound | ValueProvided | LeaseProvided | TooManyOps | DuplicateKey
            | InvalidSortOption | RequestTooLarge | MemberBadUrls | UserEmpty | RoleEmpty
            | AuthFailed | PermissionNotGiven | InvalidAuthMgmt | AuthOldRevision => {
                Code::InvalidArgument
            }
            PermissionDenied => Code::PermissionDenied,
            InvalidAuthToken => Code::Unauthenticated,
            Compacted | FutureRev | LeaseTtlTooLarge => Code::OutOfRange,
            NoSpace | TooManyRequests => Code::ResourceExhausted,
            LeaseNotFound | MemberNotFound => Code::NotFound,
            LeaseExist
            | MemberExist
            | PeerUrlExist
            | MemberNotLearner
            | LearnerNotReady
            | BadLeaderTransferee
            | TooManyLearners
            | NotEnoughStartedMembers
            | RootUserNotExist
            | RootRoleNotExist
            | UserAlreadyExist
            | UserNotFound
            | RoleAlreadyExist
            | RoleNotFound
            | RoleNotGranted
            | PermissionNotGranted
            | AuthNotEnabled => Code::FailedPrecondition,
            NoLeader
            | LeaderChanged
            | Stopped
            | Timeout
            | TimeoutLeaderFail
            | LeaderTransferTimeout
            | NotLeader { .. }
            | Unhealthy
            | NotSupportedForLearner => Code::Unavailable,
            Corrupt => Code::DataLoss,
            Unsupported(_) => Code::Unimplemented,
            Storage { .. } => Code::Internal,
        }
    }
}

impl ApiError {
    /// Whether asking again (after an election, or at another member) may
    /// succeed: no leader yet, a leader change, a timeout.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ApiError::NoLeader | ApiError::LeaderChanged | ApiError::Timeout
        )
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages_match_etcd() {
        let cases = [
            (
                ApiError::EmptyKey,
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                ApiError::KeyNotFound,
                Code::InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                ApiError::Compacted,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                ApiError::FutureRev,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                ApiError::TooManyOps,
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                ApiError::RequestTooLarge,
                Code::InvalidArgument,
                "etcdserver: request is too large",
            ),
            (
                ApiError::PermissionDenied,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                ApiError::InvalidAuthToken,
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            ),
            (
                ApiError::AuthFailed,
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                ApiError::UserNotFound,
                Code::FailedPrecondition,
                "etcdserver: user name not found",
            ),
            (
                ApiError::NoLeader,
                Code::Unavailable,
                "etcdserver: no leader",
            ),
        ];
        for (e, code, msg) in cases {
            let s = Status::from(e);
            assert_eq!(s.code(), code);
            assert_eq!(s.message(), msg);
        }
    }
}

//! Who is answering: the cluster and member ids every response header
//! carries, and the Raft term and revision it reports.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use cairn_proto::etcdserverpb::ResponseHeader;

/// Who is answering: stamped into every response header.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cluster_id: u64,
    pub member_id: u64,
    /// Shard 0's Raft term on this member, as that shard last reported it:
    /// the term of headers no shard produced (watch, lease, cluster, auth).
    /// One atomic load per header, no lock.
    pub raft_term: Arc<AtomicU64>,
    /// The highest revision a shard of this member has applied, as the
    /// shards publish it: the revision of headers etcd stamps with its
    /// store's current revision where no shard answers (lease time-to-live,
    /// list and keep-alive). One atomic load per header, no lock.
    pub revision: Arc<AtomicI64>,
}

impl Identity {
    pub fn new(cluster_id: u64, member_id: u64) -> Identity {
        Identity {
            cluster_id,
            member_id,
            raft_term: Arc::default(),
            revision: Arc::default(),
        }
    }

    pub fn header(&self, revision: i64, raft_term: u64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term,
        }
    }

    /// A header at `revision` with the member's current term.
    pub fn header_now(&self, revision: i64) -> ResponseHeader {
        self.header(revision, self.raft_term.load(Ordering::Relaxed))
    }

    /// A header at the member's current revision and term.
    pub fn header_current(&self) -> ResponseHeader {
        self.header_now(self.revision.load(Ordering::Relaxed))
    }

    /// Fills in the member fields of a header a shard produced, and the
    /// member's term where no shard's answer gave one (a txn over several
    /// shards, which the keyspace leader answers for them all; a read-only
    /// one that read no range).
    pub fn stamp(&self, header: &mut Option<ResponseHeader>) {
        let h = header.get_or_insert_with(Default::default);
        h.cluster_id = self.cluster_id;
        h.member_id = self.member_id;
        if h.raft_term == 0 {
            h.raft_term = self.raft_term.load(Ordering::Relaxed);
        }
    }
}

//! Who is answering: the cluster and member ids every response header
//! carries, and the Raft term it reports.

use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl Identity {
    pub fn new(cluster_id: u64, member_id: u64) -> Identity {
        Identity {
            cluster_id,
            member_id,
            raft_term: Arc::default(),
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

    /// Fills in the member fields of a header a shard produced.
    pub fn stamp(&self, header: &mut Option<ResponseHeader>) {
        let h = header.get_or_insert_with(Default::default);
        h.cluster_id = self.cluster_id;
        h.member_id = self.member_id;
    }
}

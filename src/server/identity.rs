//! Who is answering: the cluster and member ids every response header
//! carries.

use cairn_proto::etcdserverpb::ResponseHeader;

/// Who is answering: stamped into every response header.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cluster_id: u64,
    pub member_id: u64,
}

impl Identity {
    pub fn header(&self, revision: i64, raft_term: u64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term,
        }
    }

    /// Fills in the member fields of a header a shard produced.
    pub fn stamp(&self, header: &mut Option<ResponseHeader>) {
        let h = header.get_or_insert_with(Default::default);
        h.cluster_id = self.cluster_id;
        h.member_id = self.member_id;
    }
}

//! etcd's read-only txns (every op of both branches a range), read as a
//! range is read rather than applied through the log: etcd serves them so,
//! linearizable after a ReadIndex round unless every range is serializable.
//! A txn carries at most `--max-txn-ops` ranges and is read in one go on the
//! core, as applying it would.

use cairn_mvcc as mvcc;
use cairn_proto::etcdserverpb::{TxnRequest, TxnResponse};

use crate::server::command::Reply;
use crate::server::convert;
use crate::server::shard::Shard;

use super::ranges::store_revision;

impl Shard {
    /// Reads `request` at the store's revision, or at `point` (several
    /// shards): then at the point's revision, or at the store's own when
    /// the point is past it (this shard has applied everything up to the
    /// point, so nothing of it lies between), and the answer's revision is
    /// the point's.
    pub(in crate::server::shard) fn serve_txn(
        &self,
        request: &TxnRequest,
        reply: Reply<TxnResponse>,
        point: Option<i64>,
    ) {
        let current = self.store.current_revision();
        let mut txn = convert::txn_from_pb(request);
        let revision = match point {
            None => 0,
            Some(point) => {
                // A range's revision up to the point names the store's
                // state when it is past the store's (as the point does).
                for op in txn.success.iter_mut().chain(txn.failure.iter_mut()) {
                    if let mvcc::RequestOp::Range(r) = op {
                        if r.revision <= point {
                            r.revision = store_revision(r.revision, current);
                        }
                    }
                }
                store_revision(point, current)
            }
        };
        let answer = self
            .store
            .read_txn(&txn, revision)
            .map(|r| {
                let mut r = convert::txn_to_pb(r, self.header(0));
                if let Some(point) = point {
                    convert::set_txn_revision(&mut r, point);
                }
                r
            })
            .map_err(|e| self.read_error(e));
        let _ = reply.send(answer);
    }
}

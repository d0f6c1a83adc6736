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
        let revision = point.filter(|&p| p < current).unwrap_or(0);
        let mut txn = convert::txn_from_pb(request);
        if let Some(point) = point {
            // A range's revision between the store's and the point's names
            // the store's state (nothing of this shard lies between).
            for op in txn.success.iter_mut().chain(txn.failure.iter_mut()) {
                if let mvcc::RequestOp::Range(r) = op {
                    if r.revision > current && r.revision <= point {
                        r.revision = 0;
                    }
                }
            }
        }
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

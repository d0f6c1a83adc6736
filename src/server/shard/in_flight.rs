//! What the entries a leader proposed and has not applied yet touch. A txn
//! over several shards reads its compares and checks its ops on the state
//! the shard has applied; it waits only for the entries in flight that touch
//! its keys, not for every entry proposed before its hold, so txns over
//! unrelated keys do not wait a Raft round for each other.

use std::collections::VecDeque;

use bytes::Bytes;
use cairn_proto::cairnpb::{shard_request, ShardRequest};
use cairn_proto::etcdserverpb::{request_op, TxnRequest};
use prost::Message as _;

use crate::server::key_ranges::KeyRangeSet;

/// The keys an entry touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Touch {
    /// Key ranges as etcd gives them: `(key, range_end)`, `range_end` empty
    /// for one key and `"\0"` for every key from `key` on.
    Ranges(Vec<(Bytes, Bytes)>),
    /// State every request may depend on (a lease's grant or revoke, whose
    /// keys the request does not name).
    Everything,
}

impl Touch {
    /// What `request` touches; None for entries that change no key and no
    /// lease (closes, compactions, alarms, auth changes).
    pub(super) fn of_request(request: &shard_request::Request) -> Option<Touch> {
        use shard_request::Request as R;
        match request {
            R::Put(p) => Some(Touch::Ranges(vec![(p.key.clone(), Bytes::new())])),
            R::DeleteRange(d) => Some(Touch::Ranges(vec![(d.key.clone(), d.range_end.clone())])),
            R::Txn(t) => Some(Touch::Ranges(txn_ranges(t))),
            R::CrossPart(p) if p.revoke_lease != 0 => Some(Touch::Everything),
            R::CrossPart(p) => Some(Touch::Ranges(
                p.ops.as_ref().map(txn_ranges).unwrap_or_default(),
            )),
            R::CrossParts(ps) => {
                let mut ranges = Vec::new();
                for p in ps.parts.iter().filter_map(|p| p.part.as_ref()) {
                    if p.revoke_lease != 0 {
                        return Some(Touch::Everything);
                    }
                    if let Some(ops) = &p.ops {
                        add_txn_ranges(ops, &mut ranges);
                    }
                }
                Some(Touch::Ranges(ranges))
            }
            R::LeaseGrant(_) | R::LeaseRevoke(_) => Some(Touch::Everything),
            _ => None,
        }
    }

    /// What the encoded entries of a forwarded proposal touch together.
    pub(super) fn of_entries<'a>(data: impl Iterator<Item = &'a Bytes>) -> Option<Touch> {
        let mut all: Option<Touch> = None;
        for d in data {
            let touch = match ShardRequest::decode(d.clone()) {
                Ok(ShardRequest {
                    request: Some(r), ..
                }) => Touch::of_request(&r),
                // Not ours to judge here (a request kind this build does not
                // know, or no request); apply refuses it. Wait for it.
                Ok(_) | Err(_) => Some(Touch::Everything),
            };
            all = match (all, touch) {
                (a, None) => a,
                (None, t) => t,
                (Some(Touch::Everything), _) | (_, Some(Touch::Everything)) => {
                    Some(Touch::Everything)
                }
                (Some(Touch::Ranges(mut a)), Some(Touch::Ranges(b))) => {
                    a.extend(b);
                    Some(Touch::Ranges(a))
                }
            };
        }
        all
    }

    fn overlaps(&self, ranges: &KeyRangeSet) -> bool {
        match self {
            Touch::Everything => true,
            Touch::Ranges(mine) => ranges.overlaps_any(mine),
        }
    }
}

/// Every key range `t` names: its compares' and every op's of both
/// branches, nested txns included.
pub(crate) fn txn_ranges(t: &TxnRequest) -> Vec<(Bytes, Bytes)> {
    let mut out = Vec::new();
    add_txn_ranges(t, &mut out);
    out
}

fn add_txn_ranges(t: &TxnRequest, out: &mut Vec<(Bytes, Bytes)>) {
    for c in &t.compare {
        out.push((c.key.clone(), c.range_end.clone()));
    }
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(request_op::Request::RequestRange(r)) => {
                out.push((r.key.clone(), r.range_end.clone()))
            }
            Some(request_op::Request::RequestPut(p)) => out.push((p.key.clone(), Bytes::new())),
            Some(request_op::Request::RequestDeleteRange(d)) => {
                out.push((d.key.clone(), d.range_end.clone()))
            }
            Some(request_op::Request::RequestTxn(n)) => add_txn_ranges(n, out),
            None => {}
        }
    }
}

/// An entry (or the entries of one forwarded proposal) in flight: kept
/// encoded, and decoded only when a txn over several shards asks, once.
#[derive(Debug)]
enum Pending {
    Encoded(Vec<Bytes>),
    Decoded(Option<Touch>),
}

/// The entries this leader proposed that are not applied yet, by index.
/// Proposing costs a reference to the encoded entry; what it touches is
/// worked out only for the holds of txns over several shards.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    entries: VecDeque<(u64, Pending)>,
}

impl InFlight {
    /// Entries up to `index` (the last index after proposing them) carry
    /// `data`.
    pub(super) fn proposed(&mut self, index: u64, data: Vec<Bytes>) {
        self.entries.push_back((index, Pending::Encoded(data)));
    }

    /// Entries up to `applied` are applied.
    pub(super) fn applied(&mut self, applied: u64) {
        while self.entries.front().is_some_and(|(i, _)| *i <= applied) {
            self.entries.pop_front();
        }
    }

    /// This member stopped leading: what it proposed is no longer its to
    /// track.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The index to apply before reading `ranges` as of `up_to`: that of
    /// the last entry at or below `up_to` touching them (0: none).
    pub(super) fn last_touching(&mut self, up_to: u64, ranges: &[(Bytes, Bytes)]) -> u64 {
        let ranges = KeyRangeSet::new(ranges);
        for (i, pending) in self.entries.iter_mut().rev() {
            if *i > up_to {
                continue;
            }
            if let Pending::Encoded(data) = pending {
                *pending = Pending::Decoded(Touch::of_entries(data.iter()));
            }
            if let Pending::Decoded(Some(t)) = pending {
                if t.overlaps(&ranges) {
                    return *i;
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(k: &str, e: &str) -> (Bytes, Bytes) {
        (
            Bytes::copy_from_slice(k.as_bytes()),
            Bytes::copy_from_slice(e.as_bytes()),
        )
    }

    fn ranges_overlap(a: &(Bytes, Bytes), b: &(Bytes, Bytes)) -> bool {
        KeyRangeSet::new(std::slice::from_ref(a)).overlaps(b)
    }

    #[test]
    fn ranges_overlap_as_etcd_reads_them() {
        assert!(ranges_overlap(&r("a", ""), &r("a", "")));
        assert!(!ranges_overlap(&r("a", ""), &r("b", "")));
        assert!(!ranges_overlap(&r("a", ""), &r("a\0", "")));
        assert!(ranges_overlap(&r("a", "c"), &r("b", "")));
        assert!(!ranges_overlap(&r("a", "c"), &r("c", "")));
        assert!(ranges_overlap(&r("b", "\0"), &r("zzz", "")));
        assert!(!ranges_overlap(&r("b", "\0"), &r("a", "b")));
        assert!(ranges_overlap(&r("\0", "\0"), &r("a", "")));
    }

    /// An encoded entry of `request`.
    fn entry(request: shard_request::Request) -> Vec<Bytes> {
        vec![Bytes::from(
            ShardRequest {
                request: Some(request),
                ..Default::default()
            }
            .encode_to_vec(),
        )]
    }

    fn put(k: &str) -> Vec<Bytes> {
        entry(shard_request::Request::Put(
            cairn_proto::etcdserverpb::PutRequest {
                key: Bytes::copy_from_slice(k.as_bytes()),
                ..Default::default()
            },
        ))
    }

    #[test]
    fn a_txn_waits_only_for_entries_touching_its_keys() {
        let mut f = InFlight::default();
        f.proposed(5, put("a"));
        f.proposed(
            6,
            entry(shard_request::Request::DeleteRange(
                cairn_proto::etcdserverpb::DeleteRangeRequest {
                    key: Bytes::from_static(b"b"),
                    range_end: Bytes::from_static(b"d"),
                    ..Default::default()
                },
            )),
        );
        f.proposed(7, entry(shard_request::Request::Close(Default::default())));
        f.proposed(9, [put("x"), put("y")].concat());
        assert_eq!(f.last_touching(9, &[r("c", "")]), 6);
        assert_eq!(f.last_touching(9, &[r("a", ""), r("y", "")]), 9);
        assert_eq!(
            f.last_touching(8, &[r("x", "")]),
            0,
            "proposed after the hold"
        );
        assert_eq!(
            f.last_touching(9, &[r("q", "")]),
            0,
            "a close touches nothing"
        );
        f.proposed(
            10,
            entry(shard_request::Request::LeaseRevoke(
                cairn_proto::etcdserverpb::LeaseRevokeRequest { id: 3 },
            )),
        );
        assert_eq!(
            f.last_touching(10, &[r("q", "")]),
            10,
            "a revoke touches everything"
        );
        f.applied(9);
        assert_eq!(f.last_touching(10, &[r("a", "")]), 10);
        f.applied(10);
        assert_eq!(f.last_touching(10, &[r("a", "")]), 0);
    }
}

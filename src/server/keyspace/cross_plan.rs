//! The plan of a txn over several shards (docs/KEYSPACE.md, "Transactions
//! over several shards"): every compare it names, each decided from the
//! shards' answers over their own keys; the ops of the branches they choose,
//! split by shard; and one etcd answer merged from the shards' answers to
//! their ops.

use std::collections::{BTreeMap, BTreeSet};

use cairn_proto::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};

use crate::server::convert;

/// The sub revision of a part's op is its place in the txn shifted left by
/// this: room for every key a delete of one op deletes on one shard.
pub const OP_SUB_SHIFT: u32 = 32;
use crate::routing::{RoutingTable, ShardId};
use crate::server::keyspace::merge::merge_ranges;

/// Every compare of `t` and of its nested txns (both branches), the txn's
/// own first, then its success ops' nested txns, then its failure ops'.
pub(super) fn all_compares(t: &TxnRequest, out: &mut Vec<Compare>) {
    out.extend(t.compare.iter().cloned());
    for op in t.success.iter().chain(&t.failure) {
        if let Some(request_op::Request::RequestTxn(nested)) = &op.request {
            all_compares(nested, out);
        }
    }
}

/// Each compare over the whole keyspace from each shard's answer over its
/// own keys: false if false on any shard; true if true on some; on no
/// shard holding a key of its range, etcd's rule for a missing key.
pub(super) fn combine(compares: &[Compare], per_shard: &[Vec<Option<bool>>]) -> Vec<bool> {
    compares
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut seen = None;
            for answers in per_shard {
                match answers.get(i).copied().flatten() {
                    Some(false) => return false,
                    Some(true) => seen = Some(true),
                    None => {}
                }
            }
            seen.unwrap_or_else(|| cairn_mvcc::compare_absent(&convert::compare_from_pb(c)))
        })
        .collect()
}

/// Where an op's answer comes from once the parts are applied.
enum Slot {
    Put {
        shard: ShardId,
        at: usize,
    },
    Delete {
        parts: Vec<(ShardId, usize)>,
    },
    Range {
        req: RangeRequest,
        parts: Vec<(ShardId, usize)>,
    },
    Txn {
        succeeded: bool,
        slots: Vec<Slot>,
    },
}

/// The txn's ops on the branches its compares chose, by shard.
pub(super) struct Plan {
    top: Slot,
    pub ops: BTreeMap<ShardId, Vec<RequestOp>>,
    /// For each op of `ops`, the sub revision its writes start at: its
    /// place in the txn, shifted by [`OP_SUB_SHIFT`].
    pub subs: BTreeMap<ShardId, Vec<i64>>,
    /// Ops planned so far.
    next_op: i64,
    /// Shards with a put or a delete.
    pub written: BTreeSet<ShardId>,
}

impl Plan {
    /// Whether the chosen branches put a key.
    pub(super) fn puts(&self) -> bool {
        self.ops
            .values()
            .flatten()
            .any(|op| matches!(op.request, Some(request_op::Request::RequestPut(_))))
    }

    pub(super) fn of(t: &TxnRequest, outcomes: &[bool], routing: &RoutingTable) -> Plan {
        let mut plan = Plan {
            top: Slot::Txn {
                succeeded: false,
                slots: Vec::new(),
            },
            ops: BTreeMap::new(),
            subs: BTreeMap::new(),
            next_op: 0,
            written: BTreeSet::new(),
        };
        let mut pos = 0;
        plan.top = plan.txn(t, outcomes, &mut pos, routing, true);
        plan
    }

    /// The slot of txn `t`, whose compares start at `pos` in `outcomes`;
    /// its ops join the plan only when `chosen` (a nested txn on a branch
    /// not taken still moves `pos` past its compares).
    fn txn(
        &mut self,
        t: &TxnRequest,
        outcomes: &[bool],
        pos: &mut usize,
        routing: &RoutingTable,
        chosen: bool,
    ) -> Slot {
        let succeeded = outcomes[*pos..*pos + t.compare.len()].iter().all(|&ok| ok);
        *pos += t.compare.len();
        let mut slots = Vec::new();
        for (branch, ops) in [(true, &t.success), (false, &t.failure)] {
            let taken = chosen && branch == succeeded;
            for op in ops {
                let Some(request) = &op.request else {
                    continue;
                };
                if let request_op::Request::RequestTxn(nested) = request {
                    let slot = self.txn(nested, outcomes, pos, routing, taken);
                    if taken {
                        slots.push(slot);
                    }
                } else if taken {
                    slots.push(self.op(op, request, routing));
                }
            }
        }
        Slot::Txn { succeeded, slots }
    }

    fn op(
        &mut self,
        op: &RequestOp,
        request: &request_op::Request,
        routing: &RoutingTable,
    ) -> Slot {
        let place = self.next_op << OP_SUB_SHIFT;
        self.next_op += 1;
        let add = |plan: &mut Plan, shard: ShardId| {
            plan.subs.entry(shard).or_default().push(place);
            let ops = plan.ops.entry(shard).or_default();
            ops.push(op.clone());
            (shard, ops.len() - 1)
        };
        match request {
            request_op::Request::RequestPut(p) => {
                let shard = routing.shard_for_key(&p.key);
                self.written.insert(shard);
                let (shard, at) = add(self, shard);
                Slot::Put { shard, at }
            }
            request_op::Request::RequestDeleteRange(d) => {
                let shards = routing.shards_for_range(&d.key, &d.range_end);
                self.written.extend(shards.iter().copied());
                Slot::Delete {
                    parts: shards.into_iter().map(|s| add(self, s)).collect(),
                }
            }
            request_op::Request::RequestRange(r) => Slot::Range {
                req: r.clone(),
                parts: routing
                    .shards_for_range(&r.key, &r.range_end)
                    .into_iter()
                    .map(|s| add(self, s))
                    .collect(),
            },
            request_op::Request::RequestTxn(_) => unreachable!("nested txns are planned by txn"),
        }
    }

    /// etcd's answer from each shard's answers to its ops, at `revision`.
    pub(super) fn answer(
        &self,
        mut answers: BTreeMap<ShardId, Vec<ResponseOp>>,
        revision: i64,
    ) -> TxnResponse {
        let header = ResponseHeader {
            revision,
            ..Default::default()
        };
        let mut at = OpRevisions {
            revision,
            // A txn that writes no shard reads everything at `revision`.
            before: if self.written.is_empty() {
                revision
            } else {
                revision - 1
            },
            changed: false,
        };
        let mut answer = match answer_of(&self.top, &mut answers, &mut at) {
            response_op::Response::ResponseTxn(t) => TxnResponse {
                header: Some(header),
                ..t
            },
            _ => unreachable!("the top slot is a txn"),
        };
        if !at.changed {
            // A txn that changed nothing answers one revision throughout.
            convert::set_txn_revision(&mut answer, revision);
        }
        answer
    }
}

/// The revision each op of a txn answers, as etcd's: the txn's once an op
/// before it (or the op itself) changed a key, the one before the txn's
/// until then.
struct OpRevisions {
    revision: i64,
    before: i64,
    changed: bool,
}

impl OpRevisions {
    /// The header of the op answered now, after its own change if `changes`.
    fn header(&mut self, changes: bool) -> Option<ResponseHeader> {
        self.changed |= changes;
        Some(ResponseHeader {
            revision: if self.changed {
                self.revision
            } else {
                self.before
            },
            ..Default::default()
        })
    }
}

fn take(
    answers: &mut BTreeMap<ShardId, Vec<ResponseOp>>,
    shard: ShardId,
    at: usize,
) -> Option<response_op::Response> {
    answers
        .get_mut(&shard)
        .and_then(|ops| ops.get_mut(at))
        .and_then(|op| op.response.take())
}

fn answer_of(
    slot: &Slot,
    answers: &mut BTreeMap<ShardId, Vec<ResponseOp>>,
    at: &mut OpRevisions,
) -> response_op::Response {
    use response_op::Response as R;
    match slot {
        Slot::Put { shard, at: place } => {
            let mut p = match take(answers, *shard, *place) {
                Some(R::ResponsePut(p)) => p,
                _ => Default::default(),
            };
            p.header = at.header(true);
            R::ResponsePut(p)
        }
        Slot::Delete { parts } => {
            let mut merged = DeleteRangeResponse::default();
            for &(s, place) in parts {
                if let Some(R::ResponseDeleteRange(d)) = take(answers, s, place) {
                    merged.deleted += d.deleted;
                    merged.prev_kvs.extend(d.prev_kvs);
                }
            }
            merged.prev_kvs.sort_by(|a, b| a.key.cmp(&b.key));
            merged.header = at.header(merged.deleted > 0);
            R::ResponseDeleteRange(merged)
        }
        Slot::Range { req, parts } => {
            let got: Vec<RangeResponse> = parts
                .iter()
                .filter_map(|&(s, place)| match take(answers, s, place) {
                    Some(R::ResponseRange(r)) => Some(r),
                    _ => None,
                })
                .collect();
            let mut merged = merge_ranges(req, got);
            merged.header = at.header(false);
            R::ResponseRange(merged)
        }
        Slot::Txn { succeeded, slots } => R::ResponseTxn(TxnResponse {
            // etcd's nested txn answers with an empty header (`answer`
            // gives the top one its revision).
            header: Some(convert::OP_HEADER),
            succeeded: *succeeded,
            responses: slots
                .iter()
                .map(|s| ResponseOp {
                    response: Some(answer_of(s, answers, at)),
                })
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use cairn_proto::etcdserverpb::{compare, DeleteRangeRequest, PutRequest, PutResponse};
    use cairn_proto::mvccpb::KeyValue;

    fn routing() -> RoutingTable {
        RoutingTable::new(4, 1)
    }

    /// Two routing prefixes on different shards.
    fn two_prefixes(r: &RoutingTable) -> (String, String) {
        let first = "p0/".to_string();
        let a = r.shard_for_key(first.as_bytes());
        let other = (1..100)
            .map(|i| format!("p{i}/"))
            .find(|p| r.shard_for_key(p.as_bytes()) != a)
            .expect("a prefix on another shard");
        (first, other)
    }

    fn put(key: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                ..Default::default()
            })),
        }
    }

    fn version_is(key: &str, v: i64) -> Compare {
        Compare {
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Version as i32,
            key: Bytes::copy_from_slice(key.as_bytes()),
            target_union: Some(compare::TargetUnion::Version(v)),
            ..Default::default()
        }
    }

    #[test]
    fn a_compare_fails_on_any_shard_holds_on_some_and_else_follows_etcds_missing_key_rule() {
        let cs = vec![version_is("a", 0), version_is("b", 1), version_is("c", 0)];
        let per_shard = vec![
            vec![Some(true), None, None],
            vec![Some(true), None, None],
            vec![Some(false), None, None],
        ];
        // A missing key has version 0: the third holds, the second does not.
        assert_eq!(combine(&cs, &per_shard), vec![false, false, true]);
        let per_shard = vec![vec![None, Some(true), None], vec![None, None, None]];
        assert_eq!(combine(&cs, &per_shard), vec![true, true, true]);
    }

    #[test]
    fn the_plan_takes_the_chosen_branches_nested_ones_included_and_splits_ops_by_shard() {
        let r = routing();
        let (a, b) = two_prefixes(&r);
        let (sa, sb) = (r.shard_for_key(a.as_bytes()), r.shard_for_key(b.as_bytes()));
        let nested = TxnRequest {
            compare: vec![version_is(&format!("{b}x"), 5)],
            success: vec![put(&format!("{b}then"))],
            failure: vec![put(&format!("{b}else"))],
        };
        let t = TxnRequest {
            compare: vec![version_is(&format!("{a}x"), 0)],
            success: vec![
                put(&format!("{a}k")),
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(nested.clone())),
                },
            ],
            failure: vec![
                put(&format!("{b}failed")),
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(nested)),
                },
            ],
        };
        let mut compares = Vec::new();
        all_compares(&t, &mut compares);
        assert_eq!(compares.len(), 3, "the txn's, then each nested one's");
        // Outer holds; the nested txn on the success branch fails; the one
        // on the failure branch (not taken) would hold.
        let plan = Plan::of(&t, &[true, false, true], &r);
        assert_eq!(plan.written, BTreeSet::from([sa, sb]));
        assert_eq!(plan.ops[&sa], vec![put(&format!("{a}k"))]);
        assert_eq!(plan.ops[&sb], vec![put(&format!("{b}else"))]);
        let ok = |k: &str| ResponseOp {
            response: Some(response_op::Response::ResponsePut(PutResponse {
                prev_kv: Some(KeyValue {
                    key: Bytes::copy_from_slice(k.as_bytes()),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        };
        let answers = BTreeMap::from([(sa, vec![ok("ka")]), (sb, vec![ok("kb")])]);
        let resp = plan.answer(answers, 77);
        assert!(resp.succeeded);
        assert_eq!(resp.header.unwrap().revision, 77);
        let Some(response_op::Response::ResponsePut(p)) = &resp.responses[0].response else {
            panic!("a put first: {resp:?}");
        };
        assert_eq!(p.prev_kv.as_ref().unwrap().key.as_ref(), b"ka");
        // Inside the txn, etcd's headers: the revision alone, and a nested
        // txn's empty.
        let revision_only = Some(ResponseHeader {
            revision: 77,
            ..Default::default()
        });
        assert_eq!(p.header, revision_only);
        let Some(response_op::Response::ResponseTxn(inner)) = &resp.responses[1].response else {
            panic!("then the nested txn: {resp:?}");
        };
        assert!(!inner.succeeded);
        assert_eq!(inner.header, Some(ResponseHeader::default()));
        assert_eq!(inner.responses.len(), 1);
        let Some(response_op::Response::ResponsePut(p)) = &inner.responses[0].response else {
            panic!("a put in the nested txn: {inner:?}");
        };
        assert_eq!(p.header, revision_only);
    }

    #[test]
    fn a_delete_over_shards_answers_once_with_the_sum_and_every_previous_key_in_order() {
        let r = routing();
        let t = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key: Bytes::from_static(b"\0"),
                        range_end: Bytes::from_static(b"\0"),
                        prev_kv: true,
                    },
                )),
            }],
            ..Default::default()
        };
        let plan = Plan::of(&t, &[], &r);
        assert_eq!(
            plan.written.len(),
            4,
            "a delete of everything writes every shard"
        );
        let deleted = |keys: &[&str]| ResponseOp {
            response: Some(response_op::Response::ResponseDeleteRange(
                DeleteRangeResponse {
                    deleted: keys.len() as i64,
                    prev_kvs: keys
                        .iter()
                        .map(|k| KeyValue {
                            key: Bytes::copy_from_slice(k.as_bytes()),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                },
            )),
        };
        let answers = BTreeMap::from([
            (0, vec![deleted(&["d", "a"])]),
            (1, vec![deleted(&[])]),
            (2, vec![deleted(&["c"])]),
            (3, vec![deleted(&["b"])]),
        ]);
        let resp = plan.answer(answers, 9);
        let Some(response_op::Response::ResponseDeleteRange(d)) = &resp.responses[0].response
        else {
            panic!("a delete: {resp:?}");
        };
        assert_eq!(d.deleted, 4);
        let keys: Vec<&[u8]> = d.prev_kvs.iter().map(|kv| kv.key.as_ref()).collect();
        assert_eq!(keys, vec![b"a" as &[u8], b"b", b"c", b"d"]);
    }

    #[test]
    fn each_op_answers_the_revision_it_read_or_wrote_at_as_etcds() {
        let r = routing();
        let (a, b) = two_prefixes(&r);
        let (sa, sb) = (r.shard_for_key(a.as_bytes()), r.shard_for_key(b.as_bytes()));
        let key = |p: &str| Bytes::copy_from_slice(format!("{p}k").as_bytes());
        let get = |p: &str| RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: key(p),
                ..Default::default()
            })),
        };
        let delete = |p: &str| RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: key(p),
                    ..Default::default()
                },
            )),
        };
        let revisions = |resp: &TxnResponse| -> Vec<i64> {
            resp.responses
                .iter()
                .map(|op| match &op.response {
                    Some(response_op::Response::ResponseRange(x)) => x.header,
                    Some(response_op::Response::ResponsePut(x)) => x.header,
                    Some(response_op::Response::ResponseDeleteRange(x)) => x.header,
                    other => panic!("{other:?}"),
                })
                .map(|h| h.expect("a header").revision)
                .collect()
        };
        let range = || ResponseOp {
            response: Some(response_op::Response::ResponseRange(Default::default())),
        };
        let deleted = |n: i64| ResponseOp {
            response: Some(response_op::Response::ResponseDeleteRange(
                DeleteRangeResponse {
                    deleted: n,
                    ..Default::default()
                },
            )),
        };
        let written = || ResponseOp {
            response: Some(response_op::Response::ResponsePut(Default::default())),
        };

        // Before the first change, the revision before the txn's; a delete
        // of nothing changes nothing, one that deletes does.
        let t = TxnRequest {
            success: vec![get(&b), delete(&b), put(&a), get(&b), delete(&a)],
            ..Default::default()
        };
        let plan = Plan::of(&t, &[true], &r);
        let answers = BTreeMap::from([
            (sa, vec![written(), deleted(0)]),
            (sb, vec![range(), deleted(0), range()]),
        ]);
        let resp = plan.answer(answers, 50);
        assert_eq!(revisions(&resp), vec![49, 49, 50, 50, 50]);
        let t = TxnRequest {
            success: vec![get(&a), delete(&b), get(&a)],
            ..Default::default()
        };
        let plan = Plan::of(&t, &[true], &r);
        let answers = BTreeMap::from([(sa, vec![range(), range()]), (sb, vec![deleted(1)])]);
        let resp = plan.answer(answers, 50);
        assert_eq!(revisions(&resp), vec![49, 50, 50]);
        assert_eq!(resp.header.unwrap().revision, 50);

        // A txn that writes shards but changes nothing: one revision
        // throughout, as the shards it wrote moved there.
        let t = TxnRequest {
            success: vec![delete(&a), get(&b)],
            ..Default::default()
        };
        let plan = Plan::of(&t, &[true], &r);
        let answers = BTreeMap::from([(sa, vec![deleted(0)]), (sb, vec![range()])]);
        let resp = plan.answer(answers, 50);
        assert_eq!(revisions(&resp), vec![50, 50]);

        // A txn that writes no shard: everything at its read point.
        let t = TxnRequest {
            success: vec![get(&a), get(&b)],
            ..Default::default()
        };
        let plan = Plan::of(&t, &[true], &r);
        let answers = BTreeMap::from([(sa, vec![range()]), (sb, vec![range()])]);
        let resp = plan.answer(answers, 50);
        assert_eq!(revisions(&resp), vec![50, 50]);
    }
}

//! Merging the answers of several shards to one range request.
//!
//! Each shard answers the request as if it held the whole keyspace: sorted as
//! asked, cut to `limit`, with its own `count` and `more`. The merged answer is what
//! a single keyspace holding all the shards' keys would give: the union sorted the
//! same way (key order when no sort is asked, as etcd returns), cut to `limit`,
//! `count` the sum, and `more` set when anything matched beyond what is returned.

use std::cmp::Ordering;

use cairn_proto::etcdserverpb::{range_request, RangeRequest, RangeResponse, ResponseHeader};
use cairn_proto::mvccpb::KeyValue;

fn compare_by(target: range_request::SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    use range_request::SortTarget as T;
    let primary = match target {
        T::Key => Ordering::Equal,
        T::Version => a.version.cmp(&b.version),
        T::Create => a.create_revision.cmp(&b.create_revision),
        T::Mod => a.mod_revision.cmp(&b.mod_revision),
        T::Value => a.value.cmp(&b.value),
    };
    primary.then_with(|| a.key.cmp(&b.key))
}

/// The order a request asks its results in.
pub fn order_of(req: &RangeRequest) -> impl Fn(&KeyValue, &KeyValue) -> Ordering {
    let order = range_request::SortOrder::try_from(req.sort_order)
        .unwrap_or(range_request::SortOrder::None);
    let target = range_request::SortTarget::try_from(req.sort_target)
        .unwrap_or(range_request::SortTarget::Key);
    move |a: &KeyValue, b: &KeyValue| match order {
        range_request::SortOrder::None | range_request::SortOrder::Ascend => {
            compare_by(target, a, b)
        }
        range_request::SortOrder::Descend => compare_by(target, b, a),
    }
}

/// Merges per-shard answers to `req`. The header is the caller's: the revision
/// of a multi-shard answer is the highest shard revision seen.
pub fn merge_ranges(req: &RangeRequest, parts: Vec<RangeResponse>) -> RangeResponse {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let mut header: Option<ResponseHeader> = None;
    let mut count = 0i64;
    let mut more = false;
    let mut kvs = Vec::new();
    for p in parts {
        count += p.count;
        more |= p.more;
        if let Some(h) = p.header {
            if header.as_ref().is_none_or(|cur| h.revision > cur.revision) {
                header = Some(h);
            }
        }
        kvs.extend(p.kvs);
    }
    let cmp = order_of(req);
    kvs.sort_by(&cmp);
    if req.limit > 0 && kvs.len() > req.limit as usize {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    RangeResponse {
        header,
        kvs,
        more,
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn kv(k: &str, m: i64) -> KeyValue {
        KeyValue {
            key: Bytes::copy_from_slice(k.as_bytes()),
            mod_revision: m,
            create_revision: m,
            version: 1,
            value: Bytes::copy_from_slice(k.as_bytes()),
            lease: 0,
        }
    }

    fn resp(kvs: Vec<KeyValue>, count: i64, more: bool, rev: i64) -> RangeResponse {
        RangeResponse {
            header: Some(ResponseHeader {
                revision: rev,
                ..Default::default()
            }),
            kvs,
            more,
            count,
        }
    }

    #[test]
    fn merged_in_key_order_with_limit_count_and_more() {
        let req = RangeRequest {
            key: Bytes::from_static(b"a"),
            range_end: Bytes::from_static(b"z"),
            limit: 3,
            ..Default::default()
        };
        let a = resp(vec![kv("a", 1), kv("c", 3), kv("e", 5)], 4, true, 9);
        let b = resp(vec![kv("b", 2), kv("d", 4)], 2, false, 4);
        let m = merge_ranges(&req, vec![a, b]);
        let keys: Vec<_> = m.kvs.iter().map(|kv| kv.key.clone()).collect();
        assert_eq!(keys, vec!["a", "b", "c"]);
        assert_eq!(m.count, 6);
        assert!(m.more);
        assert_eq!(m.header.unwrap().revision, 9);
    }

    #[test]
    fn merged_by_sort_target_descending() {
        let req = RangeRequest {
            key: Bytes::from_static(b"a"),
            range_end: Bytes::from_static(b"z"),
            sort_order: range_request::SortOrder::Descend as i32,
            sort_target: range_request::SortTarget::Mod as i32,
            ..Default::default()
        };
        let a = resp(vec![kv("x", 7), kv("a", 1)], 2, false, 7);
        let b = resp(vec![kv("m", 5)], 1, false, 5);
        let m = merge_ranges(&req, vec![a, b]);
        let revs: Vec<_> = m.kvs.iter().map(|kv| kv.mod_revision).collect();
        assert_eq!(revs, vec![7, 5, 1]);
        assert!(!m.more);
        assert_eq!(m.count, 3);
    }

    #[test]
    fn count_only_sums_counts() {
        let req = RangeRequest {
            key: Bytes::from_static(b"a"),
            range_end: Bytes::from_static(b"z"),
            count_only: true,
            ..Default::default()
        };
        let m = merge_ranges(
            &req,
            vec![resp(vec![], 4, false, 1), resp(vec![], 5, false, 2)],
        );
        assert!(m.kvs.is_empty());
        assert_eq!(m.count, 9);
    }
}

//! What a shard's log entries mean, and how they are stored in the WAL.
//!
//! A normal entry's data is an encoded `cairnpb.ShardRequest` (or empty: the
//! no-op a new leader appends). The WAL records no entry type, so a membership
//! change entry is stored as a `ShardRequest` whose only field is the encoded
//! `ConfChange`; reading it back restores the type. Normal entries are stored as
//! they are, with no copy.

use bytes::Bytes;
use cairn_proto::cairnpb::{shard_request, ShardRequest};
use prost::Message as _;

use crate::raft::{Entry, EntryType};

/// The WAL record for a Raft entry of `shard`.
pub fn to_wal(shard: u32, e: &Entry) -> cairn_wal::Record {
    let data = match EntryType::try_from(e.entry_type) {
        Ok(EntryType::EntryConfChange) => Bytes::from(
            ShardRequest {
                request: Some(shard_request::Request::ConfChange(e.data.clone())),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        _ => e.data.clone(),
    };
    cairn_wal::Record::Entry {
        shard: u64::from(shard),
        index: e.index,
        term: e.term,
        data,
    }
}

/// `data`, an encoded `ShardRequest`, with its `revision` set: the field is
/// appended, and a decoder keeps the last occurrence of a field, so a
/// forwarded proposal is stamped without decoding it.
pub fn with_revision(data: &[u8], revision: i64) -> Bytes {
    let mut out = bytes::BytesMut::with_capacity(data.len() + 11);
    out.extend_from_slice(data);
    prost::encoding::int64::encode(REVISION_FIELD, &revision, &mut out);
    out.freeze()
}

/// The request an applied entry carries, or why it has none this build can
/// apply: protobuf decodes a request kind added by a newer build (a member
/// of a cluster in the middle of an upgrade proposed it) as no request at
/// all, and applying past it would silently lose that write on this member
/// alone.
pub fn known_request(
    req: &mut ShardRequest,
    shard: u32,
    index: u64,
) -> Result<shard_request::Request, String> {
    req.request.take().ok_or_else(|| {
        format!(
            "shard {shard}: entry {index} holds a request this build does not know \
             (proposed by a newer build?); restart this member with the build \
             the others run"
        )
    })
}

/// `ShardRequest.revision`'s field number.
const REVISION_FIELD: u32 = 12;

/// Why a stored entry could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("shard {shard}: WAL entry {index} does not decode as a shard request: {source}")]
pub struct EntryDecodeError {
    pub shard: u32,
    pub index: u64,
    #[source]
    pub source: prost::DecodeError,
}

/// The Raft entry a WAL entry holds.
pub fn from_wal(shard: u32, e: cairn_wal::Entry) -> Result<Entry, EntryDecodeError> {
    let mut entry = Entry {
        entry_type: EntryType::EntryNormal as i32,
        term: e.term,
        index: e.index,
        data: e.data,
    };
    if entry.data.is_empty() {
        return Ok(entry);
    }
    let req = ShardRequest::decode(entry.data.clone()).map_err(|source| EntryDecodeError {
        shard,
        index: e.index,
        source,
    })?;
    if let Some(shard_request::Request::ConfChange(cc)) = req.request {
        entry.entry_type = EntryType::EntryConfChange as i32;
        entry.data = cc;
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::etcdserverpb::PutRequest;

    fn round_trip(e: Entry) -> Entry {
        match to_wal(3, &e) {
            cairn_wal::Record::Entry {
                shard,
                index,
                term,
                data,
            } => {
                assert_eq!(shard, 3u64);
                from_wal(3, cairn_wal::Entry { index, term, data }).unwrap()
            }
            other => panic!("expected an entry record, got {other:?}"),
        }
    }

    #[test]
    fn every_entry_kind_round_trips_through_the_wal_form() {
        let put = ShardRequest {
            id: 7,
            member: 9,
            request: Some(shard_request::Request::Put(PutRequest {
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            })),
            revision: 0,
        };
        let cases = [
            Entry {
                entry_type: EntryType::EntryNormal as i32,
                term: 2,
                index: 5,
                data: Bytes::from(put.encode_to_vec()),
            },
            Entry {
                entry_type: EntryType::EntryNormal as i32,
                term: 2,
                index: 6,
                data: Bytes::new(),
            },
            Entry {
                entry_type: EntryType::EntryConfChange as i32,
                term: 3,
                index: 7,
                data: Bytes::from(
                    crate::raft::ConfChange {
                        id: 1,
                        change_type: 3,
                        node_id: 42,
                        context: Bytes::new(),
                    }
                    .encode_to_vec(),
                ),
            },
        ];
        for e in cases {
            assert_eq!(round_trip(e.clone()), e);
        }
    }

    #[test]
    fn a_stamped_request_decodes_with_its_revision_and_the_last_stamp_wins() {
        let put = ShardRequest {
            id: 3,
            member: 4,
            request: Some(shard_request::Request::Put(PutRequest {
                key: Bytes::from_static(b"k"),
                ..Default::default()
            })),
            revision: 0,
        };
        let once = with_revision(&put.encode_to_vec(), 41);
        let decoded = ShardRequest::decode(once.clone()).unwrap();
        assert_eq!(decoded.revision, 41);
        assert_eq!((decoded.id, decoded.member), (3, 4));
        assert_eq!(decoded.request, put.request);
        let twice = with_revision(&once, i64::MAX);
        assert_eq!(ShardRequest::decode(twice).unwrap().revision, i64::MAX);
    }

    #[test]
    fn a_request_kind_this_build_does_not_know_is_refused_not_skipped() {
        let put = ShardRequest {
            id: 3,
            member: 4,
            request: Some(shard_request::Request::Put(PutRequest::default())),
            revision: 9,
        };
        let mut known = ShardRequest::decode(put.encode_to_vec().as_slice()).unwrap();
        assert_eq!(known_request(&mut known, 1, 5), Ok(put.request.unwrap()));
        // A newer build's request kind: a field number this build's
        // `ShardRequest` does not have (length-delimited, like every kind).
        let mut newer = ShardRequest {
            id: 3,
            member: 4,
            request: None,
            revision: 9,
        }
        .encode_to_vec();
        prost::encoding::bytes::encode(1000, &Bytes::from_static(b"part"), &mut newer);
        let mut decoded = ShardRequest::decode(newer.as_slice()).unwrap();
        assert_eq!((decoded.id, decoded.revision), (3, 9));
        let err = known_request(&mut decoded, 1, 5).unwrap_err();
        assert!(
            err.contains("shard 1: entry 5") && err.contains("does not know"),
            "{err}"
        );
    }

    #[test]
    fn garbage_entry_data_is_an_error_naming_shard_and_index() {
        let err = from_wal(
            2,
            cairn_wal::Entry {
                index: 11,
                term: 1,
                data: Bytes::from_static(&[0xff, 0xff, 0xff]),
            },
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("shard 2") && msg.contains("entry 11"), "{msg}");
    }
}

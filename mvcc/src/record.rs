//! The record stored under each revision in the revision tree.
//!
//! ```text
//! offset  size  field (little-endian)
//! 0       1     flags: bit 0 = tombstone
//! 1       8     create_revision
//! 9       8     mod_revision
//! 17      8     version
//! 25      8     lease
//! 33      4     key length K
//! 37      K     key
//! 37+K    ...   value (to the end of the record)
//! ```

use crate::page::{get_i64, get_u32};
use crate::types::{KeyValue, Revision};

const FLAGS_OFFSET: usize = 0;
const CREATE_OFFSET: usize = FLAGS_OFFSET + size_of::<u8>();
const MOD_OFFSET: usize = CREATE_OFFSET + size_of::<i64>();
const VERSION_OFFSET: usize = MOD_OFFSET + size_of::<i64>();
const LEASE_OFFSET: usize = VERSION_OFFSET + size_of::<i64>();
const KEY_LEN_OFFSET: usize = LEASE_OFFSET + size_of::<i64>();
const KEY_OFFSET: usize = KEY_LEN_OFFSET + size_of::<u32>();
pub(crate) const RECORD_HEADER_BYTES: usize = KEY_OFFSET;

const FLAG_TOMBSTONE: u8 = 1;

/// A key-value record at one revision; a tombstone marks a delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub rev: Revision,
    pub tombstone: bool,
    pub kv: KeyValue,
}

impl Record {
    /// The record's octets, in a buffer with one octet to spare: the tree
    /// stores a short value behind a one-octet tag, which then goes in front
    /// without a new allocation.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b =
            Vec::with_capacity(RECORD_HEADER_BYTES + self.kv.key.len() + self.kv.value.len() + 1);
        b.push(if self.tombstone { FLAG_TOMBSTONE } else { 0 });
        b.extend_from_slice(&self.kv.create_revision.to_le_bytes());
        b.extend_from_slice(&self.kv.mod_revision.to_le_bytes());
        b.extend_from_slice(&self.kv.version.to_le_bytes());
        b.extend_from_slice(&self.kv.lease.to_le_bytes());
        b.extend_from_slice(&(self.kv.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.kv.key);
        b.extend_from_slice(&self.kv.value);
        b
    }

    pub(crate) fn encoded_len(&self) -> usize {
        RECORD_HEADER_BYTES + self.kv.key.len() + self.kv.value.len()
    }
}

/// A borrowed view of an encoded record, checked on construction.
pub(crate) struct RecordView<'a> {
    b: &'a [u8],
    key_len: usize,
}

impl<'a> RecordView<'a> {
    pub(crate) fn parse(b: &'a [u8]) -> Result<RecordView<'a>, &'static str> {
        if b.len() < RECORD_HEADER_BYTES {
            return Err("shorter than a record header");
        }
        if b[FLAGS_OFFSET] & !FLAG_TOMBSTONE != 0 {
            return Err("unknown record flags");
        }
        let key_len = get_u32(b, KEY_LEN_OFFSET) as usize;
        if RECORD_HEADER_BYTES + key_len > b.len() {
            return Err("key length past the record end");
        }
        Ok(RecordView { b, key_len })
    }

    pub(crate) fn tombstone(&self) -> bool {
        self.b[FLAGS_OFFSET] & FLAG_TOMBSTONE != 0
    }
    pub(crate) fn key(&self) -> &'a [u8] {
        &self.b[KEY_OFFSET..KEY_OFFSET + self.key_len]
    }
    pub(crate) fn value(&self) -> &'a [u8] {
        &self.b[KEY_OFFSET + self.key_len..]
    }
    pub(crate) fn create_revision(&self) -> i64 {
        get_i64(self.b, CREATE_OFFSET)
    }
    pub(crate) fn mod_revision(&self) -> i64 {
        get_i64(self.b, MOD_OFFSET)
    }
    pub(crate) fn version(&self) -> i64 {
        get_i64(self.b, VERSION_OFFSET)
    }
    pub(crate) fn lease(&self) -> i64 {
        get_i64(self.b, LEASE_OFFSET)
    }

    pub(crate) fn to_kv(&self, keys_only: bool) -> KeyValue {
        KeyValue {
            key: self.key().to_vec(),
            create_revision: self.create_revision(),
            mod_revision: self.mod_revision(),
            version: self.version(),
            value: if keys_only {
                Vec::new()
            } else {
                self.value().to_vec()
            },
            lease: self.lease(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_binary_keys_and_empty_values() {
        let r = Record {
            rev: Revision { main: 5, sub: 1 },
            tombstone: false,
            kv: KeyValue {
                key: vec![0, 255, 1],
                create_revision: 3,
                mod_revision: 5,
                version: 2,
                value: vec![],
                lease: -7,
            },
        };
        let b = r.encode();
        assert_eq!(b.len(), r.encoded_len());
        let v = RecordView::parse(&b).unwrap();
        assert_eq!(v.to_kv(false), r.kv);
        assert!(!v.tombstone());
        assert!(RecordView::parse(&b[..10]).is_err());
    }
}

//! Just enough HPACK (RFC 7541) to read a client's header blocks and write
//! them again: a decoder that keeps the connection's dynamic table, and an
//! encoder of literals that never touch the receiver's dynamic table.
//!
//! It serves Cairn's gRPC server, which reads every request's header block
//! with it, the authority shim in front of tonic's server, which must see each
//! request's `:authority` however the client compressed it, and
//! `cairn-bench`'s gRPC client, which reads the answers' header blocks.
//! Decoding follows every
//! representation of §6 (indexed, literal with/without/never indexing, table
//! size updates) and Huffman strings; input is untrusted, so every length,
//! index and integer is checked and an error is returned, never a panic.

pub mod huffman;
mod static_table;

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};

use static_table::STATIC_TABLE;

/// The dynamic table's size when a connection starts: the initial value of
/// SETTINGS_HEADER_TABLE_SIZE (RFC 9113 §6.5.2).
pub const DEFAULT_TABLE_SIZE_BYTES: usize = 4096;
/// Largest table size a client may switch to: the server's. Cairn's server
/// announces no other SETTINGS_HEADER_TABLE_SIZE, so 4096 (tonic's, under
/// h2, enforces the same).
pub const MAX_TABLE_SIZE_BYTES: usize = DEFAULT_TABLE_SIZE_BYTES;
/// Largest decoded header list (names, values and 32 octets per field, as
/// §4.1 and SETTINGS_MAX_HEADER_LIST_SIZE count them) a block may expand
/// to: Cairn's server announces it as SETTINGS_MAX_HEADER_LIST_SIZE. The
/// bound keeps a hostile block of references to one large entry from
/// expanding without limit.
pub const MAX_DECODED_LIST_BYTES: usize = 64 * 1024;
/// Per-entry overhead counted in the table size (§4.1).
const ENTRY_OVERHEAD_BYTES: usize = 32;
/// An HPACK integer longer than this many continuation octets is refused; 4
/// of them already carry 28 bits, more than any length or index here.
const MAX_INTEGER_OCTETS: usize = 4;

/// Why a header block could not be decoded: the client broke HPACK, which is
/// a connection error (COMPRESSION_ERROR).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("header block ends inside a representation")]
    Truncated,
    #[error("integer longer than {MAX_INTEGER_OCTETS} continuation octets")]
    IntegerTooLong,
    #[error("index 0 in an indexed header field")]
    ZeroIndex,
    #[error("index {index} is past the table ({entries} dynamic entries)")]
    IndexOutOfRange { index: usize, entries: usize },
    #[error("table size update to {size} bytes (at most {MAX_TABLE_SIZE_BYTES})")]
    TableSizeTooLarge { size: usize },
    #[error("table size update after the first header field")]
    LateTableSizeUpdate,
    #[error("header list decodes to more than {MAX_DECODED_LIST_BYTES} bytes")]
    ListTooLarge,
    #[error(transparent)]
    Huffman(#[from] huffman::HuffmanError),
}

/// One header field of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Bytes,
    pub value: Bytes,
    /// Sent as "never indexed" (§6.2.3): re-encoded the same way, so a proxy
    /// behind the server still knows not to compress it.
    pub never_indexed: bool,
}

impl Field {
    /// The octets this field counts for in a header list: name, value and
    /// 32 (§4.1, as SETTINGS_MAX_HEADER_LIST_SIZE counts them).
    pub fn list_bytes(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD_BYTES
    }
}

/// A decoded header block: its table size updates, in order, then its fields.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Block {
    pub table_size_updates: Vec<usize>,
    pub fields: Vec<Field>,
}

impl Block {
    /// A block of `(name, value)` fields, none of them never-indexed: what
    /// [`Block::pairs`] reads back.
    pub fn literals<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Block {
        Block {
            table_size_updates: Vec::new(),
            fields: fields
                .into_iter()
                .map(|(name, value)| Field {
                    name: Bytes::copy_from_slice(name.as_bytes()),
                    value: Bytes::copy_from_slice(value.as_bytes()),
                    never_indexed: false,
                })
                .collect(),
        }
    }

    /// The fields as (name, value) text, octets that are not UTF-8 replaced:
    /// for logs and tests.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn clear(&mut self) {
        self.table_size_updates.clear();
        self.fields.clear();
    }
}

/// The decoding side of one connection: its dynamic table (§2.3.2).
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: dynamic index 62 is `entries[0]`.
    entries: VecDeque<(Bytes, Bytes)>,
    size_bytes: usize,
    max_size_bytes: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            entries: VecDeque::new(),
            size_bytes: 0,
            max_size_bytes: DEFAULT_TABLE_SIZE_BYTES,
        }
    }
}

impl Decoder {
    /// Decodes one complete header block into `out` (cleared first). On an
    /// error the table may hold part of the block's insertions; the
    /// connection is unusable then anyway.
    pub fn decode(&mut self, mut src: &[u8], out: &mut Block) -> Result<(), DecodeError> {
        out.clear();
        let mut list_bytes = 0;
        while let Some(&first) = src.first() {
            let fields_before = out.fields.len();
            if first & 0x80 != 0 {
                let index = integer(&mut src, 7)?;
                let (name, value) = self.get(index)?;
                out.fields.push(Field {
                    name,
                    value,
                    never_indexed: false,
                });
            } else if first & 0xc0 == 0x40 {
                let field = self.literal(&mut src, 6, false)?;
                self.insert(field.name.clone(), field.value.clone());
                out.fields.push(field);
            } else if first & 0xe0 == 0x20 {
                if !out.fields.is_empty() {
                    return Err(DecodeError::LateTableSizeUpdate);
                }
                let size = integer(&mut src, 5)?;
                if size > MAX_TABLE_SIZE_BYTES {
                    return Err(DecodeError::TableSizeTooLarge { size });
                }
                self.max_size_bytes = size;
                self.evict_to(size);
                out.table_size_updates.push(size);
            } else {
                // 0001xxxx never indexed, 0000xxxx without indexing.
                let never_indexed = first & 0x10 != 0;
                let field = self.literal(&mut src, 4, never_indexed)?;
                out.fields.push(field);
            }
            if let Some(added) = out.fields.get(fields_before) {
                list_bytes += added.list_bytes();
                if list_bytes > MAX_DECODED_LIST_BYTES {
                    return Err(DecodeError::ListTooLarge);
                }
            }
        }
        Ok(())
    }

    /// Entries in the dynamic table.
    pub fn dynamic_entries(&self) -> usize {
        self.entries.len()
    }

    fn get(&self, index: usize) -> Result<(Bytes, Bytes), DecodeError> {
        match index {
            0 => Err(DecodeError::ZeroIndex),
            i if i <= STATIC_TABLE.len() => {
                let (name, value) = STATIC_TABLE[i - 1];
                Ok((
                    Bytes::from_static(name.as_bytes()),
                    Bytes::from_static(value.as_bytes()),
                ))
            }
            i => self.entries.get(i - STATIC_TABLE.len() - 1).cloned().ok_or(
                DecodeError::IndexOutOfRange {
                    index,
                    entries: self.entries.len(),
                },
            ),
        }
    }

    fn literal(
        &self,
        src: &mut &[u8],
        prefix_bits: u8,
        never_indexed: bool,
    ) -> Result<Field, DecodeError> {
        let name = match integer(src, prefix_bits)? {
            0 => string(src)?,
            index => self.get(index)?.0,
        };
        let value = string(src)?;
        Ok(Field {
            name,
            value,
            never_indexed,
        })
    }

    /// Adds an entry, evicting the oldest to make room (§4.4); an entry larger
    /// than the whole table empties it and is not added.
    fn insert(&mut self, name: Bytes, value: Bytes) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD_BYTES;
        if size > self.max_size_bytes {
            self.entries.clear();
            self.size_bytes = 0;
            return;
        }
        self.evict_to(self.max_size_bytes - size);
        self.entries.push_front((name, value));
        self.size_bytes += size;
        debug_assert!(self.size_bytes <= self.max_size_bytes);
    }

    fn evict_to(&mut self, limit_bytes: usize) {
        while self.size_bytes > limit_bytes {
            let Some((name, value)) = self.entries.pop_back() else {
                unreachable!("table size {} with no entries", self.size_bytes);
            };
            self.size_bytes -= name.len() + value.len() + ENTRY_OVERHEAD_BYTES;
        }
    }
}

/// Reads an integer with an N-bit prefix (§5.1), advancing `src`.
fn integer(src: &mut &[u8], prefix_bits: u8) -> Result<usize, DecodeError> {
    let (&first, mut rest) = src.split_first().ok_or(DecodeError::Truncated)?;
    let max_prefix = (1usize << prefix_bits) - 1;
    let mut value = usize::from(first) & max_prefix;
    if value == max_prefix {
        let mut shift = 0;
        loop {
            let (&byte, tail) = rest.split_first().ok_or(DecodeError::Truncated)?;
            rest = tail;
            if shift >= 7 * MAX_INTEGER_OCTETS {
                return Err(DecodeError::IntegerTooLong);
            }
            value += usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
    }
    *src = rest;
    Ok(value)
}

/// Reads a string literal (§5.2), decoding Huffman, advancing `src`.
fn string(src: &mut &[u8]) -> Result<Bytes, DecodeError> {
    let huffman = src.first().ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = integer(src, 7)?;
    if len > src.len() {
        return Err(DecodeError::Truncated);
    }
    let (raw, rest) = src.split_at(len);
    *src = rest;
    if huffman {
        let mut out = Vec::new();
        huffman::decode(raw, &mut out)?;
        Ok(Bytes::from(out))
    } else {
        Ok(Bytes::copy_from_slice(raw))
    }
}

/// Appends an integer with an N-bit prefix; `flags` fills the octet's high
/// bits above the prefix.
pub fn encode_integer(out: &mut BytesMut, flags: u8, prefix_bits: u8, mut value: usize) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.put_u8((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

fn encode_string(out: &mut BytesMut, s: &[u8]) {
    encode_integer(out, 0, 7, s.len());
    out.put_slice(s);
}

/// Appends `block` as a header block that leaves the receiver's dynamic table
/// alone: its size updates, then every field as a literal without indexing
/// (or never indexed, as it came), names from the static table where they
/// are in it, strings raw.
pub fn encode_literals(block: &Block, out: &mut BytesMut) {
    for &size in &block.table_size_updates {
        encode_integer(out, 0x20, 5, size);
    }
    for field in &block.fields {
        let flags = if field.never_indexed { 0x10 } else { 0x00 };
        match static_table::name_index(&field.name) {
            Some(index) => encode_integer(out, flags, 4, index),
            None => {
                encode_integer(out, flags, 4, 0);
                encode_string(out, &field.name);
            }
        }
        encode_string(out, &field.value);
    }
}

#[cfg(test)]
mod tests;

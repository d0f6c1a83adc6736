//! The decoder against RFC 7541's worked examples (Appendix C), its table
//! bookkeeping, and its refusals of malformed input.

use super::*;

/// Octets from hex digits (whitespace ignored).
fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// C.3 (raw strings) and C.4 (Huffman) encode the same three requests on one
/// connection; the later ones lean on entries the earlier ones added.
fn three_requests(blocks: [&str; 3]) {
    let mut decoder = Decoder::default();
    let mut block = Block::default();
    let expected = [
        owned(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        owned(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        owned(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
    ];
    let table_sizes = [57, 110, 164];
    for ((src, want), size) in blocks.iter().zip(&expected).zip(table_sizes) {
        decoder.decode(&hex(src), &mut block).unwrap();
        assert_eq!(&block.pairs(), want);
        assert_eq!(decoder.size_bytes, size);
    }
    assert_eq!(decoder.dynamic_entries(), 3);
}

#[test]
fn rfc_c3_requests_without_huffman() {
    three_requests([
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ]);
}

#[test]
fn rfc_c4_requests_with_huffman() {
    three_requests([
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ]);
}

#[test]
fn eviction_keeps_the_table_within_its_size() {
    let mut decoder = Decoder::default();
    let mut block = Block::default();
    // Size update to 64 bytes, then two insertions of 32 + 1 + 1 = 34 bytes:
    // the second evicts the first.
    decoder
        .decode(&hex("3f21 4001 6101 31"), &mut block)
        .unwrap();
    assert_eq!(block.table_size_updates, vec![64]);
    decoder.decode(&hex("4001 6201 32"), &mut block).unwrap();
    assert_eq!(decoder.dynamic_entries(), 1);
    decoder.decode(&hex("be"), &mut block).unwrap();
    assert_eq!(block.pairs(), owned(&[("b", "2")]));
    assert_eq!(
        decoder.decode(&hex("bf"), &mut block),
        Err(DecodeError::IndexOutOfRange {
            index: 63,
            entries: 1
        })
    );
    // An entry larger than the table empties it.
    decoder
        .decode(
            &hex("4001 6121 414141414141414141414141414141414141414141414141414141414141414141"),
            &mut block,
        )
        .unwrap();
    assert_eq!(decoder.dynamic_entries(), 0);
    assert_eq!(decoder.size_bytes, 0);
}

#[test]
fn refuses_malformed_blocks() {
    let cases: &[(&str, DecodeError)] = &[
        ("80", DecodeError::ZeroIndex),
        (
            "be",
            DecodeError::IndexOutOfRange {
                index: 62,
                entries: 0,
            },
        ),
        ("ff", DecodeError::Truncated),
        ("ff ff ff ff ff 01", DecodeError::IntegerTooLong),
        ("4103 6162", DecodeError::Truncated),
        ("41", DecodeError::Truncated),
        ("82 20", DecodeError::LateTableSizeUpdate),
        (
            "3f e2 ff 03",
            DecodeError::TableSizeTooLarge { size: 65_537 },
        ),
        ("3f e2 1f", DecodeError::TableSizeTooLarge { size: 4_097 }),
        (
            "4181 00",
            DecodeError::Huffman(huffman::HuffmanError::BadPadding),
        ),
    ];
    for (src, want) in cases {
        let mut decoder = Decoder::default();
        let mut block = Block::default();
        let got = decoder.decode(&hex(src), &mut block);
        assert_eq!(got.as_ref().err(), Some(want), "{src}");
    }
}

/// One large entry referenced over and over expands a small block into a
/// huge header list: refused once past the bound, and a list at the bound
/// still decodes.
#[test]
fn a_block_that_expands_past_the_list_bound_is_refused() {
    let value = vec![b'v'; 4000];
    let mut src = BytesMut::new();
    encode_integer(&mut src, 0x40, 6, 0);
    encode_integer(&mut src, 0, 7, 1);
    src.put_u8(b'a');
    encode_integer(&mut src, 0, 7, value.len());
    src.put_slice(&value);
    let entry_bytes = 1 + value.len() + ENTRY_OVERHEAD_BYTES;
    let fitting = MAX_DECODED_LIST_BYTES / entry_bytes;
    let mut at_bound = src.clone();
    for _ in 1..fitting {
        encode_integer(&mut at_bound, 0x80, 7, STATIC_TABLE.len() + 1);
    }
    let mut block = Block::default();
    Decoder::default().decode(&at_bound, &mut block).unwrap();
    assert_eq!(block.fields.len(), fitting);
    let mut past = at_bound;
    encode_integer(&mut past, 0x80, 7, STATIC_TABLE.len() + 1);
    assert_eq!(
        Decoder::default().decode(&past, &mut block),
        Err(DecodeError::ListTooLarge)
    );
}

#[test]
fn integers_round_trip_at_prefix_edges() {
    for prefix in [4u8, 5, 6, 7] {
        for value in [
            0,
            1,
            14,
            15,
            16,
            30,
            31,
            62,
            63,
            126,
            127,
            128,
            255,
            16_384,
            1 << 20,
        ] {
            let mut out = BytesMut::new();
            encode_integer(&mut out, 0, prefix, value);
            let mut src = &out[..];
            assert_eq!(
                integer(&mut src, prefix).unwrap(),
                value,
                "{prefix} {value}"
            );
            assert!(src.is_empty());
        }
    }
}

#[test]
fn literals_decode_to_the_same_fields_and_leave_the_table_empty() {
    let block = Block {
        table_size_updates: vec![0, 4096],
        fields: vec![
            Field {
                name: Bytes::from_static(b":authority"),
                value: Bytes::from_static(b"127.0.0.1:2379"),
                never_indexed: false,
            },
            Field {
                name: Bytes::from_static(b"authorization"),
                value: Bytes::from_static(b"secret"),
                never_indexed: true,
            },
            Field {
                name: Bytes::from(vec![b'x'; 200]),
                value: Bytes::from(vec![b'y'; 300]),
                never_indexed: false,
            },
        ],
    };
    let mut out = BytesMut::new();
    encode_literals(&block, &mut out);
    let mut decoder = Decoder::default();
    let mut back = Block::default();
    decoder.decode(&out, &mut back).unwrap();
    assert_eq!(back, block);
    assert_eq!(decoder.dynamic_entries(), 0);
}

#[test]
fn a_block_of_literal_pairs_decodes_to_the_same_pairs() {
    let pairs = [(":status", "200"), ("grpc-message", "not now")];
    let block = Block::literals(pairs);
    assert!(block.fields.iter().all(|f| !f.never_indexed));
    let mut out = BytesMut::new();
    encode_literals(&block, &mut out);
    let mut back = Block::default();
    Decoder::default().decode(&out, &mut back).unwrap();
    let expected: Vec<(String, String)> = pairs
        .iter()
        .map(|&(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(back.pairs(), expected);
}

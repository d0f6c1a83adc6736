//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B), decoding only.
//!
//! The code of Appendix B is canonical: within one length, codes rise with the
//! symbol, and each length starts right after the last code of the shorter
//! one. So the code lengths alone define it, and decoding needs three small
//! tables per length (first code, count, where its symbols start) instead of a
//! tree. Decoding goes bit by bit: at most [`MAX_CODE_BITS`] steps a symbol,
//! about 5 to 8 for the characters of a URL or a header name; the shim decodes
//! few strings (gRPC clients index nearly everything), so this is ample.

/// The longest code (Appendix B: the controls 10, 13, 22 and EOS).
pub const MAX_CODE_BITS: usize = 30;
/// Symbols: the 256 octets and EOS.
const SYMBOLS: usize = 257;
/// The end-of-string symbol; a decoder that meets it must fail (§5.2).
const EOS: u16 = 256;
/// Padding is the high bits of EOS (all ones) and shorter than an octet (§5.2).
const MAX_PADDING_BITS: usize = 7;

/// Appendix B's symbols grouped by code length, each group in rising order.
const GROUPS: &[(u8, &[u16])] = &[
    (5, &[48, 49, 50, 97, 99, 101, 105, 111, 115, 116]),
    (
        6,
        &[
            32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104,
            108, 109, 110, 112, 114, 117,
        ],
    ),
    (
        7,
        &[
            58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86,
            87, 89, 106, 107, 113, 118, 119, 120, 121, 122,
        ],
    ),
    (8, &[38, 42, 44, 59, 88, 90]),
    (10, &[33, 34, 40, 41, 63]),
    (11, &[39, 43, 124]),
    (12, &[35, 62]),
    (13, &[0, 36, 64, 91, 93, 126]),
    (14, &[94, 125]),
    (15, &[60, 96, 123]),
    (19, &[92, 195, 208]),
    (20, &[128, 130, 131, 162, 184, 194, 224, 226]),
    (
        21,
        &[
            153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230,
        ],
    ),
    (
        22,
        &[
            129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185,
            186, 187, 189, 190, 196, 198, 228, 232, 233,
        ],
    ),
    (
        23,
        &[
            1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166,
            168, 174, 175, 180, 182, 183, 188, 191, 197, 231, 239,
        ],
    ),
    (
        24,
        &[9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237],
    ),
    (25, &[199, 207, 234, 235]),
    (
        26,
        &[
            192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255,
        ],
    ),
    (
        27,
        &[
            203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252,
            253, 254,
        ],
    ),
    (
        28,
        &[
            2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 127, 220, 249,
        ],
    ),
    (30, &[10, 13, 22, 256]),
];

/// The canonical code's decoding tables, indexed by code length.
struct Canonical {
    /// The numerically first code of each length.
    first_code: [u32; MAX_CODE_BITS + 1],
    /// How many codes have each length.
    count: [u32; MAX_CODE_BITS + 1],
    /// Where each length's symbols start in `symbols`.
    offset: [u16; MAX_CODE_BITS + 1],
    /// Every symbol, by length and then by value: the order of their codes.
    symbols: [u16; SYMBOLS],
}

const fn canonical() -> Canonical {
    let mut c = Canonical {
        first_code: [0; MAX_CODE_BITS + 1],
        count: [0; MAX_CODE_BITS + 1],
        offset: [0; MAX_CODE_BITS + 1],
        symbols: [0; SYMBOLS],
    };
    let mut placed = 0;
    let mut g = 0;
    while g < GROUPS.len() {
        let (bits, symbols) = GROUPS[g];
        assert!(bits as usize <= MAX_CODE_BITS);
        assert!(g == 0 || GROUPS[g - 1].0 < bits, "groups rise by length");
        c.count[bits as usize] = symbols.len() as u32;
        c.offset[bits as usize] = placed as u16;
        let mut s = 0;
        while s < symbols.len() {
            assert!(s == 0 || symbols[s - 1] < symbols[s], "symbols rise");
            c.symbols[placed] = symbols[s];
            placed += 1;
            s += 1;
        }
        g += 1;
    }
    assert!(placed == SYMBOLS, "every symbol has a code");
    let mut code: u32 = 0;
    let mut bits = 1;
    while bits <= MAX_CODE_BITS {
        c.first_code[bits] = code;
        code = (code + c.count[bits]) << 1;
        bits += 1;
    }
    // A complete prefix code: the code space is used up exactly.
    assert!(code == 1 << (MAX_CODE_BITS + 1));
    c
}

const CODE: Canonical = canonical();

/// Why a Huffman string could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HuffmanError {
    #[error("Huffman string holds the EOS symbol")]
    Eos,
    #[error(
        "Huffman string ends with more than 7 bits of padding or padding that is not all ones"
    )]
    BadPadding,
}

/// Decodes `input`, appending the octets to `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    // Codes are at least 5 bits, so at most 8/5 octets per input octet.
    out.reserve(input.len() * 8 / 5);
    let mut code: u32 = 0;
    let mut bits = 0;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            bits += 1;
            let index = code.wrapping_sub(CODE.first_code[bits]);
            if index < CODE.count[bits] {
                let symbol = CODE.symbols[usize::from(CODE.offset[bits]) + index as usize];
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                out.push(symbol as u8);
                code = 0;
                bits = 0;
            }
            // The 30-bit group holds EOS, the all-ones code: any 30 bits
            // end a symbol, so `bits` never passes MAX_CODE_BITS.
            debug_assert!(bits < MAX_CODE_BITS);
        }
    }
    if bits > MAX_PADDING_BITS || code != (1 << bits) - 1 {
        return Err(HuffmanError::BadPadding);
    }
    Ok(())
}

/// The code of `symbol` as (value, length): the canonical assignment,
/// for encoding test vectors.
fn code_of(symbol: u16) -> (u32, usize) {
    for bits in 1..=MAX_CODE_BITS {
        let start = usize::from(CODE.offset[bits]);
        let n = CODE.count[bits] as usize;
        if let Some(i) = CODE.symbols[start..start + n]
            .iter()
            .position(|&s| s == symbol)
        {
            return (CODE.first_code[bits] + i as u32, bits);
        }
    }
    unreachable!("every symbol has a code")
}

/// Encodes `text` with the canonical code and EOS padding (§5.2).
pub fn encode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc: u64 = 0;
    let mut bits = 0;
    for &b in text {
        let (code, len) = code_of(u16::from(b));
        acc = (acc << len) | u64::from(code);
        bits += len;
        while bits >= 8 {
            out.push((acc >> (bits - 8)) as u8);
            bits -= 8;
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(input: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(input, &mut out).map(|()| out)
    }

    #[test]
    fn spot_codes_match_appendix_b() {
        assert_eq!(code_of(u16::from(b'0')), (0x0, 5));
        assert_eq!(code_of(u16::from(b' ')), (0x14, 6));
        assert_eq!(code_of(u16::from(b':')), (0x5c, 7));
        assert_eq!(code_of(u16::from(b'&')), (0xf8, 8));
        assert_eq!(code_of(0), (0x1ff8, 13));
        assert_eq!(code_of(1), (0x7fffd8, 23));
        assert_eq!(code_of(10), (0x3ffffffc, 30));
        assert_eq!(code_of(255), (0x3ffffee, 26));
        assert_eq!(code_of(EOS), (0x3fffffff, 30));
    }

    // RFC 7541 C.4.1 and C.6.1.
    #[test]
    fn rfc_examples() {
        let www = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        assert_eq!(decoded(&www).unwrap(), b"www.example.com");
        let date = [
            0xd0, 0x7a, 0xbe, 0x94, 0x10, 0x54, 0xd4, 0x44, 0xa8, 0x20, 0x05, 0x95, 0x04, 0x0b,
            0x81, 0x66, 0xe0, 0x82, 0xa6, 0x2d, 0x1b, 0xff,
        ];
        assert_eq!(decoded(&date).unwrap(), b"Mon, 21 Oct 2013 20:13:21 GMT");
        assert_eq!(encode(b"www.example.com"), www);
    }

    #[test]
    fn every_octet_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decoded(&encode(&all)).unwrap(), all);
        assert_eq!(decoded(&[]).unwrap(), b"");
    }

    #[test]
    fn rejects_bad_padding_and_eos() {
        // '0' is 00000: three bits of zero padding are not EOS's prefix.
        assert_eq!(decoded(&[0b0000_0000]), Err(HuffmanError::BadPadding));
        // A whole octet of ones is padding longer than 7 bits.
        assert_eq!(decoded(&[0xff]), Err(HuffmanError::BadPadding));
        // EOS itself, padded with two ones.
        assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xff]), Err(HuffmanError::Eos));
    }
}

//! The HPACK Huffman code (RFC 7541 Appendix B), decoding only: the stateless re-encoder never
//! Huffman-codes.
//!
//! The code is canonical: within one length, codes are consecutive in symbol order, and each
//! length starts right after the previous one ends, shifted left. So the table below only says
//! which symbols have which code length; the codes follow from it.

/// End of string: the last 30-bit code, never valid inside a string (RFC 7541 §5.2).
const EOS: u16 = 256;

const MAX_CODE_LENGTH: usize = 30;

/// The octets of each code length, in octet order; EOS follows the 30-bit ones.
const OCTETS_BY_CODE_LENGTH: [(usize, &[u8]); 21] = [
    (5, b"012aceiost"),
    (6, b" %-./3456789=A_bdfghlmnpru"),
    (7, b":BCDEFGHIJKLMNOPQRSTUVWYjkqvwxyz"),
    (8, b"&*,;XZ"),
    (10, b"!\"()?"),
    (11, b"'+|"),
    (12, b"#>"),
    (13, b"\0$@[]~"),
    (14, b"^}"),
    (15, b"<`{"),
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
    (30, &[10, 13, 22]),
];

/// Per code length: the first code, how many codes, and where their symbols start.
struct Canonical {
    first: [u32; MAX_CODE_LENGTH + 1],
    count: [u32; MAX_CODE_LENGTH + 1],
    offset: [usize; MAX_CODE_LENGTH + 1],
    symbols: [u16; 257],
}

const CODE: Canonical = canonical();

const fn canonical() -> Canonical {
    let mut code = Canonical {
        first: [0; MAX_CODE_LENGTH + 1],
        count: [0; MAX_CODE_LENGTH + 1],
        offset: [0; MAX_CODE_LENGTH + 1],
        symbols: [0; 257],
    };
    let (mut next, mut previous_length, mut at) = (0u32, 0usize, 0usize);
    let mut row = 0;
    while row < OCTETS_BY_CODE_LENGTH.len() {
        let (length, octets) = OCTETS_BY_CODE_LENGTH[row];
        next <<= length - previous_length;
        previous_length = length;
        code.first[length] = next;
        code.offset[length] = at;
        let mut i = 0;
        while i < octets.len() {
            code.symbols[at] = octets[i] as u16;
            at += 1;
            i += 1;
        }
        if length == MAX_CODE_LENGTH {
            code.symbols[at] = EOS;
            at += 1;
        }
        code.count[length] = (at - code.offset[length]) as u32;
        next += code.count[length];
        row += 1;
    }
    code
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("Huffman-coded string contains the EOS symbol")]
    Eos,
    #[error("Huffman-coded string ends with padding that is not a short prefix of EOS")]
    Padding,
}

/// Decodes a Huffman-coded string literal.
pub fn decode(coded: &[u8]) -> Result<Vec<u8>, HuffmanError> {
    let mut decoded = Vec::with_capacity(coded.len() * 8 / 5);
    let (mut code, mut length) = (0u32, 0usize);
    for byte in coded {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            length += 1;
            // The code is complete (tested), so a symbol matches by 30 bits at the latest.
            let index = code.wrapping_sub(CODE.first[length]);
            if code >= CODE.first[length] && index < CODE.count[length] {
                let symbol = CODE.symbols[CODE.offset[length] + index as usize];
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                decoded.push(symbol as u8);
                (code, length) = (0, 0);
            }
        }
    }
    // What is left must be padding: at most 7 bits, the most significant bits of EOS (ones).
    if length > 7 || code != (1 << length) - 1 {
        return Err(HuffmanError::Padding);
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        hex::decode(text.replace(' ', "")).unwrap()
    }

    #[test]
    fn the_code_is_complete_and_covers_every_octet() {
        let last = MAX_CODE_LENGTH;
        // Kraft equality: the last code of the longest length is all ones.
        assert_eq!(CODE.first[last] + CODE.count[last], 1 << last);
        let mut seen = [false; 257];
        for symbol in CODE.symbols {
            assert!(!seen[usize::from(symbol)], "symbol {symbol} twice");
            seen[usize::from(symbol)] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn codes_of_rfc_7541_appendix_b() {
        // (symbol, code, length) spot checks across the table.
        for (symbol, code, length) in [
            (b'0', 0x0, 5),
            (b't', 0x9, 5),
            (b' ', 0x14, 6),
            (b'u', 0x2d, 6),
            (b':', 0x5c, 7),
            (b'z', 0x7b, 7),
            (b'&', 0xf8, 8),
            (b'!', 0x3f8, 10),
            (b'|', 0x7fc, 11),
            (0, 0x1ff8, 13),
            (b'{', 0x7ffe, 15),
            (b'\\', 0x7fff0, 19),
            (128, 0xfffe6, 20),
            (1, 0x7fffd8, 23),
            (255, 0x3ffffee, 26),
            (249, 0xffffffe, 28),
            (22, 0x3ffffffe, 30),
        ] {
            let first = CODE.first[length];
            let start = CODE.offset[length];
            let found = CODE.symbols[start..start + CODE.count[length] as usize]
                .iter()
                .position(|s| *s == u16::from(symbol))
                .map(|i| first + i as u32);
            assert_eq!(found, Some(code), "symbol {symbol}");
        }
    }

    #[test]
    fn strings_of_rfc_7541_appendix_c() {
        for (coded, plain) in [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("6402", "302"),
            ("aec3 771a 4b", "private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                "https://www.example.com",
            ),
            ("9bd9 ab", "gzip"),
            ("", ""),
        ] {
            assert_eq!(decode(&hex(coded)).unwrap(), plain.as_bytes(), "{plain}");
        }
    }

    #[test]
    fn bad_padding_and_eos_are_errors() {
        // "0" (00000) padded with zeros instead of ones.
        assert_eq!(decode(&[0b0000_0000]), Err(HuffmanError::Padding));
        // A whole byte of padding after "a" + "0" + "0" (15 bits) plus 9 one bits.
        assert_eq!(decode(&[0x18, 0x01, 0xff]), Err(HuffmanError::Padding));
        // EOS itself: thirty ones, then two ones of padding.
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff]), Err(HuffmanError::Eos));
    }
}

use super::*;

const GI: i64 = 1 << 30;

/// The cases of apimachinery's `TestQuantityParse`, `TestQuantityString` (alternate forms) and
/// `TestQuantityParseEmit`, as bytes: `Quantity.Value()`, rounded up to a whole byte.
const UPSTREAM: &[(&str, i64)] = &[
    ("0", 0),
    ("0n", 0),
    ("0u", 0),
    ("0m", 0),
    ("0Ki", 0),
    ("0k", 0),
    ("0Mi", 0),
    ("0M", 0),
    ("0Gi", 0),
    ("0G", 0),
    ("0Ti", 0),
    ("0T", 0),
    ("00", 0),
    ("1", 1),
    // Binary suffixes
    ("1Ki", 1024),
    ("8Ki", 8 << 10),
    ("7Mi", 7 << 20),
    ("6Gi", 6 << 30),
    ("5Ti", 5 << 40),
    ("4Pi", 4 << 50),
    ("3Ei", 3 << 60),
    ("10Ti", 10 << 40),
    ("100Ti", 100 << 40),
    // Decimal suffixes
    ("5n", 1),
    ("4u", 1),
    ("3m", 1),
    ("9", 9),
    ("8k", 8_000),
    ("50k", 50_000),
    ("7M", 7_000_000),
    ("6G", 6_000_000_000),
    ("5T", 5_000_000_000_000),
    ("40T", 40_000_000_000_000),
    ("300T", 300_000_000_000_000),
    ("2P", 2_000_000_000_000_000),
    ("1E", 1_000_000_000_000_000_000),
    // Decimal exponents
    ("1E-3", 1),
    ("1e3", 1_000),
    ("1E6", 1_000_000),
    ("1e9", 1_000_000_000),
    ("1E12", 1_000_000_000_000),
    ("1e15", 1_000_000_000_000_000),
    ("1E18", 1_000_000_000_000_000_000),
    ("1e14", 100_000_000_000_000),
    ("1e13", 10_000_000_000_000),
    ("100.035k", 100_035),
    // Things that look like floating point
    ("0.001", 1),
    ("0.0005k", 1),
    ("0.005", 1),
    ("0.05", 1),
    ("0.5", 1),
    ("0.00050k", 1),
    ("0.00500", 1),
    ("0.05000", 1),
    ("0.50000", 1),
    ("0.5e0", 1),
    ("0.5e-1", 1),
    ("0.5e-2", 1),
    ("10.035M", 10_035_000),
    ("1.2e3", 1_200),
    ("1.3E+6", 1_300_000),
    ("1.40e9", 1_400_000_000),
    ("1.53E12", 1_530_000_000_000),
    ("1.6e15", 1_600_000_000_000_000),
    ("1.7E18", 1_700_000_000_000_000_000),
    ("9.01", 10),
    ("8.1k", 8_100),
    ("7.123456M", 7_123_456),
    ("6.987654321G", 6_987_654_321),
    ("5.444T", 5_444_000_000_000),
    ("40.1T", 40_100_000_000_000),
    ("300.2T", 300_200_000_000_000),
    ("2.5P", 2_500_000_000_000_000),
    ("1.01E", 1_010_000_000_000_000_000),
    // Things that saturate/round
    ("3.001n", 1),
    ("1.1E-9", 1),
    ("0.0000000001", 1),
    ("0.0000000005", 1),
    ("0.00000000050", 1),
    ("0.5e-9", 1),
    ("0.9n", 1),
    ("0.00000012345", 1),
    ("0.00000012354", 1),
    // Fractional binary amounts
    ("100.035Ki", 102_436),
    ("0.5Mi", 512 << 10),
    ("0.05Gi", 53_687_092),
    ("0.025Ti", 27_487_790_695),
    // Things written by trolls
    ("0.000000000001Ki", 1),
    (".001", 1),
    (".0001k", 1),
    ("1.", 1),
    ("1.G", 1_000_000_000),
    // Alternate spellings of canonical values
    ("1024Mi", GI),
    ("307200Ki", 300 << 20),
    ("1025024Mi", 1001 * GI),
    ("1024Gi", 1 << 40),
    ("5000m", 5),
    ("1000M", 1_000_000_000),
    ("0.001T", 1_000_000_000),
    ("1000u", 1),
    ("1.08", 2),
    ("1080000000n", 2),
    (".001e12", 1_000_000_000),
    ("0.001e0", 1),
    ("1000e-12", 1),
    (".001Ki", 2),
    (".000001Ki", 1),
    // Forms the API server stores that an earlier parser refused (safety review, issue 18).
    ("5e9", 5_000_000_000),
    ("1126400m", 1127),
    ("1.5Gi", 3 << 29),
    ("1E3", 1_000),
    // The edges of what bytes can be.
    ("9223372036854775807", i64::MAX),
    ("9223372036854775807000m", i64::MAX),
    ("7.999999999999999999Ei", i64::MAX),
    ("0e999999999", 0),
    ("1e-999999999", 1),
];

#[test]
fn upstream_quantities_in_bytes() {
    for (text, want) in UPSTREAM {
        assert_eq!(bytes(text), Ok(*want), "{text}");
        let plus = format!("+{text}");
        assert_eq!(bytes(&plus), Ok(*want), "{plus}");
        let minus = format!("-{text}");
        let negated = bytes(&minus);
        if *want == 0 {
            assert_eq!(negated, Ok(0), "{minus}");
        } else {
            assert_eq!(
                negated,
                Err(QuantityError::Negative(minus.clone())),
                "{minus}"
            );
        }
    }
    assert_eq!(bytes("+1Ki"), Ok(1024));
}

#[test]
fn refusals_are_typed() {
    let malformed = [
        // apimachinery's invalid cases
        "1.1.M",
        "1+1.0M",
        "0.1mi",
        "0.1am",
        "aoeu",
        ".5i",
        "1i",
        "-3.01i",
        "-3.01e-",
        " 1",
        "1 ",
        "",
        // no digit at all (upstream's scanner reads these as zero; the server never stores them)
        "Gi",
        ".",
        "-",
        "+",
        "e3", // an exponent must be an integer that fits
        "1e",
        "1e1.5",
        "1ee3",
        "1e99999999999999999999",
        "1Ki3",
        "1KiB",
        "1K",
    ];
    for text in malformed {
        assert_eq!(
            bytes(text),
            Err(QuantityError::Malformed(text.to_string())),
            "{text:?}"
        );
        assert_eq!(parse(text), None, "{text:?}");
    }
    // Upstream caps BinarySI amounts at the largest int64 and keeps larger decimal ones; as a
    // size in bytes neither is a request that can be met.
    for text in [
        "9Ei",
        "8Ei",
        "9223372036854775807Ki",
        "9223372036854775808",
        "9223372036854775807.1",
        "12E",
        "1e19",
        "1e21",
        "1000E",
        "1e999999999",
    ] {
        assert_eq!(
            bytes(text),
            Err(QuantityError::Overflow(text.to_string())),
            "{text}"
        );
    }
    assert_eq!(bytes("-1"), Err(QuantityError::Negative("-1".into())));
    let message = bytes("12E").unwrap_err().to_string();
    assert!(
        message.contains("12E") && message.contains("9223372036854775807"),
        "{message}"
    );
}

/// Generated sizes, written in every suffix form that can spell them, parse back to the same
/// number; one unit less of a finer suffix than exact rounds up to it.
#[test]
fn every_spelling_of_a_size_parses_back_to_it() {
    // A fixed-seed xorshift: the same values on every run.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    const BINARY: [(&str, u32); 6] = [
        ("Ki", 10),
        ("Mi", 20),
        ("Gi", 30),
        ("Ti", 40),
        ("Pi", 50),
        ("Ei", 60),
    ];
    const DECIMAL: [(&str, u32); 6] = [
        ("k", 3),
        ("M", 6),
        ("G", 9),
        ("T", 12),
        ("P", 15),
        ("E", 18),
    ];
    for round in 0..2_000 {
        // Sizes of every magnitude, and whole multiples of the binary units.
        let size = match round % 3 {
            0 => (next() >> (next() % 63 + 1)) as i64,
            1 => ((next() % 1024) << (10 * (next() % 6))) as i64,
            _ => (next() % 1_000_000) as i64 * 10i64.pow((next() % 13) as u32),
        };
        let mut spellings = vec![
            size.to_string(),
            format!("+{size}"),
            format!("000{size}"),
            format!("{size}.000"),
            format!("{size}e0"),
            format!("{size}000m"),
            format!("{size}000000u"),
            format!("{size}000000000n"),
        ];
        if size > 0 {
            // Just under the size, in a unit finer than a byte: rounds up to it.
            spellings.push(format!("{}999m", size - 1));
            spellings.push(format!("{}.000000001", size - 1));
        }
        for (suffix, shift) in BINARY {
            if size % (1 << shift) == 0 {
                spellings.push(format!("{}{suffix}", size >> shift));
            }
            // Halves and quarters of a unit are exact decimal fractions.
            if shift >= 2 && size % (1 << (shift - 2)) == 0 {
                let quarters = size >> (shift - 2);
                let fraction = ["", ".25", ".5", ".75"][(quarters % 4) as usize];
                spellings.push(format!("{}{fraction}{suffix}", quarters / 4));
            }
        }
        let digits = size.to_string();
        for (suffix, power) in DECIMAL {
            let power = power as usize;
            let (whole, fraction) = if digits.len() > power {
                digits.split_at(digits.len() - power)
            } else {
                ("0", digits.as_str())
            };
            let fraction = format!("{fraction:0>power$}");
            spellings.push(format!("{whole}.{fraction}{suffix}"));
            spellings.push(format!("{whole}.{fraction}e{power}"));
            spellings.push(format!("{whole}.{fraction}E+{power}"));
        }
        spellings.push(format!(
            "{}.{}e{}",
            &digits[..1],
            &digits[1..],
            digits.len() - 1
        ));
        for spelling in spellings {
            assert_eq!(bytes(&spelling), Ok(size), "{spelling}");
        }
    }
}

#[test]
fn binary_si_sizes() {
    let table = [
        (1 << 30, "1Gi"),
        (1536 << 20, "1536Mi"),
        (1000, "1000"),
        (0, "0"),
        (3 << 40, "3Ti"),
        (4096, "4Ki"),
    ];
    for (size, expected) in table {
        assert_eq!(binary_si(size), expected, "{size}");
        assert_eq!(bytes(expected), Ok(size), "{expected} parses back");
    }
}

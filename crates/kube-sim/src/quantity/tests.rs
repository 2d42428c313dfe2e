//! Vectors from apimachinery's pkg/api/resource/quantity_test.go (TestQuantityParse,
//! TestParseQuantityString, TestParseQuantity, TestQuantityCmp, TestQuantityRoundUp).

use super::*;

/// The exact value of a plain decimal such as `-12.5`, built without [`parse`].
fn exact(text: &str) -> Quantity {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let mut quantity = Quantity {
        negative,
        digits: whole
            .bytes()
            .chain(fraction.bytes())
            .map(|b| b - b'0')
            .collect(),
        exponent: -(fraction.len() as i64),
    };
    quantity.normalize();
    quantity
}

/// upstream's `decQuantity(unscaled, scale, _)`: unscaled × 10^scale.
fn dec(unscaled: i128, scale: i64) -> Quantity {
    let mut quantity = exact(&unscaled.to_string());
    if !quantity.digits.is_empty() {
        quantity.exponent += scale;
    }
    quantity
}

#[test]
fn parses_as_parse_quantity_does() {
    let max = dec(i128::from(i64::MAX), 0);
    let table = [
        ("0", dec(0, 0)),
        ("0n", dec(0, 0)),
        ("0u", dec(0, 0)),
        ("0m", dec(0, 0)),
        ("0Ki", dec(0, 0)),
        ("0k", dec(0, 0)),
        ("0Mi", dec(0, 0)),
        ("0M", dec(0, 0)),
        ("0Gi", dec(0, 0)),
        ("0G", dec(0, 0)),
        ("0Ti", dec(0, 0)),
        ("0T", dec(0, 0)),
        ("1", dec(1, 0)),
        ("1Ki", dec(1024, 0)),
        ("8Ki", dec(8 * 1024, 0)),
        ("7Mi", dec(7 << 20, 0)),
        ("6Gi", dec(6 << 30, 0)),
        ("5Ti", dec(5 << 40, 0)),
        ("4Pi", dec(4 << 50, 0)),
        ("3Ei", dec(3 << 60, 0)),
        ("10Ti", dec(10 << 40, 0)),
        ("100Ti", dec(100 << 40, 0)),
        ("5n", dec(5, -9)),
        ("4u", dec(4, -6)),
        ("3m", dec(3, -3)),
        ("9", dec(9, 0)),
        ("8k", dec(8, 3)),
        ("50k", dec(5, 4)),
        ("7M", dec(7, 6)),
        ("6G", dec(6, 9)),
        ("5T", dec(5, 12)),
        ("40T", dec(4, 13)),
        ("300T", dec(3, 14)),
        ("2P", dec(2, 15)),
        ("1E", dec(1, 18)),
        ("1E-3", dec(1, -3)),
        ("1e3", dec(1, 3)),
        ("1E6", dec(1, 6)),
        ("1e9", dec(1, 9)),
        ("1E12", dec(1, 12)),
        ("1e15", dec(1, 15)),
        ("1E18", dec(1, 18)),
        ("1e14", dec(1, 14)),
        ("1e13", dec(1, 13)),
        ("100.035k", dec(100035, 0)),
        ("0.001", dec(1, -3)),
        ("0.0005k", dec(5, -1)),
        ("0.005", dec(5, -3)),
        ("0.05", dec(5, -2)),
        ("0.5", dec(5, -1)),
        ("0.00050k", dec(5, -1)),
        ("0.00500", dec(5, -3)),
        ("0.05000", dec(5, -2)),
        ("0.50000", dec(5, -1)),
        ("0.5e0", dec(5, -1)),
        ("0.5e-1", dec(5, -2)),
        ("0.5e-2", dec(5, -3)),
        ("10.035M", dec(10035, 3)),
        ("1.2e3", dec(12, 2)),
        ("1.3E+6", dec(13, 5)),
        ("1.40e9", dec(14, 8)),
        ("1.53E12", dec(153, 10)),
        ("1.6e15", dec(16, 14)),
        ("1.7E18", dec(17, 17)),
        ("9.01", dec(901, -2)),
        ("8.1k", dec(81, 2)),
        ("7.123456M", dec(7123456, 0)),
        ("6.987654321G", dec(6987654321, 0)),
        ("5.444T", dec(5444, 9)),
        ("40.1T", dec(401, 11)),
        ("300.2T", dec(3002, 11)),
        ("2.5P", dec(25, 14)),
        ("1.01E", dec(101, 16)),
        // Rounded up to a nano; binary amounts capped at i64::MAX.
        ("3.001n", dec(4, -9)),
        ("1.1E-9", dec(2, -9)),
        ("0.0000000001", dec(1, -9)),
        ("0.0000000005", dec(1, -9)),
        ("0.00000000050", dec(1, -9)),
        ("0.5e-9", dec(1, -9)),
        ("0.9n", dec(1, -9)),
        ("0.00000012345", dec(124, -9)),
        ("0.00000012354", dec(124, -9)),
        ("9Ei", max.clone()),
        ("9223372036854775807Ki", max.clone()),
        ("12E", dec(12, 18)),
        ("100.035Ki", dec(10243584, -2)),
        ("0.5Mi", dec(512 * 1024, 0)),
        ("0.05Gi", dec(536870912, -1)),
        ("0.025Ti", dec(274877906944, -1)),
        ("0.000000000001Ki", dec(2, -9)),
        (".001", dec(1, -3)),
        (".0001k", dec(100, -3)),
        ("1.", dec(1, 0)),
        ("1.G", dec(1, 9)),
        // TestParseQuantityString: no digit at all is zero.
        (".", dec(0, 0)),
        ("-.", dec(0, 0)),
        ("0.025Ti", dec(25 << 40, -3)),
        ("-1.025Ti", exact("-1126999418470.4")),
    ];
    for (input, want) in table {
        assert_eq!(parse(input), Ok(want.clone()), "{input}");
        // As upstream: the unsigned ones also with a `+`, and negated with a `-`.
        if !input.starts_with('-') {
            assert_eq!(parse(&format!("+{input}")), Ok(want.clone()), "+{input}");
            let negated = Quantity {
                negative: !want.digits.is_empty(),
                ..want
            };
            assert_eq!(parse(&format!("-{input}")), Ok(negated), "-{input}");
        }
    }
}

#[test]
fn exact_beyond_int64_as_parse_quantity_keeps_it() {
    let table = [
        ("-999999999999999999", "-999999999999999999"),
        ("999999999999999999.1", "999999999999999999.1"),
        ("9999999999999999999", "9999999999999999999"),
        ("-1.0E", "-1000000000000000000"),
        ("9999999999999999999000m", "9999999999999999999"),
        ("-1.0000000000000000001E", "-1000000000000000000.1"),
        ("10.000000000000000001E", "10000000000000000001"),
        ("-10000000000000000000000m", "-10000000000000000000"),
        ("-9223372036854775809.1", "-9223372036854775809.1"),
        ("9223372036854775808", "9223372036854775808"),
        ("-9223372036854775808.0", "-9223372036854775808"),
    ];
    for (input, want) in table {
        assert_eq!(parse(input), Ok(exact(want)), "{input}");
    }
}

#[test]
fn refuses_as_parse_quantity_does() {
    let table = [
        ("", QuantityError::Format),
        ("1.1.M", QuantityError::Format),
        ("1+1.0M", QuantityError::Format),
        ("0.1mi", QuantityError::Suffix),
        ("0.1am", QuantityError::Format),
        ("aoeu", QuantityError::Format),
        (".5i", QuantityError::Suffix),
        ("1i", QuantityError::Suffix),
        ("-3.01i", QuantityError::Suffix),
        ("-3.01e-", QuantityError::Suffix),
        (" 1", QuantityError::Format),
        ("1 ", QuantityError::Format),
        ("Non-Numeric", QuantityError::Format),
        // Upstream's slow path (a binary suffix of 2^50 or more, or finer than a nano)
        // needs a digit where its fast path reads none as zero.
        ("Pi", QuantityError::Numeric),
        ("-Ei", QuantityError::Numeric),
        (".e-10", QuantityError::Numeric),
        ("1.e", QuantityError::Suffix),
    ];
    for (input, want) in table {
        assert_eq!(parse(input), Err(want), "{input:?}");
    }
    for zero in ["-", "+", "Gi", "Ti", ".e-9", ".Mi"] {
        assert_eq!(parse(zero).map(|q| q.digits.is_empty()), Ok(true), "{zero}");
    }
}

#[test]
fn compares_by_value_as_cmp_does() {
    let table = [
        ("0", "0", Ordering::Equal),
        ("100m", "50m", Ordering::Greater),
        ("50m", "100m", Ordering::Less),
        ("10000T", "100Gi", Ordering::Greater),
        ("1Gi", "1073741824", Ordering::Equal),
        ("-1", "0", Ordering::Less),
        ("-2", "-1", Ordering::Less),
        ("1.5", "2", Ordering::Less),
        ("0.5Ki", "512", Ordering::Equal),
    ];
    for (x, y, want) in table {
        let (x, y) = (parse(x).unwrap(), parse(y).unwrap());
        assert_eq!(x.cmp(&y), want, "{x:?} {y:?}");
    }
}

#[test]
fn values_round_up_away_from_zero() {
    let table = [
        ("9.01", Some(10)),
        ("-9.01", Some(-10)),
        ("1Gi", Some(1 << 30)),
        ("1.5Gi", Some(1536 << 20)),
        ("1n", Some(1)),
        ("0", Some(0)),
        ("9Ei", Some(i64::MAX)),
        ("-9223372036854775808", Some(i64::MIN)),
        ("9223372036854775808", None),
        ("12E", None),
        ("1e400", None),
    ];
    for (input, want) in table {
        assert_eq!(parse(input).unwrap().value(), want, "{input}");
    }
}

//! Kubernetes resource quantities (apimachinery `resource.Quantity`) as storage sizes need
//! them: every form the API server accepts, converted to bytes; and bytes printed the way
//! BinarySI does.
//!
//! The grammar (upstream's):
//!
//! ```text
//! <quantity> ::= <sign>? <number> <suffix>
//! <number>   ::= <digits> | <digits> "." <digits>? | "." <digits>
//! <suffix>   ::= "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"          (powers of 1024)
//!              | "n" | "u" | "m" | "" | "k" | "M" | "G" | "T" | "P" | "E"
//!              | ("e" | "E") <sign>? <digits>                     (a power of ten)
//! ```
//!
//! Upstream's scanner also reads forms without any digit (`Gi`, `.`, `-`) as zero; the API
//! server never stores those (it writes zero as `0`), and a flag given one is a typo, so they
//! are refused here.

/// Why a quantity is no size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantity {0:?} is malformed: expected a number with an optional suffix, e.g. 10Gi, 500M, 1.5e9"
    )]
    Malformed(String),
    #[error("quantity {0:?} is negative")]
    Negative(String),
    #[error("quantity {0:?} is more than {max} bytes", max = i64::MAX)]
    Overflow(String),
}

/// The number of decimal digits of `i64::MAX`: a longer whole number of bytes overflows.
const MAX_DIGITS: usize = 19;

/// A quantity in bytes, rounded up to a whole byte as `Quantity.Value()` rounds (any positive
/// amount is at least one byte). Negative amounts and amounts over `i64::MAX` (what both
/// Kubernetes and CSI hold) are errors; so is anything off the grammar, whitespace included.
pub fn bytes(text: &str) -> Result<i64, QuantityError> {
    let malformed = || QuantityError::Malformed(text.to_string());
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, rest) = split_digits(unsigned);
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(after_point) => split_digits(after_point),
        None => ("", rest),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(malformed());
    }
    let (power_of_ten, power_of_two) = suffix_scale(suffix).ok_or_else(malformed)?;
    // value = digits × 10^scale × 2^power_of_two, with digits an integer.
    let fraction = fraction.trim_end_matches('0');
    let mut digits: Vec<u8> = whole
        .trim_start_matches('0')
        .bytes()
        .chain(fraction.bytes())
        .map(|d| d - b'0')
        .skip_while(|d| *d == 0)
        .collect();
    if digits.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative(text.to_string()));
    }
    let overflow = || QuantityError::Overflow(text.to_string());
    multiply(&mut digits, 1u64 << power_of_two);
    let scale = i128::from(power_of_ten) - fraction.len() as i128;
    // How many of the digits are whole bytes; the others are a fraction of one.
    let whole_digits = digits.len() as i128 + scale;
    if whole_digits > MAX_DIGITS as i128 {
        return Err(overflow());
    }
    let (whole_part, fraction_part) = if scale >= 0 {
        (digits.as_slice(), &[][..])
    } else {
        digits.split_at(usize::try_from(whole_digits.max(0)).unwrap_or(0))
    };
    let mut value = whole_part
        .iter()
        .fold(0u128, |value, digit| value * 10 + u128::from(*digit));
    if scale > 0 {
        value *= 10u128.pow(u32::try_from(scale).map_err(|_| overflow())?);
    }
    if fraction_part.iter().any(|d| *d != 0) {
        value += 1;
    }
    i64::try_from(value).map_err(|_| overflow())
}

/// [`bytes`] for callers that treat a quantity they cannot use as absent.
pub fn parse(text: &str) -> Option<u128> {
    bytes(text).ok().and_then(|b| u128::try_from(b).ok())
}

/// Splits off the leading ASCII digits.
fn split_digits(text: &str) -> (&str, &str) {
    text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    )
}

/// The power of ten and the power of two a suffix stands for.
fn suffix_scale(suffix: &str) -> Option<(i64, u32)> {
    let scale = match suffix {
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "" => (0, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let magnitude = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if magnitude.is_empty() || !magnitude.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (exponent.parse().ok()?, 0)
        }
    };
    Some(scale)
}

/// Multiplies a big-endian decimal digit string by `factor` in place.
fn multiply(digits: &mut Vec<u8>, factor: u64) {
    let mut carry = 0u128;
    for digit in digits.iter_mut().rev() {
        let product = u128::from(*digit) * u128::from(factor) + carry;
        *digit = (product % 10) as u8;
        carry = product / 10;
    }
    let mut head = Vec::new();
    while carry > 0 {
        head.push((carry % 10) as u8);
        carry /= 10;
    }
    head.reverse();
    digits.splice(0..0, head);
}

/// Bytes as a Kubernetes BinarySI quantity string, as `resource.NewQuantity(n, BinarySI)`
/// prints it: the largest binary suffix that divides exactly, else plain bytes.
pub fn binary_si(bytes: i64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes != 0 {
        for (suffix, shift) in SUFFIXES {
            let unit = 1i64 << shift;
            if bytes % unit == 0 {
                return format!("{}{suffix}", bytes / unit);
            }
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests;

//! apimachinery's `resource.Quantity` (k8s.io/apimachinery/pkg/api/resource/quantity.go
//! `ParseQuantity`, `Cmp`, `Value`) as kube-apiserver decodes it and the controllers compare it.
//! kube-sim keeps its own rather than the sidecars' parser, so that a bug there is not mirrored
//! by the API server the sidecars are tested against.
//!
//! The grammar: a sign, digits, a point and digits (each part optional), then a suffix: `Ki` …
//! `Ei` (powers of 1024), `n u m k M G T P E` or none (powers of 1000), or `e`/`E` and a signed
//! exponent. Upstream reads forms without a digit (`-`, `.`, `Gi`) as zero, except where its
//! slow path needs a number to parse (`Pi`, `Ei`, `.e-10`: "unable to parse numeric part").
//!
//! A value is exact, rounded up (away from zero) to a multiple of 10⁻⁹; with a binary suffix its
//! magnitude is capped at `i64::MAX`.

use std::cmp::Ordering;

/// Why text is no quantity; the texts are upstream's `ErrFormatWrong`, `ErrNumeric`, `ErrSuffix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// An exact decimal value; the default is zero. Equal values are equal whatever their text
/// (`1Gi` == `1073741824`), as `Cmp` and the API server's semantic equality see them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    /// The magnitude's significant digits, most significant first: no leading or trailing
    /// zeros; empty for zero.
    digits: Vec<u8>,
    /// The magnitude is `digits × 10^exponent`.
    exponent: i64,
}

/// The smallest step upstream keeps: nano (10⁻⁹).
const NANO: i64 = -9;
/// Upstream's fast path takes at most this many digits of a decimal number.
const MAX_INT64_FACTORS: usize = 18;

/// apimachinery's `ParseQuantity` (no surrounding whitespace: JSON decoding trims it first).
pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Format);
    }
    let (negative, unsigned) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, rest) = split_while(unsigned, |b| b.is_ascii_digit());
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(after_point) => split_while(after_point, |b| b.is_ascii_digit()),
        None => ("", rest),
    };
    let (_, exponent_part) = split_while(suffix, |b| b"eEinumkKMGTP".contains(&b));
    let exponent_digits = exponent_part
        .strip_prefix(['+', '-'])
        .unwrap_or(exponent_part);
    if !exponent_digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuantityError::Format);
    }
    let scale = interpret(suffix).ok_or(QuantityError::Suffix)?;
    // Upstream's fast path reads the digits as an int64 and never fails; its slow path hands the
    // number part to inf.Dec, which wants a digit.
    let whole_len = whole.trim_start_matches('0').len().max(1);
    let fast = match scale {
        Scale::Decimal(exponent) => {
            whole_len + fraction.len() <= MAX_INT64_FACTORS
                && i64::from(exponent) - fraction.len() as i64 >= NANO
        }
        Scale::Binary(power) => {
            let precision = 15 - whole_len as i64 - i64::from(power) * 3 / 10 - 1;
            fraction.is_empty() && precision >= 0
        }
    };
    if !fast && whole.is_empty() && fraction.is_empty() {
        return Err(QuantityError::Numeric);
    }
    let mut digits: Vec<u8> = whole
        .bytes()
        .chain(fraction.bytes())
        .map(|b| b - b'0')
        .collect();
    let mut exponent = -(fraction.len() as i64);
    match scale {
        Scale::Decimal(power) => exponent += i64::from(power),
        Scale::Binary(power) => {
            for _ in 0..power {
                double(&mut digits);
            }
        }
    }
    let mut quantity = Quantity {
        negative,
        digits,
        exponent,
    };
    quantity.normalize();
    quantity.round_up_to_nano();
    if matches!(scale, Scale::Binary(_)) && quantity.magnitude_cmp(&max_int64()).is_gt() {
        quantity = Quantity {
            negative,
            ..max_int64()
        };
    }
    Ok(quantity)
}

impl Quantity {
    pub fn is_negative(&self) -> bool {
        self.negative
    }

    /// The value rounded up, away from zero, to an integer (`Quantity.Value()`); `None` beyond
    /// the range of i64, where Go's silently wraps.
    pub fn value(&self) -> Option<i64> {
        let places = self.digits.len() as i64 + self.exponent;
        if places > 19 {
            return None;
        }
        let kept = usize::try_from(places.max(0))
            .unwrap_or(0)
            .min(self.digits.len());
        let mut magnitude = self.digits[..kept]
            .iter()
            .fold(0i128, |value, digit| value * 10 + i128::from(*digit));
        for _ in 0..self.exponent.max(0) {
            magnitude *= 10;
        }
        if kept < self.digits.len() {
            magnitude += 1;
        }
        i64::try_from(if self.negative { -magnitude } else { magnitude }).ok()
    }

    /// Strips the leading and trailing zeros; zero has no sign.
    fn normalize(&mut self) {
        let leading = self.digits.iter().take_while(|d| **d == 0).count();
        self.digits.drain(..leading);
        while self.digits.last() == Some(&0) {
            self.digits.pop();
            self.exponent += 1;
        }
        if self.digits.is_empty() {
            *self = Quantity::default();
        }
    }

    /// Rounds the magnitude up to a multiple of 10⁻⁹: any amount asked for is at least some.
    fn round_up_to_nano(&mut self) {
        if self.exponent >= NANO {
            return;
        }
        let kept = self.digits.len() as i64 + self.exponent - NANO;
        // Normalized, the digits dropped end in a non-zero one: the kept part goes up by one.
        self.digits
            .truncate(usize::try_from(kept.max(0)).unwrap_or(0));
        self.exponent = NANO;
        let mut position = self.digits.len();
        loop {
            if position == 0 {
                self.digits.insert(0, 1);
                break;
            }
            position -= 1;
            if self.digits[position] == 9 {
                self.digits[position] = 0;
            } else {
                self.digits[position] += 1;
                break;
            }
        }
        self.normalize();
    }

    fn sign(&self) -> i8 {
        match (self.digits.is_empty(), self.negative) {
            (true, _) => 0,
            (false, true) => -1,
            (false, false) => 1,
        }
    }

    fn magnitude_cmp(&self, other: &Quantity) -> Ordering {
        let order = |q: &Quantity| q.digits.len() as i64 + q.exponent;
        match (self.digits.is_empty(), other.digits.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            (false, false) => order(self)
                .cmp(&order(other))
                .then_with(|| self.digits.cmp(&other.digits)),
        }
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Quantity) -> Ordering {
        self.sign().cmp(&other.sign()).then_with(|| {
            let magnitudes = self.magnitude_cmp(other);
            if self.negative {
                magnitudes.reverse()
            } else {
                magnitudes
            }
        })
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Quantity) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy)]
enum Scale {
    /// × 10^n
    Decimal(i32),
    /// × 2^n
    Binary(u32),
}

/// upstream's `suffixHandler.interpret`: the table, then an exponent that Go parses as an
/// int64 and truncates to int32.
fn interpret(suffix: &str) -> Option<Scale> {
    let scale = match suffix {
        "" => Scale::Decimal(0),
        "n" => Scale::Decimal(-9),
        "u" => Scale::Decimal(-6),
        "m" => Scale::Decimal(-3),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        "Ki" => Scale::Binary(10),
        "Mi" => Scale::Binary(20),
        "Gi" => Scale::Binary(30),
        "Ti" => Scale::Binary(40),
        "Pi" => Scale::Binary(50),
        "Ei" => Scale::Binary(60),
        _ => {
            let exponent: i64 = suffix.strip_prefix(['e', 'E'])?.parse().ok()?;
            Scale::Decimal(exponent as i32)
        }
    };
    Some(scale)
}

fn split_while(text: &str, keep: impl Fn(u8) -> bool) -> (&str, &str) {
    text.split_at(text.bytes().position(|b| !keep(b)).unwrap_or(text.len()))
}

/// Doubles a decimal digit string (most significant digit first) in place.
fn double(digits: &mut Vec<u8>) {
    let mut carry = 0;
    for digit in digits.iter_mut().rev() {
        let twice = *digit * 2 + carry;
        *digit = twice % 10;
        carry = twice / 10;
    }
    if carry > 0 {
        digits.insert(0, carry);
    }
}

fn max_int64() -> Quantity {
    Quantity {
        negative: false,
        digits: i64::MAX.to_string().bytes().map(|b| b - b'0').collect(),
        exponent: 0,
    }
}

#[cfg(test)]
mod tests;

//! Kubernetes resource quantities (apimachinery `resource.Quantity`) as far as storage sizes
//! need them: parsing to base units, and printing bytes the way BinarySI does.

/// A quantity in base units (bytes for storage), rounded up; `None` when malformed.
pub fn parse(text: &str) -> Option<u128> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(multiplier)?;
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len()).ok()?;
        let scale = 10u128.checked_pow(digits)?;
        let part: u128 = fraction.parse().ok()?;
        value = value.checked_add((part * multiplier).div_ceil(scale))?;
    }
    Some(value)
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
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let table = [
            ("1Mi", Some(1 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("100", Some(100)),
            ("2k", Some(2000)),
            ("0.1", Some(1)),
            ("1Qi", None),
            ("", None),
            ("Gi", None),
        ];
        for (text, expected) in table {
            assert_eq!(parse(text), expected, "{text}");
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
        for (bytes, expected) in table {
            assert_eq!(binary_si(bytes), expected, "{bytes}");
        }
    }
}

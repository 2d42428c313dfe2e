//! Kubernetes quantities (`csi_kinds::quantity`): capacities from claims, StorageClasses and
//! flags. Properties: no panic; a size is never negative and `parse` agrees with `bytes`; a
//! size is its quantity rounded up to a whole byte (against a floating-point estimate, for
//! quantities with a letter suffix); and every size, printed as BinarySI, parses back to
//! itself.
#![no_main]

use csi_kinds::quantity::{QuantityError, binary_si, bytes, parse};
use libfuzzer_sys::fuzz_target;

/// The letter suffixes and what they multiply by; the binary ones first, as "Mi" ends like
/// no decimal suffix but "M" begins it.
const SUFFIXES: [(&str, f64); 16] = [
    ("Ki", 1024.0),
    ("Mi", 1048576.0),
    ("Gi", 1073741824.0),
    ("Ti", 1099511627776.0),
    ("Pi", 1125899906842624.0),
    ("Ei", 1152921504606846976.0),
    ("n", 1e-9),
    ("u", 1e-6),
    ("m", 1e-3),
    ("k", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
    ("P", 1e15),
    ("E", 1e18),
    ("", 1.0),
];

/// About how many bytes `text` is, and whether it is more than none (a float may round a
/// tiny amount to zero): an unsigned decimal number with a letter suffix, or `None` for other
/// forms.
fn estimate(text: &str) -> Option<(f64, bool)> {
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(suffix, scale)| Some((unsigned.strip_suffix(suffix)?, *scale)))?;
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    let points = number.bytes().filter(|b| *b == b'.').count();
    if digits == 0 || points > 1 || digits + points != number.len() {
        return None;
    }
    let some = number.bytes().any(|b| (b'1'..=b'9').contains(&b));
    Some((number.parse::<f64>().ok()? * scale, some))
}

fn round_trips(size: i64) {
    assert_eq!(
        bytes(&binary_si(size)),
        Ok(size),
        "{size} as {}",
        binary_si(size)
    );
}

fuzz_target!(|input: &[u8]| {
    if let Ok(text) = std::str::from_utf8(input) {
        let size = bytes(text);
        assert_eq!(parse(text), size.clone().ok().map(|size| size as u128));
        if let Ok(size) = size {
            assert!(size >= 0, "{text:?} is {size} bytes");
            round_trips(size);
        }
        if let Some((estimate, some)) = estimate(text) {
            match size {
                Ok(size) => {
                    assert!(estimate < 9.3e18, "{text:?} is {size} bytes");
                    let error = (size as f64 - estimate.ceil()).abs();
                    assert!(error <= 1.0 + estimate * 1e-12, "{text:?} is {size} bytes");
                    assert_eq!(size > 0, some, "{text:?} is {size} bytes");
                }
                Err(QuantityError::Overflow(_)) => assert!(estimate > 9.2e18, "{text:?}"),
                Err(error) => panic!("{text:?}: {error}"),
            }
        }
    }
    // The input's first eight bytes as a size, so that sizes of every magnitude round-trip.
    let mut raw = [0; 8];
    let n = input.len().min(8);
    raw[..n].copy_from_slice(&input[..n]);
    round_trips(i64::from_le_bytes(raw) & i64::MAX);
});

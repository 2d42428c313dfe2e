//! Go's `time.Duration` text form: parsing what `time.ParseDuration` accepts and formatting
//! as `Duration.String()` does, for flags, help texts and messages shared with upstream.

use std::time::Duration;

/// Parses a Go `time.ParseDuration` string: `300ms`, `1.5h`, `1m30s`, `0`. Negative durations
/// are rejected because no flag of ours has a meaning for them.
pub fn parse_go_duration(input: &str) -> Result<Duration, String> {
    let text = input.trim();
    let bad = |why: &str| {
        format!("invalid duration {input:?}: {why} (Go syntax, e.g. 10s, 1m30s, 500ms)")
    };
    let text = text.strip_prefix('+').unwrap_or(text);
    if let Some(magnitude) = text.strip_prefix('-') {
        return if !magnitude.is_empty() && magnitude.chars().all(|c| c == '0') {
            Ok(Duration::ZERO)
        } else {
            Err(bad("must not be negative"))
        };
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("empty"));
    }
    let mut total_nanos: f64 = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("missing unit"))?;
        if number_len == 0 {
            return Err(bad("expected a number"));
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| bad("malformed number"))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(bad("missing unit")),
            unit => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        total_nanos += number * nanos_per_unit;
        rest = &rest[unit_len..];
    }
    if total_nanos > u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// Formats a duration the way Go's `time.Duration.String()` does (`1m0s`, `10s`, `500ms`), used
/// for help texts so `--help` shows the same defaults as upstream.
pub fn format_go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (value, unit) = match nanos {
            n if n < 1_000 => return format!("{n}ns"),
            n if n < 1_000_000 => (n as f64 / 1e3, "µs"),
            n => (n as f64 / 1e6, "ms"),
        };
        return format!("{}{unit}", trim_float(value));
    }
    let total_secs = duration.as_secs();
    let frac = duration.subsec_nanos();
    let seconds = if frac == 0 {
        format!("{}s", total_secs % 60)
    } else {
        format!(
            "{}s",
            trim_float((total_secs % 60) as f64 + f64::from(frac) / 1e9)
        )
    };
    match (total_secs / 3600, (total_secs / 60) % 60) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

fn trim_float(value: f64) -> String {
    let text = format!("{value:.9}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_like_time_parse_duration() {
        let table: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("1m30s", Duration::from_secs(90)),
            ("1m0s", Duration::from_secs(60)),
            ("5m", Duration::from_secs(300)),
            ("10m0s", Duration::from_secs(600)),
            ("1h", Duration::from_secs(3600)),
            ("1.5h", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("2us", Duration::from_micros(2)),
            ("2µs", Duration::from_micros(2)),
            ("7ns", Duration::from_nanos(7)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            ("+5s", Duration::from_secs(5)),
            (".5s", Duration::from_millis(500)),
        ];
        for (input, want) in table {
            assert_eq!(parse_go_duration(input).as_ref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn go_durations_reject_what_go_rejects() {
        for input in ["", "10", "s", "1x", "-5s", "1.2.3s", "ten seconds", "5 s"] {
            assert!(
                parse_go_duration(input).is_err(),
                "{input:?} must be rejected"
            );
        }
    }

    #[test]
    fn go_durations_format_like_go() {
        let table: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(15), "15s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(600), "10m0s"),
            (Duration::from_secs(3661), "1h1m1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(300), "300ms"),
        ];
        for (input, want) in table {
            assert_eq!(&format_go_duration(*input), want);
            assert_eq!(parse_go_duration(want).as_ref(), Ok(input));
        }
    }
}

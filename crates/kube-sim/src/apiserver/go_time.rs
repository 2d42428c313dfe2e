//! Go's `time.Parse` for the two layouts of Kubernetes' times: `metav1.Time` (RFC 3339) and
//! `metav1.MicroTime` (RFC 3339 with exactly six fractional digits). kube-apiserver refuses a
//! body whose time does not parse with Go's own error, which names no field
//! (`parsing time "…" as "…": cannot parse "Z" as ".000000"`), so kube-sim parses as Go does,
//! chunk by chunk of the layout, and words its refusals the same way.

/// Go's `time.RFC3339` and Kubernetes' `RFC3339Micro`.
pub(super) const RFC3339: &str = "2006-01-02T15:04:05Z07:00";
pub(super) const RFC3339_MICRO: &str = "2006-01-02T15:04:05.000000Z07:00";

/// One element of a layout, as Go's `nextStdChunk` splits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chunk {
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    /// `.000000`: exactly six fractional digits.
    Micros,
    /// `Z07:00`: `Z`, or a signed `hh:mm` offset.
    Zone,
}

/// MicroTime's layout: (literal before it, the chunk, the chunk as the layout writes it). A
/// Time's is the same without [`Chunk::Micros`].
const LAYOUT: [(&str, Chunk, &str); 8] = [
    ("", Chunk::Year, "2006"),
    ("-", Chunk::Month, "01"),
    ("-", Chunk::Day, "02"),
    ("T", Chunk::Hour, "15"),
    (":", Chunk::Minute, "04"),
    (":", Chunk::Second, "05"),
    ("", Chunk::Micros, ".000000"),
    ("", Chunk::Zone, "Z07:00"),
];

/// A parsed time: its civil fields and the offset east of UTC, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Parsed {
    pub year: i16,
    pub month: i8,
    pub day: i8,
    pub hour: i8,
    pub minute: i8,
    pub second: i8,
    pub nanosecond: i32,
    pub offset_seconds: i32,
}

impl Parsed {
    /// The instant, or `None` for one jiff cannot hold.
    pub fn timestamp(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        let civil = k8s_openapi::jiff::civil::DateTime::new(
            self.year,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            self.nanosecond,
        )
        .ok()?;
        let zone = k8s_openapi::jiff::tz::TimeZone::fixed(
            k8s_openapi::jiff::tz::Offset::from_seconds(self.offset_seconds).ok()?,
        );
        civil.to_zoned(zone).ok().map(|zoned| zoned.timestamp())
    }
}

/// `value` parsed with Kubernetes' layout of a Time (`micro` false) or a MicroTime, or Go's
/// error.
pub(super) fn parse(value: &str, micro: bool) -> Result<Parsed, String> {
    let layout = if micro { RFC3339_MICRO } else { RFC3339 };
    let chunks: Vec<_> = LAYOUT
        .into_iter()
        .filter(|chunk| micro || chunk.1 != Chunk::Micros)
        .collect();
    let cannot_parse = |element: &[u8], layout_element: &str| {
        format!(
            "parsing time {} as {}: cannot parse {} as {}",
            quote(value.as_bytes()),
            quote(layout.as_bytes()),
            quote(element),
            quote(layout_element.as_bytes())
        )
    };
    let out_of_range = |what: &str| {
        format!(
            "parsing time {}: {what} out of range",
            quote(value.as_bytes())
        )
    };
    let mut parsed = Parsed {
        year: 0,
        month: 1,
        day: 1,
        hour: 0,
        minute: 0,
        second: 0,
        nanosecond: 0,
        offset_seconds: 0,
    };
    let mut rest = value.as_bytes();
    for (i, &(prefix, chunk, layout_element)) in chunks.iter().enumerate() {
        let Some(after) = rest.strip_prefix(prefix.as_bytes()) else {
            return Err(cannot_parse(rest, prefix));
        };
        rest = after;
        let hold = rest;
        let mut range = None;
        let step: Option<&[u8]> = match chunk {
            Chunk::Year => (rest.len() >= 4 && rest[0].is_ascii_digit())
                .then(|| atoi(&rest[..4]))
                .flatten()
                .map(|year| {
                    parsed.year = year as i16;
                    &rest[4..]
                }),
            Chunk::Month => getnum(rest, true).map(|(month, after)| {
                if !(1..=12).contains(&month) {
                    range = Some("month");
                }
                parsed.month = month as i8;
                after
            }),
            Chunk::Day => getnum(rest, true).map(|(day, after)| {
                parsed.day = day as i8;
                after
            }),
            Chunk::Hour => getnum(rest, false).map(|(hour, after)| {
                if hour >= 24 {
                    range = Some("hour");
                }
                parsed.hour = hour as i8;
                after
            }),
            Chunk::Minute => getnum(rest, true).map(|(minute, after)| {
                if minute >= 60 {
                    range = Some("minute");
                }
                parsed.minute = minute as i8;
                after
            }),
            Chunk::Second => getnum(rest, true).and_then(|(second, after)| {
                parsed.second = second as i8;
                if second >= 60 {
                    range = Some("second");
                    return Some(after);
                }
                // A fraction the layout does not name is read here (RFC 3339's `.5`).
                let layout_has_fraction = chunks.get(i + 1).is_some_and(|c| c.1 == Chunk::Micros);
                let fraction = after.len() >= 2
                    && matches!(after[0], b'.' | b',')
                    && after[1].is_ascii_digit()
                    && !layout_has_fraction;
                if !fraction {
                    return Some(after);
                }
                let digits = 1 + after[1..].iter().take_while(|b| b.is_ascii_digit()).count();
                let (nanosecond, why) = nanoseconds(after, digits)?;
                range = range.or(why);
                parsed.nanosecond = nanosecond;
                Some(&after[digits..])
            }),
            Chunk::Micros => (rest.len() >= 7)
                .then(|| nanoseconds(rest, 7))
                .flatten()
                .map(|(nanosecond, why)| {
                    range = why;
                    parsed.nanosecond = nanosecond;
                    &rest[7..]
                }),
            Chunk::Zone => zone(rest).map(|(offset, after)| {
                parsed.offset_seconds = offset;
                after
            }),
        };
        if let Some(what) = range {
            return Err(out_of_range(what));
        }
        match step {
            Some(after) => rest = after,
            None => return Err(cannot_parse(hold, layout_element)),
        }
    }
    if !rest.is_empty() {
        return Err(format!(
            "parsing time {}: extra text: {}",
            quote(value.as_bytes()),
            quote(rest)
        ));
    }
    if parsed.day < 1 || parsed.day > days_in(parsed.month, parsed.year) {
        return Err(out_of_range("day"));
    }
    Ok(parsed)
}

/// Go's `getnum`: one or two leading digits (`fixed`: exactly two).
fn getnum(value: &[u8], fixed: bool) -> Option<(u32, &[u8])> {
    let digit = |i: usize| {
        value
            .get(i)
            .filter(|b| b.is_ascii_digit())
            .map(|b| u32::from(b - b'0'))
    };
    let first = digit(0)?;
    match digit(1) {
        Some(second) => Some((first * 10 + second, &value[2..])),
        None if fixed => None,
        None => Some((first, &value[1..])),
    }
}

/// Go's `atoi`: an optional sign, then digits to the end.
fn atoi(value: &[u8]) -> Option<i64> {
    let (negative, digits) = match value.first() {
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        _ => (false, value),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = std::str::from_utf8(digits).ok()?.parse::<i64>().ok()?;
    Some(if negative { -number } else { number })
}

/// Go's `parseNanoseconds` of `value[..width]` (a `.` or `,`, then digits), with the range
/// it finds out of bounds.
fn nanoseconds(value: &[u8], width: usize) -> Option<(i32, Option<&'static str>)> {
    if !matches!(value.first(), Some(b'.' | b',')) {
        return None;
    }
    let width = width.min(10);
    let fraction = atoi(&value[1..width])?;
    if fraction < 0 {
        return Some((0, Some("fractional second")));
    }
    let scale = 10_i64.pow((10 - width) as u32);
    Some(((fraction * scale) as i32, None))
}

/// `Z07:00`: `Z`, or `±hh:mm` (any two digits each: the Go that v1.28.0 is built with checks
/// no range, and took `+25:00`).
fn zone(value: &[u8]) -> Option<(i32, &[u8])> {
    if let Some(after) = value.strip_prefix(b"Z") {
        return Some((0, after));
    }
    if value.len() < 6 || value[3] != b':' {
        return None;
    }
    let (hours, _) = getnum(&value[1..3], true)?;
    let (minutes, _) = getnum(&value[4..6], true)?;
    let offset = (hours * 60 + minutes) as i32 * 60;
    match value[0] {
        b'+' => Some((offset, &value[6..])),
        b'-' => Some((-offset, &value[6..])),
        _ => None,
    }
}

fn days_in(month: i8, year: i16) -> i8 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The time package's `quote`: printable ASCII as is (`"` and `\` escaped), every byte of
/// anything else as `\xNN`.
fn quote(value: &[u8]) -> String {
    let mut quoted = String::from("\"");
    for &byte in value {
        match byte {
            b'"' | b'\\' => {
                quoted.push('\\');
                quoted.push(char::from(byte));
            }
            b' '..=b'~' => quoted.push(char::from(byte)),
            _ => quoted.push_str(&format!("\\x{byte:02x}")),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each answer is what kube-apiserver v1.28.0 answered for the value in a Lease's
    /// `renewTime` (MicroTime) or an Event's `lastTimestamp` (Time).
    #[test]
    fn parses_and_refuses_as_go() {
        let rows: [(&str, bool, Result<&str, &str>); 25] = [
            (
                "2020-01-01T00:00:00.123456Z",
                true,
                Ok("2020-01-01T00:00:00.123456Z"),
            ),
            (
                "2020-01-01T00:00:00.000000+01:00",
                true,
                Ok("2019-12-31T23:00:00Z"),
            ),
            (
                "2020-01-01T1:00:00.000000Z",
                true,
                Ok("2020-01-01T01:00:00Z"),
            ),
            (
                "2020-01-01T00:00:00Z",
                true,
                Err(
                    r#"parsing time "2020-01-01T00:00:00Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "Z" as ".000000""#,
                ),
            ),
            (
                "2020-01-01T00:00:00.123Z",
                true,
                Err(
                    r#"parsing time "2020-01-01T00:00:00.123Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse ".123Z" as ".000000""#,
                ),
            ),
            (
                "garbage",
                true,
                Err(
                    r#"parsing time "garbage" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "garbage" as "2006""#,
                ),
            ),
            (
                "2020-13-01T00:00:00.000000Z",
                true,
                Err(r#"parsing time "2020-13-01T00:00:00.000000Z": month out of range"#),
            ),
            (
                "2020-02-30T00:00:00.000000Z",
                true,
                Err(r#"parsing time "2020-02-30T00:00:00.000000Z": day out of range"#),
            ),
            (
                "2020-01-01T00:00:00.1234567Z",
                true,
                Err(
                    r#"parsing time "2020-01-01T00:00:00.1234567Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "7Z" as "Z07:00""#,
                ),
            ),
            (
                "2020-01-01T00:00:00.000000+0100",
                true,
                Err(
                    r#"parsing time "2020-01-01T00:00:00.000000+0100" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "+0100" as "Z07:00""#,
                ),
            ),
            (
                "2020-01-01T00:00:00.000000Zjunk",
                true,
                Err(r#"parsing time "2020-01-01T00:00:00.000000Zjunk": extra text: "junk""#),
            ),
            (
                "2020-01-01 00:00:00.000000Z",
                true,
                Err(
                    r#"parsing time "2020-01-01 00:00:00.000000Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse " 00:00:00.000000Z" as "T""#,
                ),
            ),
            (
                "20-01-01T00:00:00.000000Z",
                true,
                Err(
                    r#"parsing time "20-01-01T00:00:00.000000Z" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "20-01-01T00:00:00.000000Z" as "2006""#,
                ),
            ),
            (
                "2020-01-01T25:00:00.000000Z",
                true,
                Err(r#"parsing time "2020-01-01T25:00:00.000000Z": hour out of range"#),
            ),
            (
                "",
                true,
                Err(
                    r#"parsing time "" as "2006-01-02T15:04:05.000000Z07:00": cannot parse "" as "2006""#,
                ),
            ),
            (
                "",
                false,
                Err(r#"parsing time "" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "2006""#),
            ),
            (
                "2020-01-01T00:00:00.5-07:00",
                false,
                Ok("2020-01-01T07:00:00.5Z"),
            ),
            (
                "2020-01-01T00:00:00.1234567891234Z",
                false,
                Ok("2020-01-01T00:00:00.123456789Z"),
            ),
            (
                "2020-01-01T00:00:00,5Z",
                false,
                Ok("2020-01-01T00:00:00.5Z"),
            ),
            (
                "2020-01-01T00:00:00+25:00",
                false,
                Ok("2019-12-30T23:00:00Z"),
            ),
            (
                "2020-01-01T00:00:00",
                false,
                Err(
                    r#"parsing time "2020-01-01T00:00:00" as "2006-01-02T15:04:05Z07:00": cannot parse "" as "Z07:00""#,
                ),
            ),
            (
                "2020-01-01T00:00:60Z",
                false,
                Err(r#"parsing time "2020-01-01T00:00:60Z": second out of range"#),
            ),
            (
                "2020-1-01T00:00:00Z",
                false,
                Err(
                    r#"parsing time "2020-1-01T00:00:00Z" as "2006-01-02T15:04:05Z07:00": cannot parse "1-01T00:00:00Z" as "01""#,
                ),
            ),
            (
                "2020-01-01T00:00:00.Z",
                false,
                Err(
                    r#"parsing time "2020-01-01T00:00:00.Z" as "2006-01-02T15:04:05Z07:00": cannot parse ".Z" as "Z07:00""#,
                ),
            ),
            (
                "+020-01-01T00:00:00Z",
                false,
                Err(
                    r#"parsing time "+020-01-01T00:00:00Z" as "2006-01-02T15:04:05Z07:00": cannot parse "+020-01-01T00:00:00Z" as "2006""#,
                ),
            ),
        ];
        for (value, micro, expected) in rows {
            let got = parse(value, micro).map(|parsed| parsed.timestamp().unwrap().to_string());
            assert_eq!(
                got.as_deref().map_err(String::as_str),
                expected,
                "{value} (micro: {micro})"
            );
        }
    }

    #[test]
    fn quotes_as_the_time_package() {
        assert_eq!(quote("a\"b\\c".as_bytes()), r#""a\"b\\c""#);
        assert_eq!(quote("é\n".as_bytes()), r#""\xc3\xa9\x0a""#);
    }
}

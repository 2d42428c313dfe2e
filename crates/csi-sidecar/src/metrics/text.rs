//! The Prometheus text format (0.0.4) the Go sidecars serve, rewritten from the OpenMetrics
//! text `prometheus-client` encodes. Scrapers read both, but the stored series differ:
//! OpenMetrics writes `le="25.0"` where Go writes `le="25"`, so recording rules and dashboards
//! that select a bucket (`{le="25"}`) would silently match nothing. Go's text format also names
//! counter families with their `_total` suffix, and has no `# EOF`, `# UNIT` or exemplars.

/// `Content-Type` of the Prometheus text format, as client_golang's promhttp sends it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A float as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it (how client_golang writes
/// sample values and `le`/`quantile` labels): the shortest digits, in exponent form when the
/// decimal exponent is below -4 or at least 6 (`1e+06`, `7.340032e+08`).
pub fn go_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    if (-4..6).contains(&exponent) || value == 0.0 {
        return format!("{value}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// Rewrites one OpenMetrics exposition into the Prometheus text format.
pub fn from_openmetrics(openmetrics: &str) -> String {
    let mut text = String::with_capacity(openmetrics.len());
    let lines: Vec<&str> = openmetrics.lines().collect();
    for (index, line) in lines.iter().enumerate() {
        if let Some(comment) = line.strip_prefix("# ") {
            let Some((keyword, rest)) = comment.split_once(' ') else {
                continue;
            };
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            match keyword {
                "HELP" => {
                    let counter = lines
                        .get(index + 1)
                        .is_some_and(|next| *next == format!("# TYPE {name} counter"));
                    let name = family_name(name, counter);
                    text.push_str(&format!("# HELP {name} {tail}\n"));
                }
                "TYPE" => {
                    let kind = if tail == "unknown" { "untyped" } else { tail };
                    let name = family_name(name, kind == "counter");
                    text.push_str(&format!("# TYPE {name} {kind}\n"));
                }
                // `# UNIT`, `# EOF`: OpenMetrics only.
                _ => {}
            }
        } else if !line.is_empty() {
            text.push_str(&sample(line));
            text.push('\n');
        }
    }
    text
}

/// Go names a counter family after its samples, `_total` included.
fn family_name(name: &str, counter: bool) -> String {
    if counter && !name.ends_with("_total") {
        format!("{name}_total")
    } else {
        name.to_string()
    }
}

/// One sample line: the name and labels kept (`le` and `quantile` values reformatted), the
/// value in Go's spelling, any exemplar (`# {...}`) dropped.
fn sample(line: &str) -> String {
    let (series, rest) = match line.find('{') {
        Some(open) => match closing_brace(line, open) {
            Some(close) => (&line[..=close], &line[close + 1..]),
            None => return line.to_string(),
        },
        None => line.split_at(line.find(' ').unwrap_or(line.len())),
    };
    let value = rest.split_whitespace().next().unwrap_or_default();
    let value = value
        .parse::<f64>()
        .map(go_float)
        .unwrap_or_else(|_| value.to_string());
    format!("{} {value}", reformat_bounds(series))
}

/// The index of the `}` closing the label set opened at `open`, skipping quoted values.
fn closing_brace(line: &str, open: usize) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (offset, c) in line[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(open + offset),
            _ => {}
        }
    }
    None
}

/// `le="25.0"` → `le="25"` (and `quantile`), leaving every other label as written.
fn reformat_bounds(series: &str) -> String {
    let Some(open) = series.find('{') else {
        return series.to_string();
    };
    let mut out = series[..=open].to_string();
    let mut rest = &series[open + 1..];
    while let Some(equals) = rest.find("=\"") {
        let name = &rest[..equals];
        let value_start = equals + 2;
        let Some(length) = quoted_length(&rest[value_start..]) else {
            break;
        };
        let value = &rest[value_start..value_start + length];
        let value = match (name, value.parse::<f64>()) {
            ("le" | "quantile", Ok(bound)) => go_float(bound),
            _ => value.to_string(),
        };
        out.push_str(&format!("{name}=\"{value}\""));
        rest = &rest[value_start + length + 1..];
        match rest.strip_prefix(',') {
            Some(next) => {
                out.push(',');
                rest = next;
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// The length of a label value up to its closing, unescaped `"`.
fn quoted_length(value: &str) -> Option<usize> {
    let mut escaped = false;
    for (offset, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(offset),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_go_writes_them() {
        let table: [(f64, &str); 14] = [
            (0.0, "0"),
            (1.0, "1"),
            (25.0, "25"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (123_456.0, "123456"),
            (1_000_000.0, "1e+06"),
            (734_003_200.0, "7.340032e+08"),
            (u64::MAX as f64, "1.8446744073709552e+19"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (-3.5, "-3.5"),
        ];
        for (value, want) in table {
            assert_eq!(go_float(value), want, "{value}");
        }
        assert_eq!(go_float(f64::NAN), "NaN");
    }

    #[test]
    fn an_openmetrics_exposition_becomes_the_go_text_format() {
        let openmetrics = "\
# HELP csi_sidecar_operations_seconds Container Storage Interface operation duration with gRPC error code status total.
# TYPE csi_sidecar_operations_seconds histogram
csi_sidecar_operations_seconds_sum{driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 0.003
csi_sidecar_operations_seconds_count{driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"0.1\",driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"25.0\",driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"+Inf\",driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
# HELP process_cpu_seconds Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds counter
# UNIT process_cpu_seconds seconds
process_cpu_seconds_total 3.8
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 734003200.0
# HELP requests Requests.
# TYPE requests counter
requests_total{path=\"a}b \\\"le=\\\"1.0\\\"\",le=\"1.0\",x=\",le=\\\"2.0\"} 7 # {trace=\"x\"} 1.0
# HELP odd A family of unknown type.
# TYPE odd unknown
odd 1.0
# EOF
";
        let want = "\
# HELP csi_sidecar_operations_seconds Container Storage Interface operation duration with gRPC error code status total.
# TYPE csi_sidecar_operations_seconds histogram
csi_sidecar_operations_seconds_sum{driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 0.003
csi_sidecar_operations_seconds_count{driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"0.1\",driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"25\",driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"+Inf\",driver_name=\"d\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.8
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 7.340032e+08
# HELP requests_total Requests.
# TYPE requests_total counter
requests_total{path=\"a}b \\\"le=\\\"1.0\\\"\",le=\"1\",x=\",le=\\\"2.0\"} 7
# HELP odd A family of unknown type.
# TYPE odd untyped
odd 1
";
        assert_eq!(from_openmetrics(openmetrics), want);
    }
}

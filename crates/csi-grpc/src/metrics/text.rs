//! The Prometheus text format (0.0.4) the Go sidecars serve, rewritten from the OpenMetrics
//! text `prometheus-client` encodes. Scrapers read both, but the stored series differ:
//! OpenMetrics writes `le="25.0"` where Go writes `le="25"`, so recording rules and dashboards
//! that select a bucket (`{le="25"}`) would silently match nothing. Go's text format also names
//! counter families with their `_total` suffix, and has no `# EOF`, `# UNIT` or exemplars.

use std::collections::HashMap;

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
    if value == 0.0 {
        // -0 as well: client_golang's writeFloat tests `f == 0`.
        return "0".to_string();
    }
    if (-4..6).contains(&exponent) {
        return format!("{value}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// Rewrites one OpenMetrics exposition into the Prometheus text format, laid out as
/// client_golang writes it: families sorted by name and those without samples left out;
/// within a family, series sorted by their label values, each label set sorted by name
/// (`le`/`quantile` last), and a histogram's buckets before its `_sum` and `_count`.
pub fn from_openmetrics(openmetrics: &str) -> String {
    let mut families = parse(openmetrics);
    families.retain(|family| !family.series.is_empty());
    families.sort_by(|a, b| a.name.cmp(&b.name));
    let mut text = String::with_capacity(openmetrics.len());
    for family in families {
        if let Some(help) = &family.help {
            text.push_str(&format!("# HELP {} {help}\n", family.name));
        }
        text.push_str(&format!("# TYPE {} {}\n", family.name, family.kind));
        for series in family.series {
            for sample in series.samples {
                text.push_str(&sample);
                text.push('\n');
            }
        }
    }
    text
}

/// One family as the Go text format names and types it.
struct TextFamily {
    name: String,
    kind: &'static str,
    help: Option<String>,
    series: Vec<Series>,
    /// Where each label set's series is in `series`: a family may have thousands.
    index: HashMap<Vec<(String, String)>, usize>,
}

/// The samples sharing one label set (a histogram's buckets, sum and count), written.
struct Series {
    labels: Vec<(String, String)>,
    samples: Vec<String>,
}

fn parse(openmetrics: &str) -> Vec<TextFamily> {
    let mut families: Vec<TextFamily> = Vec::new();
    let mut help: Option<(String, String)> = None;
    for line in openmetrics.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let Some((keyword, rest)) = comment.split_once(' ') else {
                continue;
            };
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            match keyword {
                "HELP" => help = Some((name.to_string(), tail.to_string())),
                "TYPE" => {
                    let help = help
                        .take()
                        .filter(|(described, _)| described == name)
                        .map(|(_, text)| text);
                    let (name, kind) = go_family(name, tail);
                    families.push(TextFamily {
                        name,
                        kind,
                        help,
                        series: Vec::new(),
                        index: HashMap::new(),
                    });
                }
                // `# UNIT`, `# EOF`: OpenMetrics only.
                _ => {}
            }
        } else if !line.is_empty() {
            let Some(family) = families.last_mut() else {
                continue;
            };
            add_sample(family, line);
        }
    }
    for family in &mut families {
        family.series.sort_by(|a, b| {
            let values = |series: &Series| -> Vec<String> {
                series.labels.iter().map(|(_, v)| v.clone()).collect()
            };
            values(a).cmp(&values(b))
        });
    }
    families
}

/// Go's name and type for an OpenMetrics family: a counter is named with its `_total`
/// suffix, an info family becomes the gauge of its `_info` samples, and what the 0.0.4
/// format has no type for (unknown, state sets, gauge histograms) is untyped.
fn go_family(name: &str, kind: &str) -> (String, &'static str) {
    match kind {
        "counter" if !name.ends_with("_total") => (format!("{name}_total"), "counter"),
        "counter" => (name.to_string(), "counter"),
        "gauge" => (name.to_string(), "gauge"),
        "histogram" => (name.to_string(), "histogram"),
        "summary" => (name.to_string(), "summary"),
        "info" => (format!("{name}_info"), "gauge"),
        _ => (name.to_string(), "untyped"),
    }
}

/// Files one sample line under its series: the name and labels kept (labels sorted, `le` and
/// `quantile` reformatted and last), the value in Go's spelling, any exemplar (`# {...}`)
/// dropped.
fn add_sample(family: &mut TextFamily, line: &str) {
    let (name, labels, rest) = match line.find('{') {
        Some(open) => match closing_brace(line, open) {
            Some(close) => (
                &line[..open],
                labels(&line[open + 1..close]),
                &line[close + 1..],
            ),
            None => return,
        },
        None => {
            let (name, rest) = line.split_at(line.find(' ').unwrap_or(line.len()));
            (name, Vec::new(), rest)
        }
    };
    let value = rest.split_whitespace().next().unwrap_or_default();
    let value = value
        .parse::<f64>()
        .map(go_float)
        .unwrap_or_else(|_| value.to_string());
    let (mut bounds, mut identity): (Vec<_>, Vec<_>) = labels
        .into_iter()
        .partition(|(label, _)| label == "le" || label == "quantile");
    identity.sort();
    for (_, bound) in &mut bounds {
        if let Ok(parsed) = bound.parse::<f64>() {
            *bound = go_float(parsed);
        }
    }
    let written: Vec<String> = identity
        .iter()
        .chain(&bounds)
        .map(|(label, value)| format!("{label}=\"{value}\""))
        .collect();
    let sample = if written.is_empty() {
        format!("{name} {value}")
    } else {
        format!("{name}{{{}}} {value}", written.join(","))
    };
    let next = family.series.len();
    let at = *family.index.entry(identity.clone()).or_insert(next);
    if at == next {
        family.series.push(Series {
            labels: identity,
            samples: Vec::new(),
        });
    }
    let series = &mut family.series[at];
    // Go writes a histogram's buckets (a summary's quantiles) first, then `_sum`, `_count`.
    let rank = |sample: &str| {
        let name = sample.split(['{', ' ']).next().unwrap_or_default();
        if name.ends_with("_sum") {
            1
        } else if name.ends_with("_count") {
            2
        } else {
            0
        }
    };
    let at = series
        .samples
        .iter()
        .position(|written| rank(written) > rank(&sample))
        .unwrap_or(series.samples.len());
    series.samples.insert(at, sample);
}

/// The `name="value"` pairs of a label set, values kept escaped as written.
fn labels(mut rest: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    while let Some(equals) = rest.find("=\"") {
        let name = rest[..equals].to_string();
        let value_start = equals + 2;
        let Some(length) = quoted_length(&rest[value_start..]) else {
            break;
        };
        pairs.push((name, rest[value_start..value_start + length].to_string()));
        rest = &rest[value_start + length + 1..];
        match rest.strip_prefix(',') {
            Some(next) => rest = next,
            None => break,
        }
    }
    pairs
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
        let table: [(f64, &str); 15] = [
            (-0.0, "0"),
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
csi_sidecar_operations_seconds_sum{driver_name=\"d\",method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"} 0.002
csi_sidecar_operations_seconds_count{driver_name=\"d\",method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"0.1\",driver_name=\"d\",method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"25.0\",driver_name=\"d\",method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"} 1
csi_sidecar_operations_seconds_bucket{le=\"+Inf\",driver_name=\"d\",method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"} 1
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
odd -0.0
# HELP build Build.
# TYPE build info
build_info{version=\"v1\"} 1
# HELP never_set A family with no series yet.
# TYPE never_set gauge
# EOF
";
        let want = "\
# HELP build_info Build.
# TYPE build_info gauge
build_info{version=\"v1\"} 1
# HELP csi_sidecar_operations_seconds Container Storage Interface operation duration with gRPC error code status total.
# TYPE csi_sidecar_operations_seconds histogram
csi_sidecar_operations_seconds_bucket{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\",le=\"0.1\"} 1
csi_sidecar_operations_seconds_bucket{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\",le=\"25\"} 1
csi_sidecar_operations_seconds_bucket{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\",le=\"+Inf\"} 1
csi_sidecar_operations_seconds_sum{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\"} 0.002
csi_sidecar_operations_seconds_count{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/GetPluginInfo\"} 1
csi_sidecar_operations_seconds_bucket{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\",le=\"0.1\"} 1
csi_sidecar_operations_seconds_bucket{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\",le=\"25\"} 1
csi_sidecar_operations_seconds_bucket{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\",le=\"+Inf\"} 1
csi_sidecar_operations_seconds_sum{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\"} 0.003
csi_sidecar_operations_seconds_count{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\"} 1
# HELP odd A family of unknown type.
# TYPE odd untyped
odd 0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.8
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 7.340032e+08
# HELP requests_total Requests.
# TYPE requests_total counter
requests_total{path=\"a}b \\\"le=\\\"1.0\\\"\",x=\",le=\\\"2.0\",le=\"1\"} 7
";
        assert_eq!(from_openmetrics(openmetrics), want);
    }
}

//! Value parsers that accept exactly what Go's `flag`/`pflag` accept, so existing manifests work.

use std::collections::BTreeMap;

/// The smallest positive `--kube-api-qps`: one request a day. Below it the wait for a single
/// token outgrows what a timer can represent, and no sidecar could do its work anyway.
pub const MIN_POSITIVE_KUBE_API_QPS: f64 = 1.0 / 86_400.0;

/// Parses `--kube-api-qps`: a finite number; zero means the default and a negative value
/// disables the limit (client-go's meaning), a positive one must be at least
/// [`MIN_POSITIVE_KUBE_API_QPS`].
pub fn parse_kube_api_qps(input: &str) -> Result<f32, String> {
    // Parsed as f64 first so a value that underflows or overflows f32 is seen as what it is.
    let wide: f64 = input
        .trim()
        .parse()
        .map_err(|_| format!("invalid number {input:?}"))?;
    let qps = wide as f32;
    if !wide.is_finite() || !qps.is_finite() {
        return Err(format!(
            "{input:?} is not a finite number of queries per second"
        ));
    }
    if wide > 0.0 && wide < MIN_POSITIVE_KUBE_API_QPS {
        return Err(format!(
            "{input:?} is below one request a day ({MIN_POSITIVE_KUBE_API_QPS:.7}); use 0 for the default or a negative value to disable the limit"
        ));
    }
    Ok(qps)
}

/// Parses a boolean the way Go's `strconv.ParseBool` does.
pub fn parse_go_bool(input: &str) -> Result<bool, String> {
    match input {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("invalid boolean {other:?} (use true or false)")),
    }
}

/// Parses `k:v,k2:v2` (csi-lib-utils' `--leader-election-labels` syntax). Empty input is an
/// empty map; an item without `:` or with an empty key is an error, as upstream.
pub fn parse_colon_map(input: &str) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for item in input.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.split_once(':') {
            Some((key, value)) if !key.trim().is_empty() => {
                map.insert(key.trim().to_string(), value.trim().to_string());
            }
            _ => return Err(format!("invalid item {item:?}: expected key:value")),
        }
    }
    Ok(map)
}

/// Parses `--feature-gates=A=true,B=false` into a name → value map (names are checked later
/// against the component's own gate table).
pub fn parse_feature_gate_map(input: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut map = BTreeMap::new();
    for item in input.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for feature gate {item:?}"))?;
        let value = parse_go_bool(value.trim())
            .map_err(|e| format!("feature gate {}: {e}", name.trim()))?;
        map.insert(name.trim().to_string(), value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        for bad in ["yes", "", "on", "tRUE"] {
            assert!(parse_go_bool(bad).is_err());
        }
    }

    #[test]
    fn colon_maps() {
        let map = parse_colon_map("app:csi, tier : storage").unwrap();
        assert_eq!(map.get("app").map(String::as_str), Some("csi"));
        assert_eq!(map.get("tier").map(String::as_str), Some("storage"));
        assert!(parse_colon_map("").unwrap().is_empty());
        assert!(parse_colon_map("novalue").is_err());
        assert!(parse_colon_map(":v").is_err());
    }

    #[test]
    fn feature_gate_maps() {
        let map =
            parse_feature_gate_map("Topology=false,ReleaseLeaderElectionOnExit=true").unwrap();
        assert_eq!(map.get("Topology"), Some(&false));
        assert_eq!(map.get("ReleaseLeaderElectionOnExit"), Some(&true));
        assert!(parse_feature_gate_map("Topology").is_err());
        assert!(parse_feature_gate_map("Topology=maybe").is_err());
    }
}

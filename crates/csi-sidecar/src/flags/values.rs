//! Value parsers that accept exactly what Go's `flag`/`pflag` accept, so existing manifests work.

use std::collections::BTreeMap;

use csi_grpc::flags::parse_go_bool;

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
    fn feature_gate_maps() {
        let map =
            parse_feature_gate_map("Topology=false,ReleaseLeaderElectionOnExit=true").unwrap();
        assert_eq!(map.get("Topology"), Some(&false));
        assert_eq!(map.get("ReleaseLeaderElectionOnExit"), Some(&true));
        assert!(parse_feature_gate_map("Topology").is_err());
        assert!(parse_feature_gate_map("Topology=maybe").is_err());
    }
}

//! Value parsers that accept exactly what Go's `flag`/`pflag` accept, so existing manifests work.

use std::collections::BTreeMap;

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
}

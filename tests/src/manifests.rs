//! Reading rendered Kubernetes manifests (`helm template` output, `manifests/`): YAML documents
//! as JSON values.

use serde::Deserialize;
use serde_json::Value;

/// The objects of a multi-document YAML manifest (empty documents skipped).
pub fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("the manifest is YAML"))
        .filter(|object| !object.is_null())
        .collect()
}

/// The strings of a JSON array (nothing for anything else).
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

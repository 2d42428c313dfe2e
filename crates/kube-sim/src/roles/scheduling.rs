//! Pure predicates the PV binder, the scheduler and the node lifecycle controller share:
//! quantities, label and node selectors, PV ↔ claim matching, PV node affinity, and taint
//! toleration — with the semantics of k8s.io/component-helpers (scheduling/corev1,
//! storage/volume) and apimachinery's resource.Quantity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, PersistentVolume, PersistentVolumeClaim, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::quantity;

/// A quantity as the controllers read one the API server stored (which always parses).
pub fn parse_quantity(stored: &Quantity) -> Option<quantity::Quantity> {
    quantity::parse(&stored.0).ok()
}

/// The status of the node's Ready condition ("True", "False", "Unknown"), if it has one.
pub fn node_ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

/// `metav1.LabelSelector` against labels (an absent selector matches everything).
pub fn label_selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}

/// `v1.NodeSelector` against a Node (component-helpers `MatchNodeSelectorTerms`).
pub fn node_selector_matches(selector: &NodeSelector, node: &Node) -> bool {
    csi_sidecar::node_selector::matches(selector, &node.name_any(), node.labels())
}

/// The PV's required node affinity admits the node (no affinity: every node).
pub fn pv_matches_node(volume: &PersistentVolume, node: &Node) -> bool {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .is_none_or(|required| node_selector_matches(required, node))
}

/// A PV satisfies a claim: same class, enough capacity, every requested access mode, the same
/// volume mode, and the claim's selector (pv_controller `findMatchingVolume`).
pub fn claim_matches_pv(claim: &PersistentVolumeClaim, volume: &PersistentVolume) -> bool {
    let (Some(claim_spec), Some(spec)) = (claim.spec.as_ref(), volume.spec.as_ref()) else {
        return false;
    };
    let claim_class = claim_spec.storage_class_name.clone().unwrap_or_default();
    let volume_class = spec.storage_class_name.clone().unwrap_or_default();
    let requested = claim_spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(parse_quantity)
        .unwrap_or_default();
    let offered = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .and_then(parse_quantity)
        .unwrap_or_default();
    let modes = spec.access_modes.clone().unwrap_or_default();
    let mode_of = |m: Option<&String>| m.map_or("Filesystem".to_string(), Clone::clone);
    claim_class == volume_class
        && offered >= requested
        && claim_spec
            .access_modes
            .iter()
            .flatten()
            .all(|m| modes.contains(m))
        && mode_of(claim_spec.volume_mode.as_ref()) == mode_of(spec.volume_mode.as_ref())
        && label_selector_matches(claim_spec.selector.as_ref(), volume.labels())
}

/// A toleration tolerates a taint (component-helpers `ToleratesTaint`): an empty effect
/// matches every effect, an empty key with Exists matches every taint.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first taint with one of `effects` that no toleration tolerates.
pub fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    effects: &[&str],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|t| {
            !tolerations
                .iter()
                .any(|toleration| tolerates(toleration, t))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn claims_and_volumes() {
        let pv = |class: &str, size: &str, modes: serde_json::Value| -> PersistentVolume {
            from(
                json!({"metadata": {"name": "pv", "labels": {"tier": "gold"}}, "spec": {"storageClassName": class, "capacity": {"storage": size}, "accessModes": modes}}),
            )
        };
        let claim = |class: Option<&str>,
                     size: &str,
                     selector: serde_json::Value|
         -> PersistentVolumeClaim {
            from(
                json!({"metadata": {"name": "c"}, "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}, "selector": selector}}),
            )
        };
        let rwo = json!(["ReadWriteOnce", "ReadOnlyMany"]);
        let table = [
            (
                claim(Some(""), "1Gi", json!(null)),
                pv("", "1Gi", rwo.clone()),
                true,
            ),
            (
                claim(None, "1Gi", json!(null)),
                pv("", "2Gi", rwo.clone()),
                true,
            ),
            (
                claim(Some("fast"), "1Gi", json!(null)),
                pv("", "1Gi", rwo.clone()),
                false,
            ),
            (
                claim(Some(""), "3Gi", json!(null)),
                pv("", "2Gi", rwo.clone()),
                false,
            ),
            (
                claim(Some(""), "1Gi", json!(null)),
                pv("", "1Gi", json!(["ReadWriteMany"])),
                false,
            ),
            (
                claim(Some(""), "1Gi", json!({"matchLabels": {"tier": "gold"}})),
                pv("", "1Gi", rwo.clone()),
                true,
            ),
            (
                claim(
                    Some(""),
                    "1Gi",
                    json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}),
                ),
                pv("", "1Gi", rwo.clone()),
                false,
            ),
        ];
        for (i, (claim, volume, expected)) in table.iter().enumerate() {
            assert_eq!(claim_matches_pv(claim, volume), *expected, "case {i}");
        }
    }

    #[test]
    fn node_affinity() {
        let node: Node =
            from(json!({"metadata": {"name": "n1", "labels": {"zone": "a", "cores": "8"}}}));
        let selector = |terms: serde_json::Value| -> NodeSelector {
            from(json!({"nodeSelectorTerms": terms}))
        };
        let table = [
            (
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}, {"key": "gpu", "operator": "DoesNotExist"}]}]),
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]}]),
                false,
            ),
            (json!([{}]), false),
            (json!([]), false),
        ];
        for (i, (terms, expected)) in table.into_iter().enumerate() {
            assert_eq!(
                node_selector_matches(&selector(terms), &node),
                expected,
                "case {i}"
            );
        }
        let pv: PersistentVolume = from(json!({"metadata": {"name": "pv"}, "spec": {}}));
        assert!(pv_matches_node(&pv, &node));
    }

    #[test]
    fn tolerations() {
        let taint: Taint =
            from(json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}));
        let table = [
            (
                json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}),
                true,
            ),
            (
                json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists"}),
                true,
            ),
            (json!({"operator": "Exists"}), true),
            (
                json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
            (
                json!({"key": "node.kubernetes.io/unreachable", "value": "x"}),
                false,
            ),
            (json!({"key": "node.kubernetes.io/unreachable"}), true),
        ];
        for (i, (toleration, expected)) in table.into_iter().enumerate() {
            assert_eq!(tolerates(&from(toleration), &taint), expected, "case {i}");
        }
        let taints = vec![taint];
        assert!(untolerated(&taints, &[], &["NoSchedule"]).is_none());
        assert!(untolerated(&taints, &[], &["NoExecute"]).is_some());
    }
}

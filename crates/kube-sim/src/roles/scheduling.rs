//! Pure predicates the PV binder, the scheduler and the node lifecycle controller share:
//! quantities, label and node selectors, PV ↔ claim matching, PV node affinity, and taint
//! toleration — with the semantics of k8s.io/component-helpers (scheduling/corev1,
//! storage/volume) and apimachinery's resource.Quantity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim, Taint,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::quantity;
use crate::selectors::{label_value_errors, qualified_name_errors};

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

/// `v1.NodeSelector` against a Node (component-helpers nodeaffinity `NodeSelector.Match`):
/// terms are ORed, an empty one skipped; a term's requirements are ANDed, and a term with one
/// upstream cannot parse (`labels.NewRequirement`, a field other than In/NotIn of one value)
/// matches nothing.
pub fn node_selector_matches(selector: &NodeSelector, node: &Node) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!expressions.is_empty() || !fields.is_empty())
            && expressions
                .iter()
                .all(|r| label_requirement_matches(r, node.labels()))
            && fields.iter().all(|r| field_requirement_matches(r, node))
    })
}

fn label_requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let valid = qualified_name_errors(&requirement.key).is_empty()
        && values.iter().all(|v| label_value_errors(v).is_empty());
    let label = labels.get(&requirement.key);
    let integer = |text: &String| text.parse::<i64>().ok();
    valid
        && match (requirement.operator.as_str(), values) {
            ("In", [_, ..]) => label.is_some_and(|v| values.contains(v)),
            ("NotIn", [_, ..]) => label.is_none_or(|v| !values.contains(v)),
            ("Exists", []) => label.is_some(),
            ("DoesNotExist", []) => label.is_none(),
            (operator @ ("Gt" | "Lt"), [bound]) => {
                match (label.and_then(integer), integer(bound)) {
                    (Some(actual), Some(bound)) if operator == "Gt" => actual > bound,
                    (Some(actual), Some(bound)) => actual < bound,
                    _ => false,
                }
            }
            _ => false,
        }
}

/// A Node's fields are `metadata.name` alone; any other reads as empty, as in a fields.Set.
fn field_requirement_matches(requirement: &NodeSelectorRequirement, node: &Node) -> bool {
    let name = node.name_any();
    let field = if requirement.key == "metadata.name" {
        name.as_str()
    } else {
        ""
    };
    match (
        requirement.operator.as_str(),
        requirement.values.as_deref().unwrap_or_default(),
    ) {
        ("In", [value]) => field == value,
        ("NotIn", [value]) => field != value,
        _ => false,
    }
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

    /// component-helpers nodeaffinity_test.go (TestNodeSelectorMatch,
    /// TestNodeSelectorRequirementsAsSelector): a term upstream cannot parse matches nothing.
    #[test]
    fn node_selectors_as_component_helpers_match_them() {
        let host: Node = from(json!({"metadata": {"name": "host_1"}}));
        let labelled: Node = from(
            json!({"metadata": {"name": "host_1", "labels": {"label_1": "label_1_val", "foo": "bar"}}}),
        );
        let label = json!({"key": "label_1", "operator": "In", "values": ["label_1_val"]});
        let name = json!({"key": "metadata.name", "operator": "In", "values": ["host_1"]});
        let expression = |r: serde_json::Value| json!([{"matchExpressions": [r]}]);
        let table = [
            // Fields: In/NotIn with exactly one value.
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["host_1", "host_2"]}]}]),
                &labelled,
                false,
            ),
            (
                json!([{"matchExpressions": [label], "matchFields": [name]}]),
                &host,
                false,
            ),
            (
                json!([{"matchExpressions": [label], "matchFields": [name]}]),
                &labelled,
                true,
            ),
            (
                json!([{"matchExpressions": [label]}, {"matchFields": [name]}]),
                &host,
                true,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["host_2"]}]}]),
                &host,
                true,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}]),
                &host,
                false,
            ),
            // Labels: NewRequirement's rules.
            (
                expression(
                    json!({"key": "invalid key", "operator": "In", "values": ["label_value"]}),
                ),
                &labelled,
                false,
            ),
            (
                expression(json!({"key": "foo", "operator": "In", "values": ["bar", "baz"]})),
                &labelled,
                true,
            ),
            (
                expression(json!({"key": "foo", "operator": "Exists", "values": ["bar", "baz"]})),
                &labelled,
                false,
            ),
            (
                expression(json!({"key": "foo", "operator": "NotIn", "values": []})),
                &labelled,
                false,
            ),
            (
                expression(json!({"key": "baz", "operator": "invalid", "values": ["5"]})),
                &labelled,
                false,
            ),
            (
                expression(json!({"key": "foo", "operator": "NotIn", "values": ["bad value"]})),
                &labelled,
                false,
            ),
        ];
        for (i, (terms, node, expected)) in table.into_iter().enumerate() {
            let selector: NodeSelector = from(json!({"nodeSelectorTerms": terms}));
            assert_eq!(node_selector_matches(&selector, node), expected, "case {i}");
        }
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

//! The default admission plugins of kube-apiserver that storage stories depend on, applied on
//! create: StorageObjectInUseProtection (plugin/pkg/admission/storage/storageobjectinuseprotection),
//! DefaultStorageClass (plugin/pkg/admission/storage/persistentvolume/defaultstorageclass),
//! DefaultTolerationSeconds (plugin/pkg/admission/defaulttolerationseconds), TaintNodesByCondition
//! (plugin/pkg/admission/nodetaint), and the pod defaulting of pkg/apis/core/v1/defaults.go that
//! controllers read.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::resources::ResourceType;

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
const BETA_DEFAULT_CLASS_ANNOTATION: &str = "storageclass.beta.kubernetes.io/is-default-class";
/// DefaultTolerationSeconds' `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds`.
const DEFAULT_TOLERATION_SECONDS: i64 = 300;
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Admits a new object of a built-in kind; `storage_classes` lists the StorageClasses when the
/// DefaultStorageClass plugin needs them.
pub fn admit(
    rt: &ResourceType,
    mut object: Value,
    storage_classes: impl FnOnce() -> Vec<Arc<Value>>,
) -> Value {
    if !rt.group.is_empty() || rt.version != "v1" {
        return object;
    }
    match rt.kind.as_str() {
        "PersistentVolumeClaim" => {
            add_finalizer(&mut object, PVC_PROTECTION);
            if object["spec"]["storageClassName"].is_null()
                && let Some(class) = default_class(&storage_classes())
            {
                object["spec"]["storageClassName"] = json!(class);
            }
        }
        "PersistentVolume" => add_finalizer(&mut object, PV_PROTECTION),
        "Node" => add_not_ready_taint(&mut object),
        "Pod" => {
            default_pod(&mut object);
            add_default_tolerations(&mut object);
        }
        _ => {}
    }
    object
}

/// A claim's larger storage request on update, after validation (which refuses any change of
/// a claim not Bound): the PersistentVolumeClaimResize admission plugin
/// (plugin/pkg/admission/storage/persistentvolume/resize) needs a class (`class`, the
/// StorageClass the claim names, if it exists) that allows volume expansion, 403 otherwise.
pub fn admit_claim_update(
    current: &Value,
    next: &Value,
    class: Option<&Value>,
) -> Result<(), ApiError> {
    let storage = |claim: &Value| {
        claim["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .and_then(|q| crate::quantity::parse(q).ok())
    };
    let (Some(old), Some(new)) = (storage(current), storage(next)) else {
        return Ok(());
    };
    let name = current["metadata"]["name"].as_str().unwrap_or_default();
    if new > old && class.is_none_or(|c| c["allowVolumeExpansion"] != true) {
        return Err(ApiError::forbidden(format!(
            "persistentvolumeclaims \"{name}\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
        )));
    }
    Ok(())
}

/// A new Node is not ready until the node lifecycle controller sees it Ready and lifts the
/// taint, so that nothing is scheduled to it before.
fn add_not_ready_taint(node: &mut Value) {
    let taints = &mut node["spec"]["taints"];
    if !taints.is_array() {
        *taints = json!([]);
    }
    let Some(list) = taints.as_array_mut() else {
        return;
    };
    if !list
        .iter()
        .any(|t| t["key"] == NOT_READY_TAINT && t["effect"] == "NoSchedule")
    {
        list.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
}

fn add_finalizer(object: &mut Value, finalizer: &str) {
    let finalizers = &mut object["metadata"]["finalizers"];
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    if let Some(list) = finalizers.as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
}

/// The default class: annotated `is-default-class: "true"`; of several, the newest (then the
/// name) wins, as since Kubernetes 1.26.
fn default_class(classes: &[Arc<Value>]) -> Option<String> {
    classes
        .iter()
        .filter(|c| {
            let annotations = &c["metadata"]["annotations"];
            annotations[DEFAULT_CLASS_ANNOTATION] == "true"
                || annotations[BETA_DEFAULT_CLASS_ANNOTATION] == "true"
        })
        .max_by_key(|c| {
            (
                c["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .and_then(|c| c["metadata"]["name"].as_str().map(str::to_string))
}

/// Pod fields defaulted on create that the roles and the sidecars read.
fn default_pod(pod: &mut Value) {
    if !pod["spec"].is_object() {
        return;
    }
    let spec = &mut pod["spec"];
    let defaults = [
        ("schedulerName", json!("default-scheduler")),
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("serviceAccountName", json!("default")),
        ("enableServiceLinks", json!(true)),
        ("priority", json!(0)),
    ];
    for (field, value) in defaults {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
}

/// Every pod tolerates not-ready and unreachable (NoExecute) for 5 minutes unless it says
/// otherwise, so a short node outage does not evict it.
fn add_default_tolerations(pod: &mut Value) {
    if !pod["spec"].is_object() {
        return;
    }
    let tolerations = &mut pod["spec"]["tolerations"];
    if !tolerations.is_array() {
        *tolerations = json!([]);
    }
    let Some(list) = tolerations.as_array_mut() else {
        return;
    };
    for key in [NOT_READY_TAINT, UNREACHABLE_TAINT] {
        let covered = list.iter().any(|t| {
            let effect = t["effect"].as_str().unwrap_or("");
            let toleration_key = t["key"].as_str().unwrap_or("");
            (effect.is_empty() || effect == "NoExecute")
                && (toleration_key == key
                    || (toleration_key.is_empty() && t["operator"] == "Exists"))
        });
        if !covered {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": DEFAULT_TOLERATION_SECONDS}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    fn rt(plural: &str) -> ResourceType {
        Registry::default()
            .find("", "v1", plural)
            .expect("a built-in resource")
    }

    #[test]
    fn claims_get_protection_and_the_default_class() {
        let classes = vec![
            Arc::new(
                json!({"metadata": {"name": "old", "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}}}),
            ),
            Arc::new(
                json!({"metadata": {"name": "new", "creationTimestamp": "2026-02-01T00:00:00Z", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}}}),
            ),
            Arc::new(
                json!({"metadata": {"name": "plain", "creationTimestamp": "2026-03-01T00:00:00Z"}}),
            ),
        ];
        let claim = admit(
            &rt("persistentvolumeclaims"),
            json!({"metadata": {"name": "c"}, "spec": {}}),
            || classes.clone(),
        );
        assert_eq!(claim["metadata"]["finalizers"], json!([PVC_PROTECTION]));
        assert_eq!(claim["spec"]["storageClassName"], "new");
        let explicit = admit(
            &rt("persistentvolumeclaims"),
            json!({"metadata": {"name": "c"}, "spec": {"storageClassName": ""}}),
            || classes.clone(),
        );
        assert_eq!(
            explicit["spec"]["storageClassName"], "",
            "an explicit empty class means no class"
        );
        let volume = admit(
            &rt("persistentvolumes"),
            json!({"metadata": {"name": "v", "finalizers": [PV_PROTECTION]}}),
            Vec::new,
        );
        assert_eq!(volume["metadata"]["finalizers"], json!([PV_PROTECTION]));
    }

    #[test]
    fn pods_get_defaults_and_tolerations() {
        let pod = admit(
            &rt("pods"),
            json!({"metadata": {"name": "p"}, "spec": {"containers": [], "terminationGracePeriodSeconds": 5,
                "tolerations": [{"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute"}]}}),
            Vec::new,
        );
        assert_eq!(pod["spec"]["schedulerName"], "default-scheduler");
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 5);
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        let tolerations = pod["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tolerations.len(), 2, "{tolerations:?}");
        assert_eq!(tolerations[1]["key"], NOT_READY_TAINT);
        assert_eq!(
            tolerations[1]["tolerationSeconds"],
            DEFAULT_TOLERATION_SECONDS
        );
    }
}

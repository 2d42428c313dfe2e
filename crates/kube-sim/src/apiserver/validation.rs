//! Field validation of the built-in objects storage stories write, as kube-apiserver's
//! registries run it on create and update (pkg/apis/core/validation, pkg/apis/storage/validation,
//! pkg/apis/coordination/validation and k8s.io/apimachinery/pkg/api/validation/objectmeta.go,
//! v1.19 rules): every object's finalizer names (and none added while it is being deleted);
//! PersistentVolumes, claims (on create, and what an update may change), Events' namespaces,
//! Node taints, VolumeAttachments, StorageClasses, CSINodes, Leases and the CEL rules of
//! CustomResourceDefinitions ([`super::cel`]). Every violation is one
//! field error of a 422 Invalid; Go's dumps of a whole struct (the diff after "immutable after
//! creation") are left out of the messages.

use serde_json::Value;

use super::{cel, objects, rbac_objects};
use crate::errors::{ApiError, FieldError};
use crate::quantity;
use crate::resources::ResourceType;
use crate::selectors::{dns1123_subdomain_errors, qualified_name_errors};

/// Finalizers a name without a domain may have (pkg/apis/core/helper IsStandardFinalizerName).
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];
const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const RECLAIM_POLICIES: [&str; 3] = ["Delete", "Recycle", "Retain"];
const VOLUME_MODES: [&str; 2] = ["Block", "Filesystem"];
/// A PersistentVolume's sources, in the order validation counts them.
const VOLUME_SOURCES: [&str; 22] = [
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "glusterfs",
    "flocker",
    "nfs",
    "rbd",
    "quobyte",
    "cephfs",
    "iscsi",
    "cinder",
    "fc",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "photonPersistentDisk",
    "portworxVolume",
    "azureDisk",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];
/// The CSI source's secret references (CSIPersistentVolumeSource).
const CSI_SECRET_REFS: [&str; 4] = [
    "controllerPublishSecretRef",
    "nodeStageSecretRef",
    "nodePublishSecretRef",
    "controllerExpandSecretRef",
];

/// A new object of `rt`.
pub fn on_create(rt: &ResourceType, object: &Value) -> Result<(), ApiError> {
    let mut errors = finalizer_errors(rt, object);
    errors.extend(kind_errors(rt, object));
    if is_core(rt, "PersistentVolumeClaim") {
        errors.extend(claim_spec_errors(&object["spec"]));
    }
    refuse(rt, object, errors)
}

/// The rules of a kind that hold on create and on every update.
fn kind_errors(rt: &ResourceType, object: &Value) -> Vec<FieldError> {
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "PersistentVolume") => volume_spec_errors(&object["spec"]),
        ("", "Event") => event_errors(object),
        ("", "Node") => taint_errors(&object["spec"]),
        ("storage.k8s.io", "VolumeAttachment") => attachment_spec_errors(&object["spec"]),
        ("storage.k8s.io", "StorageClass") => class_errors(object),
        ("storage.k8s.io", "CSINode") => csi_node_errors(&object["spec"]),
        ("coordination.k8s.io", "Lease") => lease_errors(&object["spec"]),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => cel::crd_errors(object),
        ("rbac.authorization.k8s.io", _) => rbac_objects::errors(rt, object),
        _ => Vec::new(),
    }
}

/// `next` replacing `current` (both after the update's own rules: a status write's metadata
/// is already the current one where the kind's status strategy resets it).
pub fn on_update(rt: &ResourceType, current: &Value, next: &Value) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if current["metadata"]["deletionTimestamp"].is_string() {
        errors.extend(new_finalizer_errors(current, next));
    }
    errors.extend(finalizer_errors(rt, next));
    errors.extend(kind_errors(rt, next));
    errors.extend(rbac_objects::update_errors(rt, current, next));
    if is_core(rt, "PersistentVolume") {
        errors.extend(volume_update_errors(&current["spec"], &next["spec"]));
    }
    if is_core(rt, "PersistentVolumeClaim") {
        errors.extend(claim_update_errors(current, next));
    }
    // ValidateVolumeAttachmentUpdate.
    if rt.group == "storage.k8s.io"
        && rt.kind == "VolumeAttachment"
        && current["spec"] != next["spec"]
    {
        errors.push(FieldError {
            field: "spec".into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {}: field is immutable", next["spec"]),
        });
    }
    refuse(rt, next, errors)
}

fn is_core(rt: &ResourceType, kind: &str) -> bool {
    rt.group.is_empty() && rt.kind == kind
}

fn refuse(rt: &ResourceType, object: &Value, errors: Vec<FieldError>) -> Result<(), ApiError> {
    if errors.is_empty() {
        return Ok(());
    }
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::invalid_fields(rt, name, &errors))
}

/// apimachinery's ValidateFinalizers (each a qualified name; the path not indexed), then, for
/// built-in kinds (their validation is core's ValidateObjectMeta, a custom resource's is
/// apimachinery's alone), a name without a domain must be a standard one.
fn finalizer_errors(rt: &ResourceType, object: &Value) -> Vec<FieldError> {
    let names = objects::finalizers(object);
    let mut errors: Vec<FieldError> = names
        .iter()
        .flat_map(|name| {
            qualified_name_errors(name).into_iter().map(move |why| {
                FieldError::invalid("metadata.finalizers", &Value::from(*name), &why)
            })
        })
        .collect();
    if super::is_custom_resource(rt) {
        return errors;
    }
    for (i, name) in names.iter().enumerate() {
        if !name.contains('/') && !STANDARD_FINALIZERS.contains(name) {
            errors.push(FieldError::invalid(
                format!("metadata.finalizers[{i}]"),
                &Value::from(*name),
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    errors
}

/// ValidateNoNewFinalizers: the new ones sorted, as Go's `%#v` of a string slice.
fn new_finalizer_errors(current: &Value, next: &Value) -> Option<FieldError> {
    let existing = objects::finalizers(current);
    let mut added: Vec<&str> = objects::finalizers(next)
        .into_iter()
        .filter(|f| !existing.contains(f))
        .collect();
    if added.is_empty() {
        return None;
    }
    added.sort_unstable();
    added.dedup();
    let quoted: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
    Some(FieldError::forbidden(
        "metadata.finalizers",
        format!(
            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
            quoted.join(", ")
        ),
    ))
}

/// ValidatePersistentVolumeSpec: access modes, capacity (storage only, not negative), reclaim
/// policy, exactly one source, the CSI source's driver, handle and secret references, the
/// class name and the volume mode.
fn volume_spec_errors(spec: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    errors.extend(access_mode_errors(
        spec,
        FieldError::required("spec.accessModes"),
    ));
    let capacity = spec["capacity"].as_object().cloned().unwrap_or_default();
    if capacity.is_empty() {
        errors.push(FieldError::required("spec.capacity"));
    }
    if !capacity.contains_key("storage") || capacity.len() > 1 {
        // Go prints the map it decoded; an absent or empty one as below.
        let printed = match &spec["capacity"] {
            Value::Null => "core.ResourceList(nil)".to_string(),
            _ if capacity.is_empty() => "core.ResourceList{}".to_string(),
            other => other.to_string(),
        };
        errors.push(FieldError {
            field: "spec.capacity".into(),
            reason: "FieldValueNotSupported",
            detail: format!("Unsupported value: {printed}: supported values: \"storage\""),
        });
    }
    // validateBasicResource (the value as an integer), then ValidatePositiveQuantityValue.
    for (resource, quantity) in &capacity {
        // What decoding accepted: a string (trimmed, as Go's UnmarshalJSON) or a number.
        let text = match quantity {
            Value::Number(number) => number.to_string(),
            other => other.as_str().unwrap_or_default().trim().to_string(),
        };
        let Ok(parsed) = quantity::parse(&text) else {
            continue;
        };
        let zero = quantity::Quantity::default();
        if parsed > zero {
            continue;
        }
        let field = format!("spec.capacity[{resource}]");
        // Go's Value() wraps beyond int64; kube-sim leaves that error out for such sizes.
        if let Some(value) = parsed.value().filter(|v| *v < 0) {
            errors.push(FieldError::invalid(
                field.clone(),
                &Value::from(value),
                "must be a valid resource quantity",
            ));
        }
        // Go prints the quantity in canonical form, which for zero is always "0".
        let shown = if parsed == zero {
            Value::from("0")
        } else {
            quantity.clone()
        };
        errors.push(FieldError::invalid(
            field,
            &shown,
            "must be greater than zero",
        ));
    }
    errors.extend(one_of(
        "spec.persistentVolumeReclaimPolicy",
        &spec["persistentVolumeReclaimPolicy"],
        &RECLAIM_POLICIES,
    ));
    let sources: Vec<&str> = VOLUME_SOURCES
        .into_iter()
        .filter(|source| spec[*source].is_object())
        .collect();
    match sources.as_slice() {
        [] => errors.push(FieldError::required_because(
            "spec",
            "must specify a volume type",
        )),
        [first, more @ ..] => {
            if *first == "csi" {
                errors.extend(csi_source_errors(&spec["csi"]));
            }
            errors.extend(more.iter().map(|source| {
                FieldError::forbidden(
                    format!("spec.{source}"),
                    "may not specify more than 1 volume type",
                )
            }));
        }
    }
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        errors.extend(subdomain_errors("spec.storageClassName", class, class));
    }
    errors.extend(one_of(
        "spec.volumeMode",
        &spec["volumeMode"],
        &VOLUME_MODES,
    ));
    errors
}

/// `value`, when it is set, one of `supported`.
fn one_of(field: &str, value: &Value, supported: &[&str]) -> Option<FieldError> {
    value
        .as_str()
        .filter(|v| !supported.contains(v))
        .map(|_| FieldError::not_supported(field, value, supported))
}

/// At least one access mode (`required` when there is none), each one supported, and
/// ReadWriteOncePod alone.
fn access_mode_errors(spec: &Value, required: FieldError) -> Vec<FieldError> {
    let modes = spec["accessModes"].as_array().cloned().unwrap_or_default();
    let missing = modes.is_empty().then_some(required);
    let supported = |mode: &&Value| mode.as_str().is_some_and(|m| ACCESS_MODES.contains(&m));
    let pod = modes.iter().any(|mode| mode == "ReadWriteOncePod");
    let other = modes
        .iter()
        .filter(supported)
        .any(|mode| mode != "ReadWriteOncePod");
    let mixed = (pod && other).then(|| {
        FieldError::forbidden(
            "spec.accessModes",
            "may not use ReadWriteOncePod with other access modes",
        )
    });
    missing
        .into_iter()
        .chain(
            modes
                .iter()
                .filter_map(|mode| one_of("spec.accessModes", mode, &ACCESS_MODES)),
        )
        .chain(mixed)
        .collect()
}

/// IsDNS1123Subdomain's complaints about `checked` (`value`, or a form of it), at `field`.
fn subdomain_errors(field: &str, value: &str, checked: &str) -> Vec<FieldError> {
    dns1123_subdomain_errors(checked)
        .into_iter()
        .map(|why| FieldError::invalid(field, &Value::from(value), &why))
        .collect()
}

/// ValidateCSIDriverName: a DNS subdomain (case aside) of at most 63 characters.
fn csi_driver_errors(field: &str, driver: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if driver.is_empty() {
        errors.push(FieldError::required(field));
    }
    if driver.len() > 63 {
        errors.push(FieldError {
            field: field.into(),
            reason: "FieldValueTooLong",
            detail: "Too long: must have at most 63 bytes".into(),
        });
    }
    errors.extend(subdomain_errors(field, driver, &driver.to_lowercase()));
    errors
}

/// validateCSIPersistentVolumeSource: the driver's name, a handle, and each secret reference
/// with a name and a namespace.
fn csi_source_errors(csi: &Value) -> Vec<FieldError> {
    let mut errors = csi_driver_errors(
        "spec.csi.driver",
        csi["driver"].as_str().unwrap_or_default(),
    );
    if csi["volumeHandle"].as_str().is_none_or(str::is_empty) {
        errors.push(FieldError::required("spec.csi.volumeHandle"));
    }
    for reference in CSI_SECRET_REFS {
        if !csi[reference].is_object() {
            continue;
        }
        for field in ["name", "namespace"] {
            if csi[reference][field].as_str().is_none_or(str::is_empty) {
                errors.push(FieldError::required(format!(
                    "spec.csi.{reference}.{field}"
                )));
            }
        }
    }
    errors
}

/// ValidatePersistentVolumeUpdate: the source is immutable, so is the volume mode, and node
/// affinity once set (the paths as v1.19 names them).
fn volume_update_errors(current: &Value, next: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let source =
        |spec: &Value| -> Vec<Value> { VOLUME_SOURCES.iter().map(|s| spec[*s].clone()).collect() };
    if source(current) != source(next) {
        errors.push(FieldError::forbidden(
            "spec.persistentvolumesource",
            "spec.persistentvolumesource is immutable after creation",
        ));
    }
    for (field, set_once) in [("volumeMode", false), ("nodeAffinity", true)] {
        if set_once && current[field].is_null() {
            continue;
        }
        if current[field] != next[field] {
            errors.push(FieldError::invalid(
                field,
                &next[field],
                "field is immutable",
            ));
        }
    }
    errors
}

/// ValidatePersistentVolumeClaimUpdate: the spec is immutable but for the volume name (set
/// once), and for a Bound claim the storage request (lowered only above its capacity) and
/// the VolumeAttributesClass; a class may be set where only the beta annotation named it.
fn claim_update_errors(current: &Value, next: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let (mut old, mut new) = (current["spec"].clone(), next["spec"].clone());
    if old["volumeName"].as_str().is_none_or(str::is_empty) {
        old["volumeName"] = new["volumeName"].clone();
    }
    let beta_class = &current["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"];
    if old["storageClassName"].is_null()
        && !beta_class.is_null()
        && new["storageClassName"] == *beta_class
    {
        new["storageClassName"] = Value::Null;
    }
    let storage = |spec: &Value| {
        spec["resources"]["requests"]["storage"]
            .as_str()
            .and_then(|q| quantity::parse(q).ok())
    };
    let bound = next["status"]["phase"] == "Bound";
    // Quantities compare by value ("1Gi" is "1073741824").
    if storage(&old) == storage(&new) || bound {
        new["resources"]["requests"]["storage"] = old["resources"]["requests"]["storage"].clone();
    }
    if bound {
        new["volumeAttributesClassName"] = old["volumeAttributesClassName"].clone();
    }
    if strip_nulls(old) != strip_nulls(new) {
        errors.push(FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    // With RecoverVolumeExpansionFailure (GA since 1.34) a request may come down, to recover
    // from an expansion that cannot finish, but stay above the capacity the claim has.
    let capacity = current["status"]["capacity"]["storage"]
        .as_str()
        .and_then(|q| quantity::parse(q).ok())
        .unwrap_or_default();
    if let (Some(before), Some(after)) = (storage(&current["spec"]), storage(&next["spec"]))
        && after < before
        && after <= capacity
    {
        errors.push(FieldError::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    errors
}

/// A JSON value without null members, as Go decodes absent and null alike.
fn strip_nulls(mut value: Value) -> Value {
    if let Some(map) = value.as_object_mut() {
        map.retain(|_, v| !v.is_null());
        for v in map.values_mut() {
            *v = strip_nulls(std::mem::take(v));
        }
    }
    value
}

/// ValidatePersistentVolumeClaimSpec: at least one access mode, each supported, and a
/// storage request.
fn claim_spec_errors(spec: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    errors.extend(access_mode_errors(
        spec,
        FieldError::required_because("spec.accessModes", "at least 1 access mode is required"),
    ));
    if spec["resources"]["requests"]["storage"].is_null() {
        errors.push(FieldError::required("spec.resources[storage]"));
    }
    errors
}

/// A core Event without `eventTime` (legacyValidateEvent): its namespace is its object's, or
/// "default" (or none) for a cluster-scoped object.
fn event_errors(event: &Value) -> Vec<FieldError> {
    if event["eventTime"].is_string() {
        return Vec::new();
    }
    let namespace = event["metadata"]["namespace"].as_str().unwrap_or_default();
    let involved = event["involvedObject"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let matches = if involved.is_empty() {
        namespace.is_empty() || namespace == "default"
    } else {
        namespace == involved
    };
    if matches {
        return Vec::new();
    }
    vec![FieldError::invalid(
        "involvedObject.namespace",
        &Value::from(involved),
        "does not match event.namespace",
    )]
}

/// validateNodeTaints' effects (the path as v1.19 names it).
fn taint_errors(spec: &Value) -> Vec<FieldError> {
    const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
    let taints = spec["taints"].as_array().cloned().unwrap_or_default();
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, taint) in taints.iter().enumerate() {
        let at = format!("metadata.taints[{i}]");
        let key = taint["key"].as_str().unwrap_or_default();
        errors.extend(
            qualified_name_errors(key)
                .into_iter()
                .map(|why| FieldError::invalid(format!("{at}.key"), &Value::from(key), &why)),
        );
        let effect = &taint["effect"];
        errors.extend(match effect.as_str() {
            None | Some("") => Some(FieldError::required(format!("{at}.effect"))),
            Some(_) => one_of(&format!("{at}.effect"), effect, &EFFECTS),
        });
        let effect = effect.as_str().unwrap_or_default();
        if !seen.insert((key, effect)) {
            // Go prints the taint with %#v.
            let added = taint["timeAdded"].as_str().unwrap_or("<nil>");
            let value = taint["value"].as_str().unwrap_or_default();
            errors.push(FieldError {
                field: at,
                reason: "FieldValueDuplicate",
                detail: format!(
                    "Duplicate value: core.Taint{{Key:{key:?}, Value:{value:?}, Effect:{effect:?}, TimeAdded:{added}}}: taints must be unique by key and effect pair"
                ),
            });
        }
    }
    errors
}

/// ValidateVolumeAttachmentSpec: the attacher a CSI driver name, exactly one source, and the
/// node a DNS subdomain.
fn attachment_spec_errors(spec: &Value) -> Vec<FieldError> {
    let mut errors = csi_driver_errors(
        "spec.attacher",
        spec["attacher"].as_str().unwrap_or_default(),
    );
    let source = &spec["source"];
    let named = source["persistentVolumeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let inline = source["inlineVolumeSpec"].is_object();
    if named == inline {
        errors.push(FieldError::required_because(
            "spec.source",
            "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
        ));
    }
    let node = spec["nodeName"].as_str().unwrap_or_default();
    errors.extend(subdomain_errors("spec.nodeName", node, node));
    errors
}

/// ValidateStorageClass: a provisioner, and the reclaim policy and binding mode it supports.
fn class_errors(class: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if class["provisioner"].as_str().is_none_or(str::is_empty) {
        errors.push(FieldError::required("provisioner"));
    }
    errors.extend(one_of(
        "reclaimPolicy",
        &class["reclaimPolicy"],
        &["Delete", "Retain"],
    ));
    errors.extend(one_of(
        "volumeBindingMode",
        &class["volumeBindingMode"],
        &["Immediate", "WaitForFirstConsumer"],
    ));
    errors
}

/// ValidateCSINodeSpec: each driver named once, with a node ID.
fn csi_node_errors(spec: &Value) -> Vec<FieldError> {
    let drivers = spec["drivers"].as_array().cloned().unwrap_or_default();
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, driver) in drivers.iter().enumerate() {
        let name = driver["name"].as_str().unwrap_or_default();
        errors.extend(csi_driver_errors(&format!("spec.drivers[{i}].name"), name));
        if !seen.insert(name) {
            errors.push(FieldError {
                field: format!("spec.drivers[{i}].name"),
                reason: "FieldValueDuplicate",
                detail: format!("Duplicate value: {name:?}"),
            });
        }
        if driver["nodeID"].as_str().is_none_or(str::is_empty) {
            errors.push(FieldError::required(format!("spec.drivers[{i}].nodeID")));
        }
    }
    errors
}

/// ValidateLeaseSpec: durations and transitions, when given, positive (transitions: not
/// negative).
fn lease_errors(spec: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let duration = &spec["leaseDurationSeconds"];
    if duration.as_i64().is_some_and(|d| d <= 0) {
        errors.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            duration,
            "must be greater than 0",
        ));
    }
    let transitions = &spec["leaseTransitions"];
    if transitions.as_i64().is_some_and(|t| t < 0) {
        errors.push(FieldError::invalid(
            "spec.leaseTransitions",
            transitions,
            "must be greater than or equal to 0",
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(phase: &str, request: &str, capacity: Option<&str>, volume: &str) -> Value {
        json!({"metadata": {"name": "c"},
            "spec": {"storageClassName": "fast", "volumeName": volume,
                "resources": {"requests": {"storage": request}}},
            "status": {"phase": phase, "capacity": capacity.map(|c| json!({"storage": c}))}})
    }

    /// What a claim update may change (the phase and capacity are the current claim's).
    #[test]
    fn claim_updates() {
        let bound = |request| claim("Bound", request, Some("1Gi"), "pv");
        let cases = [
            ("a Bound claim grows", bound("1Gi"), bound("2Gi"), vec![]),
            (
                "lowered above its capacity, to recover from a failed expansion",
                bound("2Pi"),
                bound("2Gi"),
                vec![],
            ),
            (
                "lowered to its capacity",
                bound("2Gi"),
                bound("1Gi"),
                vec![
                    "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity",
                ],
            ),
            (
                "a Pending claim's request",
                claim("Pending", "1Gi", None, ""),
                claim("Pending", "2Gi", None, ""),
                vec![
                    "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ],
            ),
            (
                "the same request written another way",
                claim("Pending", "1Gi", None, ""),
                claim("Pending", "1073741824", None, ""),
                vec![],
            ),
            (
                "the volume name, set once",
                claim("Pending", "1Gi", None, ""),
                claim("Pending", "1Gi", None, "pv"),
                vec![],
            ),
            (
                "the volume name, changed",
                claim("Pending", "1Gi", None, "pv"),
                claim("Pending", "1Gi", None, "other"),
                vec![
                    "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ],
            ),
        ];
        for (case, current, next, want) in cases {
            let got: Vec<String> = claim_update_errors(&current, &next)
                .iter()
                .map(|e| format!("{}: {}", e.field, e.detail))
                .collect();
            assert_eq!(got, want, "{case}");
        }
    }
}

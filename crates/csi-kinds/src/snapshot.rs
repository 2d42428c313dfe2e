//! snapshot.storage.k8s.io/v1: VolumeSnapshot, VolumeSnapshotContent and VolumeSnapshotClass,
//! with upstream's field names, the finalizers and annotations both controllers share, and the
//! CustomResourceDefinitions generated from these types ([`crds`]; `manifests/crds/` holds them
//! as YAML, written by the `snapshot-crds` binary and checked fresh by a test).
//!
//! The schemas keep upstream's structure (types, required fields, enums, the int-or-string
//! `restoreSize`) and its CEL rules (`x-kubernetes-validations`: immutable sources, exactly one
//! source, sources required once set, a content's `volumeSnapshotRef` name and namespace, an
//! immutable `sourceVolumeMode`), word for word. Servers from 1.25 enforce them; older ones
//! drop the field from the CRD (kubectl's and helm's client-side validation refuse it there, so
//! the chart renders the rules only for 1.25 and later), and the snapshot-controller checks the
//! same rules itself, as upstream's does for clusters without its validating webhook.

use std::collections::BTreeMap;

use crate::crd::{ObjectReference, TopLevelKind, TypeOf, top_level_crd};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube_core::CustomResourceExt;
use kube_derive::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "snapshot.storage.k8s.io";
/// The `api-approved.kubernetes.io` annotation of upstream's CRDs (a protected `*.k8s.io`
/// group needs one, or the API server refuses the CRD).
pub const API_APPROVAL: &str = "https://github.com/kubernetes-csi/external-snapshotter/pull/814";

/// On a VolumeSnapshotContent bound to a VolumeSnapshot, until the sidecar has deleted the
/// snapshot on the storage (or the policy retains it).
pub const CONTENT_BOUND_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// On a VolumeSnapshot bound to a content with policy Delete, until that content is gone.
pub const SNAPSHOT_BOUND_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
/// On every VolumeSnapshot, so it is not deleted while a claim is being restored from it.
pub const SNAPSHOT_AS_SOURCE_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// On a claim while a snapshot of it is being cut.
pub const PVC_AS_SOURCE_FINALIZER: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";

/// On a VolumeSnapshotClass: the default class for its driver.
pub const IS_DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// Set by the snapshot-controller on a content whose VolumeSnapshot is being deleted.
pub const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// Set by the sidecar while CreateSnapshot may still be cutting the snapshot, so a content
/// deleted meanwhile waits instead of leaking it.
pub const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// The secret DeleteSnapshot (and CreateSnapshot) use, resolved when the content was made.
pub const DELETION_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
pub const DELETION_SECRET_NAMESPACE: &str =
    "snapshot.storage.kubernetes.io/deletion-secret-namespace";
/// On a content that is a member of a group snapshot (the group API is not served here).
pub const GROUP_SNAPSHOT_HANDLE: &str = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle";

/// What happens to the snapshot on the storage when its content is deleted.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum DeletionPolicy {
    #[default]
    Delete,
    Retain,
}

fn date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "format": "date-time", "nullable": true})
}

/// A resource.Quantity: an integer or a string, as upstream's `restoreSize`.
fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
        "x-kubernetes-int-or-string": true,
        "nullable": true
    })
}

/// A user's request for a snapshot of a claim, or to use an existing snapshot.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "snapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeSnapshot",
    namespaced,
    status = "VolumeSnapshotStatus",
    shortname = "vs",
    derive = "PartialEq",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-csi/external-snapshotter/pull/814"
    ),
    printcolumn = r#"{"name":"ReadyToUse","type":"boolean","jsonPath":".status.readyToUse"}"#,
    printcolumn = r#"{"name":"SourcePVC","type":"string","jsonPath":".spec.source.persistentVolumeClaimName"}"#,
    printcolumn = r#"{"name":"SourceSnapshotContent","type":"string","jsonPath":".spec.source.volumeSnapshotContentName"}"#,
    printcolumn = r#"{"name":"RestoreSize","type":"string","jsonPath":".status.restoreSize"}"#,
    printcolumn = r#"{"name":"SnapshotClass","type":"string","jsonPath":".spec.volumeSnapshotClassName"}"#,
    printcolumn = r#"{"name":"SnapshotContent","type":"string","jsonPath":".status.boundVolumeSnapshotContentName"}"#,
    printcolumn = r#"{"name":"CreationTime","type":"date","jsonPath":".status.creationTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    pub source: VolumeSnapshotSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "size(self) > 0", "message": "volumeSnapshotClassName must not be the empty string when set"}
    ]))]
    pub volume_snapshot_class_name: Option<String>,
}

/// Exactly one: a claim to snapshot (dynamic), or an existing content (pre-provisioned).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(oldSelf.persistentVolumeClaimName) || has(self.persistentVolumeClaimName)", "message": "persistentVolumeClaimName is required once set"},
    {"rule": "!has(oldSelf.volumeSnapshotContentName) || has(self.volumeSnapshotContentName)", "message": "volumeSnapshotContentName is required once set"},
    {"rule": "(has(self.volumeSnapshotContentName) && !has(self.persistentVolumeClaimName)) || (!has(self.volumeSnapshotContentName) && has(self.persistentVolumeClaimName))", "message": "exactly one of volumeSnapshotContentName and persistentVolumeClaimName must be set"}
]))]
pub struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "persistentVolumeClaimName is immutable"}
    ]))]
    pub persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "volumeSnapshotContentName is immutable"}
    ]))]
    pub volume_snapshot_content_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub creation_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "quantity")]
    pub restore_size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_name: Option<String>,
}

/// The last error of cutting or binding a snapshot.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct SnapshotError {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A snapshot on the storage, cluster-wide, bound to one VolumeSnapshot.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "snapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeSnapshotContent",
    status = "VolumeSnapshotContentStatus",
    shortname = "vsc",
    derive = "PartialEq",
    shortname = "vscs",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-csi/external-snapshotter/pull/814"
    ),
    printcolumn = r#"{"name":"ReadyToUse","type":"boolean","jsonPath":".status.readyToUse"}"#,
    printcolumn = r#"{"name":"RestoreSize","type":"integer","jsonPath":".status.restoreSize"}"#,
    printcolumn = r#"{"name":"DeletionPolicy","type":"string","jsonPath":".spec.deletionPolicy"}"#,
    printcolumn = r#"{"name":"Driver","type":"string","jsonPath":".spec.driver"}"#,
    printcolumn = r#"{"name":"VolumeSnapshotClass","type":"string","jsonPath":".spec.volumeSnapshotClassName"}"#,
    printcolumn = r#"{"name":"VolumeSnapshot","type":"string","jsonPath":".spec.volumeSnapshotRef.name"}"#,
    printcolumn = r#"{"name":"VolumeSnapshotNamespace","type":"string","jsonPath":".spec.volumeSnapshotRef.namespace"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(oldSelf.sourceVolumeMode) || has(self.sourceVolumeMode)", "message": "sourceVolumeMode is required once set"}
]))]
pub struct VolumeSnapshotContentSpec {
    /// The VolumeSnapshot a content is bound to (an ObjectReference, as upstream).
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "has(self.name) && has(self.__namespace__)", "message": "both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace must be set"}
    ]))]
    pub volume_snapshot_ref: SnapshotReference,
    pub deletion_policy: DeletionPolicy,
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    pub source: VolumeSnapshotContentSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "sourceVolumeMode is immutable"}
    ]))]
    pub source_volume_mode: Option<String>,
}

/// An ObjectReference, as upstream's.
pub type SnapshotReference = ObjectReference;

/// Exactly one: the volume to cut a snapshot of (dynamic), or the snapshot that exists.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(oldSelf.volumeHandle) || has(self.volumeHandle)", "message": "volumeHandle is required once set"},
    {"rule": "!has(oldSelf.snapshotHandle) || has(self.snapshotHandle)", "message": "snapshotHandle is required once set"},
    {"rule": "(has(self.volumeHandle) && !has(self.snapshotHandle)) || (!has(self.volumeHandle) && has(self.snapshotHandle))", "message": "exactly one of volumeHandle and snapshotHandle must be set"}
]))]
pub struct VolumeSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "volumeHandle is immutable"}
    ]))]
    pub volume_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "snapshotHandle is immutable"}
    ]))]
    pub snapshot_handle: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    /// Nanoseconds since the Unix epoch, as upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes (upstream's schema also says `minimum: 0`, which a float in the CRD type would
    /// render as `0.0`; the sidecar never writes a negative size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_handle: Option<String>,
}

/// How snapshots of one driver are cut: top-level fields, no spec (as StorageClass).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    #[serde(flatten)]
    #[schemars(skip)]
    pub types: TypeOf<VolumeSnapshotClass>,
    #[schemars(skip)]
    pub metadata: ObjectMeta,
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    pub deletion_policy: DeletionPolicy,
}

crate::crd::top_level_resource!(
    VolumeSnapshotClass,
    GROUP,
    "v1",
    "snapshot.storage.k8s.io/v1",
    "volumesnapshotclasses"
);

impl VolumeSnapshotClass {
    /// The class's parameters (none is an empty map).
    pub fn parameters(&self) -> BTreeMap<String, String> {
        self.parameters.clone().unwrap_or_default()
    }

    pub fn is_default(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(IS_DEFAULT_CLASS))
            .is_some_and(|v| v == "true")
    }

    /// Its CustomResourceDefinition, built like kube's derive builds the other two.
    pub fn crd() -> CustomResourceDefinition {
        top_level_crd::<Self>(TopLevelKind {
            group: GROUP,
            version: "v1",
            kind: "VolumeSnapshotClass",
            plural: "volumesnapshotclasses",
            short_names: &["vsclass", "vsclasses"],
            scope: "Cluster",
            approval: API_APPROVAL,
            printer_columns: serde_json::from_value(serde_json::json!([
                {"name": "Driver", "type": "string", "jsonPath": ".driver"},
                {"name": "DeletionPolicy", "type": "string", "jsonPath": ".deletionPolicy",
                 "description": "Determines whether a VolumeSnapshotContent created through the VolumeSnapshotClass should be deleted when its bound VolumeSnapshot is deleted."},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
            ]))
            .expect("printer columns"),
        })
    }
}

/// The three CRDs, in the order they are installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        VolumeSnapshotClass::crd(),
        VolumeSnapshotContent::crd(),
        VolumeSnapshot::crd(),
    ]
}

/// The command that writes `manifests/crds/` (named in each file's header).
pub const CRDS_COMMAND: &str = "cargo run -p csi-snapshotter --bin snapshot-crds";

/// A merge patch of `status` from `old` to `new`: `new`'s fields, and `null` for each field
/// `old` had that `new` drops (a merge patch removes a field only when told so).
pub fn status_merge_patch<T: Serialize>(old: Option<&T>, new: &T) -> serde_json::Value {
    let mut status = serde_json::to_value(new).unwrap_or_default();
    if let (Some(old), Some(fields)) = (
        old.and_then(|o| serde_json::to_value(o).ok()),
        status.as_object_mut(),
    ) && let Some(old) = old.as_object()
    {
        for key in old.keys() {
            fields.entry(key.clone()).or_insert(serde_json::Value::Null);
        }
    }
    serde_json::json!({ "status": status })
}

/// `namespace/name`, as upstream names snapshots in messages.
pub fn snapshot_key(snapshot: &VolumeSnapshot) -> String {
    format!(
        "{}/{}",
        snapshot.metadata.namespace.as_deref().unwrap_or_default(),
        snapshot.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed YAML (and the chart's copy) is what the types generate (`make crds`
    /// rewrites both).
    #[test]
    fn committed_crds_are_current() {
        crate::crd::assert_committed("charts/csi-suite/files/crds", &crds(), CRDS_COMMAND);
    }

    /// Upstream's CEL rules (external-snapshotter v8.6.0, client/config/crd, in `v1`, the one
    /// version served): (plural, node, rule, message). VolumeSnapshotClass has none.
    const UPSTREAM_RULES: [(&str, &str, &str, &str); 14] = [
        (
            "volumesnapshots",
            ".spec.source",
            "!has(oldSelf.persistentVolumeClaimName) || has(self.persistentVolumeClaimName)",
            "persistentVolumeClaimName is required once set",
        ),
        (
            "volumesnapshots",
            ".spec.source",
            "!has(oldSelf.volumeSnapshotContentName) || has(self.volumeSnapshotContentName)",
            "volumeSnapshotContentName is required once set",
        ),
        (
            "volumesnapshots",
            ".spec.source",
            "(has(self.volumeSnapshotContentName) && !has(self.persistentVolumeClaimName)) || (!has(self.volumeSnapshotContentName) && has(self.persistentVolumeClaimName))",
            "exactly one of volumeSnapshotContentName and persistentVolumeClaimName must be set",
        ),
        (
            "volumesnapshots",
            ".spec.source.persistentVolumeClaimName",
            "self == oldSelf",
            "persistentVolumeClaimName is immutable",
        ),
        (
            "volumesnapshots",
            ".spec.source.volumeSnapshotContentName",
            "self == oldSelf",
            "volumeSnapshotContentName is immutable",
        ),
        (
            "volumesnapshots",
            ".spec.volumeSnapshotClassName",
            "size(self) > 0",
            "volumeSnapshotClassName must not be the empty string when set",
        ),
        (
            "volumesnapshotcontents",
            ".spec",
            "!has(oldSelf.sourceVolumeMode) || has(self.sourceVolumeMode)",
            "sourceVolumeMode is required once set",
        ),
        (
            "volumesnapshotcontents",
            ".spec.source",
            "!has(oldSelf.volumeHandle) || has(self.volumeHandle)",
            "volumeHandle is required once set",
        ),
        (
            "volumesnapshotcontents",
            ".spec.source",
            "!has(oldSelf.snapshotHandle) || has(self.snapshotHandle)",
            "snapshotHandle is required once set",
        ),
        (
            "volumesnapshotcontents",
            ".spec.source",
            "(has(self.volumeHandle) && !has(self.snapshotHandle)) || (!has(self.volumeHandle) && has(self.snapshotHandle))",
            "exactly one of volumeHandle and snapshotHandle must be set",
        ),
        (
            "volumesnapshotcontents",
            ".spec.source.snapshotHandle",
            "self == oldSelf",
            "snapshotHandle is immutable",
        ),
        (
            "volumesnapshotcontents",
            ".spec.source.volumeHandle",
            "self == oldSelf",
            "volumeHandle is immutable",
        ),
        (
            "volumesnapshotcontents",
            ".spec.sourceVolumeMode",
            "self == oldSelf",
            "sourceVolumeMode is immutable",
        ),
        (
            "volumesnapshotcontents",
            ".spec.volumeSnapshotRef",
            "has(self.name) && has(self.__namespace__)",
            "both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace must be set",
        ),
    ];

    #[test]
    fn crds_carry_upstreams_cel_rules() {
        crate::crd::assert_rules(&crds(), |plural, _| {
            UPSTREAM_RULES
                .iter()
                .filter(|(of, ..)| *of == plural)
                .map(|(_, node, rule, message)| (*node, *rule, *message))
                .collect()
        });
    }

    #[test]
    fn crds_carry_upstream_names_scopes_and_approval() {
        let crds = crds();
        let names: Vec<_> = crds
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap(),
                    c.spec.scope.clone(),
                    c.metadata.annotations.clone().unwrap()["api-approved.kubernetes.io"].clone(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (
                    "volumesnapshotclasses.snapshot.storage.k8s.io".to_string(),
                    "Cluster".to_string(),
                    API_APPROVAL.to_string()
                ),
                (
                    "volumesnapshotcontents.snapshot.storage.k8s.io".to_string(),
                    "Cluster".to_string(),
                    API_APPROVAL.to_string()
                ),
                (
                    "volumesnapshots.snapshot.storage.k8s.io".to_string(),
                    "Namespaced".to_string(),
                    API_APPROVAL.to_string()
                ),
            ]
        );
        let content = serde_json::to_value(&crds[1]).unwrap();
        let spec =
            &content["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(
            spec["properties"]["deletionPolicy"]["enum"],
            serde_json::json!(["Delete", "Retain"])
        );
        let mut required: Vec<_> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        required.sort();
        assert_eq!(
            required,
            ["deletionPolicy", "driver", "source", "volumeSnapshotRef"]
        );
        let class = serde_json::to_value(&crds[0]).unwrap();
        let properties = &class["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert_eq!(
            properties["parameters"]["additionalProperties"]["type"],
            "string"
        );
        assert!(properties["metadata"].is_object());
    }

    #[test]
    fn status_patches_null_what_is_gone() {
        let old = VolumeSnapshotContentStatus {
            ready_to_use: Some(false),
            error: Some(SnapshotError::default()),
            ..VolumeSnapshotContentStatus::default()
        };
        let new = VolumeSnapshotContentStatus {
            ready_to_use: Some(true),
            ..VolumeSnapshotContentStatus::default()
        };
        assert_eq!(
            status_merge_patch(Some(&old), &new),
            serde_json::json!({"status": {"readyToUse": true, "error": null}})
        );
        assert_eq!(
            status_merge_patch(None, &new),
            serde_json::json!({"status": {"readyToUse": true}})
        );
    }

    #[test]
    fn a_class_round_trips_with_its_type() {
        let class: VolumeSnapshotClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": "c", "annotations": {IS_DEFAULT_CLASS: "true"}},
            "driver": "d", "deletionPolicy": "Retain", "parameters": {"a": "b"}}))
        .unwrap();
        assert!(class.is_default());
        assert_eq!(class.deletion_policy, DeletionPolicy::Retain);
        let back = serde_json::to_value(&class).unwrap();
        assert_eq!(back["kind"], "VolumeSnapshotClass");
        assert_eq!(back["parameters"]["a"], "b");
    }
}

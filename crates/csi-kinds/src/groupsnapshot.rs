//! groupsnapshot.storage.k8s.io: VolumeGroupSnapshot, VolumeGroupSnapshotContent and
//! VolumeGroupSnapshotClass (external-snapshotter v8.6), with upstream's field names, the
//! finalizers and annotations both controllers share, and the CRDs generated from these types
//! ([`crds`]), with upstream's CEL rules (`x-kubernetes-validations`): servers from 1.25 enforce
//! them, older ones drop the field and the snapshot-controller checks the same rules itself.
//!
//! ## Versions
//! Every CRD serves `v1`, `v1beta2` and `v1beta1` (deprecated) with conversion `None`, and
//! stores `v1beta2`, as upstream v8.6.0: `v1` and `v1beta2` are the same schema, and storing
//! `v1beta2` keeps a downgrade to upstream v8.4/v8.5 CRDs (which lack `v1`) possible, since a CRD
//! update must keep every stored version. Upstream's `v1beta1` differs in one field: a content's
//! members are `status.volumeSnapshotHandlePairList` (volume and snapshot handles) there and
//! `status.volumeSnapshotInfoList` (plus creation time, readiness, size) in the others; with
//! conversion None the API server prunes whichever list the version read lacks, and upstream's
//! conversion webhook, the other way out, cannot convert `v1` at all (external-snapshotter
//! #1450). Here every version's schema has both lists, and the csi-snapshotter writes both: a
//! client of any version reads what it expects, and nothing written through one version is
//! pruned when read through another. The versions differ only in the CEL rules upstream's
//! `v1beta1` lacks, and in its `deprecated` flag.

use std::collections::BTreeMap;

use crate::crd::{ObjectReference, TopLevelKind, TypeOf, top_level_crd};
use crate::snapshot::{DeletionPolicy, SnapshotError};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use kube_core::CustomResourceExt;
use kube_derive::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "groupsnapshot.storage.k8s.io";
/// The `api-approved.kubernetes.io` annotation of upstream's group CRDs.
pub const API_APPROVAL: &str = "https://github.com/kubernetes-csi/external-snapshotter/pull/1337";
/// The version the controllers read and write.
pub const VERSION: &str = "v1";
/// The version the CRDs store (see the module docs).
pub const STORAGE_VERSION: &str = "v1beta2";
/// Every served version, newest first.
pub const SERVED_VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1beta1"];

/// On a VolumeGroupSnapshot bound to its content, until the content is gone (or retained).
pub const GROUP_SNAPSHOT_BOUND_FINALIZER: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-bound-protection";
/// On a VolumeGroupSnapshotContent bound to a group, until the sidecar has deleted the group
/// snapshot on the storage (or the policy retains it).
pub const GROUP_CONTENT_BOUND_FINALIZER: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshotcontent-bound-protection";
/// On a member VolumeSnapshot of a group: it goes with its group, not on its own.
pub const IN_GROUP_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-in-group-protection";
/// On a VolumeGroupSnapshotClass: the default class for its driver.
pub const IS_DEFAULT_CLASS: &str = "groupsnapshot.storage.kubernetes.io/is-default-class";
/// Set by the sidecar while CreateVolumeGroupSnapshot may still be cutting the group.
pub const BEING_CREATED: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-created";
/// Set by the snapshot-controller on a content whose group is being deleted.
pub const BEING_DELETED: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-deleted";
/// The secret the group RPCs use, resolved when the content was made.
pub const DELETION_SECRET_NAME: &str = "groupsnapshot.storage.kubernetes.io/deletion-secret-name";
pub const DELETION_SECRET_NAMESPACE: &str =
    "groupsnapshot.storage.kubernetes.io/deletion-secret-namespace";

fn date_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "format": "date-time", "nullable": true})
}

/// A metav1.LabelSelector, atomic, as upstream's schema has it.
fn label_selector(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "matchExpressions": {
                "type": "array",
                "x-kubernetes-list-type": "atomic",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string"},
                        "operator": {"type": "string"},
                        "values": {
                            "type": "array",
                            "x-kubernetes-list-type": "atomic",
                            "items": {"type": "string"}
                        }
                    }
                }
            },
            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
        },
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "selector is immutable"}
        ]
    })
}

/// A request to snapshot a group of claims together, or to use a group snapshot that exists.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "groupsnapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeGroupSnapshot",
    namespaced,
    status = "VolumeGroupSnapshotStatus",
    shortname = "vgs",
    derive = "PartialEq",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-csi/external-snapshotter/pull/1337"
    ),
    printcolumn = r#"{"name":"ReadyToUse","type":"boolean","jsonPath":".status.readyToUse","description":"Indicates if all the individual snapshots in the group are ready to be used to restore a group of volumes."}"#,
    printcolumn = r#"{"name":"VolumeGroupSnapshotClass","type":"string","jsonPath":".spec.volumeGroupSnapshotClassName","description":"The name of the VolumeGroupSnapshotClass requested by the VolumeGroupSnapshot."}"#,
    printcolumn = r#"{"name":"VolumeGroupSnapshotContent","type":"string","jsonPath":".status.boundVolumeGroupSnapshotContentName","description":"Name of the VolumeGroupSnapshotContent object to which the VolumeGroupSnapshot object intends to bind to. Please note that verification of binding actually requires checking both VolumeGroupSnapshot and VolumeGroupSnapshotContent to ensure both are pointing at each other. Binding MUST be verified prior to usage of this object."}"#,
    printcolumn = r#"{"name":"CreationTime","type":"date","jsonPath":".status.creationTime","description":"Timestamp when the point-in-time group snapshot was taken by the underlying storage system."}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotSpec {
    pub source: VolumeGroupSnapshotSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "size(self) > 0", "message": "volumeGroupSnapshotClassName must not be the empty string when set"}
    ]))]
    pub volume_group_snapshot_class_name: Option<String>,
}

/// Exactly one: a label selector over the group's claims (dynamic), or the name of a content
/// that exists (pre-provisioned).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(oldSelf.selector) || has(self.selector)", "message": "selector is required once set"},
    {"rule": "!has(oldSelf.volumeGroupSnapshotContentName) || has(self.volumeGroupSnapshotContentName)", "message": "volumeGroupSnapshotContentName is required once set"},
    {"rule": "(has(self.selector) && !has(self.volumeGroupSnapshotContentName)) || (!has(self.selector) && has(self.volumeGroupSnapshotContentName))", "message": "exactly one of selector and volumeGroupSnapshotContentName must be set"}
]))]
pub struct VolumeGroupSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "volumeGroupSnapshotContentName is immutable"}
    ]))]
    pub volume_group_snapshot_content_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "boundVolumeGroupSnapshotContentName is immutable once set"}
    ]))]
    pub bound_volume_group_snapshot_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub creation_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
}

/// A group snapshot on the storage, cluster-wide, bound to one VolumeGroupSnapshot.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "groupsnapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeGroupSnapshotContent",
    status = "VolumeGroupSnapshotContentStatus",
    shortname = "vgsc",
    shortname = "vgscs",
    derive = "PartialEq",
    annotation(
        "api-approved.kubernetes.io",
        "https://github.com/kubernetes-csi/external-snapshotter/pull/1337"
    ),
    printcolumn = r#"{"name":"ReadyToUse","type":"boolean","jsonPath":".status.readyToUse","description":"Indicates if all the individual snapshots in the group are ready to be used to restore a group of volumes."}"#,
    printcolumn = r#"{"name":"DeletionPolicy","type":"string","jsonPath":".spec.deletionPolicy","description":"Determines whether this VolumeGroupSnapshotContent and its physical group snapshot on the underlying storage system should be deleted when its bound VolumeGroupSnapshot is deleted."}"#,
    printcolumn = r#"{"name":"Driver","type":"string","jsonPath":".spec.driver","description":"Name of the CSI driver used to create the physical group snapshot on the underlying storage system."}"#,
    printcolumn = r#"{"name":"VolumeGroupSnapshotClass","type":"string","jsonPath":".spec.volumeGroupSnapshotClassName","description":"Name of the VolumeGroupSnapshotClass from which this group snapshot was (or will be) created."}"#,
    printcolumn = r#"{"name":"VolumeGroupSnapshotNamespace","type":"string","jsonPath":".spec.volumeGroupSnapshotRef.namespace","description":"Namespace of the VolumeGroupSnapshot object to which this VolumeGroupSnapshotContent object is bound."}"#,
    printcolumn = r#"{"name":"VolumeGroupSnapshot","type":"string","jsonPath":".spec.volumeGroupSnapshotRef.name","description":"Name of the VolumeGroupSnapshot object to which this VolumeGroupSnapshotContent object is bound."}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotContentSpec {
    /// The VolumeGroupSnapshot the content is bound to.
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "has(self.name) && has(self.__namespace__)", "message": "both volumeGroupSnapshotRef.name and volumeGroupSnapshotRef.namespace must be set"},
        {"rule": "self.name == oldSelf.name && self.__namespace__ == oldSelf.__namespace__", "message": "volumeGroupSnapshotRef.name and volumeGroupSnapshotRef.namespace are immutable"},
        {"rule": "!has(oldSelf.uid) || (has(self.uid) && self.uid == oldSelf.uid)", "message": "volumeGroupSnapshotRef.uid is immutable once set"}
    ]))]
    pub volume_group_snapshot_ref: ObjectReference,
    pub deletion_policy: DeletionPolicy,
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "driver is immutable once set"}
    ]))]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "volumeGroupSnapshotClassName is immutable once set"}
    ]))]
    pub volume_group_snapshot_class_name: Option<String>,
    pub source: VolumeGroupSnapshotContentSource,
}

/// Exactly one: the volumes to snapshot together (dynamic), or the group snapshot that exists.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(oldSelf.volumeHandles) || has(self.volumeHandles)", "message": "volumeHandles is required once set"},
    {"rule": "!has(oldSelf.groupSnapshotHandles) || has(self.groupSnapshotHandles)", "message": "groupSnapshotHandles is required once set"},
    {"rule": "(has(self.volumeHandles) && !has(self.groupSnapshotHandles)) || (!has(self.volumeHandles) && has(self.groupSnapshotHandles))", "message": "exactly one of volumeHandles and groupSnapshotHandles must be set"}
]))]
pub struct VolumeGroupSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "volumeHandles is immutable"}
    ]))]
    pub volume_handles: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "groupSnapshotHandles is immutable"}
    ]))]
    pub group_snapshot_handles: Option<GroupSnapshotHandles>,
}

/// A pre-provisioned group snapshot: its CSI group snapshot ID and its members' snapshot IDs.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GroupSnapshotHandles {
    pub volume_group_snapshot_handle: String,
    pub volume_snapshot_handles: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotContentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "volumeGroupSnapshotHandle is immutable once set"}
    ]))]
    pub volume_group_snapshot_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time")]
    pub creation_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    /// The members (v1beta2 and v1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_info_list: Option<Vec<VolumeSnapshotInfo>>,
    /// The members as v1beta1 has them (see the module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_handle_pair_list: Option<Vec<VolumeSnapshotHandlePair>>,
}

/// One member of a group snapshot.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// Nanoseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
}

/// One member of a group snapshot, as v1beta1 lists it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotHandlePair {
    pub volume_handle: String,
    pub snapshot_handle: String,
}

impl VolumeGroupSnapshotContentStatus {
    /// The members, from whichever list a writer of any version filled: the info list, else
    /// the v1beta1 pairs.
    pub fn members(&self) -> Vec<VolumeSnapshotInfo> {
        match (
            &self.volume_snapshot_info_list,
            &self.volume_snapshot_handle_pair_list,
        ) {
            (Some(infos), _) if !infos.is_empty() => infos.clone(),
            (_, Some(pairs)) => pairs
                .iter()
                .map(|pair| VolumeSnapshotInfo {
                    volume_handle: Some(pair.volume_handle.clone()),
                    snapshot_handle: Some(pair.snapshot_handle.clone()),
                    ..VolumeSnapshotInfo::default()
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Sets the members in both lists (see the module docs); pairs only for members with both
    /// handles, as v1beta1 requires them.
    pub fn set_members(&mut self, members: Vec<VolumeSnapshotInfo>) {
        self.volume_snapshot_handle_pair_list = Some(
            members
                .iter()
                .filter_map(|m| {
                    Some(VolumeSnapshotHandlePair {
                        volume_handle: m.volume_handle.clone()?,
                        snapshot_handle: m.snapshot_handle.clone()?,
                    })
                })
                .collect(),
        );
        self.volume_snapshot_info_list = Some(members);
    }
}

/// How group snapshots of one driver are cut: top-level fields, no spec (as StorageClass).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotClass {
    #[serde(flatten)]
    #[schemars(skip)]
    pub types: TypeOf<VolumeGroupSnapshotClass>,
    #[schemars(skip)]
    pub metadata: ObjectMeta,
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "driver is immutable once set"}
    ]))]
    pub driver: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "parameters are immutable once set"}
    ]))]
    pub parameters: Option<BTreeMap<String, String>>,
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "deletionPolicy is immutable once set"}
    ]))]
    pub deletion_policy: DeletionPolicy,
}

crate::crd::top_level_resource!(
    VolumeGroupSnapshotClass,
    GROUP,
    VERSION,
    "groupsnapshot.storage.k8s.io/v1",
    "volumegroupsnapshotclasses"
);

impl VolumeGroupSnapshotClass {
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

    /// Its CustomResourceDefinition (one version; [`crds`] serves it in all three).
    fn crd() -> CustomResourceDefinition {
        top_level_crd::<Self>(TopLevelKind {
            group: GROUP,
            version: VERSION,
            kind: "VolumeGroupSnapshotClass",
            plural: "volumegroupsnapshotclasses",
            short_names: &["vgsclass", "vgsclasses"],
            scope: "Cluster",
            approval: API_APPROVAL,
            printer_columns: serde_json::from_value(serde_json::json!([
                {"name": "Driver", "type": "string", "jsonPath": ".driver"},
                {"name": "DeletionPolicy", "type": "string", "jsonPath": ".deletionPolicy",
                 "description": "Determines whether a VolumeGroupSnapshotContent created through the VolumeGroupSnapshotClass should be deleted when its bound VolumeGroupSnapshot is deleted."},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
            ]))
            .expect("printer columns"),
        })
    }
}

/// The CEL rules upstream's v1beta1 schemas lack, by message.
const RULES_NOT_IN_V1BETA1: &[&str] = &[
    "boundVolumeGroupSnapshotContentName is immutable once set",
    "driver is immutable once set",
    "volumeGroupSnapshotClassName is immutable once set",
    "volumeGroupSnapshotRef.name and volumeGroupSnapshotRef.namespace are immutable",
    "volumeGroupSnapshotRef.uid is immutable once set",
    "volumeGroupSnapshotHandle is immutable once set",
    "parameters are immutable once set",
    "deletionPolicy is immutable once set",
];

/// Removes the rules of `messages` from every `x-kubernetes-validations` in `schema`, and the
/// lists left empty.
fn without_rules(schema: &mut serde_json::Value, messages: &[&str]) {
    match schema {
        serde_json::Value::Object(object) => {
            if let Some(serde_json::Value::Array(rules)) =
                object.get_mut("x-kubernetes-validations")
            {
                rules.retain(|rule| {
                    !rule["message"]
                        .as_str()
                        .is_some_and(|message| messages.contains(&message))
                });
                if rules.is_empty() {
                    object.remove("x-kubernetes-validations");
                }
            }
            for value in object.values_mut() {
                without_rules(value, messages);
            }
        }
        serde_json::Value::Array(values) => {
            for value in values {
                without_rules(value, messages);
            }
        }
        _ => {}
    }
}

/// `crd` (one `v1` version) served as v1, v1beta1 (deprecated, without the rules it lacks
/// upstream) and v1beta2 (stored), in upstream's order.
fn in_every_version(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let v1 = crd.spec.versions.remove(0);
    let version = |name: &str, storage: bool| CustomResourceDefinitionVersion {
        name: name.to_string(),
        served: true,
        storage,
        ..v1.clone()
    };
    let mut v1beta1 = version("v1beta1", false);
    v1beta1.deprecated = Some(true);
    if let Some(schema) = v1beta1
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
    {
        let mut json = serde_json::to_value(&*schema).expect("a schema is JSON");
        without_rules(&mut json, RULES_NOT_IN_V1BETA1);
        *schema = serde_json::from_value(json).expect("still a schema");
    }
    crd.spec.versions = vec![
        version("v1", false),
        v1beta1,
        version(STORAGE_VERSION, true),
    ];
    crd
}

/// The three CRDs, in the order they are installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        in_every_version(VolumeGroupSnapshotClass::crd()),
        in_every_version(VolumeGroupSnapshotContent::crd()),
        in_every_version(VolumeGroupSnapshot::crd()),
    ]
}

fn member_hash(group_uid: &str, volume_handle: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("{group_uid}{volume_handle}")))
}

/// A member snapshot's name: `snapshot-<sha256(group UID + volume handle)>`, as upstream.
pub fn member_snapshot_name(group_uid: &str, volume_handle: &str) -> String {
    format!("snapshot-{}", member_hash(group_uid, volume_handle))
}

/// A member content's name: `snapcontent-<sha256(group UID + volume handle)>`, as upstream.
pub fn member_content_name(group_uid: &str, volume_handle: &str) -> String {
    format!("snapcontent-{}", member_hash(group_uid, volume_handle))
}

/// `namespace/name`, as upstream names groups in messages.
pub fn group_snapshot_key(group: &VolumeGroupSnapshot) -> String {
    format!(
        "{}/{}",
        group.metadata.namespace.as_deref().unwrap_or_default(),
        group.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::CRDS_COMMAND;

    /// The committed YAML (and the chart's copy) is what the types generate (`make crds`
    /// rewrites both; `snapshot-crds` writes these with the snapshot CRDs).
    #[test]
    fn committed_crds_are_current() {
        crate::crd::assert_committed("charts/csi-suite/files/crds", &crds(), CRDS_COMMAND);
    }

    fn version<'a>(crd: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
        crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()
    }

    #[test]
    fn crds_serve_three_versions_and_store_v1beta2() {
        for crd in crds() {
            let json = serde_json::to_value(&crd).unwrap();
            let versions: Vec<_> = json["spec"]["versions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap().to_string(),
                        v["served"].as_bool().unwrap(),
                        v["storage"].as_bool().unwrap(),
                        v["deprecated"].as_bool().unwrap_or(false),
                    )
                })
                .collect();
            assert_eq!(
                versions,
                vec![
                    ("v1".into(), true, false, false),
                    ("v1beta1".into(), true, false, true),
                    ("v1beta2".into(), true, true, false),
                ],
                "{}",
                crd.metadata.name.unwrap()
            );
            assert!(json["spec"]["conversion"].is_null());
            assert_eq!(
                json["metadata"]["annotations"]["api-approved.kubernetes.io"],
                API_APPROVAL
            );
            assert_eq!(
                version(&json, "v1")["schema"],
                version(&json, "v1beta2")["schema"]
            );
        }
    }

    /// Upstream's CEL rules (external-snapshotter v8.6.0, client/config/crd; the same in `v1`
    /// and `v1beta2`): (plural, node, rule, message, whether `v1beta1` has it too).
    const UPSTREAM_RULES: [(&str, &str, &str, &str, bool); 21] = [
        (
            "volumegroupsnapshotclasses",
            ".deletionPolicy",
            "self == oldSelf",
            "deletionPolicy is immutable once set",
            false,
        ),
        (
            "volumegroupsnapshotclasses",
            ".driver",
            "self == oldSelf",
            "driver is immutable once set",
            false,
        ),
        (
            "volumegroupsnapshotclasses",
            ".parameters",
            "self == oldSelf",
            "parameters are immutable once set",
            false,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.driver",
            "self == oldSelf",
            "driver is immutable once set",
            false,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.source",
            "!has(oldSelf.volumeHandles) || has(self.volumeHandles)",
            "volumeHandles is required once set",
            true,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.source",
            "!has(oldSelf.groupSnapshotHandles) || has(self.groupSnapshotHandles)",
            "groupSnapshotHandles is required once set",
            true,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.source",
            "(has(self.volumeHandles) && !has(self.groupSnapshotHandles)) || (!has(self.volumeHandles) && has(self.groupSnapshotHandles))",
            "exactly one of volumeHandles and groupSnapshotHandles must be set",
            true,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.source.groupSnapshotHandles",
            "self == oldSelf",
            "groupSnapshotHandles is immutable",
            true,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.source.volumeHandles",
            "self == oldSelf",
            "volumeHandles is immutable",
            true,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.volumeGroupSnapshotClassName",
            "self == oldSelf",
            "volumeGroupSnapshotClassName is immutable once set",
            false,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.volumeGroupSnapshotRef",
            "has(self.name) && has(self.__namespace__)",
            "both volumeGroupSnapshotRef.name and volumeGroupSnapshotRef.namespace must be set",
            true,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.volumeGroupSnapshotRef",
            "self.name == oldSelf.name && self.__namespace__ == oldSelf.__namespace__",
            "volumeGroupSnapshotRef.name and volumeGroupSnapshotRef.namespace are immutable",
            false,
        ),
        (
            "volumegroupsnapshotcontents",
            ".spec.volumeGroupSnapshotRef",
            "!has(oldSelf.uid) || (has(self.uid) && self.uid == oldSelf.uid)",
            "volumeGroupSnapshotRef.uid is immutable once set",
            false,
        ),
        (
            "volumegroupsnapshotcontents",
            ".status.volumeGroupSnapshotHandle",
            "self == oldSelf",
            "volumeGroupSnapshotHandle is immutable once set",
            false,
        ),
        (
            "volumegroupsnapshots",
            ".spec.source",
            "!has(oldSelf.selector) || has(self.selector)",
            "selector is required once set",
            true,
        ),
        (
            "volumegroupsnapshots",
            ".spec.source",
            "!has(oldSelf.volumeGroupSnapshotContentName) || has(self.volumeGroupSnapshotContentName)",
            "volumeGroupSnapshotContentName is required once set",
            true,
        ),
        (
            "volumegroupsnapshots",
            ".spec.source",
            "(has(self.selector) && !has(self.volumeGroupSnapshotContentName)) || (!has(self.selector) && has(self.volumeGroupSnapshotContentName))",
            "exactly one of selector and volumeGroupSnapshotContentName must be set",
            true,
        ),
        (
            "volumegroupsnapshots",
            ".spec.source.selector",
            "self == oldSelf",
            "selector is immutable",
            true,
        ),
        (
            "volumegroupsnapshots",
            ".spec.source.volumeGroupSnapshotContentName",
            "self == oldSelf",
            "volumeGroupSnapshotContentName is immutable",
            true,
        ),
        (
            "volumegroupsnapshots",
            ".spec.volumeGroupSnapshotClassName",
            "size(self) > 0",
            "volumeGroupSnapshotClassName must not be the empty string when set",
            true,
        ),
        (
            "volumegroupsnapshots",
            ".status.boundVolumeGroupSnapshotContentName",
            "self == oldSelf",
            "boundVolumeGroupSnapshotContentName is immutable once set",
            false,
        ),
    ];

    #[test]
    fn crds_carry_upstreams_cel_rules_in_every_version() {
        crate::crd::assert_rules(&crds(), |plural, version| {
            UPSTREAM_RULES
                .iter()
                .filter(|(of, .., in_v1beta1)| {
                    *of == plural && (*in_v1beta1 || version != "v1beta1")
                })
                .map(|(_, node, rule, message, _)| (*node, *rule, *message))
                .collect()
        });
    }

    #[test]
    fn a_content_schema_holds_both_member_lists_in_every_version() {
        let content = serde_json::to_value(&crds()[1]).unwrap();
        for name in SERVED_VERSIONS {
            let status = &version(&content, name)["schema"]["openAPIV3Schema"]["properties"]["status"]
                ["properties"];
            assert_eq!(
                status["volumeSnapshotInfoList"]["items"]["properties"]["creationTime"]["format"],
                "int64",
                "{name}"
            );
            assert_eq!(
                status["volumeSnapshotHandlePairList"]["items"]["required"],
                serde_json::json!(["snapshotHandle", "volumeHandle"]),
                "{name}"
            );
        }
        let spec = &version(&content, "v1")["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut required: Vec<_> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort();
        assert_eq!(
            required,
            [
                "deletionPolicy",
                "driver",
                "source",
                "volumeGroupSnapshotRef"
            ]
        );
    }

    #[test]
    fn members_are_read_from_either_list_and_written_to_both() {
        let member = |volume: &str, snapshot: &str| VolumeSnapshotInfo {
            volume_handle: Some(volume.into()),
            snapshot_handle: Some(snapshot.into()),
            ready_to_use: Some(true),
            ..VolumeSnapshotInfo::default()
        };
        let mut status = VolumeGroupSnapshotContentStatus::default();
        assert!(status.members().is_empty());
        status.set_members(vec![member("a", "sa"), member("b", "sb")]);
        assert_eq!(
            status.volume_snapshot_handle_pair_list.as_ref().unwrap()[1],
            VolumeSnapshotHandlePair {
                volume_handle: "b".into(),
                snapshot_handle: "sb".into()
            }
        );
        assert_eq!(status.members()[0].ready_to_use, Some(true));
        let written_by_v1beta1 = VolumeGroupSnapshotContentStatus {
            volume_snapshot_handle_pair_list: status.volume_snapshot_handle_pair_list.clone(),
            ..VolumeGroupSnapshotContentStatus::default()
        };
        assert_eq!(
            written_by_v1beta1.members(),
            vec![
                VolumeSnapshotInfo {
                    ready_to_use: None,
                    ..member("a", "sa")
                },
                VolumeSnapshotInfo {
                    ready_to_use: None,
                    ..member("b", "sb")
                }
            ]
        );
    }
}

//! Lean cached kinds: what a cache keeps of an object whose generated type is large.
//!
//! k8s-openapi's `PersistentVolume` is about 3.4 KB before any string: its spec holds every
//! in-tree volume source inline. A controller caching thousands of PVs of a CSI driver reads
//! none of those, so its cache keeps a [`CachedVolume`] (about 1.3 KB) and builds the full
//! object only for the one it works on ([`CachedVolume::to_volume`]). The maps of a PV's
//! and a claim's annotations, spec and status (capacity, requests, CSI volume attributes) are
//! kept as [`Pairs`]: a `BTreeMap` allocates a whole node of about 540 bytes for string keys
//! and values even for the few entries these maps hold, so a [`CachedClaim`] saves three such
//! nodes per claim, a [`CachedVolume`] three per PV. The annotations are read through the
//! cached type's own `annotations()`: its `metadata.annotations` is always `None`.
//!
//! k8s-openapi's `VolumeAttachment` is about 3.6 KB for the same reason: its source holds an
//! inline `PersistentVolumeSpec`, which only the VolumeAttachment of an in-tree inline volume
//! migrated to CSI has. A [`CachedAttachment`] boxes it: about 0.9 KB. The attacher reads
//! and patches VolumeAttachments and PVs in their cached forms only (`Api<CachedAttachment>`,
//! `Api<CachedVolume>`), so none of its syncs holds a full object.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ModifyVolumeStatus, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec, PersistentVolumeStatus, SecretReference,
    TypedLocalObjectReference, TypedObjectReference, VolumeNodeAffinity,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::VolumeError;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use serde::{Deserialize, Deserializer};

use crate::annotations::LAST_APPLIED;

/// A PersistentVolume without the in-tree volume sources: its metadata, its status and every
/// other field of its spec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedVolume {
    /// Without its annotations (always `None` here): they are in `annotations`.
    pub metadata: ObjectMeta,
    pub annotations: Option<Pairs<String>>,
    pub spec: Option<CachedVolumeSpec>,
    pub status: Option<PersistentVolumeStatus>,
}

deserialize_from_wire!(CachedVolume);

crate::fixed_resource!(
    CachedVolume,
    k8s_openapi::ClusterResourceScope,
    "",
    "v1",
    "PersistentVolume",
    "persistentvolumes"
);

/// The fields of `PersistentVolumeSpec` a CSI controller reads: all but the in-tree sources.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedVolumeSpec {
    pub access_modes: Option<Vec<String>>,
    pub capacity: Option<Pairs<Quantity>>,
    pub claim_ref: Option<ObjectReference>,
    pub csi: Option<CachedCsiSource>,
    pub mount_options: Option<Vec<String>>,
    pub node_affinity: Option<VolumeNodeAffinity>,
    pub persistent_volume_reclaim_policy: Option<String>,
    pub storage_class_name: Option<String>,
    pub volume_attributes_class_name: Option<String>,
    pub volume_mode: Option<String>,
}

/// `CSIPersistentVolumeSource` with its volume attributes as [`Pairs`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedCsiSource {
    pub controller_expand_secret_ref: Option<SecretReference>,
    pub controller_publish_secret_ref: Option<SecretReference>,
    pub driver: String,
    pub fs_type: Option<String>,
    pub node_expand_secret_ref: Option<SecretReference>,
    pub node_publish_secret_ref: Option<SecretReference>,
    pub node_stage_secret_ref: Option<SecretReference>,
    pub read_only: Option<bool>,
    pub volume_attributes: Option<Pairs<String>>,
    pub volume_handle: String,
}

impl CachedCsiSource {
    /// The `CSIPersistentVolumeSource` this was cached from.
    pub fn to_source(&self) -> CSIPersistentVolumeSource {
        CSIPersistentVolumeSource {
            controller_expand_secret_ref: self.controller_expand_secret_ref.clone(),
            controller_publish_secret_ref: self.controller_publish_secret_ref.clone(),
            driver: self.driver.clone(),
            fs_type: self.fs_type.clone(),
            node_expand_secret_ref: self.node_expand_secret_ref.clone(),
            node_publish_secret_ref: self.node_publish_secret_ref.clone(),
            node_stage_secret_ref: self.node_stage_secret_ref.clone(),
            read_only: self.read_only,
            volume_attributes: self.volume_attributes.as_ref().map(Pairs::to_map),
            volume_handle: self.volume_handle.clone(),
        }
    }
}

/// A map with string keys as the list of its entries, in key order (as a JSON object
/// deserializes into a `BTreeMap`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pairs<V>(Box<[(String, V)]>);

impl<V: Clone> Pairs<V> {
    pub fn to_map(&self) -> BTreeMap<String, V> {
        self.0.iter().cloned().collect()
    }
}

impl<V> Pairs<V> {
    /// The value of `key`, as `BTreeMap::get`.
    pub fn get(&self, key: &str) -> Option<&V> {
        let at = self.0.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok()?;
        Some(&self.0[at].1)
    }
}

/// The annotations of a cached object, read as its map would be.
#[derive(Clone, Copy, Debug)]
pub struct Annotations<'a>(Option<&'a Pairs<String>>);

impl<'a> Annotations<'a> {
    pub fn get(&self, key: &str) -> Option<&'a String> {
        self.0?.get(key)
    }
}

/// `Deserialize` for a cached kind: from its [`Wire`] form, the annotations moved apart.
macro_rules! deserialize_from_wire {
    ($type:ty) => {
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let Wire {
                    mut metadata,
                    spec,
                    status,
                } = Wire::deserialize(deserializer)?;
                let annotations = take_annotations(&mut metadata);
                Ok(Self {
                    metadata,
                    annotations,
                    spec,
                    status,
                })
            }
        }
    };
}
use deserialize_from_wire;

/// An object as the API sends it, before its annotations move out of its metadata. `Spec`
/// is an `Option` where the kind's spec is optional.
#[derive(Deserialize)]
struct Wire<Spec, Status> {
    #[serde(default, deserialize_with = "metadata_without_managed_fields")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Spec,
    status: Option<Status>,
}

/// An object's metadata as the API sends it, less `managedFields`: no cache keeps them, and
/// skipped while parsing they cost no tree of maps built and freed for each object of each
/// watch event (on a real server, one tree per field manager).
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WireMetadata {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

fn metadata_without_managed_fields<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<ObjectMeta, D::Error> {
    let metadata = Option::<WireMetadata>::deserialize(deserializer)?.unwrap_or_default();
    // Every field named (no `..`): a field k8s-openapi adds fails the build until it is read.
    Ok(ObjectMeta {
        annotations: metadata.annotations,
        creation_timestamp: metadata.creation_timestamp,
        deletion_grace_period_seconds: metadata.deletion_grace_period_seconds,
        deletion_timestamp: metadata.deletion_timestamp,
        finalizers: metadata.finalizers,
        generate_name: metadata.generate_name,
        generation: metadata.generation,
        labels: metadata.labels,
        managed_fields: None,
        name: metadata.name,
        namespace: metadata.namespace,
        owner_references: metadata.owner_references,
        resource_version: metadata.resource_version,
        self_link: metadata.self_link,
        uid: metadata.uid,
    })
}

/// Moves an object's annotations out of its metadata into [`Pairs`], less kubectl's copy of
/// the applied object (as the informers drop it from every cached object). The map stays
/// `Some` when it empties, so the full object built back has the map it had.
fn take_annotations(metadata: &mut ObjectMeta) -> Option<Pairs<String>> {
    let mut annotations = metadata.annotations.take()?;
    annotations.remove(LAST_APPLIED);
    Some(Pairs(annotations.into_iter().collect()))
}

/// The metadata of a full object built from a cached one: with its annotation map back.
fn full_metadata(metadata: &ObjectMeta, annotations: &Option<Pairs<String>>) -> ObjectMeta {
    ObjectMeta {
        annotations: annotations.as_ref().map(Pairs::to_map),
        ..metadata.clone()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Pairs<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, V>::deserialize(deserializer)?;
        Ok(Self(map.into_iter().collect()))
    }
}

impl CachedVolume {
    /// The PV's annotations (`metadata.annotations` is `None` in the cache).
    pub fn annotations(&self) -> Annotations<'_> {
        Annotations(self.annotations.as_ref())
    }

    /// The PersistentVolume this was cached from, less the in-tree sources.
    pub fn to_volume(&self) -> PersistentVolume {
        PersistentVolume {
            metadata: full_metadata(&self.metadata, &self.annotations),
            spec: self.spec.as_ref().map(|spec| PersistentVolumeSpec {
                access_modes: spec.access_modes.clone(),
                capacity: spec.capacity.as_ref().map(Pairs::to_map),
                claim_ref: spec.claim_ref.clone(),
                csi: spec.csi.as_ref().map(CachedCsiSource::to_source),
                mount_options: spec.mount_options.clone(),
                node_affinity: spec.node_affinity.clone(),
                persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy.clone(),
                storage_class_name: spec.storage_class_name.clone(),
                volume_attributes_class_name: spec.volume_attributes_class_name.clone(),
                volume_mode: spec.volume_mode.clone(),
                ..Default::default()
            }),
            status: self.status.clone(),
        }
    }
}

/// A PersistentVolumeClaim with the maps of its spec and status kept as [`Pairs`]; every
/// field survives ([`CachedClaim::to_claim`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedClaim {
    /// Without its annotations (always `None` here): they are in `annotations`.
    pub metadata: ObjectMeta,
    pub annotations: Option<Pairs<String>>,
    pub spec: Option<CachedClaimSpec>,
    pub status: Option<CachedClaimStatus>,
}

deserialize_from_wire!(CachedClaim);

crate::fixed_resource!(
    CachedClaim,
    k8s_openapi::NamespaceResourceScope,
    "",
    "v1",
    "PersistentVolumeClaim",
    "persistentvolumeclaims"
);

/// `PersistentVolumeClaimSpec` with its resources' maps as [`Pairs`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedClaimSpec {
    pub access_modes: Option<Vec<String>>,
    pub data_source: Option<TypedLocalObjectReference>,
    pub data_source_ref: Option<TypedObjectReference>,
    pub resources: Option<CachedResources>,
    pub selector: Option<LabelSelector>,
    pub storage_class_name: Option<String>,
    pub volume_attributes_class_name: Option<String>,
    pub volume_mode: Option<String>,
    pub volume_name: Option<String>,
}

/// `VolumeResourceRequirements` as [`Pairs`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedResources {
    pub limits: Option<Pairs<Quantity>>,
    pub requests: Option<Pairs<Quantity>>,
}

/// `PersistentVolumeClaimStatus` with its maps as [`Pairs`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedClaimStatus {
    pub access_modes: Option<Vec<String>>,
    pub allocated_resource_statuses: Option<Pairs<String>>,
    pub allocated_resources: Option<Pairs<Quantity>>,
    pub capacity: Option<Pairs<Quantity>>,
    pub conditions: Option<Vec<PersistentVolumeClaimCondition>>,
    pub current_volume_attributes_class_name: Option<String>,
    pub modify_volume_status: Option<ModifyVolumeStatus>,
    pub phase: Option<String>,
}

impl CachedClaim {
    /// The claim's annotations (`metadata.annotations` is `None` in the cache).
    pub fn annotations(&self) -> Annotations<'_> {
        Annotations(self.annotations.as_ref())
    }

    /// The PersistentVolumeClaim this was cached from.
    pub fn to_claim(&self) -> PersistentVolumeClaim {
        let map = |pairs: &Option<Pairs<Quantity>>| pairs.as_ref().map(Pairs::to_map);
        PersistentVolumeClaim {
            metadata: full_metadata(&self.metadata, &self.annotations),
            spec: self.spec.as_ref().map(|spec| PersistentVolumeClaimSpec {
                access_modes: spec.access_modes.clone(),
                data_source: spec.data_source.clone(),
                data_source_ref: spec.data_source_ref.clone(),
                resources: spec.resources.as_ref().map(|r| VolumeResourceRequirements {
                    limits: map(&r.limits),
                    requests: map(&r.requests),
                }),
                selector: spec.selector.clone(),
                storage_class_name: spec.storage_class_name.clone(),
                volume_attributes_class_name: spec.volume_attributes_class_name.clone(),
                volume_mode: spec.volume_mode.clone(),
                volume_name: spec.volume_name.clone(),
            }),
            status: self
                .status
                .as_ref()
                .map(|status| PersistentVolumeClaimStatus {
                    access_modes: status.access_modes.clone(),
                    allocated_resource_statuses: status
                        .allocated_resource_statuses
                        .as_ref()
                        .map(Pairs::to_map),
                    allocated_resources: map(&status.allocated_resources),
                    capacity: map(&status.capacity),
                    conditions: status.conditions.clone(),
                    current_volume_attributes_class_name: status
                        .current_volume_attributes_class_name
                        .clone(),
                    modify_volume_status: status.modify_volume_status.clone(),
                    phase: status.phase.clone(),
                }),
        }
    }
}

/// A VolumeAttachment with its inline volume spec boxed and its maps kept as [`Pairs`]; every
/// field survives (the table test's round trip). Written back as it is read: its patches
/// and status patches answer a `CachedAttachment`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedAttachment {
    /// Without its annotations (always `None` here): they are in `annotations`.
    pub metadata: ObjectMeta,
    pub annotations: Option<Pairs<String>>,
    pub spec: CachedAttachmentSpec,
    pub status: Option<CachedAttachmentStatus>,
}

deserialize_from_wire!(CachedAttachment);

crate::fixed_resource!(
    CachedAttachment,
    k8s_openapi::ClusterResourceScope,
    "storage.k8s.io",
    "v1",
    "VolumeAttachment",
    "volumeattachments"
);

/// `VolumeAttachmentSpec` with its source's inline volume spec boxed.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedAttachmentSpec {
    pub attacher: String,
    pub node_name: String,
    pub source: CachedAttachmentSource,
}

/// `VolumeAttachmentSource`, the inline spec boxed.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedAttachmentSource {
    pub inline_volume_spec: Option<Box<PersistentVolumeSpec>>,
    pub persistent_volume_name: Option<String>,
}

/// `VolumeAttachmentStatus` with the attachment metadata as [`Pairs`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedAttachmentStatus {
    pub attach_error: Option<VolumeError>,
    #[serde(default)]
    pub attached: bool,
    pub attachment_metadata: Option<Pairs<String>>,
    pub detach_error: Option<VolumeError>,
}

impl CachedAttachment {
    /// The VolumeAttachment's annotations (`metadata.annotations` is `None` in the cache).
    pub fn annotations(&self) -> Annotations<'_> {
        Annotations(self.annotations.as_ref())
    }

    /// Whether `status.attached` is true.
    pub fn attached(&self) -> bool {
        self.status.as_ref().is_some_and(|status| status.attached)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use k8s_openapi::api::storage::v1::{
        VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
    };

    use super::*;

    /// The VolumeAttachment a cached one stands for: the round trip the tests check.
    fn to_attachment(cached: &CachedAttachment) -> VolumeAttachment {
        let spec = &cached.spec;
        VolumeAttachment {
            metadata: full_metadata(&cached.metadata, &cached.annotations),
            spec: VolumeAttachmentSpec {
                attacher: spec.attacher.clone(),
                node_name: spec.node_name.clone(),
                source: VolumeAttachmentSource {
                    inline_volume_spec: spec.source.inline_volume_spec.as_deref().cloned(),
                    persistent_volume_name: spec.source.persistent_volume_name.clone(),
                },
            },
            status: cached.status.as_ref().map(|status| VolumeAttachmentStatus {
                attach_error: status.attach_error.clone(),
                attached: status.attached,
                attachment_metadata: status.attachment_metadata.as_ref().map(Pairs::to_map),
                detach_error: status.detach_error.clone(),
            }),
        }
    }

    #[test]
    fn a_cached_volume_is_the_volume_less_its_in_tree_sources() {
        let csi_volume = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "pv-1", "resourceVersion": "7", "finalizers": ["f"],
                         "annotations": {"pv.kubernetes.io/provisioned-by": "d"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "1Gi", "other": "2"},
                "claimRef": {"namespace": "ns", "name": "c", "uid": "u"},
                "csi": {"driver": "d", "volumeHandle": "h", "fsType": "ext4", "readOnly": true,
                        "volumeAttributes": {"k": "v", "a": "b"},
                        "controllerPublishSecretRef": {"name": "p", "namespace": "ns"},
                        "controllerExpandSecretRef": {"name": "e", "namespace": "ns"},
                        "nodeExpandSecretRef": {"name": "x", "namespace": "ns"},
                        "nodePublishSecretRef": {"name": "n", "namespace": "ns"},
                        "nodeStageSecretRef": {"name": "s", "namespace": "ns"}},
                "mountOptions": ["ro"],
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}]}]}},
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "fast",
                "volumeAttributesClassName": "gold",
                "volumeMode": "Filesystem",
            },
            "status": {"phase": "Bound", "message": "m"},
        });
        let full: PersistentVolume = serde_json::from_value(csi_volume.clone()).unwrap();
        let cached: CachedVolume = serde_json::from_value(csi_volume).unwrap();
        assert_eq!(
            cached.to_volume(),
            full,
            "every field a CSI volume has survives"
        );

        let in_tree = json!({"metadata": {"name": "pv-2"},
            "spec": {"hostPath": {"path": "/x"}, "storageClassName": "manual"}});
        let cached: CachedVolume = serde_json::from_value(in_tree).unwrap();
        let volume = cached.to_volume();
        let spec = volume.spec.unwrap();
        assert_eq!(spec.host_path, None, "the in-tree source is not kept");
        assert_eq!(spec.storage_class_name.as_deref(), Some("manual"));

        assert!(
            std::mem::size_of::<CachedVolume>() * 2 < std::mem::size_of::<PersistentVolume>(),
            "the point of the type: {} against {} bytes inline",
            std::mem::size_of::<CachedVolume>(),
            std::mem::size_of::<PersistentVolume>()
        );
    }

    #[test]
    fn every_metadata_field_but_the_managed_fields_is_cached() {
        let metadata = json!({
            "name": "pv-1", "generateName": "pv-", "namespace": "", "uid": "u", "generation": 3,
            "resourceVersion": "7", "selfLink": "/api/v1/persistentvolumes/pv-1",
            "creationTimestamp": "2026-12-06T10:00:00Z",
            "deletionTimestamp": "2026-12-06T11:00:00Z", "deletionGracePeriodSeconds": 0,
            "labels": {"l": "1"}, "annotations": {"a": "2"}, "finalizers": ["f"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "o"}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                "apiVersion": "v1", "time": "2026-12-06T10:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:phase": {}}}}],
            "aFieldOfTomorrow": {"x": 1},
        });
        let full: ObjectMeta = serde_json::from_value(metadata.clone()).unwrap();
        let cached: CachedVolume = serde_json::from_value(json!({"metadata": metadata})).unwrap();
        assert_eq!(
            cached.to_volume().metadata,
            ObjectMeta {
                managed_fields: None,
                ..full
            }
        );

        for absent in [json!({}), json!({"metadata": null})] {
            let cached: CachedVolume = serde_json::from_value(absent).unwrap();
            assert_eq!(cached.metadata, ObjectMeta::default());
        }
        let wrong = serde_json::from_value::<CachedVolume>(json!({"metadata": {"name": 1}}));
        assert!(wrong.is_err(), "a malformed field is still an error");
    }

    #[test]
    fn a_cached_claim_is_the_claim() {
        let claim = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                         "annotations": {"volume.kubernetes.io/selected-node": "n1"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"},
                "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src",
                                  "namespace": "other"},
                "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
                "selector": {"matchLabels": {"a": "b"}},
                "storageClassName": "fast",
                "volumeAttributesClassName": "gold",
                "volumeMode": "Block",
                "volumeName": "pv-1",
            },
            "status": {
                "accessModes": ["ReadWriteOnce"],
                "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                "allocatedResources": {"storage": "2Gi"},
                "capacity": {"storage": "1Gi"},
                "conditions": [{"type": "Resizing", "status": "True"}],
                "currentVolumeAttributesClassName": "silver",
                "modifyVolumeStatus": {"status": "InProgress", "targetVolumeAttributesClassName": "gold"},
                "phase": "Bound",
            },
        });
        let full: PersistentVolumeClaim = serde_json::from_value(claim.clone()).unwrap();
        let cached: CachedClaim = serde_json::from_value(claim).unwrap();
        assert_eq!(cached.to_claim(), full, "every field survives");
        assert_eq!(
            cached
                .annotations()
                .get("volume.kubernetes.io/selected-node"),
            Some(&"n1".to_string())
        );
        assert_eq!(cached.annotations().get("other"), None);
        assert_eq!(cached.metadata.annotations, None, "kept apart, as Pairs");

        let bare: CachedClaim = serde_json::from_value(json!({"metadata": {"name": "d"}})).unwrap();
        assert_eq!(
            bare.to_claim(),
            serde_json::from_value::<PersistentVolumeClaim>(json!({"metadata": {"name": "d"}}))
                .unwrap()
        );
    }

    #[test]
    fn annotations_are_kept_as_pairs_without_kubectls_copy() {
        let volume = |annotations: Value| {
            serde_json::from_value::<CachedVolume>(
                json!({"metadata": {"name": "pv", "annotations": annotations}}),
            )
            .unwrap()
        };
        let cached = volume(json!({LAST_APPLIED: "{...}", "b": "2", "a": "1"}));
        assert_eq!(cached.annotations().get("a"), Some(&"1".to_string()));
        assert_eq!(cached.annotations().get("b"), Some(&"2".to_string()));
        assert_eq!(cached.annotations().get(LAST_APPLIED), None);
        assert_eq!(
            cached.to_volume().metadata.annotations,
            Some(BTreeMap::from([
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "2".to_string())
            ]))
        );

        // Emptied by the drop, the map stays: a JSON patch built from the object must not
        // add a whole map over one written meanwhile.
        let only_kubectls = volume(json!({LAST_APPLIED: "{...}"}));
        assert_eq!(
            only_kubectls.to_volume().metadata.annotations,
            Some(BTreeMap::new())
        );
        let none = volume(Value::Null);
        assert_eq!(none.to_volume().metadata.annotations, None);
        assert_eq!(none.annotations().get("a"), None);
    }

    #[test]
    fn a_cached_attachment_is_the_attachment() {
        let attachment = |source: Value| {
            json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttachment",
                "metadata": {"name": "csi-1", "resourceVersion": "3", "finalizers": ["f"],
                             "deletionTimestamp": "2026-01-01T00:00:00Z",
                             "annotations": {"csi.alpha.kubernetes.io/node-id": "n1"}},
                "spec": {"attacher": "d", "nodeName": "node-a", "source": source},
                "status": {
                    "attached": true,
                    "attachmentMetadata": {"b": "2", "a": "1"},
                    "attachError": {"time": "2026-01-01T00:00:00Z", "message": "m",
                                    "errorCode": 4},
                    "detachError": {"message": "n"},
                },
            })
        };
        for source in [
            json!({"persistentVolumeName": "pv-1"}),
            json!({"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"k": "v"}}}}),
        ] {
            let value = attachment(source);
            let full: VolumeAttachment = serde_json::from_value(value.clone()).unwrap();
            let cached: CachedAttachment = serde_json::from_value(value).unwrap();
            assert_eq!(to_attachment(&cached), full, "every field survives");
            assert!(cached.attached());
            assert_eq!(
                cached.annotations().get("csi.alpha.kubernetes.io/node-id"),
                Some(&"n1".to_string())
            );
            assert_eq!(cached.metadata.annotations, None, "kept apart, as Pairs");
        }

        let bare = json!({"metadata": {"name": "csi-2"},
            "spec": {"attacher": "d", "nodeName": "n", "source": {}}});
        let cached: CachedAttachment = serde_json::from_value(bare.clone()).unwrap();
        assert!(!cached.attached());
        assert_eq!(
            to_attachment(&cached),
            serde_json::from_value::<VolumeAttachment>(bare).unwrap()
        );

        assert!(
            std::mem::size_of::<CachedAttachment>() * 2 < std::mem::size_of::<VolumeAttachment>(),
            "the point of the type: {} against {} bytes inline",
            std::mem::size_of::<CachedAttachment>(),
            std::mem::size_of::<VolumeAttachment>()
        );
    }
}

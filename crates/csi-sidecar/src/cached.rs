//! Lean cached kinds: what a cache keeps of an object whose generated type is large inline.
//!
//! k8s-openapi's `PersistentVolume` is about 3.4 KB before any string: its spec holds every
//! in-tree volume source inline. A controller caching thousands of PVs of a CSI driver reads
//! none of those, so its cache keeps a [`CachedVolume`] (about 1.3 KB) and builds the full
//! object only for the one it works on ([`CachedVolume::to_volume`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// A PersistentVolume without the in-tree volume sources: its metadata, its status and every
/// other field of its spec.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedVolume {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<CachedVolumeSpec>,
    pub status: Option<PersistentVolumeStatus>,
}

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
    pub capacity: Option<BTreeMap<String, Quantity>>,
    pub claim_ref: Option<ObjectReference>,
    pub csi: Option<CSIPersistentVolumeSource>,
    pub mount_options: Option<Vec<String>>,
    pub node_affinity: Option<VolumeNodeAffinity>,
    pub persistent_volume_reclaim_policy: Option<String>,
    pub storage_class_name: Option<String>,
    pub volume_attributes_class_name: Option<String>,
    pub volume_mode: Option<String>,
}

impl CachedVolume {
    /// The PersistentVolume this was cached from, less the in-tree sources.
    pub fn to_volume(&self) -> PersistentVolume {
        PersistentVolume {
            metadata: self.metadata.clone(),
            spec: self.spec.clone().map(|spec| PersistentVolumeSpec {
                access_modes: spec.access_modes,
                capacity: spec.capacity,
                claim_ref: spec.claim_ref,
                csi: spec.csi,
                mount_options: spec.mount_options,
                node_affinity: spec.node_affinity,
                persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy,
                storage_class_name: spec.storage_class_name,
                volume_attributes_class_name: spec.volume_attributes_class_name,
                volume_mode: spec.volume_mode,
                ..Default::default()
            }),
            status: self.status.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_cached_volume_is_the_volume_less_its_in_tree_sources() {
        let csi_volume = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "pv-1", "resourceVersion": "7", "finalizers": ["f"],
                         "annotations": {"pv.kubernetes.io/provisioned-by": "d"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "1Gi"},
                "claimRef": {"namespace": "ns", "name": "c", "uid": "u"},
                "csi": {"driver": "d", "volumeHandle": "h", "fsType": "ext4",
                        "volumeAttributes": {"k": "v"},
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
}

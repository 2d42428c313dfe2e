//! What the provisioner does with a PersistentVolume (library `syncVolume` + CSI `Delete` in
//! external-provisioner): keep its finalizer in step with the reclaim policy, and delete
//! Released volumes with reclaim policy Delete — never while a VolumeAttachment still
//! references the PV. Pure: inputs → [`VolumePlan`].

use csi_kinds::secrets::{DeletionSecret, deletion_secret};

use crate::claims::migrated_from;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;

/// The finalizer on PVs whose volume the provisioner deletes (HonorPVReclaimPolicy, KEP-2644).
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
use csi_kinds::annotations::PROVISIONED_BY;
pub use csi_kinds::migration::MIGRATED_TO;
pub const DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
pub const DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";

/// The step for one PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumePlan {
    /// Not ours, or nothing to do.
    Nothing,
    AddFinalizer,
    RemoveFinalizer,
    /// Wait: a VolumeAttachment still references the PV (a Warning event and a retry).
    StillAttached,
    /// DeleteVolume (secrets recorded on the PV, or resolved again from its StorageClass with
    /// the claimRef's name and namespace), then delete the PV object and drop the finalizer.
    Delete {
        volume_id: String,
        secret: DeletionSecret,
    },
    /// A PV of ours without `spec.csi` cannot be deleted through CSI.
    NotCsi,
}

/// Whether the provisioner named `driver` handles this PV: by `provisioned-by` (the driver, or
/// the in-tree plugin it migrated from, as upstream's additional provisioner name) or
/// `migrated-to`, or for a static PV without that annotation by `spec.csi.driver`.
pub fn is_ours(volume: &PersistentVolume, driver: &str) -> bool {
    let annotations = volume.annotations();
    if annotations.get(MIGRATED_TO).is_some_and(|d| d == driver) {
        return true;
    }
    match annotations.get(PROVISIONED_BY) {
        Some(provisioner) => {
            provisioner == driver || migrated_from(driver) == Some(provisioner.as_str())
        }
        None => volume
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|csi| csi.driver == driver),
    }
}

/// The plan for one PV. `attached` says whether any VolumeAttachment references it;
/// `publishes` whether the driver has PUBLISH_UNPUBLISH_VOLUME (else attachments don't hold
/// the volume).
pub fn plan(
    volume: &PersistentVolume,
    driver: &str,
    publishes: bool,
    attached: bool,
) -> VolumePlan {
    if !is_ours(volume, driver) {
        return VolumePlan::Nothing;
    }
    let spec = volume.spec.clone().unwrap_or_default();
    let policy = spec
        .persistent_volume_reclaim_policy
        .as_deref()
        .unwrap_or("Delete");
    let phase = volume
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    let has_finalizer = volume.finalizers().iter().any(|f| f == PV_FINALIZER);
    let deleting = volume.metadata.deletion_timestamp.is_some();
    if policy == "Delete" && !deleting && phase == "Bound" && !has_finalizer {
        return VolumePlan::AddFinalizer;
    }
    if policy != "Delete" && has_finalizer {
        return VolumePlan::RemoveFinalizer;
    }
    if (!has_finalizer && deleting) || phase != "Released" || policy != "Delete" {
        return VolumePlan::Nothing;
    }
    let Some(csi) = spec.csi else {
        return VolumePlan::NotCsi;
    };
    if publishes && attached {
        return VolumePlan::StillAttached;
    }
    let secret = deletion_secret(volume.annotations());
    VolumePlan::Delete {
        volume_id: csi.volume_handle,
        secret,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_kinds::secrets::{
        DELETION_SECRET_NAME_ANNOTATION, DELETION_SECRET_NAMESPACE_ANNOTATION,
    };
    use serde_json::{Value, json};

    const DRIVER: &str = "csi.example.com";

    fn pv(phase: &str, policy: &str, finalizer: bool, extra: Value) -> PersistentVolume {
        let mut value = json!({
            "metadata": {"name": "pvc-1", "annotations": {PROVISIONED_BY: DRIVER, DELETION_SECRET_NAME_ANNOTATION: "", DELETION_SECRET_NAMESPACE_ANNOTATION: ""}},
            "spec": {"persistentVolumeReclaimPolicy": policy, "storageClassName": "fast",
                "claimRef": {"name": "data", "namespace": "apps"},
                "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}},
            "status": {"phase": phase},
        });
        if finalizer {
            value["metadata"]["finalizers"] = json!([PV_FINALIZER]);
        }
        if let (Some(object), Some(extra)) = (value["metadata"].as_object_mut(), extra.as_object())
        {
            for (k, v) in extra {
                object.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(value).unwrap()
    }

    fn delete(secret: DeletionSecret) -> VolumePlan {
        VolumePlan::Delete {
            volume_id: "vol-1".into(),
            secret,
        }
    }

    #[test]
    fn plans() {
        let recorded = DeletionSecret::Annotated(None);
        let table = [
            (
                "bound, Delete, no finalizer",
                pv("Bound", "Delete", false, json!({})),
                false,
                VolumePlan::AddFinalizer,
            ),
            (
                "bound with finalizer",
                pv("Bound", "Delete", true, json!({})),
                false,
                VolumePlan::Nothing,
            ),
            (
                "Retain drops the finalizer",
                pv("Bound", "Retain", true, json!({})),
                false,
                VolumePlan::RemoveFinalizer,
            ),
            (
                "Released Retain",
                pv("Released", "Retain", false, json!({})),
                false,
                VolumePlan::Nothing,
            ),
            (
                "Released Delete",
                pv("Released", "Delete", true, json!({})),
                false,
                delete(recorded.clone()),
            ),
            (
                "still attached",
                pv("Released", "Delete", true, json!({})),
                true,
                VolumePlan::StillAttached,
            ),
            (
                "Available",
                pv("Available", "Delete", true, json!({})),
                false,
                VolumePlan::Nothing,
            ),
            (
                "deleting without finalizer",
                pv(
                    "Released",
                    "Delete",
                    false,
                    json!({"deletionTimestamp": "2026-01-01T00:00:00Z"}),
                ),
                false,
                VolumePlan::Nothing,
            ),
        ];
        for (what, volume, attached, expected) in table {
            assert_eq!(plan(&volume, DRIVER, true, attached), expected, "{what}");
        }
        let attached_but_no_publish = pv("Released", "Delete", true, json!({}));
        assert_eq!(
            plan(&attached_but_no_publish, DRIVER, false, true),
            delete(recorded)
        );
    }

    #[test]
    fn ownership_and_secret_sources() {
        let other = pv(
            "Released",
            "Delete",
            true,
            json!({"annotations": {PROVISIONED_BY: "other.example.com"}}),
        );
        assert_eq!(plan(&other, DRIVER, true, false), VolumePlan::Nothing);
        let migrated = pv(
            "Released",
            "Delete",
            true,
            json!({"annotations": {PROVISIONED_BY: "kubernetes.io/gce-pd", MIGRATED_TO: DRIVER}}),
        );
        assert!(is_ours(&migrated, DRIVER));
        // The EBS driver's provisioner deletes the volumes provisioned as aws-ebs volumes (its
        // additional provisioner name upstream), and no other plugin's.
        let ebs = |plugin: &str| {
            pv(
                "Released",
                "Delete",
                true,
                json!({"annotations": {PROVISIONED_BY: plugin}}),
            )
        };
        assert!(is_ours(&ebs("kubernetes.io/aws-ebs"), "ebs.csi.aws.com"));
        assert!(!is_ours(&ebs("kubernetes.io/gce-pd"), "ebs.csi.aws.com"));
        assert!(!is_ours(&ebs("kubernetes.io/aws-ebs"), DRIVER));
        // A static PV (no provisioned-by) is ours by its CSI driver; no recorded secret means the
        // StorageClass is consulted.
        let static_pv = pv("Released", "Delete", true, json!({"annotations": {}}));
        assert_eq!(
            plan(&static_pv, DRIVER, true, false),
            delete(DeletionSecret::FromStorageClass)
        );
        let mut not_csi = pv("Released", "Delete", true, json!({}));
        if let Some(spec) = not_csi.spec.as_mut() {
            spec.csi = None;
        }
        assert_eq!(plan(&not_csi, DRIVER, true, false), VolumePlan::NotCsi);
    }
}

//! VolumeAttributesClass (storage.k8s.io/v1, GA in Kubernetes 1.34): a claim's
//! `spec.volumeAttributesClassName` names a class whose `parameters` CreateVolume sends as
//! `mutable_parameters`, and the PV names the class (external-provisioner's
//! `prepareProvision` and `Provision`, gate `VolumeAttributesClass`). The gate and API
//! discovery decide whether classes are read at all; the checks are pure.

use std::collections::BTreeMap;

use csi_kinds::vac::{Support, VolumeAttributesClass};
use csi_sidecar::feature_gates::FeatureGate;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

/// external-provisioner's gate: GA, on by default, not locked (pkg/features/features.go).
pub const GATE: FeatureGate = crate::gates::VOLUME_ATTRIBUTES_CLASS;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VacError {
    #[error(
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    )]
    NoModifyVolume,
    #[error(
        "volumeattributesclasses.storage.k8s.io \"{0}\": the API server does not serve storage.k8s.io/v1 VolumeAttributesClass"
    )]
    NotServed(String),
    /// The cache has no initial list yet (a 403 on `list volumeattributesclasses`, say: its
    /// warnings name the cause).
    #[error(
        "volumeattributesclasses.storage.k8s.io \"{0}\": the VolumeAttributesClass cache is not synced yet"
    )]
    NotSynced(String),
    #[error("volumeattributesclasses.storage.k8s.io \"{0}\" not found")]
    NotFound(String),
    #[error(
        "VAC {name} referenced in PVC is for driver {driver} which does not match driver name {ours}"
    )]
    OtherDriver {
        name: String,
        driver: String,
        ours: String,
    },
}

/// The class a claim names, when classes are not ignored.
pub fn class_name(claim: &PersistentVolumeClaim, support: Support) -> Option<String> {
    if support == Support::Disabled {
        return None;
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.clone())
        .filter(|name| !name.is_empty())
}

/// CreateVolume's `mutable_parameters`: the parameters of `class` (the cached class named
/// `name`, if any), which must be for `driver`.
pub fn mutable_parameters(
    name: &str,
    class: Option<&VolumeAttributesClass>,
    driver: &str,
) -> Result<BTreeMap<String, String>, VacError> {
    let class = class.ok_or_else(|| VacError::NotFound(name.to_string()))?;
    if class.driver_name != driver {
        return Err(VacError::OtherDriver {
            name: name.to_string(),
            driver: class.driver_name.clone(),
            ours: driver.to_string(),
        });
    }
    Ok(class.parameters.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mutable_parameters_come_from_a_class_of_this_driver() {
        let class: VolumeAttributesClass = serde_json::from_value(json!({
            "metadata": {"name": "gold"}, "driverName": "csi.example.com",
            "parameters": {"iops": "3000"}}))
        .unwrap();
        assert_eq!(
            mutable_parameters("gold", Some(&class), "csi.example.com"),
            Ok(BTreeMap::from([("iops".to_string(), "3000".to_string())]))
        );
        assert_eq!(
            mutable_parameters("gold", Some(&class), "other.example.com")
                .unwrap_err()
                .to_string(),
            "VAC gold referenced in PVC is for driver csi.example.com which does not match driver name other.example.com"
        );
        assert_eq!(
            mutable_parameters("silver", None, "csi.example.com"),
            Err(VacError::NotFound("silver".to_string()))
        );
    }

    #[test]
    fn the_class_name_counts_only_with_the_gate() {
        let claim: PersistentVolumeClaim = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"volumeAttributesClassName": "gold"}}),
        )
        .unwrap();
        assert_eq!(class_name(&claim, Support::Served).as_deref(), Some("gold"));
        assert_eq!(
            class_name(&claim, Support::NotServed).as_deref(),
            Some("gold")
        );
        assert_eq!(class_name(&claim, Support::Disabled), None);
        let empty: PersistentVolumeClaim = serde_json::from_value(
            json!({"metadata": {"name": "c"}, "spec": {"volumeAttributesClassName": ""}}),
        )
        .unwrap();
        assert_eq!(class_name(&empty, Support::Served), None);
    }
}

//! ControllerModifyVolume for VolumeAttributesClass changes (external-resizer
//! `pkg/modifycontroller`), the pure part: whether a claim's volume is to be modified to the
//! class its spec names, and the claim and PV patches that record each step
//! (`status.modifyVolumeStatus`, the `ModifyingVolume` / `ModifyVolumeError` conditions,
//! `status.currentVolumeAttributesClassName`, the PV's `spec.volumeAttributesClassName`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use csi_kinds::secrets::SecretRef;
use csi_kinds::vac::VolumeAttributesClass;
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use tonic::Code;

use crate::resize::is_ours;

/// Event reasons (upstream's `util` constants).
pub mod reason {
    pub const VOLUME_MODIFY: &str = "VolumeModify";
    pub const VOLUME_MODIFY_FAILED: &str = "VolumeModifyFailed";
    pub const VOLUME_MODIFY_SUCCESSFUL: &str = "VolumeModifySuccessful";
    /// Upstream's spelling.
    pub const VOLUME_MODIFY_CANCELLED: &str = "VolumeModifyCanceled";
}

/// `status.modifyVolumeStatus.status` values.
pub mod status {
    pub const PENDING: &str = "Pending";
    pub const IN_PROGRESS: &str = "InProgress";
    pub const INFEASIBLE: &str = "Infeasible";
}

/// Claim condition types of a modification.
pub mod condition {
    pub const MODIFYING: &str = "ModifyingVolume";
    pub const ERROR: &str = "ModifyVolumeError";
}

/// With `--extra-modify-metadata`, ControllerModifyVolume gets these.
pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// The annotations csi-provisioner writes on a PV when its class names a modify secret.
pub const SECRET_NAME_ANNOTATION: &str = csi_kinds::secrets::MODIFY_SECRET_NAME_ANNOTATION;
pub const SECRET_NAMESPACE_ANNOTATION: &str =
    csi_kinds::secrets::MODIFY_SECRET_NAMESPACE_ANNOTATION;

/// What to do about a claim's class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModifyPlan {
    Nothing,
    /// The claim went back to its current class before the driver was asked: the
    /// `ModifyingVolume` condition goes, with a `VolumeModifyCanceled` Event.
    RolledBack,
    /// Modify to `class`; `mark` first records `InProgress` and the `VolumeModify` Event (not
    /// when resuming a call whose outcome is unknown).
    Modify {
        class: String,
        mark: bool,
    },
    /// An infeasible modification to the same class is retried only after this.
    RetryLater(Duration),
}

/// What the controller remembers of a claim between syncs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// The last ControllerModifyVolume may still be running at the driver (a timeout, say).
    pub uncertain: bool,
    /// Left of the slow retry after an infeasible modification.
    pub infeasible_wait: Option<Duration>,
}

fn spec_class(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .unwrap_or("")
}

fn current_class(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status
        .as_ref()
        .and_then(|s| s.current_volume_attributes_class_name.as_deref())
        .unwrap_or("")
}

/// `status.modifyVolumeStatus`: (status, target class).
pub fn modify_status(pvc: &PersistentVolumeClaim) -> Option<(&str, &str)> {
    let status = pvc.status.as_ref()?.modify_volume_status.as_ref()?;
    Some((
        status.status.as_str(),
        status
            .target_volume_attributes_class_name
            .as_deref()
            .unwrap_or(""),
    ))
}

fn conditions_of(pvc: &PersistentVolumeClaim) -> &[PersistentVolumeClaimCondition] {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

/// Whether an infeasible modification to the class the claim still names awaits its slow
/// retry (upstream `delayModificationIfRecentlyInfeasible`).
pub fn is_infeasible(pvc: &PersistentVolumeClaim) -> bool {
    matches!(modify_status(pvc), Some((status::INFEASIBLE, target)) if target == spec_class(pvc))
}

/// Upstream `syncPVC` and `modify`.
pub fn plan(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    driver: &str,
    memory: Memory,
) -> ModifyPlan {
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound || !is_ours(pv, driver) {
        return ModifyPlan::Nothing;
    }
    if let Some(wait) = memory.infeasible_wait.filter(|_| is_infeasible(pvc)) {
        return ModifyPlan::RetryLater(wait);
    }
    let (spec, current) = (spec_class(pvc), current_class(pvc));
    let status = modify_status(pvc);
    if status.is_none() && spec == current {
        return ModifyPlan::Nothing;
    }
    let in_progress = status.is_some_and(|(s, _)| s == status::IN_PROGRESS);
    if spec.is_empty() && !in_progress {
        let modifying = conditions_of(pvc)
            .iter()
            .any(|c| c.type_ == condition::MODIFYING);
        return if modifying {
            ModifyPlan::RolledBack
        } else {
            ModifyPlan::Nothing
        };
    }
    if (in_progress && memory.uncertain) || spec.is_empty() {
        let target = status.map(|(_, target)| target).unwrap_or_default();
        return ModifyPlan::Modify {
            class: target.to_string(),
            mark: false,
        };
    }
    ModifyPlan::Modify {
        class: spec.to_string(),
        mark: true,
    }
}

/// The class's parameters, checked to be for `driver`.
pub fn parameters(
    class: &VolumeAttributesClass,
    driver: &str,
) -> Result<BTreeMap<String, String>, String> {
    if class.driver_name != driver {
        return Err(format!(
            "VAC {} is for driver {} which does not match driver name {driver}",
            class.metadata.name.as_deref().unwrap_or_default(),
            class.driver_name
        ));
    }
    Ok(class.parameters.clone())
}

/// The secret of ControllerModifyVolume: the PV's modify-secret annotations, else its
/// controllerExpandSecretRef (upstream `getModifyCredentials`).
pub fn modify_secret(pv: &PersistentVolume) -> Option<SecretRef> {
    let annotations = pv.metadata.annotations.as_ref();
    let annotated = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
    };
    if let (Some(name), Some(namespace)) = (
        annotated(SECRET_NAME_ANNOTATION),
        annotated(SECRET_NAMESPACE_ANNOTATION),
    ) {
        return Some(SecretRef {
            name: name.clone(),
            namespace: namespace.clone(),
        });
    }
    crate::resize::expand_secret(pv)
}

/// The ControllerModifyVolume request.
pub fn request(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    mut parameters: BTreeMap<String, String>,
    extra_metadata: bool,
    secrets: HashMap<String, String>,
) -> csi::ControllerModifyVolumeRequest {
    if extra_metadata {
        parameters.insert(
            PVC_NAME_KEY.into(),
            pvc.metadata.name.clone().unwrap_or_default(),
        );
        parameters.insert(
            PVC_NAMESPACE_KEY.into(),
            pvc.metadata.namespace.clone().unwrap_or_default(),
        );
        parameters.insert(
            PV_NAME_KEY.into(),
            pv.metadata.name.clone().unwrap_or_default(),
        );
    }
    let volume_id = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default();
    csi::ControllerModifyVolumeRequest {
        volume_id,
        secrets,
        mutable_parameters: parameters.into_iter().collect(),
    }
}

/// A failed ControllerModifyVolume: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    /// The driver is not still modifying (upstream `IsFinalError`).
    pub fn is_final(&self) -> bool {
        csi_grpc::conn::is_final_error(self.code)
    }

    /// The status it leaves: Infeasible for an invalid argument, else still in progress.
    pub fn status(&self) -> &'static str {
        if self.is_final() && self.code == Code::InvalidArgument {
            status::INFEASIBLE
        } else {
            status::IN_PROGRESS
        }
    }

    /// Go's `err.Error()` of a gRPC error, and the note of a call that may still be running.
    pub fn event_message(&self, class: &str) -> String {
        let base = format!(
            "rpc error: code = {} desc = {}",
            csi_grpc::metrics::go_code_name(self.code),
            self.message
        );
        if self.is_final() {
            base
        } else {
            format!("{base}. Still modifying to VAC {class}")
        }
    }
}

/// Conditions of other kinds stay; a modify condition in `new` replaces the old one of its
/// kind; the rest of `new` is appended (upstream `MergePVCConditions`).
fn merge_conditions(
    old: &[PersistentVolumeClaimCondition],
    new: Vec<PersistentVolumeClaimCondition>,
) -> Vec<PersistentVolumeClaimCondition> {
    let mut new = new;
    let mut merged = Vec::new();
    for condition in old {
        if let Some(at) = new.iter().position(|n| n.type_ == condition.type_) {
            merged.push(new.remove(at));
        } else {
            merged.push(condition.clone());
        }
    }
    merged.extend(new);
    merged
}

fn conditions_value(conditions: Vec<PersistentVolumeClaimCondition>) -> Value {
    if conditions.is_empty() {
        Value::Null
    } else {
        json!(conditions)
    }
}

fn condition(
    kind: &str,
    message: String,
    reason: Option<String>,
    now: &Time,
) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: kind.to_string(),
        status: "True".to_string(),
        last_probe_time: Some(now.clone()),
        message: Some(message),
        reason,
        ..PersistentVolumeClaimCondition::default()
    }
}

/// The claim status patch marking `status` (upstream `markControllerModifyVolumeStatus`):
/// Pending touches no condition; otherwise `ModifyingVolume`, and with a failure
/// `ModifyVolumeError` too. Guarded by the claim's resourceVersion.
pub fn status_patch(
    pvc: &PersistentVolumeClaim,
    new_status: &str,
    failure: Option<&Failure>,
    now: &Time,
) -> Value {
    let (_, old_target) = modify_status(pvc).unwrap_or(("", ""));
    // Only a modification that starts names its target; Pending and failures keep the old one.
    let target = if failure.is_none() && new_status != status::PENDING {
        spec_class(pvc).to_string()
    } else {
        old_target.to_string()
    };
    let mut modify = json!({"status": new_status});
    if !target.is_empty() {
        modify["targetVolumeAttributesClassName"] = json!(target);
    }
    let mut status = json!({"modifyVolumeStatus": modify});
    if new_status != status::PENDING {
        let mut conditions = Vec::new();
        let message = match failure {
            None => format!("Modifying volume to {target:?} is in progress."),
            Some(f) if f.is_final() => {
                format!("Modifying volume to {target:?} failed. Waiting for retry.")
            }
            Some(_) => format!("Modifying volume to {target:?} is still in progress."),
        };
        conditions.push(condition(condition::MODIFYING, message, None, now));
        if let Some(failure) = failure {
            conditions.push(condition(
                condition::ERROR,
                failure.message.clone(),
                Some(format!("{:?}", failure.code)),
                now,
            ));
        }
        status["conditions"] = conditions_value(merge_conditions(conditions_of(pvc), conditions));
    }
    json!({
        "metadata": {"resourceVersion": pvc.metadata.resource_version},
        "status": status,
    })
}

/// The claim status patch of a finished modification (upstream
/// `markControllerModifyVolumeCompleted`).
pub fn completed_patch(pvc: &PersistentVolumeClaim, class: &str) -> Value {
    let conditions: Vec<PersistentVolumeClaimCondition> = conditions_of(pvc)
        .iter()
        .filter(|c| c.type_ != condition::MODIFYING && c.type_ != condition::ERROR)
        .cloned()
        .collect();
    json!({"status": {
        "modifyVolumeStatus": null,
        "currentVolumeAttributesClassName": class,
        "conditions": conditions_value(conditions),
    }})
}

/// The PV patch naming its new class.
pub fn volume_patch(class: &str) -> Value {
    json!({"spec": {"volumeAttributesClassName": class}})
}

/// The claim status patch of a rolled-back modification (upstream `markRolledBack`).
pub fn rolled_back_patch(pvc: &PersistentVolumeClaim) -> Value {
    let conditions: Vec<PersistentVolumeClaimCondition> = conditions_of(pvc)
        .iter()
        .filter(|c| c.type_ != condition::MODIFYING)
        .cloned()
        .collect();
    json!({"status": {"conditions": conditions_value(conditions)}})
}

#[cfg(test)]
mod tests;

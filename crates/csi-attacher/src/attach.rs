//! The pure core of the attacher (external-attacher `pkg/controller/{csi_handler,util}.go`):
//! which VolumeAttachments are ours and what to do with them, the volume they attach, the node
//! ID to attach to, and the ControllerPublishVolume / ControllerUnpublishVolume requests.

use std::collections::HashMap;

use csi_proto::csi::v1 as csi;
use csi_sidecar::capability::{AccessKind, CapabilityError, volume_access_mode, volume_capability};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, SecretReference,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};

/// The CSI node ID a VolumeAttachment was attached with: the fallback for detaching once the
/// CSINode has lost the driver (node deleted, driver pod gone).
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("VolumeAttachment {0} has no volume source")]
    NoSource(String),
    #[error("VolumeAttachment {0} has both a PersistentVolume and an inline volume source")]
    TwoSources(String),
    #[error("PersistentVolume {0} not found")]
    MissingVolume(String),
    #[error("PersistentVolume {0} is marked for deletion")]
    VolumeDeleted(String),
    #[error("{0} is not a CSI volume")]
    NotCsi(String),
    #[error("CSINode {node} not found")]
    MissingCsiNode { node: String },
    #[error("CSINode {node} does not contain driver {driver}")]
    DriverNotOnNode { node: String, driver: String },
    #[error(
        "no node ID for node {node}: its CSINode has no driver {driver} and the VolumeAttachment no {NODE_ID_ANNOTATION} annotation"
    )]
    NoNodeId { node: String, driver: String },
    #[error(transparent)]
    AccessMode(#[from] CapabilityError),
}

/// `external-attacher/<driver>`, every character outside `[a-zA-Z0-9-]` replaced by `-` and an
/// `X` appended when that leaves a trailing `-` (`ebs.csi.aws.com` →
/// `external-attacher/ebs-csi-aws-com`); the finalizer on VolumeAttachments and PVs.
pub fn finalizer(driver: &str) -> String {
    // external-attacher's SanitizeDriverName is csi-lib-utils' lock-name rule.
    format!(
        "external-attacher/{}",
        csi_sidecar::leader::sanitize_lease_name(driver)
    )
}

/// What the driver can do, from its capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DriverSupport {
    /// CONTROLLER_SERVICE and PUBLISH_UNPUBLISH_VOLUME; without it the attacher is "trivial".
    pub publish_unpublish: bool,
    pub publish_readonly: bool,
    pub single_node_multi_writer: bool,
    /// LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES: the reconcile can run.
    pub list_published_nodes: bool,
}

/// What to do with one VolumeAttachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VaPlan {
    /// Another attacher's.
    NotOurs,
    /// Attached, or detached and released: nothing to do.
    Nothing,
    /// A driver without ControllerPublishVolume: mark it attached, no finalizer, no CSI call.
    MarkAttached,
    Attach,
    Detach,
}

/// The plan for `va` of this `driver`.
pub fn plan(va: &VolumeAttachment, driver: &str, support: DriverSupport) -> VaPlan {
    if va.spec.attacher != driver {
        return VaPlan::NotOurs;
    }
    let attached = va.status.as_ref().is_some_and(|s| s.attached);
    let deleting = va.metadata.deletion_timestamp.is_some();
    if !support.publish_unpublish {
        return if attached || deleting {
            VaPlan::Nothing
        } else {
            VaPlan::MarkAttached
        };
    }
    let ours = finalizer(driver);
    let finalized = va.metadata.finalizers.iter().flatten().any(|f| *f == ours);
    match (deleting, attached) {
        (true, _) if finalized => VaPlan::Detach,
        (true, _) => VaPlan::Nothing,
        (false, true) => VaPlan::Nothing,
        (false, false) => VaPlan::Attach,
    }
}

/// The volume a VolumeAttachment attaches: its PV's spec (or the inline spec) and CSI source.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachedVolume {
    /// The PV's name; `None` for an inline volume (which gets no PV finalizer).
    pub pv_name: Option<String>,
    pub spec: PersistentVolumeSpec,
    pub csi: CSIPersistentVolumeSource,
}

/// Exactly one of `persistentVolumeName` and `inlineVolumeSpec`; a PV must exist, be a CSI
/// volume and not be marked for deletion (attaching it would block its deletion).
pub fn attached_volume(
    va: &VolumeAttachment,
    pv: Option<&PersistentVolume>,
) -> Result<AttachedVolume, AttachError> {
    let name = va.metadata.name.clone().unwrap_or_default();
    let source = &va.spec.source;
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(_), Some(_)) => Err(AttachError::TwoSources(name)),
        (None, None) => Err(AttachError::NoSource(name)),
        (None, Some(inline)) => {
            let csi = inline
                .csi
                .clone()
                .ok_or_else(|| AttachError::NotCsi(format!("the inline volume of {name}")))?;
            Ok(AttachedVolume {
                pv_name: None,
                spec: inline.clone(),
                csi,
            })
        }
        (Some(pv_name), None) => {
            let pv = pv.ok_or_else(|| AttachError::MissingVolume(pv_name.clone()))?;
            if pv.metadata.deletion_timestamp.is_some() {
                return Err(AttachError::VolumeDeleted(pv_name.clone()));
            }
            let spec = pv.spec.clone().unwrap_or_default();
            let csi = spec
                .csi
                .clone()
                .ok_or_else(|| AttachError::NotCsi(format!("PersistentVolume {pv_name}")))?;
            Ok(AttachedVolume {
                pv_name: Some(pv_name.clone()),
                spec,
                csi,
            })
        }
    }
}

/// The node ID to attach to: the CSINode's entry for the driver, nothing else (the Node
/// annotation upstream stopped reading in v2.2 is not a fallback either).
pub fn attach_node_id(
    node: &str,
    csi_node: Option<&CSINode>,
    driver: &str,
) -> Result<String, AttachError> {
    let csi_node = csi_node.ok_or_else(|| AttachError::MissingCsiNode {
        node: node.to_string(),
    })?;
    csi_node
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.node_id.clone())
        .ok_or_else(|| AttachError::DriverNotOnNode {
            node: node.to_string(),
            driver: driver.to_string(),
        })
}

/// The node ID to detach from: the CSINode's entry, else the ID the attach recorded on the
/// VolumeAttachment — so a VolumeAttachment of a deleted node is detached, not stuck.
pub fn detach_node_id(
    va: &VolumeAttachment,
    csi_node: Option<&CSINode>,
    driver: &str,
) -> Result<String, AttachError> {
    let node = &va.spec.node_name;
    attach_node_id(node, csi_node, driver).or_else(|_| {
        va.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION))
            .filter(|id| !id.is_empty())
            .cloned()
            .ok_or_else(|| AttachError::NoNodeId {
                node: node.clone(),
                driver: driver.to_string(),
            })
    })
}

/// The Secret whose data goes with ControllerPublish/Unpublish (`controllerPublishSecretRef`).
pub fn publish_secret(volume: &AttachedVolume) -> Option<SecretReference> {
    volume.csi.controller_publish_secret_ref.clone()
}

/// ControllerPublishVolume for `volume` on `node_id`: the capability from the access modes,
/// volumeMode, fsType (or `default_fstype`) and mount options; `readonly` only when the driver
/// has PUBLISH_READONLY; the volume attributes as context.
pub fn publish_request(
    volume: &AttachedVolume,
    node_id: &str,
    default_fstype: &str,
    support: DriverSupport,
    secrets: HashMap<String, String>,
) -> Result<csi::ControllerPublishVolumeRequest, AttachError> {
    let modes = volume.spec.access_modes.clone().unwrap_or_default();
    let mode = volume_access_mode(&modes, support.single_node_multi_writer)?;
    let fs_type = volume
        .csi
        .fs_type
        .clone()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| default_fstype.to_string());
    let kind = AccessKind::from_volume_mode(
        volume.spec.volume_mode.as_deref(),
        fs_type,
        volume.spec.mount_options.clone().unwrap_or_default(),
    );
    Ok(csi::ControllerPublishVolumeRequest {
        volume_id: volume.csi.volume_handle.clone(),
        node_id: node_id.to_string(),
        volume_capability: Some(volume_capability(&kind, mode)),
        readonly: support.publish_readonly && volume.csi.read_only == Some(true),
        secrets,
        volume_context: volume
            .csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    })
}

pub fn unpublish_request(
    volume_id: &str,
    node_id: &str,
    secrets: HashMap<String, String>,
) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: volume_id.to_string(),
        node_id: node_id.to_string(),
        secrets,
    }
}

#[cfg(test)]
mod tests;

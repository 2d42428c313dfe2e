//! The pure core of the attacher (external-attacher `pkg/controller/{csi_handler,util}.go`):
//! which VolumeAttachments are ours and what to do with them, the volume they attach, the node
//! ID to attach to, and the ControllerPublishVolume request (ControllerUnpublishVolume's, shared
//! with podmon, is in `csi_kinds::volume_attachment`).

use std::collections::HashMap;

use serde_json::{Value, json};

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::DriverInfo;
use csi_kinds::cached::{CachedAttachment, CachedVolume};
use csi_kinds::capability::{AccessKind, CapabilityError, volume_access_mode, volume_capability};
use csi_kinds::migration::{self, MigrationError};
use csi_kinds::secrets::SecretRef;
use csi_kinds::volume_attachment::NODE_ID_ANNOTATION;
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};
use k8s_openapi::api::storage::v1::CSINode;

/// Why a VolumeAttachment cannot be attached or detached. The texts are upstream's: they are
/// the `attachError`/`detachError` message, which the attach/detach controller quotes in the
/// pod's Events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source")]
    NoSource,
    #[error("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source")]
    TwoSources,
    /// Upstream's PV lister's NotFound.
    #[error("persistentvolume \"{0}\" not found")]
    MissingVolume(String),
    #[error("PersistentVolume \"{0}\" is marked for deletion")]
    VolumeDeleted(String),
    #[error("inline volume spec contains nil CSI source")]
    InlineNotCsi,
    #[error("pv spec contained non-csi source that was not migrated")]
    NotCsi,
    /// An in-tree PV of a migrated plugin whose source cannot be translated.
    #[error("failed to translate in tree pv to CSI: {0}")]
    Migration(#[from] MigrationError),
    /// Upstream's CSINode lister's NotFound.
    #[error("csinode.storage.k8s.io \"{node}\" not found")]
    MissingCsiNode { node: String },
    #[error("CSINode {node} does not contain driver {driver}")]
    DriverNotOnNode { node: String, driver: String },
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
        csi_sidecar::leader::sanitize_name(driver)
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

impl DriverSupport {
    pub fn of(driver: &DriverInfo) -> Self {
        let has =
            |capability| driver.plugin.controller_service && driver.has_controller(capability);
        Self {
            publish_unpublish: has(ControllerCapability::PublishUnpublishVolume),
            publish_readonly: has(ControllerCapability::PublishReadonly),
            single_node_multi_writer: has(ControllerCapability::SingleNodeMultiWriter),
            list_published_nodes: has(ControllerCapability::ListVolumes)
                && has(ControllerCapability::ListVolumesPublishedNodes),
        }
    }
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

/// The plan for `va` of this `driver`. `forced`: the reconcile found the driver's view
/// different from `status.attached`, so the publish (or unpublish) is done again even though
/// the VolumeAttachment says it is done (upstream's force-sync).
pub fn plan(va: &CachedAttachment, driver: &str, support: DriverSupport, forced: bool) -> VaPlan {
    if va.spec.attacher != driver {
        return VaPlan::NotOurs;
    }
    let attached = va.attached();
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
        (true, _) if finalized || forced => VaPlan::Detach,
        (true, _) => VaPlan::Nothing,
        (false, true) if !forced => VaPlan::Nothing,
        (false, _) => VaPlan::Attach,
    }
}

/// The volume a VolumeAttachment attaches: what ControllerPublishVolume reads of its PV's
/// spec (or of the inline spec), and its CSI source.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachedVolume {
    /// The PV's name; `None` for an inline volume (which gets no PV finalizer).
    pub pv_name: Option<String>,
    pub access_modes: Vec<String>,
    pub volume_mode: Option<String>,
    pub mount_options: Vec<String>,
    pub csi: CSIPersistentVolumeSource,
}

/// The volume to attach: [`volume_of`], refusing a PV marked for deletion (attaching it would
/// block its deletion).
pub fn attached_volume(
    va: &CachedAttachment,
    pv: Option<&CachedVolume>,
    stored: Option<&PersistentVolume>,
) -> Result<AttachedVolume, AttachError> {
    let volume = volume_of(va, pv, stored)?;
    if pv.is_some_and(|pv| pv.metadata.deletion_timestamp.is_some()) {
        return Err(AttachError::VolumeDeleted(
            volume.pv_name.clone().unwrap_or_default(),
        ));
    }
    Ok(volume)
}

/// Exactly one of `persistentVolumeName` and `inlineVolumeSpec`; a PV must exist and be a CSI
/// volume, or an in-tree volume of a plugin migrated to CSI (CSI migration: the attach/detach
/// controller hands such a PV to the CSI driver's attacher, which attaches it as
/// csi-translation-lib translates it). The cached PV keeps no in-tree source: `stored` is the
/// PV as stored, read when the cached one has no CSI source ([`AttachError::NotCsi`] without
/// it). An inline volume's spec is already translated by the attach/detach controller.
/// (Detaching needs the volume too: our finalizer keeps the PV until no VolumeAttachment names
/// it.)
pub fn volume_of(
    va: &CachedAttachment,
    pv: Option<&CachedVolume>,
    stored: Option<&PersistentVolume>,
) -> Result<AttachedVolume, AttachError> {
    let source = &va.spec.source;
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(_), Some(_)) => Err(AttachError::TwoSources),
        (None, None) => Err(AttachError::NoSource),
        (None, Some(inline)) => {
            let csi = inline.csi.clone().ok_or(AttachError::InlineNotCsi)?;
            Ok(AttachedVolume {
                pv_name: None,
                access_modes: inline.access_modes.clone().unwrap_or_default(),
                volume_mode: inline.volume_mode.clone(),
                mount_options: inline.mount_options.clone().unwrap_or_default(),
                csi,
            })
        }
        (Some(pv_name), None) => {
            let pv = pv.ok_or_else(|| AttachError::MissingVolume(pv_name.clone()))?;
            let spec = pv.spec.as_ref().ok_or(AttachError::NotCsi)?;
            let Some(csi) = spec.csi.as_ref() else {
                let translated = migration::in_tree_to_csi(stored.ok_or(AttachError::NotCsi)?)?;
                let spec = translated
                    .and_then(|pv| pv.spec)
                    .ok_or(AttachError::NotCsi)?;
                return Ok(AttachedVolume {
                    pv_name: Some(pv_name.clone()),
                    access_modes: spec.access_modes.unwrap_or_default(),
                    volume_mode: spec.volume_mode,
                    mount_options: spec.mount_options.unwrap_or_default(),
                    csi: spec.csi.ok_or(AttachError::NotCsi)?,
                });
            };
            Ok(AttachedVolume {
                pv_name: Some(pv_name.clone()),
                access_modes: spec.access_modes.clone().unwrap_or_default(),
                volume_mode: spec.volume_mode.clone(),
                mount_options: spec.mount_options.clone().unwrap_or_default(),
                csi: csi.to_source(),
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
/// VolumeAttachment — so a VolumeAttachment of a deleted node is detached, not stuck. Without
/// either, the CSINode's error, as upstream.
pub fn detach_node_id(
    va: &CachedAttachment,
    csi_node: Option<&CSINode>,
    driver: &str,
) -> Result<String, AttachError> {
    attach_node_id(&va.spec.node_name, csi_node, driver).or_else(|error| {
        va.annotations()
            .get(NODE_ID_ANNOTATION)
            .filter(|id| !id.is_empty())
            .cloned()
            .ok_or(error)
    })
}

/// The Secret whose data goes with ControllerPublish/Unpublish (`controllerPublishSecretRef`).
pub fn publish_secret(volume: &AttachedVolume) -> Option<SecretRef> {
    let reference = volume.csi.controller_publish_secret_ref.as_ref()?;
    Some(SecretRef {
        name: reference.name.clone().unwrap_or_default(),
        namespace: reference.namespace.clone().unwrap_or_default(),
    })
}

/// ControllerPublishVolume for `volume`: the capability from the access modes, volumeMode,
/// fsType (or `default_fstype`) and mount options; `readonly` only when the driver has
/// PUBLISH_READONLY; the volume attributes as context. The secrets and the node ID are the
/// caller's to add: upstream checks the capability first, then reads the Secret, then looks
/// up the node ID, and a VolumeAttachment with several faults reports the first.
pub fn publish_request(
    volume: &AttachedVolume,
    default_fstype: &str,
    support: DriverSupport,
) -> Result<csi::ControllerPublishVolumeRequest, AttachError> {
    let mode = volume_access_mode(&volume.access_modes, support.single_node_multi_writer)?;
    let fs_type = volume
        .csi
        .fs_type
        .clone()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| default_fstype.to_string());
    let kind = AccessKind::from_volume_mode(
        volume.volume_mode.as_deref(),
        fs_type,
        volume.mount_options.clone(),
    );
    Ok(csi::ControllerPublishVolumeRequest {
        volume_id: volume.csi.volume_handle.clone(),
        node_id: String::new(),
        volume_capability: Some(volume_capability(&kind, mode)),
        readonly: support.publish_readonly && volume.csi.read_only == Some(true),
        secrets: HashMap::new(),
        volume_context: volume
            .csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    })
}

/// JSON patch ops (RFC 6902) that add our finalizer and the node-ID annotation in one write
/// (after every check passed, so a failing VolumeAttachment never blocks its own deletion);
/// `None` when both are in place. The finalizer list is guarded by a `test` of what we read,
/// so a finalizer someone else changed meanwhile fails the patch instead of being lost.
pub fn claim_patch(va: &CachedAttachment, finalizer: &str, node_id: &str) -> Option<Value> {
    let mut ops = Vec::new();
    match &va.metadata.finalizers {
        Some(list) if list.iter().any(|f| f == finalizer) => {}
        Some(list) => ops.extend([
            json!({"op": "test", "path": "/metadata/finalizers", "value": list}),
            json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}),
        ]),
        None => ops.extend([
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": va.metadata.resource_version}),
            json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}),
        ]),
    }
    match va.annotations().get(NODE_ID_ANNOTATION) {
        Some(current) if current == node_id => {}
        _ if va.annotations.is_none() => ops.push(
            json!({"op": "add", "path": "/metadata/annotations", "value": {NODE_ID_ANNOTATION: node_id}}),
        ),
        // `/` in a key is `~1` in a JSON pointer.
        _ => ops.push(json!({"op": "add",
            "path": format!("/metadata/annotations/{}", NODE_ID_ANNOTATION.replace('/', "~1")),
            "value": node_id})),
    }
    (!ops.is_empty()).then_some(Value::Array(ops))
}

/// The status merge patch after a successful ControllerPublishVolume: attached, with the
/// publish context kubelet hands to NodeStage/NodePublish, and no error.
pub fn attached_status(publish_context: &HashMap<String, String>) -> Value {
    let metadata = if publish_context.is_empty() {
        Value::Null
    } else {
        json!(publish_context)
    };
    json!({"status": {"attached": true, "attachmentMetadata": metadata, "attachError": null}})
}

/// The status merge patch after a successful ControllerUnpublishVolume.
pub fn detached_status() -> Value {
    json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
}

/// Which call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Attach,
    Detach,
}

/// The status merge patch after a failed call: `attachError` {time, message, errorCode} or
/// `detachError` {time, message} (upstream sets errorCode on attach errors only); `attached`
/// keeps its value.
pub fn error_status(
    operation: Operation,
    attached: bool,
    message: &str,
    code: Option<i32>,
    time: &str,
) -> Value {
    let mut error = json!({"time": time, "message": message});
    match operation {
        Operation::Attach => {
            if let Some(code) = code {
                error["errorCode"] = json!(code);
            }
            json!({"status": {"attached": attached, "attachError": error}})
        }
        Operation::Detach => json!({"status": {"attached": attached, "detachError": error}}),
    }
}

#[cfg(test)]
mod tests;

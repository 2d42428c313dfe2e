//! The pure core of the resizer (external-resizer `pkg/controller/{controller,expand_and_recover,
//! resize_status}.go`, `pkg/resizer`): whether a claim's volume is ours and needs expanding, to
//! which size, the ControllerExpandVolume request, and the merge patches that record each step
//! on the claim's status and on the PV.
//!
//! Two paths, as upstream, chosen by the `RecoverVolumeExpansionFailure` gate (GA, on):
//! - on: [`plan_recovering`] — the size in flight is kept in `status.allocatedResources` and the
//!   step in `status.allocatedResourceStatuses["storage"]` (`ControllerResizeInProgress`,
//!   `ControllerResizeInfeasible`, `NodeResizePending`, …), so a user may lower a request that
//!   failed and the resizer retries the smaller size;
//! - off: [`plan_legacy`] — conditions only.
//!
//! Old API servers: the two fields exist only where the API server's own
//! RecoverVolumeExpansionFailure gate is on (alpha from 1.23, `allocatedResourceStatuses` from
//! 1.28, on by default from 1.32); Kubernetes v1.19 serves neither, and a server that does not
//! keep a field drops it from a patch without an error. Like upstream we write them anyway and
//! read them back as absent, which [`plan_recovering`] handles as upstream does: no status with
//! the PV already expanded means "expand to the request again" (the driver call is idempotent)
//! unless the claim has `FileSystemResizePending`. On such a server the gate so behaves like the
//! legacy path plus two fields nobody keeps. The k8s-openapi types of this workspace (v1_33)
//! have both fields.
//!
//! CSI migration (upstream's `CanSupport` and `Resize` with csi-translation-lib, here
//! [`csi_kinds::migration`]): when the driver is the CSI driver an in-tree plugin migrated to,
//! a PV without `spec.csi` is ours once its claim's `volume.kubernetes.io/storage-resizer` names
//! the driver (the kube-controller-manager's expand controller writes it so); ControllerExpandVolume
//! gets the PV's CSI translation ([`csi_volume`]) and the PV's capacity alone is patched, its
//! in-tree source stays. The secret of ControllerExpandVolume is the PV's
//! `spec.csi.controllerExpandSecretRef`, as upstream: the StorageClass's
//! `csi.storage.k8s.io/controller-expand-secret-*` parameters (templates included) are resolved
//! into that reference by the provisioner when it creates the PV, and the resizer's RBAC has no
//! access to StorageClasses. Guards upstream lacks: a CSI PV is ours only with our driver (upstream
//! also takes another driver's when the annotation names ours), an in-tree PV of another plugin
//! than the driver's is not expanded through it, the pre-resize annotation is removed from
//! our PVs only (upstream removes it from any PV whose claim it syncs), and a driver answering
//! `capacity_bytes: 0` (a required field) leaves the PV at the requested size, not at 0.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi::node_service_capability::rpc::Type as NodeCapability;
use csi_grpc::conn::DriverInfo;
use csi_kinds::capability::{AccessKind, CapabilityError, volume_access_mode, volume_capability};
use csi_kinds::migration::{self, MigrationError, Plugin};
use csi_kinds::secrets::SecretRef;
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use tonic::Code;

/// The resource every size here is of.
const STORAGE: &str = "storage";

/// PV annotation: the claim's capacity before an expansion that still needs the node
/// (gate `AnnotateFsResize`); the PV controller reads it when it binds the claim again.
pub const PRE_RESIZE_CAPACITY_ANNOTATION: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";
/// Claim annotation: the controller finished the expansion and kubelet has nothing to do.
pub const NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: &str =
    "volume.kubernetes.io/node-expansion-not-required";
/// Claim annotation: the resizer that expands the claim's volume. The kube-controller-manager's
/// expand controller writes the CSI driver's name there when the PV is of an in-tree plugin
/// migrated to CSI.
pub const STORAGE_RESIZER_ANNOTATION: &str = "volume.kubernetes.io/storage-resizer";

/// Claim condition types the resizer owns (Kubernetes `PersistentVolumeClaimConditionType`).
pub mod condition {
    pub const RESIZING: &str = "Resizing";
    pub const FILE_SYSTEM_RESIZE_PENDING: &str = "FileSystemResizePending";
    pub const CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
    pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";
    /// Every resize condition: [`super::merge_resize_conditions`] replaces or drops these and
    /// keeps any other.
    pub const ALL: [&str; 4] = [
        RESIZING,
        FILE_SYSTEM_RESIZE_PENDING,
        CONTROLLER_RESIZE_ERROR,
        NODE_RESIZE_ERROR,
    ];
}

/// `status.allocatedResourceStatuses["storage"]` values (Kubernetes `ClaimResourceStatus`).
pub mod resize_status {
    pub const CONTROLLER_RESIZE_IN_PROGRESS: &str = "ControllerResizeInProgress";
    pub const CONTROLLER_RESIZE_INFEASIBLE: &str = "ControllerResizeInfeasible";
    pub const NODE_RESIZE_PENDING: &str = "NodeResizePending";
    pub const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
    pub const NODE_RESIZE_INFEASIBLE: &str = "NodeResizeInfeasible";
}

/// Event reasons (upstream `pkg/util/events.go`).
pub mod reason {
    pub const RESIZING: &str = "Resizing";
    pub const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
    pub const VOLUME_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
    pub const FILE_SYSTEM_RESIZE_REQUIRED: &str = "FileSystemResizeRequired";
}

/// The message of the `FileSystemResizePending` condition.
pub const FS_RESIZE_PENDING_MESSAGE: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

/// How the driver expands volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resizer {
    /// CONTROLLER_SERVICE with EXPAND_VOLUME: ControllerExpandVolume.
    Controller { single_node_multi_writer: bool },
    /// Node expansion only (upstream's "trivial resizer"): no CSI call; the PV takes the
    /// requested size and kubelet expands the volume on the node.
    NodeOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SupportError {
    #[error("CSI driver does not support controller service")]
    NoControllerService,
    #[error("CSI driver neither supports controller resize nor node resize")]
    NoExpansion,
}

impl Resizer {
    /// From the driver's capabilities; `driver.node` must hold its node capabilities when it
    /// has no EXPAND_VOLUME controller capability (upstream asks the node service only then).
    pub fn of(driver: &DriverInfo) -> Result<Self, SupportError> {
        if !driver.plugin.controller_service {
            return Err(SupportError::NoControllerService);
        }
        if driver.has_controller(ControllerCapability::ExpandVolume) {
            return Ok(Self::Controller {
                single_node_multi_writer: driver
                    .has_controller(ControllerCapability::SingleNodeMultiWriter),
            });
        }
        if driver.has_node(NodeCapability::ExpandVolume) {
            return Ok(Self::NodeOnly);
        }
        Err(SupportError::NoExpansion)
    }

    /// Whether the driver expands on the controller (upstream `DriverSupportsControlPlaneExpansion`).
    pub fn on_controller(self) -> bool {
        matches!(self, Self::Controller { .. })
    }
}

/// What to do with one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Not asking for more, not bound to its PV, another driver's, or waiting for kubelet.
    Nothing,
    /// The size last tried was infeasible and the claim still asks for it: try again after
    /// this long (upstream's slow set, `--retry-interval-max` after the failure).
    RetryLater(Duration),
    Expand(Expansion),
}

/// An expansion to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expansion {
    /// The size to ask the driver for.
    pub bytes: i64,
    /// Write `allocatedResourceStatuses` and drop old resize conditions (false when the same
    /// size is retried: what the status says stays).
    pub update_status: bool,
}

/// What the controller remembers about a claim between syncs (upstream's `finalErrorPVCs` and
/// slow set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// The last ControllerExpandVolume failed with a final error: the driver is not working on
    /// the size in `allocatedResources` any more.
    pub final_error: bool,
    /// Time left before an infeasible size may be tried again.
    pub infeasible_wait: Option<Duration>,
}

fn storage(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Option<i64> {
    map?.get(STORAGE)
        .and_then(|q| csi_kinds::quantity::bytes(&q.0).ok())
}

/// `spec.resources.requests.storage` in bytes (0 when absent).
pub fn requested(pvc: &PersistentVolumeClaim) -> i64 {
    let requests = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.as_ref());
    storage(requests).unwrap_or(0)
}

/// `status.capacity.storage` in bytes (0 when absent).
pub fn claim_capacity(pvc: &PersistentVolumeClaim) -> i64 {
    storage(pvc.status.as_ref().and_then(|s| s.capacity.as_ref())).unwrap_or(0)
}

/// `status.allocatedResources.storage` in bytes.
pub fn allocated(pvc: &PersistentVolumeClaim) -> Option<i64> {
    storage(
        pvc.status
            .as_ref()
            .and_then(|s| s.allocated_resources.as_ref()),
    )
}

/// `status.allocatedResourceStatuses.storage`.
pub fn resize_status(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status
        .as_ref()?
        .allocated_resource_statuses
        .as_ref()?
        .get(STORAGE)
        .map(String::as_str)
}

/// `spec.capacity.storage` of the PV in bytes (0 when absent).
pub fn volume_capacity(pv: &PersistentVolume) -> i64 {
    storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())).unwrap_or(0)
}

/// Whether the claim is a Bound claim asking for more than it has (upstream `pvcNeedResize`).
pub fn claim_needs_resize(pvc: &PersistentVolumeClaim) -> bool {
    let status = pvc.status.as_ref();
    let bound = status.and_then(|s| s.phase.as_deref()) == Some("Bound");
    let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    bound && volume.is_some_and(|v| !v.is_empty()) && requested(pvc) > claim_capacity(pvc)
}

/// Whether `pv` is a CSI volume of `driver`.
pub fn is_ours(pv: &PersistentVolume, driver: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == driver)
}

/// Whether this resizer expands `pv` for `pvc` (upstream `CanSupport`): a CSI volume of `driver`,
/// or (CSI migration) a PV without CSI source whose claim's storage-resizer annotation names
/// `driver` when `driver` is the CSI driver of an in-tree plugin.
pub fn can_support(pvc: &PersistentVolumeClaim, pv: &PersistentVolume, driver: &str) -> bool {
    match pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        Some(csi) => csi.driver == driver,
        None => {
            Plugin::for_driver(driver).is_some()
                && pvc
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(STORAGE_RESIZER_ANNOTATION))
                    .is_some_and(|resizer| resizer == driver)
        }
    }
}

/// Whether `pv` is bound to this very claim (namespace and UID of its `claimRef`).
fn bound_to(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.namespace == pvc.metadata.namespace && r.uid.is_some() && r.uid == pvc.metadata.uid
        })
}

fn has_condition(pvc: &PersistentVolumeClaim, kind: &str) -> bool {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

/// The legacy plan (gate off, upstream `pvNeedResize`): expand to the request, unless the PV
/// already has it and kubelet's file system resize is pending.
pub fn plan_legacy(pvc: &PersistentVolumeClaim, pv: &PersistentVolume, driver: &str) -> Plan {
    if !claim_needs_resize(pvc) || !can_support(pvc, pv, driver) || !bound_to(pv, pvc) {
        return Plan::Nothing;
    }
    let request = requested(pvc);
    if volume_capacity(pv) >= request && has_condition(pvc, condition::FILE_SYSTEM_RESIZE_PENDING) {
        return Plan::Nothing;
    }
    Plan::Expand(Expansion {
        bytes: request,
        update_status: true,
    })
}

/// The recovering plan (gate on, upstream `expandAndRecover`): the size to expand to follows
/// the step recorded in `allocatedResourceStatuses`, so an expansion in flight finishes before
/// another starts, and a failed one may be retried at the (lowered) request.
pub fn plan_recovering(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    driver: &str,
    resizer: Resizer,
    memory: Memory,
) -> Plan {
    use resize_status::*;
    if !claim_needs_resize(pvc) || !can_support(pvc, pv, driver) || !bound_to(pv, pvc) {
        return Plan::Nothing;
    }
    let request = requested(pvc);
    let volume = volume_capacity(pv);
    let allocated = allocated(pvc);
    let status = resize_status(pvc);
    let bytes = if volume < request {
        // The volume is smaller than asked: an expansion in flight finishes first.
        match status {
            Some(NODE_RESIZE_INFEASIBLE) => allocated.unwrap_or(request),
            Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS) => {
                let size = allocated.unwrap_or(request);
                if volume >= size {
                    return Plan::Nothing;
                }
                size
            }
            // In progress: the last call may still be under way in the driver, unless it ended
            // with a final error.
            Some(CONTROLLER_RESIZE_IN_PROGRESS) if memory.final_error => request,
            Some(CONTROLLER_RESIZE_IN_PROGRESS) => allocated.unwrap_or(request),
            _ => request,
        }
    } else {
        // The volume has the size already.
        match status {
            // kubelet's turn.
            Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS) => return Plan::Nothing,
            // kubelet failed: reset the status so it may retry.
            Some(NODE_RESIZE_INFEASIBLE) => match allocated {
                Some(size) if resizer.on_controller() => size,
                _ => request,
            },
            // Our record of the expansion was not written, or the request was lowered.
            Some(CONTROLLER_RESIZE_IN_PROGRESS | CONTROLLER_RESIZE_INFEASIBLE) => {
                allocated.unwrap_or(request)
            }
            None if allocated.is_some() => allocated.unwrap_or(request),
            // No status kept: an API server without the fields (see the module doc).
            _ if has_condition(pvc, condition::FILE_SYSTEM_RESIZE_PENDING) => {
                return Plan::Nothing;
            }
            _ => request,
        }
    };
    let same_size = allocated == Some(bytes);
    if same_size && let Some(wait) = memory.infeasible_wait {
        return Plan::RetryLater(wait);
    }
    Plan::Expand(Expansion {
        bytes,
        update_status: !same_size,
    })
}

/// Whether a PV annotated with its claim's old capacity has finished node expansion (the
/// claim's capacity reached the PV's), so the annotation can go.
pub fn pre_resize_annotation_done(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    pv.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PRE_RESIZE_CAPACITY_ANNOTATION))
        && claim_capacity(pvc) >= volume_capacity(pv)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("empty volume handle")]
    EmptyVolumeHandle,
    #[error("volume {0} is not migrated to CSI")]
    NotCsi(String),
    #[error("failed to translate persistent volume: {0}")]
    Translate(#[from] MigrationError),
    #[error(
        "failed to translate persistent volume: could not find in-tree plugin translation logic for {0:?}"
    )]
    NoTranslation(String),
    #[error(
        "failed to translate persistent volume: {volume:?} is a {plugin} volume, which did not migrate to {driver}"
    )]
    OtherPlugin {
        volume: String,
        plugin: &'static str,
        driver: String,
    },
    #[error("failed to get capabilities of volume {volume} with {source}")]
    Capability {
        volume: String,
        source: CapabilityError,
    },
}

/// `pv` as the CSI volume of `driver` ControllerExpandVolume is for (upstream `Resize`): a CSI PV
/// as it is; an in-tree PV of the plugin `driver` migrated from as csi-translation-lib
/// translates it. Any other PV has no CSI form for this driver.
pub fn csi_volume<'a>(
    pv: &'a PersistentVolume,
    driver: &str,
) -> Result<Cow<'a, PersistentVolume>, RequestError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let Some(spec) = pv.spec.as_ref().filter(|s| s.csi.is_none()) else {
        return Ok(Cow::Borrowed(pv));
    };
    let Some(ours) = Plugin::for_driver(driver) else {
        return Err(RequestError::NotCsi(name));
    };
    match Plugin::of_spec(spec) {
        None => Err(RequestError::NoTranslation(name)),
        Some(plugin) if plugin != ours => Err(RequestError::OtherPlugin {
            volume: name,
            plugin: plugin.in_tree_name(),
            driver: driver.to_string(),
        }),
        Some(_) => migration::in_tree_to_csi(pv)?
            .map(Cow::Owned)
            .ok_or(RequestError::NoTranslation(name)),
    }
}

/// The secret ControllerExpandVolume needs: the PV's `controllerExpandSecretRef`.
pub fn expand_secret(pv: &PersistentVolume) -> Option<SecretRef> {
    let reference = pv
        .spec
        .as_ref()?
        .csi
        .as_ref()?
        .controller_expand_secret_ref
        .as_ref()?;
    Some(SecretRef {
        name: reference.name.clone().unwrap_or_default(),
        namespace: reference.namespace.clone().unwrap_or_default(),
    })
}

/// ControllerExpandVolume for `pv` to `bytes`: the capability from the PV's access modes,
/// volumeMode, fsType and mount options (upstream `GetVolumeCapabilities`).
pub fn expand_request(
    pv: &PersistentVolume,
    bytes: i64,
    single_node_multi_writer: bool,
    secrets: HashMap<String, String>,
) -> Result<csi::ControllerExpandVolumeRequest, RequestError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let source = spec
        .and_then(|s| s.csi.as_ref())
        .ok_or_else(|| RequestError::NotCsi(name.clone()))?;
    if source.volume_handle.is_empty() {
        return Err(RequestError::EmptyVolumeHandle);
    }
    let modes = spec
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    let mode = volume_access_mode(&modes, single_node_multi_writer).map_err(|source| {
        RequestError::Capability {
            volume: name,
            source,
        }
    })?;
    let kind = AccessKind::from_volume_mode(
        spec.and_then(|s| s.volume_mode.as_deref()),
        source.fs_type.clone().unwrap_or_default(),
        spec.and_then(|s| s.mount_options.clone())
            .unwrap_or_default(),
    );
    Ok(csi::ControllerExpandVolumeRequest {
        volume_id: source.volume_handle.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        secrets,
        volume_capability: Some(volume_capability(&kind, mode)),
    })
}

/// The size a volume has after ControllerExpandVolume answered `capacity_bytes` for a request
/// of `requested`: the answer, unless the driver left that required field 0 (which must not
/// shrink the PV to nothing).
pub fn expanded_size(capacity_bytes: i64, requested: i64) -> i64 {
    if capacity_bytes > 0 {
        capacity_bytes
    } else {
        requested
    }
}

/// How a failed ControllerExpandVolume counts (upstream `pkg/util` and `inUseError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureKind {
    /// The operation is certainly not running in the driver any more.
    pub final_error: bool,
    /// Final, and the size cannot be had (InvalidArgument, OutOfRange, NotFound).
    pub infeasible: bool,
    /// FailedPrecondition: the driver cannot expand the volume while it is in use.
    pub in_use: bool,
}

impl FailureKind {
    /// `None` for a failure before any CSI call (never final: be on the safe side).
    pub fn of(code: Option<Code>) -> Self {
        let Some(code) = code else {
            return Self {
                final_error: false,
                infeasible: false,
                in_use: false,
            };
        };
        let final_error = csi_grpc::conn::is_final_error(code);
        Self {
            final_error,
            infeasible: matches!(
                code,
                Code::InvalidArgument | Code::OutOfRange | Code::NotFound
            ),
            in_use: code == Code::FailedPrecondition,
        }
    }
}

/// A claim condition of `kind`, status True, at `now`.
pub fn new_condition(
    kind: &str,
    message: Option<String>,
    now: &Time,
) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition {
        type_: kind.to_string(),
        status: "True".to_string(),
        last_transition_time: Some(now.clone()),
        message,
        ..PersistentVolumeClaimCondition::default()
    }
}

/// Upstream `MergeResizeConditionsOfPVC`: conditions of other kinds stay; a resize condition in
/// `new` replaces the old one of its kind; other old resize conditions stay only when
/// `keep_old`; the rest of `new` is appended.
pub fn merge_resize_conditions(
    old: &[PersistentVolumeClaimCondition],
    new: Vec<PersistentVolumeClaimCondition>,
    keep_old: bool,
) -> Vec<PersistentVolumeClaimCondition> {
    let mut new = new;
    let mut merged = Vec::new();
    for condition in old {
        if !condition::ALL.contains(&condition.type_.as_str()) {
            merged.push(condition.clone());
        } else if let Some(at) = new.iter().position(|n| n.type_ == condition.type_) {
            merged.push(new.remove(at));
        } else if keep_old {
            merged.push(condition.clone());
        }
    }
    merged.extend(new);
    merged
}

fn conditions_of(pvc: &PersistentVolumeClaim) -> &[PersistentVolumeClaimCondition] {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

fn conditions_value(conditions: Vec<PersistentVolumeClaimCondition>) -> Value {
    // An empty list clears the field, as Go's omitempty does.
    if conditions.is_empty() {
        Value::Null
    } else {
        json!(conditions)
    }
}

/// Whether the claim carries [`NODE_EXPANSION_NOT_REQUIRED_ANNOTATION`].
fn has_annotation(pvc: &PersistentVolumeClaim, key: &str) -> bool {
    pvc.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// Which path a status patch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Legacy,
    Recovering,
}

/// The claim status merge patch before the driver is called: `Resizing`, and on the recovering
/// path the size in `allocatedResources`, `ControllerResizeInProgress` (when the status is
/// updated) and no node-expansion-not-required annotation. Guarded by the claim's
/// resourceVersion (a conflict retries the sync).
pub fn in_progress_patch(
    pvc: &PersistentVolumeClaim,
    path: Path,
    expansion: Expansion,
    now: &Time,
) -> Value {
    let keep_old = path == Path::Recovering && !expansion.update_status;
    let conditions = merge_resize_conditions(
        conditions_of(pvc),
        vec![new_condition(condition::RESIZING, None, now)],
        keep_old,
    );
    let mut patch = json!({
        "metadata": {"resourceVersion": pvc.metadata.resource_version},
        "status": {"conditions": conditions_value(conditions)},
    });
    if path == Path::Recovering {
        patch["status"]["allocatedResources"] =
            json!({STORAGE: csi_kinds::quantity::binary_si(expansion.bytes)});
        if expansion.update_status {
            patch["status"]["allocatedResourceStatuses"] =
                json!({STORAGE: resize_status::CONTROLLER_RESIZE_IN_PROGRESS});
        }
        drop_not_required_annotation(pvc, &mut patch);
    }
    patch
}

fn drop_not_required_annotation(pvc: &PersistentVolumeClaim, patch: &mut Value) {
    if has_annotation(pvc, NODE_EXPANSION_NOT_REQUIRED_ANNOTATION) {
        patch["metadata"]["annotations"] = json!({NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: null});
    }
}

/// The claim status merge patch after an expansion that kubelet must finish on the node:
/// `FileSystemResizePending`, and on the recovering path `NodeResizePending`.
pub fn node_expansion_pending_patch(pvc: &PersistentVolumeClaim, path: Path, now: &Time) -> Value {
    let conditions = merge_resize_conditions(
        conditions_of(pvc),
        vec![new_condition(
            condition::FILE_SYSTEM_RESIZE_PENDING,
            Some(FS_RESIZE_PENDING_MESSAGE.to_string()),
            now,
        )],
        path == Path::Recovering,
    );
    let mut patch = json!({
        "metadata": {"resourceVersion": pvc.metadata.resource_version},
        "status": {"conditions": conditions_value(conditions)},
    });
    if path == Path::Recovering {
        patch["status"]["allocatedResourceStatuses"] =
            json!({STORAGE: resize_status::NODE_RESIZE_PENDING});
        drop_not_required_annotation(pvc, &mut patch);
    }
    patch
}

/// The claim status merge patch after an expansion that needs nothing from the node: the new
/// capacity, no resize conditions, and on the recovering path no storage status and the
/// node-expansion-not-required annotation (so kubelet does not expand again).
pub fn finished_patch(pvc: &PersistentVolumeClaim, path: Path, bytes: i64) -> Value {
    let conditions = merge_resize_conditions(conditions_of(pvc), Vec::new(), false);
    let mut patch = json!({
        "metadata": {"resourceVersion": pvc.metadata.resource_version},
        "status": {
            "capacity": {STORAGE: csi_kinds::quantity::binary_si(bytes)},
            "conditions": conditions_value(conditions),
        },
    });
    if path == Path::Recovering {
        // Without other resources the field goes, as upstream leaves it nil.
        let others = pvc
            .status
            .as_ref()
            .and_then(|s| s.allocated_resource_statuses.as_ref())
            .is_some_and(|statuses| statuses.keys().any(|k| k != STORAGE));
        patch["status"]["allocatedResourceStatuses"] = if others {
            json!({STORAGE: null})
        } else {
            Value::Null
        };
        if !has_annotation(pvc, NODE_EXPANSION_NOT_REQUIRED_ANNOTATION) {
            patch["metadata"]["annotations"] =
                json!({NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: "true"});
        }
    }
    patch
}

/// The claim status merge patch after a final failure on the recovering path:
/// `ControllerResizeError` with the message, and `ControllerResizeInfeasible` when the size
/// cannot be had. Not guarded by the resourceVersion, as upstream: the failure must be recorded
/// even if our copy of the claim is a little old.
pub fn failed_patch(
    pvc: &PersistentVolumeClaim,
    infeasible: bool,
    error: &str,
    now: &Time,
) -> Value {
    let conditions = merge_resize_conditions(
        conditions_of(pvc),
        vec![new_condition(
            condition::CONTROLLER_RESIZE_ERROR,
            Some(format!("failed to expand pvc with {error}")),
            now,
        )],
        true,
    );
    let mut patch = json!({"status": {"conditions": conditions_value(conditions)}});
    if infeasible {
        patch["status"]["allocatedResourceStatuses"] =
            json!({STORAGE: resize_status::CONTROLLER_RESIZE_INFEASIBLE});
    }
    patch
}

/// The PV merge patch after an expansion: the new capacity, and (gate `AnnotateFsResize`, node
/// expansion required) the claim's capacity before it, unless already annotated.
pub fn volume_patch(
    pv: &PersistentVolume,
    claim_capacity: &str,
    bytes: i64,
    node_expansion_required: bool,
    annotate: bool,
) -> Value {
    let mut patch = json!({"spec": {"capacity": {STORAGE: csi_kinds::quantity::binary_si(bytes)}}});
    let annotated = pv
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PRE_RESIZE_CAPACITY_ANNOTATION));
    if annotate && node_expansion_required && !annotated {
        patch["metadata"] =
            json!({"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: claim_capacity}});
    }
    patch
}

/// The PV merge patch that removes the pre-resize capacity annotation.
pub fn remove_pre_resize_annotation_patch() -> Value {
    json!({"metadata": {"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: null}}})
}

/// The claim's `status.capacity.storage` as written (`0` when absent, as Go prints a zero
/// quantity), for the pre-resize annotation.
pub fn claim_capacity_text(pvc: &PersistentVolumeClaim) -> String {
    pvc.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get(STORAGE))
        .map_or_else(|| "0".to_string(), |q| q.0.clone())
}

#[cfg(test)]
mod tests;

//! The snapshot-controller's pure core (external-snapshotter `pkg/common-controller`): the next
//! step for one VolumeSnapshot, for one VolumeSnapshotContent, and whether a source claim's
//! protection can go. One step per sync: the adapter ([`crate::common`]) acts, and the watch
//! bringing its write syncs the object again, so every step plans from what the API holds.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;

use crate::distributed::{self, MANAGED_BY_LABEL, Placement};
use crate::group::owning_group;
use crate::secrets::{SNAPSHOTTER, secret_reference};
use csi_kinds::groupsnapshot::IN_GROUP_FINALIZER;
use csi_kinds::snapshot::{
    BEING_DELETED, CONTENT_BOUND_FINALIZER, DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE,
    DeletionPolicy, PVC_AS_SOURCE_FINALIZER, SNAPSHOT_AS_SOURCE_FINALIZER,
    SNAPSHOT_BOUND_FINALIZER, SnapshotError, SnapshotReference, VolumeSnapshot,
    VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentSource,
    VolumeSnapshotContentSpec, VolumeSnapshotStatus, snapshot_key,
};

/// Event reasons (upstream's).
pub mod reason {
    pub const CREATING_SNAPSHOT: &str = "CreatingSnapshot";
    pub const SNAPSHOT_CREATED: &str = "SnapshotCreated";
    pub const SNAPSHOT_READY: &str = "SnapshotReady";
    pub const GET_SNAPSHOT_CLASS_FAILED: &str = "GetSnapshotClassFailed";
    pub const SET_DEFAULT_CLASS_FAILED: &str = "SetDefaultSnapshotClassFailed";
    pub const VALIDATION_ERROR: &str = "SnapshotValidationError";
    pub const CONTENT_MISSING: &str = "SnapshotContentMissing";
    pub const CONTENT_MISMATCH: &str = "SnapshotContentMismatch";
    pub const CONTENT_MISBOUND: &str = "SnapshotContentMisbound";
    pub const MISBOUND: &str = "SnapshotMisbound";
    pub const BIND_FAILED: &str = "SnapshotBindFailed";
    pub const HANDLE_SET: &str = "SnapshotHandleSet";
    pub const PVC_SOURCE_MISSING: &str = "SnapshotPVCSourceMissing";
    pub const CONTENT_CREATION_FAILED: &str = "SnapshotContentCreationFailed";
    pub const CREATE_CONTENT_FAILED: &str = "CreateSnapshotContentFailed";
    pub const STATUS_UPDATE_FAILED: &str = "SnapshotStatusUpdateFailed";
    pub const FINALIZER_ERROR: &str = "SnapshotFinalizerError";
    pub const DELETE_PENDING: &str = "SnapshotDeletePending";
    pub const CONTENT_DELETE_ERROR: &str = "SnapshotContentObjectDeleteError";
    pub const CONTENT_VALIDATION_ERROR: &str = "ContentValidationError";
    pub const PVC_FINALIZER_ERROR: &str = "ErrorPVCFinalizer";
}

const SNAPSHOT_API_VERSION: &str = "snapshot.storage.k8s.io/v1";

/// A failed step: a Warning Event and, when `status` is set, the snapshot's `status.error`
/// (with `readyToUse: false` when it is `Some(true)`); then the sync is retried with backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
    pub status: Option<bool>,
}

impl Failure {
    fn status(reason: &'static str, message: impl Into<String>, ready_false: bool) -> Self {
        Failure {
            reason,
            message: message.into(),
            status: Some(ready_false),
        }
    }

    /// A dynamic snapshot's content could not be made: its claim not protected, its inputs
    /// wrong, or the content refused (upstream `createSnapshotContent`'s errors).
    pub fn content_creation(error: impl std::fmt::Display) -> Self {
        Failure::status(
            reason::CONTENT_CREATION_FAILED,
            format!("Failed to create snapshot content with error {error}"),
            true,
        )
    }
}

/// A status that records failures: a VolumeSnapshot's or a VolumeGroupSnapshot's.
pub trait FailureStatus: Clone + Default {
    fn error_mut(&mut self) -> &mut Option<SnapshotError>;
    fn ready_mut(&mut self) -> &mut Option<bool>;
    fn recorded_error(&self) -> Option<&str>;
}

impl FailureStatus for VolumeSnapshotStatus {
    fn error_mut(&mut self) -> &mut Option<SnapshotError> {
        &mut self.error
    }
    fn ready_mut(&mut self) -> &mut Option<bool> {
        &mut self.ready_to_use
    }
    fn recorded_error(&self) -> Option<&str> {
        self.error.as_ref()?.message.as_deref()
    }
}

impl FailureStatus for csi_kinds::groupsnapshot::VolumeGroupSnapshotStatus {
    fn error_mut(&mut self) -> &mut Option<SnapshotError> {
        &mut self.error
    }
    fn ready_mut(&mut self) -> &mut Option<bool> {
        &mut self.ready_to_use
    }
    fn recorded_error(&self) -> Option<&str> {
        self.error.as_ref()?.message.as_deref()
    }
}

/// What recording a [`Failure`] writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Recording<S> {
    /// An Event only (upstream records no status for this failure).
    EventOnly,
    /// The same message is recorded already: no write, no Event.
    Recorded,
    /// This status, then the Event.
    Status(S),
}

impl Failure {
    /// What recording this failure on an object whose status is `old` writes (upstream
    /// `updateSnapshotErrorStatusWithEvent` and its group twin).
    pub fn recording<S: FailureStatus>(&self, old: Option<&S>, now: Time) -> Recording<S> {
        let Some(ready_false) = self.status else {
            return Recording::EventOnly;
        };
        if old.and_then(|s| s.recorded_error()) == Some(self.message.as_str()) {
            return Recording::Recorded;
        }
        let mut status = old.cloned().unwrap_or_default();
        *status.error_mut() = Some(SnapshotError {
            time: Some(now),
            message: Some(self.message.clone()),
        });
        if ready_false {
            *status.ready_mut() = Some(false);
        }
        Recording::Status(status)
    }
}

/// Upstream's `newControllerUpdateError`: how a refused write of `object` reads in Events,
/// `status.error` and logs.
pub fn controller_update_error(
    object: impl std::fmt::Display,
    cause: impl std::fmt::Display,
) -> String {
    format!("snapshot controller failed to update {object} on API server: {cause}")
}

/// The next step for a VolumeSnapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Nothing,
    Fail(Failure),
    /// The content the snapshot names is not one it may bind (upstream's
    /// `checkandAddSnapshotFinalizers` failing): `failure` is reported as [`Step::Fail`]'s,
    /// then, on every sync, a `SnapshotFinalizerError` Event quotes `error`.
    RefuseContent {
        failure: Failure,
        error: String,
    },
    /// Tell the sidecar the snapshot is going (annotation on the content).
    MarkContentBeingDeleted(String),
    DeleteContent(String),
    RemoveFinalizers {
        source: bool,
        bound: bool,
        /// A group member's `volumesnapshot-in-group-protection`.
        in_group: bool,
    },
    /// Record the default class of the source volume's driver in the snapshot's spec.
    SetClass(String),
    AddFinalizers {
        source: bool,
        bound: bool,
    },
    /// Bind a pre-provisioned content: its `volumeSnapshotRef.uid` (and class).
    Bind {
        content: String,
        uid: String,
        class: Option<String>,
    },
    /// Keep the source claim while the snapshot is cut.
    ProtectClaim(String),
    /// Create the content, labelled with its node when `placement` names one.
    CreateContent {
        content: Box<VolumeSnapshotContent>,
        placement: Placement,
    },
    UpdateStatus {
        status: Box<VolumeSnapshotStatus>,
        events: Vec<(&'static str, String)>,
    },
}

/// What a VolumeSnapshot's step is planned from, read from the caches.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The content named by [`content_name`].
    pub content: Option<&'a VolumeSnapshotContent>,
    /// The source claim (dynamic snapshots) and its volume.
    pub claim: Option<&'a PersistentVolumeClaim>,
    pub volume: Option<&'a PersistentVolume>,
    pub classes: &'a [&'a VolumeSnapshotClass],
    /// A Pending claim in the namespace is being restored from the snapshot.
    pub restoring: bool,
    /// `--prevent-volume-mode-conversion`: record the source's volume mode on the content.
    pub prevent_volume_mode_conversion: bool,
    /// The snapshot is a member of a VolumeGroupSnapshot that exists and is not being
    /// deleted: only the group's deletion deletes it (a group being deleted deletes its members).
    pub held_by_group: bool,
    /// `--enable-distributed-snapshotting`: the cluster's Nodes, to label a new content with
    /// the node of its node-local volume ([`crate::distributed`]); `None` when off.
    pub nodes: Option<&'a [&'a Node]>,
}

fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

fn has_annotation(meta: &ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// `snapcontent-<snapshot UID>`.
pub fn dynamic_content_name(snapshot: &VolumeSnapshot) -> String {
    format!("snapcontent-{}", snapshot.uid().unwrap_or_default())
}

fn bound_content_name(snapshot: &VolumeSnapshot) -> Option<&str> {
    snapshot
        .status
        .as_ref()?
        .bound_volume_snapshot_content_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

fn is_ready(snapshot: &VolumeSnapshot) -> bool {
    snapshot
        .status
        .as_ref()
        .and_then(|s| s.ready_to_use)
        .unwrap_or(false)
}

/// The content a snapshot's sync reads: the bound one while it is deleted, else the one its
/// source names (pre-provisioned) or implies (dynamic; a group member's is named as the member
/// is, `snapcontent-` for `snapshot-`).
pub fn content_name(snapshot: &VolumeSnapshot) -> Option<String> {
    if snapshot.metadata.deletion_timestamp.is_some()
        && let Some(name) = bound_content_name(snapshot)
    {
        return Some(name.to_string());
    }
    if owning_group(snapshot).is_some()
        && snapshot.spec.source.volume_snapshot_content_name.is_none()
    {
        return bound_content_name(snapshot)
            .map(str::to_string)
            .or_else(|| {
                let name = snapshot.metadata.name.as_deref()?;
                Some(format!("snapcontent-{}", name.strip_prefix("snapshot-")?))
            });
    }
    let source = &snapshot.spec.source;
    match (
        &source.volume_snapshot_content_name,
        &source.persistent_volume_claim_name,
    ) {
        (Some(name), _) => Some(name.clone()),
        (None, Some(_)) => Some(dynamic_content_name(snapshot)),
        (None, None) => None,
    }
}

/// Whether `content` points back at `snapshot` (name, namespace and UID).
pub fn refers_to(content: &VolumeSnapshotContent, snapshot: &VolumeSnapshot) -> bool {
    let reference = &content.spec.volume_snapshot_ref;
    reference.name == snapshot.metadata.name
        && reference.namespace == snapshot.metadata.namespace
        && reference.uid.is_some()
        && reference.uid == snapshot.metadata.uid
}

/// A snapshot being deleted that still holds one of our finalizers.
pub fn is_deletion_candidate(snapshot: &VolumeSnapshot) -> bool {
    snapshot.metadata.deletion_timestamp.is_some()
        && [
            SNAPSHOT_AS_SOURCE_FINALIZER,
            SNAPSHOT_BOUND_FINALIZER,
            IN_GROUP_FINALIZER,
        ]
        .iter()
        .any(|f| has_finalizer(&snapshot.metadata, f))
}

/// Upstream `syncSnapshot` (with the class check that precedes it).
pub fn plan(snapshot: &VolumeSnapshot, inputs: &Inputs<'_>) -> Step {
    if snapshot.metadata.deletion_timestamp.is_some() {
        return deletion(snapshot, inputs);
    }
    let source = &snapshot.spec.source;
    let dynamic = source.volume_snapshot_content_name.is_none();
    // A group member is cut with its group: no class, no claim protection, no content of its
    // own making, and no bound finalizer (its content goes with the group).
    let member = owning_group(snapshot).is_some();
    match &snapshot.spec.volume_snapshot_class_name {
        Some(name)
            if !inputs
                .classes
                .iter()
                .any(|c| c.metadata.name.as_ref() == Some(name)) =>
        {
            return Step::Fail(Failure::status(
                reason::GET_SNAPSHOT_CLASS_FAILED,
                format!(
                    "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io \"{name}\" not found"
                ),
                false,
            ));
        }
        None if dynamic && source.persistent_volume_claim_name.is_some() && !member => {
            return match default_class(snapshot, inputs) {
                Ok(name) => Step::SetClass(name),
                Err(error) => Step::Fail(Failure::status(
                    reason::SET_DEFAULT_CLASS_FAILED,
                    format!("Failed to set default snapshot class with error {error}"),
                    false,
                )),
            };
        }
        _ => {}
    }
    if source.persistent_volume_claim_name.is_some()
        == source.volume_snapshot_content_name.is_some()
    {
        return Step::Fail(Failure::status(
            reason::VALIDATION_ERROR,
            "Exactly one of PersistentVolumeClaimName and VolumeSnapshotContentName should be specified",
            true,
        ));
    }
    let content = match checked_content(snapshot, inputs.content) {
        Ok(content) => content,
        Err((failure, error)) => return Step::RefuseContent { failure, error },
    };
    let source_finalizer = !has_finalizer(&snapshot.metadata, SNAPSHOT_AS_SOURCE_FINALIZER);
    let bound_finalizer = !member
        && content.is_some_and(|c| c.spec.deletion_policy == DeletionPolicy::Delete)
        && bound_content_name(snapshot).is_some()
        && !has_finalizer(&snapshot.metadata, SNAPSHOT_BOUND_FINALIZER);
    if source_finalizer || bound_finalizer {
        return Step::AddFinalizers {
            source: source_finalizer,
            bound: bound_finalizer,
        };
    }
    if !is_ready(snapshot) || bound_content_name(snapshot).is_none() {
        return unready(snapshot, content, inputs);
    }
    match content {
        None => Step::Fail(Failure::status(
            reason::CONTENT_MISSING,
            "VolumeSnapshotContent is missing",
            true,
        )),
        Some(content) if !refers_to(content, snapshot) => Step::Fail(Failure::status(
            reason::MISBOUND,
            "VolumeSnapshotContent is not bound to the VolumeSnapshot correctly",
            true,
        )),
        Some(_) => Step::Nothing,
    }
}

/// The content the snapshot's source names, checked to be of the right kind and to point back
/// (upstream `get{Preprovisioned,DynamicallyProvisioned}ContentFromStore`); a refusal is the
/// snapshot's failure and the error upstream returns with it.
fn checked_content<'a>(
    snapshot: &VolumeSnapshot,
    content: Option<&'a VolumeSnapshotContent>,
) -> Result<Option<&'a VolumeSnapshotContent>, (Failure, String)> {
    let Some(content) = content else {
        return Ok(None);
    };
    let name = content.name_any();
    let reference = &content.spec.volume_snapshot_ref;
    let pre_provisioned = snapshot.spec.source.volume_snapshot_content_name.is_some();
    let misbound = || {
        let message = format!("VolumeSnapshotContent [{name}] is bound to a different snapshot");
        (
            Failure::status(reason::CONTENT_MISBOUND, message.clone(), true),
            message,
        )
    };
    let mismatch = |message: String, expected: &str, found: &str| {
        (
            Failure::status(reason::CONTENT_MISMATCH, message, true),
            format!(
                "snapshot {} expects a {expected} VolumeSnapshotContent {name} but gets a {found} one",
                snapshot_key(snapshot)
            ),
        )
    };
    let same_object = reference.name == snapshot.metadata.name
        && reference.namespace == snapshot.metadata.namespace;
    if pre_provisioned {
        if content.spec.source.snapshot_handle.is_none() {
            return Err(mismatch(
                "VolumeSnapshotContent is dynamically provisioned while expecting a pre-provisioned one".into(),
                "pre-provisioned",
                "dynamically provisioned",
            ));
        }
        let uid = reference.uid.as_deref().unwrap_or("");
        if !same_object || (!uid.is_empty() && Some(uid) != snapshot.metadata.uid.as_deref()) {
            return Err(misbound());
        }
    } else {
        if content.spec.source.volume_handle.is_none() {
            return Err(mismatch(
                format!(
                    "VolumeSnapshotContent {name} is pre-provisioned while expecting a dynamically provisioned one"
                ),
                "dynamically provisioned",
                "pre-provisioned",
            ));
        }
        if !same_object || reference.uid != snapshot.metadata.uid {
            return Err(misbound());
        }
    }
    Ok(Some(content))
}

/// Upstream `syncUnreadySnapshot`.
fn unready(
    snapshot: &VolumeSnapshot,
    content: Option<&VolumeSnapshotContent>,
    inputs: &Inputs<'_>,
) -> Step {
    let key = snapshot_key(snapshot);
    if snapshot.spec.source.volume_snapshot_content_name.is_some() {
        let Some(content) = content else {
            return Step::Fail(Failure::status(
                reason::CONTENT_MISSING,
                "VolumeSnapshotContent is missing",
                true,
            ));
        };
        let reference = &content.spec.volume_snapshot_ref;
        let snapshot_name = snapshot.name_any();
        let uid = reference.uid.as_deref().unwrap_or("");
        if reference.name.as_deref() != Some(snapshot_name.as_str())
            || (!uid.is_empty() && Some(uid) != snapshot.metadata.uid.as_deref())
        {
            return Step::Fail(Failure::status(
                reason::BIND_FAILED,
                format!(
                    "Snapshot failed to bind VolumeSnapshotContent, Could not bind snapshot {snapshot_name} and content {}, the VolumeSnapshotRef does not match",
                    content.name_any()
                ),
                true,
            ));
        }
        if uid.is_empty() || content.spec.volume_snapshot_class_name.is_none() {
            let class = snapshot.spec.volume_snapshot_class_name.clone();
            let wanted_uid = snapshot.uid().unwrap_or_default();
            if uid != wanted_uid
                || (class.is_some() && class != content.spec.volume_snapshot_class_name)
            {
                return Step::Bind {
                    content: content.name_any(),
                    uid: wanted_uid,
                    class,
                };
            }
        }
        return status_step(snapshot, content);
    }
    if let Some(content) = content {
        if content.spec.source.snapshot_handle.is_some() {
            return Step::Fail(Failure::status(
                reason::HANDLE_SET,
                format!(
                    "Snapshot handle should not be set in content {key} for dynamic provisioning"
                ),
                true,
            ));
        }
        return status_step(snapshot, content);
    }
    if owning_group(snapshot).is_some() {
        // Its content comes from the group's sync; its creation syncs this snapshot again.
        return Step::Nothing;
    }
    let Some(claim_name) = &snapshot.spec.source.persistent_volume_claim_name else {
        return Step::Fail(Failure::status(
            reason::PVC_SOURCE_MISSING,
            format!("PVC source for snapshot {key} is missing"),
            true,
        ));
    };
    let creation_failed = |error: String| Step::Fail(Failure::content_creation(error));
    let Some(claim) = inputs.claim else {
        return creation_failed(controller_update_error(
            snapshot.name_any(),
            "cannot get claim from snapshot",
        ));
    };
    // The content's inputs first: a snapshot that cannot get one (a missing class, an unbound
    // claim) does not protect its claim, so it neither holds it nor writes it on each retry.
    let (content, placement) = match new_content(snapshot, inputs) {
        Ok(created) => created,
        Err(error) => {
            return creation_failed(format!(
                "failed to get input parameters to create snapshot {}: {error:?}",
                snapshot.name_any()
            ));
        }
    };
    if claim.metadata.deletion_timestamp.is_some() {
        // Not even while another snapshot's protection holds the claim: its release must not
        // race a cut that starts after it (upstream cuts one here, so a stream of new
        // snapshots keeps the claim Terminating).
        return creation_failed(controller_update_error(
            claim_name,
            "cannot add finalizer on claim because it is being deleted",
        ));
    }
    if !has_finalizer(&claim.metadata, PVC_AS_SOURCE_FINALIZER) {
        return Step::ProtectClaim(claim_name.clone());
    }
    Step::CreateContent {
        content: Box::new(content),
        placement,
    }
}

/// The source claim's bound volume (upstream `getVolumeFromVolumeSnapshot`).
fn source_volume<'a>(
    snapshot: &VolumeSnapshot,
    inputs: &Inputs<'a>,
) -> Result<&'a PersistentVolume, String> {
    let claim_name = snapshot
        .spec
        .source
        .persistent_volume_claim_name
        .clone()
        .unwrap_or_default();
    let Some(claim) = inputs.claim else {
        return Err(format!(
            "failed to retrieve PVC {claim_name} from the lister: \"persistentvolumeclaim \\\"{claim_name}\\\" not found\""
        ));
    };
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(format!(
            "the PVC {claim_name} is not yet bound to a PV, will not attempt to take a snapshot"
        ));
    }
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let Some(volume) = inputs.volume else {
        return Err(format!(
            "failed to retrieve PV {pv_name} from the API server: \"persistentvolumes \\\"{pv_name}\\\" not found\""
        ));
    };
    let bound = volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.name.as_deref() == Some(claim_name.as_str())
                && r.namespace == claim.metadata.namespace
                && (r.uid.as_deref().unwrap_or("").is_empty() || r.uid == claim.metadata.uid)
        });
    if !bound {
        return Err("claim in dataSource not bound or invalid".to_string());
    }
    Ok(volume)
}

fn csi_driver(volume: &PersistentVolume) -> Option<(&str, &str)> {
    let csi = volume.spec.as_ref()?.csi.as_ref()?;
    Some((csi.driver.as_str(), csi.volume_handle.as_str()))
}

/// The one default class of the source volume's driver (upstream `SetDefaultSnapshotClass`).
fn default_class(snapshot: &VolumeSnapshot, inputs: &Inputs<'_>) -> Result<String, String> {
    let volume = source_volume(snapshot, inputs)?;
    let Some((driver, _)) = csi_driver(volume) else {
        return Err(format!(
            "snapshotting non-CSI volumes is not supported, snapshot:{}",
            snapshot_key(snapshot)
        ));
    };
    let defaults: Vec<&&VolumeSnapshotClass> = inputs
        .classes
        .iter()
        .filter(|c| c.is_default() && c.driver == driver)
        .collect();
    match defaults.as_slice() {
        [] => Err("cannot find default snapshot class".to_string()),
        [class] => Ok(class.metadata.name.clone().unwrap_or_default()),
        many => Err(format!(
            "{} default snapshot classes were found",
            many.len()
        )),
    }
}

/// The content of a dynamic snapshot (upstream `createSnapshotContent`) and where it is cut.
fn new_content(
    snapshot: &VolumeSnapshot,
    inputs: &Inputs<'_>,
) -> Result<(VolumeSnapshotContent, Placement), String> {
    let Some(class_name) = &snapshot.spec.volume_snapshot_class_name else {
        return Err(format!(
            "failed to take snapshot {} without a snapshot class",
            snapshot.name_any()
        ));
    };
    let Some(class) = inputs
        .classes
        .iter()
        .find(|c| c.metadata.name.as_ref() == Some(class_name))
    else {
        return Err(format!(
            "volumesnapshotclass.snapshot.storage.k8s.io \"{class_name}\" not found"
        ));
    };
    let volume = source_volume(snapshot, inputs)?;
    let content_name = dynamic_content_name(snapshot);
    let namespace = snapshot.namespace().unwrap_or_default();
    let name = snapshot.name_any();
    let secret = secret_reference(
        SNAPSHOTTER,
        &class.parameters(),
        &content_name,
        Some((&namespace, &name)),
    )
    .map_err(|e| e.to_string())?;
    let Some((_, volume_handle)) = csi_driver(volume) else {
        return Err(format!(
            "cannot find CSI PersistentVolumeSource for volume {}",
            volume.name_any()
        ));
    };
    let mut content = VolumeSnapshotContent::new(
        &content_name,
        VolumeSnapshotContentSpec {
            volume_snapshot_ref: SnapshotReference {
                api_version: Some(SNAPSHOT_API_VERSION.into()),
                kind: Some("VolumeSnapshot".into()),
                name: Some(name),
                namespace: Some(namespace),
                uid: snapshot.metadata.uid.clone(),
                resource_version: snapshot.metadata.resource_version.clone(),
                field_path: None,
            },
            deletion_policy: class.deletion_policy,
            driver: class.driver.clone(),
            volume_snapshot_class_name: Some(class_name.clone()),
            source: VolumeSnapshotContentSource {
                volume_handle: Some(volume_handle.to_string()),
                snapshot_handle: None,
            },
            source_volume_mode: if inputs.prevent_volume_mode_conversion {
                volume.spec.as_ref().and_then(|s| s.volume_mode.clone())
            } else {
                None
            },
        },
    );
    // Born with the bound finalizer (upstream adds it in a write of its own afterwards): a
    // content that lost the race to get it, then was deleted with its snapshot, would be gone
    // before csi-snapshotter could DeleteSnapshot, and the snapshot would leak.
    content.metadata.finalizers = Some(vec![CONTENT_BOUND_FINALIZER.to_string()]);
    // Only the secret's annotations: `new` would also copy the CRD's approval annotation.
    content.metadata.annotations = secret.map(|secret| {
        [
            (DELETION_SECRET_NAME.to_string(), secret.name),
            (DELETION_SECRET_NAMESPACE.to_string(), secret.namespace),
        ]
        .into()
    });
    let placement = distributed::placement(volume, inputs.nodes);
    content.metadata.labels = placement
        .node()
        .map(|node| [(MANAGED_BY_LABEL.to_string(), node.to_string())].into());
    Ok((content, placement))
}

fn status_step(snapshot: &VolumeSnapshot, content: &VolumeSnapshotContent) -> Step {
    match status_from_content(snapshot, content) {
        Some((status, events)) => Step::UpdateStatus {
            status: Box::new(status),
            events,
        },
        None => Step::Nothing,
    }
}

/// The snapshot status the content's status implies (upstream `updateSnapshotStatus`), with
/// the Events of what became true (`SnapshotCreated`, `SnapshotReady`); `None` if unchanged.
pub fn status_from_content(
    snapshot: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
) -> Option<(VolumeSnapshotStatus, Vec<(&'static str, String)>)> {
    let content_status = content.status.as_ref();
    let created_at = content_status
        .and_then(|s| s.creation_time)
        .and_then(|ns| k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns)).ok())
        .map(Time);
    let size = content_status.and_then(|s| s.restore_size);
    let ready = content_status.and_then(|s| s.ready_to_use).unwrap_or(false);
    let error = content_status.and_then(|s| s.error.clone());
    let old = snapshot.status.clone();
    let mut new = old.clone().unwrap_or_default();
    if new.bound_volume_snapshot_content_name.is_none() {
        new.bound_volume_snapshot_content_name = Some(content.name_any());
    }
    if new.creation_time.is_none() {
        new.creation_time = created_at;
    }
    if new.ready_to_use != Some(ready) {
        new.ready_to_use = Some(ready);
        if ready {
            new.error = None;
        }
    }
    let zero = new
        .restore_size
        .as_ref()
        .is_some_and(|q| csi_kinds::quantity::bytes(&q.0).is_ok_and(|b| b == 0));
    if let Some(size) = size
        && (new.restore_size.is_none() || (zero && size > 0))
    {
        new.restore_size = Some(Quantity(csi_kinds::quantity::binary_si(size)));
    }
    // The content's error (or none) is the snapshot's, as upstream copies it on every update.
    new.error = error;
    if new.volume_group_snapshot_name.is_none() {
        new.volume_group_snapshot_name = owning_group(snapshot).map(|group| group.name.clone());
    }
    if old.as_ref() == Some(&new) {
        return None;
    }
    let key = snapshot_key(snapshot);
    let was_created = old.as_ref().is_some_and(|s| s.creation_time.is_some());
    let was_ready = old.as_ref().and_then(|s| s.ready_to_use).unwrap_or(false);
    let mut events = Vec::new();
    if !was_created && new.creation_time.is_some() {
        events.push((
            reason::SNAPSHOT_CREATED,
            format!("Snapshot {key} was successfully created by the CSI driver."),
        ));
    }
    if !was_ready && ready {
        events.push((
            reason::SNAPSHOT_READY,
            format!("Snapshot {key} is ready to use."),
        ));
    }
    Some((new, events))
}

/// A snapshot being deleted (upstream `processSnapshotWithDeletionTimestamp` and
/// `checkandRemoveSnapshotFinalizersAndCheckandDeleteContent`).
fn deletion(snapshot: &VolumeSnapshot, inputs: &Inputs<'_>) -> Step {
    if !is_deletion_candidate(snapshot) {
        return Step::Nothing;
    }
    if let Some(group) = owning_group(snapshot)
        && inputs.held_by_group
    {
        return Step::Fail(Failure {
            reason: reason::DELETE_PENDING,
            message: format!(
                "deletion of the individual volume snapshot {} is not allowed as it belongs to group snapshot {}/{}. Deleting the group snapshot will trigger the deletion of all the individual volume snapshots that are part of the group.",
                snapshot_key(snapshot),
                snapshot.metadata.namespace.as_deref().unwrap_or_default(),
                group.name
            ),
            status: None,
        });
    }
    let content = inputs.content.filter(|c| refers_to(c, snapshot));
    let delete_content = content.is_some_and(|c| c.spec.deletion_policy == DeletionPolicy::Delete);
    if let Some(content) = content {
        if inputs.restoring {
            return Step::Fail(Failure {
                reason: reason::DELETE_PENDING,
                message: "Snapshot is being used to restore a PVC".into(),
                status: None,
            });
        }
        if !has_annotation(&content.metadata, BEING_DELETED) {
            return Step::MarkContentBeingDeleted(content.name_any());
        }
        if delete_content && content.metadata.deletion_timestamp.is_none() {
            return Step::DeleteContent(content.name_any());
        }
    }
    let source = has_finalizer(&snapshot.metadata, SNAPSHOT_AS_SOURCE_FINALIZER);
    let bound = !(content.is_some() && delete_content)
        && has_finalizer(&snapshot.metadata, SNAPSHOT_BOUND_FINALIZER);
    let in_group = has_finalizer(&snapshot.metadata, IN_GROUP_FINALIZER);
    if source || bound || in_group {
        Step::RemoveFinalizers {
            source,
            bound,
            in_group,
        }
    } else {
        Step::Nothing
    }
}

/// The next step for a VolumeSnapshotContent (upstream common `syncContent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentStep {
    Nothing,
    /// An Event on the content, then retried.
    Invalid(String),
    AddFinalizer,
    MarkBeingDeleted,
}

/// `snapshot`: the VolumeSnapshot its `volumeSnapshotRef` names, if cached.
pub fn content_plan(
    content: &VolumeSnapshotContent,
    snapshot: Option<&VolumeSnapshot>,
) -> ContentStep {
    let source = &content.spec.source;
    if source.volume_handle.is_some() == source.snapshot_handle.is_some() {
        return ContentStep::Invalid(
            "Exactly one of VolumeHandle and SnapshotHandle should be specified".into(),
        );
    }
    let uid = content
        .spec
        .volume_snapshot_ref
        .uid
        .as_deref()
        .unwrap_or("");
    if uid.is_empty() {
        return ContentStep::Nothing;
    }
    if content.metadata.deletion_timestamp.is_none()
        && !has_finalizer(&content.metadata, CONTENT_BOUND_FINALIZER)
    {
        return ContentStep::AddFinalizer;
    }
    let snapshot = snapshot.filter(|s| s.metadata.uid.as_deref() == Some(uid));
    if snapshot.is_some_and(is_deletion_candidate)
        && !has_annotation(&content.metadata, BEING_DELETED)
    {
        return ContentStep::MarkBeingDeleted;
    }
    ContentStep::Nothing
}

/// The snapshots taking `claim` as their source. Upstream checks the claim's protection in the
/// sync of each of them and reports a failed release on each ([`reason::PVC_FINALIZER_ERROR`]);
/// we release it from the claim's sync, so it is reported on each of these.
pub fn snapshots_of_claim<'a>(
    claim: &PersistentVolumeClaim,
    snapshots: impl IntoIterator<Item = &'a VolumeSnapshot>,
) -> impl Iterator<Item = &'a VolumeSnapshot> {
    let name = claim.name_any();
    snapshots.into_iter().filter(move |s| {
        s.metadata.namespace == claim.metadata.namespace
            && s.spec.source.persistent_volume_claim_name.as_deref() == Some(name.as_str())
    })
}

/// Whether a claim's `pvc-as-source-protection` can go: none of its snapshots can still be
/// cut from it ([`may_still_be_cut`]). `has_content` says whether a snapshot's content exists
/// (bound, or created and not yet bound).
///
/// Upstream (`isPVCBeingUsed`) keeps the claim for every snapshot not ready yet, so a snapshot
/// that never will be (a missing class, a claim being deleted) holds it Terminating forever
/// (external-snapshotter #1305).
pub fn claim_protection_removable<'a>(
    claim: &PersistentVolumeClaim,
    snapshots: impl IntoIterator<Item = &'a VolumeSnapshot>,
    has_content: impl Fn(&VolumeSnapshot) -> bool,
) -> bool {
    has_finalizer(&claim.metadata, PVC_AS_SOURCE_FINALIZER)
        && !snapshots_of_claim(claim, snapshots).any(|s| may_still_be_cut(s, has_content(s)))
}

/// Whether a snapshot not ready yet may still make its driver read its source volume: it has
/// a content (CreateSnapshot may be in flight or retried), or it is about to get one (no
/// failure recorded, not being deleted). A snapshot without content whose creation failed
/// gets one only by a later sync, and that sync refuses a claim being deleted ([`plan`]).
pub fn may_still_be_cut(snapshot: &VolumeSnapshot, has_content: bool) -> bool {
    if is_ready(snapshot) {
        return false;
    }
    let failed = snapshot.status.as_ref().is_some_and(|s| s.error.is_some());
    has_content
        || bound_content_name(snapshot).is_some()
        || (!failed && snapshot.metadata.deletion_timestamp.is_none())
}

/// Whether `claim` is Pending with `snapshot` as its data source (a restore in progress).
pub fn restores_from(claim: &PersistentVolumeClaim, snapshot: &VolumeSnapshot) -> bool {
    let pending = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    let source = claim.spec.as_ref().and_then(|s| s.data_source.as_ref());
    pending
        && claim.metadata.namespace == snapshot.metadata.namespace
        && source.is_some_and(|s| {
            s.kind == "VolumeSnapshot"
                && s.api_group.as_deref() == Some(csi_kinds::snapshot::GROUP)
                && Some(&s.name) == snapshot.metadata.name.as_ref()
        })
}

#[cfg(test)]
mod tests;

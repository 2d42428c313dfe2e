//! The snapshot-controller's pure core for volume group snapshots (external-snapshotter
//! `pkg/common-controller/groupsnapshot_controller_helper.go`): the next step for one
//! VolumeGroupSnapshot, planned from what the caches hold, one step per sync as for snapshots
//! ([`crate::snapshot`]).
//!
//! A dynamic group (a label selector) gets its VolumeGroupSnapshotContent
//! (`groupsnapcontent-<uid>`) with the volume handles of the claims selected; once the
//! csi-snapshotter has cut the group and listed its members in the content's status, the group
//! gets one VolumeSnapshot and one VolumeSnapshotContent per member, named as upstream names
//! them (`snapshot-` / `snapcontent-` and the SHA-256 of the group's UID and the member's volume
//! handle), owned by the group and bound to each other; the ordinary snapshot sync then gives
//! each member its status. A pre-provisioned group binds the content it names.
//!
//! Where upstream leaks or misleads, this core does not:
//! - the group holds its bound finalizer *before* its content exists (upstream adds it only
//!   after binding, so a group deleted in between leaves a content nobody deletes, and its group
//!   snapshot on the storage);
//! - contents are born with their bound finalizer, and member snapshots with theirs;
//! - a group is ready only once its content is ready *and* every member snapshot exists and is
//!   ready (upstream copies the content's readiness alone, so a "ready" group may have no member
//!   to restore from yet);
//! - the selector's `matchExpressions` count (upstream reads `matchLabels` only);
//! - members are created once (upstream re-creates them, and resets their status, on every sync
//!   of an unready group).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::ResourceExt;

use crate::secrets::{GROUP_SNAPSHOTTER, secret_reference};
use crate::snapshot::{Failure, restores_from};
use csi_kinds::crd::ObjectReference;
use csi_kinds::groupsnapshot::{
    self, DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE, GROUP_CONTENT_BOUND_FINALIZER,
    GROUP_SNAPSHOT_BOUND_FINALIZER, IN_GROUP_FINALIZER, VolumeGroupSnapshot,
    VolumeGroupSnapshotClass, VolumeGroupSnapshotContent, VolumeGroupSnapshotContentSource,
    VolumeGroupSnapshotContentSpec, VolumeGroupSnapshotStatus, VolumeSnapshotInfo,
    group_snapshot_key, member_content_name, member_snapshot_name,
};
use csi_kinds::snapshot::{
    self as snapshots, CONTENT_BOUND_FINALIZER, GROUP_SNAPSHOT_HANDLE,
    SNAPSHOT_AS_SOURCE_FINALIZER, VolumeSnapshot, VolumeSnapshotContent,
    VolumeSnapshotContentSource, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus,
    VolumeSnapshotSource, VolumeSnapshotSpec,
};

/// Event reasons (upstream's).
pub mod reason {
    pub const CREATING: &str = "CreatingGroupSnapshot";
    pub const CREATED: &str = "GroupSnapshotCreated";
    pub const READY: &str = "GroupSnapshotReady";
    pub const GET_CLASS_FAILED: &str = "GetGroupSnapshotClassFailed";
    pub const SET_DEFAULT_CLASS_FAILED: &str = "SetDefaultGroupSnapshotClassFailed";
    pub const VALIDATION_ERROR: &str = "GroupSnapshotValidationError";
    pub const CONTENT_MISSING: &str = "GroupSnapshotContentMissing";
    pub const CONTENT_MISMATCH: &str = "GroupSnapshotContentMismatch";
    pub const CONTENT_MISBOUND: &str = "GroupSnapshotContentMisbound";
    pub const BIND_FAILED: &str = "GroupSnapshotBindFailed";
    pub const CONTENT_CREATION_FAILED: &str = "GroupSnapshotContentCreationFailed";
    pub const CREATE_CONTENT_FAILED: &str = "CreateGroupSnapshotContentFailed";
    pub const STATUS_UPDATE_FAILED: &str = "GroupSnapshotStatusUpdateFailed";
    pub const FINALIZER_ERROR: &str = "GroupSnapshotFinalizerError";
    pub const CONTENT_DELETE_ERROR: &str = "GroupSnapshotContentObjectDeleteError";
    pub const CONTENT_VALIDATION_ERROR: &str = "GroupContentValidationError";
    pub const DELETE_PENDING: &str = "SnapshotDeletePending";
    pub const SNAPSHOT_DELETE_ERROR: &str = "SnapshotDeleteError";
}

const GROUP_API_VERSION: &str = "groupsnapshot.storage.k8s.io/v1";

/// The next step for a VolumeGroupSnapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupStep {
    Nothing,
    Fail(Failure),
    /// Record the default class of the selected volumes' driver in the group's spec.
    SetClass(String),
    AddFinalizer,
    /// Create the dynamic group's content (then a `CreatingGroupSnapshot` Event).
    CreateContent(Box<VolumeGroupSnapshotContent>),
    /// Bind a pre-provisioned content: its `volumeGroupSnapshotRef.uid` (and class).
    Bind {
        content: String,
        uid: String,
        class: Option<String>,
    },
    /// The member snapshots not yet there.
    CreateMemberSnapshots(Vec<VolumeSnapshot>),
    /// The member contents not yet there (their snapshots exist: the contents name their UID).
    CreateMemberContents(Vec<VolumeSnapshotContent>),
    /// The status of member contents that have none yet: `(content, status)`.
    SetMemberContentStatus(Vec<(String, VolumeSnapshotContentStatus)>),
    UpdateStatus {
        status: Box<VolumeGroupSnapshotStatus>,
        events: Vec<(&'static str, String)>,
    },
    /// Tell the sidecar the group is going (annotation on the content).
    MarkContentBeingDeleted(String),
    DeleteContent(String),
    /// Delete these member snapshots (their own sync releases them once the group is gone).
    DeleteMembers(Vec<String>),
    RemoveFinalizer,
}

/// What a group's step is planned from, read from the caches.
#[derive(Debug, Clone, Copy)]
pub struct GroupInputs<'a> {
    /// The content named by [`content_name`].
    pub content: Option<&'a VolumeGroupSnapshotContent>,
    pub classes: &'a [&'a VolumeGroupSnapshotClass],
    /// The claims of the group's namespace (the selector picks among them).
    pub claims: &'a [&'a PersistentVolumeClaim],
    /// Every cached PersistentVolume (the selected claims' volumes, the members' volumes).
    pub volumes: &'a [&'a PersistentVolume],
    /// The cached snapshots of the group's namespace that the group owns.
    pub members: &'a [&'a VolumeSnapshot],
    /// The cached member contents (by [`member_content_name`]).
    pub member_contents: &'a [&'a VolumeSnapshotContent],
}

fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// `groupsnapcontent-<group UID>`.
pub fn dynamic_content_name(group: &VolumeGroupSnapshot) -> String {
    format!(
        "groupsnapcontent-{}",
        group.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// The content a group binds: the one it names (pre-provisioned), or its dynamic one.
pub fn content_name(group: &VolumeGroupSnapshot) -> String {
    group
        .spec
        .source
        .volume_group_snapshot_content_name
        .clone()
        .or_else(|| {
            group
                .status
                .as_ref()
                .and_then(|s| s.bound_volume_group_snapshot_content_name.clone())
        })
        .unwrap_or_else(|| dynamic_content_name(group))
}

/// The group that owns `snapshot`, if it is a member of one (any served version of the group
/// API: upstream v8.5 wrote v1beta2 owner references).
pub fn owning_group(snapshot: &VolumeSnapshot) -> Option<&OwnerReference> {
    snapshot
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.kind == "VolumeGroupSnapshot"
                && o.api_version
                    .strip_prefix(groupsnapshot::GROUP)
                    .is_some_and(|v| v.starts_with('/'))
        })
}

/// A group being deleted that still holds its finalizer.
pub fn is_deletion_candidate(group: &VolumeGroupSnapshot) -> bool {
    group.metadata.deletion_timestamp.is_some()
        && has_finalizer(&group.metadata, GROUP_SNAPSHOT_BOUND_FINALIZER)
}

fn refers_to(content: &VolumeGroupSnapshotContent, group: &VolumeGroupSnapshot) -> bool {
    let reference = &content.spec.volume_group_snapshot_ref;
    reference.name == group.metadata.name
        && reference.namespace == group.metadata.namespace
        && reference.uid == group.metadata.uid
}

fn fail(reason: &'static str, message: impl Into<String>, ready_false: bool) -> GroupStep {
    GroupStep::Fail(Failure {
        reason,
        message: message.into(),
        status: Some(ready_false),
    })
}

/// Upstream `syncGroupSnapshotByKey` and `syncGroupSnapshot`.
pub fn plan(group: &VolumeGroupSnapshot, inputs: &GroupInputs<'_>) -> GroupStep {
    if group.metadata.deletion_timestamp.is_some() {
        return deletion(group, inputs);
    }
    let source = &group.spec.source;
    let dynamic = source.volume_group_snapshot_content_name.is_none();
    match &group.spec.volume_group_snapshot_class_name {
        Some(name)
            if !inputs
                .classes
                .iter()
                .any(|c| c.metadata.name.as_ref() == Some(name)) =>
        {
            return fail(
                reason::GET_CLASS_FAILED,
                format!(
                    "failed to get group snapshot class with error volumegroupsnapshotclass.groupsnapshot.storage.k8s.io \"{name}\" not found"
                ),
                false,
            );
        }
        None if dynamic && source.selector.is_some() => {
            return match default_class(group, inputs) {
                Ok(name) => GroupStep::SetClass(name),
                Err(error) => fail(
                    reason::SET_DEFAULT_CLASS_FAILED,
                    format!("Failed to set default group snapshot class with error {error}"),
                    false,
                ),
            };
        }
        _ => {}
    }
    if source.selector.is_some() == source.volume_group_snapshot_content_name.is_some() {
        return fail(
            reason::VALIDATION_ERROR,
            "Exactly one of Selector and VolumeGroupSnapshotContentName should be specified",
            true,
        );
    }
    if !has_finalizer(&group.metadata, GROUP_SNAPSHOT_BOUND_FINALIZER) {
        return GroupStep::AddFinalizer;
    }
    let content = match checked_content(group, inputs.content) {
        Ok(content) => content,
        Err(step) => return step,
    };
    let Some(content) = content else {
        let bound = group
            .status
            .as_ref()
            .is_some_and(|s| s.bound_volume_group_snapshot_content_name.is_some());
        if !dynamic || bound {
            return fail(
                reason::CONTENT_MISSING,
                "VolumeGroupSnapshotContent is missing",
                true,
            );
        }
        return match new_content(group, inputs) {
            Ok(content) => GroupStep::CreateContent(Box::new(content)),
            Err(step) => step,
        };
    };
    if !dynamic && let Some(step) = bind(group, content) {
        return step;
    }
    if let Some(step) = members(group, content, inputs) {
        return step;
    }
    status_step(group, content, inputs)
}

/// The content the group names, checked to be of the right kind and to point back (upstream
/// `get{Preprovisioned,DynamicallyProvisioned}GroupSnapshotContentFromStore`).
fn checked_content<'a>(
    group: &VolumeGroupSnapshot,
    content: Option<&'a VolumeGroupSnapshotContent>,
) -> Result<Option<&'a VolumeGroupSnapshotContent>, GroupStep> {
    let Some(content) = content else {
        return Ok(None);
    };
    let name = content.name_any();
    let reference = &content.spec.volume_group_snapshot_ref;
    let misbound = || {
        fail(
            reason::CONTENT_MISBOUND,
            format!("VolumeGroupSnapshotContent [{name}] is bound to a different group snapshot"),
            true,
        )
    };
    let same_object =
        reference.name == group.metadata.name && reference.namespace == group.metadata.namespace;
    let source = &content.spec.source;
    if group
        .spec
        .source
        .volume_group_snapshot_content_name
        .is_some()
    {
        if source.group_snapshot_handles.is_none() {
            return Err(fail(
                reason::CONTENT_MISMATCH,
                "VolumeGroupSnapshotContent is dynamically provisioned while expecting a pre-provisioned one",
                true,
            ));
        }
        let uid = reference.uid.as_deref().unwrap_or("");
        if !same_object || (!uid.is_empty() && Some(uid) != group.metadata.uid.as_deref()) {
            return Err(misbound());
        }
    } else {
        if source.group_snapshot_handles.is_some() {
            return Err(fail(
                reason::CONTENT_MISMATCH,
                format!(
                    "VolumeGroupSnapshotContent {name} is pre-provisioned while expecting a dynamically provisioned one"
                ),
                true,
            ));
        }
        if !same_object || reference.uid != group.metadata.uid {
            return Err(misbound());
        }
    }
    Ok(Some(content))
}

/// Upstream `checkAndBindGroupSnapshotContent`: a pre-provisioned content gets the group's UID
/// (and class).
fn bind(group: &VolumeGroupSnapshot, content: &VolumeGroupSnapshotContent) -> Option<GroupStep> {
    let uid = content
        .spec
        .volume_group_snapshot_ref
        .uid
        .as_deref()
        .unwrap_or("");
    if !uid.is_empty() && content.spec.volume_group_snapshot_class_name.is_some() {
        return None;
    }
    let class = group.spec.volume_group_snapshot_class_name.clone();
    let wanted = group.metadata.uid.clone().unwrap_or_default();
    (uid != wanted || (class.is_some() && class != content.spec.volume_group_snapshot_class_name))
        .then(|| GroupStep::Bind {
            content: content.name_any(),
            uid: wanted,
            class,
        })
}

/// The claims the selector picks in the group's namespace, in name order, with their bound
/// volumes (upstream `getVolumesFromVolumeGroupSnapshot`).
fn selected_volumes<'a>(
    group: &VolumeGroupSnapshot,
    inputs: &GroupInputs<'a>,
) -> Result<Vec<&'a PersistentVolume>, String> {
    let selector = group.spec.source.selector.clone().unwrap_or_default();
    let mut claims = Vec::new();
    for claim in inputs.claims {
        if claim.metadata.namespace != group.metadata.namespace {
            continue;
        }
        let labels = claim.metadata.labels.clone().unwrap_or_default();
        if csi_kinds::label_selector::matches(&selector, &labels).map_err(|e| e.to_string())? {
            claims.push(*claim);
        }
    }
    if claims.is_empty() {
        return Err(format!(
            "label selector {} for group snapshot not applied to any PVC",
            selector_string(&selector)
        ));
    }
    claims.sort_by_key(|c| c.name_any());
    let mut volumes = Vec::new();
    for claim in claims {
        let name = claim.name_any();
        if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Err(format!(
                "the PVC {name} is not yet bound to a PV, will not attempt to take a group snapshot"
            ));
        }
        let pv_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let Some(volume) = inputs
            .volumes
            .iter()
            .find(|v| v.metadata.name.as_deref() == Some(pv_name.as_str()))
        else {
            return Err(format!(
                "failed to retrieve PV {pv_name} from the API server: \"persistentvolumes \\\"{pv_name}\\\" not found\""
            ));
        };
        let bound = volume
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_some_and(|r| {
                r.name.as_deref() == Some(name.as_str())
                    && r.namespace == claim.metadata.namespace
                    && (r.uid.as_deref().unwrap_or("").is_empty() || r.uid == claim.metadata.uid)
            });
        if !bound {
            return Err("claim in dataSource not bound or invalid".to_string());
        }
        volumes.push(*volume);
    }
    Ok(volumes)
}

/// A selector as `labels.Selector.String()` writes it (`a=b,c in (d,e)`), for messages.
fn selector_string(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.clone().unwrap_or_default().join(",");
        parts.push(match req.operator.as_str() {
            "In" => format!("{} in ({values})", req.key),
            "NotIn" => format!("{} notin ({values})", req.key),
            "Exists" => req.key.clone(),
            "DoesNotExist" => format!("!{}", req.key),
            other => format!("{} {other} ({values})", req.key),
        });
    }
    parts.join(",")
}

fn csi_driver(volume: &PersistentVolume) -> Option<(&str, &str)> {
    let csi = volume.spec.as_ref()?.csi.as_ref()?;
    Some((csi.driver.as_str(), csi.volume_handle.as_str()))
}

/// The one default group class of the selected volumes' driver (upstream
/// `SetDefaultGroupSnapshotClass`).
fn default_class(group: &VolumeGroupSnapshot, inputs: &GroupInputs<'_>) -> Result<String, String> {
    let volumes = selected_volumes(group, inputs)?;
    let Some((driver, _)) = volumes.first().and_then(|v| csi_driver(v)) else {
        return Err(format!(
            "snapshotting non-CSI volumes is not supported, group snapshot:{}",
            group_snapshot_key(group)
        ));
    };
    let defaults: Vec<_> = inputs
        .classes
        .iter()
        .filter(|c| c.is_default() && c.driver == driver)
        .collect();
    match defaults.as_slice() {
        [] => Err("cannot find default group snapshot class".to_string()),
        [class] => Ok(class.metadata.name.clone().unwrap_or_default()),
        many => Err(format!(
            "{} default snapshot classes were found",
            many.len()
        )),
    }
}

/// The content of a dynamic group (upstream `createGroupSnapshotContent`), born with its bound
/// finalizer.
fn new_content(
    group: &VolumeGroupSnapshot,
    inputs: &GroupInputs<'_>,
) -> Result<VolumeGroupSnapshotContent, GroupStep> {
    let creation_failed = |error: String| {
        fail(
            reason::CONTENT_CREATION_FAILED,
            format!("failed to create group snapshot content with error {error}"),
            true,
        )
    };
    let name = group.name_any();
    let Some(class_name) = &group.spec.volume_group_snapshot_class_name else {
        return Err(creation_failed(format!(
            "failed to take group snapshot {name} without a group snapshot class"
        )));
    };
    let Some(class) = inputs
        .classes
        .iter()
        .find(|c| c.metadata.name.as_ref() == Some(class_name))
    else {
        return Err(creation_failed(format!(
            "volumegroupsnapshotclass.groupsnapshot.storage.k8s.io \"{class_name}\" not found"
        )));
    };
    let content_name = dynamic_content_name(group);
    let namespace = group.namespace().unwrap_or_default();
    let input_error = |error: String| {
        creation_failed(format!(
            "failed to get input parameters to create group snapshot {name}: {error:?}"
        ))
    };
    let volumes = selected_volumes(group, inputs).map_err(input_error)?;
    let secret = secret_reference(
        GROUP_SNAPSHOTTER,
        &class.parameters(),
        &content_name,
        Some((&namespace, &name)),
    )
    .map_err(|e| input_error(e.to_string()))?;
    let mut handles = Vec::new();
    for volume in volumes {
        let pv = volume.name_any();
        let Some((driver, handle)) = csi_driver(volume) else {
            return Err(fail(
                reason::CREATE_CONTENT_FAILED,
                format!("Cannot snapshot a non-CSI volume: {pv}"),
                true,
            ));
        };
        if driver != class.driver {
            return Err(fail(
                reason::CREATE_CONTENT_FAILED,
                format!(
                    "Volume CSI driver ({driver}) mismatch with VolumeGroupSnapshotClass ({}) {}: {pv}",
                    class.driver,
                    group_snapshot_key(group)
                ),
                true,
            ));
        }
        handles.push(handle.to_string());
    }
    let mut content = VolumeGroupSnapshotContent::new(
        &content_name,
        VolumeGroupSnapshotContentSpec {
            volume_group_snapshot_ref: ObjectReference {
                api_version: Some(GROUP_API_VERSION.into()),
                kind: Some("VolumeGroupSnapshot".into()),
                name: Some(name),
                namespace: Some(namespace),
                uid: group.metadata.uid.clone(),
                resource_version: group.metadata.resource_version.clone(),
                field_path: None,
            },
            deletion_policy: class.deletion_policy,
            driver: class.driver.clone(),
            volume_group_snapshot_class_name: Some(class_name.clone()),
            source: VolumeGroupSnapshotContentSource {
                volume_handles: Some(handles),
                group_snapshot_handles: None,
            },
        },
    );
    content.metadata.finalizers = Some(vec![GROUP_CONTENT_BOUND_FINALIZER.to_string()]);
    // Only the secret's annotations: `new` would also copy the CRD's approval annotation.
    content.metadata.annotations = secret.map(|secret| {
        BTreeMap::from([
            (DELETION_SECRET_NAME.to_string(), secret.name),
            (DELETION_SECRET_NAMESPACE.to_string(), secret.namespace),
        ])
    });
    Ok(content)
}

/// The members the content lists that lack their snapshot, their content, or that content's
/// status (upstream `createSnapshotsForGroupSnapshotContent`, one kind of write per step).
fn members(
    group: &VolumeGroupSnapshot,
    content: &VolumeGroupSnapshotContent,
    inputs: &GroupInputs<'_>,
) -> Option<GroupStep> {
    let status = content.status.as_ref()?;
    let group_handle = status.volume_group_snapshot_handle.clone()?;
    let listed = status.members();
    let group_uid = group.metadata.uid.clone().unwrap_or_default();
    let namespace = group.namespace().unwrap_or_default();
    let listed: Vec<(&VolumeSnapshotInfo, &str)> = listed
        .iter()
        .filter_map(|m| Some((m, m.volume_handle.as_deref()?)))
        .collect();
    let snapshot_of = |handle: &str| {
        let name = member_snapshot_name(&group_uid, handle);
        inputs
            .members
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some(name.as_str()))
            .copied()
    };
    let content_of = |handle: &str| {
        let name = member_content_name(&group_uid, handle);
        inputs
            .member_contents
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            .copied()
    };
    let volume_of = |handle: &str| {
        inputs
            .volumes
            .iter()
            .find(|v| csi_driver(v) == Some((content.spec.driver.as_str(), handle)))
            .copied()
    };
    let missing_snapshots: Vec<VolumeSnapshot> = listed
        .iter()
        .filter(|(_, handle)| snapshot_of(handle).is_none())
        .map(|(_, handle)| member_snapshot(group, &namespace, handle, volume_of(handle)))
        .collect();
    if !missing_snapshots.is_empty() {
        return Some(GroupStep::CreateMemberSnapshots(missing_snapshots));
    }
    let secret = member_secret(group, content, inputs);
    let missing_contents: Vec<VolumeSnapshotContent> = listed
        .iter()
        .filter(|(_, handle)| content_of(handle).is_none())
        .filter_map(|(_, handle)| {
            let snapshot = snapshot_of(handle)?;
            Some(member_content(
                content,
                snapshot,
                &group_handle,
                handle,
                volume_of(handle),
                secret.as_ref(),
            ))
        })
        .collect();
    if !missing_contents.is_empty() {
        return Some(GroupStep::CreateMemberContents(missing_contents));
    }
    let statuses: Vec<(String, VolumeSnapshotContentStatus)> = listed
        .iter()
        .filter_map(|(info, handle)| {
            let member = content_of(handle)?;
            let has_handle = member
                .status
                .as_ref()
                .is_some_and(|s| s.snapshot_handle.is_some());
            (!has_handle).then(|| {
                (
                    member.name_any(),
                    VolumeSnapshotContentStatus {
                        snapshot_handle: info.snapshot_handle.clone(),
                        volume_group_snapshot_handle: Some(group_handle.clone()),
                        creation_time: info.creation_time,
                        restore_size: info.restore_size,
                        ready_to_use: info.ready_to_use,
                        error: None,
                    },
                )
            })
        })
        .collect();
    (!statuses.is_empty()).then_some(GroupStep::SetMemberContentStatus(statuses))
}

/// The group snapshotter secret member contents record for the sidecar (upstream resolves it
/// without the group, so only the content's name may be templated); unresolvable means none.
fn member_secret(
    group: &VolumeGroupSnapshot,
    content: &VolumeGroupSnapshotContent,
    inputs: &GroupInputs<'_>,
) -> Option<csi_kinds::secrets::SecretRef> {
    let class_name = group.spec.volume_group_snapshot_class_name.as_ref()?;
    let class = inputs
        .classes
        .iter()
        .find(|c| c.metadata.name.as_ref() == Some(class_name))?;
    secret_reference(
        GROUP_SNAPSHOTTER,
        &class.parameters(),
        &content.name_any(),
        None,
    )
    .ok()
    .flatten()
}

/// A member VolumeSnapshot: owned by the group, born with the in-group and as-source
/// finalizers; its source is the member's claim when the volume is known here, else its
/// content (an imported group of volumes this cluster does not hold).
fn member_snapshot(
    group: &VolumeGroupSnapshot,
    namespace: &str,
    handle: &str,
    volume: Option<&PersistentVolume>,
) -> VolumeSnapshot {
    let group_uid = group.metadata.uid.clone().unwrap_or_default();
    let claim = volume
        .and_then(|v| v.spec.as_ref()?.claim_ref.as_ref())
        .filter(|r| r.namespace.as_deref() == Some(namespace))
        .and_then(|r| r.name.clone());
    let source = match claim {
        Some(claim) => VolumeSnapshotSource {
            persistent_volume_claim_name: Some(claim),
            volume_snapshot_content_name: None,
        },
        None => VolumeSnapshotSource {
            persistent_volume_claim_name: None,
            volume_snapshot_content_name: Some(member_content_name(&group_uid, handle)),
        },
    };
    let mut snapshot = VolumeSnapshot::new(
        &member_snapshot_name(&group_uid, handle),
        VolumeSnapshotSpec {
            source,
            volume_snapshot_class_name: None,
        },
    );
    snapshot.metadata.namespace = Some(namespace.to_string());
    snapshot.metadata.annotations = None;
    snapshot.metadata.owner_references = Some(vec![OwnerReference {
        api_version: GROUP_API_VERSION.into(),
        kind: "VolumeGroupSnapshot".into(),
        name: group.name_any(),
        uid: group_uid,
        controller: None,
        block_owner_deletion: None,
    }]);
    snapshot.metadata.finalizers = Some(vec![
        IN_GROUP_FINALIZER.to_string(),
        SNAPSHOT_AS_SOURCE_FINALIZER.to_string(),
    ]);
    snapshot
}

/// A member VolumeSnapshotContent, bound to its snapshot and born with its bound finalizer; the
/// group handle annotation tells the sidecar the group cuts and deletes it.
fn member_content(
    content: &VolumeGroupSnapshotContent,
    snapshot: &VolumeSnapshot,
    group_handle: &str,
    handle: &str,
    volume: Option<&PersistentVolume>,
    secret: Option<&csi_kinds::secrets::SecretRef>,
) -> VolumeSnapshotContent {
    let group_uid = content
        .spec
        .volume_group_snapshot_ref
        .uid
        .clone()
        .unwrap_or_default();
    let mut member = VolumeSnapshotContent::new(
        &member_content_name(&group_uid, handle),
        VolumeSnapshotContentSpec {
            // Without apiVersion, as upstream writes a member's reference.
            volume_snapshot_ref: ObjectReference {
                api_version: None,
                kind: Some("VolumeSnapshot".into()),
                name: snapshot.metadata.name.clone(),
                namespace: snapshot.metadata.namespace.clone(),
                uid: snapshot.metadata.uid.clone(),
                resource_version: None,
                field_path: None,
            },
            deletion_policy: content.spec.deletion_policy,
            driver: content.spec.driver.clone(),
            volume_snapshot_class_name: None,
            source: VolumeSnapshotContentSource {
                volume_handle: Some(handle.to_string()),
                snapshot_handle: None,
            },
            source_volume_mode: volume.and_then(|v| v.spec.as_ref()?.volume_mode.clone()),
        },
    );
    member.metadata.finalizers = Some(vec![CONTENT_BOUND_FINALIZER.to_string()]);
    let mut annotations =
        BTreeMap::from([(GROUP_SNAPSHOT_HANDLE.to_string(), group_handle.to_string())]);
    if let Some(secret) = secret {
        annotations.insert(
            snapshots::DELETION_SECRET_NAME.to_string(),
            secret.name.clone(),
        );
        annotations.insert(
            snapshots::DELETION_SECRET_NAMESPACE.to_string(),
            secret.namespace.clone(),
        );
    }
    member.metadata.annotations = Some(annotations);
    member
}

fn member_ready(snapshot: &VolumeSnapshot) -> bool {
    snapshot
        .status
        .as_ref()
        .and_then(|s| s.ready_to_use)
        .unwrap_or(false)
}

/// The group status the content and members imply (upstream `updateGroupSnapshotStatus`), with
/// the Events of what became true.
fn status_step(
    group: &VolumeGroupSnapshot,
    content: &VolumeGroupSnapshotContent,
    inputs: &GroupInputs<'_>,
) -> GroupStep {
    let content_status = content.status.clone().unwrap_or_default();
    let listed = content_status.members();
    let group_uid = group.metadata.uid.clone().unwrap_or_default();
    let members_ready = !listed.is_empty()
        && listed.iter().all(|m| {
            let Some(handle) = m.volume_handle.as_deref() else {
                return false;
            };
            let name = member_snapshot_name(&group_uid, handle);
            inputs
                .members
                .iter()
                .any(|s| s.metadata.name.as_deref() == Some(name.as_str()) && member_ready(s))
        });
    let pre_provisioned = group
        .spec
        .source
        .volume_group_snapshot_content_name
        .is_some();
    let ready = content_status.ready_to_use.unwrap_or(false) && (members_ready || pre_provisioned);
    let old = group.status.clone();
    let mut new = old.clone().unwrap_or_default();
    if new.bound_volume_group_snapshot_content_name.is_none() {
        new.bound_volume_group_snapshot_content_name = Some(content.name_any());
    }
    if new.creation_time.is_none() {
        new.creation_time = content_status.creation_time.clone();
    }
    if new.ready_to_use != Some(ready) {
        new.ready_to_use = Some(ready);
    }
    new.error = if ready { None } else { content_status.error };
    if old.as_ref() == Some(&new) {
        return GroupStep::Nothing;
    }
    let key = group_snapshot_key(group);
    let was_created = old.as_ref().is_some_and(|s| s.creation_time.is_some());
    let was_ready = old.as_ref().and_then(|s| s.ready_to_use).unwrap_or(false);
    let mut events = Vec::new();
    if !was_created && new.creation_time.is_some() {
        events.push((
            reason::CREATED,
            format!("GroupSnapshot {key} was successfully created by the CSI driver."),
        ));
    }
    if !was_ready && ready {
        events.push((
            reason::READY,
            format!("GroupSnapshot {key} is ready to use."),
        ));
    }
    GroupStep::UpdateStatus {
        status: Box::new(new),
        events,
    }
}

/// A group being deleted (upstream `processGroupSnapshotWithDeletionTimestamp`): members being
/// restored hold it; its content is told and, with policy Delete, deleted; its member
/// snapshots are deleted; its finalizer goes once a Delete content is gone.
fn deletion(group: &VolumeGroupSnapshot, inputs: &GroupInputs<'_>) -> GroupStep {
    if !is_deletion_candidate(group) {
        return GroupStep::Nothing;
    }
    let key = group_snapshot_key(group);
    if let Some(member) = inputs
        .members
        .iter()
        .find(|m| inputs.claims.iter().any(|c| restores_from(c, m)))
    {
        return GroupStep::Fail(Failure {
            reason: reason::DELETE_PENDING,
            message: format!(
                "Snapshot {} belonging to VolumeGroupSnapshot {key} is being used to restore a PVC",
                member.name_any()
            ),
            status: None,
        });
    }
    let content = inputs.content.filter(|c| refers_to(c, group));
    let delete_content =
        content.is_some_and(|c| c.spec.deletion_policy == snapshots::DeletionPolicy::Delete);
    if let Some(content) = content {
        let marked = content
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(groupsnapshot::BEING_DELETED));
        if !marked {
            return GroupStep::MarkContentBeingDeleted(content.name_any());
        }
        if delete_content && content.metadata.deletion_timestamp.is_none() {
            return GroupStep::DeleteContent(content.name_any());
        }
    }
    let members: Vec<String> = inputs
        .members
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .map(|m| m.name_any())
        .collect();
    if !members.is_empty() {
        return GroupStep::DeleteMembers(members);
    }
    if content.is_some() && delete_content {
        // The finalizer goes once the sidecar has deleted the group snapshot and its content.
        return GroupStep::Nothing;
    }
    GroupStep::RemoveFinalizer
}

/// The next step for a VolumeGroupSnapshotContent (upstream common `syncGroupSnapshotContent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupContentStep {
    Nothing,
    /// An Event on the content.
    Invalid(String),
    AddFinalizer,
}

pub fn content_plan(content: &VolumeGroupSnapshotContent) -> GroupContentStep {
    let source = &content.spec.source;
    if source.volume_handles.is_some() == source.group_snapshot_handles.is_some() {
        return GroupContentStep::Invalid(
            "Exactly one of GroupSnapshotHandles and VolumeHandles should be specified".into(),
        );
    }
    let bound = !content
        .spec
        .volume_group_snapshot_ref
        .uid
        .as_deref()
        .unwrap_or("")
        .is_empty();
    if bound
        && content.metadata.deletion_timestamp.is_none()
        && !has_finalizer(&content.metadata, GROUP_CONTENT_BOUND_FINALIZER)
    {
        return GroupContentStep::AddFinalizer;
    }
    GroupContentStep::Nothing
}

#[cfg(test)]
mod tests;

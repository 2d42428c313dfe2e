//! The csi-snapshotter sidecar's pure core for volume group snapshots (external-snapshotter
//! `pkg/sidecar-controller/groupsnapshot_helper.go`): what one VolumeGroupSnapshotContent of
//! our driver needs next, and the status a CSI answer turns into. The adapter
//! ([`crate::group_sidecar`]) only matches the plan and acts.
//!
//! The group's members are written to both member lists of the status
//! ([`VolumeGroupSnapshotContentStatus::set_members`]), so clients of every served version read
//! them; a pre-provisioned group's members come from GetVolumeGroupSnapshot too (upstream leaves
//! them out, so its snapshot-controller never makes member snapshots for an imported group).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::content::snapshot_name;
use csi_kinds::groupsnapshot::{
    BEING_CREATED, BEING_DELETED, GROUP_CONTENT_BOUND_FINALIZER, VolumeGroupSnapshotContent,
    VolumeGroupSnapshotContentStatus, VolumeSnapshotInfo,
};
use csi_kinds::snapshot::DeletionPolicy;
use csi_proto::csi::v1 as csi;

/// With `--extra-create-metadata`, CreateVolumeGroupSnapshot gets these.
pub const GROUP_NAME_KEY: &str = "csi.storage.k8s.io/volumegroupsnapshot/name";
pub const GROUP_NAMESPACE_KEY: &str = "csi.storage.k8s.io/volumegroupsnapshot/namespace";
pub const GROUP_CONTENT_NAME_KEY: &str = "csi.storage.k8s.io/volumegroupsnapshotcontent/name";

/// Event reasons (upstream's, all Warnings on the content).
pub mod reason {
    pub const CREATION_FAILED: &str = "GroupSnapshotCreationFailed";
    pub const CHECK_AND_UPDATE_FAILED: &str = "GroupSnapshotContentCheckandUpdateFailed";
    pub const DELETE_ERROR: &str = "GroupSnapshotDeleteError";
}

/// A group snapshot to delete at the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDeletion {
    pub group_snapshot_id: String,
    pub snapshot_ids: Vec<String>,
}

/// What a group content needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupContentPlan {
    /// Another driver's content.
    NotOurs,
    Nothing,
    /// Its group is being deleted: DeleteVolumeGroupSnapshot first when `delete` says what
    /// (policy Delete and a cut group), then the bound finalizer goes.
    Delete {
        delete: Option<GroupDeletion>,
        remove_finalizer: bool,
    },
    /// Cut the group with CreateVolumeGroupSnapshot (also to learn whether it is ready: the
    /// call is idempotent by name).
    Create,
    /// A pre-provisioned group: GetVolumeGroupSnapshot tells whether it exists and is ready.
    Refresh(GroupDeletion),
    /// Ready: the being-created annotation is left to remove.
    ClearBeingCreated,
}

fn annotations(content: &VolumeGroupSnapshotContent) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    content.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

fn is_ready(content: &VolumeGroupSnapshotContent) -> bool {
    content
        .status
        .as_ref()
        .and_then(|s| s.ready_to_use)
        .unwrap_or(false)
}

/// Upstream `shouldDeleteGroupSnapshotContent`: being deleted and either an unbound
/// pre-provisioned content, or its group being deleted — never while
/// CreateVolumeGroupSnapshot may still be cutting it.
pub fn should_delete(content: &VolumeGroupSnapshotContent) -> bool {
    if content.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let unbound = content
        .spec
        .volume_group_snapshot_ref
        .uid
        .as_deref()
        .unwrap_or("")
        .is_empty();
    if content.spec.source.group_snapshot_handles.is_some() && unbound {
        return true;
    }
    let annotations = annotations(content);
    !annotations.contains_key(BEING_CREATED) && annotations.contains_key(BEING_DELETED)
}

/// The group's CSI handle and its members' snapshot IDs: from the status, else from the
/// pre-provisioned source.
fn handles(content: &VolumeGroupSnapshotContent) -> Option<GroupDeletion> {
    let status = content.status.as_ref();
    let source = content.spec.source.group_snapshot_handles.as_ref();
    let group_snapshot_id = status
        .and_then(|s| s.volume_group_snapshot_handle.clone())
        .or_else(|| source.map(|s| s.volume_group_snapshot_handle.clone()))?;
    let mut snapshot_ids: Vec<String> = status
        .map(|s| s.members())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.snapshot_handle)
        .collect();
    if snapshot_ids.is_empty() {
        snapshot_ids = source
            .map(|s| s.volume_snapshot_handles.clone())
            .unwrap_or_default();
    }
    Some(GroupDeletion {
        group_snapshot_id,
        snapshot_ids,
    })
}

/// Upstream `syncGroupSnapshotContent` of the sidecar.
pub fn plan(content: &VolumeGroupSnapshotContent, driver: &str) -> GroupContentPlan {
    if content.spec.driver != driver {
        return GroupContentPlan::NotOurs;
    }
    if should_delete(content) {
        let cut = content
            .status
            .as_ref()
            .is_some_and(|s| s.volume_group_snapshot_handle.is_some());
        let delete = (content.spec.deletion_policy == DeletionPolicy::Delete && cut)
            .then(|| handles(content))
            .flatten();
        let remove_finalizer = content
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == GROUP_CONTENT_BOUND_FINALIZER);
        return if delete.is_none() && !remove_finalizer {
            GroupContentPlan::Nothing
        } else {
            GroupContentPlan::Delete {
                delete,
                remove_finalizer,
            }
        };
    }
    if is_ready(content) {
        return if annotations(content).contains_key(BEING_CREATED) {
            GroupContentPlan::ClearBeingCreated
        } else {
            GroupContentPlan::Nothing
        };
    }
    if content.spec.source.group_snapshot_handles.is_some() {
        return match handles(content) {
            Some(handles) => GroupContentPlan::Refresh(handles),
            None => GroupContentPlan::Nothing,
        };
    }
    GroupContentPlan::Create
}

/// The CSI group snapshot name: `<prefix>-<group UID>`, or with `uuid_length` ≥ 0 that many
/// characters of the UID without dashes (upstream `makeSnapshotName` for groups).
pub fn group_snapshot_name(
    prefix: &str,
    group_uid: &str,
    uuid_length: i64,
) -> Result<String, String> {
    if group_uid.is_empty() {
        return Err("group snapshot object is missing UID".to_string());
    }
    snapshot_name(prefix, group_uid, uuid_length)
}

/// The `--extra-create-metadata` parameters.
pub fn add_extra_metadata(
    parameters: &mut HashMap<String, String>,
    content: &VolumeGroupSnapshotContent,
) {
    let reference = &content.spec.volume_group_snapshot_ref;
    parameters.insert(
        GROUP_NAME_KEY.into(),
        reference.name.clone().unwrap_or_default(),
    );
    parameters.insert(
        GROUP_NAMESPACE_KEY.into(),
        reference.namespace.clone().unwrap_or_default(),
    );
    parameters.insert(
        GROUP_CONTENT_NAME_KEY.into(),
        content.metadata.name.clone().unwrap_or_default(),
    );
}

/// A CSI timestamp in nanoseconds since the epoch, if the driver gave one.
fn nanos(timestamp: Option<&prost_types::Timestamp>) -> Option<i64> {
    timestamp
        .filter(|t| t.seconds != 0 || t.nanos != 0)
        .map(|t| {
            t.seconds
                .saturating_mul(1_000_000_000)
                .saturating_add(i64::from(t.nanos))
        })
}

fn time(timestamp: Option<&prost_types::Timestamp>) -> Option<Time> {
    let nanos = nanos(timestamp)?;
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .ok()
        .map(Time)
}

/// The content status after the driver's answer (upstream `updateGroupSnapshotContentStatus`):
/// the handle, readiness (a ready group clears the error), the creation time (`now` when the
/// driver gave none) and, once, the members; `None` when nothing changes.
pub fn status_after(
    status: Option<&VolumeGroupSnapshotContentStatus>,
    group: &csi::VolumeGroupSnapshot,
    now: Time,
) -> Option<VolumeGroupSnapshotContentStatus> {
    let mut new = status.cloned().unwrap_or_default();
    if new.volume_group_snapshot_handle.is_none() {
        new.volume_group_snapshot_handle = Some(group.group_snapshot_id.clone());
    }
    if new.ready_to_use != Some(group.ready_to_use) {
        new.ready_to_use = Some(group.ready_to_use);
        if group.ready_to_use {
            new.error = None;
        }
    }
    if new.creation_time.is_none() {
        new.creation_time = Some(time(group.creation_time.as_ref()).unwrap_or(now));
    }
    let members: Vec<VolumeSnapshotInfo> = group
        .snapshots
        .iter()
        .map(|s| VolumeSnapshotInfo {
            volume_handle: Some(s.source_volume_id.clone()),
            snapshot_handle: Some(s.snapshot_id.clone()),
            creation_time: nanos(s.creation_time.as_ref()),
            ready_to_use: Some(s.ready_to_use),
            restore_size: (s.size_bytes > 0).then_some(s.size_bytes),
        })
        .collect();
    // A member's readiness follows the driver's; the rest of a listed member stays as written.
    let listed = new.members();
    if listed.is_empty() && !members.is_empty() {
        new.set_members(members);
    } else if !listed.is_empty() {
        let updated: Vec<VolumeSnapshotInfo> = listed
            .into_iter()
            .map(|mut member| {
                if let Some(answer) = members
                    .iter()
                    .find(|m| m.snapshot_handle == member.snapshot_handle)
                {
                    member.ready_to_use = answer.ready_to_use;
                }
                member
            })
            .collect();
        if Some(&updated) != new.volume_snapshot_info_list.as_ref() {
            new.set_members(updated);
        }
    }
    (status != Some(&new)).then_some(new)
}

#[cfg(test)]
mod tests;

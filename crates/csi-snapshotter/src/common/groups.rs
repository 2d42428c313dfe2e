//! The snapshot-controller's adapters for volume group snapshots: each VolumeGroupSnapshot is
//! planned ([`crate::group`]) from the caches and its one step acted on; each
//! VolumeGroupSnapshotContent gets its bound finalizer. A group syncs again when its content,
//! one of its member snapshots, or a claim of its namespace changes.

use std::sync::Arc;

use csi_sidecar::events::EventType;
use csi_sidecar::finalizers::{add_finalizer, set_finalizers, without};
use csi_sidecar::lock;
use csi_sidecar::workers::Synced;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Controller, Key, SyncError};
use crate::group::{
    self, GroupContentStep, GroupInputs, GroupStep, owning_group, reason as group_reason,
};
use crate::metrics::{CANCEL, Operation, SUCCESS};
use crate::sidecar::now;
use crate::snapshot::{Failure, Recording, controller_update_error};
use csi_kinds::groupsnapshot::{
    BEING_DELETED, GROUP_CONTENT_BOUND_FINALIZER, GROUP_SNAPSHOT_BOUND_FINALIZER,
    VolumeGroupSnapshot, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
    VolumeGroupSnapshotStatus, group_snapshot_key, member_content_name,
};
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent, status_merge_patch};

/// The group kinds' caches (with the CSIVolumeGroupSnapshot gate and the API served).
pub(super) struct GroupCaches {
    pub groups: Store<VolumeGroupSnapshot>,
    pub contents: Store<VolumeGroupSnapshotContent>,
    pub classes: Store<VolumeGroupSnapshotClass>,
}

/// The cached objects of one group's plan, owned for the sync.
struct Owned {
    content: Option<Arc<VolumeGroupSnapshotContent>>,
    classes: Vec<Arc<VolumeGroupSnapshotClass>>,
    claims: Vec<Arc<PersistentVolumeClaim>>,
    volumes: Vec<Arc<PersistentVolume>>,
    members: Vec<Arc<VolumeSnapshot>>,
    member_contents: Vec<Arc<VolumeSnapshotContent>>,
}

fn group_ref(
    namespace: Option<&str>,
    name: Option<&str>,
) -> Option<ObjectRef<VolumeGroupSnapshot>> {
    Some(ObjectRef::new(name?).within(namespace?))
}

impl Controller {
    fn group_caches(&self) -> Option<&GroupCaches> {
        self.caches.groups.as_ref()
    }

    /// Every group and group content.
    pub(super) fn group_keys(&self) -> Vec<Key> {
        let Some(caches) = self.group_caches() else {
            return Vec::new();
        };
        caches
            .groups
            .state()
            .iter()
            .map(|g| Key::Group(ObjectRef::from_obj(g.as_ref())))
            .chain(
                caches
                    .contents
                    .state()
                    .iter()
                    .map(|c| Key::GroupContent(ObjectRef::from_obj(c.as_ref()))),
            )
            .collect()
    }

    /// The group a member snapshot belongs to (its sync follows the member's changes), and the
    /// unbound groups of a claim's namespace (they wait for their claims).
    pub(super) fn groups_concerned(&self, key: &Key) -> Vec<Key> {
        let Some(caches) = self.group_caches() else {
            return Vec::new();
        };
        match key {
            Key::Snapshot(reference) => self
                .caches
                .snapshots
                .get(reference)
                .and_then(|s| {
                    let owner = owning_group(&s)?;
                    Some(Key::Group(
                        ObjectRef::new(&owner.name).within(reference.namespace.as_deref()?),
                    ))
                })
                .into_iter()
                .collect(),
            Key::Claim(claim) => caches
                .groups
                .state()
                .iter()
                .filter(|g| g.namespace().as_deref() == claim.namespace.as_deref())
                .filter(|g| {
                    g.status
                        .as_ref()
                        .and_then(|s| s.bound_volume_group_snapshot_content_name.as_ref())
                        .is_none()
                })
                .map(|g| Key::Group(ObjectRef::from_obj(g.as_ref())))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn group_inputs(&self, group: &VolumeGroupSnapshot) -> Option<Owned> {
        let caches = self.group_caches()?;
        let namespace = group.namespace().unwrap_or_default();
        let content = caches
            .contents
            .get(&ObjectRef::new(&group::content_name(group)));
        let uid = group.metadata.uid.clone().unwrap_or_default();
        let members: Vec<Arc<VolumeSnapshot>> = self
            .caches
            .snapshots
            .state()
            .into_iter()
            .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|s| owning_group(s).is_some_and(|o| o.uid == uid))
            .collect();
        let member_contents = content
            .iter()
            .filter_map(|c| c.status.as_ref())
            .flat_map(|s| s.members())
            .filter_map(|m| {
                let name = member_content_name(&uid, m.volume_handle.as_deref()?);
                self.caches.contents.get(&ObjectRef::new(&name))
            })
            .collect();
        Some(Owned {
            content,
            classes: caches.classes.state(),
            claims: self
                .caches
                .claims
                .state()
                .into_iter()
                .filter(|c| c.namespace().as_deref() == Some(namespace.as_str()))
                .collect(),
            volumes: self.caches.volumes.state(),
            members,
            member_contents,
        })
    }

    /// What a group's plan depends on, as one version string; `None` when it is gone.
    pub(super) fn group_version(
        &self,
        reference: &ObjectRef<VolumeGroupSnapshot>,
    ) -> Option<String> {
        let group = self.group_caches()?.groups.get(reference)?;
        let owned = self.group_inputs(&group)?;
        let versions = |objects: Vec<Option<String>>| {
            objects.into_iter().flatten().collect::<Vec<_>>().join(",")
        };
        Some(format!(
            "{}/{}/{}/{}/{}/{}",
            group.resource_version().unwrap_or_default(),
            owned
                .content
                .as_ref()
                .and_then(|c| c.resource_version())
                .unwrap_or_default(),
            versions(owned.members.iter().map(|m| m.resource_version()).collect()),
            versions(
                owned
                    .member_contents
                    .iter()
                    .map(|m| m.resource_version())
                    .collect()
            ),
            versions(owned.classes.iter().map(|c| c.resource_version()).collect()),
            versions(owned.claims.iter().map(|c| c.resource_version()).collect()),
        ))
    }

    pub(super) fn group_content_version(
        &self,
        reference: &ObjectRef<VolumeGroupSnapshotContent>,
    ) -> Option<String> {
        let content = self.group_caches()?.contents.get(reference)?;
        Some(content.resource_version().unwrap_or_default())
    }

    /// A group is gone: its deletion is over.
    pub(super) fn group_gone(&self, reference: &ObjectRef<VolumeGroupSnapshot>) {
        if let Some(uid) = lock(&self.deleting_groups).remove(reference) {
            self.settings
                .metrics
                .finish(Operation::DeleteGroupSnapshot, &uid, SUCCESS);
        }
    }

    pub(super) async fn sync_group(
        &self,
        reference: &ObjectRef<VolumeGroupSnapshot>,
    ) -> Result<Synced, SyncError> {
        let Some(group) = self.group_caches().and_then(|c| c.groups.get(reference)) else {
            return Ok(Synced::Done);
        };
        if self
            .superseded_groups
            .is_stale(reference, group.resource_version().as_deref())
        {
            return Ok(Synced::Waiting);
        }
        let Some(owned) = self.group_inputs(&group) else {
            return Ok(Synced::Done);
        };
        let classes: Vec<_> = owned.classes.iter().map(AsRef::as_ref).collect();
        let claims: Vec<_> = owned.claims.iter().map(AsRef::as_ref).collect();
        let volumes: Vec<_> = owned.volumes.iter().map(AsRef::as_ref).collect();
        let members: Vec<_> = owned.members.iter().map(AsRef::as_ref).collect();
        let member_contents: Vec<_> = owned.member_contents.iter().map(AsRef::as_ref).collect();
        let inputs = GroupInputs {
            content: owned.content.as_deref(),
            classes: &classes,
            claims: &claims,
            volumes: &volumes,
            members: &members,
            member_contents: &member_contents,
        };
        self.track_group(&group, &inputs);
        let step = group::plan(&group, &inputs);
        tracing::debug!(group = %group_snapshot_key(&group), ?step, "group snapshot step");
        self.act_group(&group, step).await
    }

    /// Starts the group's operation metrics its state implies, as for snapshots.
    fn track_group(&self, group: &VolumeGroupSnapshot, inputs: &GroupInputs<'_>) {
        let metrics = &self.settings.metrics;
        let uid = group.uid().unwrap_or_default();
        let pre_provisioned = group
            .spec
            .source
            .volume_group_snapshot_content_name
            .is_some();
        let driver = inputs
            .content
            .map(|c| c.spec.driver.clone())
            .or_else(|| {
                let class = group.spec.volume_group_snapshot_class_name.as_ref()?;
                let found = inputs
                    .classes
                    .iter()
                    .find(|c| c.metadata.name.as_ref() == Some(class))?;
                Some(found.driver.clone())
            })
            .unwrap_or_default();
        if group.metadata.deletion_timestamp.is_some() {
            if group::is_deletion_candidate(group) {
                metrics.finish(Operation::CreateGroupSnapshot, &uid, CANCEL);
                metrics.finish(Operation::CreateGroupSnapshotAndReady, &uid, CANCEL);
                metrics.start(
                    Operation::DeleteGroupSnapshot,
                    &uid,
                    &driver,
                    pre_provisioned,
                );
                lock(&self.deleting_groups).insert(ObjectRef::from_obj(group), uid);
            }
            return;
        }
        let status = group.status.as_ref();
        if status.and_then(|s| s.ready_to_use) != Some(true) {
            if status.and_then(|s| s.creation_time.as_ref()).is_none() {
                metrics.start(
                    Operation::CreateGroupSnapshot,
                    &uid,
                    &driver,
                    pre_provisioned,
                );
            }
            metrics.start(
                Operation::CreateGroupSnapshotAndReady,
                &uid,
                &driver,
                pre_provisioned,
            );
        }
    }

    async fn act_group(
        &self,
        group: &VolumeGroupSnapshot,
        step: GroupStep,
    ) -> Result<Synced, SyncError> {
        let key = group_snapshot_key(group);
        let namespace = group.namespace().unwrap_or_default();
        let groups: Api<VolumeGroupSnapshot> = Api::namespaced(self.client.clone(), &namespace);
        let contents: Api<VolumeGroupSnapshotContent> = Api::all(self.client.clone());
        let update_error = |source: kube::Error| SyncError::Update {
            object: key.clone(),
            source,
        };
        match step {
            GroupStep::Nothing => {}
            GroupStep::Fail(failure) => return Err(self.fail_group(group, failure).await),
            GroupStep::SetClass(class) => {
                let patch = json!({"spec": {"volumeGroupSnapshotClassName": class}});
                let updated = groups
                    .patch(
                        &group.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .map_err(update_error)?;
                self.superseded_groups
                    .wrote(ObjectRef::from_obj(group), group, &updated);
            }
            GroupStep::AddFinalizer => {
                let mut finalizers = group.finalizers().to_vec();
                finalizers.push(GROUP_SNAPSHOT_BOUND_FINALIZER.into());
                match set_finalizers(&groups, group, finalizers).await {
                    Ok(Some(updated)) => {
                        self.superseded_groups
                            .wrote(ObjectRef::from_obj(group), group, &updated);
                    }
                    Ok(None) => {}
                    Err(error) => {
                        let message = format!(
                            "Failed to check and update group snapshot: {}",
                            controller_update_error(&key, error.cause())
                        );
                        self.group_event(
                            group,
                            EventType::Warning,
                            group_reason::FINALIZER_ERROR,
                            &message,
                        )
                        .await;
                        return Err(SyncError::Failed(message));
                    }
                }
            }
            GroupStep::CreateContent(content) => {
                match contents.create(&PostParams::default(), &content).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(error) => {
                        let message = format!(
                            "Error creating volume group snapshot content object for group snapshot {key}: {error}."
                        );
                        self.group_event(
                            group,
                            EventType::Warning,
                            group_reason::CREATE_CONTENT_FAILED,
                            &message,
                        )
                        .await;
                        let failure = Failure {
                            reason: group_reason::CONTENT_CREATION_FAILED,
                            message: format!(
                                "failed to create group snapshot content with error {}",
                                controller_update_error(&key, error)
                            ),
                            status: Some(true),
                        };
                        return Err(self.fail_group(group, failure).await);
                    }
                }
                self.group_event(
                    group,
                    EventType::Normal,
                    group_reason::CREATING,
                    &format!("Waiting for a group snapshot {key} to be created by the CSI driver."),
                )
                .await;
            }
            GroupStep::Bind {
                content,
                uid,
                class,
            } => {
                let mut patch = vec![
                    json!({"op": "add", "path": "/spec/volumeGroupSnapshotRef/uid", "value": uid}),
                ];
                if let Some(class) = class {
                    patch.push(json!({"op": "add", "path": "/spec/volumeGroupSnapshotClassName", "value": class}));
                }
                let patch: json_patch::Patch = serde_json::from_value(json!(patch))
                    .map_err(|e| SyncError::Failed(e.to_string()))?;
                if let Err(error) = contents
                    .patch(&content, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await
                {
                    let failure = Failure {
                        reason: group_reason::BIND_FAILED,
                        message: format!(
                            "GroupSnapshot failed to bind VolumeGroupSnapshotContent, {error}"
                        ),
                        status: Some(true),
                    };
                    return Err(self.fail_group(group, failure).await);
                }
            }
            GroupStep::CreateMemberSnapshots(snapshots) => {
                let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &namespace);
                for snapshot in snapshots {
                    create_or_exists(&api, &snapshot, &key).await?;
                }
            }
            GroupStep::CreateMemberContents(members) => {
                let api: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
                for content in members {
                    create_or_exists(&api, &content, &key).await?;
                }
            }
            GroupStep::SetMemberContentStatus(statuses) => {
                let api: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
                for (name, status) in statuses {
                    let patch = json!({"status": status});
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(|source| SyncError::Update {
                            object: name.clone(),
                            source,
                        })?;
                }
            }
            GroupStep::UpdateStatus { status, events } => {
                if let Err(error) = self.patch_group_status(group, &status).await {
                    let failure = Failure {
                        reason: group_reason::STATUS_UPDATE_FAILED,
                        message: format!(
                            "GroupSnapshot status update failed, {}",
                            controller_update_error(&key, error)
                        ),
                        status: Some(false),
                    };
                    return Err(self.fail_group(group, failure).await);
                }
                let uid = group.uid().unwrap_or_default();
                let metrics = &self.settings.metrics;
                for (reason, message) in events {
                    match reason {
                        group_reason::CREATED => {
                            metrics.finish(Operation::CreateGroupSnapshot, &uid, SUCCESS);
                        }
                        group_reason::READY => {
                            metrics.finish(Operation::CreateGroupSnapshotAndReady, &uid, SUCCESS);
                        }
                        _ => {}
                    }
                    self.group_event(group, EventType::Normal, reason, &message)
                        .await;
                }
            }
            GroupStep::MarkContentBeingDeleted(name) => {
                let patch = json!({"metadata": {"annotations": {BEING_DELETED: "yes"}}});
                contents
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| SyncError::Update {
                        object: name,
                        source,
                    })?;
            }
            GroupStep::DeleteContent(name) => {
                match contents.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => {
                        self.group_event(
                            group,
                            EventType::Warning,
                            group_reason::CONTENT_DELETE_ERROR,
                            "Failed to delete group snapshot content API object",
                        )
                        .await;
                        return Err(SyncError::Failed(format!(
                            "failed to delete VolumeGroupSnapshotContent {name} from API server: {error}"
                        )));
                    }
                }
            }
            GroupStep::DeleteMembers(names) => {
                let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &namespace);
                for name in names {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(error) => {
                            let message = format!(
                                "failed to delete snapshot API object {namespace}/{name} part of group snapshot {key}: {error}"
                            );
                            self.group_event(
                                group,
                                EventType::Warning,
                                group_reason::SNAPSHOT_DELETE_ERROR,
                                &message,
                            )
                            .await;
                            return Err(SyncError::Failed(message));
                        }
                    }
                }
            }
            GroupStep::RemoveFinalizer => {
                set_finalizers(
                    &groups,
                    group,
                    without(group.finalizers(), GROUP_SNAPSHOT_BOUND_FINALIZER),
                )
                .await?;
            }
        }
        Ok(Synced::Done)
    }

    /// A Warning Event and, where upstream records it, the error in the group's status (once
    /// per message).
    async fn fail_group(&self, group: &VolumeGroupSnapshot, failure: Failure) -> SyncError {
        match failure.recording(group.status.as_ref(), now()) {
            Recording::Recorded => return SyncError::Failed(failure.message),
            Recording::Status(status) => {
                if let Err(error) = self.patch_group_status(group, &status).await {
                    tracing::warn!(group = %group_snapshot_key(group), %error, "failed to record the error in the group's status");
                }
            }
            Recording::EventOnly => {}
        }
        self.group_event(group, EventType::Warning, failure.reason, &failure.message)
            .await;
        SyncError::Failed(failure.message)
    }

    async fn patch_group_status(
        &self,
        group: &VolumeGroupSnapshot,
        status: &VolumeGroupSnapshotStatus,
    ) -> Result<(), kube::Error> {
        let api: Api<VolumeGroupSnapshot> =
            Api::namespaced(self.client.clone(), &group.namespace().unwrap_or_default());
        let patch = status_merge_patch(group.status.as_ref(), status);
        let updated = api
            .patch_status(
                &group.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.superseded_groups
            .wrote(ObjectRef::from_obj(group), group, &updated);
        Ok(())
    }

    async fn group_event(
        &self,
        group: &VolumeGroupSnapshot,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        self.events
            .publish(&group.object_ref(&()), event_type, reason, message)
            .await;
    }

    /// The bound finalizer of a group content (upstream common `syncGroupSnapshotContent`).
    pub(super) async fn sync_group_content(
        &self,
        reference: &ObjectRef<VolumeGroupSnapshotContent>,
    ) -> Result<Synced, SyncError> {
        let Some(content) = self.group_caches().and_then(|c| c.contents.get(reference)) else {
            return Ok(Synced::Done);
        };
        match group::content_plan(&content) {
            GroupContentStep::Nothing => {}
            GroupContentStep::Invalid(message) => {
                self.events
                    .publish(
                        &content.object_ref(&()),
                        EventType::Warning,
                        group_reason::CONTENT_VALIDATION_ERROR,
                        &message,
                    )
                    .await;
                return Err(SyncError::Failed(message));
            }
            GroupContentStep::AddFinalizer => {
                let api: Api<VolumeGroupSnapshotContent> = Api::all(self.client.clone());
                add_finalizer(&api, content.as_ref(), GROUP_CONTENT_BOUND_FINALIZER).await?;
            }
        }
        Ok(Synced::Done)
    }

    /// The group a group content names (its change syncs the group).
    pub(super) fn group_of(content: &VolumeGroupSnapshotContent) -> Option<Key> {
        let reference = &content.spec.volume_group_snapshot_ref;
        Some(Key::Group(group_ref(
            reference.namespace.as_deref(),
            reference.name.as_deref(),
        )?))
    }
}

/// Creates `object`; one that exists already (a sync that ran before) is fine.
async fn create_or_exists<K>(api: &Api<K>, object: &K, group: &str) -> Result<(), SyncError>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => {
            tracing::warn!(group, object = %object.name_any(), %source, "creating a group member failed");
            Err(SyncError::Update {
                object: object.name_any(),
                source,
            })
        }
    }
}

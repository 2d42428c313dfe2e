//! The csi-snapshotter sidecar's adapters for volume group snapshots: caches of
//! VolumeGroupSnapshotContents and VolumeGroupSnapshotClasses; each content of our driver is
//! planned ([`crate::group_content`]) and acted on by its own keyed workers (upstream's queue
//! `csi-snapshotter-groupsnapshotcontent`): CreateVolumeGroupSnapshot with the being-created
//! annotation around it, GetVolumeGroupSnapshot for pre-provisioned groups,
//! DeleteVolumeGroupSnapshot and the bound finalizer, with upstream's Events and `status.error`.
//! Member contents are the snapshot-controller's to make, and the ordinary sidecar leaves their
//! snapshots to the group ([`crate::content`]).

use std::collections::HashMap;
use std::sync::Arc;

use csi_grpc::conn::{CsiConnection, GoStatus};
use csi_kinds::secrets::SecretRef;
use csi_proto::csi::v1 as csi;
use csi_sidecar::finalizers::{set_finalizers, without};
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::content_writes::ContentWrites;
use crate::group_content::{self, GroupContentPlan, GroupDeletion, reason};
use crate::secrets::{
    GROUP_CONTENT_SECRET, GROUP_SNAPSHOTTER_GET, annotated_secret, create_parameters,
    secret_reference,
};
use crate::sidecar::{CreateError, Settings, SidecarError, SyncError, now, secret_data};
use csi_kinds::groupsnapshot::{
    GROUP_CONTENT_BOUND_FINALIZER, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
};
use csi_kinds::snapshot::status_merge_patch;

type Key = ObjectRef<VolumeGroupSnapshotContent>;

struct Controller {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    contents: Store<VolumeGroupSnapshotContent>,
    classes: Store<VolumeGroupSnapshotClass>,
    writes: ContentWrites<VolumeGroupSnapshotContent>,
}

/// Runs the group controller until `shutdown`.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), SidecarError> {
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    let queue = settings
        .workqueues
        .queue("csi-snapshotter-groupsnapshotcontent");
    workers.report_to(vec![queue], |_| 0);
    let mut informers = csi_sidecar::informers::Informers::new(&client, &shutdown)
        .reporting_to(&settings.cache_sync);
    let work = workers.clone();
    let driver = settings.driver_name.clone();
    // Under `--node-deployment` only the group contents labelled with our node, as upstream's
    // (whose snapshot-controller labels none: a node's instance then cuts no group snapshot).
    let contents = informers.watch_with(
        Api::all(client.clone()),
        settings.content_watch(),
        move |content: &VolumeGroupSnapshotContent| {
            if content.spec.driver == driver {
                work.trigger_for(ObjectRef::from_obj(content), content);
            }
        },
    );
    let classes = informers.all::<VolumeGroupSnapshotClass>();
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let controller = Arc::new(Controller {
        writes: ContentWrites::new(
            client.clone(),
            &settings.driver_name,
            settings.retry_start,
            settings.retry_max,
        ),
        client,
        csi,
        contents,
        classes,
        settings,
    });
    tracing::info!(driver = %controller.settings.driver_name, "group snapshots started");
    workers
        .reconcile(
            &controller,
            JoinSet::new(),
            &wake,
            controller.settings.resync,
            &shutdown,
        )
        .await;
    Ok(())
}

impl Reconciler for Controller {
    type Key = Key;
    type Error = SyncError;

    /// The group contents of our driver.
    fn keys(&self) -> Vec<Key> {
        self.contents
            .state()
            .iter()
            .filter(|c| c.spec.driver == self.settings.driver_name)
            .map(|c| ObjectRef::from_obj(c.as_ref()))
            .collect()
    }

    fn offer(&self, key: &Key) -> Offer {
        match self.contents.get(key) {
            Some(content) => Offer::at(Some(content.resource_version().unwrap_or_default())),
            None => Offer::Gone,
        }
    }

    fn sync(self: Arc<Self>, key: Key) -> SyncFuture<SyncError> {
        Box::pin(async move { self.sync_content(&key).await })
    }

    fn forget(&self, key: &Key) {
        self.writes.forget(key);
    }
}

impl Controller {
    async fn sync_content(&self, key: &Key) -> Result<Synced, SyncError> {
        let Some(content) = self.contents.get(key) else {
            return Ok(Synced::Done);
        };
        if self.writes.is_stale(key, &content) {
            return Ok(Synced::Waiting);
        }
        let plan = group_content::plan(&content, &self.settings.driver_name);
        tracing::debug!(content = %content.name_any(), ?plan, "group content step");
        let (outcome, reason, prefix) = match plan {
            GroupContentPlan::NotOurs | GroupContentPlan::Nothing => return Ok(Synced::Done),
            GroupContentPlan::ClearBeingCreated => {
                self.writes.set_being_created(&content, false).await?;
                return Ok(self.writes.poll(key, true));
            }
            GroupContentPlan::Delete {
                delete,
                remove_finalizer,
            } => return self.delete(&content, delete, remove_finalizer).await,
            GroupContentPlan::Create if content.status.is_none() => (
                self.create(&content).await,
                reason::CREATION_FAILED,
                "Failed to create group snapshot",
            ),
            GroupContentPlan::Create => (
                self.create(&content).await,
                reason::CHECK_AND_UPDATE_FAILED,
                "Failed to check and update group snapshot content",
            ),
            GroupContentPlan::Refresh(handles) => (
                self.refresh(&content, handles).await,
                reason::CHECK_AND_UPDATE_FAILED,
                "Failed to check and update group snapshot content",
            ),
        };
        match outcome {
            Ok(ready) => Ok(self.writes.poll(key, ready)),
            Err(CreateError::Failed(message)) => Err(self
                .writes
                .record_error(&content, reason, format!("{prefix}: {message}"))
                .await),
            Err(CreateError::Sync(error)) => Err(error),
        }
    }

    /// The data of the secret a content recorded (upstream's group credentials).
    async fn recorded_secrets(
        &self,
        content: &VolumeGroupSnapshotContent,
    ) -> Result<HashMap<String, String>, String> {
        let name = content.name_any();
        let secret = annotated_secret(GROUP_CONTENT_SECRET, &name, content.annotations())
            .map_err(|e| e.to_string())?;
        self.secrets(&name, secret.as_ref()).await
    }

    async fn secrets(
        &self,
        content: &str,
        secret: Option<&SecretRef>,
    ) -> Result<HashMap<String, String>, String> {
        secret_data(&self.client, "group snapshot content", content, secret).await
    }

    /// CreateVolumeGroupSnapshot (upstream `createGroupSnapshotWrapper`); whether the group is
    /// ready.
    async fn create(&self, content: &VolumeGroupSnapshotContent) -> Result<bool, CreateError> {
        let name = content.name_any();
        let input_error = |error: String| {
            CreateError::Failed(format!(
                "failed to get input parameters to create group snapshot for group snapshot content {name}: {error:?}"
            ))
        };
        let class_name = content
            .spec
            .volume_group_snapshot_class_name
            .as_ref()
            .ok_or_else(|| {
                input_error(format!(
                    "failed to take group snapshot {name} without a group snapshot class"
                ))
            })?;
        let class = self
            .classes
            .get(&ObjectRef::new(class_name))
            .ok_or_else(|| {
                input_error(format!(
                    "volumegroupsnapshotclass.groupsnapshot.storage.k8s.io \"{class_name}\" not found"
                ))
            })?;
        let secrets = self.recorded_secrets(content).await.map_err(input_error)?;
        let mut parameters = create_parameters(&class.parameters())
            .map_err(|e| CreateError::Failed(e.to_string()))?;
        if self.settings.extra_create_metadata {
            group_content::add_extra_metadata(&mut parameters, content);
        }
        let uid = content
            .spec
            .volume_group_snapshot_ref
            .uid
            .clone()
            .unwrap_or_default();
        if uid.is_empty() {
            return Err(CreateError::Failed(format!(
                "cannot create group snapshot. Group snapshot content {name} not bound to a group snapshot"
            )));
        }
        let volumes = content
            .spec
            .source
            .volume_handles
            .clone()
            .unwrap_or_default();
        if volumes.is_empty() {
            return Err(CreateError::Failed(format!(
                "cannot create group snapshot. PVCs to be snapshotted not found in group snapshot content {name}"
            )));
        }
        let group_name = group_content::group_snapshot_name(
            &self.settings.group_snapshot_name_prefix,
            &uid,
            self.settings.group_snapshot_name_uuid_length,
        )
        .map_err(CreateError::Failed)?;
        let content = self.writes.set_being_created(content, true).await?;
        let request = csi::CreateVolumeGroupSnapshotRequest {
            name: group_name,
            source_volume_ids: volumes.clone(),
            secrets,
            parameters,
        };
        let group = match self
            .csi
            .create_volume_group_snapshot(request, self.settings.timeout)
            .await
        {
            Ok(response) => response.group_snapshot.unwrap_or_default(),
            Err(status) => {
                if csi_grpc::conn::is_final_error(status.code()) {
                    self.writes.set_being_created(&content, false).await?;
                }
                return Err(CreateError::Failed(format!(
                    "failed to take group snapshot of the volumes {volumes:?}: {:?}",
                    GoStatus(&status).to_string()
                )));
            }
        };
        let content = self.update_status(&content, &group).await?;
        self.writes.set_being_created(&content, false).await?;
        tracing::info!(content = %name, group = %group.group_snapshot_id, ready = group.ready_to_use, "group snapshot cut");
        Ok(group.ready_to_use)
    }

    /// GetVolumeGroupSnapshot for a pre-provisioned group.
    async fn refresh(
        &self,
        content: &VolumeGroupSnapshotContent,
        handles: GroupDeletion,
    ) -> Result<bool, CreateError> {
        let name = content.name_any();
        if handles.snapshot_ids.is_empty() {
            return Err(CreateError::Failed(format!(
                "cannot list group snapshot {}. No snapshots found in the group snapshot content",
                handles.group_snapshot_id
            )));
        }
        let mut secret = None;
        if let Some(class_name) = &content.spec.volume_group_snapshot_class_name {
            let class = self.classes.get(&ObjectRef::new(class_name)).ok_or_else(|| {
                CreateError::Failed(format!(
                    "failed to get group snapshot class {class_name} for group snapshot content {name}: volumegroupsnapshotclass.groupsnapshot.storage.k8s.io \"{class_name}\" not found"
                ))
            })?;
            secret = secret_reference(GROUP_SNAPSHOTTER_GET, &class.parameters(), &name, None)
                .map_err(|e| CreateError::Failed(e.to_string()))?;
        }
        let secrets = self
            .secrets(&name, secret.as_ref())
            .await
            .map_err(CreateError::Failed)?;
        let request = csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: handles.group_snapshot_id,
            snapshot_ids: handles.snapshot_ids,
            secrets,
        };
        let group = self
            .csi
            .get_volume_group_snapshot(request, self.settings.timeout)
            .await
            .map_err(|status| {
                CreateError::Failed(format!(
                    "failed to list group snapshot for group snapshot content {name}: {:?}",
                    GoStatus(&status).to_string()
                ))
            })?
            .group_snapshot
            .unwrap_or_default();
        self.update_status(content, &group).await?;
        Ok(group.ready_to_use)
    }

    /// DeleteVolumeGroupSnapshot when the plan says so, then the bound finalizer.
    async fn delete(
        &self,
        content: &VolumeGroupSnapshotContent,
        delete: Option<GroupDeletion>,
        remove_finalizer: bool,
    ) -> Result<Synced, SyncError> {
        let name = content.name_any();
        let mut current = content.clone();
        if let Some(delete) = delete {
            let secrets = match self.recorded_secrets(content).await {
                Ok(secrets) => secrets,
                Err(error) => {
                    self.writes
                        .warn(
                            content,
                            reason::DELETE_ERROR,
                            "Failed to get snapshot credentials",
                        )
                        .await;
                    return Err(SyncError::Snapshot(format!(
                        "failed to get input parameters to delete group snapshot for content {name}: {error:?}"
                    )));
                }
            };
            let request = csi::DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: delete.group_snapshot_id,
                snapshot_ids: delete.snapshot_ids,
                secrets,
            };
            if let Err(status) = self
                .csi
                .delete_volume_group_snapshot(request, self.settings.timeout)
                .await
            {
                self.writes
                    .warn(
                        content,
                        reason::DELETE_ERROR,
                        "Failed to delete group snapshot",
                    )
                    .await;
                return Err(SyncError::Snapshot(format!(
                    "failed to delete group snapshot content {name}: {:?}",
                    GoStatus(&status).to_string()
                )));
            }
            // Cleared, so a retry after a failed finalizer removal does not delete again.
            let cleared = json!({"status": {"volumeGroupSnapshotHandle": null,
                "readyToUse": null, "creationTime": null, "error": null}});
            current = match self.writes.patch_status(content, &cleared).await {
                Ok(updated) => updated,
                Err(error) => {
                    self.writes
                        .warn(
                            content,
                            reason::DELETE_ERROR,
                            "Failed to clear content status",
                        )
                        .await;
                    return Err(error);
                }
            };
            tracing::info!(content = %name, "group snapshot deleted");
        }
        if remove_finalizer {
            let api: Api<VolumeGroupSnapshotContent> = Api::all(self.client.clone());
            set_finalizers(
                &api,
                &current,
                without(current.finalizers(), GROUP_CONTENT_BOUND_FINALIZER),
            )
            .await?;
        }
        Ok(Synced::Done)
    }

    /// The status after the driver's answer, written when it changed.
    async fn update_status(
        &self,
        content: &VolumeGroupSnapshotContent,
        group: &csi::VolumeGroupSnapshot,
    ) -> Result<VolumeGroupSnapshotContent, SyncError> {
        match group_content::status_after(content.status.as_ref(), group, now()) {
            Some(status) => {
                self.writes
                    .patch_status(
                        content,
                        &status_merge_patch(content.status.as_ref(), &status),
                    )
                    .await
            }
            None => Ok(content.clone()),
        }
    }
}

//! The csi-snapshotter sidecar's adapters: caches of VolumeSnapshotContents and
//! VolumeSnapshotClasses; a content's change triggers its key; each triggered content is
//! planned ([`crate::content`]) and acted on by the keyed workers: CreateSnapshot (with the
//! being-created annotation around it), ListSnapshots for pre-provisioned snapshots,
//! DeleteSnapshot and the bound finalizer, with upstream's Events and `status.error`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use csi_grpc::conn::{CsiConnection, GoStatus};
use csi_kinds::secrets::SecretRef;
use csi_proto::csi::v1 as csi;
use csi_sidecar::finalizers::{FinalizerError, set_finalizers, without};
use csi_sidecar::informers::{CacheSyncHealth, Informers};
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use csi_sidecar::workqueue_metrics::WorkqueueMetrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::content::{self, ContentPlan, Cut};
use crate::content_writes::ContentWrites;
use crate::secrets::{
    CONTENT_SECRET, SNAPSHOTTER_LIST, annotated_secret, create_parameters, secret_reference,
};
use csi_kinds::snapshot::{
    CONTENT_BOUND_FINALIZER, VolumeSnapshotClass, VolumeSnapshotContent, status_merge_patch,
};

/// How the sidecar is set up (from its flags and the driver's discovery).
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver_name: String,
    /// Deadline of each CSI call (`--timeout`).
    pub timeout: Duration,
    pub snapshot_name_prefix: String,
    pub snapshot_name_uuid_length: i64,
    /// `--groupsnapshot-name-prefix`, `--groupsnapshot-name-uuid-length`.
    pub group_snapshot_name_prefix: String,
    pub group_snapshot_name_uuid_length: i64,
    pub extra_create_metadata: bool,
    /// The driver serves ListSnapshots; without it a pre-provisioned snapshot is taken as ready.
    pub list_snapshots: bool,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub workers: usize,
    pub resync: Duration,
    pub cache_sync: Arc<CacheSyncHealth>,
    /// client-go's `workqueue_*`: upstream's queues "csi-snapshotter-content" and
    /// "csi-snapshotter-groupsnapshotcontent".
    pub workqueues: WorkqueueMetrics,
    /// The CSIVolumeGroupSnapshot gate: also cut the driver's volume group snapshots
    /// ([`crate::group_sidecar`]) where the cluster serves the group API to us
    /// ([`crate::group_api`]).
    pub group_snapshots: bool,
    /// `--node-deployment`: the node (`NODE_NAME`) whose contents, and group contents, this
    /// instance handles, those labelled `snapshot.storage.kubernetes.io/managed-by=<node>`;
    /// `None`: every content of the driver.
    pub node: Option<String>,
}

impl Settings {
    /// The watch of the contents (and group contents) this instance handles: with
    /// [`Settings::node`], those labelled with its node, as upstream's informer selects them.
    pub fn content_watch(&self) -> watcher::Config {
        match &self.node {
            Some(node) => {
                watcher::Config::default().labels(&crate::distributed::node_selector(node))
            }
            None => watcher::Config::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Why a content's sync failed; logged and retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A failed snapshot operation (also the content's `status.error` and Event).
    #[error("{0}")]
    Snapshot(String),
    #[error("{}", crate::snapshot::controller_update_error(content, source))]
    Update {
        content: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
}

type Key = ObjectRef<VolumeSnapshotContent>;

struct Controller {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    contents: Store<VolumeSnapshotContent>,
    classes: Store<VolumeSnapshotClass>,
    writes: ContentWrites<VolumeSnapshotContent>,
}

/// Runs the sidecar until `shutdown`: the snapshot contents' controller and, with
/// [`Settings::group_snapshots`], the group contents' beside it.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), SidecarError> {
    if !(settings.group_snapshots && crate::group_api::served(&client, false).await) {
        return run_contents(client, csi, settings, shutdown).await;
    }
    let groups = crate::group_sidecar::run(
        client.clone(),
        csi.clone(),
        settings.clone(),
        shutdown.clone(),
    );
    tokio::try_join!(run_contents(client, csi, settings, shutdown), groups).map(|_| ())
}

async fn run_contents(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), SidecarError> {
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    let queue = settings.workqueues.queue("csi-snapshotter-content");
    workers.report_to(vec![queue], |_| 0);
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let content_work = workers.clone();
    let driver = settings.driver_name.clone();
    let contents = informers.watch_with(
        Api::all(client.clone()),
        settings.content_watch(),
        move |content: &VolumeSnapshotContent| {
            if content.spec.driver == driver {
                content_work.trigger_for(ObjectRef::from_obj(content), content);
            }
        },
    );
    let classes = informers.all::<VolumeSnapshotClass>();
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
    tracing::info!(driver = %controller.settings.driver_name, node = ?controller.settings.node, "csi-snapshotter started");
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

    /// The contents of our driver.
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
    async fn sync_content(self: &Arc<Self>, key: &Key) -> Result<Synced, SyncError> {
        let Some(content) = self.contents.get(key) else {
            return Ok(Synced::Done);
        };
        if self.writes.is_stale(key, &content) {
            return Ok(Synced::Waiting);
        }
        match content::plan(&content, &self.settings.driver_name) {
            ContentPlan::NotOurs | ContentPlan::Nothing => Ok(Synced::Done),
            ContentPlan::ClearBeingCreated => {
                self.writes.set_being_created(&content, false).await?;
                Ok(self.writes.poll(key, true))
            }
            ContentPlan::Delete {
                delete,
                remove_finalizer,
            } => self.delete(&content, delete, remove_finalizer).await,
            ContentPlan::Create => {
                let failure_reason = if content.status.is_none() {
                    "SnapshotCreationFailed"
                } else {
                    "SnapshotContentCheckandUpdateFailed"
                };
                match self.create(&content).await {
                    Ok(ready) => Ok(self.writes.poll(key, ready)),
                    Err(CreateError::Failed(message)) => {
                        let message = if content.status.is_none() {
                            format!("Failed to create snapshot: {message}")
                        } else {
                            format!("Failed to check and update snapshot content: {message}")
                        };
                        Err(self
                            .writes
                            .record_error(&content, failure_reason, message)
                            .await)
                    }
                    Err(CreateError::Sync(error)) => Err(error),
                }
            }
            ContentPlan::Refresh { snapshot_handle } => {
                match self.refresh(&content, &snapshot_handle).await {
                    Ok(ready) => Ok(self.writes.poll(key, ready)),
                    Err(CreateError::Failed(message)) => Err(self
                        .writes
                        .record_error(
                            &content,
                            "SnapshotContentCheckandUpdateFailed",
                            format!("Failed to check and update snapshot content: {message}"),
                        )
                        .await),
                    Err(CreateError::Sync(error)) => Err(error),
                }
            }
        }
    }

    /// CreateSnapshot (upstream `createSnapshotWrapper`); whether the snapshot is ready.
    async fn create(&self, content: &VolumeSnapshotContent) -> Result<bool, CreateError> {
        let name = content.name_any();
        let input = || -> Result<(BTreeMap<String, String>, Option<SecretRef>), String> {
            let class_name = content
                .spec
                .volume_snapshot_class_name
                .as_ref()
                .ok_or_else(|| {
                    format!("failed to take snapshot {name} without a snapshot class")
                })?;
            let class = self
                .classes
                .get(&ObjectRef::new(class_name))
                .ok_or_else(|| {
                    format!(
                        "volumesnapshotclass.snapshot.storage.k8s.io \"{class_name}\" not found"
                    )
                })?;
            let secret = annotated_secret(CONTENT_SECRET, &name, content.annotations())
                .map_err(|e| e.to_string())?;
            Ok((class.parameters(), secret))
        };
        let input_error = |error: String| {
            CreateError::Failed(format!(
                "failed to get input parameters to create snapshot for content {name}: {error:?}"
            ))
        };
        let (class_parameters, secret) = input().map_err(input_error)?;
        let secrets = self
            .secrets(&name, secret.as_ref())
            .await
            .map_err(input_error)?;
        let content = self.writes.set_being_created(content, true).await?;
        let mut parameters =
            create_parameters(&class_parameters).map_err(|e| CreateError::Failed(e.to_string()))?;
        if self.settings.extra_create_metadata {
            content::add_extra_metadata(&mut parameters, &content);
        }
        let volume_handle = content
            .spec
            .source
            .volume_handle
            .clone()
            .unwrap_or_default();
        let snapshot_name = content::snapshot_name(
            &self.settings.snapshot_name_prefix,
            content
                .spec
                .volume_snapshot_ref
                .uid
                .as_deref()
                .unwrap_or(""),
            self.settings.snapshot_name_uuid_length,
        )
        .map_err(CreateError::Failed)?;
        let request = csi::CreateSnapshotRequest {
            source_volume_id: volume_handle.clone(),
            name: snapshot_name,
            secrets,
            parameters,
            // CSI v1.13's alpha snapshot topology: upstream's sidecar does not send it.
            accessibility_requirements: None,
        };
        let snapshot = match self
            .csi
            .create_snapshot(request, self.settings.timeout)
            .await
        {
            Ok(response) => response.snapshot.unwrap_or_default(),
            Err(status) => {
                if csi_grpc::conn::is_final_error(status.code()) {
                    self.writes.set_being_created(&content, false).await?;
                }
                return Err(CreateError::Failed(format!(
                    "failed to take snapshot of the volume {volume_handle}: {:?}",
                    GoStatus(&status).to_string()
                )));
            }
        };
        let cut = Cut {
            snapshot_handle: snapshot.snapshot_id,
            ready_to_use: snapshot.ready_to_use,
            creation_time: nanos(snapshot.creation_time),
            size_bytes: snapshot.size_bytes,
        };
        let content = self.update_status(&content, &cut).await?;
        self.writes.set_being_created(&content, false).await?;
        tracing::info!(content = %name, snapshot = %cut.snapshot_handle, ready = cut.ready_to_use, "snapshot cut");
        Ok(cut.ready_to_use)
    }

    /// ListSnapshots for a pre-provisioned snapshot (upstream `checkandUpdateContentStatus`).
    async fn refresh(
        &self,
        content: &VolumeSnapshotContent,
        handle: &str,
    ) -> Result<bool, CreateError> {
        let name = content.name_any();
        let cut = if self.settings.list_snapshots {
            let mut secret = None;
            if let Some(class_name) = &content.spec.volume_snapshot_class_name {
                let class = self.classes.get(&ObjectRef::new(class_name)).ok_or_else(|| {
                    CreateError::Failed(format!(
                        "failed to get snapshot class {class_name} for snapshot content {name}: volumesnapshotclass.snapshot.storage.k8s.io \"{class_name}\" not found"
                    ))
                })?;
                secret = secret_reference(SNAPSHOTTER_LIST, &class.parameters(), &name, None)
                    .map_err(|e| {
                        CreateError::Failed(format!(
                            "failed to get secret reference for snapshot content {name}: {e}"
                        ))
                    })?;
            }
            let secrets = self.secrets(&name, secret.as_ref()).await.map_err(|e| {
                CreateError::Failed(format!(
                    "failed to get credentials for snapshot content {name}: {e}"
                ))
            })?;
            let request = csi::ListSnapshotsRequest {
                snapshot_id: handle.to_string(),
                secrets,
                ..csi::ListSnapshotsRequest::default()
            };
            let listed = self
                .csi
                .list_snapshots(request, self.settings.timeout)
                .await
                .map_err(|status| GoStatus(&status).to_string())
                .and_then(|response| {
                    response
                        .entries
                        .into_iter()
                        .find_map(|e| e.snapshot)
                        .ok_or_else(|| format!("can not find snapshot for snapshotID {handle}"))
                })
                .map_err(|error| {
                    CreateError::Failed(format!(
                        "failed to list snapshot for content {name}: {error:?}"
                    ))
                })?;
            Cut {
                snapshot_handle: handle.to_string(),
                ready_to_use: listed.ready_to_use,
                creation_time: nanos(listed.creation_time),
                size_bytes: listed.size_bytes,
            }
        } else {
            Cut {
                snapshot_handle: handle.to_string(),
                ready_to_use: true,
                creation_time: nanos(None),
                size_bytes: 0,
            }
        };
        self.update_status(content, &cut).await?;
        Ok(cut.ready_to_use)
    }

    /// DeleteSnapshot when the plan says so, then the bound finalizer.
    async fn delete(
        &self,
        content: &VolumeSnapshotContent,
        handle: Option<String>,
        remove_finalizer: bool,
    ) -> Result<Synced, SyncError> {
        let name = content.name_any();
        let mut current = content.clone();
        if let Some(handle) = handle {
            let secrets = match annotated_secret(CONTENT_SECRET, &name, content.annotations()) {
                Ok(secret) => self.secrets(&name, secret.as_ref()).await,
                Err(error) => Err(error.to_string()),
            };
            let secrets = match secrets {
                Ok(secrets) => secrets,
                Err(error) => {
                    self.writes
                        .warn(
                            content,
                            "SnapshotDeleteError",
                            "Failed to get snapshot credentials",
                        )
                        .await;
                    return Err(SyncError::Snapshot(format!(
                        "failed to get input parameters to delete snapshot for content {name}: {error:?}"
                    )));
                }
            };
            let request = csi::DeleteSnapshotRequest {
                snapshot_id: handle,
                secrets,
            };
            if let Err(status) = self
                .csi
                .delete_snapshot(request, self.settings.timeout)
                .await
            {
                self.writes
                    .warn(content, "SnapshotDeleteError", "Failed to delete snapshot")
                    .await;
                return Err(SyncError::Snapshot(format!(
                    "failed to delete snapshot {name:?}, err: failed to delete snapshot content {name}: {:?}",
                    GoStatus(&status).to_string()
                )));
            }
            let cleared = json!({"status": {"snapshotHandle": null, "readyToUse": null,
                "creationTime": null, "restoreSize": null}});
            current = match self.writes.patch_status(content, &cleared).await {
                Ok(updated) => updated,
                Err(error) => {
                    self.writes
                        .warn(
                            content,
                            "SnapshotDeleteError",
                            "Failed to clear content status",
                        )
                        .await;
                    return Err(error);
                }
            };
            tracing::info!(content = %name, "snapshot deleted");
        }
        if remove_finalizer {
            let api: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
            set_finalizers(
                &api,
                &current,
                without(current.finalizers(), CONTENT_BOUND_FINALIZER),
            )
            .await?;
        }
        Ok(Synced::Done)
    }

    async fn secrets(
        &self,
        content: &str,
        secret: Option<&SecretRef>,
    ) -> Result<HashMap<String, String>, String> {
        secret_data(&self.client, "snapshot content", content, secret).await
    }

    /// The status after `cut`, written when it changed.
    async fn update_status(
        &self,
        content: &VolumeSnapshotContent,
        cut: &Cut,
    ) -> Result<VolumeSnapshotContent, SyncError> {
        match content::status_after(content.status.as_ref(), cut) {
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

/// A step that failed either with a snapshot error (recorded on the content) or a write.
pub(crate) enum CreateError {
    Failed(String),
    Sync(SyncError),
}

impl From<SyncError> for CreateError {
    fn from(error: SyncError) -> Self {
        CreateError::Sync(error)
    }
}

/// A CSI timestamp in nanoseconds since the epoch; now when the driver gave none.
fn nanos(timestamp: Option<prost_types::Timestamp>) -> i64 {
    match timestamp {
        Some(t) if t.seconds != 0 || t.nanos != 0 => t
            .seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(t.nanos)),
        _ => SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
    }
}

/// The data of the secret `secret` names for `content` (a `kind` in messages); none: no
/// secrets.
pub(crate) async fn secret_data(
    client: &Client,
    kind: &str,
    content: &str,
    secret: Option<&SecretRef>,
) -> Result<HashMap<String, String>, String> {
    let Some(secret) = secret else {
        return Ok(HashMap::new());
    };
    match csi_sidecar::secrets::fetch_secret_data(client.clone(), secret).await {
        Ok(data) => Ok(data.into_inner()),
        Err(error) => {
            tracing::warn!(content, %error, "failed to get credentials");
            Err(format!("cannot get credentials for {kind} {content:?}"))
        }
    }
}

pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

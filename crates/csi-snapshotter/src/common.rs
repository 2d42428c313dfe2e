//! The snapshot-controller's adapters: caches of VolumeSnapshots, VolumeSnapshotContents,
//! VolumeSnapshotClasses, claims and PVs, and of the group kinds when group snapshots are on
//! ([`groups`]). A snapshot's change triggers it and its source claim; a content's triggers it
//! and the snapshot it names; a claim's triggers it and the snapshots of it; a group content's
//! triggers it and its group. Each key is planned ([`crate::snapshot`], [`crate::group`]) and its
//! one step acted on.

mod groups;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::finalizers::{
    FinalizerError, add_builtin_finalizer, add_finalizer, remove_builtin_finalizer, set_finalizers,
    without,
};
use csi_sidecar::informers::{CacheSyncHealth, Informers, keep_node_labels};
use csi_sidecar::lock;
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::distributed::Placement;
use crate::group::owning_group;
use crate::metrics::{CANCEL, Operation, OperationMetrics, SUCCESS};
use crate::sidecar::now;
use crate::snapshot::{
    self, ContentStep, Failure, Inputs, Recording, Step, controller_update_error, reason,
};
use csi_kinds::groupsnapshot::{
    IN_GROUP_FINALIZER, VolumeGroupSnapshot, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
};
use csi_kinds::snapshot::{
    BEING_DELETED, CONTENT_BOUND_FINALIZER, PVC_AS_SOURCE_FINALIZER, SNAPSHOT_AS_SOURCE_FINALIZER,
    SNAPSHOT_BOUND_FINALIZER, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent,
    VolumeSnapshotStatus, snapshot_key, status_merge_patch,
};
use groups::GroupCaches;

#[derive(Debug, Clone)]
pub struct Settings {
    pub prevent_volume_mode_conversion: bool,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub workers: usize,
    pub resync: Duration,
    pub cache_sync: Arc<CacheSyncHealth>,
    /// `snapshot_controller_operation_total_seconds` and `..._operations_in_flight`.
    pub metrics: Arc<OperationMetrics>,
    /// The CSIVolumeGroupSnapshot gate: groups are served where the cluster serves the group
    /// API to us ([`crate::group_api`]).
    pub group_snapshots: bool,
    /// `--enable-distributed-snapshotting`: watch the Nodes and label each new content of a
    /// node-local volume with its node ([`crate::distributed`]).
    pub distributed_snapshotting: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A failed step (also an Event, and the snapshot's `status.error` where upstream sets it).
    #[error("{0}")]
    Failed(String),
    #[error("{}", controller_update_error(object, source))]
    Update { object: String, source: kube::Error },
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Snapshot(ObjectRef<VolumeSnapshot>),
    Content(ObjectRef<VolumeSnapshotContent>),
    /// A claim that may hold `pvc-as-source-protection`.
    Claim(ObjectRef<PersistentVolumeClaim>),
    Group(ObjectRef<VolumeGroupSnapshot>),
    GroupContent(ObjectRef<VolumeGroupSnapshotContent>),
}

struct Caches {
    snapshots: Store<VolumeSnapshot>,
    contents: Store<VolumeSnapshotContent>,
    classes: Store<VolumeSnapshotClass>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    /// Names and labels only; with [`Settings::distributed_snapshotting`].
    nodes: Option<Store<Node>>,
    /// With [`Settings::group_snapshots`].
    groups: Option<GroupCaches>,
}

struct Controller {
    client: Client,
    settings: Settings,
    caches: Caches,
    events: EventRecorder,
    /// Snapshot → the resourceVersion our last write to it replaced.
    superseded: Superseded<ObjectRef<VolumeSnapshot>>,
    /// Snapshots whose deletion is timed → their UID (the metric ends when the object is gone
    /// from the cache, which then no longer says its UID).
    deleting: Mutex<HashMap<ObjectRef<VolumeSnapshot>, String>>,
    /// The same two for groups.
    superseded_groups: Superseded<ObjectRef<VolumeGroupSnapshot>>,
    deleting_groups: Mutex<HashMap<ObjectRef<VolumeGroupSnapshot>, String>>,
}

fn snapshot_ref(namespace: Option<&str>, name: Option<&str>) -> Option<ObjectRef<VolumeSnapshot>> {
    Some(ObjectRef::new(name?).within(namespace?))
}

/// Says where a new content's snapshot is cut under distributed snapshotting (upstream logs a
/// content of a node-local volume that no Node matches as an error).
fn log_placement(content: &VolumeSnapshotContent, placement: &Placement) {
    let name = content.name_any();
    let volume = content.spec.source.volume_handle.as_deref().unwrap_or("");
    match placement {
        Placement::Central => {}
        Placement::NotNodeLocal => {
            tracing::debug!(content = %name, volume, "volume not node-local: content not labelled with a node");
        }
        Placement::Node(node) => {
            tracing::info!(content = %name, volume, node, "content labelled for the csi-snapshotter of its volume's node");
        }
        Placement::NoNode => tracing::error!(
            content = %name,
            volume,
            "failed to find nodes that match the node affinity requirements of the volume: content not labelled with a node"
        ),
    }
}

/// Runs the controller until `shutdown`.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let work = workers.clone();
    let snapshots = informers.all_with(move |s: &VolumeSnapshot| {
        work.trigger_for(Key::Snapshot(ObjectRef::from_obj(s)), s);
        if let Some(claim) = &s.spec.source.persistent_volume_claim_name
            && let Some(namespace) = s.namespace()
        {
            work.trigger(Key::Claim(ObjectRef::new(claim).within(&namespace)));
        }
    });
    let work = workers.clone();
    let contents = informers.all_with(move |c: &VolumeSnapshotContent| {
        work.trigger_for(Key::Content(ObjectRef::from_obj(c)), c);
        let reference = &c.spec.volume_snapshot_ref;
        if let Some(key) = snapshot_ref(reference.namespace.as_deref(), reference.name.as_deref()) {
            work.trigger(Key::Snapshot(key));
        }
    });
    let classes = informers.all::<VolumeSnapshotClass>();
    let work = workers.clone();
    let claims = informers.all_with(move |c: &PersistentVolumeClaim| {
        work.trigger_for(Key::Claim(ObjectRef::from_obj(c)), c);
    });
    let volumes = informers.all::<PersistentVolume>();
    let nodes = settings
        .distributed_snapshotting
        .then(|| informers.all_lean::<Node>(keep_node_labels));
    let groups =
        (settings.group_snapshots && crate::group_api::served(&client, true).await).then(|| {
            let work = workers.clone();
            let groups = informers.all_with(move |g: &VolumeGroupSnapshot| {
                work.trigger_for(Key::Group(ObjectRef::from_obj(g)), g);
            });
            let work = workers.clone();
            let contents = informers.all_with(move |c: &VolumeGroupSnapshotContent| {
                work.trigger_for(Key::GroupContent(ObjectRef::from_obj(c)), c);
                if let Some(group) = Controller::group_of(c) {
                    work.trigger(group);
                }
            });
            GroupCaches {
                groups,
                contents,
                classes: informers.all::<VolumeGroupSnapshotClass>(),
            }
        });
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let controller = Arc::new(Controller {
        events: EventRecorder::new(client.clone(), "snapshot-controller", ""),
        client,
        caches: Caches {
            snapshots,
            contents,
            classes,
            claims,
            volumes,
            nodes,
            groups,
        },
        superseded: Superseded::default(),
        deleting: Mutex::default(),
        superseded_groups: Superseded::default(),
        deleting_groups: Mutex::default(),
        settings,
    });
    tracing::info!("snapshot-controller started");
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

    /// Every snapshot and content, and the claims that carry our protection.
    fn keys(&self) -> Vec<Key> {
        let caches = &self.caches;
        caches
            .snapshots
            .state()
            .iter()
            .map(|s| Key::Snapshot(ObjectRef::from_obj(s.as_ref())))
            .chain(
                caches
                    .contents
                    .state()
                    .iter()
                    .map(|c| Key::Content(ObjectRef::from_obj(c.as_ref()))),
            )
            .chain(
                caches
                    .claims
                    .state()
                    .iter()
                    .filter(|c| c.finalizers().iter().any(|f| f == PVC_AS_SOURCE_FINALIZER))
                    .map(|c| Key::Claim(ObjectRef::from_obj(c.as_ref()))),
            )
            .chain(self.group_keys())
            .collect()
    }

    /// A claim changing concerns the snapshots taken of it (they wait for it to be bound),
    /// those it is restored from (their deletion waits for the restore) and the unbound groups
    /// of its namespace; a member snapshot changing concerns its group.
    fn concerned(&self, mut keys: Vec<Key>) -> Vec<Key> {
        let claim_snapshots: Vec<Key> = keys
            .iter()
            .filter_map(|k| match k {
                Key::Claim(claim) => Some(claim),
                _ => None,
            })
            .flat_map(|claim| self.snapshots_concerning(claim))
            .collect();
        keys.extend(claim_snapshots);
        let groups: Vec<Key> = keys.iter().flat_map(|k| self.groups_concerned(k)).collect();
        keys.extend(groups);
        keys
    }

    fn offer(&self, key: &Key) -> Offer {
        match self.version(key) {
            Some(version) => Offer::at(Some(version)),
            None => Offer::Gone,
        }
    }

    fn forget(&self, key: &Key) {
        match key {
            Key::Snapshot(snapshot) => {
                self.superseded.forget(snapshot);
                self.gone(snapshot);
            }
            Key::Group(group) => {
                self.superseded_groups.forget(group);
                self.group_gone(group);
            }
            _ => {}
        }
    }

    /// Each kind's sync in a box of its own size ([`SyncFuture`]).
    fn sync(self: Arc<Self>, key: Key) -> SyncFuture<SyncError> {
        let this = self;
        match key {
            Key::Snapshot(reference) => {
                Box::pin(async move { this.sync_snapshot(&reference).await })
            }
            Key::Content(reference) => Box::pin(async move { this.sync_content(&reference).await }),
            Key::Claim(reference) => Box::pin(async move { this.sync_claim(&reference).await }),
            Key::Group(reference) => Box::pin(async move { this.sync_group(&reference).await }),
            Key::GroupContent(reference) => {
                Box::pin(async move { this.sync_group_content(&reference).await })
            }
        }
    }
}

impl Controller {
    fn snapshots_concerning(&self, claim: &ObjectRef<PersistentVolumeClaim>) -> Vec<Key> {
        let cached = self.caches.claims.get(claim);
        self.caches
            .snapshots
            .state()
            .iter()
            .filter(|s| s.namespace().as_deref() == claim.namespace.as_deref())
            .filter(|s| {
                s.spec.source.persistent_volume_claim_name.as_deref() == Some(claim.name.as_str())
                    || cached
                        .as_ref()
                        .is_some_and(|c| snapshot::restores_from(c, s))
            })
            .map(|s| Key::Snapshot(ObjectRef::from_obj(s.as_ref())))
            .collect()
    }

    /// What a key's plan depends on, as one version string; `None` when its object is gone.
    fn version(&self, key: &Key) -> Option<String> {
        let caches = &self.caches;
        match key {
            Key::Snapshot(reference) => {
                let snapshot = caches.snapshots.get(reference)?;
                let inputs = self.inputs_of(&snapshot);
                let classes: Vec<String> = caches
                    .classes
                    .state()
                    .iter()
                    .map(|c| c.resource_version().unwrap_or_default())
                    .collect();
                Some(
                    format!(
                        "{}/{}/{}/{}/{}/{}",
                        snapshot.resource_version().unwrap_or_default(),
                        inputs
                            .content
                            .and_then(|c| c.resource_version())
                            .unwrap_or_default(),
                        inputs
                            .claim
                            .and_then(|c| c.resource_version())
                            .unwrap_or_default(),
                        inputs
                            .volume
                            .and_then(|v| v.resource_version())
                            .unwrap_or_default(),
                        inputs.restoring,
                        classes.join(",")
                    ) + if inputs.held_by_group {
                        "/in-group"
                    } else {
                        ""
                    },
                )
            }
            Key::Content(reference) => {
                let content = caches.contents.get(reference)?;
                let snapshot = self.snapshot_of(&content);
                Some(format!(
                    "{}/{}",
                    content.resource_version().unwrap_or_default(),
                    snapshot
                        .and_then(|s| s.resource_version())
                        .unwrap_or_default()
                ))
            }
            Key::Claim(reference) => {
                let claim = caches.claims.get(reference)?;
                let removable = snapshot::claim_protection_removable(
                    &claim,
                    caches.snapshots.state().iter().map(AsRef::as_ref),
                    |s| self.has_content(s),
                );
                Some(format!(
                    "{}/{removable}",
                    claim.resource_version().unwrap_or_default()
                ))
            }
            Key::Group(reference) => self.group_version(reference),
            Key::GroupContent(reference) => self.group_content_version(reference),
        }
    }

    fn snapshot_of(&self, content: &VolumeSnapshotContent) -> Option<Arc<VolumeSnapshot>> {
        let reference = &content.spec.volume_snapshot_ref;
        self.caches.snapshots.get(&snapshot_ref(
            reference.namespace.as_deref(),
            reference.name.as_deref(),
        )?)
    }

    /// Whether a snapshot's content is in the cache.
    fn has_content(&self, snapshot: &VolumeSnapshot) -> bool {
        snapshot::content_name(snapshot)
            .is_some_and(|name| self.caches.contents.get(&ObjectRef::new(&name)).is_some())
    }

    /// The cached objects a snapshot's plan reads.
    fn inputs_of(&self, snapshot: &VolumeSnapshot) -> Owned {
        let caches = &self.caches;
        let content = snapshot::content_name(snapshot)
            .and_then(|name| caches.contents.get(&ObjectRef::new(&name)));
        let namespace = snapshot.namespace().unwrap_or_default();
        let claim = snapshot
            .spec
            .source
            .persistent_volume_claim_name
            .as_ref()
            .and_then(|name| caches.claims.get(&ObjectRef::new(name).within(&namespace)));
        let volume = claim
            .as_ref()
            .and_then(|c| c.spec.as_ref()?.volume_name.clone())
            .and_then(|name| caches.volumes.get(&ObjectRef::new(&name)));
        let restoring = caches
            .claims
            .state()
            .iter()
            .any(|c| snapshot::restores_from(c, snapshot));
        let held_by_group = owning_group(snapshot).is_some_and(|owner| {
            caches.groups.as_ref().is_some_and(|groups| {
                groups
                    .groups
                    .get(&ObjectRef::new(&owner.name).within(&namespace))
                    .is_some_and(|g| {
                        g.metadata.uid.as_deref() == Some(owner.uid.as_str())
                            && g.metadata.deletion_timestamp.is_none()
                    })
            })
        });
        Owned {
            content,
            claim,
            volume,
            nodes: caches.nodes.as_ref().map(Store::state),
            classes: caches.classes.state(),
            restoring,
            held_by_group,
        }
    }

    async fn sync_snapshot(
        &self,
        reference: &ObjectRef<VolumeSnapshot>,
    ) -> Result<Synced, SyncError> {
        let Some(snapshot) = self.caches.snapshots.get(reference) else {
            return Ok(Synced::Done);
        };
        if self
            .superseded
            .is_stale(reference, snapshot.resource_version().as_deref())
        {
            return Ok(Synced::Waiting);
        }
        let owned = self.inputs_of(&snapshot);
        let classes: Vec<&VolumeSnapshotClass> = owned.classes.iter().map(AsRef::as_ref).collect();
        let nodes: Option<Vec<&Node>> = owned
            .nodes
            .as_ref()
            .map(|nodes| nodes.iter().map(AsRef::as_ref).collect());
        let inputs = Inputs {
            content: owned.content.as_deref(),
            claim: owned.claim.as_deref(),
            volume: owned.volume.as_deref(),
            classes: &classes,
            restoring: owned.restoring,
            prevent_volume_mode_conversion: self.settings.prevent_volume_mode_conversion,
            held_by_group: owned.held_by_group,
            nodes: nodes.as_deref(),
        };
        self.track(&snapshot, &inputs);
        let step = snapshot::plan(&snapshot, &inputs);
        tracing::debug!(snapshot = %snapshot_key(&snapshot), ?step, "snapshot step");
        self.act(&snapshot, step).await
    }

    async fn act(&self, snapshot: &VolumeSnapshot, step: Step) -> Result<Synced, SyncError> {
        let key = snapshot_key(snapshot);
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(
            self.client.clone(),
            &snapshot.namespace().unwrap_or_default(),
        );
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        match step {
            Step::Nothing => return Ok(Synced::Done),
            Step::Fail(failure) => return Err(self.fail(snapshot, failure).await),
            Step::RefuseContent { failure, error } => {
                self.fail(snapshot, failure).await;
                return Err(self.finalizer_check_failed(snapshot, error).await);
            }
            Step::MarkContentBeingDeleted(name) => {
                let patch = json!({"metadata": {"annotations": {BEING_DELETED: "yes"}}});
                contents
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|source| SyncError::Update {
                        object: name,
                        source,
                    })?;
            }
            Step::DeleteContent(name) => {
                match contents.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        tracing::info!(snapshot = %key, content = %name, "deleting the snapshot's content")
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(source) => {
                        self.event(
                            snapshot,
                            EventType::Warning,
                            reason::CONTENT_DELETE_ERROR,
                            "Failed to delete snapshot content API object",
                        )
                        .await;
                        return Err(SyncError::Failed(format!(
                            "failed to delete VolumeSnapshotContent {name} from API server: {source}"
                        )));
                    }
                }
            }
            Step::RemoveFinalizers {
                source,
                bound,
                in_group,
            } => {
                let mut finalizers = snapshot.finalizers().to_vec();
                if source {
                    finalizers = without(&finalizers, SNAPSHOT_AS_SOURCE_FINALIZER);
                }
                if bound {
                    finalizers = without(&finalizers, SNAPSHOT_BOUND_FINALIZER);
                }
                if in_group {
                    finalizers = without(&finalizers, IN_GROUP_FINALIZER);
                }
                set_finalizers(&snapshots, snapshot, finalizers).await?;
            }
            Step::SetClass(class) => {
                let patch = json!({"spec": {"volumeSnapshotClassName": class}});
                let updated = snapshots
                    .patch(
                        &snapshot.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .map_err(|source| SyncError::Update {
                        object: key.clone(),
                        source,
                    })?;
                self.superseded_by(snapshot, &updated);
            }
            Step::AddFinalizers { source, bound } => {
                let mut finalizers = snapshot.finalizers().to_vec();
                if source {
                    finalizers.push(SNAPSHOT_AS_SOURCE_FINALIZER.into());
                }
                if bound {
                    finalizers.push(SNAPSHOT_BOUND_FINALIZER.into());
                }
                match set_finalizers(&snapshots, snapshot, finalizers).await {
                    // The next sync waits for the cache to show the finalizers: from the
                    // version before, it would add them again over a stale list.
                    Ok(Some(updated)) => self.superseded_by(snapshot, &updated),
                    Ok(None) => {}
                    Err(error) => {
                        let error = controller_update_error(&key, error.cause());
                        return Err(self.finalizer_check_failed(snapshot, error).await);
                    }
                }
            }
            Step::Bind {
                content,
                uid,
                class,
            } => {
                let mut patch =
                    vec![json!({"op": "add", "path": "/spec/volumeSnapshotRef/uid", "value": uid})];
                if let Some(class) = class {
                    patch.push(json!({"op": "add", "path": "/spec/volumeSnapshotClassName", "value": class}));
                }
                let patch: json_patch::Patch = serde_json::from_value(json!(patch))
                    .map_err(|e| SyncError::Failed(e.to_string()))?;
                if let Err(error) = contents
                    .patch(&content, &PatchParams::default(), &Patch::<()>::Json(patch))
                    .await
                {
                    let failure = Failure {
                        reason: reason::BIND_FAILED,
                        message: format!("Snapshot failed to bind VolumeSnapshotContent, {error}"),
                        status: Some(true),
                    };
                    return Err(self.fail(snapshot, failure).await);
                }
            }
            Step::ProtectClaim(claim) => {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(
                    self.client.clone(),
                    &snapshot.namespace().unwrap_or_default(),
                );
                if let Some(cached) = self
                    .caches
                    .claims
                    .get(&ObjectRef::new(&claim).within(&snapshot.namespace().unwrap_or_default()))
                    && let Err(error) =
                        add_builtin_finalizer(&claims, cached.as_ref(), PVC_AS_SOURCE_FINALIZER)
                            .await
                {
                    // Upstream fails the content's creation: no snapshot without its claim kept.
                    let failure = Failure::content_creation(controller_update_error(&claim, error));
                    return Err(self.fail(snapshot, failure).await);
                }
            }
            Step::CreateContent { content, placement } => {
                log_placement(&content, &placement);
                match contents.create(&PostParams::default(), &content).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(error) => {
                        let message = format!(
                            "Error creating volume snapshot content object for snapshot {key}: {error}."
                        );
                        self.event(
                            snapshot,
                            EventType::Warning,
                            reason::CREATE_CONTENT_FAILED,
                            &message,
                        )
                        .await;
                        let failure =
                            Failure::content_creation(controller_update_error(&key, error));
                        return Err(self.fail(snapshot, failure).await);
                    }
                }
                self.event(
                    snapshot,
                    EventType::Normal,
                    reason::CREATING_SNAPSHOT,
                    &format!("Waiting for a snapshot {key} to be created by the CSI driver."),
                )
                .await;
            }
            Step::UpdateStatus { status, events } => {
                match self.patch_status(snapshot, status.as_ref()).await {
                    Ok(()) => {}
                    Err(error) => {
                        let failure = Failure {
                            reason: reason::STATUS_UPDATE_FAILED,
                            message: format!(
                                "Snapshot status update failed, {}",
                                controller_update_error(&key, error)
                            ),
                            status: Some(false),
                        };
                        return Err(self.fail(snapshot, failure).await);
                    }
                }
                let uid = snapshot.uid().unwrap_or_default();
                let metrics = &self.settings.metrics;
                for (reason, message) in events {
                    match reason {
                        reason::SNAPSHOT_CREATED => {
                            metrics.finish(Operation::CreateSnapshot, &uid, SUCCESS);
                        }
                        reason::SNAPSHOT_READY => {
                            metrics.finish(Operation::CreateSnapshotAndReady, &uid, SUCCESS);
                        }
                        _ => {}
                    }
                    self.event(snapshot, EventType::Normal, reason, &message)
                        .await;
                }
            }
        }
        Ok(Synced::Done)
    }

    /// A Warning Event and, where upstream records it, the error in the snapshot's status
    /// (once per message: the same error again writes nothing and sends no Event).
    async fn fail(&self, snapshot: &VolumeSnapshot, failure: Failure) -> SyncError {
        match failure.recording(snapshot.status.as_ref(), now()) {
            Recording::Recorded => return SyncError::Failed(failure.message),
            Recording::Status(status) => {
                if let Err(error) = self.patch_status(snapshot, &status).await {
                    tracing::warn!(snapshot = %snapshot_key(snapshot), %error, "failed to record the error in the snapshot's status");
                }
            }
            Recording::EventOnly => {}
        }
        self.event(
            snapshot,
            EventType::Warning,
            failure.reason,
            &failure.message,
        )
        .await;
        SyncError::Failed(failure.message)
    }

    async fn sync_content(
        &self,
        reference: &ObjectRef<VolumeSnapshotContent>,
    ) -> Result<Synced, SyncError> {
        let Some(content) = self.caches.contents.get(reference) else {
            return Ok(Synced::Done);
        };
        let snapshot = self.snapshot_of(&content);
        let api: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        match snapshot::content_plan(&content, snapshot.as_deref()) {
            ContentStep::Nothing => {}
            ContentStep::Invalid(message) => {
                self.events
                    .publish(
                        &content.object_ref(&()),
                        EventType::Warning,
                        reason::CONTENT_VALIDATION_ERROR,
                        &message,
                    )
                    .await;
                return Err(SyncError::Failed(message));
            }
            ContentStep::AddFinalizer => {
                add_finalizer(&api, content.as_ref(), CONTENT_BOUND_FINALIZER).await?;
            }
            ContentStep::MarkBeingDeleted => {
                let patch = json!({"metadata": {"annotations": {BEING_DELETED: "yes"}}});
                api.patch(
                    &content.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|source| SyncError::Update {
                    object: content.name_any(),
                    source,
                })?;
            }
        }
        Ok(Synced::Done)
    }

    async fn sync_claim(
        &self,
        reference: &ObjectRef<PersistentVolumeClaim>,
    ) -> Result<Synced, SyncError> {
        let Some(claim) = self.caches.claims.get(reference) else {
            return Ok(Synced::Done);
        };
        let snapshots = self.caches.snapshots.state();
        let snapshots = || snapshots.iter().map(AsRef::as_ref);
        if snapshot::claim_protection_removable(&claim, snapshots(), |s| self.has_content(s)) {
            let api: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
            if let Err(error) =
                remove_builtin_finalizer(&api, claim.as_ref(), PVC_AS_SOURCE_FINALIZER).await
            {
                // Upstream's Event, on the snapshots whose syncs would have released the claim.
                for source in snapshot::snapshots_of_claim(&claim, snapshots()) {
                    self.event(
                        source,
                        EventType::Warning,
                        reason::PVC_FINALIZER_ERROR,
                        "Error check and remove PVC Finalizer for VolumeSnapshot",
                    )
                    .await;
                }
                return Err(error.into());
            }
            tracing::info!(claim = %reference, "removed the snapshot source protection");
        }
        Ok(Synced::Done)
    }

    /// Writes `status` as the snapshot's (fields it drops are removed), and remembers that the
    /// cached version is older than our write.
    async fn patch_status(
        &self,
        snapshot: &VolumeSnapshot,
        status: &VolumeSnapshotStatus,
    ) -> Result<(), kube::Error> {
        let api: Api<VolumeSnapshot> = Api::namespaced(
            self.client.clone(),
            &snapshot.namespace().unwrap_or_default(),
        );
        let patch = status_merge_patch(snapshot.status.as_ref(), status);
        let updated = api
            .patch_status(
                &snapshot.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.superseded_by(snapshot, &updated);
        Ok(())
    }

    /// Starts the operation metrics the snapshot's state implies (upstream starts them where
    /// its sync functions begin): a deletion once the snapshot is no longer restored from,
    /// ending unfinished create operations as cancelled; the create operations while it is not
    /// cut or not ready.
    fn track(&self, snapshot: &VolumeSnapshot, inputs: &Inputs<'_>) {
        let metrics = &self.settings.metrics;
        let uid = snapshot.uid().unwrap_or_default();
        let pre_provisioned = snapshot.spec.source.volume_snapshot_content_name.is_some();
        let driver = inputs
            .content
            .map(|c| c.spec.driver.clone())
            .or_else(|| {
                let class = snapshot.spec.volume_snapshot_class_name.as_ref()?;
                let found = inputs
                    .classes
                    .iter()
                    .find(|c| c.metadata.name.as_ref() == Some(class))?;
                Some(found.driver.clone())
            })
            .unwrap_or_default();
        let status = snapshot.status.as_ref();
        if snapshot.metadata.deletion_timestamp.is_some() {
            if snapshot::is_deletion_candidate(snapshot) && !inputs.restoring {
                metrics.finish(Operation::CreateSnapshot, &uid, CANCEL);
                metrics.finish(Operation::CreateSnapshotAndReady, &uid, CANCEL);
                metrics.start(Operation::DeleteSnapshot, &uid, &driver, pre_provisioned);
                lock(&self.deleting).insert(ObjectRef::from_obj(snapshot), uid);
            }
            return;
        }
        if status.and_then(|s| s.ready_to_use) != Some(true) {
            if status.and_then(|s| s.creation_time.as_ref()).is_none() {
                metrics.start(Operation::CreateSnapshot, &uid, &driver, pre_provisioned);
            }
            metrics.start(
                Operation::CreateSnapshotAndReady,
                &uid,
                &driver,
                pre_provisioned,
            );
        }
    }

    /// A VolumeSnapshot is gone: its deletion is over.
    fn gone(&self, snapshot: &ObjectRef<VolumeSnapshot>) {
        if let Some(uid) = lock(&self.deleting).remove(snapshot) {
            self.settings
                .metrics
                .finish(Operation::DeleteSnapshot, &uid, SUCCESS);
        }
    }

    /// Upstream's `checkandAddSnapshotFinalizers` failed with `error`: a
    /// `SnapshotFinalizerError` Event quoting it, on every sync that fails so.
    async fn finalizer_check_failed(&self, snapshot: &VolumeSnapshot, error: String) -> SyncError {
        self.event(
            snapshot,
            EventType::Warning,
            reason::FINALIZER_ERROR,
            &format!("Failed to check and update snapshot: {error}"),
        )
        .await;
        SyncError::Failed(error)
    }

    fn superseded_by(&self, old: &VolumeSnapshot, new: &VolumeSnapshot) {
        self.superseded.wrote(ObjectRef::from_obj(old), old, new);
    }

    async fn event(
        &self,
        snapshot: &VolumeSnapshot,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        self.events
            .publish(&snapshot.object_ref(&()), event_type, reason, message)
            .await;
    }
}

/// The cached objects of one snapshot's plan, owned for the sync.
struct Owned {
    content: Option<Arc<VolumeSnapshotContent>>,
    claim: Option<Arc<PersistentVolumeClaim>>,
    volume: Option<Arc<PersistentVolume>>,
    nodes: Option<Vec<Arc<Node>>>,
    classes: Vec<Arc<VolumeSnapshotClass>>,
    restoring: bool,
    held_by_group: bool,
}

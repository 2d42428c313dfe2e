//! The attacher's adapters: caches of VolumeAttachments, PVs and CSINodes; each change of a
//! VolumeAttachment or PV triggers its key, a pass plans each triggered VolumeAttachment
//! ([`crate::attach::plan`]) and hands the work to keyed workers — attaches, detaches and PV finalizer releases in separate lanes, so a detach
//! storm never starves attaches (external-attacher #761) — and, when the driver can list
//! published nodes, a periodic reconcile against ListVolumes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_grpc::conn::{CsiConnection, GoStatus};
use csi_kinds::cached::{CachedAttachment, CachedVolume};
use csi_kinds::volume_attachment::unpublish_request;
use csi_proto::csi::v1 as csi;
use csi_sidecar::api_errors::GoApiError;
use csi_sidecar::finalizers::{
    FinalizerError, add_builtin_finalizer, remove_builtin_finalizer, without,
};
use csi_sidecar::informers::{CacheSyncHealth, Informers};
use csi_sidecar::lock;
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use csi_sidecar::workqueue_metrics::WorkqueueMetrics;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::attach::{self, AttachError, AttachedVolume, DriverSupport, Operation, VaPlan};

/// How the attacher is set up (from its flags and the driver's discovery).
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver_name: String,
    pub support: DriverSupport,
    pub default_fstype: String,
    /// Deadline of each ControllerPublish/Unpublish call and of one whole reconcile pass.
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
    /// Workers per lane (attach, detach, PV).
    pub workers: usize,
    /// Every VolumeAttachment and PV is synced again this often (`--resync`).
    pub resync: Duration,
    /// Period of the ListVolumes reconcile (`--reconcile-sync`).
    pub reconcile_sync: Duration,
    /// `max_entries` of each ListVolumes page (0: the driver decides).
    pub max_entries: i32,
    /// Put the gRPC code of a failed attach into `attachError.errorCode`.
    pub attach_error_codes: bool,
    pub metrics: AttacherMetrics,
    /// Where the caches report whether they got their initial lists (`/healthz`).
    pub cache_sync: Arc<CacheSyncHealth>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

/// The backlog upstream does not show (external-attacher #706): VolumeAttachments waiting for
/// an attach or a detach, updated as each is planned.
#[derive(Clone, Debug, Default)]
pub struct AttacherMetrics {
    pending: Family<OperationLabel, Gauge>,
    /// client-go's `workqueue_*`: upstream's queues "csi-attacher-va" and "csi-attacher-pv".
    pub workqueues: WorkqueueMetrics,
}

impl AttacherMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            workqueues: WorkqueueMetrics::register(registry),
            ..Self::default()
        };
        registry.register(
            "csi_attacher_pending_operations",
            "VolumeAttachments waiting to be attached or detached",
            metrics.pending.clone(),
        );
        for operation in ["attach", "detach"] {
            metrics.set_pending(operation, 0);
        }
        metrics
    }

    fn set_pending(&self, operation: &'static str, count: usize) {
        self.pending
            .get_or_create(&OperationLabel { operation })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AttacherError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Why a sync failed; the runtime logs it and retries the key with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// ControllerPublishVolume or a check before it failed (also saved as `attachError`).
    #[error("attaching {attachment}: {message}")]
    Attach { attachment: String, message: String },
    /// ControllerUnpublishVolume or a check before it failed (also saved as `detachError`).
    #[error("detaching {attachment}: {message}")]
    Detach { attachment: String, message: String },
    #[error(transparent)]
    Finalizers(#[from] FinalizerError),
    #[error("updating the status of VolumeAttachment {attachment}: {source}")]
    Status {
        attachment: String,
        source: kube::Error,
    },
}

/// Why a reconcile against ListVolumes failed (it runs again next period).
#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("ListVolumes took longer than {0:?}")]
    Timeout(Duration),
    #[error("ListVolumes: {}", .0.message())]
    ListVolumes(tonic::Status),
}

/// The work item of one VolumeAttachment or one PV.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Attachment(String),
    Volume(String),
}

/// Worker lanes.
const ATTACH: usize = 0;
const DETACH: usize = 1;
const VOLUME: usize = 2;

struct Caches {
    /// Lean: k8s-openapi's VolumeAttachment holds an inline PV spec, 3.6 KB each.
    attachments: Store<CachedAttachment>,
    volumes: Store<CachedVolume>,
    csi_nodes: Store<CSINode>,
}

struct Attacher {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    finalizer: String,
    caches: Caches,
    workers: Arc<KeyedWorkers<Key>>,
    /// VolumeAttachment name → resourceVersions our own writes replaced. A sync that reads
    /// one of them from the cache would redo what we did (a second publish or unpublish), so it
    /// waits for the watch to bring our write.
    superseded: Superseded<String>,
    /// VolumeAttachment name → the UID whose volume was unpublished but whose finalizer is not
    /// removed yet: a retry only removes the finalizer (never a second unpublish, upstream #587).
    unpublished: Mutex<HashMap<String, String>>,
    /// VolumeAttachments the reconcile found out of step with the driver.
    forced: Mutex<HashSet<String>>,
    /// VolumeAttachment name → the operation it waits for, as last planned (the gauges).
    pending: Mutex<HashMap<String, &'static str>>,
}

/// A failed attach or detach: what goes into `attachError` / `detachError`.
struct Failure {
    message: String,
    code: Option<i32>,
}

impl From<AttachError> for Failure {
    fn from(error: AttachError) -> Self {
        Self {
            message: error.to_string(),
            code: None,
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Self {
        Self {
            message: GoStatus(&status).to_string(),
            code: Some(status.code() as i32),
        }
    }
}

/// Runs the attacher until `shutdown`.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), AttacherError> {
    let workers = KeyedWorkers::with_lanes(
        3,
        settings.workers,
        settings.retry_start,
        settings.retry_max,
    );
    let queues = &settings.metrics.workqueues;
    let named = vec![
        queues.queue("csi-attacher-va"),
        queues.queue("csi-attacher-pv"),
    ];
    workers.report_to(named, |key| match key {
        Key::Attachment(_) => 0,
        Key::Volume(_) => 1,
    });
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let (attachment_work, volume_work) = (workers.clone(), workers.clone());
    let caches = Caches {
        // A VolumeAttachment's change may also free its PV for release.
        attachments: informers.all_with(move |va: &CachedAttachment| {
            attachment_work.trigger_for(Key::Attachment(va.name_any()), va);
            if let Some(pv) = &va.spec.source.persistent_volume_name {
                attachment_work.trigger(Key::Volume(pv.clone()));
            }
        }),
        volumes: informers.all_with(move |pv: &CachedVolume| {
            volume_work.trigger_for(Key::Volume(pv.name_any()), pv);
        }),
        csi_nodes: informers.all(),
    };
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let attacher = Arc::new(Attacher {
        finalizer: attach::finalizer(&settings.driver_name),
        workers,
        client,
        csi,
        caches,
        superseded: Superseded::default(),
        unpublished: Mutex::default(),
        forced: Mutex::default(),
        pending: Mutex::default(),
        settings,
    });
    tracing::info!(driver = %attacher.settings.driver_name, support = ?attacher.settings.support, "attacher started");
    // The reconcile belongs to the loop: when it stops, the reconcile stops with it.
    let mut tasks = JoinSet::new();
    if attacher.settings.support.list_published_nodes {
        tasks.spawn(attacher.clone().reconcile_loop(shutdown.clone()));
    }
    let workers = attacher.workers.clone();
    workers
        .reconcile(&attacher, tasks, &wake, attacher.settings.resync, &shutdown)
        .await;
    Ok(())
}

impl Reconciler for Attacher {
    type Key = Key;
    type Error = SyncError;

    /// Every VolumeAttachment and PV.
    fn keys(&self) -> Vec<Key> {
        let attachments = self.caches.attachments.state();
        let volumes = self.caches.volumes.state();
        attachments
            .iter()
            .map(|va| Key::Attachment(va.name_any()))
            .chain(volumes.iter().map(|pv| Key::Volume(pv.name_any())))
            .collect()
    }

    /// Whether `key` has work, and then the version it is offered at and its lane.
    /// Attachments and volumes with nothing to do, or whose cache does not show our write
    /// yet, keep their backoff.
    fn offer(&self, key: &Key) -> Offer {
        match key {
            Key::Attachment(name) => {
                let Some(va) = self.caches.attachments.get(&ObjectRef::new(name)) else {
                    return Offer::Gone;
                };
                let version = va.resource_version();
                let (plan, forced) = self.plan(&va);
                let (operation, lane) = match plan {
                    VaPlan::NotOurs | VaPlan::Nothing => {
                        self.set_pending(name, None);
                        return Offer::Idle;
                    }
                    VaPlan::Attach | VaPlan::MarkAttached => ("attach", ATTACH),
                    VaPlan::Detach => ("detach", DETACH),
                };
                self.set_pending(name, Some(operation));
                if self.superseded.is_stale(name, version.as_deref()) {
                    return Offer::Idle;
                }
                Offer::Run {
                    // A forced sync runs even if this version was synced before.
                    version: version.filter(|_| !forced),
                    lane,
                }
            }
            Key::Volume(name) => {
                let Some(pv) = self.caches.volumes.get(&ObjectRef::new(name)) else {
                    return Offer::Gone;
                };
                if pv.metadata.deletion_timestamp.is_some()
                    && pv.finalizers().contains(&self.finalizer)
                {
                    Offer::Run {
                        version: pv.resource_version(),
                        lane: VOLUME,
                    }
                } else {
                    Offer::Idle
                }
            }
        }
    }

    /// Each kind's sync in a box of its own size ([`SyncFuture`]).
    fn sync(self: Arc<Self>, key: Key) -> SyncFuture<SyncError> {
        match key {
            Key::Attachment(name) => Box::pin(async move { self.sync_attachment(&name).await }),
            Key::Volume(name) => Box::pin(async move { self.sync_volume(&name).await }),
        }
    }

    /// Drops the in-memory state of a VolumeAttachment that is gone.
    fn forget(&self, key: &Key) {
        if let Key::Attachment(name) = key {
            self.superseded.forget(name);
            lock(&self.unpublished).remove(name);
            lock(&self.forced).remove(name);
            self.set_pending(name, None);
        }
    }
}

impl Attacher {
    /// Records the operation the VolumeAttachment `name` waits for (`None`: none) and counts
    /// them again in the gauges when that changed.
    fn set_pending(&self, name: &str, operation: Option<&'static str>) {
        let mut pending = lock(&self.pending);
        let changed = match operation {
            Some(operation) => pending.insert(name.to_string(), operation) != Some(operation),
            None => pending.remove(name).is_some(),
        };
        if changed {
            let attaching = pending.values().filter(|op| **op == "attach").count();
            self.settings.metrics.set_pending("attach", attaching);
            self.settings
                .metrics
                .set_pending("detach", pending.len() - attaching);
        }
    }

    /// The VolumeAttachment's plan, and whether the reconcile forced its sync.
    fn plan(&self, va: &CachedAttachment) -> (VaPlan, bool) {
        let forced = lock(&self.forced).contains(&va.name_any());
        let plan = attach::plan(
            va,
            &self.settings.driver_name,
            self.settings.support,
            forced,
        );
        (plan, forced)
    }

    /// Records that our write replaced `va`'s version — unless the write changed nothing: the
    /// apiserver keeps the resourceVersion of a no-op write (an identical detachError within
    /// the same second), and waiting for a newer version would then wait forever.
    fn wrote(&self, va: &CachedAttachment, updated: Option<&CachedAttachment>) {
        match updated {
            Some(updated) => self.superseded.wrote(va.name_any(), va, updated),
            None => self.supersede(va),
        }
    }

    /// Records that `va`'s version is older than our last write.
    fn supersede(&self, va: &CachedAttachment) {
        self.superseded.supersede(va.name_any(), va);
    }

    fn attachments(&self) -> Api<CachedAttachment> {
        Api::all(self.client.clone())
    }

    async fn sync_attachment(&self, name: &str) -> Result<Synced, SyncError> {
        let Some(va) = self.caches.attachments.get(&ObjectRef::new(name)) else {
            return Ok(Synced::Done);
        };
        if self
            .superseded
            .contains(&name.to_string(), va.resource_version().as_deref())
        {
            return Ok(Synced::Waiting);
        }
        let (plan, forced) = self.plan(&va);
        let result = match plan {
            VaPlan::NotOurs | VaPlan::Nothing => Ok(()),
            VaPlan::MarkAttached => self.mark_attached(&va).await,
            VaPlan::Attach => self.attach(&va).await,
            VaPlan::Detach => self.detach(&va).await,
        };
        if result.is_ok() && forced {
            lock(&self.forced).remove(name);
        }
        result.map(|()| Synced::Done)
    }

    /// Trivial mode: attached, no finalizer, no CSI call.
    async fn mark_attached(&self, va: &CachedAttachment) -> Result<(), SyncError> {
        self.patch_status(va, attach::attached_status(&HashMap::new()))
            .await
            .map(drop)
    }

    async fn attach(&self, va: &CachedAttachment) -> Result<(), SyncError> {
        let name = va.name_any();
        let published = match self.publish(va).await {
            Ok(published) => published,
            Err(failure) => {
                let attached = va.attached();
                let status = attach::error_status(
                    Operation::Attach,
                    attached,
                    &failure.message,
                    failure.code.filter(|_| self.settings.attach_error_codes),
                    &now(),
                );
                if let Err(error) = self.patch_status(va, status).await {
                    tracing::warn!(attachment = %name, %error, "saving the attach error failed");
                }
                return Err(SyncError::Attach {
                    attachment: name,
                    message: failure.message,
                });
            }
        };
        let (current, context) = published;
        self.patch_status(&current, attach::attached_status(&context))
            .await?;
        tracing::info!(attachment = %name, node = %va.spec.node_name, "attached");
        Ok(())
    }

    /// Every check, the PV finalizer, our VA finalizer + node-ID annotation, then
    /// ControllerPublishVolume. Returns the VolumeAttachment as last written and the publish
    /// context.
    ///
    /// The finalizer patch is boxed: retried from a fresh GET, it is large inline and would
    /// size every running sync.
    async fn publish(
        &self,
        va: &CachedAttachment,
    ) -> Result<(CachedAttachment, HashMap<String, String>), Failure> {
        let pv = self.cached_volume(va);
        let volume = self.volume(va, pv.as_deref(), true).await?;
        if let Some(pv) = &pv {
            let api: Api<CachedVolume> = Api::all(self.client.clone());
            match Box::pin(add_builtin_finalizer(&api, pv.as_ref(), &self.finalizer)).await {
                Ok(Some(_)) => {}
                Ok(None) => return Err(AttachError::MissingVolume(pv.name_any()).into()),
                Err(error) => {
                    return Err(message(format!(
                        "could not add PersistentVolume finalizer: {}",
                        error.cause()
                    )));
                }
            }
        }
        let mut request = attach::publish_request(
            &volume,
            &self.settings.default_fstype,
            self.settings.support,
        )?;
        request.secrets = self.secrets(&volume).await?;
        let node = &va.spec.node_name;
        let csi_node = self.caches.csi_nodes.get(&ObjectRef::new(node));
        request.node_id =
            attach::attach_node_id(node, csi_node.as_deref(), &self.settings.driver_name)?;
        let current = match attach::claim_patch(va, &self.finalizer, &request.node_id) {
            Some(ops) => self.patch_metadata(va, ops).await?,
            None => va.clone(),
        };
        let response = self
            .csi
            .controller_publish_volume(request, self.settings.timeout)
            .await?;
        Ok((current, response.publish_context.into_iter().collect()))
    }

    async fn detach(&self, va: &CachedAttachment) -> Result<(), SyncError> {
        let name = va.name_any();
        let uid = va.uid().unwrap_or_default();
        if lock(&self.unpublished).get(&name) != Some(&uid) {
            if let Err(failure) = self.unpublish(va).await {
                let attached = va.attached();
                let status = attach::error_status(
                    Operation::Detach,
                    attached,
                    &failure.message,
                    failure.code,
                    &now(),
                );
                if let Err(error) = self.patch_status(va, status).await {
                    tracing::warn!(attachment = %name, %error, "saving the detach error failed");
                }
                return Err(SyncError::Detach {
                    attachment: name,
                    message: failure.message,
                });
            }
            lock(&self.unpublished).insert(name.clone(), uid.clone());
        }
        // The finalizer first, then the status (upstream #587: the other order let a sync see
        // "finalizer and not attached" and unpublish again).
        let finalizers = without(va.finalizers(), &self.finalizer);
        // Deleting and left without finalizers, the VolumeAttachment is gone: no status to
        // write. (The apiserver answers such an update with the object as last stored, so
        // the response cannot tell.)
        let gone = va.metadata.deletion_timestamp.is_some() && finalizers.is_empty();
        let current = if finalizers.len() == va.finalizers().len() {
            Some(va.clone())
        } else {
            let updated =
                remove_builtin_finalizer(&self.attachments(), va, &self.finalizer).await?;
            if gone {
                // The answer may carry the version last stored, which cannot tell this write
                // from a no-op; the cached VolumeAttachment is stale all the same until the
                // watch brings its deletion (else the reconcile finds it attached and
                // unpublished, and a forced sync unpublishes a second time).
                self.supersede(va);
            } else {
                self.wrote(va, updated.as_ref());
            }
            updated
        };
        lock(&self.unpublished).remove(&name);
        if let Some(current) = current.filter(|_| !gone) {
            self.patch_status(&current, attach::detached_status())
                .await?;
        }
        tracing::info!(attachment = %name, node = %va.spec.node_name, "detached");
        Ok(())
    }

    async fn unpublish(&self, va: &CachedAttachment) -> Result<(), Failure> {
        let pv = self.cached_volume(va);
        let volume = self.volume(va, pv.as_deref(), false).await?;
        // Upstream's order: the Secret, then the node ID.
        let secrets = self.secrets(&volume).await?;
        let csi_node = self
            .caches
            .csi_nodes
            .get(&ObjectRef::new(&va.spec.node_name));
        let node_id = attach::detach_node_id(va, csi_node.as_deref(), &self.settings.driver_name)?;
        let request = unpublish_request(&volume.csi.volume_handle, &node_id, secrets);
        self.csi
            .controller_unpublish_volume(request, self.settings.timeout)
            .await?;
        Ok(())
    }

    /// The volume `va` attaches: [`attach::attached_volume`] when `attaching`, else
    /// [`attach::volume_of`]. The cache keeps no in-tree source, so a PV without a CSI source
    /// is read as stored, for CSI migration.
    async fn volume(
        &self,
        va: &CachedAttachment,
        pv: Option<&CachedVolume>,
        attaching: bool,
    ) -> Result<AttachedVolume, Failure> {
        let of = |stored: Option<&PersistentVolume>| {
            if attaching {
                attach::attached_volume(va, pv, stored)
            } else {
                attach::volume_of(va, pv, stored)
            }
        };
        match (of(None), pv) {
            (Err(AttachError::NotCsi), Some(pv)) => {
                let name = pv.name_any();
                let api: Api<PersistentVolume> = Api::all(self.client.clone());
                let stored = api.get(&name).await.map_err(|error| {
                    message(format!("reading PersistentVolume {name}: {error}"))
                })?;
                Ok(of(Some(&stored))?)
            }
            (volume, _) => Ok(volume?),
        }
    }

    fn cached_volume(&self, va: &CachedAttachment) -> Option<Arc<CachedVolume>> {
        let name = va.spec.source.persistent_volume_name.as_ref()?;
        self.caches.volumes.get(&ObjectRef::new(name))
    }

    /// The publish secrets: a live GET (secrets are not cached, as upstream).
    async fn secrets(&self, volume: &AttachedVolume) -> Result<HashMap<String, String>, Failure> {
        let Some(reference) = attach::publish_secret(volume) else {
            return Ok(HashMap::new());
        };
        csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &reference)
            .await
            .map(|data| data.into_inner())
            .map_err(|error| {
                message(format!(
                    "failed to load secret \"{}/{}\": {}",
                    reference.namespace,
                    reference.name,
                    error.cause()
                ))
            })
    }

    /// Our finalizer and node-ID annotation ([`attach::claim_patch`]); a failure reads as
    /// upstream's.
    async fn patch_metadata(
        &self,
        va: &CachedAttachment,
        ops: Value,
    ) -> Result<CachedAttachment, Failure> {
        let save_failed = |cause: &dyn std::fmt::Display| {
            message(format!("could not save VolumeAttachment: {cause}"))
        };
        let ops: json_patch::Patch =
            serde_json::from_value(ops).map_err(|error| save_failed(&error))?;
        let updated = self
            .attachments()
            .patch(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(ops),
            )
            .await
            .map_err(|error| save_failed(&GoApiError(&error)))?;
        self.wrote(va, Some(&updated));
        Ok(updated)
    }

    /// A merge patch of the status subresource; a VolumeAttachment that is gone is fine.
    async fn patch_status(
        &self,
        va: &CachedAttachment,
        status: Value,
    ) -> Result<Option<CachedAttachment>, SyncError> {
        match self
            .attachments()
            .patch_status(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
        {
            Ok(updated) => {
                self.wrote(va, Some(&updated));
                Ok(Some(updated))
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(source) => Err(SyncError::Status {
                attachment: va.name_any(),
                source,
            }),
        }
    }

    /// Releases a PV being deleted once no VolumeAttachment names it.
    async fn sync_volume(&self, name: &str) -> Result<Synced, SyncError> {
        let Some(pv) = self.caches.volumes.get(&ObjectRef::new(name)) else {
            return Ok(Synced::Done);
        };
        if pv.metadata.deletion_timestamp.is_none() || !pv.finalizers().contains(&self.finalizer) {
            return Ok(Synced::Done);
        }
        let in_use = self
            .caches
            .attachments
            .state()
            .iter()
            .any(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name));
        if in_use {
            return Ok(Synced::Waiting);
        }
        let api: Api<CachedVolume> = Api::all(self.client.clone());
        remove_builtin_finalizer(&api, &*pv, &self.finalizer).await?;
        tracing::info!(volume = %name, "released the PersistentVolume");
        Ok(Synced::Done)
    }

    /// Once the caches are synced and then every `--reconcile-sync` (as upstream's
    /// `wait.UntilWithContext`, so a restarted attacher catches a volume the driver lost at
    /// once): compares each VolumeAttachment's `status.attached` with the driver's published
    /// nodes and forces a sync of those out of step. The reconcile itself writes nothing, so
    /// it never races the workers.
    async fn reconcile_loop(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            match self.reconcile().await {
                Ok(0) => {}
                Ok(count) => {
                    tracing::info!(
                        count,
                        "VolumeAttachments out of step with the driver, syncing them again"
                    );
                }
                Err(error) => tracing::warn!(%error, "reconcile with ListVolumes failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.settings.reconcile_sync) => {}
            }
        }
    }

    /// One reconcile pass; returns how many VolumeAttachments were forced.
    async fn reconcile(&self) -> Result<usize, ReconcileError> {
        // Read the VolumeAttachments before listing: one whose version changed meanwhile (or
        // whose sync runs) is in motion and is left to its worker.
        let before: Vec<Arc<CachedAttachment>> = self
            .caches
            .attachments
            .state()
            .into_iter()
            .filter(|va| va.spec.attacher == self.settings.driver_name)
            .collect();
        let published = tokio::time::timeout(self.settings.timeout, self.published_nodes())
            .await
            .map_err(|_| ReconcileError::Timeout(self.settings.timeout))??;
        let mut forced = 0;
        for va in before {
            let name = va.name_any();
            let still = self.caches.attachments.get(&ObjectRef::new(&name));
            if still.is_none_or(|now| now.resource_version() != va.resource_version())
                || self.workers.is_running(&Key::Attachment(name.clone()))
                || self
                    .superseded
                    .contains(&name, va.resource_version().as_deref())
            {
                continue;
            }
            let pv = self.cached_volume(&va);
            // An in-tree PV (CSI migration) is not read from the API server here: its
            // attachment is not compared with the driver.
            let Ok(volume) = attach::volume_of(&va, pv.as_deref(), None) else {
                continue;
            };
            let csi_node = self
                .caches
                .csi_nodes
                .get(&ObjectRef::new(&va.spec.node_name));
            let Ok(node_id) =
                attach::detach_node_id(&va, csi_node.as_deref(), &self.settings.driver_name)
            else {
                continue;
            };
            let found = published
                .get(&volume.csi.volume_handle)
                .is_some_and(|nodes| nodes.contains(&node_id));
            let attached = va.attached();
            if attached != found {
                tracing::info!(attachment = %name, attached, published = found, "out of step with the driver");
                lock(&self.forced).insert(name.clone());
                self.workers.trigger(Key::Attachment(name));
                forced += 1;
            }
        }
        Ok(forced)
    }

    /// Volume ID → the node IDs it is published to, over every ListVolumes page.
    async fn published_nodes(&self) -> Result<HashMap<String, HashSet<String>>, ReconcileError> {
        let mut published = HashMap::new();
        let mut token = String::new();
        loop {
            let request = csi::ListVolumesRequest {
                max_entries: self.settings.max_entries,
                starting_token: token.clone(),
            };
            let page = self
                .csi
                .list_volumes(request, self.settings.timeout)
                .await
                .map_err(ReconcileError::ListVolumes)?;
            for entry in page.entries {
                let (Some(volume), Some(status)) = (entry.volume, entry.status) else {
                    continue;
                };
                published
                    .entry(volume.volume_id)
                    .or_insert_with(HashSet::new)
                    .extend(status.published_node_ids);
            }
            if page.next_token.is_empty() {
                return Ok(published);
            }
            token = page.next_token;
        }
    }
}

fn message(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        code: None,
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map_or_else(|_| String::new(), |t| t.to_string())
}

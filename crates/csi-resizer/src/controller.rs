//! The resizer's adapters: caches of claims, PVs and (with `--handle-volume-inuse-error`) pods;
//! a claim's change triggers its key, and so does a change of the PV its `claimRef` names. Each
//! triggered claim is planned ([`crate::resize`]) and expanded on the keyed workers: the claim
//! status marked, ControllerExpandVolume called, the PV's capacity patched, the claim status
//! finished or marked for node expansion, with upstream's Events. With the modify controller
//! ([`crate::modify`]) a claim no expansion is due for gets its VolumeAttributesClass. A driver
//! that cannot expand runs the modify part alone: a claim asking for more is left as it is, as
//! upstream leaves it with no resize controller.
//!
//! CSI migration: the PV cache keeps whole PVs, so an in-tree PV's CSI translation
//! ([`crate::resize::csi_volume`]) is made from the cached PV without another read.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_grpc::conn::{CsiConnection, GoStatus};
use csi_kinds::vac::VolumeAttributesClass;
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::informers::{CacheSyncHealth, Informers, keep_pod_volumes};
use csi_sidecar::lock;
use csi_sidecar::slow_set::SlowSet;
use csi_sidecar::superseded::Superseded;
use csi_sidecar::workers::{KeyedWorkers, Offer, Reconciler, SyncFuture, Synced};
use csi_sidecar::workqueue_metrics::WorkqueueMetrics;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::modify::{self, ModifyPlan};
use crate::resize::{self, Expansion, FailureKind, Memory, Path, Plan, Resizer, reason};

/// How the resizer is set up (from its flags and the driver's discovery).
#[derive(Debug, Clone)]
pub struct Settings {
    pub driver_name: String,
    /// The resize controller: how the driver expands; `None` for a driver that cannot (upstream
    /// runs no resize controller then).
    pub resizer: Option<Resizer>,
    /// Deadline of each ControllerExpandVolume call (`--timeout`).
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
    /// Concurrent syncs (`--workers`).
    pub workers: usize,
    /// Every claim is synced again this often (`--resync-period`).
    pub resync: Duration,
    /// `--handle-volume-inuse-error`: watch pods, and hold back a claim whose driver refused to
    /// expand it in use while a pod uses it.
    pub handle_volume_in_use_error: bool,
    /// Gate `RecoverVolumeExpansionFailure`.
    pub recover: bool,
    /// Gate `AnnotateFsResize`.
    pub annotate_fs_resize: bool,
    /// Where the caches report whether they got their initial lists (`/healthz`).
    pub cache_sync: Arc<CacheSyncHealth>,
    /// ControllerModifyVolume for VolumeAttributesClass changes: the driver can modify, the
    /// gate is on and the server serves the classes.
    pub modify: Option<ModifySettings>,
    /// client-go's `workqueue_*`; upstream's resize and modify controllers both name their
    /// queue "<driver>-pvc".
    pub workqueues: WorkqueueMetrics,
}

/// How volumes are modified.
#[derive(Debug, Clone, Copy)]
pub struct ModifySettings {
    /// `--extra-modify-metadata`.
    pub extra_metadata: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ResizerError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Why a sync failed; the runtime logs it and retries the claim with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The expansion failed (the message is also the `VolumeResizeFailed` Event's).
    #[error("{0}")]
    Expand(String),
    /// The driver cannot expand the volume online and a pod still uses the claim.
    #[error("{0}")]
    InUse(String),
    /// The modification failed (also the `VolumeModifyFailed` Event).
    #[error("{0}")]
    Modify(String),
    #[error("updating the status of PersistentVolumeClaim {claim}: {source}")]
    Status { claim: String, source: kube::Error },
    #[error("updating PersistentVolume {volume}: {source}")]
    Volume { volume: String, source: kube::Error },
}

type Key = ObjectRef<PersistentVolumeClaim>;

struct Caches {
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    pods: Option<Store<Pod>>,
    classes: Option<Store<VolumeAttributesClass>>,
}

struct Controller {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    caches: Caches,
    events: EventRecorder,
    /// Upstream's `Name()` in messages: the driver name.
    name: String,
    /// Claim → the resourceVersion our last status write replaced: a sync that reads it from
    /// the cache waits for the watch to bring our write instead of planning from stale state.
    superseded: Superseded<Key>,
    /// UIDs of claims whose driver answered FailedPrecondition (cannot expand in use).
    in_use_errors: Mutex<HashSet<String>>,
    /// Claims whose last ControllerExpandVolume ended with a final error.
    final_errors: Mutex<HashSet<Key>>,
    /// Claims whose expansion was infeasible (upstream's slow set).
    infeasible: SlowSet<Key>,
    /// Claims whose last ControllerModifyVolume may still run at the driver.
    modify_uncertain: Mutex<HashSet<Key>>,
    /// Claims whose modification was infeasible (the modify controller's slow set).
    modify_infeasible: SlowSet<Key>,
}

/// A failed expansion step: its message and, for a CSI error, the gRPC code.
struct Failure {
    message: String,
    code: Option<tonic::Code>,
}

impl Failure {
    fn other(message: impl ToString) -> Self {
        Self {
            message: message.to_string(),
            code: None,
        }
    }
}

/// Runs the resizer until `shutdown`; with neither the resize nor the modify controller (a
/// driver that only modifies, the VolumeAttributesClass gate off) it waits idle, as upstream.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), ResizerError> {
    if settings.resizer.is_none() && settings.modify.is_none() {
        tracing::info!(driver = %settings.driver_name, "the driver cannot expand and the VolumeAttributesClass gate is off: no controller runs");
        shutdown.cancelled().await;
        return Ok(());
    }
    let workers = KeyedWorkers::new(settings.workers, settings.retry_start, settings.retry_max);
    let queue = settings
        .workqueues
        .queue(&format!("{}-pvc", settings.driver_name));
    workers.report_to(vec![queue], |_| 0);
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let (claim_work, volume_work) = (workers.clone(), workers.clone());
    let caches = Caches {
        claims: informers.all_with(move |pvc: &PersistentVolumeClaim| {
            claim_work.trigger_for(ObjectRef::from_obj(pvc), pvc);
        }),
        // A PV's change (its capacity, our annotation) concerns the claim it is bound to.
        volumes: informers.all_with(move |pv: &PersistentVolume| {
            let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            if let Some((name, namespace)) =
                claim.and_then(|c| Some((c.name.as_ref()?, c.namespace.as_ref()?)))
            {
                volume_work.trigger(ObjectRef::new(name).within(namespace));
            }
        }),
        pods: (settings.resizer.is_some() && settings.handle_volume_in_use_error)
            .then(|| informers.all_lean::<Pod>(keep_pod_volumes)),
        classes: settings
            .modify
            .map(|_| informers.all::<VolumeAttributesClass>()),
    };
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    // A modification in progress when the resizer (re)started may still run at the driver
    // (upstream initUncertainPVCs).
    let modify_uncertain: HashSet<Key> = caches
        .claims
        .state()
        .iter()
        .filter(|pvc| {
            modify::modify_status(pvc).is_some_and(|(s, _)| s == modify::status::IN_PROGRESS)
        })
        .map(|pvc| ObjectRef::from_obj(pvc.as_ref()))
        .collect();
    let controller = Arc::new(Controller {
        events: EventRecorder::new(
            client.clone(),
            format!("external-resizer {}", settings.driver_name),
            "",
        ),
        name: settings.driver_name.clone(),
        client,
        csi,
        caches,
        superseded: Superseded::default(),
        in_use_errors: Mutex::default(),
        final_errors: Mutex::default(),
        infeasible: SlowSet::new(settings.retry_max),
        modify_uncertain: Mutex::new(modify_uncertain),
        modify_infeasible: SlowSet::new(settings.retry_max),
        settings,
    });
    tracing::info!(driver = %controller.name, resizer = ?controller.settings.resizer, modify = controller.settings.modify.is_some(), "resizer started");
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

    fn keys(&self) -> Vec<Key> {
        let claims = self.caches.claims.state();
        claims.iter().map(|c| ObjectRef::from_obj(&**c)).collect()
    }

    /// At the claim's version and its PV's, since either changes the plan.
    fn offer(&self, key: &Key) -> Offer {
        let Some(pvc) = self.caches.claims.get(key) else {
            return Offer::Gone;
        };
        let pv = self.volume_of(&pvc);
        Offer::at(Some(format!(
            "{}/{}",
            pvc.resource_version().unwrap_or_default(),
            pv.and_then(|pv| pv.resource_version()).unwrap_or_default()
        )))
    }

    fn sync(self: Arc<Self>, key: Key) -> SyncFuture<SyncError> {
        Box::pin(async move { self.sync_claim(&key).await })
    }

    /// Drops the in-memory state of a claim that is gone.
    fn forget(&self, key: &Key) {
        self.superseded.forget(key);
        lock(&self.final_errors).remove(key);
        self.infeasible.remove(key);
        lock(&self.modify_uncertain).remove(key);
        self.modify_infeasible.remove(key);
    }
}

impl Controller {
    fn volume_of(&self, pvc: &PersistentVolumeClaim) -> Option<Arc<PersistentVolume>> {
        let name = pvc.spec.as_ref()?.volume_name.as_ref()?;
        self.caches.volumes.get(&ObjectRef::new(name))
    }

    async fn sync_claim(self: &Arc<Self>, key: &Key) -> Result<Synced, SyncError> {
        let Some(pvc) = self.caches.claims.get(key) else {
            return Ok(Synced::Done);
        };
        if self
            .superseded
            .is_stale(key, pvc.resource_version().as_deref())
        {
            return Ok(Synced::Waiting);
        }
        // A claim whose PV is not in the cache yet: the PV's arrival triggers it again.
        let Some(pv) = self.volume_of(&pvc) else {
            return Ok(Synced::Done);
        };
        let Some(resizer) = self.settings.resizer else {
            return self.modify_if_on(key, &pvc, &pv).await;
        };
        let driver = &self.settings.driver_name;
        if self.settings.annotate_fs_resize
            && resize::can_support(&pvc, &pv, driver)
            && resize::pre_resize_annotation_done(&pvc, &pv)
        {
            self.patch_volume(&pv, &resize::remove_pre_resize_annotation_patch())
                .await?;
        }
        let plan = if self.settings.recover {
            resize::plan_recovering(&pvc, &pv, driver, resizer, self.memory(key, &pvc))
        } else {
            resize::plan_legacy(&pvc, &pv, driver)
        };
        match plan {
            Plan::Nothing => self.modify_if_on(key, &pvc, &pv).await,
            Plan::RetryLater(wait) => {
                tracing::debug!(claim = %claim_name(key), ?wait, "expansion failed as infeasible before; retrying later");
                Ok(Synced::After(wait))
            }
            Plan::Expand(expansion) => self.expand(key, &pvc, &pv, resizer, expansion).await,
        }
    }

    /// [`Controller::modify`] when the modify controller runs.
    async fn modify_if_on(
        &self,
        key: &Key,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<Synced, SyncError> {
        match self.settings.modify {
            Some(settings) => self.modify(key, pvc, pv, settings).await,
            None => Ok(Synced::Done),
        }
    }

    /// The controller's memory of the claim for the plan; an infeasible status starts (or
    /// continues) its slow retry.
    fn memory(&self, key: &Key, pvc: &PersistentVolumeClaim) -> Memory {
        let refused =
            resize::resize_status(pvc) == Some(resize::resize_status::CONTROLLER_RESIZE_INFEASIBLE);
        Memory {
            final_error: lock(&self.final_errors).contains(key),
            infeasible_wait: self
                .infeasible
                .remaining_then_mark(key, (), refused, Instant::now()),
        }
    }

    fn path(&self) -> Path {
        if self.settings.recover {
            Path::Recovering
        } else {
            Path::Legacy
        }
    }

    /// Marks the claim, expands the volume and records the outcome.
    async fn expand(
        &self,
        key: &Key,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        resizer: Resizer,
        expansion: Expansion,
    ) -> Result<Synced, SyncError> {
        let path = self.path();
        let claim = self
            .patch_status(
                pvc,
                &resize::in_progress_patch(pvc, path, expansion, &now()),
            )
            .await?;
        let uid = pvc.uid().unwrap_or_default();
        if lock(&self.in_use_errors).contains(&uid) && self.used_by_pod(pvc) {
            let message = format!(
                "Unable to expand {} because CSI driver {} only supports offline expansion and volume is currently in-use",
                claim_name(key),
                self.name
            );
            self.warn(&claim, reason::VOLUME_RESIZE_FAILED, &message)
                .await;
            return Err(SyncError::InUse(message));
        }
        let pv_name = pv.name_any();
        self.event(
            &claim,
            EventType::Normal,
            reason::RESIZING,
            &format!("External resizer is resizing volume {pv_name}"),
        )
        .await;
        lock(&self.in_use_errors).remove(&uid);
        let result = match self.call_driver(pv, resizer, expansion.bytes).await {
            Ok(done) => {
                lock(&self.final_errors).remove(key);
                self.infeasible.remove(key);
                self.record_success(&claim, pv, done).await
            }
            Err(failure) => Err(self.record_failure(key, &claim, &pv_name, failure).await),
        };
        if let Err(error) = &result
            && !is_conflict(error)
        {
            self.warn(&claim, reason::VOLUME_RESIZE_FAILED, &error.to_string())
                .await;
        }
        result.map(|()| Synced::Done)
    }

    /// ControllerExpandVolume (or, for a node-only driver, nothing): the new size and whether
    /// the node must expand too.
    async fn call_driver(
        &self,
        pv: &PersistentVolume,
        resizer: Resizer,
        bytes: i64,
    ) -> Result<(i64, bool), Failure> {
        let Resizer::Controller {
            single_node_multi_writer,
        } = resizer
        else {
            return Ok((bytes, true));
        };
        // CSI migration: an in-tree PV is expanded as its CSI translation.
        let volume = resize::csi_volume(pv, &self.settings.driver_name).map_err(Failure::other)?;
        let secrets = match resize::expand_secret(&volume) {
            Some(reference) => {
                csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &reference)
                    .await
                    .map_err(Failure::other)?
                    .into_inner()
            }
            None => HashMap::new(),
        };
        let request = resize::expand_request(&volume, bytes, single_node_multi_writer, secrets)
            .map_err(Failure::other)?;
        let response = self
            .csi
            .controller_expand_volume(request, self.settings.timeout)
            .await
            .map_err(|status| Failure {
                message: GoStatus(&status).to_string(),
                code: Some(status.code()),
            })?;
        Ok((
            resize::expanded_size(response.capacity_bytes, bytes),
            response.node_expansion_required,
        ))
    }

    /// The PV's new capacity, then the claim: node expansion pending, or finished.
    async fn record_success(
        &self,
        claim: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        (bytes, node_expansion_required): (i64, bool),
    ) -> Result<(), SyncError> {
        let capacity = resize::claim_capacity_text(claim);
        let patch = resize::volume_patch(
            pv,
            &capacity,
            bytes,
            node_expansion_required,
            self.settings.annotate_fs_resize,
        );
        self.patch_volume(pv, &patch).await?;
        let path = self.path();
        if node_expansion_required {
            self.patch_status(
                claim,
                &resize::node_expansion_pending_patch(claim, path, &now()),
            )
            .await?;
            self.event(
                claim,
                EventType::Normal,
                reason::FILE_SYSTEM_RESIZE_REQUIRED,
                "Require file system resize of volume on node",
            )
            .await;
        } else {
            self.patch_status(claim, &resize::finished_patch(claim, path, bytes))
                .await?;
            self.event(
                claim,
                EventType::Normal,
                reason::VOLUME_RESIZE_SUCCESSFUL,
                "Resize volume succeeded",
            )
            .await;
        }
        tracing::info!(claim = %claim_name(&ObjectRef::from_obj(claim)), volume = %pv.name_any(), bytes, node_expansion_required, "volume expanded");
        Ok(())
    }

    /// Remembers what the failure means for the next plan and, on the recovering path, records
    /// a final one in the claim's status.
    async fn record_failure(
        &self,
        key: &Key,
        claim: &PersistentVolumeClaim,
        pv_name: &str,
        failure: Failure,
    ) -> SyncError {
        let kind = FailureKind::of(failure.code);
        if kind.in_use {
            lock(&self.in_use_errors).insert(claim.uid().unwrap_or_default());
        }
        let message = format!(
            "resize volume {pv_name:?} by resizer {:?} failed: {}",
            self.name, failure.message
        );
        if !self.settings.recover {
            return SyncError::Expand(message);
        }
        if !kind.final_error {
            lock(&self.final_errors).remove(key);
            self.infeasible.remove(key);
            return SyncError::Expand(message);
        }
        lock(&self.final_errors).insert(key.clone());
        if !kind.infeasible {
            self.infeasible.remove(key);
        }
        let patch = resize::failed_patch(claim, kind.infeasible, &failure.message, &now());
        match self.patch_status(claim, &patch).await {
            Ok(_) => SyncError::Expand(message),
            Err(error) => SyncError::Expand(format!(
                "resizing failed in controller with {} but failed to update PVC {} with: {error}",
                failure.message,
                claim_name(key)
            )),
        }
    }

    /// Whether a pod that has not terminated mounts the claim.
    fn used_by_pod(&self, pvc: &PersistentVolumeClaim) -> bool {
        let Some(pods) = &self.caches.pods else {
            return false;
        };
        let (namespace, name) = (pvc.namespace(), pvc.name_any());
        pods.state().iter().any(|pod| {
            let terminated = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
            !terminated
                && pod.namespace() == namespace
                && pod
                    .spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .filter_map(|v| v.persistent_volume_claim.as_ref())
                    .any(|source| source.claim_name == name)
        })
    }

    /// The claim's VolumeAttributesClass, once no expansion is due (upstream's modify
    /// controller): ControllerModifyVolume with the class's parameters, then the PV and the
    /// claim record the class; failures go into the claim's status and conditions.
    async fn modify(
        &self,
        key: &Key,
        pvc: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        settings: ModifySettings,
    ) -> Result<Synced, SyncError> {
        let memory = self.modify_memory(key, pvc);
        let name = pvc.name_any();
        let (class, mark) = match modify::plan(pvc, pv, &self.settings.driver_name, memory) {
            ModifyPlan::Nothing => return Ok(Synced::Done),
            ModifyPlan::RetryLater(wait) => return Ok(Synced::After(wait)),
            ModifyPlan::RolledBack => {
                self.event(
                    pvc,
                    EventType::Normal,
                    modify::reason::VOLUME_MODIFY_CANCELLED,
                    "Cancelled modify.",
                )
                .await;
                self.patch_status(pvc, &modify::rolled_back_patch(pvc))
                    .await?;
                return Ok(Synced::Done);
            }
            ModifyPlan::Modify { class, mark } => (class, mark),
        };
        let cached = self
            .caches
            .classes
            .as_ref()
            .and_then(|classes| classes.get(&ObjectRef::new(&class)));
        let Some(vac) = cached else {
            self.warn(
                pvc,
                modify::reason::VOLUME_MODIFY_FAILED,
                &format!("VAC {class:?} does not exist."),
            )
            .await;
            if mark {
                self.patch_status(
                    pvc,
                    &modify::status_patch(pvc, modify::status::PENDING, None, &now()),
                )
                .await?;
            }
            return Err(SyncError::Modify(format!(
                "get VAC with vac name {class} in VACInformer cache failed: volumeattributesclass.storage.k8s.io \"{class}\" not found"
            )));
        };
        let parameters = match modify::parameters(&vac, &self.settings.driver_name) {
            Ok(parameters) => parameters,
            Err(message) => {
                self.warn(pvc, modify::reason::VOLUME_MODIFY_FAILED, &message)
                    .await;
                return Err(SyncError::Modify(message));
            }
        };
        let claim = if mark {
            let claim = self
                .patch_status(
                    pvc,
                    &modify::status_patch(pvc, modify::status::IN_PROGRESS, None, &now()),
                )
                .await?;
            self.event(
                &claim,
                EventType::Normal,
                modify::reason::VOLUME_MODIFY,
                &format!("external resizer is modifying volume {name} with vac {class}"),
            )
            .await;
            claim
        } else {
            pvc.clone()
        };
        let secrets = match modify::modify_secret(pv) {
            Some(reference) => {
                csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &reference)
                    .await
                    .map_err(|e| SyncError::Modify(e.to_string()))?
                    .into_inner()
            }
            None => HashMap::new(),
        };
        let request = modify::request(&claim, pv, parameters, settings.extra_metadata, secrets);
        match self
            .csi
            .controller_modify_volume(request, self.settings.timeout)
            .await
        {
            Ok(_) => {
                lock(&self.modify_uncertain).remove(key);
                self.modify_infeasible.remove(key);
                self.patch_volume(pv, &modify::volume_patch(&class)).await?;
                self.patch_status(&claim, &modify::completed_patch(&claim, &class))
                    .await?;
                self.event(
                    &claim,
                    EventType::Normal,
                    modify::reason::VOLUME_MODIFY_SUCCESSFUL,
                    &format!(
                        "external resizer modified volume {name} with vac {class} successfully"
                    ),
                )
                .await;
                tracing::info!(claim = %claim_name(key), %class, "volume modified");
                Ok(Synced::Done)
            }
            Err(status) => {
                let failure = modify::Failure {
                    code: status.code(),
                    message: status.message().to_string(),
                };
                if failure.is_final() {
                    lock(&self.modify_uncertain).remove(key);
                } else {
                    lock(&self.modify_uncertain).insert(key.clone());
                }
                let new_status = failure.status();
                if new_status == modify::status::INFEASIBLE {
                    self.modify_infeasible.add(key.clone(), (), Instant::now());
                }
                let message = failure.event_message(&class);
                self.patch_status(
                    &claim,
                    &modify::status_patch(&claim, new_status, Some(&failure), &now()),
                )
                .await?;
                self.warn(&claim, modify::reason::VOLUME_MODIFY_FAILED, &message)
                    .await;
                Err(SyncError::Modify(message))
            }
        }
    }

    /// What the modify plan needs to remember of the claim: whether a call may still run,
    /// and what is left of an infeasible modification's slow retry.
    fn modify_memory(&self, key: &Key, pvc: &PersistentVolumeClaim) -> modify::Memory {
        let refused = modify::is_infeasible(pvc);
        if !refused {
            self.modify_infeasible.remove(key);
        }
        modify::Memory {
            uncertain: lock(&self.modify_uncertain).contains(key),
            infeasible_wait: self.modify_infeasible.remaining_then_mark(
                key,
                (),
                refused,
                Instant::now(),
            ),
        }
    }

    /// A merge patch of the claim's status subresource; records the version it replaced.
    async fn patch_status(
        &self,
        pvc: &PersistentVolumeClaim,
        patch: &Value,
    ) -> Result<PersistentVolumeClaim, SyncError> {
        let namespace = pvc.namespace().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        let updated = api
            .patch_status(
                &pvc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map_err(|source| SyncError::Status {
                claim: claim_name(&ObjectRef::from_obj(pvc)),
                source,
            })?;
        self.superseded
            .wrote(ObjectRef::from_obj(pvc), pvc, &updated);
        Ok(updated)
    }

    async fn patch_volume(&self, pv: &PersistentVolume, patch: &Value) -> Result<(), SyncError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        api.patch(
            &pv.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .map(drop)
        .map_err(|source| SyncError::Volume {
            volume: pv.name_any(),
            source,
        })
    }

    async fn event(
        &self,
        pvc: &PersistentVolumeClaim,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        self.events
            .publish(&pvc.object_ref(&()), event_type, reason, message)
            .await;
    }

    async fn warn(&self, pvc: &PersistentVolumeClaim, reason: &str, message: &str) {
        self.event(pvc, EventType::Warning, reason, message).await;
    }
}

/// `namespace/name`, as upstream names claims in messages.
fn claim_name(key: &Key) -> String {
    format!(
        "{}/{}",
        key.namespace.as_deref().unwrap_or_default(),
        key.name
    )
}

/// A 409 from a guarded status write: the claim changed meanwhile; retried without an Event.
fn is_conflict(error: &SyncError) -> bool {
    matches!(error, SyncError::Status { source: kube::Error::Api(status), .. } if status.code == 409)
}

fn now() -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now()),
    )
}

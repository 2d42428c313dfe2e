//! controller-podmon: watches protected pods and nodes (cached), and cleans up the pods of a
//! failed node — validate with the driver (when it serves the podmon extension), fence with
//! ControllerUnpublishVolume, taint the node, delete the VolumeAttachments, force-delete the
//! pods — so their StatefulSet can recreate them elsewhere while the zombies cannot write.
//! Also: crash-looping pods are deleted (at most five times each), nodes hosting protected pods
//! are sampled for connectivity (a node the driver reports disconnected for the loss
//! threshold, its plugin running, has its Ready pods with our volumes cleaned up if the driver
//! also says so for their volumes), driver node pods that are not Ready taint their node
//! (NoSchedule only), a circuit breaker bounds how many nodes are evacuated at once, and a
//! maintenance switch (dynamic config or a node annotation) pauses cleanups.
//!
//! One cleanup per node at a time; pods of a node are cleaned together (fencing is per node
//! and volume, so pods sharing a volume there share its fate). On any doubt — a failed call,
//! a missing node ID, the driver's "connected" — the cleanup is aborted, reported and retried
//! with backoff; nothing is fenced or force-deleted on a guess, nor on a stale cache: the node
//! and the pods are read live before the first destructive step and right before the force
//! delete. Whether the driver serves the extension is asked at start and, until it answers
//! (only UNIMPLEMENTED means "no"), again with backoff; meanwhile cleanups are held, as taints
//! alone are not enough where it does.
//!
//! It runs on the suite's one reconciler loop, [`KeyedWorkers::run`]: a pass on every change of
//! a cache, on a woken retry, and every second (a cleanup's backoff and the breaker are clocked
//! decisions). The pass itself is [`plan::pass`] over every failed node at once, not a sync per
//! key: the circuit breaker and maintenance decide over all nodes together (how many are being
//! evacuated, with which triggers), and a cleanup's retry delay is part of the plan's
//! [`plan::Memory`], where the table tests see it, so cleanups are spawned tasks that record
//! their outcome there (one per node at a time, with backoff from
//! `--retry-interval-start/max`). What every pass keeps in step — the driver-offline taints and
//! the fences kept — is keyed work ([`Upkeep`]): one run at a time, run again when a pass comes
//! while it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use csi_grpc::conn::CsiConnection;
use csi_kinds::cached::{CachedAttachment, CachedClaim, CachedVolume};
use csi_kinds::secrets::SecretRef;
use csi_proto::podmon::v1 as podmon_v1;
use csi_sidecar::backoff::delay_for;
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::informers::{CacheSyncHealth, Informers};
use csi_sidecar::secrets::FetchError;
use csi_sidecar::workers::{KeyedWorkers, Synced};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::LiveConfig;
use crate::metrics::{FailoverResult, PodmonMetrics, Sample};
use crate::plan::{
    self, Action, CleanupInput, Connectivity, Extension, Group, Memory, NO_SCHEDULE, Objects,
    PassInput, Recheck, Refusal, Step, Trigger, key, uid,
};
use crate::taints::update_taints;

/// Timeout of ValidateVolumeHostConnectivity calls (Dell's ShortTimeout).
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause between ControllerUnpublishVolume attempts while the driver answers ABORTED
/// ([`plan::fence_retry`]).
const PENDING_RETRY_DELAY: Duration = Duration::from_millis(50);

/// How often the controller looks again without a change (retries, backoff, breaker).
const TICK: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct Settings {
    pub driver_name: String,
    pub label_key: String,
    pub label_value: String,
    /// The driver node pods' label (controller mode); `None` in standalone mode.
    pub driver_pod_label: Option<(String, String)>,
    /// Sample nodes' connectivity through the extension once the driver serves it (controller
    /// mode).
    pub poll_connectivity: bool,
    /// The driver can fence (PUBLISH_UNPUBLISH_VOLUME).
    pub can_fence: bool,
    pub ignore_volumeless_pods: bool,
    pub out_of_service_taint: bool,
    /// Timeout of ControllerUnpublishVolume.
    pub timeout: Duration,
    pub retry_start: Duration,
    pub retry_max: Duration,
    pub metrics: PodmonMetrics,
    /// Where the caches report whether they got their initial lists (`/healthz`).
    pub cache_sync: Arc<CacheSyncHealth>,
}

impl Settings {
    fn fenced_key(&self) -> String {
        plan::fenced_taint_key(&self.driver_name)
    }

    fn offline_key(&self) -> String {
        plan::offline_taint_key(&self.driver_name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("the caches never synced")]
    NotSynced,
}

/// The key of a pass's upkeep on the shared workers: the driver-offline taints and the fences
/// kept, recomputed from the caches on each run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Upkeep;

struct Caches {
    pods: Store<Pod>,
    nodes: Store<Node>,
    attachments: Store<CachedAttachment>,
    volumes: Store<CachedVolume>,
    claims: Store<CachedClaim>,
    csi_nodes: Store<CSINode>,
    driver_pods: Option<Store<Pod>>,
}

/// Why a cleanup did not finish: the plans' refusal, or a call that failed (an Event and a
/// retry either way).
#[derive(Debug, thiserror::Error)]
enum CleanupError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("cannot read node {node}: {source}")]
    ReadNode { node: String, source: kube::Error },
    #[error("cannot read pod {pod}: {source}")]
    ReadPod { pod: String, source: kube::Error },
    #[error("couldn't delete VolumeAttachment {name}: {source}")]
    DeleteAttachment { name: String, source: kube::Error },
    #[error("couldn't fence volumes: {0}")]
    FenceSecret(#[from] FetchError),
    #[error("couldn't fence volumes: {pv}: {}", .status.message())]
    Fence { pv: String, status: tonic::Status },
    #[error("node {0} is not known")]
    UnknownNode(String),
    #[error("couldn't taint node {node}: {source}")]
    Taint { node: String, source: kube::Error },
    #[error("Delete pod failed: {0}")]
    DeletePod(kube::Error),
}

impl CleanupError {
    fn result(&self) -> FailoverResult {
        match self {
            CleanupError::Refused(refusal) if refusal.aborted() => FailoverResult::Aborted,
            _ => FailoverResult::Failed,
        }
    }
}

impl Objects for Caches {
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<CachedClaim>> {
        self.claims.get(&ObjectRef::new(name).within(namespace))
    }

    fn volume(&self, name: &str) -> Option<Arc<CachedVolume>> {
        self.volumes.get(&ObjectRef::new(name))
    }

    fn csi_node(&self, name: &str) -> Option<Arc<CSINode>> {
        self.csi_nodes.get(&ObjectRef::new(name))
    }
}

struct Controller {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    live: LiveConfig,
    caches: Caches,
    events: EventRecorder,
    state: Mutex<Memory>,
    wake: Arc<Notify>,
}

/// Runs controller-podmon until `shutdown`.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    live: LiveConfig,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    let mut informers = Informers::new(&client, &shutdown).reporting_to(&settings.cache_sync);
    let selector = format!("{}={}", settings.label_key, settings.label_value);
    tracing::info!(label_selector = %selector, driver = %settings.driver_name, "controller-podmon watching protected pods");
    let caches = Caches {
        pods: informers.watch(
            Api::all(client.clone()),
            watcher::Config::default().labels(&selector),
        ),
        nodes: informers.all(),
        attachments: informers.all(),
        volumes: informers.all(),
        claims: informers.all(),
        csi_nodes: informers.all(),
        driver_pods: settings.driver_pod_label.as_ref().map(|(key, value)| {
            informers.watch(
                Api::all(client.clone()),
                watcher::Config::default().labels(&format!("{key}={value}")),
            )
        }),
    };
    let wake = informers.synced().await;
    let Some(wake) = wake else {
        return if shutdown.is_cancelled() {
            Ok(())
        } else {
            Err(ControllerError::NotSynced)
        };
    };
    let extension = probe_extension(&csi, settings.timeout).await;
    let controller = Arc::new(Controller {
        events: EventRecorder::new(client.clone(), "podmon", ""),
        client,
        csi,
        settings,
        live,
        caches,
        state: Mutex::new(Memory {
            extension,
            ..Memory::default()
        }),
        wake,
    });
    // Cleanups, the upkeep, the sampler and the prober live in this set: when the run ends
    // (leadership lost), they stop with it.
    let mut tasks = JoinSet::new();
    if extension == Extension::Unknown {
        tasks.spawn(learn_extension(controller.clone(), shutdown.clone()));
    }
    if controller.settings.poll_connectivity {
        tasks.spawn(connectivity_loop(controller.clone(), shutdown.clone()));
    }
    let settings = &controller.settings;
    let workers = KeyedWorkers::new(1, settings.retry_start, settings.retry_max);
    workers
        .run(tasks, &controller.wake, TICK, &shutdown, |tasks, _| {
            controller.pass(&workers, tasks);
            settings.metrics.pass_done();
        })
        .await;
    Ok(())
}

/// Whether the driver serves `podmon.v1.Podmon`: an empty request is the presence probe.
pub async fn probe_extension(csi: &CsiConnection, timeout: Duration) -> Extension {
    let outcome = csi
        .validate_volume_host_connectivity(
            podmon_v1::ValidateVolumeHostConnectivityRequest::default(),
            timeout,
        )
        .await;
    let extension = Extension::from_probe(outcome.as_ref().map(|_| ()).map_err(|s| s.code()));
    match (&outcome, extension) {
        (Ok(response), _) => {
            tracing::info!(messages = ?response.messages, "the driver serves the podmon extension")
        }
        (Err(_), Extension::NotServed) => tracing::warn!(
            "the driver does not serve the podmon extension: decisions rest on node taints only"
        ),
        (Err(status), _) => tracing::warn!(
            code = ?status.code(),
            error = %status.message(),
            "cannot tell whether the driver serves the podmon extension: no cleanup until it answers"
        ),
    }
    extension
}

/// Asks the driver again, with backoff, until it says whether it serves the extension.
async fn learn_extension(controller: Arc<Controller>, shutdown: CancellationToken) {
    let settings = &controller.settings;
    let mut failures = 0;
    loop {
        let delay = delay_for(settings.retry_start, settings.retry_max, failures);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        let extension = probe_extension(&controller.csi, settings.timeout).await;
        if extension != Extension::Unknown {
            controller.state().extension = extension;
            controller.wake.notify_one();
            return;
        }
        failures = failures.saturating_add(1);
    }
}

/// Dell's message form, kept: alerting rules match it.
fn pod_words(pod: &Pod, node: &str) -> String {
    format!("[{} {node}]", uid(pod))
}

impl Controller {
    fn state(&self) -> MutexGuard<'_, Memory> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.caches.node(name)
    }

    /// One pass: the upkeep (driver-offline taints, fences kept) scheduled, then what
    /// [`plan::pass`] decides, each action a task.
    fn pass(self: &Arc<Self>, workers: &Arc<KeyedWorkers<Upkeep>>, tasks: &mut JoinSet<()>) {
        let controller = self.clone();
        workers.schedule(0, Upkeep, None, tasks, move || async move {
            controller.upkeep().await;
            Ok::<_, Infallible>(Synced::Done)
        });
        let settings = &self.settings;
        let fenced_key = settings.fenced_key();
        let nodes = self.caches.nodes.state();
        let fenced_nodes = plan::fenced_nodes(&nodes, &fenced_key);
        settings.metrics.set_tainted_nodes(fenced_nodes.len());
        let pods = self.caches.pods.state();
        let tunables = self.live.get();
        let input = PassInput {
            pods: &pods,
            fenced_nodes: &fenced_nodes,
            node_count: plan::driver_node_count(
                &self.caches.csi_nodes.state(),
                &settings.driver_name,
            ),
            maintenance: tunables.maintenance,
            max_evacuated_fraction: tunables.max_evacuated_fraction,
            loss_threshold: tunables.loss_threshold,
            driver: &settings.driver_name,
            fenced_key: &fenced_key,
        };
        let actions = plan::pass(&mut self.state(), &input, &self.caches, Instant::now());
        for action in actions {
            let controller = self.clone();
            match action {
                Action::DeleteCrashLooping(pod) => {
                    tasks.spawn(async move { controller.delete_crash_looping(&pod).await })
                }
                Action::Hold { node, group, why } => {
                    tasks.spawn(async move { controller.hold(&node, &group, &why).await })
                }
                Action::CleanUp {
                    node,
                    group,
                    extension,
                } => tasks.spawn(async move { controller.clean_up(node, group, extension).await }),
            };
        }
    }

    /// What every pass keeps in step: the driver-offline taints, and the fences kept.
    async fn upkeep(&self) {
        let fenced_nodes =
            plan::fenced_nodes(&self.caches.nodes.state(), &self.settings.fenced_key());
        self.driver_pod_taints(&self.settings.offline_key()).await;
        self.keep_fenced(&fenced_nodes).await;
    }

    /// Reports that a node's cleanup waits.
    async fn hold(&self, node: &str, group: &Group, why: &plan::Hold) {
        self.settings.metrics.failover(FailoverResult::Held);
        tracing::warn!(%node, %why, "cleanup held");
        for pod in &group.pods {
            let message = format!(
                "podmon held the cleanup of pod {}: {why}",
                pod_words(pod, node)
            );
            self.event(pod, group.trigger.reason(), &message).await;
        }
    }

    async fn event(&self, pod: &Pod, reason: &str, message: &str) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            namespace: pod.namespace(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        self.events
            .publish(&reference, EventType::Warning, reason, message)
            .await;
    }

    /// A crash-looping pod on a healthy node is deleted (gracefully, same UID only).
    async fn delete_crash_looping(&self, pod: &Pod) {
        let node = plan::node_name(pod).unwrap_or_default().to_string();
        self.event(
            pod,
            "CrashLoopBackOff",
            &format!("podmon cleaning pod {} with delete", pod_words(pod, &node)),
        )
        .await;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid(pod)),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => tracing::info!(pod = %key(pod), "deleted a crash-looping pod"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(error) => {
                tracing::warn!(pod = %key(pod), %error, "cannot delete a crash-looping pod")
            }
        }
    }

    /// The driver-offline taint follows the readiness of the driver's node pods
    /// ([`plan::driver_readiness`]).
    async fn driver_pod_taints(&self, offline_key: &str) {
        let Some(driver_pods) = &self.caches.driver_pods else {
            return;
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        for (node_name, ready) in plan::driver_readiness(&driver_pods.state()) {
            let Some(node) = self.node(&node_name) else {
                continue;
            };
            let key = offline_key.to_string();
            let written = if ready {
                update_taints(&nodes, (*node).clone(), |t| plan::without_taint(t, &key)).await
            } else {
                update_taints(&nodes, (*node).clone(), |t| {
                    plan::with_taint(t, &key, "", NO_SCHEDULE, now())
                })
                .await
            };
            match written {
                Ok(true) => {
                    tracing::warn!(node = %node_name, driver_ready = ready, taint = %key, "driver-offline taint updated")
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(node = %node_name, %error, "cannot update the driver-offline taint")
                }
            }
        }
    }

    /// Whether the driver's node plugin on `node` can be believed running (see
    /// [`plan::plugin_up`]).
    fn plugin_up(&self, node: &str) -> bool {
        let driver_pods = self
            .caches
            .driver_pods
            .as_ref()
            .map(Store::state)
            .unwrap_or_default();
        plan::plugin_up(
            self.node(node).as_deref(),
            &self.settings.offline_key(),
            driver_pods
                .iter()
                .filter(|p| plan::node_name(p) == Some(node))
                .map(|p| p.as_ref()),
        )
    }

    /// Runs a node's cleanup and records its outcome; on failure, an Event per pod.
    async fn clean_up(&self, node: String, group: Group, extension: Extension) {
        let started = Instant::now();
        let outcome = self.clean_up_steps(&node, &group, extension).await;
        let metrics = &self.settings.metrics;
        match outcome {
            Ok(deleted) => {
                let failover = self.state().cleanup_succeeded(&node, deleted);
                if failover {
                    metrics.failover(FailoverResult::Success);
                    metrics.cleanup_took(started.elapsed().as_secs_f64());
                }
            }
            Err(error) => {
                for pod in &group.pods {
                    self.event(
                        pod,
                        group.trigger.reason(),
                        &format!(
                            "podmon aborted pod cleanup {} {error}",
                            pod_words(pod, &node)
                        ),
                    )
                    .await;
                }
                let delay = self.state().cleanup_failed(
                    &node,
                    Instant::now(),
                    self.settings.retry_start,
                    self.settings.retry_max,
                );
                metrics.failover(error.result());
                tracing::warn!(%node, %error, retry_in = ?delay, "cleanup did not finish");
            }
        }
        self.wake.notify_one();
    }

    /// Executes the steps of [`plan::cleanup`] in order; the UIDs of the pods force-deleted.
    async fn clean_up_steps(
        &self,
        node: &str,
        group: &Group,
        extension: Extension,
    ) -> Result<Vec<String>, CleanupError> {
        let pods = self.caches.pods.state();
        let attachments = self.caches.attachments.state();
        let input = CleanupInput {
            node,
            group,
            extension,
            pods: &pods,
            attachments: &attachments,
            driver: &self.settings.driver_name,
            can_fence: self.settings.can_fence,
            ignore_volumeless_pods: self.settings.ignore_volumeless_pods,
        };
        let cleanup = plan::cleanup(&input, &self.caches)?;
        let mut chosen = cleanup.pods;
        for step in cleanup.steps {
            match step {
                Step::Validate { request, rwx } => {
                    self.validate(node, request, rwx, group).await?;
                }
                Step::ConfirmLive(recheck) => {
                    let still = self.confirm_live(node, recheck, &chosen).await?;
                    plan::confirmed(&chosen, &still)?;
                }
                Step::DeleteAttachments(names) => self.delete_attachments(node, &names).await?,
                Step::Fence {
                    pv,
                    request,
                    secret,
                } => self.fence(node, &pv, request, secret).await?,
                Step::CannotFence => {
                    tracing::warn!(%node, "the driver cannot unpublish volumes: the node is tainted without fencing")
                }
                Step::Taint => {
                    // Recorded before the write: a write whose answer is lost must leave a
                    // taint this controller still believes on its retry.
                    self.state().tainted(node, &cleanup.volumes, Instant::now());
                    self.taint(node).await?
                }
                Step::ForceDelete(recheck) => {
                    chosen = self.confirm_live(node, recheck, &chosen).await?;
                    self.force_delete(node, group.trigger, &chosen).await?;
                }
            }
        }
        Ok(chosen.values().map(|p| uid(p)).collect())
    }

    /// Our fenced taint (and the out-of-service one if so configured) on the node
    /// ([`plan::cleanup_taints`]).
    async fn taint(&self, node_name: &str) -> Result<(), CleanupError> {
        let node = self
            .node(node_name)
            .ok_or_else(|| CleanupError::UnknownNode(node_name.to_string()))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let fenced_key = self.settings.fenced_key();
        let out_of_service = self.settings.out_of_service_taint;
        update_taints(&nodes, (*node).clone(), |current| {
            plan::cleanup_taints(current, &fenced_key, out_of_service, &now())
        })
        .await
        .map_err(|source| CleanupError::Taint {
            node: node_name.to_string(),
            source,
        })?;
        Ok(())
    }

    /// Force-deletes the pods (grace 0, same UID only), an Event each.
    async fn force_delete(
        &self,
        node_name: &str,
        trigger: Trigger,
        pods: &BTreeMap<String, Arc<Pod>>,
    ) -> Result<(), CleanupError> {
        for pod in pods.values() {
            self.event(
                pod,
                trigger.reason(),
                &format!(
                    "podmon cleaning pod {} with force delete",
                    pod_words(pod, node_name)
                ),
            )
            .await;
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid(pod)),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            match api.delete(&pod.name_any(), &params).await {
                Ok(_) => {
                    tracing::warn!(pod = %key(pod), node = %node_name, "force-deleted pod of a failed node")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(error) => return Err(CleanupError::DeletePod(error)),
            }
        }
        Ok(())
    }

    /// Reads the node and the pods live (not from the caches): with `recheck.node` the node must
    /// still be failed ([`plan::node_still_failed`]); pods that are gone, replaced or already
    /// being deleted are left out ([`plan::pod_still_to_delete`]). Returns the pods still to
    /// delete.
    async fn confirm_live(
        &self,
        node_name: &str,
        recheck: Recheck,
        chosen: &BTreeMap<String, Arc<Pod>>,
    ) -> Result<BTreeMap<String, Arc<Pod>>, CleanupError> {
        if let Some(signals) = recheck.node {
            let node = Api::<Node>::all(self.client.clone())
                .get(node_name)
                .await
                .map_err(|source| CleanupError::ReadNode {
                    node: node_name.to_string(),
                    source,
                })?;
            plan::node_still_failed(signals, &node, &self.settings.fenced_key())
                .map_err(Refusal::Refused)?;
        }
        let mut still = BTreeMap::new();
        for (name, pod) in chosen {
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            let live =
                api.get_opt(&pod.name_any())
                    .await
                    .map_err(|source| CleanupError::ReadPod {
                        pod: name.clone(),
                        source,
                    })?;
            match plan::pod_still_to_delete(&uid(pod), live.as_ref()) {
                Ok(()) => {
                    still.insert(name.clone(), pod.clone());
                }
                Err(why) => {
                    tracing::warn!(pod = %name, node = %node_name, %why, "not force-deleting the pod")
                }
            }
        }
        Ok(still)
    }

    /// Asks the driver (podmon extension) whether the node may be cleaned up
    /// ([`plan::validation_allows`]).
    async fn validate(
        &self,
        node_name: &str,
        request: podmon_v1::ValidateVolumeHostConnectivityRequest,
        rwx: bool,
        group: &Group,
    ) -> Result<(), CleanupError> {
        let answer = match self
            .csi
            .validate_volume_host_connectivity(request, VALIDATE_TIMEOUT)
            .await
        {
            Ok(response) => {
                tracing::info!(node = %node_name, connected = response.connected, ios_in_progress = response.ios_in_progress, messages = ?response.messages, "driver connectivity answer");
                Connectivity::Answer {
                    connected: response.connected,
                    ios_in_progress: response.ios_in_progress,
                }
            }
            Err(status) => {
                tracing::warn!(node = %node_name, error = %status.message(), code = ?status.code(), "ValidateVolumeHostConnectivity failed");
                Connectivity::Error
            }
        };
        plan::validation_allows(
            group.trigger,
            answer,
            rwx,
            group.signals,
            self.live.get().skip_validation,
        )
        .map_err(|why| Refusal::Refused(why).into())
    }

    /// Deletes the named VolumeAttachments (gone ones are fine).
    async fn delete_attachments(
        &self,
        node_name: &str,
        names: &BTreeSet<String>,
    ) -> Result<(), CleanupError> {
        let vas: Api<CachedAttachment> = Api::all(self.client.clone());
        for name in names {
            match vas.delete(name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(va = %name, node = %node_name, "deleted VolumeAttachment"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(CleanupError::DeleteAttachment {
                        name: name.clone(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// Keeps fenced what a cleanup fenced while the node carries our taint
    /// ([`plan::refenced_attachments`]).
    async fn keep_fenced(&self, fenced_nodes: &BTreeSet<String>) {
        let fences = self.state().kept_fences(fenced_nodes, Instant::now());
        if fences.is_empty() {
            return;
        }
        let stale = plan::refenced_attachments(
            &fences,
            &self.caches.pods.state(),
            &self.caches.attachments.state(),
            &self.caches,
            &self.settings.driver_name,
        );
        for (node, names) in stale {
            tracing::warn!(%node, attachments = ?names, "a fenced volume was attached to the node again; deleting the attachment");
            if let Err(error) = self.delete_attachments(&node, &names).await {
                tracing::warn!(%node, %error, "cannot keep the node fenced; retrying");
            }
        }
    }

    /// ControllerUnpublishVolume of a volume from the node, with the secrets of `secret`:
    /// after it, the node's writes cannot reach the volume.
    async fn fence(
        &self,
        node_name: &str,
        pv_name: &str,
        mut request: csi_proto::csi::v1::ControllerUnpublishVolumeRequest,
        secret: Option<SecretRef>,
    ) -> Result<(), CleanupError> {
        if let Some(reference) = secret {
            request.secrets =
                csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &reference)
                    .await?
                    .into_inner();
        }
        let mut attempt = 1;
        loop {
            match self
                .csi
                .controller_unpublish_volume(request.clone(), self.settings.timeout)
                .await
            {
                Ok(_) => break,
                Err(status) if plan::fence_retry(status.code(), attempt) => {
                    attempt += 1;
                    tokio::time::sleep(PENDING_RETRY_DELAY).await;
                }
                Err(status) => {
                    return Err(CleanupError::Fence {
                        pv: pv_name.to_string(),
                        status,
                    });
                }
            }
        }
        tracing::warn!(pv = %pv_name, node = %node_name, "fenced: volume unpublished from the node");
        Ok(())
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Samples, every poll rate, whether the driver still reaches each node hosting protected
/// pods; a node "not connected" for the loss threshold in a row gets its pods cleaned up.
/// An error is no evidence: it counts as connected (as Dell).
async fn connectivity_loop(controller: Arc<Controller>, shutdown: CancellationToken) {
    loop {
        let poll_rate = controller.live.get().poll_rate;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(poll_rate) => {}
        }
        if controller.state().extension != Extension::Served {
            continue;
        }
        let nodes: BTreeSet<String> = controller
            .caches
            .pods
            .state()
            .iter()
            .filter(|p| plan::is_ready(p))
            .filter_map(|p| plan::node_name(p).map(str::to_string))
            .collect();
        let mut crossed = false;
        for node in nodes {
            let caches = &controller.caches;
            let Some(node_id) = plan::node_id(
                &controller.settings.driver_name,
                &[],
                caches.csi_node(&node).as_deref(),
                caches.node(&node).as_deref(),
            ) else {
                continue;
            };
            let request = podmon_v1::ValidateVolumeHostConnectivityRequest {
                node_id,
                ..Default::default()
            };
            let metrics = &controller.settings.metrics;
            let connected = match controller
                .csi
                .validate_volume_host_connectivity(request, VALIDATE_TIMEOUT)
                .await
            {
                Ok(response) => {
                    metrics.connectivity_sample(if response.connected {
                        Sample::Connected
                    } else {
                        Sample::Disconnected
                    });
                    response.connected
                }
                Err(status) => {
                    metrics.connectivity_sample(Sample::Failed);
                    tracing::debug!(%node, error = %status.message(), "connectivity sample failed; assuming connected");
                    true
                }
            };
            let plugin_up = controller.plugin_up(&node);
            let threshold = controller.live.get().loss_threshold;
            let count = controller
                .state()
                .record_sample(&node, connected, plugin_up);
            if count == 0 {
                if !connected {
                    tracing::info!(%node, "the driver reports the node disconnected while its driver plugin is down: not counted");
                }
            } else {
                tracing::warn!(%node, samples = count, threshold, "the driver reports the node disconnected");
                crossed |= count == threshold;
            }
        }
        if crossed {
            controller.wake.notify_one();
        }
    }
}

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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use csi_proto::podmon::v1 as podmon;
use csi_sidecar::conn::CsiConnection;
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::informers::{CacheSyncHealth, Informers};
use csi_sidecar::kubelet_paths;
use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
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
    self, Connectivity, CrashLoopDeletes, Extension, MAINTENANCE_ANNOTATION, NO_EXECUTE,
    NO_SCHEDULE, NODE_IDS_ANNOTATION, NodeSignals, OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE,
    PodAction, Trigger,
};
use crate::taints::update_taints;

/// Timeout of ValidateVolumeHostConnectivity calls (Dell's ShortTimeout).
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long crash-loop deletes of a pod that is gone are remembered (its StatefulSet may
/// recreate it).
const CRASH_LOOP_MEMORY: Duration = Duration::from_secs(600);

/// How long a node just tainted by a cleanup counts as tainted before the cache shows it.
const TAINT_CACHE_GRACE: Duration = Duration::from_secs(30);

/// ControllerUnpublishVolume attempts while the driver answers ABORTED (an operation on the
/// volume is pending), and the pause between them.
const PENDING_RETRIES: u32 = 20;
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

struct Caches {
    pods: Store<Pod>,
    nodes: Store<Node>,
    attachments: Store<VolumeAttachment>,
    volumes: Store<PersistentVolume>,
    claims: Store<PersistentVolumeClaim>,
    csi_nodes: Store<CSINode>,
    driver_pods: Option<Store<Pod>>,
}

/// What a finished cleanup did.
#[derive(Debug, Default)]
struct Cleaned {
    /// UIDs of the pods force-deleted.
    pods: Vec<String>,
    /// The PVs fenced from the node.
    volumes: BTreeSet<String>,
}

/// Why a cleanup did not finish.
#[derive(Debug)]
enum Stop {
    /// The evidence does not allow it (connected, I/O, missing node ID): an Event, a retry.
    Aborted(String),
    /// A call failed: an Event, a retry.
    Failed(String),
}

#[derive(Default)]
struct State {
    /// Nodes with a cleanup running.
    busy: HashSet<String>,
    /// Per node: when to try again and the next delay.
    backoff: HashMap<String, (Instant, Duration)>,
    /// Crash-loop deletes per pod (namespace/name, so a recreated pod counts on; reset when
    /// the pod is Ready)
    /// and when the last was.
    crash_deletes: HashMap<String, (CrashLoopDeletes, Instant)>,
    /// Consecutive "not connected" samples per node.
    loss: HashMap<String, u32>,
    /// Nodes whose hold (breaker or maintenance) was already reported.
    held: HashSet<String>,
    /// UIDs of pods force-deleted, until the cache no longer shows them.
    cleaned: HashSet<String>,
    /// PVs fenced per node (and when), kept fenced while the node carries our taint.
    fenced: HashMap<String, (BTreeSet<String>, Instant)>,
    /// Whether the driver serves the podmon extension; asked again until known.
    extension: Extension,
}

struct Controller {
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    live: LiveConfig,
    caches: Caches,
    events: EventRecorder,
    state: Mutex<State>,
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
        state: Mutex::new(State {
            extension,
            ..State::default()
        }),
        wake,
    });
    // Cleanups, the sampler and the prober live in this set: when the run ends (leadership
    // lost), they stop with it.
    let mut tasks = JoinSet::new();
    if extension == Extension::Unknown {
        tasks.spawn(learn_extension(controller.clone(), shutdown.clone()));
    }
    if controller.settings.poll_connectivity {
        tasks.spawn(connectivity_loop(controller.clone(), shutdown.clone()));
    }
    loop {
        while tasks.try_join_next().is_some() {}
        controller.pass(&mut tasks).await;
        controller.settings.metrics.pass_done();
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = controller.wake.notified() => {}
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// Whether the driver serves `podmon.v1.Podmon`: an empty request is the presence probe.
pub async fn probe_extension(csi: &CsiConnection, timeout: Duration) -> Extension {
    let outcome = csi
        .validate_volume_host_connectivity(
            podmon::ValidateVolumeHostConnectivityRequest::default(),
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
    let mut delay = settings.retry_start;
    loop {
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
        delay = (delay * 2).min(settings.retry_max);
    }
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Dell's message form, kept: alerting rules match it.
fn pod_words(pod: &Pod, node: &str) -> String {
    format!("[{} {node}]", uid(pod))
}

impl Controller {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.caches.nodes.get(&ObjectRef::new(name))
    }

    async fn pass(self: &Arc<Self>, tasks: &mut JoinSet<()>) {
        let fenced_key = self.settings.fenced_key();
        let offline_key = self.settings.offline_key();
        let nodes = self.caches.nodes.state();
        let fenced_nodes: BTreeSet<String> = nodes
            .iter()
            .filter(|n| plan::has_taint(n, &fenced_key, NO_SCHEDULE))
            .map(|n| n.name_any())
            .collect();
        self.settings.metrics.set_tainted_nodes(fenced_nodes.len());
        self.driver_pod_taints(&offline_key).await;
        self.keep_fenced(&fenced_nodes).await;

        let pods = self.caches.pods.state();
        let mut groups: BTreeMap<String, (Trigger, NodeSignals, Vec<Arc<Pod>>)> = BTreeMap::new();
        let tunables = self.live.get();
        let disconnected: BTreeSet<String> = {
            let mut state = self.state();
            let uids: HashSet<String> = pods.iter().map(|p| uid(p)).collect();
            state.cleaned.retain(|uid| uids.contains(uid));
            let present: HashSet<String> = pods.iter().map(|p| key(p)).collect();
            state.crash_deletes.retain(|key, (_, last)| {
                present.contains(key) || last.elapsed() < CRASH_LOOP_MEMORY
            });
            state
                .loss
                .iter()
                .filter(|(_, count)| **count >= tunables.loss_threshold)
                .map(|(node, _)| node.clone())
                .collect()
        };
        let cleaned = self.state().cleaned.clone();
        for pod in pods.iter().filter(|p| !cleaned.contains(&uid(p))) {
            let Some(node_name) = plan::node_name(pod) else {
                continue;
            };
            let node = self.node(node_name);
            match plan::pod_action(pod, node.as_deref(), &fenced_key) {
                PodAction::Nothing => {
                    if plan::is_ready(pod) {
                        self.state().crash_deletes.remove(&key(pod));
                    }
                    // Connectivity concerns pods with our volumes only: the driver can say
                    // nothing about the others.
                    if disconnected.contains(node_name)
                        && pod.metadata.deletion_timestamp.is_none()
                        && self.volumes_of(pod).is_ok_and(|v| !v.is_empty())
                    {
                        let signals = node
                            .map(|n| NodeSignals::of(&n, &fenced_key))
                            .unwrap_or_default();
                        let group = groups.entry(node_name.to_string()).or_insert((
                            Trigger::ArrayConnectivityLoss,
                            signals,
                            Vec::new(),
                        ));
                        // A node failed by Kubernetes' account is cleaned on that account; its
                        // Ready pods wait to be judged by the stricter rule of their own.
                        if group.0 == Trigger::ArrayConnectivityLoss {
                            group.2.push(pod.clone());
                        }
                    }
                }
                PodAction::CleanUp(signals) => {
                    let group = groups.entry(node_name.to_string()).or_insert((
                        Trigger::NodeFailure,
                        signals,
                        Vec::new(),
                    ));
                    if group.0 != Trigger::NodeFailure {
                        group.2.clear();
                    }
                    group.0 = Trigger::NodeFailure;
                    group.1 = signals;
                    group.2.push(pod.clone());
                }
                PodAction::DeleteCrashLooping => self.delete_crash_looping(pod.clone()).await,
            }
        }

        let now = Instant::now();
        let extension = self.state().extension;
        for (node_name, (trigger, signals, pods)) in groups {
            {
                let state = self.state();
                if state.busy.contains(&node_name)
                    || state
                        .backoff
                        .get(&node_name)
                        .is_some_and(|(at, _)| *at > now)
                {
                    continue;
                }
            }
            if extension == Extension::Unknown {
                let why = "the driver has not said yet whether it serves the podmon extension";
                self.hold(&node_name, &pods, trigger, why).await;
                continue;
            }
            let node = self.node(&node_name);
            let paused_node = node
                .as_ref()
                .and_then(|n| n.annotations().get(MAINTENANCE_ANNOTATION).cloned())
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            if tunables.maintenance || paused_node {
                let why = if tunables.maintenance {
                    "PODMON_MAINTENANCE is on"
                } else {
                    "the node is annotated for maintenance"
                };
                self.hold(&node_name, &pods, trigger, &format!("maintenance: {why}"))
                    .await;
                continue;
            }
            let evacuated: BTreeSet<String> = {
                let state = self.state();
                fenced_nodes
                    .iter()
                    .cloned()
                    .chain(state.busy.iter().cloned())
                    .collect()
            };
            if !plan::breaker_allows(
                &node_name,
                evacuated.iter().map(String::as_str),
                nodes.len(),
                tunables.max_evacuated_fraction,
            ) {
                let limit = plan::evacuation_limit(nodes.len(), tunables.max_evacuated_fraction);
                self.hold(
                    &node_name,
                    &pods,
                    trigger,
                    &format!(
                        "circuit breaker: {} of {} nodes already evacuated (limit {limit})",
                        evacuated.len(),
                        nodes.len()
                    ),
                )
                .await;
                continue;
            }
            {
                let mut state = self.state();
                state.held.remove(&node_name);
                state.busy.insert(node_name.clone());
            }
            let controller = self.clone();
            tasks.spawn(async move {
                let started = Instant::now();
                let outcome = controller
                    .clean_up(&node_name, trigger, signals, extension, pods)
                    .await;
                let mut state = controller.state();
                state.busy.remove(&node_name);
                match outcome {
                    Ok(cleaned) => {
                        state.backoff.remove(&node_name);
                        state.loss.remove(&node_name);
                        // Nothing left to clean (the pods went meanwhile) is no failover.
                        if !cleaned.pods.is_empty() {
                            let metrics = &controller.settings.metrics;
                            metrics.failover(FailoverResult::Success);
                            metrics.cleanup_took(started.elapsed().as_secs_f64());
                        }
                        state.cleaned.extend(cleaned.pods);
                        let entry = state
                            .fenced
                            .entry(node_name.clone())
                            .or_insert_with(|| (BTreeSet::new(), Instant::now()));
                        entry.0.extend(cleaned.volumes);
                        entry.1 = Instant::now();
                    }
                    Err(stop) => {
                        let delay = state
                            .backoff
                            .get(&node_name)
                            .map_or(controller.settings.retry_start, |(_, d)| {
                                (*d * 2).min(controller.settings.retry_max)
                            });
                        state
                            .backoff
                            .insert(node_name.clone(), (Instant::now() + delay, delay));
                        let result = match stop {
                            Stop::Aborted(_) => FailoverResult::Aborted,
                            Stop::Failed(_) => FailoverResult::Failed,
                        };
                        controller.settings.metrics.failover(result);
                        tracing::warn!(node = %node_name, ?stop, retry_in = ?delay, "cleanup did not finish");
                    }
                }
                drop(state);
                controller.wake.notify_one();
            });
        }
    }

    /// Reports (once per hold) that a node's cleanup waits.
    async fn hold(&self, node: &str, pods: &[Arc<Pod>], trigger: Trigger, why: &str) {
        if !self.state().held.insert(node.to_string()) {
            return;
        }
        self.settings.metrics.failover(FailoverResult::Held);
        tracing::warn!(%node, %why, "cleanup held");
        for pod in pods {
            let message = format!(
                "podmon held the cleanup of pod {}: {why}",
                pod_words(pod, node)
            );
            self.event(pod, trigger.reason(), &message).await;
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

    /// A crash-looping pod on a healthy node is deleted (gracefully, same UID only), at most
    /// [`plan::MAX_CRASH_LOOP_DELETES`] times per pod name until it is Ready again.
    async fn delete_crash_looping(&self, pod: Arc<Pod>) {
        let uid = uid(&pod);
        {
            let mut state = self.state();
            let (deletes, last) = state
                .crash_deletes
                .entry(key(&pod))
                .or_insert_with(|| (CrashLoopDeletes::default(), Instant::now()));
            if !deletes.admit(&uid) {
                return;
            }
            *last = Instant::now();
        }
        let node = plan::node_name(&pod).unwrap_or_default().to_string();
        self.event(
            &pod,
            "CrashLoopBackOff",
            &format!("podmon cleaning pod {} with delete", pod_words(&pod, &node)),
        )
        .await;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => tracing::info!(pod = %key(&pod), "deleted a crash-looping pod"),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(error) => {
                tracing::warn!(pod = %key(&pod), %error, "cannot delete a crash-looping pod")
            }
        }
    }

    /// The driver-offline taint follows the readiness of the driver's node pods: a node whose
    /// driver pods are all not Ready gets it; one with a Ready driver pod loses it.
    async fn driver_pod_taints(&self, offline_key: &str) {
        let Some(driver_pods) = &self.caches.driver_pods else {
            return;
        };
        let mut ready_by_node: BTreeMap<String, bool> = BTreeMap::new();
        for pod in driver_pods.state() {
            if let Some(node) = plan::node_name(&pod) {
                *ready_by_node.entry(node.to_string()).or_default() |= plan::is_ready(&pod);
            }
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        for (node_name, ready) in ready_by_node {
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

    /// The CSI node ID of `node` for our driver: the attacher's annotation on a VolumeAttachment
    /// there, else the CSINode, else kubelet's node annotation.
    fn node_id(&self, node: &str, attachments: &[Arc<VolumeAttachment>]) -> Option<String> {
        let driver = &self.settings.driver_name;
        let from_attachment = attachments.iter().find_map(|va| {
            va.annotations()
                .get(csi_sidecar::volume_attachment::NODE_ID_ANNOTATION)
                .filter(|id| !id.is_empty())
                .cloned()
        });
        let from_csi_node = || {
            self.caches
                .csi_nodes
                .get(&ObjectRef::new(node))
                .and_then(|c| {
                    c.spec
                        .drivers
                        .iter()
                        .find(|d| &d.name == driver)
                        .map(|d| d.node_id.clone())
                })
        };
        let from_annotation = || {
            let node = self.node(node)?;
            let ids: BTreeMap<String, String> =
                serde_json::from_str(node.annotations().get(NODE_IDS_ANNOTATION)?).ok()?;
            ids.get(driver).cloned()
        };
        from_attachment
            .or_else(from_csi_node)
            .or_else(from_annotation)
            .filter(|id| !id.is_empty())
    }

    /// Our driver's PVs a pod uses through bound claims (also generic ephemeral volumes').
    fn volumes_of(&self, pod: &Pod) -> Result<Vec<Arc<PersistentVolume>>, Stop> {
        let namespace = pod.namespace().unwrap_or_default();
        let mut volumes = Vec::new();
        for claim in plan::claim_names(pod) {
            let Some(claim) = self
                .caches
                .claims
                .get(&ObjectRef::new(&claim).within(&namespace))
            else {
                continue;
            };
            let Some(pv_name) = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .filter(|n| !n.is_empty())
            else {
                continue;
            };
            let pv = self
                .caches
                .volumes
                .get(&ObjectRef::new(&pv_name))
                .ok_or_else(|| {
                    Stop::Failed(format!(
                        "PersistentVolume {pv_name} of pod {} is not known yet",
                        key(pod)
                    ))
                })?;
            let ours = pv
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| c.driver == self.settings.driver_name);
            if ours {
                volumes.push(pv);
            } else {
                tracing::warn!(pod = %key(pod), pv = %pv_name, "the pod uses a volume of another driver; podmon cannot fence it");
            }
        }
        Ok(volumes)
    }

    async fn clean_up(
        &self,
        node_name: &str,
        trigger: Trigger,
        signals: NodeSignals,
        extension: Extension,
        pods: Vec<Arc<Pod>>,
    ) -> Result<Cleaned, Stop> {
        let reason = trigger.reason();
        let outcome = self
            .clean_up_steps(node_name, trigger, signals, extension, pods.clone())
            .await;
        if let Err(Stop::Aborted(why) | Stop::Failed(why)) = &outcome {
            for pod in &pods {
                self.event(
                    pod,
                    reason,
                    &format!(
                        "podmon aborted pod cleanup {} {why}",
                        pod_words(pod, node_name)
                    ),
                )
                .await;
            }
        }
        outcome
    }

    async fn clean_up_steps(
        &self,
        node_name: &str,
        trigger: Trigger,
        signals: NodeSignals,
        extension: Extension,
        pods: Vec<Arc<Pod>>,
    ) -> Result<Cleaned, Stop> {
        // The pods as the cache has them now (a replaced pod has a new UID and is skipped),
        // plus the protected pods on the node that share a volume with them.
        let cached: BTreeMap<String, Arc<Pod>> = self
            .caches
            .pods
            .state()
            .into_iter()
            .filter(|p| plan::node_name(p) == Some(node_name))
            .map(|p| (key(&p), p))
            .collect();
        let mut chosen: BTreeMap<String, Arc<Pod>> = pods
            .iter()
            .filter_map(|p| {
                cached
                    .get(&key(p))
                    .filter(|c| uid(c) == uid(p))
                    .map(|c| (key(c), c.clone()))
            })
            .collect();
        let mut volumes: BTreeMap<String, Arc<PersistentVolume>> = BTreeMap::new();
        for pod in chosen.values() {
            for pv in self.volumes_of(pod)? {
                volumes.insert(pv.name_any(), pv);
            }
        }
        for (name, pod) in &cached {
            if chosen.contains_key(name) {
                continue;
            }
            if self
                .volumes_of(pod)?
                .iter()
                .any(|pv| volumes.contains_key(&pv.name_any()))
            {
                tracing::warn!(pod = %name, node = %node_name, "cleaning a pod that shares a fenced volume on the node");
                chosen.insert(name.clone(), pod.clone());
            }
        }
        if self.settings.ignore_volumeless_pods {
            let mut kept = BTreeMap::new();
            for (name, pod) in chosen {
                if !self.volumes_of(&pod)?.is_empty() {
                    kept.insert(name, pod);
                }
            }
            chosen = kept;
        }
        if chosen.is_empty() {
            return Ok(Cleaned::default());
        }
        let attachments: Vec<Arc<VolumeAttachment>> = self
            .caches
            .attachments
            .state()
            .into_iter()
            .filter(|va| {
                va.spec.node_name == node_name && va.spec.attacher == self.settings.driver_name
            })
            .filter(|va| {
                va.spec
                    .source
                    .persistent_volume_name
                    .as_ref()
                    .is_some_and(|pv| volumes.contains_key(pv))
            })
            .collect();

        // The VolumeAttachments to delete: the cached ones and the names the attach/detach
        // controller gives (a VA it re-creates may not be cached yet).
        let mut attachment_names: BTreeSet<String> =
            attachments.iter().map(|va| va.name_any()).collect();
        attachment_names.extend(volumes.values().filter_map(|pv| {
            let handle = &pv.spec.as_ref()?.csi.as_ref()?.volume_handle;
            Some(kubelet_paths::attachment_name(
                handle,
                &self.settings.driver_name,
                node_name,
            ))
        }));

        let mut node_id = None;
        if !volumes.is_empty() {
            let id = self
                .node_id(node_name, &attachments)
                .ok_or_else(|| Stop::Aborted("due to missing CSI annotations".to_string()))?;
            if extension == Extension::Served {
                self.validate(node_name, &id, &volumes, trigger, signals)
                    .await?;
            }
            node_id = Some(id);
        }
        // The caches may lag: before the first step that cannot be undone, the live objects
        // must still show what the decision rested on.
        if self
            .confirm_live(node_name, trigger, signals, &chosen)
            .await?
            .len()
            != chosen.len()
        {
            return Err(Stop::Aborted(
                "the pods changed since the decision".to_string(),
            ));
        }
        // A deleting VolumeAttachment is one the attacher will not publish again (its
        // reconcile re-publishes attached ones the driver lost), so they go before the fence.
        self.delete_attachments(node_name, &attachment_names)
            .await?;
        match node_id {
            Some(id) if self.settings.can_fence => self.fence(node_name, &id, &volumes).await?,
            Some(_) => {
                tracing::warn!(node = %node_name, "the driver cannot unpublish volumes: the node is tainted without fencing")
            }
            None => {}
        }

        let node = self
            .node(node_name)
            .ok_or_else(|| Stop::Failed(format!("node {node_name} is not known")))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let fenced_key = self.settings.fenced_key();
        let out_of_service = self.settings.out_of_service_taint;
        update_taints(&nodes, (*node).clone(), |current| {
            let mut taints = plan::with_taint(current, &fenced_key, "", NO_SCHEDULE, now());
            if out_of_service {
                let base = taints.clone().unwrap_or_else(|| current.to_vec());
                taints = plan::with_taint(
                    &base,
                    OUT_OF_SERVICE_TAINT,
                    OUT_OF_SERVICE_VALUE,
                    NO_EXECUTE,
                    now(),
                )
                .or(taints);
            }
            taints
        })
        .await
        .map_err(|e| Stop::Failed(format!("couldn't taint node {node_name}: {e}")))?;

        // Fencing and tainting took time: again, right before the force delete.
        let chosen = self
            .confirm_live(node_name, trigger, signals, &chosen)
            .await?;
        for pod in chosen.values() {
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
                Err(error) => return Err(Stop::Failed(format!("Delete pod failed: {error}"))),
            }
        }
        Ok(Cleaned {
            pods: chosen.values().map(|p| uid(p)).collect(),
            volumes: volumes.keys().cloned().collect(),
        })
    }

    /// Reads the node and the pods live (not from the caches): a NodeFailure's node must still
    /// be failed ([`plan::node_still_failed`]); pods that are gone, replaced or already being
    /// deleted are left out ([`plan::pod_still_to_delete`]). Returns the pods still to delete.
    async fn confirm_live(
        &self,
        node_name: &str,
        trigger: Trigger,
        signals: NodeSignals,
        chosen: &BTreeMap<String, Arc<Pod>>,
    ) -> Result<BTreeMap<String, Arc<Pod>>, Stop> {
        if trigger == Trigger::NodeFailure {
            let node = Api::<Node>::all(self.client.clone())
                .get(node_name)
                .await
                .map_err(|e| Stop::Failed(format!("cannot read node {node_name}: {e}")))?;
            plan::node_still_failed(signals, &node, &self.settings.fenced_key())
                .map_err(|why| Stop::Aborted(why.to_string()))?;
        }
        let mut still = BTreeMap::new();
        for (name, pod) in chosen {
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            let live = api
                .get_opt(&pod.name_any())
                .await
                .map_err(|e| Stop::Failed(format!("cannot read pod {name}: {e}")))?;
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
        node_id: &str,
        volumes: &BTreeMap<String, Arc<PersistentVolume>>,
        trigger: Trigger,
        signals: NodeSignals,
    ) -> Result<(), Stop> {
        let request = podmon::ValidateVolumeHostConnectivityRequest {
            volume_ids: volumes
                .values()
                .filter_map(|pv| {
                    pv.spec
                        .as_ref()?
                        .csi
                        .as_ref()
                        .map(|c| c.volume_handle.clone())
                })
                .collect(),
            node_id: node_id.to_string(),
            ..Default::default()
        };
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
        let rwx = volumes.values().any(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.access_modes.as_ref())
                .is_some_and(|m| m.iter().any(|m| m == "ReadWriteMany"))
        });
        plan::validation_allows(
            trigger,
            answer,
            rwx,
            signals,
            self.live.get().skip_validation,
        )
        .map_err(|why| Stop::Aborted(why.to_string()))
    }

    /// Deletes the named VolumeAttachments (gone ones are fine).
    async fn delete_attachments(
        &self,
        node_name: &str,
        names: &BTreeSet<String>,
    ) -> Result<(), Stop> {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        for name in names {
            match vas.delete(name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(va = %name, node = %node_name, "deleted VolumeAttachment"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    return Err(Stop::Failed(format!(
                        "couldn't delete VolumeAttachment {name}: {error}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Keeps fenced what a cleanup fenced while the node carries our taint: a VolumeAttachment
    /// of such a volume to that node that appears again (the attach/detach controller may
    /// re-create it from a cache that still shows the deleted pod) is deleted, so the attacher
    /// unpublishes it again — the zombie never gets its access back.
    async fn keep_fenced(&self, fenced_nodes: &BTreeSet<String>) {
        let kept: Vec<(String, BTreeSet<String>)> = {
            let mut state = self.state();
            // Until the cache shows the taint we wrote, the entry stays.
            state.fenced.retain(|node, (_, since)| {
                fenced_nodes.contains(node) || since.elapsed() < TAINT_CACHE_GRACE
            });
            state
                .fenced
                .iter()
                .map(|(n, (v, _))| (n.clone(), v.clone()))
                .collect()
        };
        if kept.is_empty() {
            return;
        }
        let pods = self.caches.pods.state();
        for (node, volumes) in kept {
            let in_use: BTreeSet<String> = pods
                .iter()
                .filter(|p| plan::node_name(p) == Some(node.as_str()))
                .filter_map(|p| self.volumes_of(p).ok())
                .flatten()
                .map(|pv| pv.name_any())
                .collect();
            let names: BTreeSet<String> = self
                .caches
                .attachments
                .state()
                .iter()
                .filter(|va| {
                    va.spec.node_name == node && va.spec.attacher == self.settings.driver_name
                })
                .filter(|va| va.metadata.deletion_timestamp.is_none())
                .filter(|va| {
                    va.spec
                        .source
                        .persistent_volume_name
                        .as_ref()
                        .is_some_and(|pv| volumes.contains(pv) && !in_use.contains(pv))
                })
                .map(|va| va.name_any())
                .collect();
            if !names.is_empty() {
                tracing::warn!(%node, attachments = ?names, "a fenced volume was attached to the node again; deleting the attachment");
                if let Err(error) = self.delete_attachments(&node, &names).await {
                    tracing::warn!(%node, ?error, "cannot keep the node fenced; retrying");
                }
            }
        }
    }

    /// ControllerUnpublishVolume of every volume from the node: after it, the node's writes
    /// cannot reach them.
    async fn fence(
        &self,
        node_name: &str,
        node_id: &str,
        volumes: &BTreeMap<String, Arc<PersistentVolume>>,
    ) -> Result<(), Stop> {
        for (pv_name, pv) in volumes {
            let Some(source) = pv.spec.as_ref().and_then(|s| s.csi.clone()) else {
                continue;
            };
            let secrets = match source.controller_publish_secret_ref.as_ref() {
                Some(reference) => {
                    let reference = csi_sidecar::secrets::SecretRef {
                        name: reference.name.clone().unwrap_or_default(),
                        namespace: reference.namespace.clone().unwrap_or_default(),
                    };
                    csi_sidecar::secrets::fetch_secret_data(self.client.clone(), &reference)
                        .await
                        .map_err(|e| Stop::Failed(format!("couldn't fence volumes: {e}")))?
                        .into_inner()
                }
                None => Default::default(),
            };
            let request = csi_sidecar::volume_attachment::unpublish_request(
                &source.volume_handle,
                node_id,
                secrets,
            );
            let mut attempt = 1;
            loop {
                match self
                    .csi
                    .controller_unpublish_volume(request.clone(), self.settings.timeout)
                    .await
                {
                    Ok(_) => break,
                    // ABORTED: another operation on the volume is pending — usually the
                    // attacher's own unpublish of the VolumeAttachment just deleted. Dell retries
                    // its driver's "pending" errors the same way.
                    Err(status)
                        if status.code() == tonic::Code::Aborted && attempt < PENDING_RETRIES =>
                    {
                        attempt += 1;
                        tokio::time::sleep(PENDING_RETRY_DELAY).await;
                    }
                    Err(status) => {
                        return Err(Stop::Failed(format!(
                            "couldn't fence volumes: {pv_name}: {}",
                            status.message()
                        )));
                    }
                }
            }
            tracing::warn!(pv = %pv_name, node = %node_name, "fenced: volume unpublished from the node");
        }
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
            let Some(node_id) = controller.node_id(&node, &[]) else {
                continue;
            };
            let request = podmon::ValidateVolumeHostConnectivityRequest {
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
            let mut state = controller.state();
            let previous = state.loss.get(&node).copied().unwrap_or(0);
            let count = plan::loss_after_sample(previous, connected, plugin_up);
            if count == 0 {
                state.loss.remove(&node);
                if !connected {
                    tracing::info!(%node, "the driver reports the node disconnected while its driver plugin is down: not counted");
                }
            } else {
                state.loss.insert(node.clone(), count);
                tracing::warn!(%node, samples = count, threshold, "the driver reports the node disconnected");
                crossed |= count == threshold;
            }
        }
        if crossed {
            controller.wake.notify_one();
        }
    }
}

//! A kubelet for one simulated node, with its own root directory standing in for
//! `/var/lib/kubelet`: it registers and heartbeats its Node, registers CSI drivers through the
//! plugin watcher (`plugins.rs`), and mounts the volumes of the pods bound to it through the
//! drivers it registered (`volumes.rs`). Containers are simulated; a pod annotated with
//! [`WRITE_TO_ANNOTATION`] gets a real writer process appending to its volume, so tests can see
//! writes — and see them stop when the node is fenced. The volume stats calculator
//! (`volume_stats.rs`) asks the drivers for each published volume's usage and, with the
//! `CSIVolumeHealth` gate, its condition.
//!
//! Failure injection: [`Kubelet::partition`] stops every API call (heartbeats included) while
//! the writers keep running, like a node cut off from the control plane; [`Kubelet::reboot`]
//! loses processes, mounts and in-memory state but keeps the disk, and reports a new
//! `nodeInfo.bootID`. Node agents (a DaemonSet's pods) get their API client from
//! [`Kubelet::node_client`], so a partition cuts them off too.

mod paths;
mod plugins;
mod volume_stats;
mod volumes;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use csi_grpc::conn::Endpoint;
use csi_sidecar::events::EventRecorder;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{RoleError, Timing, is_benign, lock, merge_patch, merge_patch_status, now};

pub use volume_stats::{DEFAULT_VOLUME_STATS_AGG_PERIOD, VOLUME_CONDITION_ABNORMAL, VolumeStats};
pub use volumes::{attachment_name, staging_path, target_path, unique_volume_name};

/// Pod annotation naming the pod volume its simulated container writes to: one line per
/// 50 ms appended to `<mount>/<pod name>.log`.
pub const WRITE_TO_ANNOTATION: &str = "kube-sim.csi-suite.io/write-to";

/// Node annotation telling kube-controller-manager that it, not the kubelet, attaches volumes.
pub const CONTROLLER_MANAGED_ATTACH_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// Namespace of node heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Lease duration kubelet sets (`nodeLeaseDurationSeconds`).
const NODE_LEASE_SECONDS: i32 = 40;

/// Where the kubelet finds registration sockets, under its root.
pub const PLUGINS_REGISTRY_DIR: &str = "plugins_registry";

/// One simulated node's kubelet.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    pub node: String,
    /// Stands in for `/var/lib/kubelet`.
    pub root: PathBuf,
    pub timing: Timing,
    /// Extra Node labels (e.g. a zone).
    pub labels: BTreeMap<String, String>,
    /// Drivers registered without a registration socket (as if a registrar had announced
    /// them), e.g. before a node-driver-registrar runs.
    pub driver_endpoints: Vec<Endpoint>,
    /// Where filesystem volumes are staged: the layout of the kubelet version simulated.
    pub staging_layout: StagingLayout,
    /// The `CSIVolumeHealth` feature gate (alpha, off by default): node-side volume conditions
    /// become pod Events and a gauge.
    pub csi_volume_health: bool,
    /// `--volume-stats-agg-period`: how often each volume's stats are asked for.
    pub volume_stats_agg_period: std::time::Duration,
}

/// Where a kubelet stages a CSI filesystem volume: it changed in Kubernetes 1.24
/// (kubernetes#107065), and node agents that clean up after a kubelet must find either.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StagingLayout {
    /// Kubernetes 1.24 and later: `csi/<driver>/<sha256(volumeHandle)>/globalmount`.
    #[default]
    VolumeHandleDigest,
    /// Before 1.24 (the real node of `make test-node` runs v1.19): `csi/pv/<pv>/globalmount`.
    PvName,
}

impl KubeletConfig {
    pub fn new(node: impl Into<String>, root: impl Into<PathBuf>, timing: Timing) -> Self {
        Self {
            node: node.into(),
            root: root.into(),
            timing,
            labels: BTreeMap::new(),
            driver_endpoints: Vec::new(),
            staging_layout: StagingLayout::default(),
            csi_volume_health: false,
            volume_stats_agg_period: DEFAULT_VOLUME_STATS_AGG_PERIOD,
        }
    }

    pub fn plugins_registry(&self) -> PathBuf {
        self.root.join(PLUGINS_REGISTRY_DIR)
    }
}

/// What every task of one kubelet shares.
struct Shared {
    client: Client,
    config: KubeletConfig,
    partitioned: Arc<AtomicBool>,
    /// `status.nodeInfo.bootID`, new on every (re)boot.
    boot_id: Mutex<String>,
    crash_looping: Mutex<HashSet<(String, String)>>,
    drivers: plugins::Drivers,
    volumes: tokio::sync::Mutex<volumes::VolumeState>,
    /// The volume stats calculator's latest results, by pod UID.
    volume_stats: Mutex<BTreeMap<String, Vec<VolumeStats>>>,
    events: EventRecorder,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("node", &self.config.node)
            .field("root", &self.config.root)
            .field("partitioned", &self.partitioned())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn partitioned(&self) -> bool {
        self.partitioned.load(Ordering::SeqCst)
    }

    fn node_api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
}

/// A running kubelet.
#[derive(Debug)]
pub struct Kubelet {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    generation: Mutex<Generation>,
}

#[derive(Debug)]
struct Generation {
    token: CancellationToken,
    tasks: JoinSet<()>,
}

impl Kubelet {
    /// Registers the Node (and its CSINode) and starts heartbeats, the plugin watcher and
    /// the volume manager.
    pub async fn start(
        client: Client,
        config: KubeletConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, RoleError> {
        std::fs::create_dir_all(config.plugins_registry()).map_err(|error| {
            RoleError::Invalid(format!("cannot create {}: {error}", config.root.display()))
        })?;
        let events = EventRecorder::new(client.clone(), "kubelet", config.node.clone());
        let shared = Arc::new(Shared {
            client,
            config,
            partitioned: Arc::new(AtomicBool::new(false)),
            boot_id: Mutex::new(uuid::Uuid::new_v4().to_string()),
            crash_looping: Mutex::new(HashSet::new()),
            drivers: plugins::Drivers::default(),
            volumes: tokio::sync::Mutex::new(volumes::VolumeState::default()),
            volume_stats: Mutex::default(),
            events,
            wake: Arc::new(Notify::new()),
        });
        let generation = start_generation(&shared, &shutdown).await?;
        Ok(Self {
            shared,
            shutdown,
            generation: Mutex::new(generation),
        })
    }

    pub fn node(&self) -> &str {
        &self.shared.config.node
    }

    pub fn root(&self) -> &Path {
        &self.shared.config.root
    }

    /// Cuts the node off the control plane: no heartbeats, no API calls at all; pods and their
    /// writers keep running (the zombie writers fencing exists for).
    pub fn partition(&self) {
        tracing::warn!(node = %self.node(), "kubelet partitioned from the API server");
        self.shared.partitioned.store(true, Ordering::SeqCst);
    }

    /// A client for an agent running on this node (e.g. a DaemonSet pod such as node-podmon),
    /// named `agent` in its User-Agent (the API server counts its requests under that name):
    /// while the node is partitioned its requests fail as if the network were down.
    pub fn node_client(&self, agent: &str) -> Client {
        let client = self.shared.client.clone();
        let partitioned = self.shared.partitioned.clone();
        let node = self.node().to_string();
        let user_agent =
            http::HeaderValue::from_str(agent).expect("an agent name is a header value");
        let service = tower::service_fn(move |mut request: http::Request<kube::client::Body>| {
            let client = client.clone();
            let cut_off = partitioned.load(Ordering::SeqCst);
            let node = node.clone();
            request
                .headers_mut()
                .insert(http::header::USER_AGENT, user_agent.clone());
            async move {
                if cut_off {
                    let error = std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        format!("node {node} is partitioned from the API server"),
                    );
                    return Err(tower::BoxError::from(error));
                }
                client.send(request).await.map_err(tower::BoxError::from)
            }
        });
        Client::new(service, self.shared.client.default_namespace())
    }

    /// The boot ID the node reports now.
    pub fn boot_id(&self) -> String {
        lock(&self.shared.boot_id).clone()
    }

    /// Ends a partition: heartbeats resume and the kubelet catches up with the API.
    pub fn heal(&self) {
        tracing::info!(node = %self.node(), "kubelet reconnected to the API server");
        self.shared.partitioned.store(false, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }

    /// The pod's simulated containers crash from now on: its writer stops and its status
    /// shows CrashLoopBackOff with a growing restart count.
    pub fn crash_loop(&self, namespace: &str, name: &str) {
        lock(&self.shared.crash_looping).insert((namespace.to_string(), name.to_string()));
        self.shared.wake.notify_one();
    }

    /// The latest volume stats, one per claim in use on the node: what the
    /// `kubelet_volume_stats_*` gauges of its `/metrics` show.
    pub fn volume_stats(&self) -> Vec<VolumeStats> {
        volume_stats::by_claim(&lock(&self.shared.volume_stats))
    }

    /// Names of the drivers registered with this kubelet.
    pub fn registered_drivers(&self) -> Vec<String> {
        self.shared.drivers.names()
    }

    /// A node reboot: every process and mount of the node is gone and the kubelet restarts with
    /// empty memory; the disk (pod directories, registration sockets) survives, and the kubelet
    /// reconstructs its volumes from it, as the real one does.
    pub async fn reboot(&self) -> Result<(), RoleError> {
        tracing::warn!(node = %self.node(), "rebooting node");
        let old = {
            let mut generation = lock(&self.generation);
            let placeholder = Generation {
                token: CancellationToken::new(),
                tasks: JoinSet::new(),
            };
            std::mem::replace(&mut *generation, placeholder)
        };
        old.token.cancel();
        old.tasks.join_all().await;
        self.shared.volumes.lock().await.kill_writers().await;
        self.shared.drivers.clear();
        volumes::unmount_everything_under(&self.shared.config.root)?;
        *self.shared.volumes.lock().await = volumes::VolumeState::default();
        lock(&self.shared.volume_stats).clear();
        *lock(&self.shared.boot_id) = uuid::Uuid::new_v4().to_string();
        let generation = start_generation(&self.shared, &self.shutdown).await?;
        *lock(&self.generation) = generation;
        Ok(())
    }

    /// Stops the kubelet's tasks and its writers (mounts stay, as on a kubelet restart).
    pub async fn stop(&self) {
        let generation = {
            let mut generation = lock(&self.generation);
            std::mem::replace(
                &mut *generation,
                Generation {
                    token: CancellationToken::new(),
                    tasks: JoinSet::new(),
                },
            )
        };
        generation.token.cancel();
        generation.tasks.join_all().await;
        self.shared.volumes.lock().await.kill_writers().await;
    }
}

async fn start_generation(
    shared: &Arc<Shared>,
    shutdown: &CancellationToken,
) -> Result<Generation, RoleError> {
    register_node(shared).await?;
    initialize_csi_node(shared).await?;
    let token = shutdown.child_token();
    let mut tasks = JoinSet::new();
    tasks.spawn(heartbeats(shared.clone(), token.clone()));
    tasks.spawn(plugins::watch(shared.clone(), token.clone()));
    tasks.spawn(volumes::manage(shared.clone(), token.clone()));
    Ok(Generation { token, tasks })
}

/// The Node as a kubelet registers it: hostname/os/arch labels, the controller-managed
/// attach/detach annotation, capacity and a Ready condition.
fn node_object(config: &KubeletConfig) -> serde_json::Value {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), config.node.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        (
            "kubernetes.io/arch".to_string(),
            std::env::consts::ARCH
                .replace("x86_64", "amd64")
                .replace("aarch64", "arm64"),
        ),
    ]);
    labels.extend(config.labels.clone());
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.node,
            "labels": labels,
            "annotations": {CONTROLLER_MANAGED_ATTACH_ANNOTATION: "true"},
        },
        "spec": {},
    })
}

fn ready_status(transition: &str, boot_id: &str) -> serde_json::Value {
    let now = now();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": transition,
        })
    };
    json!({"status": {
        "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"},
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"},
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {
            "kubeletVersion": concat!("v1.33.0-kube-sim-", env!("CARGO_PKG_VERSION")),
            "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": std::env::consts::ARCH, "containerRuntimeVersion": "kube-sim://simulated",
            "kernelVersion": "", "osImage": "kube-sim", "machineID": "", "systemUUID": "", "bootID": boot_id,
        },
    }})
}

/// Creates the Node, or adopts an existing one (a kubelet restart), and reports it Ready.
async fn register_node(shared: &Shared) -> Result<(), RoleError> {
    let api = shared.node_api();
    let config = &shared.config;
    let node: Node = serde_json::from_value(node_object(config))
        .map_err(|e| RoleError::Invalid(format!("node object: {e}")))?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %config.node, "registered node"),
        Err(error) if is_benign(&error) => {
            let labels = node.labels().clone();
            merge_patch(
                &api,
                &config.node,
                json!({"metadata": {"labels": labels, "annotations": {CONTROLLER_MANAGED_ATTACH_ANNOTATION: "true"}}}),
            )
            .await?;
        }
        Err(error) => return Err(error.into()),
    }
    let boot_id = lock(&shared.boot_id).clone();
    merge_patch_status(&api, &config.node, ready_status(&now(), &boot_id)).await?;
    Ok(())
}

/// kubelet creates its CSINode at start, before any driver registers, owned by the Node so it
/// goes with it (pkg/volume/csi/nodeinfomanager `InitializeCSINode`).
async fn initialize_csi_node(shared: &Shared) -> Result<(), RoleError> {
    let node = shared.node_api().get(&shared.config.node).await?;
    let api: Api<CSINode> = Api::all(shared.client.clone());
    let csi_node: CSINode = serde_json::from_value(plugins::csi_node_object(&node))
        .map_err(|e| RoleError::Invalid(format!("CSINode object: {e}")))?;
    match api.create(&PostParams::default(), &csi_node).await {
        Ok(_) => Ok(()),
        Err(error) if is_benign(&error) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Renews the node Lease every heartbeat interval and reports Ready again when the node
/// lifecycle controller marked the node Unknown (after a partition).
async fn heartbeats(shared: Arc<Shared>, token: CancellationToken) {
    let leases: Api<Lease> = Api::namespaced(shared.client.clone(), NODE_LEASE_NAMESPACE);
    let mut ticker = tokio::time::interval(shared.config.timing.heartbeat_interval);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if shared.partitioned() {
            continue;
        }
        if let Err(error) = heartbeat(&shared, &leases).await {
            tracing::warn!(node = %shared.config.node, %error, "heartbeat failed");
        }
    }
}

async fn heartbeat(shared: &Shared, leases: &Api<Lease>) -> Result<(), RoleError> {
    let node_name = &shared.config.node;
    let renew = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let spec = json!({"spec": {"holderIdentity": node_name, "leaseDurationSeconds": NODE_LEASE_SECONDS, "renewTime": renew}});
    match merge_patch(leases, node_name, spec).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let node = shared.node_api().get(node_name).await?;
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {
                    "name": node_name,
                    "namespace": NODE_LEASE_NAMESPACE,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node.uid()}],
                },
                "spec": {"holderIdentity": node_name, "leaseDurationSeconds": NODE_LEASE_SECONDS, "renewTime": renew},
            }))
            .map_err(|e| RoleError::Invalid(format!("lease object: {e}")))?;
            match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => {}
                Err(error) if is_benign(&error) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Err(error) => return Err(error.into()),
    }
    let node = shared.node_api().get(node_name).await?;
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if !ready {
        tracing::info!(node = %node_name, "reporting node Ready again");
        let boot_id = lock(&shared.boot_id).clone();
        merge_patch_status(
            &shared.node_api(),
            node_name,
            ready_status(&now(), &boot_id),
        )
        .await?;
    }
    Ok(())
}

//! podmon in the scenario cluster: controller-podmon against the driver's controller
//! instance, node-podmon per node against that node's driver instance with the node's own API
//! client (a partition cuts it off too), and node failures that cut a node off both the
//! control plane and the storage (the driver's podmon extension then reports it disconnected).

use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use csi_hostpath::state::{Layout, Store};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use podmon::config::{LiveConfig, Tunables};
use podmon::controller::Settings;
use podmon::metrics::PodmonMetrics;
use podmon::node::NodeSettings;
use tokio_util::sync::CancellationToken;

use crate::{Cluster, Sidecar, rbac};

/// Dell's default label key; the value is the driver's name.
pub const LABEL_KEY: &str = "podmon.dellemc.com/driver";

/// The label of the driver's node pods (`--driverPodLabelKey`); the value is the driver's name.
pub const DRIVER_POD_LABEL_KEY: &str = "driver.dellemc.com";

/// A running controller-podmon, its live settings and metrics.
#[derive(Debug)]
pub struct PodmonController {
    pub sidecar: Sidecar,
    pub live: LiveConfig,
    pub metrics: PodmonMetrics,
}

impl PodmonController {
    /// Waits until controller-podmon has completed two passes over its caches after this call:
    /// the second began after the first ended, so it judged what the API showed when the
    /// scenario asked (instead of sleeping and hoping a pass happened).
    pub async fn two_passes(&self, cluster: &Cluster, what: &str) {
        let start = self.metrics.passes();
        cluster
            .eventually(what, || self.metrics.passes() >= start + 2)
            .await;
    }
}

impl Cluster {
    /// Labels a pod manifest as protected by podmon, tolerating unreachable for good (so only
    /// podmon moves it, as on a real cluster where the default 300 s toleration outlasts a
    /// scenario).
    pub fn protect(&self, pod: &mut serde_json::Value) {
        pod["metadata"]["labels"][LABEL_KEY] = serde_json::json!(self.driver_name);
        pod["spec"]["tolerations"] = serde_json::json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]);
    }

    /// The StatefulSet's part: a new protected pod with the same name, placed by the scheduler
    /// on one of the scenario's nodes.
    pub async fn replace_pod(&self, name: &str, claim: Option<&str>, writes: bool) -> Pod {
        let mut manifest = crate::fixtures::pod(name, "unused", claim, writes);
        if let Some(spec) = manifest["spec"].as_object_mut() {
            spec.remove("nodeSelector");
            spec.insert("affinity".to_string(), self.on_scenario_nodes());
        }
        self.protect(&mut manifest);
        self.create(&self.namespaced::<Pod>(), manifest).await
    }

    pub async fn volume_handle(&self, pv: &str) -> String {
        let pv = self
            .cluster_scoped::<PersistentVolume>()
            .get(pv)
            .await
            .expect("the PV");
        pv.spec
            .and_then(|s| s.csi)
            .map(|c| c.volume_handle)
            .expect("a CSI PV")
    }

    /// The volume's data directory in the driver's state (what every node's mount shows).
    pub async fn volume_data(&self, pv: &str) -> std::path::PathBuf {
        let handle = self.volume_handle(pv).await;
        self.driver_store().volume_data(&handle, Layout::Directory)
    }

    /// Whether the driver has fenced `node` from the volume `handle`.
    pub fn is_fenced(&self, handle: &str, node: &str) -> bool {
        self.driver_store()
            .read()
            .ok()
            .and_then(|s| s.volumes.get(handle).map(|v| v.fenced.contains_key(node)))
            .unwrap_or(false)
    }

    pub fn has_podmon_taint(&self, node: &Node) -> bool {
        podmon::plan::has_taint(
            node,
            &podmon::plan::fenced_taint_key(&self.driver_name),
            "NoSchedule",
        )
    }

    /// Waits until node-podmon has removed the fenced taint from `node`.
    pub async fn wait_podmon_untainted(&self, node: &str, what: &str) {
        self.wait_for(&self.cluster_scoped::<Node>(), node, what, |n| {
            !self.has_podmon_taint(n)
        })
        .await;
    }

    /// Whether `node` carries podmon's fenced taint now.
    pub async fn podmon_tainted(&self, node: &str) -> bool {
        let node = self
            .cluster_scoped::<Node>()
            .get(node)
            .await
            .expect("the node");
        self.has_podmon_taint(&node)
    }

    /// controller-podmon in this process (fast retries; connectivity sampled every second).
    pub async fn start_podmon_controller(
        &self,
        change: impl FnOnce(&mut Settings, &mut Tunables),
    ) -> PodmonController {
        self.start_podmon(None, self.driver.controller.csi.clone(), change)
            .await
    }

    /// [`Cluster::start_podmon_controller`] talking to the driver through `csi`.
    pub async fn start_podmon_controller_via(
        &self,
        csi: CsiConnection,
        change: impl FnOnce(&mut Settings, &mut Tunables),
    ) -> PodmonController {
        self.start_podmon(None, csi, change).await
    }

    /// A controller-podmon replica electing on the Lease `podmon-<driver>`, talking to the
    /// driver through `csi`.
    pub async fn start_podmon_replica(
        &self,
        identity: &str,
        csi: CsiConnection,
        change: impl FnOnce(&mut Settings, &mut Tunables),
    ) -> PodmonController {
        self.start_podmon(Some(identity), csi, change).await
    }

    async fn start_podmon(
        &self,
        identity: Option<&str>,
        csi: CsiConnection,
        change: impl FnOnce(&mut Settings, &mut Tunables),
    ) -> PodmonController {
        let metrics = PodmonMetrics::unregistered();
        let mut settings = Settings {
            driver_name: self.driver_name.clone(),
            label_key: LABEL_KEY.to_string(),
            label_value: self.driver_name.clone(),
            driver_pod_label: Some((DRIVER_POD_LABEL_KEY.to_string(), self.driver_name.clone())),
            poll_connectivity: true,
            can_fence: true,
            ignore_volumeless_pods: false,
            out_of_service_taint: false,
            timeout: Duration::from_secs(10),
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(2),
            metrics: metrics.clone(),
            cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
                csi_sidecar::informers::SYNC_GRACE_PERIOD,
            ),
        };
        let mut tunables = Tunables {
            poll_rate: Duration::from_secs(1),
            loss_threshold: 3,
            skip_validation: false,
            maintenance: false,
            max_evacuated_fraction: 1.0 / 3.0,
        };
        change(&mut settings, &mut tunables);
        let live = LiveConfig::fixed(tunables);
        let (client, running) = (self.component_client(rbac::PODMON_CONTROLLER), live.clone());
        let work = move |token: CancellationToken| async move {
            if let Err(error) = podmon::controller::run(client, csi, settings, running, token).await
            {
                tracing::error!(%error, "controller-podmon stopped");
            }
        };
        let sidecar = match identity {
            Some(identity) => {
                let lease = podmon::plan::lease_name(&self.driver_name);
                self.elected(rbac::PODMON_CONTROLLER, identity, &lease, work)
            }
            None => {
                let shutdown = CancellationToken::new();
                let task = tokio::spawn(work(shutdown.clone()));
                Sidecar { shutdown, task }
            }
        };
        PodmonController {
            sidecar,
            live,
            metrics,
        }
    }

    /// Where node-podmon of `node` keeps its inventory (on the node's "disk").
    pub fn podmon_state_file(&self, node: &str) -> std::path::PathBuf {
        self.driver
            .kubelet_dir(node)
            .join("plugins")
            .join(&self.driver_name)
            .join("podmon-node-state.json")
    }

    /// node-podmon of `node` in this process, polling its Node every 200 ms.
    pub async fn start_podmon_node(&self, node: &str) -> Sidecar {
        let settings = NodeSettings {
            node_name: node.to_string(),
            driver_name: self.driver_name.clone(),
            label_key: LABEL_KEY.to_string(),
            label_value: self.driver_name.clone(),
            kubelet_dir: self.driver.kubelet_dir(node),
            state_file: self.podmon_state_file(node),
            poll_interval: Duration::from_millis(200),
            stage_unstage: true,
            ignore_volumeless_pods: false,
            out_of_service_taint: false,
            timeout: Duration::from_secs(10),
            metrics: PodmonMetrics::unregistered(),
        };
        let client = self.kubelet(node).node_client(rbac::PODMON_NODE);
        let csi = self.driver.node(node).csi.clone();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = podmon::node::run(client, csi, settings, token).await {
                tracing::error!(%error, "node-podmon stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// The reference driver's state directory (volume data, fencing records).
    pub fn driver_store(&self) -> Store {
        Store::open(&self.driver.state_dir).expect("the driver's state directory")
    }

    /// A node failure: the kubelet (and node agents) lose the API server and the node loses
    /// its storage network (the driver stops hearing its heartbeat); pods and writers go on.
    pub fn fail_node(&self, node: &str) {
        self.kubelet(node).partition();
        self.driver_store()
            .set_link(node, false)
            .expect("the storage link marker");
    }

    /// The node is back on both networks.
    pub fn recover_node(&self, node: &str) {
        self.driver_store()
            .set_link(node, true)
            .expect("the storage link marker");
        self.kubelet(node).heal();
    }
}

/// How many records the writer of pod `uid` appended to `log` (`<uid> <n>` lines).
pub fn records_of(log: &std::path::Path, uid: &str) -> usize {
    let prefix = format!("{uid} ");
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

/// What [`failover_story`] reports as it goes: a step begins, a step is done (on an object).
#[derive(Debug)]
pub enum Narration {
    Begin(&'static str),
    Done(&'static str, String),
}

/// What one failover story saw.
#[derive(Debug)]
pub struct FailoverStory {
    pub pv: String,
    pub old_uid: String,
    pub new_uid: String,
    /// Where the replacement runs.
    pub new_node: String,
    /// The volume's shared log of records, `<uid> <n>` per line.
    pub log: std::path::PathBuf,
    /// The zombie's records when the fence landed (and ever after).
    pub zombie_records: usize,
    /// Node failure → fence landed.
    pub detect_and_fence: Duration,
    /// Fence → replacement Running.
    pub failover: Duration,
    /// Node back → cleaned and untainted.
    pub node_cleanup: Duration,
}

/// podmon's failover end to end, on a cluster running the attacher, controller-podmon (with
/// skipArrayConnectionValidation: the zombie's writes are I/O the driver sees) and node-podmon
/// on `node`: a protected pod writes to a static volume on `node`; the node fails (control
/// plane and storage network); the volume is fenced; the pod is force-deleted and the node
/// tainted; the StatefulSet's replacement runs elsewhere; the node comes back and is cleaned
/// and untainted. The data proof holds throughout: no record of the zombie after the fence.
pub async fn failover_story(
    cluster: &Cluster,
    node: &str,
    mut narrate: impl FnMut(Narration),
) -> FailoverStory {
    use crate::fixtures::{is_running, running_pod_with_static_volume};
    use kube::ResourceExt;

    narrate(Narration::Begin("a protected pod writes to its volume"));
    let (old, pv, old_target) =
        running_pod_with_static_volume(cluster, "app-0", node, |p| cluster.protect(p)).await;
    let old_uid = old.uid().unwrap_or_default();
    let handle = cluster.volume_handle(&pv).await;
    let log = cluster.volume_data(&pv).await.join("app-0.log");
    cluster
        .eventually("the pod writing", || records_of(&log, &old_uid) > 0)
        .await;
    narrate(Narration::Done(
        "protected pod Running and writing",
        format!("Pod app-0 on {node}, PV {pv}"),
    ));

    narrate(Narration::Begin(
        "the node fails: cut off the control plane and its storage network; the writer goes on",
    ));
    let failed = std::time::Instant::now();
    cluster.fail_node(node);
    cluster
        .eventually("the fence", || cluster.is_fenced(&handle, node))
        .await;
    let detect_and_fence = failed.elapsed();
    // The driver stopped the node's writers before it recorded the fence.
    let zombie_records = records_of(&log, &old_uid);
    narrate(Narration::Done(
        "unreachable → podmon fenced the volume from the node (ControllerUnpublishVolume; writers stopped)",
        format!("volume {handle}"),
    ));

    narrate(Narration::Begin(
        "podmon taints the node, deletes its VolumeAttachment and force-deletes the pod",
    ));
    let fenced = std::time::Instant::now();
    let pods = cluster.namespaced::<Pod>();
    cluster
        .wait_gone(&pods, "app-0", "the pod force-deleted")
        .await;
    assert!(
        cluster.podmon_tainted(node).await,
        "the failed node carries podmon's taint"
    );
    narrate(Narration::Done(
        "pod gone, node tainted",
        format!(
            "{} on Node {node}",
            podmon::plan::fenced_taint_key(&cluster.driver_name)
        ),
    ));

    narrate(Narration::Begin(
        "the StatefulSet's replacement is scheduled elsewhere, attached, mounted, writing",
    ));
    let new_uid = cluster
        .replace_pod("app-0", Some("app-0"), true)
        .await
        .uid()
        .unwrap_or_default();
    let running = cluster
        .wait_for(&pods, "app-0", "the replacement Running", is_running)
        .await;
    let failover = fenced.elapsed();
    let new_node = running.spec.and_then(|s| s.node_name).unwrap_or_default();
    assert_ne!(new_node, node, "the replacement avoids the failed node");
    cluster
        .eventually("the replacement writing", || records_of(&log, &new_uid) > 0)
        .await;
    assert_eq!(
        records_of(&log, &old_uid),
        zombie_records,
        "a zombie write landed after the fence"
    );
    narrate(Narration::Done(
        "replacement Running; no zombie record after the fence",
        format!("Pod app-0 on {new_node}"),
    ));

    narrate(Narration::Begin(
        "the node comes back; node-podmon cleans the zombie's mounts and removes the taint",
    ));
    let recovering = std::time::Instant::now();
    cluster.recover_node(node);
    cluster
        .wait_podmon_untainted(node, "the node cleaned and untainted")
        .await;
    let node_cleanup = recovering.elapsed();
    assert!(!old_target.exists(), "the zombie's target path is gone");
    assert_eq!(
        records_of(&log, &old_uid),
        zombie_records,
        "a zombie write landed after the node came back"
    );
    narrate(Narration::Done(
        "node clean and schedulable again",
        format!("Node {node}"),
    ));
    FailoverStory {
        pv,
        old_uid,
        new_uid,
        new_node,
        log,
        zombie_records,
        detect_and_fence,
        failover,
        node_cleanup,
    }
}

//! The scenario suite's fixture. [`Cluster::start`] brings up a whole cluster on this machine:
//! kube-sim's API server, every cluster role (PV binder, scheduler, attach/detach, node
//! lifecycle, a kubelet per simulated node) and the reference CSI driver (a controller instance
//! and a node instance per node, registered through each kubelet's plugin watcher). With
//! `KUBECONFIG` set it uses that cluster instead and starts only the kubelets and the driver —
//! a real kube-apiserver, kube-controller-manager and kube-scheduler do the rest.
//!
//! Each scenario gets an id of its own that names its namespace, its Nodes (`node-a-<id>`) and
//! its driver (`hostpath-<id>.csi-suite.io`), so scenarios share a real cluster without seeing
//! each other's Nodes, CSINode entries, PVs or taints. When a wait times out, the fixture dumps
//! the scenario's objects before failing; whether the scenario ends or fails, everything it
//! made in the cluster is deleted. Logs go to the test's captured output.

pub mod bench;
pub mod csi_proxy;
pub mod fixtures;
pub mod image;
pub mod logs;
pub mod manifests;
pub mod moto;
pub mod object_storage;
pub mod podmon;
pub mod rbac;
pub mod registration;
pub mod service_accounts;
pub mod snapshot_metadata;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use csi_hostpath::local::LocalCluster;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, Resource, ResourceExt};
use kube_sim::ApiServer;
use kube_sim::apiserver::RequestCounts;
use kube_sim::faults::Faults;
use kube_sim::proxy::FaultProxy;
use kube_sim::roles::kubelet::{Kubelet, KubeletConfig, StagingLayout};
use kube_sim::roles::{Role, Timing};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

pub use csi_hostpath::config::DEFAULT_DRIVER_NAME as DRIVER;
pub use registration::RegistrationServer;

/// The Node label kube-controller-manager groups nodes into zones by.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The simulated nodes of a default cluster, by the names scenarios use for them
/// ([`Cluster::node`] gives the name of the scenario's own Node).
pub const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

/// How long a scenario waits for one step before it dumps the cluster and fails. Real
/// clusters get more: their node monitor grace period alone is 40 s.
pub fn step_timeout() -> Duration {
    if real_cluster() {
        Duration::from_secs(120)
    } else {
        Duration::from_secs(30)
    }
}

/// True when the scenarios run against the cluster `KUBECONFIG` points at.
pub fn real_cluster() -> bool {
    std::env::var_os("KUBECONFIG").is_some()
}

/// True when this process may mount (the driver's node service needs it).
pub fn can_mount() -> bool {
    csi_hostpath::mounts::can_mount()
}

/// True (after saying why) when this process cannot mount, so a scenario that needs real
/// mounts should return early; under `CI=true` it fails instead.
pub fn skip_without_root() -> bool {
    let scenario = std::thread::current()
        .name()
        .unwrap_or("this scenario")
        .to_string();
    csi_hostpath::mounts::skip_without_root(&scenario)
}

/// Says that `scenario` (or a part of it) did not run because the server lacks `what`, on
/// stderr and, when `CSI_SUITE_SKIPS` names a file, as a line appended to it (`make test-real`
/// counts those lines and prints them).
pub fn report_skip(scenario: &str, what: &str) {
    let line = format!("skipped {scenario}: {what}");
    eprintln!("{line}");
    if let Some(file) = std::env::var_os("CSI_SUITE_SKIPS") {
        use std::io::Write;
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(error) = appended {
            panic!("recording the skip in {}: {error}", file.to_string_lossy());
        }
    }
}

/// Logs to the test's captured output at info level; `RUST_LOG` adjusts.
pub fn init_logging() {
    init_logging_at("info");
}

/// Logs at `level` for our crates (the first call in a process wins; `RUST_LOG` overrides).
pub fn init_logging_at(level: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(level))
        .with_test_writer()
        .try_init();
}

/// Our crates at `level`, chatty dependencies at warn; `RUST_LOG` overrides.
fn log_filter(level: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{level},kube_runtime=warn,hyper=warn,h2=warn,tower=warn"
        ))
    })
}

/// What a scenario needs from its cluster.
#[derive(Clone, Debug)]
pub struct Options {
    /// The nodes, by the names the scenario uses (see [`Cluster::node`]).
    pub nodes: Vec<String>,
    /// Register the driver's node instances through a registration socket per node (as a
    /// node-driver-registrar would). Off: the scenario registers (or not) by itself.
    pub register_driver: bool,
    /// The reference driver's name; the cluster's driver is named after it and the scenario's
    /// id (see [`scenario_driver_name`]).
    pub driver_name: String,
    /// Whether the driver needs ControllerPublishVolume before NodeStageVolume (its
    /// `--enable-attach`); pair `false` with a CSIDriver object with `attachRequired: false`.
    pub attach_required: bool,
    /// The driver's storage pool per node (its `--capacity`); `None`: the state directory's
    /// free space.
    pub pool_bytes: Option<u64>,
    /// Whether the driver serves the podmon connectivity extension.
    pub podmon_extension: bool,
    /// Where the simulated kubelets stage filesystem volumes (their Kubernetes version's
    /// layout).
    pub staging_layout: StagingLayout,
    /// The scenario injects API faults ([`Cluster::faults`]): on a real cluster its components
    /// then talk to the API server through a [`FaultProxy`].
    pub api_faults: bool,
    /// The volume health API the driver serves (its `--volume-health`).
    pub volume_health: csi_hostpath::health::HealthApi,
    /// The kubelets' `CSIVolumeHealth` feature gate.
    pub kubelet_volume_health: bool,
    /// The kubelets' `--volume-stats-agg-period`.
    pub volume_stats_agg_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: NODES.iter().map(|n| n.to_string()).collect(),
            register_driver: true,
            driver_name: DRIVER.to_string(),
            attach_required: true,
            pool_bytes: None,
            podmon_extension: true,
            staging_layout: StagingLayout::default(),
            api_faults: false,
            volume_health: csi_hostpath::health::HealthApi::V1_13,
            kubelet_volume_health: false,
            volume_stats_agg_period: kube_sim::roles::kubelet::DEFAULT_VOLUME_STATS_AGG_PERIOD,
        }
    }
}

impl Options {
    /// The defaults, with API faults ([`Options::api_faults`]).
    pub fn with_api_faults() -> Self {
        Self {
            api_faults: true,
            ..Self::default()
        }
    }
}

/// A running cluster and a namespace for one scenario.
pub struct Cluster {
    pub client: Client,
    /// How `client` was configured: the components get clients of their own from it.
    config: kube::Config,
    /// The scenario's name, as its test gave it.
    pub scenario: String,
    /// What names the scenario's objects apart from every other scenario's.
    pub id: String,
    pub namespace: String,
    /// The scenario's Node names, in the order of [`Options::nodes`].
    pub nodes: Vec<String>,
    pub driver: LocalCluster,
    pub driver_name: String,
    pub kubelets: BTreeMap<String, Kubelet>,
    pub registrations: Vec<RegistrationServer>,
    pub timing: Timing,
    pub sim: Option<ApiServer>,
    /// On a real cluster with [`Options::api_faults`]: where the components' requests go.
    fault_proxy: Option<FaultProxy>,
    shutdown: CancellationToken,
    /// The control-plane roles' tasks (dropping the set would abort them).
    control_plane: tokio::task::JoinSet<()>,
    /// Deletes what the scenario made in a real cluster if it fails before [`Cluster::stop`].
    sweep_on_panic: SweepOnDrop,
    root: ScratchRoot,
}

/// A scenario's scratch directory. Dropping it first unmounts what the scenario's kubelets and
/// driver left mounted under it (a node that fails never unstages), then detaches the loop
/// devices left on its images (an export or a staged block volume the scenario ended with), so
/// neither the directory nor a mount nor a loop device outlives the scenario.
struct ScratchRoot(tempfile::TempDir);

impl ScratchRoot {
    fn path(&self) -> &Path {
        self.0.path()
    }

    /// The loop devices whose backing file lies under this directory.
    fn loop_devices(&self) -> Vec<String> {
        let Ok(devices) = std::fs::read_dir("/sys/block") else {
            return Vec::new();
        };
        devices
            .flatten()
            .filter_map(|device| {
                let backing =
                    std::fs::read_to_string(device.path().join("loop/backing_file")).ok()?;
                Path::new(backing.trim_end())
                    .starts_with(self.path())
                    .then(|| format!("/dev/{}", device.file_name().to_string_lossy()))
            })
            .collect()
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let points = csi_grpc::mounts::mount_points_under(self.path()).unwrap_or_default();
        for point in points {
            if let Err(error) = csi_grpc::mounts::unmount_all(&point) {
                eprintln!("scenario cleanup: unmounting {}: {error}", point.display());
            }
        }
        for device in self.loop_devices() {
            if let Err(error) = csi_hostpath::mounts::loop_detach(&device) {
                eprintln!("scenario cleanup: detaching {device}: {error}");
            }
        }
    }
}

impl Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .field("nodes", &self.nodes)
            .field("root", &self.root.path())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster with every role, three nodes and the registered driver.
    pub async fn start(scenario: &str) -> Self {
        Self::start_with(scenario, Options::default()).await
    }

    pub async fn start_with(scenario: &str, options: Options) -> Self {
        init_logging();
        let id = scenario_id();
        let root = ScratchRoot(
            tempfile::Builder::new()
                .prefix("s-")
                .tempdir_in(scratch_dir())
                .expect("a scratch directory"),
        );
        let timing = Timing::fast();
        let shutdown = CancellationToken::new();
        let mut control_plane = tokio::task::JoinSet::new();
        let (config, sim) = if real_cluster() {
            let config = kube::Config::infer()
                .await
                .expect("a configuration from KUBECONFIG");
            (config, None)
        } else {
            let sim = ApiServer::start().await.expect("kube-sim starts");
            let uri = format!("http://{}", sim.addr)
                .parse()
                .expect("an address URI");
            (kube::Config::new(uri), Some(sim))
        };
        let client = Client::try_from(config.clone()).expect("a client");
        let fault_proxy = if sim.is_none() && options.api_faults {
            let proxy = FaultProxy::start(client.clone())
                .await
                .expect("the fault proxy starts");
            Some(proxy)
        } else {
            None
        };
        if let Some(sim) = &sim {
            let roles = Role::ALL
                .into_iter()
                .filter(|r| *r != Role::Kubelet)
                .collect::<Vec<_>>();
            control_plane = kube_sim::roles::start_control_plane(
                sim.client(),
                &roles,
                timing.clone(),
                shutdown.clone(),
            );
        }
        let driver_name = scenario_driver_name(&options.driver_name, &id);
        let nodes: Vec<String> = options
            .nodes
            .iter()
            .map(|node| scenario_node_name(node, &id))
            .collect();
        let namespace = format!("{scenario}-{id}").replace('_', "-");
        let sweep_on_panic = SweepOnDrop(Some(Sweep {
            config: config.clone(),
            namespace: namespace.clone(),
            driver_name: driver_name.clone(),
            nodes: nodes.clone(),
            made: Arc::default(),
        }));
        let node_names: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let driver = LocalCluster::start(root.path(), &node_names, |config| {
            config.driver_name = driver_name.clone();
            config.enable_attach = options.attach_required;
            config.podmon_extension = options.podmon_extension;
            config.volume_health = options.volume_health;
            // What the scenarios' VolumeAttributesClasses set.
            config.accepted_mutable_parameters = ["iops".to_string()].into();
            if let Some(bytes) = options.pool_bytes {
                config.capacity.insert(String::new(), bytes);
            }
        })
        .await
        .expect("the reference driver starts");
        let mut kubelets = BTreeMap::new();
        let mut registrations = Vec::new();
        for node in &nodes {
            let mut config =
                KubeletConfig::new(node.clone(), driver.kubelet_dir(node), timing.clone());
            config.staging_layout = options.staging_layout;
            config.csi_volume_health = options.kubelet_volume_health;
            config.volume_stats_agg_period = options.volume_stats_agg_period;
            // A zone of its own: kube-controller-manager judges zone health over all the nodes
            // of a zone (no unreachable:NoExecute taints while most of a zone is down), which
            // must not mix scenarios running at once on one cluster.
            config
                .labels
                .insert(ZONE_LABEL.to_string(), format!("zone-{id}"));
            let kubelet = Kubelet::start(client.clone(), config.clone(), shutdown.clone())
                .await
                .expect("the kubelet starts");
            if options.register_driver {
                let endpoint = driver.node(node).endpoint.path().display().to_string();
                let server = RegistrationServer::start(
                    &config.plugins_registry(),
                    &driver_name,
                    &endpoint,
                    &["1.0.0"],
                )
                .await
                .expect("the registration server starts");
                registrations.push(server);
            }
            kubelets.insert(node.clone(), kubelet);
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &object(serde_json::json!({"metadata": {"name": namespace}})),
            )
            .await
            .expect("the scenario namespace");
        let cluster = Self {
            client,
            config,
            scenario: scenario.to_string(),
            id,
            namespace,
            nodes,
            driver,
            driver_name,
            kubelets,
            registrations,
            timing,
            sim,
            fault_proxy,
            shutdown,
            control_plane,
            sweep_on_panic,
            root,
        };
        cluster.wait_for_pod_admission().await;
        if options.register_driver {
            for node in &cluster.nodes {
                cluster
                    .wait_for(
                        &cluster.cluster_scoped::<CSINode>(),
                        node,
                        "the driver registered in the CSINode",
                        |csi_node| {
                            csi_node
                                .spec
                                .drivers
                                .iter()
                                .any(|d| d.name == cluster.driver_name)
                        },
                    )
                    .await;
            }
        }
        cluster
    }

    /// The scenario's Node for `node`, a name of [`Options::nodes`] (`node-a` → `node-a-<id>`).
    pub fn node(&self, node: &str) -> String {
        let name = scenario_node_name(node, &self.id);
        assert!(
            self.nodes.contains(&name),
            "{node} is not one of the scenario's nodes {:?}",
            self.nodes
        );
        name
    }

    /// Whether the server serves `resource` in `group_version` (through discovery); when it
    /// does not, reports the scenario's skip (see [`report_skip`]).
    pub async fn serves(&self, group_version: &str, resource: &str) -> bool {
        let served = match self.client.list_api_group_resources(group_version).await {
            Ok(list) => list.resources.iter().any(|r| r.name == resource),
            Err(kube::Error::Api(status)) if status.code == 404 => false,
            Err(error) => panic!("discovery of {group_version}: {error}"),
        };
        if !served {
            report_skip(
                &self.scenario,
                &format!("{group_version} {resource} not served"),
            );
        }
        served
    }

    /// Whether the server keeps `status.attachError.errorCode` of a VolumeAttachment (added in
    /// Kubernetes 1.33; older servers drop the field). Probed on an attachment nobody acts on
    /// (its attacher is no driver); reports the skip of `part` when the field is dropped.
    pub async fn keeps_attach_error_code(&self, part: &str) -> bool {
        let api = self.cluster_scoped::<VolumeAttachment>();
        let name = format!("{}-error-code-probe", self.namespace);
        let probe = serde_json::json!({"metadata": {"name": name}, "spec": {
            "attacher": format!("probe.{}", self.driver_name), "nodeName": self.nodes[0],
            "source": {"persistentVolumeName": name}}});
        self.create(&api, probe).await;
        let status = serde_json::json!({"status": {"attached": false,
            "attachError": {"message": "probe", "errorCode": 14}}});
        let written = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("the probe's status");
        forget(&api, &name, &DeleteParams::default()).await;
        let kept = written
            .status
            .and_then(|s| s.attach_error)
            .and_then(|e| e.error_code)
            .is_some();
        if !kept {
            report_skip(
                &format!("{} ({part})", self.scenario),
                "VolumeAttachment status.attachError.errorCode not served (dropped)",
            );
        }
        kept
    }

    /// Whether the server keeps a claim's `spec.dataSourceRef.namespace` (only with its
    /// CrossNamespaceVolumeDataSource feature, alpha since Kubernetes 1.26; older servers have
    /// no `dataSourceRef` at all). Probed on a claim of a class nobody provisions; reports the
    /// scenario's skip when the field is dropped.
    pub async fn keeps_cross_namespace_data_sources(&self) -> bool {
        let claims = self.namespaced::<PersistentVolumeClaim>();
        let name = "cross-namespace-probe";
        let probe = serde_json::json!({"metadata": {"name": name}, "spec": {
            "storageClassName": format!("{}-probe", self.namespace),
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}},
            "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "source",
                "namespace": format!("{}-probe", self.namespace)}}});
        let created: PersistentVolumeClaim = self.create(&claims, probe).await;
        forget(&claims, name, &DeleteParams::default()).await;
        let kept = created
            .spec
            .and_then(|s| s.data_source_ref)
            .and_then(|r| r.namespace)
            .is_some();
        if !kept {
            report_skip(
                &self.scenario,
                "PersistentVolumeClaim spec.dataSourceRef.namespace not served (dropped: no CrossNamespaceVolumeDataSource in the API server)",
            );
        }
        kept
    }

    /// A pod affinity that keeps the scheduler on the scenario's nodes (a real cluster has
    /// other scenarios' nodes too).
    pub fn on_scenario_nodes(&self) -> serde_json::Value {
        serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                "operator": "In", "values": self.nodes}]}]}}})
    }

    /// Waits until the ServiceAccount admission plugin accepts pods in the new namespace (see
    /// [`kube_sim_harness::admits_pods`]), as any client creating a namespace must.
    async fn wait_for_pod_admission(&self) {
        self.eventually_async(
            "the namespace admitting pods (its default ServiceAccount)",
            || async {
                kube_sim_harness::admits_pods(&self.client, &self.namespace)
                    .await
                    .expect("reading the namespace's ServiceAccount")
            },
        )
        .await;
    }

    pub fn root(&self) -> PathBuf {
        self.root.path().to_path_buf()
    }

    pub fn kubelet(&self, node: &str) -> &Kubelet {
        self.kubelets
            .get(node)
            .unwrap_or_else(|| panic!("no kubelet for {node}"))
    }

    /// An API for a kind in the scenario's namespace.
    pub fn namespaced<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn cluster_scoped<K>(&self) -> Api<K>
    where
        K: Resource,
        K::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// Creates an object from JSON (in the scenario namespace when `namespaced`).
    pub async fn create<K>(&self, api: &Api<K>, value: serde_json::Value) -> K
    where
        K: Resource + Clone + Debug + DeserializeOwned + Serialize,
    {
        let object: K = object(value);
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|error| panic!("creating {}: {error}", object.name_any()))
    }

    /// Waits until `name` exists and satisfies `ready`; on timeout dumps the cluster and
    /// fails the scenario with `what`.
    pub async fn wait_for<K>(
        &self,
        api: &Api<K>,
        name: &str,
        what: &str,
        ready: impl Fn(&K) -> bool,
    ) -> K
    where
        K: Resource + Clone + Debug + DeserializeOwned,
    {
        let deadline = Instant::now() + step_timeout();
        let started = Instant::now();
        loop {
            if let Ok(Some(object)) = api.get_opt(name).await
                && ready(&object)
            {
                tracing::info!(%name, elapsed = ?started.elapsed(), "{what}");
                return object;
            }
            if Instant::now() > deadline {
                self.dump().await;
                panic!("timed out waiting for {what} ({name})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes `name` and waits until it is gone (finalizers done).
    pub async fn delete_and_wait<K>(&self, api: &Api<K>, name: &str, what: &str)
    where
        K: Resource + Clone + Debug + DeserializeOwned,
    {
        api.delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|error| panic!("deleting {name}: {error}"));
        self.wait_gone(api, name, what).await;
    }

    /// Waits until `name` is gone.
    pub async fn wait_gone<K>(&self, api: &Api<K>, name: &str, what: &str)
    where
        K: Resource + Clone + Debug + DeserializeOwned,
    {
        let deadline = Instant::now() + step_timeout();
        while api.get_opt(name).await.ok().flatten().is_some() {
            if Instant::now() > deadline {
                self.dump().await;
                panic!("timed out waiting for {what} ({name} still exists)");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `check` holds (for conditions that are not one object's state).
    pub async fn eventually(&self, what: &str, mut check: impl FnMut() -> bool) {
        self.eventually_async(what, || std::future::ready(check()))
            .await;
    }

    /// [`Cluster::eventually`] with a check that calls the API or the driver.
    pub async fn eventually_async<F>(&self, what: &str, mut check: impl FnMut() -> F)
    where
        F: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + step_timeout();
        while !check().await {
            if Instant::now() > deadline {
                self.dump().await;
                panic!("timed out waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for an Event of the scenario's namespace with `reason` about `object` whose
    /// message contains `text` (earlier attempts may have failed otherwise); returns it.
    pub async fn wait_for_event(&self, object: &str, reason: &str, text: &str) -> String {
        let deadline = Instant::now() + step_timeout();
        loop {
            let found = self
                .events()
                .await
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(object))
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.message)
                .find(|m| m.contains(text));
            if let Some(message) = found {
                return message;
            }
            if Instant::now() > deadline {
                self.dump().await;
                panic!("timed out waiting for a {reason} event about {object} with {text:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every Event of the test's namespace, as the API server lists them now.
    pub async fn events(&self) -> Vec<k8s_openapi::api::core::v1::Event> {
        self.namespaced::<k8s_openapi::api::core::v1::Event>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// Creates `<namespace>-<suffix>`, a class of the cluster's driver, and returns its name.
    pub async fn storage_class(
        &self,
        suffix: &str,
        binding: &str,
        reclaim: &str,
        parameters: serde_json::Value,
    ) -> String {
        let name = format!("{}-{suffix}", self.namespace);
        let class = serde_json::json!({"metadata": {"name": name}, "provisioner": self.driver_name,
            "reclaimPolicy": reclaim, "volumeBindingMode": binding, "parameters": parameters});
        self.create(
            &self.cluster_scoped::<k8s_openapi::api::storage::v1::StorageClass>(),
            class,
        )
        .await;
        name
    }

    /// The PersistentVolumes of the scenario's driver (a real cluster has other scenarios' too).
    pub async fn driver_pvs(&self) -> Vec<PersistentVolume> {
        let list = self
            .cluster_scoped::<PersistentVolume>()
            .list(&ListParams::default())
            .await
            .expect("listing PersistentVolumes");
        list.items
            .into_iter()
            .filter(|pv| of_driver(pv, &self.driver_name))
            .collect()
    }

    /// The claim UIDs in the provisioner's record of provisionings in flight (its Lease in
    /// the scenario's namespace; none before the first write).
    pub async fn in_flight(&self) -> Vec<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let name = csi_provisioner::inflight::lease_name(&self.driver_name, None);
        let lease = leases.get_opt(&name).await.expect("reading the record");
        let annotations = lease.map(|l| l.metadata.annotations.unwrap_or_default());
        let (entries, broken) =
            csi_provisioner::inflight::entries_of(&annotations.unwrap_or_default());
        assert!(broken.is_empty(), "unreadable entries: {broken:?}");
        entries.into_keys().collect()
    }

    /// Waits until the provisioner is done with every claim: its record of provisionings in
    /// flight empty (so no CreateVolume of a claim it still finishes can come), no volume at
    /// the driver and no PV of it.
    pub async fn wait_nothing_provisioned(&self, what: &str) {
        self.eventually_async(what, || async {
            self.in_flight().await.is_empty()
                && self.driver_volumes().await.is_empty()
                && self.driver_pvs().await.is_empty()
        })
        .await;
    }

    /// The volume ids the driver's controller lists.
    pub async fn driver_volumes(&self) -> Vec<String> {
        self.listed_volumes()
            .await
            .into_iter()
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect()
    }

    /// What the driver's controller lists (ListVolumes): each volume with its capacity and
    /// the nodes it is published to.
    pub async fn listed_volumes(&self) -> Vec<csi_proto::csi::v1::list_volumes_response::Entry> {
        self.driver
            .controller
            .csi
            .list_volumes(
                csi_proto::csi::v1::ListVolumesRequest::default(),
                Duration::from_secs(10),
            )
            .await
            .expect("ListVolumes")
            .entries
    }

    /// Runs csi-attacher's controller in this process against the driver's controller
    /// instance, with upstream's defaults (fast retries and reconcile for tests).
    pub async fn start_attacher(&self) -> Sidecar {
        self.start_attacher_via(self.driver.controller.csi.clone(), |_| {})
            .await
    }

    /// [`Cluster::start_attacher`] talking to the driver through `csi`, with changed settings.
    pub async fn start_attacher_via(
        &self,
        csi: csi_grpc::conn::CsiConnection,
        change: impl FnOnce(&mut csi_attacher::controller::Settings),
    ) -> Sidecar {
        self.start_attacher_as(self.component_client(rbac::ATTACHER), csi, change)
            .await
    }

    /// [`Cluster::start_attacher_via`] calling the API with `client` (another identity's, say:
    /// see [`Cluster::service_account_client`]).
    pub async fn start_attacher_as(
        &self,
        client: Client,
        csi: csi_grpc::conn::CsiConnection,
        change: impl FnOnce(&mut csi_attacher::controller::Settings),
    ) -> Sidecar {
        let settings = attacher_settings(&csi, change).await;
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = csi_attacher::controller::run(client, csi, settings, token).await {
                tracing::error!(%error, "csi-attacher stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// Runs csi-resizer's controller in this process against the driver's controller
    /// instance, with upstream's defaults and gates (fast retries for tests).
    pub async fn start_resizer(&self) -> Sidecar {
        let csi = self.driver.controller.csi.clone();
        let driver = discover_controller(&csi).await;
        // As the binary decides, with the VolumeAttributesClass gate at its default.
        let classes =
            csi_kinds::vac::support(true, false, csi_sidecar::vac::served(&self.client).await);
        let controllers = csi_resizer::run::Controllers::of(&driver, classes)
            .expect("the driver resizes or modifies");
        let settings = csi_resizer::controller::Settings {
            resizer: controllers.resize,
            driver_name: driver.name,
            timeout: Duration::from_secs(10),
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            workers: 10,
            resync: Duration::from_secs(600),
            handle_volume_in_use_error: true,
            recover: true,
            annotate_fs_resize: true,
            cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
                csi_sidecar::informers::SYNC_GRACE_PERIOD,
            ),
            modify: controllers
                .modify
                .then_some(csi_resizer::controller::ModifySettings {
                    extra_metadata: false,
                }),
            workqueues: Default::default(),
        };
        let client = self.component_client(rbac::RESIZER);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = csi_resizer::controller::run(client, csi, settings, token).await {
                tracing::error!(%error, "csi-resizer stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// Runs csi-health-monitor in this process against the driver's controller instance, with
    /// its chart RBAC, passes every `interval` (both modes) and the node watcher when asked;
    /// upstream's start-up checks first.
    pub async fn start_health_monitor(&self, interval: Duration, node_watcher: bool) -> Sidecar {
        let csi = self.driver.controller.csi.clone();
        let driver = discover_controller(&csi).await;
        assert!(
            csi_health_monitor::monitor::Source::of(
                &driver.controller,
                driver.volume_condition.controller
            )
            .is_some(),
            "the driver reports volume health"
        );
        let settings = csi_health_monitor::monitor::Settings {
            driver_name: driver.name,
            timeout: Duration::from_secs(10),
            list_interval: interval,
            monitor_interval: interval,
            workers: 10,
        };
        let client = self.component_client(rbac::HEALTH_MONITOR);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            let run = csi_health_monitor::run::monitor(
                client,
                csi,
                settings,
                node_watcher.then_some(interval),
                None,
                token,
            );
            if let Err(error) = run.await {
                tracing::error!(%error, "csi-health-monitor stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// Runs the csi-snapshotter sidecar in this process against the driver's controller
    /// instance, with upstream's defaults (fast retries for tests).
    pub async fn start_snapshotter(&self) -> Sidecar {
        self.start_snapshotter_via(self.driver.controller.csi.clone(), None)
            .await
    }

    /// [`Cluster::start_snapshotter`] talking to the driver through `csi`; with `node`, as a
    /// `--node-deployment` instance of that node (`NODE_NAME`).
    pub async fn start_snapshotter_via(
        &self,
        csi: csi_grpc::conn::CsiConnection,
        node: Option<String>,
    ) -> Sidecar {
        let driver = discover_controller(&csi).await;
        let settings = csi_snapshotter::sidecar::Settings {
            list_snapshots: driver.has_controller(
                csi_proto::csi::v1::controller_service_capability::rpc::Type::ListSnapshots,
            ),
            driver_name: driver.name,
            timeout: Duration::from_secs(10),
            snapshot_name_prefix: "snapshot".into(),
            snapshot_name_uuid_length: -1,
            group_snapshot_name_prefix: "groupsnapshot".into(),
            group_snapshot_name_uuid_length: -1,
            extra_create_metadata: false,
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            workers: 10,
            resync: Duration::from_secs(900),
            cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
                csi_sidecar::informers::SYNC_GRACE_PERIOD,
            ),
            workqueues: Default::default(),
            group_snapshots: true,
            node,
        };
        let client = self.component_client(rbac::SNAPSHOTTER);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = csi_snapshotter::sidecar::run(client, csi, settings, token).await {
                tracing::error!(%error, "csi-snapshotter stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// Runs cosi-controller in this process (fast retries).
    pub fn start_cosi_controller(&self) -> Sidecar {
        let settings = cosi::controller::Settings {
            workers: 10,
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(2),
            resync: Duration::from_secs(600),
            cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
                csi_sidecar::informers::SYNC_GRACE_PERIOD,
            ),
        };
        let client = self.component_client(rbac::COSI_CONTROLLER);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(cosi::controller::run(client, settings, token));
        Sidecar { shutdown, task }
    }

    /// Runs the cosi-provisioner sidecar in this process for the COSI driver behind `driver`
    /// (fast retries).
    pub async fn start_cosi_provisioner(&self, driver: &csi_grpc::conn::Endpoint) -> Sidecar {
        let csi = csi_grpc::conn::connect(
            driver,
            Duration::from_secs(10),
            csi_grpc::metrics::CsiOperationMetrics::unregistered(),
        )
        .await
        .expect("the COSI driver's socket");
        let name = csi
            .driver_get_info(
                csi_proto::cosi::v1alpha1::DriverGetInfoRequest {},
                Duration::from_secs(10),
            )
            .await
            .expect("DriverGetInfo")
            .name;
        let settings = cosi::sidecar::Settings {
            driver: name,
            workers: 10,
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(2),
            resync: Duration::from_secs(600),
            timeout: Duration::from_secs(30),
            cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
                csi_sidecar::informers::SYNC_GRACE_PERIOD,
            ),
        };
        let client = self.component_client(rbac::COSI_PROVISIONER);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(cosi::sidecar::run(client, csi, settings, token));
        Sidecar { shutdown, task }
    }

    /// Runs the snapshot-controller in this process, with upstream's defaults (fast retries).
    pub fn start_snapshot_controller(&self) -> Sidecar {
        self.start_snapshot_controller_as(self.component_client(rbac::SNAPSHOT_CONTROLLER))
    }

    /// [`Cluster::start_snapshot_controller`] calling the API with `client` (another
    /// identity's, say: see [`Cluster::service_account_client`]).
    pub fn start_snapshot_controller_as(&self, client: Client) -> Sidecar {
        self.start_snapshot_controller_configured(client, false)
    }

    /// [`Cluster::start_snapshot_controller_as`], with `--enable-distributed-snapshotting` when
    /// `distributed_snapshotting`.
    pub fn start_snapshot_controller_configured(
        &self,
        client: Client,
        distributed_snapshotting: bool,
    ) -> Sidecar {
        let settings = csi_snapshotter::common::Settings {
            prevent_volume_mode_conversion: true,
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(5),
            workers: 10,
            resync: Duration::from_secs(900),
            cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
                csi_sidecar::informers::SYNC_GRACE_PERIOD,
            ),
            metrics: Arc::new(csi_snapshotter::metrics::OperationMetrics::unregistered()),
            // The gate; fixtures::install_snapshot_crds installs the group CRDs with the others.
            group_snapshots: true,
            distributed_snapshotting,
        };
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = csi_snapshotter::common::run(client, settings, token).await {
                tracing::error!(%error, "snapshot-controller stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// Runs csi-provisioner's controller in this process against the driver's controller
    /// instance, with upstream's defaults (fast retries for tests).
    pub async fn start_provisioner(&self) -> Sidecar {
        self.start_provisioner_with(|_| {}).await
    }

    /// [`Cluster::start_provisioner`] with changed settings.
    pub async fn start_provisioner_with(
        &self,
        change: impl FnOnce(&mut csi_provisioner::controller::Settings),
    ) -> Sidecar {
        self.start_provisioner_via(self.driver.controller.csi.clone(), change)
            .await
    }

    /// Capacity tracking for the scenario's namespace, as the central deployment's; refreshes
    /// come from volume changes and failures, not from the (hour-long) poll.
    pub fn capacity_settings(
        &self,
        owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    ) -> csi_provisioner::capacity::controller::CapacitySettings {
        csi_provisioner::capacity::controller::CapacitySettings {
            client: self.component_client(rbac::PROVISIONER),
            namespace: self.namespace.clone(),
            owner,
            poll_interval: Duration::from_secs(3600),
            workers: 2,
            immediate_binding: false,
            default_fstype: String::new(),
            timeout: Duration::from_secs(10),
            retry_start: Duration::from_millis(200),
            retry_max: Duration::from_secs(2),
            metrics: Default::default(),
            refresh: Default::default(),
            managed_by: csi_provisioner::capacity::MANAGED_BY.to_string(),
            workqueue: None,
        }
    }

    /// The flags a component's binary run in this process (its `run::run`) needs to reach the
    /// cluster: on kube-sim a `--kubeconfig` written for it; on a real cluster none (the
    /// binaries read `KUBECONFIG`, as the scenarios do).
    pub fn kubeconfig_args(&self) -> Vec<String> {
        let Some(sim) = &self.sim else {
            return Vec::new();
        };
        let path = self.root().join("kubeconfig");
        std::fs::write(&path, kube_sim::cli::kubeconfig_yaml(sim.addr))
            .expect("writing the kubeconfig");
        vec![format!("--kubeconfig={}", path.display())]
    }

    /// A proxy in front of the driver's controller socket, and a connection through it.
    pub async fn csi_proxy(&self) -> (csi_proxy::CsiProxy, csi_grpc::conn::CsiConnection) {
        let socket = self
            .root()
            .join("sockets")
            .join(format!("proxy-{}.sock", scenario_id()));
        let proxy = csi_proxy::CsiProxy::start(&socket, self.driver.controller.endpoint.path());
        let endpoint = csi_grpc::conn::Endpoint::from_path(socket).expect("the proxy endpoint");
        let csi = csi_grpc::conn::connect(
            &endpoint,
            Duration::from_secs(10),
            csi_grpc::metrics::CsiOperationMetrics::unregistered(),
        )
        .await
        .expect("a connection through the proxy");
        (proxy, csi)
    }

    /// [`Cluster::start_provisioner_with`] talking to the driver through `csi`.
    pub async fn start_provisioner_via(
        &self,
        csi: csi_grpc::conn::CsiConnection,
        change: impl FnOnce(&mut csi_provisioner::controller::Settings),
    ) -> Sidecar {
        self.start_provisioner_as(self.component_client(rbac::PROVISIONER), csi, change)
            .await
    }

    /// [`Cluster::start_provisioner_via`] calling the API with `client` (another identity's,
    /// say: see [`Cluster::service_account_client`]).
    pub async fn start_provisioner_as(
        &self,
        client: Client,
        csi: csi_grpc::conn::CsiConnection,
        change: impl FnOnce(&mut csi_provisioner::controller::Settings),
    ) -> Sidecar {
        let settings = provisioner_settings(&self.client, &self.namespace, &csi, change).await;
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = csi_provisioner::controller::run(client, csi, settings, token).await
            {
                tracing::error!(%error, "csi-provisioner stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// A provisioner replica under leader election (as `--leader-election` runs it) on the
    /// driver-name Lease in the scenario's namespace, with short timings (lease 2 s).
    pub async fn start_provisioner_replica(
        &self,
        identity: &str,
        csi: csi_grpc::conn::CsiConnection,
    ) -> Sidecar {
        let settings = provisioner_settings(&self.client, &self.namespace, &csi, |_| {}).await;
        let client = self.component_client(rbac::PROVISIONER);
        let lease = self.driver_name.clone();
        self.elected(
            rbac::PROVISIONER,
            identity,
            &lease,
            move |leading| async move {
                if let Err(error) =
                    csi_provisioner::controller::run(client, csi, settings, leading).await
                {
                    tracing::error!(%error, "csi-provisioner stopped");
                }
            },
        )
    }

    /// Runs `work` as replica `identity` of `component` electing on the Lease `lease` in the
    /// scenario namespace (fast timings: a dead leader's Lease expires after 2 s).
    pub fn elected<W, F>(&self, component: &str, identity: &str, lease: &str, work: W) -> Sidecar
    where
        W: FnOnce(CancellationToken) -> F + Send + 'static,
        F: std::future::Future<Output = ()> + Send,
    {
        use csi_sidecar::leader::{
            self, LeaderElectionConfig, LeaderElectionTimings, LeaderStatus,
        };
        let timings = LeaderElectionTimings {
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(250),
        };
        let config = LeaderElectionConfig {
            lease_name: leader::sanitize_name(lease),
            namespace: self.namespace.clone(),
            identity: identity.to_string(),
            event_source: format!("{lease}/{identity}"),
            labels: BTreeMap::new(),
            timings,
            release_on_exit: false,
        };
        let shutdown = CancellationToken::new();
        let client = self.component_client(component);
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            let status = LeaderStatus::new(timings.lease_duration);
            if let Err(error) = leader::run(client, config, status, token, work).await {
                tracing::error!(%error, "replica stopped");
            }
        });
        Sidecar { shutdown, task }
    }

    /// Prints the scenario's objects: its namespace's, and the PVs, VolumeAttachments,
    /// CSINodes and Nodes of its driver and nodes (to the captured output of the failing test).
    pub async fn dump(&self) {
        eprintln!("===== cluster dump for namespace {} =====", self.namespace);
        dump_list::<Pod>(&self.namespaced(), |_| true).await;
        dump_list::<PersistentVolumeClaim>(&self.namespaced(), |_| true).await;
        dump_list::<k8s_openapi::api::core::v1::Event>(&self.namespaced(), |_| true).await;
        let driver = self.driver_name.as_str();
        dump_list::<PersistentVolume>(&self.cluster_scoped(), |pv| of_driver(pv, driver)).await;
        dump_list::<VolumeAttachment>(&self.cluster_scoped(), |va| va.spec.attacher == driver)
            .await;
        let ours = |name: String| self.nodes.contains(&name);
        dump_list::<CSINode>(&self.cluster_scoped(), |n| ours(n.name_any())).await;
        dump_list::<Node>(&self.cluster_scoped(), |n| ours(n.name_any())).await;
        eprintln!("===== end of dump =====");
    }

    /// Stops every task and the driver, then deletes everything the scenario made in the
    /// cluster (see [`Sweep`]); on kube-sim, fails on any request a component's chart RBAC
    /// would deny.
    pub async fn stop(mut self) {
        for kubelet in self.kubelets.values() {
            kubelet.stop().await;
        }
        self.shutdown.cancel();
        self.control_plane.join_all().await;
        for registration in self.registrations {
            registration.stop().await;
        }
        self.driver.stop().await;
        if let Some(sweep) = self.sweep_on_panic.0.take() {
            sweep.run(&self.client).await;
        }
        if let Some(sim) = &self.sim {
            let denied = rbac::denied(&sim.request_counts());
            assert!(
                denied.is_empty(),
                "requests the chart's RBAC does not allow:\n{}",
                denied.join("\n")
            );
        }
    }

    /// A client for `component`, built as the binaries build theirs (its User-Agent names it,
    /// so the API server counts its requests apart and [`rbac::denied`] can check them
    /// against the chart's rules).
    pub fn component_client(&self, component: &str) -> Client {
        csi_sidecar::kube::client_from_config(self.component_config(component), None)
            .expect("a client")
    }

    /// [`Cluster::component_client`] authenticating with the bearer `token` instead of the
    /// scenario's credentials (the cluster's address and the trust in its certificate stay).
    pub fn component_client_with_token(&self, component: &str, token: &str) -> Client {
        let mut config = self.component_config(component);
        config.auth_info = object(serde_json::json!({ "token": token }));
        csi_sidecar::kube::client_from_config(config, None).expect("a client")
    }

    /// What the reliability scenarios put their components through: every request 50 ms
    /// late, and the next three requests of each `(method, resource, status, Retry-After)`
    /// failed. Returns the faults, to cut watches and to check that all were met.
    pub fn slow_and_failing_api(
        &self,
        failures: &[(&str, &str, http::StatusCode, Option<u64>)],
    ) -> Faults {
        let faults = self.faults();
        faults.set_latency(Duration::from_millis(50));
        for &(method, resource, status, retry_after) in failures {
            faults.fail_next(method, resource, status, 3, retry_after);
        }
        faults
    }

    /// The API faults of the scenario's components: kube-sim's own, or on a real cluster
    /// those of the proxy between its components and the API server.
    pub fn faults(&self) -> Faults {
        match (&self.sim, &self.fault_proxy) {
            (Some(sim), _) => sim.faults(),
            (None, Some(proxy)) => proxy.faults(),
            (None, None) => panic!("API faults on a real cluster need Options::api_faults"),
        }
    }

    /// The requests of the scenario's components (on kube-sim, of every client), by client,
    /// verb and resource.
    pub fn request_counts(&self) -> RequestCounts {
        match (&self.sim, &self.fault_proxy) {
            (Some(sim), _) => sim.request_counts(),
            (None, Some(proxy)) => proxy.request_counts(),
            (None, None) => panic!("request counts on a real cluster need Options::api_faults"),
        }
    }

    fn component_config(&self, component: &str) -> kube::Config {
        let mut config = match &self.fault_proxy {
            Some(proxy) => proxy.config(),
            None => self.config.clone(),
        };
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(component).expect("a component name is a header value"),
        ));
        config
    }

    /// Has the cleanup (at [`Cluster::stop`], or when the scenario fails) delete `name`, an
    /// object the fixture does not otherwise find as the scenario's (in `namespace`, or
    /// cluster-scoped): the last one registered is deleted first.
    pub fn delete_at_cleanup<K>(&self, namespace: Option<&str>, name: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let Some(sweep) = &self.sweep_on_panic.0 else {
            return;
        };
        sweep
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Made {
                resource: ApiResource::erase::<K>(&()),
                namespace: namespace.map(str::to_string),
                name: name.to_string(),
            });
    }
}

/// An object a scenario made that its [`Sweep`] deletes by name.
#[derive(Clone, Debug)]
struct Made {
    resource: ApiResource,
    namespace: Option<String>,
    name: String,
}

/// Everything a scenario made in the cluster, found by its namespace, its driver's name and its
/// Nodes: deleted with the finalizers of its stopped components stripped, so a real cluster is
/// left as it was (pods are deleted at once, as their kubelets are gone).
#[derive(Clone)]
struct Sweep {
    config: kube::Config,
    namespace: String,
    driver_name: String,
    nodes: Vec<String>,
    /// What the scenario registered with [`Cluster::delete_at_cleanup`].
    made: Arc<Mutex<Vec<Made>>>,
}

impl Sweep {
    async fn run(&self, client: &Client) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(PoisonError::into_inner));
        for made in made.iter().rev() {
            let api: Api<DynamicObject> = match &made.namespace {
                Some(namespace) => Api::namespaced_with(client.clone(), namespace, &made.resource),
                None => Api::all_with(client.clone(), &made.resource),
            };
            forget(&api, &made.name, &now).await;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for pod in list.items {
                forget(&pods, &pod.name_any(), &now).await;
            }
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let _ = namespaces.delete(&self.namespace, &now).await;
        let driver = self.driver_name.as_str();
        let attachments: Api<VolumeAttachment> = Api::all(client.clone());
        if let Ok(list) = attachments.list(&ListParams::default()).await {
            for attachment in list.items.iter().filter(|a| a.spec.attacher == driver) {
                forget(&attachments, &attachment.name_any(), &now).await;
            }
        }
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        if let Ok(list) = volumes.list(&ListParams::default()).await {
            for pv in list.items.iter().filter(|pv| of_driver(pv, driver)) {
                forget(&volumes, &pv.name_any(), &now).await;
            }
        }
        let classes: Api<StorageClass> = Api::all(client.clone());
        if let Ok(list) = classes.list(&ListParams::default()).await {
            for class in list.items.iter().filter(|c| c.provisioner == driver) {
                forget(&classes, &class.name_any(), &now).await;
            }
        }
        forget(&Api::<CSIDriver>::all(client.clone()), driver, &now).await;
        for node in &self.nodes {
            forget(&Api::<CSINode>::all(client.clone()), node, &now).await;
            forget(&Api::<Node>::all(client.clone()), node, &now).await;
        }
    }
}

/// Whether `pv` is a volume of `driver`.
fn of_driver(pv: &PersistentVolume, driver: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|spec| spec.csi.as_ref())
        .is_some_and(|csi| csi.driver == driver)
}

/// Deletes `name` and strips the finalizers it still has (their controllers are stopped).
async fn forget<K>(api: &Api<K>, name: &str, params: &DeleteParams)
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    match api.delete(name, params).await {
        Ok(either) if either.is_left() => {
            let strip = serde_json::json!({"metadata": {"finalizers": null}});
            let _ = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&strip))
                .await;
        }
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => tracing::warn!(%name, %error, "cleanup failed"),
    }
}

/// Runs the [`Sweep`] of a scenario that panicked before [`Cluster::stop`] (real clusters only:
/// kube-sim goes away with the scenario).
struct SweepOnDrop(Option<Sweep>);

impl Drop for SweepOnDrop {
    fn drop(&mut self) {
        let Some(sweep) = self.0.take() else { return };
        if !real_cluster() {
            return;
        }
        // The scenario's runtime is unwinding: the sweep gets a runtime and a client of its own.
        let swept = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup");
            runtime.block_on(async {
                match Client::try_from(sweep.config.clone()) {
                    Ok(client) => sweep.run(&client).await,
                    Err(error) => eprintln!("cleanup of {} failed: {error}", sweep.namespace),
                }
            });
        });
        let _ = swept.join();
    }
}

/// A scenario's id: six random hex digits (short, so socket paths with it stay under 108 bytes).
fn scenario_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:06x}", hasher.finish() & 0xff_ffff)
}

/// The scenario's Node for one of [`Options::nodes`].
pub fn scenario_node_name(node: &str, id: &str) -> String {
    format!("{node}-{id}")
}

/// The scenario's driver: `id` joined to the first label of `driver`
/// (`hostpath.csi-suite.io` → `hostpath-<id>.csi-suite.io`).
pub fn scenario_driver_name(driver: &str, id: &str) -> String {
    match driver.split_once('.') {
        Some((first, rest)) => format!("{first}-{id}.{rest}"),
        None => format!("{driver}-{id}"),
    }
}

/// A sidecar's controller running in this process.
#[derive(Debug)]
pub struct Sidecar {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sidecar {
    /// Drops the controller at whatever await point it is — in-flight CSI calls and API
    /// writes included — as a SIGKILL would.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

async fn dump_list<K>(api: &Api<K>, shown: impl Fn(&K) -> bool)
where
    K: Resource + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).into_owned();
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            for item in list.items.into_iter().filter(|item| shown(item)) {
                let text = serde_json::to_string_pretty(&item).unwrap_or_default();
                eprintln!("--- {kind} {}\n{text}", item.name_any());
            }
        }
        Err(error) => eprintln!("--- {kind}: cannot list: {error}"),
    }
}

/// A typed object from JSON; panics with the reason on a malformed fixture.
pub fn object<K: DeserializeOwned>(value: serde_json::Value) -> K {
    serde_json::from_value(value).unwrap_or_else(|error| panic!("fixture object: {error}"))
}

/// Where scenario roots go: short, so Unix socket paths stay under the 108-byte limit.
fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from("/tmp/csi-scenarios");
    std::fs::create_dir_all(&dir).expect("the scratch directory");
    dir
}

/// csi-provisioner's settings for scenarios: upstream's defaults with fast retries, after
/// discovering the driver behind `csi` and, as the binary does, whether `client`'s server
/// serves VolumeAttributesClasses.
async fn provisioner_settings(
    client: &Client,
    namespace: &str,
    csi: &csi_grpc::conn::CsiConnection,
    change: impl FnOnce(&mut csi_provisioner::controller::Settings),
) -> csi_provisioner::controller::Settings {
    let driver = discover_controller(csi).await;
    let mut settings = csi_provisioner::controller::Settings {
        driver,
        volume_name_prefix: "pvc".to_string(),
        volume_name_uuid_length: -1,
        default_fstype: String::new(),
        extra_create_metadata: false,
        strict_topology: false,
        immediate_topology: true,
        controller_publish_readonly: false,
        timeout: Duration::from_secs(10),
        retry_start: Duration::from_millis(200),
        retry_max: Duration::from_secs(5),
        workers: 16,
        cloning_protection_workers: 1,
        topology: true,
        metrics: Default::default(),
        cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
            csi_sidecar::informers::SYNC_GRACE_PERIOD,
        ),
        resync: Duration::from_secs(5),
        prevent_volume_mode_conversion: true,
        snapshot_orphan_sweep_interval: Duration::from_secs(1),
        capacity: None,
        volume_attributes_classes: csi_sidecar::vac::discover(
            client,
            csi_provisioner::vac::GATE.default,
            false,
        )
        .await,
        cross_namespace_data_sources: csi_provisioner::grants::GATE.default,
        node_deployment: None,
        // As the leader election Lease of the replicas.
        inflight_namespace: namespace.to_string(),
    };
    change(&mut settings);
    settings
}

/// csi-attacher's settings for scenarios: upstream's defaults with fast retries and a fast
/// reconcile, after discovering the driver behind `csi`.
async fn attacher_settings(
    csi: &csi_grpc::conn::CsiConnection,
    change: impl FnOnce(&mut csi_attacher::controller::Settings),
) -> csi_attacher::controller::Settings {
    let driver = discover_controller(csi).await;
    let mut settings = csi_attacher::controller::Settings {
        support: csi_attacher::attach::DriverSupport::of(&driver),
        driver_name: driver.name,
        default_fstype: String::new(),
        timeout: Duration::from_secs(10),
        retry_start: Duration::from_millis(200),
        retry_max: Duration::from_secs(5),
        workers: 10,
        resync: Duration::from_secs(600),
        reconcile_sync: Duration::from_secs(1),
        max_entries: 0,
        attach_error_codes: true,
        metrics: Default::default(),
        cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
            csi_sidecar::informers::SYNC_GRACE_PERIOD,
        ),
    };
    change(&mut settings);
    settings
}

/// The driver behind `csi`, as a controller sidecar discovers it.
async fn discover_controller(csi: &csi_grpc::conn::CsiConnection) -> csi_grpc::conn::DriverInfo {
    let services = csi_grpc::conn::Services::CONTROLLER;
    csi_grpc::conn::DriverInfo::discover(csi, Duration::from_secs(10), services)
        .await
        .expect("driver discovery")
}

//! Startup as external-provisioner does it (cmd/csi-provisioner): Kubernetes client, CSI
//! connection (bounded wait, Probe until ready, exit on loss), driver discovery, metrics and
//! health on `--http-endpoint`, then the controller — under leader election when asked (the
//! Lease is the driver name, sanitized; losing it exits).

use csi_grpc::conn::Services;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1::NodeGetInfoRequest;
use csi_proto::csi::v1::controller_service_capability::rpc::Type as ControllerCapability;
use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use csi_sidecar::startup::StartupError;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::capacity::controller::{CapacityMetrics, CapacitySettings};
use crate::controller::{self, ProvisionerError, Settings};
use crate::flags::ProvisionerArgs;
use crate::gates::{RELEASE_ON_EXIT_GATE, TOPOLOGY};
use crate::node_deployment::NodeDeployment;
use crate::{grants, vac};

/// Upstream's claim resync period.
const RESYNC: std::time::Duration = std::time::Duration::from_secs(15 * 60);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("the driver has no controller service; csi-provisioner needs CREATE_DELETE_VOLUME")]
    NoControllerService,
    #[error(transparent)]
    Provisioner(#[from] ProvisionerError),
    #[error("--enable-capacity: the driver does not support GetCapacity (GET_CAPACITY)")]
    NoGetCapacity,
    #[error("--enable-capacity needs the {0} environment variable (set it from the downward API)")]
    MissingEnv(&'static str),
    #[error("The NODE_NAME environment variable must be set when using --node-deployment.")]
    MissingNodeName,
    #[error("Failed to get node info from CSI driver: {0}")]
    NodeInfo(String),
    #[error("--enable-capacity: finding the owner of CSIStorageCapacity objects: {0}")]
    CapacityOwner(#[from] crate::capacity::owner::OwnerError),
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn run(args: ProvisionerArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let gates = args.gates().map_err(StartupError::FeatureGates)?;
    gates.log_warnings();
    // Checked before anything connects, as upstream.
    let node_name = std::env::var("NODE_NAME").unwrap_or_default();
    if args.node_deployment && node_name.is_empty() {
        return Err(RunError::MissingNodeName);
    }
    let config = csi_sidecar::kube::config_with_master(&sidecar.kube, &args.master).await?;
    let rate_limit = csi_sidecar::kube::RateLimit::from_flags(
        sidecar.kube.kube_api_qps,
        sidecar.kube.kube_api_burst,
    );
    let capacity_client = args
        .enable_capacity
        .then(|| {
            let limit = csi_sidecar::kube::RateLimit::from_flags(
                args.kube_api_capacity_qps,
                args.kube_api_capacity_burst,
            );
            csi_sidecar::kube::client_from_config(config.clone(), limit)
        })
        .transpose()?;
    let client = csi_sidecar::kube::client_from_config(config, rate_limit)?;
    let volume_attributes_classes = csi_sidecar::vac::discover(
        &client,
        gates.get(vac::GATE),
        sidecar.feature_gates().contains_key(vac::GATE.name),
    )
    .await;

    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register_with_migration(&mut registry);
    let provisioner_metrics = crate::metrics::ProvisionerMetrics::register(&mut registry);
    let capacity_metrics = args
        .enable_capacity
        .then(|| CapacityMetrics::register(&mut registry));
    let services = Services::CONTROLLER;
    let (csi, driver) = csi_sidecar::startup::connect_driver(
        &sidecar.csi,
        metrics,
        services,
        csi_grpc::conn::StartupOrder::ProbeThenName,
    )
    .await?;
    if !driver.plugin.controller_service {
        return Err(RunError::NoControllerService);
    }
    let node_deployment = if args.node_deployment {
        Some(node_deployment(&args, &csi, node_name).await?)
    } else {
        None
    };
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar,
        registry,
        csi_sidecar::startup::GoRegistries::Legacy,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;

    let capacity = match (capacity_client, capacity_metrics) {
        (Some(client), Some(metrics)) => {
            if !driver.has_controller(ControllerCapability::GetCapacity) {
                return Err(RunError::NoGetCapacity);
            }
            let queue = provisioner_metrics.workqueues.queue("csistoragecapacity");
            Some(capacity_settings(&args, client, metrics, queue, node_deployment.as_ref()).await?)
        }
        _ => None,
    };
    let settings = Settings {
        volume_name_prefix: args.volume_name_prefix.clone(),
        volume_name_uuid_length: args.volume_name_uuid_length,
        default_fstype: args.default_fstype.clone(),
        extra_create_metadata: args.extra_create_metadata,
        strict_topology: args.strict_topology,
        immediate_topology: args.immediate_topology,
        controller_publish_readonly: args.controller_publish_readonly,
        timeout: sidecar.csi.timeout,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        cloning_protection_workers: usize::try_from(args.cloning_protection_threads)
            .unwrap_or(usize::MAX),
        topology: gates.get(TOPOLOGY),
        metrics: provisioner_metrics,
        cache_sync,
        resync: RESYNC,
        prevent_volume_mode_conversion: args.prevent_volume_mode_conversion,
        snapshot_orphan_sweep_interval: args.snapshot_orphan_sweep_interval,
        capacity,
        driver: driver.clone(),
        volume_attributes_classes,
        cross_namespace_data_sources: gates.get(grants::GATE),
        node_deployment,
        inflight_namespace: sidecar
            .leader_election
            .config(&driver.name, false)
            .namespace,
    };
    let release = gates.get(RELEASE_ON_EXIT_GATE);
    let lock_name = driver.name.clone();
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        &lock_name,
        release,
        status,
        shutdown,
        |token| controller::run(work_client, csi, settings, token),
    )
    .await??;
    Ok(())
}

/// Who this node's instance is: `NODE_NAME` and the driver's NodeGetInfo (its topology).
async fn node_deployment(
    args: &ProvisionerArgs,
    csi: &csi_grpc::conn::CsiConnection,
    node_name: String,
) -> Result<NodeDeployment, RunError> {
    let info = csi
        .node_get_info(NodeGetInfoRequest {}, args.sidecar.csi.timeout)
        .await
        .map_err(|status| RunError::NodeInfo(status.message().to_string()))?;
    let segments = info
        .accessible_topology
        .map(|t| t.segments.into_iter().collect())
        .unwrap_or_default();
    let deployment = NodeDeployment {
        node_name,
        segments,
        immediate_binding: args.node_deployment_immediate_binding,
        base_delay: args.node_deployment_base_delay,
        max_delay: args.node_deployment_max_delay,
    };
    tracing::info!(node = %deployment.node_name, node_id = %info.node_id, segments = ?deployment.segments, "using local topology");
    Ok(deployment)
}

/// Capacity tracking's settings: the objects live in `NAMESPACE`, owned (unless
/// `--capacity-ownerref-level` is negative) by the owner found from `POD_NAME`, as upstream.
async fn capacity_settings(
    args: &ProvisionerArgs,
    client: kube::Client,
    metrics: CapacityMetrics,
    workqueue: csi_sidecar::workqueue_metrics::QueueMetrics,
    node_deployment: Option<&NodeDeployment>,
) -> Result<CapacitySettings, RunError> {
    let env = |name: &'static str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or(RunError::MissingEnv(name))
    };
    let namespace = env("NAMESPACE")?;
    let owner = match u32::try_from(args.capacity_ownerref_level) {
        Ok(level) => {
            let pod = env("POD_NAME")?;
            let owner = crate::capacity::owner::find(&client, &namespace, &pod, level).await?;
            tracing::info!(kind = %owner.kind, name = %owner.name, "CSIStorageCapacity objects are owned by");
            Some(owner)
        }
        Err(_) => None,
    };
    let sidecar = &args.sidecar;
    Ok(CapacitySettings {
        client,
        namespace,
        owner,
        poll_interval: args.capacity_poll_interval,
        workers: usize::try_from(args.capacity_threads).unwrap_or(1),
        immediate_binding: args.capacity_for_immediate_binding,
        default_fstype: args.default_fstype.clone(),
        timeout: sidecar.csi.timeout,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        metrics,
        refresh: Default::default(),
        managed_by: node_deployment.map_or_else(
            || crate::capacity::MANAGED_BY.to_string(),
            |nd| crate::capacity::node_managed_by(&nd.node_name),
        ),
        workqueue: Some(workqueue),
    })
}

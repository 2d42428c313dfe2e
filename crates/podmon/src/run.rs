//! Startup: Kubernetes client, the driver's socket (bounded wait, Probe until ready, exit on
//! loss), its name and capabilities, metrics and /healthz on `--http-endpoint`; then
//! controller mode (elected, Lease `podmon-<driver>`; it probes for the podmon extension) or
//! node mode.

use csi_sidecar::startup::StartupError;
use std::path::PathBuf;
use std::time::Duration;

use csi_grpc::conn::Services;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1 as csi;
use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, LiveConfig, Tunables};
use crate::controller::{self, ControllerError, Settings};
use crate::flags::{Mode, PodmonArgs};
use crate::metrics::PodmonMetrics;
use crate::node::{self, NodeError, NodeSettings};

/// How often the dynamic configuration file is checked for changes.
const CONFIG_RELOAD_PERIOD: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Controller(#[from] ControllerError),
    #[error(transparent)]
    Node(#[from] NodeError),
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn run(args: PodmonArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let client = csi_sidecar::kube::client(&args.sidecar.kube).await?;
    let mut sidecar = args.sidecar.clone();
    sidecar.csi.csi_address = args.csi_address().to_string();
    sidecar.leader_election.leader_election = args.elects();

    let mut registry = Registry::default();
    let csi_metrics = CsiOperationMetrics::register(&mut registry);
    let metrics = PodmonMetrics::register(&mut registry);
    let services = Services {
        plugin: true,
        controller: args.mode != Mode::Node,
        node: args.mode == Mode::Node,
    };
    let (csi, driver) = csi_sidecar::startup::connect_driver(
        &sidecar.csi,
        csi_metrics,
        services,
        csi_grpc::conn::StartupOrder::ProbeThenName,
    )
    .await?;
    let driver_name = args
        .configured_driver_name()
        .unwrap_or(&driver.name)
        .to_string();
    let label_value = if args.label_value.is_empty() {
        driver_name.clone()
    } else {
        args.label_value.clone()
    };
    if args.mode == Mode::Node {
        // No informer-sync check: node-podmon of a node cut off from the API server works on
        // from its persisted inventory, and a restart by its liveness probe would not help.
        csi_sidecar::startup::serve_http(
            &sidecar,
            registry,
            csi_sidecar::startup::GoRegistries::Legacy,
            shutdown.clone(),
        )
        .await?;
        let state_file = if args.state_file.is_empty() {
            args.kubelet_dir
                .join("plugins")
                .join(&driver_name)
                .join("podmon-node-state.json")
        } else {
            PathBuf::from(&args.state_file)
        };
        let settings = NodeSettings {
            node_name: args.node_name.clone(),
            driver_name,
            label_key: args.label_key.clone(),
            label_value,
            kubelet_dir: args.kubelet_dir.clone(),
            state_file,
            poll_interval: args.node_poll_interval,
            stage_unstage: driver
                .has_node(csi::node_service_capability::rpc::Type::StageUnstageVolume),
            ignore_volumeless_pods: args.ignore_volumeless_pods,
            out_of_service_taint: args.out_of_service_taint,
            timeout: sidecar.csi.timeout,
            metrics,
        };
        node::run(client, csi, settings, shutdown).await?;
        return Ok(());
    }

    let base = Tunables {
        poll_rate: Duration::from_secs(args.array_connectivity_poll_rate),
        loss_threshold: args.array_connectivity_connection_loss_threshold,
        skip_validation: args.skip_array_connection_validation,
        maintenance: false,
        max_evacuated_fraction: args.max_evacuated_fraction,
    };
    let live = if args.driver_config_params.is_empty() {
        LiveConfig::fixed(base)
    } else {
        LiveConfig::load(
            base,
            args.driver_config_params.as_ref(),
            CONFIG_RELOAD_PERIOD,
            shutdown.clone(),
        )?
    };
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        &sidecar,
        registry,
        csi_sidecar::startup::GoRegistries::Legacy,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;
    let settings = Settings {
        driver_name: driver_name.clone(),
        label_key: args.label_key.clone(),
        label_value,
        driver_pod_label: (args.mode == Mode::Controller).then(|| {
            (
                args.driver_pod_label_key.clone(),
                args.driver_pod_label_value.clone(),
            )
        }),
        poll_connectivity: args.mode == Mode::Controller,
        can_fence: driver
            .has_controller(csi::controller_service_capability::rpc::Type::PublishUnpublishVolume),
        ignore_volumeless_pods: args.ignore_volumeless_pods,
        out_of_service_taint: args.out_of_service_taint,
        timeout: sidecar.csi.timeout,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        metrics,
        cache_sync,
    };
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        &sidecar,
        &crate::plan::lease_name(&driver_name),
        false,
        status,
        shutdown,
        |token| controller::run(work_client, csi, settings, live, token),
    )
    .await??;
    Ok(())
}

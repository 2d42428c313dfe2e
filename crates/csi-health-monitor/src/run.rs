//! Startup as external-health-monitor-controller does it: Kubernetes client, CSI connection
//! (bounded wait, Probe until ready, exit on loss), driver discovery — a driver without the
//! controller service, or reporting volume health in neither generation, exits as upstream's
//! does (with the reason said) — metrics and health on `--http-endpoint`, then the monitor
//! (and the node watcher with `--enable-node-watcher`), under leader election on the Lease
//! `external-health-monitor-leader-<driver>` when asked (losing it exits).

use csi_sidecar::startup::StartupError;
use std::sync::Arc;
use std::time::Duration;

use csi_grpc::conn::{CsiConnection, Services};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_kinds::cached::CachedVolume;
use csi_sidecar::events::EventRecorder;
use csi_sidecar::informers::{CacheSyncHealth, Informers, SYNC_GRACE_PERIOD, keep_pod_volumes};
use csi_sidecar::leader::RELEASE_ON_EXIT_GATE;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::flags::HealthMonitorArgs;
use crate::monitor::{Monitor, MonitorError, Settings, Source, component};
use crate::watcher::{NodeWatcher, keep_ready_condition};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Monitor(#[from] MonitorError),
    #[error("the CSI driver {0} has no controller service: there is no volume health to monitor")]
    NoControllerService(String),
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn run(args: HealthMonitorArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let gates = csi_sidecar::feature_gates::resolve_feature_gates(
        &sidecar.feature_gates(),
        &[RELEASE_ON_EXIT_GATE],
    )
    .map_err(StartupError::FeatureGates)?;
    let client = csi_sidecar::kube::client(&sidecar.kube).await?;

    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register(&mut registry);
    let (csi, driver) = csi_sidecar::startup::connect_driver(
        &sidecar.csi,
        metrics,
        Services::CONTROLLER,
        csi_grpc::conn::StartupOrder::ProbeThenName,
    )
    .await?;
    if !driver.plugin.controller_service {
        return Err(RunError::NoControllerService(driver.name));
    }
    if Source::of(&driver.controller, driver.volume_condition.controller).is_none() {
        return Err(MonitorError::NoVolumeHealth.into());
    }
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar,
        registry,
        csi_sidecar::startup::GoRegistries::ManagerThenLegacy,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;
    let settings = Settings {
        driver_name: driver.name.clone(),
        timeout: sidecar.csi.timeout,
        list_interval: args.list_volumes_interval,
        monitor_interval: args.monitor_interval,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
    };
    let node_watcher = args
        .enable_node_watcher
        .then_some(args.node_list_add_interval);
    let lock_name = format!("external-health-monitor-leader-{}", driver.name);
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        &lock_name,
        gates.get(RELEASE_ON_EXIT_GATE),
        status,
        shutdown,
        |token| {
            monitor(
                work_client,
                csi,
                settings,
                node_watcher,
                Some(cache_sync),
                token,
            )
        },
    )
    .await??;
    Ok(())
}

/// What runs while leading: the monitor, and with `node_watcher` (its
/// `--node-list-add-interval`) the node watcher, until `shutdown`; their caches report to
/// `cache_sync` (the sidecar's `/healthz`) when given.
pub async fn monitor(
    client: Client,
    csi: CsiConnection,
    settings: Settings,
    node_watcher: Option<Duration>,
    cache_sync: Option<Arc<CacheSyncHealth>>,
    shutdown: CancellationToken,
) -> Result<(), MonitorError> {
    let informers = |client: &Client| {
        let informers = Informers::new(client, &shutdown);
        match &cache_sync {
            Some(health) => informers.reporting_to(health),
            None => informers,
        }
    };
    let mut volumes = informers(&client);
    let pvs = volumes.all::<CachedVolume>();
    let events = Arc::new(EventRecorder::new(
        client.clone(),
        component(&settings.driver_name),
        "",
    ));
    // The watcher stops with the monitor, whatever ended the monitor.
    let stop_watcher = shutdown.child_token();
    let watcher = match node_watcher {
        Some(interval) => {
            let mut watched = informers(&client);
            let nodes = watched.all_lean(keep_ready_condition);
            let pods = watched.all_lean(keep_pod_volumes);
            let watcher = NodeWatcher {
                nodes,
                pods,
                pvs: pvs.clone(),
                events: events.clone(),
                driver_name: settings.driver_name.clone(),
                interval,
                wake: watched.wake(),
            };
            watched.synced().await;
            Some(tokio::spawn(watcher.run(stop_watcher.clone())))
        }
        None => None,
    };
    volumes.synced().await;
    let outcome = match Monitor::new(&client, csi, pvs, events, settings).await {
        Ok(monitor) => monitor.run(shutdown.clone()).await,
        Err(error) => Err(error),
    };
    stop_watcher.cancel();
    if let Some(watcher) = watcher {
        let _ = watcher.await;
    }
    outcome
}

//! Startup as external-attacher does it (cmd/csi-attacher): Kubernetes client, CSI connection
//! (bounded wait, Probe until ready, exit on loss), driver discovery — no controller service or
//! no PUBLISH_UNPUBLISH_VOLUME makes the attacher trivial — metrics and health on
//! `--http-endpoint`, then the controller, under leader election on the Lease
//! `external-attacher-leader-<driver>` when asked (losing it exits).

use csi_grpc::conn::Services;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_sidecar::feature_gates::{FeatureGate, Stage};
use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use csi_sidecar::leader::RELEASE_ON_EXIT_GATE;
use csi_sidecar::startup::StartupError;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::attach::DriverSupport;
use crate::controller::{self, AttacherError, AttacherMetrics, Settings};
use crate::flags::AttacherArgs;

/// GA upstream (default on): `attachError.errorCode` carries the gRPC code of a failed attach.
pub const ERROR_CODE_GATE: FeatureGate = FeatureGate {
    name: "MutableCSINodeAllocatableCount",
    default: true,
    stage: Stage::Ga,
    locked: false,
};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Attacher(#[from] AttacherError),
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn run(args: AttacherArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let gates = csi_sidecar::feature_gates::resolve_feature_gates(
        &sidecar.feature_gates(),
        &[RELEASE_ON_EXIT_GATE, ERROR_CODE_GATE],
    )
    .map_err(StartupError::FeatureGates)?;
    let gate = |gate: FeatureGate| gates.get(gate);
    let client = csi_sidecar::kube::client(&sidecar.kube).await?;

    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register_with_migration(&mut registry);
    let attacher_metrics = AttacherMetrics::register(&mut registry);
    let services = Services::CONTROLLER;
    let (csi, driver) = csi_sidecar::startup::connect_driver(
        &sidecar.csi,
        metrics,
        services,
        csi_grpc::conn::StartupOrder::ProbeThenName,
    )
    .await?;
    let csi = csi.with_max_log_length(
        usize::try_from(args.max_grpc_log_length)
            .ok()
            .filter(|n| *n > 0),
    );
    let support = DriverSupport::of(&driver);
    if !support.publish_unpublish {
        tracing::info!(driver = %driver.name, "the driver does not publish volumes: VolumeAttachments are marked attached without calling it");
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
        support,
        default_fstype: args.default_fstype.clone(),
        timeout: sidecar.csi.timeout,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        resync: args.resync,
        reconcile_sync: args.reconcile_sync,
        max_entries: args.max_entries,
        attach_error_codes: gate(ERROR_CODE_GATE),
        metrics: attacher_metrics,
        cache_sync,
    };
    let lock_name = format!("external-attacher-leader-{}", driver.name);
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        &lock_name,
        gate(RELEASE_ON_EXIT_GATE),
        status,
        shutdown,
        |token| controller::run(work_client, csi, settings, token),
    )
    .await??;
    Ok(())
}

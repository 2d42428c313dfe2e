//! Startup of cosi-controller and cosi-provisioner: Kubernetes client, (the sidecar) the
//! driver's socket and its name from DriverGetInfo, metrics and health on `--http-endpoint`
//! (`/healthz` fails while a cache has no initial list, e.g. before the COSI CRDs are
//! installed), then the controller under leader election on upstream's Lease.

use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use csi_sidecar::startup::StartupError;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use csi_grpc::conn::Endpoint;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::cosi::v1alpha1 as proto;
use csi_sidecar::leader::sanitize_name;

use crate::controller::{self, Settings};
use crate::flags::{ControllerArgs, ProvisionerArgs};
use crate::sidecar;

/// Upstream's Lease: `leader-lock/cosi-controller-manager`, sanitized.
pub const CONTROLLER_LEASE: &str = "leader-lock-cosi-controller-manager";

/// The sidecar's Lease, as upstream names it: `<driver>/cosi`, sanitized.
pub fn sidecar_lease(driver: &str) -> String {
    sanitize_name(&format!("{driver}/cosi"))
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("DriverGetInfo: {}", csi_grpc::conn::GoStatus(.0))]
    DriverInfo(tonic::Status),
    #[error("DriverGetInfo returned an empty driver name")]
    NoDriverName,
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn provisioner(
    args: ProvisionerArgs,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let sidecar_args = &args.sidecar;
    let client = csi_sidecar::kube::client(&sidecar_args.kube).await?;
    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register(&mut registry);
    let endpoint = Endpoint::parse(&args.driver_addr)?;
    let driver = csi_grpc::conn::connect(
        &endpoint,
        csi_grpc::conn::DEFAULT_CONNECT_WAIT,
        metrics.clone(),
    )
    .await?;
    driver.exit_on_loss();
    let name = driver
        .driver_get_info(proto::DriverGetInfoRequest {}, sidecar_args.csi.timeout)
        .await
        .map_err(RunError::DriverInfo)?
        .name;
    if name.is_empty() {
        return Err(RunError::NoDriverName);
    }
    metrics.set_driver_name(&name);
    tracing::info!(driver = %name, "detected COSI driver");
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar_args,
        registry,
        csi_sidecar::startup::GoRegistries::Legacy,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;
    let settings = sidecar::Settings {
        driver: name.clone(),
        workers: usize::try_from(sidecar_args.workers.worker_threads).unwrap_or(usize::MAX),
        retry_start: sidecar_args.workers.retry_interval_start,
        retry_max: sidecar_args.workers.retry_interval_max,
        resync: args.resync_period,
        timeout: sidecar_args.csi.timeout,
        cache_sync,
    };
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar_args,
        &sidecar_lease(&name),
        false,
        status,
        shutdown,
        |token| async move {
            sidecar::run(work_client, driver, settings, token).await;
            Ok::<(), RunError>(())
        },
    )
    .await??;
    Ok(())
}

pub async fn controller(args: ControllerArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let client = csi_sidecar::kube::client(&sidecar.kube).await?;
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar,
        Registry::default(),
        csi_sidecar::startup::GoRegistries::Legacy,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;
    let settings = Settings {
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        resync: args.resync_period,
        cache_sync,
    };
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        CONTROLLER_LEASE,
        false,
        status,
        shutdown,
        |token| async move {
            controller::run(work_client, settings, token).await;
            Ok::<(), RunError>(())
        },
    )
    .await??;
    Ok(())
}

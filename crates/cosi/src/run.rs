//! Startup of cosi-controller: Kubernetes client, metrics and health on `--http-endpoint`
//! (`/healthz` fails while a cache has no initial list, e.g. before the COSI CRDs are
//! installed), then the controller under leader election on upstream's Lease.

use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use csi_sidecar::kube::KubeClientError;
use csi_sidecar::leader::LeaderElectionError;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::controller::{self, Settings};
use crate::flags::ControllerArgs;

/// Upstream's Lease: `leader-lock/cosi-controller-manager`, sanitized.
pub const CONTROLLER_LEASE: &str = "leader-lock-cosi-controller-manager";

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Kube(#[from] KubeClientError),
    #[error(transparent)]
    Http(#[from] csi_sidecar::http::HttpError),
    #[error(transparent)]
    LeaderElection(#[from] LeaderElectionError),
}

pub async fn controller(args: ControllerArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let client = csi_sidecar::kube::client(&sidecar.kube).await?;
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar,
        Registry::default(),
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

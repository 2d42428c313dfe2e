//! Startup of both binaries, as external-snapshotter's `cmd/` does it.
//!
//! csi-snapshotter: with `--node-deployment`, its node from `NODE_NAME` (exit 1 without it or
//! with `--leader-election`); Kubernetes client, CSI connection (bounded wait, Probe until
//! ready, exit on loss), driver discovery — a driver without CREATE_DELETE_SNAPSHOT is an error
//! (exit 1) — metrics and health on `--http-endpoint`, then the sidecar controller, under
//! leader election on the Lease `external-snapshotter-leader-<driver>` (sanitized) when asked.
//!
//! snapshot-controller: Kubernetes client, a wait (with backoff up to
//! `--retry-crd-interval-max`) until the snapshot CRDs are served, metrics and health, then the
//! controller, under leader election on the Lease `snapshot-controller-leader`. With the
//! CSIVolumeGroupSnapshot gate both serve volume group snapshots where the cluster serves the
//! group API ([`crate::group_api`]).

use csi_sidecar::startup::StartupError;
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::{CsiConnection, GoStatus, Services};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1 as csi;
use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use csi_sidecar::leader::{RELEASE_ON_EXIT_GATE, sanitize_name};
use csi_sidecar::workqueue_metrics::WorkqueueMetrics;
use kube::api::{Api, ListParams};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::common::{self, ControllerError};
use crate::distributed::NODE_NAME_ENV;
use crate::flags::{ControllerArgs, NodeDeploymentError, SnapshotterArgs, VOLUME_GROUP_SNAPSHOT};
use crate::metrics::OperationMetrics;
use crate::sidecar::{self, SidecarError};
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};

/// The snapshot-controller's Lease.
pub const CONTROLLER_LEASE: &str = "snapshot-controller-leader";

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("CSI driver {0} does not support ControllerCreateSnapshot")]
    NoSnapshots(String),
    #[error("the snapshot CRDs are not served ({0}); install them (manifests/crds) and retry")]
    NoCrds(String),
    #[error(transparent)]
    NodeDeployment(#[from] NodeDeploymentError),
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    #[error(transparent)]
    Controller(#[from] ControllerError),
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn sidecar(args: SnapshotterArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let gates = args.gates().map_err(StartupError::FeatureGates)?;
    gates.log_warnings();
    // Checked before anything connects, as upstream.
    let node = args.deployment_node(std::env::var(NODE_NAME_ENV).ok().as_deref())?;
    let client = client(sidecar).await?;
    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register(&mut registry);
    let workqueues = WorkqueueMetrics::register(&mut registry);
    let services = Services {
        plugin: false,
        controller: true,
        node: false,
    };
    let (csi, driver) = csi_sidecar::startup::connect_driver(
        &sidecar.csi,
        metrics,
        services,
        csi_grpc::conn::StartupOrder::NameThenProbe,
    )
    .await?;
    if !driver.has_controller(ControllerCapability::CreateDeleteSnapshot) {
        return Err(RunError::NoSnapshots(driver.name));
    }
    let group_snapshots = gates.get(VOLUME_GROUP_SNAPSHOT);
    if group_snapshots {
        warn_without_group_capability(&csi, &driver.name, sidecar.csi.timeout).await;
    }
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar,
        registry,
        csi_sidecar::startup::GoRegistries::ManagerThenLegacy,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;
    let settings = sidecar::Settings {
        driver_name: driver.name.clone(),
        timeout: sidecar.csi.timeout,
        snapshot_name_prefix: args.snapshot_name_prefix.clone(),
        snapshot_name_uuid_length: args.snapshot_name_uuid_length,
        group_snapshot_name_prefix: args.group_snapshot_name_prefix.clone(),
        group_snapshot_name_uuid_length: args.group_snapshot_name_uuid_length,
        extra_create_metadata: args.extra_create_metadata,
        list_snapshots: driver.has_controller(ControllerCapability::ListSnapshots),
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        resync: args.resync_period,
        cache_sync,
        workqueues,
        group_snapshots,
        node,
    };
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        &lease_name(&driver.name),
        gates.get(RELEASE_ON_EXIT_GATE),
        status,
        shutdown,
        |token| sidecar::run(work_client, csi, settings, token),
    )
    .await??;
    Ok(())
}

pub async fn controller(args: ControllerArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let gates = args.gates().map_err(StartupError::FeatureGates)?;
    gates.log_warnings();
    let client = client(sidecar).await?;
    wait_for_crds(&client, args.retry_crd_interval_max, &shutdown).await?;
    let mut registry = Registry::default();
    let metrics = std::sync::Arc::new(OperationMetrics::register(&mut registry));
    let (status, cache_sync) = csi_sidecar::startup::serve_http_with_caches(
        sidecar,
        registry,
        csi_sidecar::startup::GoRegistries::Manager,
        SYNC_GRACE_PERIOD,
        shutdown.clone(),
    )
    .await?;
    let settings = common::Settings {
        prevent_volume_mode_conversion: args.prevent_volume_mode_conversion,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        resync: args.resync_period,
        cache_sync,
        metrics,
        group_snapshots: gates.get(VOLUME_GROUP_SNAPSHOT),
        distributed_snapshotting: args.enable_distributed_snapshotting,
    };
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        CONTROLLER_LEASE,
        gates.get(RELEASE_ON_EXIT_GATE),
        status,
        shutdown,
        |token| common::run(work_client, settings, token),
    )
    .await??;
    Ok(())
}

async fn client(sidecar: &csi_sidecar::flags::SidecarArgs) -> Result<kube::Client, RunError> {
    Ok(csi_sidecar::kube::client(&sidecar.kube).await?)
}

/// Lists each snapshot kind until all are served, waiting 100 ms, then 1.5 times longer each
/// time up to `max`, for about ten tries (upstream `ensureCustomResourceDefinitionsExist`).
async fn wait_for_crds(
    client: &kube::Client,
    max: Duration,
    shutdown: &CancellationToken,
) -> Result<(), RunError> {
    let mut wait = Duration::from_millis(100);
    let mut last = String::new();
    for _ in 0..10 {
        let one = ListParams::default().limit(1);
        let checks = [
            (
                "volumesnapshotclasses",
                Api::<VolumeSnapshotClass>::all(client.clone())
                    .list_metadata(&one)
                    .await
                    .err(),
            ),
            (
                "volumesnapshotcontents",
                Api::<VolumeSnapshotContent>::all(client.clone())
                    .list_metadata(&one)
                    .await
                    .err(),
            ),
            (
                "volumesnapshots",
                Api::<VolumeSnapshot>::all(client.clone())
                    .list_metadata(&one)
                    .await
                    .err(),
            ),
        ];
        let failing: Vec<String> = checks
            .into_iter()
            .filter_map(|(kind, error)| Some(format!("{kind}: {}", error?)))
            .collect();
        if failing.is_empty() {
            return Ok(());
        }
        last = failing.join("; ");
        tracing::warn!(missing = %last, ?wait, "waiting for the snapshot CRDs");
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
        wait = wait.mul_f64(1.5).min(max);
    }
    Err(RunError::NoCrds(last))
}

/// Upstream's warning when the driver lacks CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT. The group
/// controller runs all the same, as upstream's: a group content of this driver then carries the
/// driver's refusal in its status and Events, rather than waiting in silence.
async fn warn_without_group_capability(csi: &CsiConnection, driver: &str, timeout: Duration) {
    use csi::group_controller_service_capability::{Type, rpc::Type as Rpc};
    let served = csi
        .group_controller_get_capabilities(
            csi::GroupControllerGetCapabilitiesRequest::default(),
            timeout,
        )
        .await
        .map(|response| {
            response.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(Type::Rpc(rpc))
                    if rpc.r#type == Rpc::CreateDeleteGetVolumeGroupSnapshot as i32)
            })
        });
    match served {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "CSI driver {driver} does not support GroupControllerCreateVolumeGroupSnapshot when the --feature-gates=CSIVolumeGroupSnapshot=true flag is set"
        ),
        Err(status) => tracing::warn!(
            "error determining if driver supports create/delete group snapshot operations: {}",
            GoStatus(&status)
        ),
    }
}

/// `external-snapshotter-leader-` and the sanitized driver name.
pub fn lease_name(driver: &str) -> String {
    format!("external-snapshotter-leader-{}", sanitize_name(driver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_upstream_ones() {
        assert_eq!(
            lease_name("hostpath.csi.k8s.io"),
            "external-snapshotter-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(
            lease_name("odd_driver."),
            "external-snapshotter-leader-odd-driver-X"
        );
        assert_eq!(CONTROLLER_LEASE, "snapshot-controller-leader");
    }
}

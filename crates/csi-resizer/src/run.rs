//! Startup as external-resizer does it (cmd/csi-resizer): Kubernetes client (`--master`
//! overrides the server), CSI connection (bounded wait, Probe until ready, exit on loss), driver
//! discovery — no controller service is an error; no EXPAND_VOLUME controller capability but
//! node EXPAND_VOLUME makes the resizer "trivial"; neither is an error — metrics and health on
//! `--http-endpoint`, then the controller, under leader election on the Lease
//! `external-resizer-<driver>` (sanitized) when asked (losing it exits).
//!
//! ControllerModifyVolume for VolumeAttributesClass changes runs when the driver has
//! MODIFY_VOLUME, the `VolumeAttributesClass` gate is on and the server serves the v1 classes (a
//! gate left at its default is turned off otherwise, as upstream). A driver that can modify but
//! not expand is refused: this csi-resizer runs the modify controller beside the resize
//! controller only.

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::{Services, node_capabilities};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1 as csi;
use csi_sidecar::informers::SYNC_GRACE_PERIOD;
use csi_sidecar::leader::{RELEASE_ON_EXIT_GATE, sanitize_name};
use csi_sidecar::startup::StartupError;
use csi_sidecar::workqueue_metrics::WorkqueueMetrics;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::controller::{self, ModifySettings, ResizerError, Settings};
use crate::flags::{
    ANNOTATE_FS_RESIZE, RECOVER_VOLUME_EXPANSION_FAILURE, ResizerArgs, VOLUME_ATTRIBUTES_CLASS,
};
use crate::resize::{Resizer, SupportError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("failed to check if plugin supports node resize: {0}")]
    NodeCapabilities(tonic::Status),
    #[error("Failed to create CSI resizer: {0}")]
    Support(SupportError),
    #[error(
        "CSI driver supports only volume modification (MODIFY_VOLUME), not expansion: this csi-resizer runs modification only beside expansion"
    )]
    ModifyOnly,
    #[error(transparent)]
    Resizer(#[from] ResizerError),
}

csi_sidecar::startup_error_conversions!(RunError);

pub async fn run(args: ResizerArgs, shutdown: CancellationToken) -> Result<(), RunError> {
    let sidecar = &args.sidecar;
    let gates = args.gates().map_err(StartupError::FeatureGates)?;
    gates.log_warnings();
    let client = csi_sidecar::kube::client_with_master(&sidecar.kube, &args.master).await?;

    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register_with_migration(&mut registry);
    let workqueues = WorkqueueMetrics::register(&mut registry);
    let services = Services::CONTROLLER;
    let (csi, mut driver) = csi_sidecar::startup::connect_driver(
        &sidecar.csi,
        metrics,
        services,
        csi_grpc::conn::StartupOrder::NamedByCaller,
    )
    .await?;
    // Upstream asks the node service only when the controller cannot expand.
    if driver.plugin.controller_service
        && !driver.has_controller(ControllerCapability::ExpandVolume)
    {
        let response = csi
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}, sidecar.csi.timeout)
            .await
            .map_err(RunError::NodeCapabilities)?;
        driver.node = node_capabilities(&response);
    }
    csi.metrics().set_driver_name(&driver.name);
    let modifies = driver.has_controller(ControllerCapability::ModifyVolume);
    let resizer = match Resizer::of(&driver) {
        Ok(resizer) => resizer,
        Err(SupportError::NoExpansion) if modifies => return Err(RunError::ModifyOnly),
        Err(error) => return Err(RunError::Support(error)),
    };
    if resizer == Resizer::NodeOnly {
        tracing::info!(driver = %driver.name, "The CSI driver supports node resize only, using trivial resizer to handle resize requests");
    }
    let modify = if modifies {
        let support = csi_sidecar::vac::discover(
            &client,
            gates.get(VOLUME_ATTRIBUTES_CLASS),
            sidecar
                .feature_gates()
                .contains_key(VOLUME_ATTRIBUTES_CLASS.name),
        )
        .await;
        (support == csi_kinds::vac::Support::Served).then_some(ModifySettings {
            extra_metadata: args.extra_modify_metadata,
        })
    } else {
        None
    };
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
        resizer,
        timeout: sidecar.csi.timeout,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        resync: args.resync_period,
        handle_volume_in_use_error: args.handle_volume_inuse_error,
        recover: gates.get(RECOVER_VOLUME_EXPANSION_FAILURE),
        annotate_fs_resize: gates.get(ANNOTATE_FS_RESIZE),
        cache_sync,
        modify,
        workqueues,
    };
    let lock_name = lease_name(&driver.name);
    let work_client = client.clone();
    csi_sidecar::startup::run_controller(
        client,
        sidecar,
        &lock_name,
        gates.get(RELEASE_ON_EXIT_GATE),
        status,
        shutdown,
        |token| controller::run(work_client, csi, settings, token),
    )
    .await??;
    Ok(())
}

/// `external-resizer-` and the driver name with every character outside `[a-zA-Z0-9-]`
/// replaced by `-` and an `X` appended after a trailing `-` (upstream `util.SanitizeName`).
pub fn lease_name(driver: &str) -> String {
    format!("external-resizer-{}", sanitize_name(driver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_sanitized_as_upstream() {
        for (driver, expected) in [
            ("ebs.csi.aws.com", "external-resizer-ebs-csi-aws-com"),
            (
                "hostpath.csi.k8s.io",
                "external-resizer-hostpath-csi-k8s-io",
            ),
            ("odd_driver.", "external-resizer-odd-driver-X"),
            ("plain-name", "external-resizer-plain-name"),
        ] {
            assert_eq!(lease_name(driver), expected, "{driver}");
        }
    }
}

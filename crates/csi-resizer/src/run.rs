//! Startup as external-resizer does it (cmd/csi-resizer): Kubernetes client (`--master`
//! overrides the server), CSI connection (bounded wait, Probe until ready, exit on loss), driver
//! discovery, metrics and health on `--http-endpoint`, then the controllers, under leader
//! election on the Lease `external-resizer-<driver>` (sanitized) when asked (losing it exits).
//!
//! Which controllers run is [`Controllers::of`]: the resize controller for a driver that
//! expands (EXPAND_VOLUME, or node EXPAND_VOLUME only: the "trivial" resizer), the modify
//! controller (ControllerModifyVolume for VolumeAttributesClass changes) for a driver with
//! MODIFY_VOLUME while the `VolumeAttributesClass` gate is on and the server serves the v1
//! classes (a gate left at its default is turned off otherwise, as upstream). A driver that
//! only modifies gets the modify controller alone; with the gate off it gets none and the
//! process stays up idle, as upstream's does. No controller service, or neither expansion nor
//! modification, is an error.

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::{DriverInfo, Services, node_capabilities};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_kinds::vac::Support;
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
    #[error(transparent)]
    Unsupported(#[from] UnsupportedError),
    #[error(transparent)]
    Resizer(#[from] ResizerError),
}

/// A driver csi-resizer has nothing to run for (upstream exits with these messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnsupportedError {
    #[error("Failed to create CSI resizer: {0}")]
    Resizer(SupportError),
    #[error("CSI driver does not support resize nor modify")]
    NeitherResizeNorModify,
}

/// The controllers that run for a driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controllers {
    /// The resize controller and how the driver expands; `None`: the driver cannot expand and
    /// nothing acts on a claim asking for more.
    pub resize: Option<Resizer>,
    /// The modify controller.
    pub modify: bool,
}

impl Controllers {
    /// From the driver's capabilities (`driver.node` holding its node capabilities when it has
    /// no EXPAND_VOLUME controller capability) and the VolumeAttributesClass gate after
    /// discovery (asked only of a driver that can modify).
    pub fn of(driver: &DriverInfo, classes: Support) -> Result<Self, UnsupportedError> {
        let modifies = driver.has_controller(ControllerCapability::ModifyVolume);
        let resize = match Resizer::of(driver) {
            Ok(resizer) => Some(resizer),
            Err(SupportError::NoExpansion) if modifies => None,
            Err(SupportError::NoExpansion) => {
                return Err(UnsupportedError::NeitherResizeNorModify);
            }
            Err(error) => return Err(UnsupportedError::Resizer(error)),
        };
        Ok(Self {
            resize,
            modify: modifies && classes == Support::Served,
        })
    }
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
    let classes = if modifies {
        csi_sidecar::vac::discover(
            &client,
            gates.get(VOLUME_ATTRIBUTES_CLASS),
            sidecar
                .feature_gates()
                .contains_key(VOLUME_ATTRIBUTES_CLASS.name),
        )
        .await
    } else {
        tracing::info!(driver = %driver.name, "Modify not supported: CSI driver does not support controller modify");
        Support::Disabled
    };
    let controllers = Controllers::of(&driver, classes)?;
    match controllers.resize {
        None => {
            tracing::info!(driver = %driver.name, "Resize not supported: {}", SupportError::NoExpansion);
        }
        Some(Resizer::NodeOnly) => {
            tracing::info!(driver = %driver.name, "The CSI driver supports node resize only, using trivial resizer to handle resize requests");
        }
        Some(Resizer::Controller { .. }) => {}
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
        resizer: controllers.resize,
        timeout: sidecar.csi.timeout,
        retry_start: sidecar.workers.retry_interval_start,
        retry_max: sidecar.workers.retry_interval_max,
        workers: usize::try_from(sidecar.workers.worker_threads).unwrap_or(usize::MAX),
        resync: args.resync_period,
        handle_volume_in_use_error: args.handle_volume_inuse_error,
        recover: gates.get(RECOVER_VOLUME_EXPANSION_FAILURE),
        annotate_fs_resize: gates.get(ANNOTATE_FS_RESIZE),
        cache_sync,
        modify: controllers.modify.then_some(ModifySettings {
            extra_metadata: args.extra_modify_metadata,
        }),
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
    use csi::node_service_capability::rpc::Type as NodeCapability;

    fn driver(
        controller_service: bool,
        controller: &[ControllerCapability],
        node: &[NodeCapability],
    ) -> DriverInfo {
        let mut driver = DriverInfo {
            controller: controller.iter().copied().collect(),
            node: node.iter().copied().collect(),
            ..DriverInfo::default()
        };
        driver.plugin.controller_service = controller_service;
        driver
    }

    #[test]
    fn the_controllers_follow_the_drivers_capabilities_and_the_class_gate() {
        use ControllerCapability::{ExpandVolume, ModifyVolume, SingleNodeMultiWriter};
        use Support::{Disabled, NotServed, Served};
        let controller = Some(Resizer::Controller {
            single_node_multi_writer: false,
        });
        let run = |resize, modify| Ok(Controllers { resize, modify });
        let node_expand = [NodeCapability::ExpandVolume];
        let table = [
            (
                "expands",
                driver(true, &[ExpandVolume], &[]),
                Served,
                run(controller, false),
            ),
            (
                "expands, single-node multi-writer",
                driver(true, &[ExpandVolume, SingleNodeMultiWriter], &[]),
                Served,
                run(
                    Some(Resizer::Controller {
                        single_node_multi_writer: true,
                    }),
                    false,
                ),
            ),
            (
                "expands on the node only",
                driver(true, &[], &node_expand),
                Served,
                run(Some(Resizer::NodeOnly), false),
            ),
            (
                "expands and modifies, classes served",
                driver(true, &[ExpandVolume, ModifyVolume], &[]),
                Served,
                run(controller, true),
            ),
            (
                "expands and modifies, gate off",
                driver(true, &[ExpandVolume, ModifyVolume], &[]),
                Disabled,
                run(controller, false),
            ),
            (
                "expands and modifies, gate on but classes not served",
                driver(true, &[ExpandVolume, ModifyVolume], &[]),
                NotServed,
                run(controller, false),
            ),
            (
                "node expansion and modification",
                driver(true, &[ModifyVolume], &node_expand),
                Served,
                run(Some(Resizer::NodeOnly), true),
            ),
            (
                "modifies only, classes served: the modify controller alone",
                driver(true, &[ModifyVolume], &[]),
                Served,
                run(None, true),
            ),
            (
                "modifies only, gate off: nothing runs, no error",
                driver(true, &[ModifyVolume], &[]),
                Disabled,
                run(None, false),
            ),
            (
                "modifies only, classes not served",
                driver(true, &[ModifyVolume], &[]),
                NotServed,
                run(None, false),
            ),
            (
                "neither expands nor modifies",
                driver(true, &[], &[]),
                Served,
                Err(UnsupportedError::NeitherResizeNorModify),
            ),
            (
                "no controller service",
                driver(false, &[ExpandVolume, ModifyVolume], &node_expand),
                Served,
                Err(UnsupportedError::Resizer(SupportError::NoControllerService)),
            ),
        ];
        for (case, driver, classes, expected) in table {
            assert_eq!(Controllers::of(&driver, classes), expected, "{case}");
        }
    }

    #[test]
    fn a_driver_with_nothing_to_run_gets_upstreams_messages() {
        assert_eq!(
            UnsupportedError::NeitherResizeNorModify.to_string(),
            "CSI driver does not support resize nor modify"
        );
        assert_eq!(
            UnsupportedError::Resizer(SupportError::NoControllerService).to_string(),
            "Failed to create CSI resizer: CSI driver does not support controller service"
        );
    }

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

//! What a driver is and can do, discovered once at startup: GetPluginInfo, then the plugin,
//! controller and node capabilities its sidecar asks for.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi::node_service_capability::rpc::Type as NodeCapability;
use csi::plugin_capability::service::Type as ServiceType;
use csi::plugin_capability::volume_expansion::Type as ExpansionType;
use csi_proto::csi::v1 as csi;

use super::{ConnError, CsiConnection};

/// Which capabilities to ask for beyond GetPluginInfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Services {
    /// Ask GetPluginCapabilities (every upstream sidecar does but csi-snapshotter).
    pub plugin: bool,
    /// Ask ControllerGetCapabilities: when the plugin advertises CONTROLLER_SERVICE or, with
    /// plugin capabilities not asked, always (csi-snapshotter asks a driver that does not
    /// advertise the service, as upstream).
    pub controller: bool,
    /// Ask NodeGetCapabilities (node sidecars only: controller-only drivers need not serve it).
    pub node: bool,
}

impl Services {
    /// A controller sidecar's: plugin capabilities, then the controller's if advertised.
    pub const CONTROLLER: Self = Self {
        plugin: true,
        controller: true,
        node: false,
    };
}

/// Plugin capabilities from GetPluginCapabilities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginCapabilities {
    pub controller_service: bool,
    pub volume_accessibility_constraints: bool,
    pub group_controller_service: bool,
    pub snapshot_metadata_service: bool,
    /// SNAPSHOT_ACCESSIBILITY_CONSTRAINTS (alpha, CSI v1.13): snapshots carry a topology.
    pub snapshot_accessibility_constraints: bool,
    pub online_expansion: bool,
    pub offline_expansion: bool,
}

/// A driver's identity and capabilities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub vendor_version: String,
    pub manifest: BTreeMap<String, String>,
    pub plugin: PluginCapabilities,
    pub controller: BTreeSet<ControllerCapability>,
    pub node: BTreeSet<NodeCapability>,
    /// The alpha VOLUME_CONDITION capabilities of CSI v1.0-v1.12, which v1.13 removed: the
    /// driver fills `volume_condition`, read with the `legacy_*` calls (feature `v1-12`).
    pub volume_condition: VolumeConditionSupport,
}

/// Where a driver of the VolumeCondition generation reports conditions. v1.13 reserved the
/// two capability values, so the generated enums no longer name them and
/// [`controller_capabilities`] / [`node_capabilities`] skip them as unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeConditionSupport {
    /// Controller VOLUME_CONDITION: in ListVolumes and ControllerGetVolume.
    pub controller: bool,
    /// Node VOLUME_CONDITION: in NodeGetVolumeStats.
    pub node: bool,
}

/// The controller capability VOLUME_CONDITION of CSI v1.0-v1.12 (reserved since v1.13).
pub const LEGACY_CONTROLLER_VOLUME_CONDITION: i32 = 11;

/// The node capability VOLUME_CONDITION of CSI v1.0-v1.12 (reserved since v1.13).
pub const LEGACY_NODE_VOLUME_CONDITION: i32 = 4;

/// Where upstream's binary names the driver in its CSI call metrics among its start-up calls,
/// and so the `driver_name` label those calls' samples carry (`unknown-driver` before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupOrder {
    /// Probe until ready, GetPluginInfo, the name, capabilities (csi-provisioner,
    /// csi-attacher; podmon).
    ProbeThenName,
    /// GetPluginInfo, the name, Probe until ready, capabilities (csi-snapshotter).
    NameThenProbe,
    /// Probe until ready, GetPluginInfo, capabilities; the caller names the driver after its
    /// own start-up calls (csi-resizer, whose resizer and modifier ask before its main sets
    /// the name). A driver whose calls carry `migrated` is named after GetPluginInfo and
    /// probed again, as upstream's second connection.
    NamedByCaller,
}

impl DriverInfo {
    /// Asks the driver, naming it in the metrics once its name is known. Every call uses
    /// `timeout`; any failure is final (upstream exits: these quick calls are not retried).
    pub async fn discover(
        connection: &CsiConnection,
        timeout: Duration,
        services: Services,
    ) -> Result<Self, ConnError> {
        let driver = Self::identify(connection, timeout).await?;
        connection.metrics().set_driver_name(&driver.name);
        driver
            .with_capabilities(connection, timeout, services)
            .await
    }

    /// Waits for the driver to be ready and discovers it, in upstream's `order`.
    pub async fn start(
        connection: &CsiConnection,
        timeout: Duration,
        services: Services,
        order: StartupOrder,
    ) -> Result<Self, ConnError> {
        match order {
            StartupOrder::ProbeThenName => {
                connection.probe_until_ready(timeout).await?;
                Self::discover(connection, timeout, services).await
            }
            StartupOrder::NameThenProbe => {
                let driver = Self::identify(connection, timeout).await?;
                connection.metrics().set_driver_name(&driver.name);
                connection.probe_until_ready(timeout).await?;
                driver
                    .with_capabilities(connection, timeout, services)
                    .await
            }
            StartupOrder::NamedByCaller => {
                connection.probe_until_ready(timeout).await?;
                let driver = Self::identify(connection, timeout).await?;
                if connection.metrics().labels_migration_of(&driver.name) {
                    // Upstream's resizer reconnects to a driver that replaces an in-tree
                    // plugin with a metrics manager named from the start: it probes again,
                    // and its capability calls carry the name.
                    connection.metrics().set_driver_name(&driver.name);
                    connection.probe_until_ready(timeout).await?;
                }
                driver
                    .with_capabilities(connection, timeout, services)
                    .await
            }
        }
    }

    /// GetPluginInfo: the name (never empty), version and manifest.
    async fn identify(connection: &CsiConnection, timeout: Duration) -> Result<Self, ConnError> {
        let info = connection
            .get_plugin_info(csi::GetPluginInfoRequest {}, timeout)
            .await
            .map_err(|status| ConnError::Call {
                method: "GetPluginInfo",
                status,
            })?;
        if info.name.is_empty() {
            return Err(ConnError::EmptyDriverName);
        }
        Ok(Self {
            name: info.name,
            vendor_version: info.vendor_version,
            manifest: info.manifest.into_iter().collect(),
            ..Self::default()
        })
    }

    /// The capabilities of the `services` asked for.
    async fn with_capabilities(
        mut self,
        connection: &CsiConnection,
        timeout: Duration,
        services: Services,
    ) -> Result<Self, ConnError> {
        let failed = |method| move |status| ConnError::Call { method, status };
        if services.plugin {
            let plugin_capabilities = connection
                .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}, timeout)
                .await
                .map_err(failed("GetPluginCapabilities"))?;
            self.plugin = PluginCapabilities::from_response(&plugin_capabilities);
        }
        if services.controller && (self.plugin.controller_service || !services.plugin) {
            let response = connection
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}, timeout)
                .await
                .map_err(failed("ControllerGetCapabilities"))?;
            self.controller = controller_capabilities(&response);
            self.volume_condition.controller = controller_volume_condition(&response);
        }
        if services.node {
            let response = connection
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}, timeout)
                .await
                .map_err(failed("NodeGetCapabilities"))?;
            self.node = node_capabilities(&response);
            self.volume_condition.node = node_volume_condition(&response);
        }
        tracing::info!(
            driver = %self.name,
            version = %self.vendor_version,
            plugin = ?self.plugin,
            controller = ?self.controller,
            node = ?self.node,
            volume_condition = ?self.volume_condition,
            "discovered CSI driver"
        );
        Ok(self)
    }

    pub fn has_controller(&self, capability: ControllerCapability) -> bool {
        self.controller.contains(&capability)
    }

    pub fn has_node(&self, capability: NodeCapability) -> bool {
        self.node.contains(&capability)
    }
}

impl PluginCapabilities {
    pub fn from_response(response: &csi::GetPluginCapabilitiesResponse) -> Self {
        use csi::plugin_capability::Type;
        let mut capabilities = Self::default();
        for capability in &response.capabilities {
            match &capability.r#type {
                Some(Type::Service(service)) => match ServiceType::try_from(service.r#type) {
                    Ok(ServiceType::ControllerService) => capabilities.controller_service = true,
                    Ok(ServiceType::VolumeAccessibilityConstraints) => {
                        capabilities.volume_accessibility_constraints = true;
                    }
                    Ok(ServiceType::GroupControllerService) => {
                        capabilities.group_controller_service = true;
                    }
                    Ok(ServiceType::SnapshotMetadataService) => {
                        capabilities.snapshot_metadata_service = true;
                    }
                    Ok(ServiceType::SnapshotAccessibilityConstraints) => {
                        capabilities.snapshot_accessibility_constraints = true;
                    }
                    Ok(ServiceType::Unknown) | Err(_) => {
                        tracing::debug!(
                            value = service.r#type,
                            "ignoring unknown plugin service capability"
                        );
                    }
                },
                Some(Type::VolumeExpansion(expansion)) => {
                    match ExpansionType::try_from(expansion.r#type) {
                        Ok(ExpansionType::Online) => capabilities.online_expansion = true,
                        Ok(ExpansionType::Offline) => capabilities.offline_expansion = true,
                        Ok(ExpansionType::Unknown) | Err(_) => {
                            tracing::debug!(
                                value = expansion.r#type,
                                "ignoring unknown volume expansion capability"
                            );
                        }
                    }
                }
                None => {}
            }
        }
        capabilities
    }
}

/// The known controller capabilities in a response (unknown values are skipped: a newer
/// driver may advertise RPCs this build does not know).
pub fn controller_capabilities(
    response: &csi::ControllerGetCapabilitiesResponse,
) -> BTreeSet<ControllerCapability> {
    use csi::controller_service_capability::Type;
    response
        .capabilities
        .iter()
        .filter_map(|capability| match &capability.r#type {
            Some(Type::Rpc(rpc)) => ControllerCapability::try_from(rpc.r#type).ok(),
            None => None,
        })
        .filter(|capability| *capability != ControllerCapability::Unknown)
        .collect()
}

/// The known node capabilities in a response.
pub fn node_capabilities(response: &csi::NodeGetCapabilitiesResponse) -> BTreeSet<NodeCapability> {
    use csi::node_service_capability::Type;
    response
        .capabilities
        .iter()
        .filter_map(|capability| match &capability.r#type {
            Some(Type::Rpc(rpc)) => NodeCapability::try_from(rpc.r#type).ok(),
            None => None,
        })
        .filter(|capability| *capability != NodeCapability::Unknown)
        .collect()
}

/// Whether a controller advertises VOLUME_CONDITION (value 11, CSI v1.0-v1.12).
pub fn controller_volume_condition(response: &csi::ControllerGetCapabilitiesResponse) -> bool {
    use csi::controller_service_capability::Type;
    response.capabilities.iter().any(|capability| {
        matches!(&capability.r#type, Some(Type::Rpc(rpc)) if rpc.r#type == LEGACY_CONTROLLER_VOLUME_CONDITION)
    })
}

/// Whether a node advertises VOLUME_CONDITION (value 4, CSI v1.0-v1.12).
pub fn node_volume_condition(response: &csi::NodeGetCapabilitiesResponse) -> bool {
    use csi::node_service_capability::Type;
    response.capabilities.iter().any(|capability| {
        matches!(&capability.r#type, Some(Type::Rpc(rpc)) if rpc.r#type == LEGACY_NODE_VOLUME_CONDITION)
    })
}

//! The CSI Identity service and the podmon connectivity extension.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use csi::identity_server::Identity;
use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
use csi_proto::csi::v1 as csi;
use csi_proto::podmon::v1 as podmon_v1;
use podmon_v1::podmon_server::Podmon;
use tonic::{Request, Response, Status};

use crate::data;
use crate::driver::Driver;
use crate::error::DriverError;
use crate::state::Phase;

/// A node whose instance has not beaten for this long is not connected.
pub const HEARTBEAT_STALE: Duration = Duration::from_secs(2);

/// Window for `ios_in_progress` when the request gives none.
pub const DEFAULT_IO_SAMPLE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct IdentityService {
    driver: Arc<Driver>,
}

impl IdentityService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.driver.config.driver_name.clone(),
            vendor_version: self.driver.config.vendor_version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let service = |t: service::Type| csi::PluginCapability {
            r#type: Some(Type::Service(Service { r#type: t as i32 })),
        };
        let mut capabilities = vec![service(service::Type::VolumeAccessibilityConstraints)];
        if self.driver.config.mode.controller() {
            capabilities.push(service(service::Type::ControllerService));
            capabilities.push(service(service::Type::GroupControllerService));
            if self.driver.config.snapshot_metadata {
                capabilities.push(service(service::Type::SnapshotMetadataService));
            }
        }
        capabilities.push(csi::PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        });
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        // The state was loaded before serving began; a state file that has become unreadable
        // since makes the driver not ready.
        let driver = self.driver.clone();
        let ready = tokio::task::spawn_blocking(move || driver.store.read().is_ok())
            .await
            .unwrap_or(false);
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}

#[derive(Debug, Clone)]
pub struct PodmonService {
    driver: Arc<Driver>,
}

impl PodmonService {
    pub fn new(driver: Arc<Driver>) -> Self {
        Self { driver }
    }
}

impl Driver {
    fn connectivity(
        &self,
        request: &podmon_v1::ValidateVolumeHostConnectivityRequest,
    ) -> Result<podmon_v1::ValidateVolumeHostConnectivityResponse, DriverError> {
        if request.volume_ids.is_empty() && request.node_id.is_empty() {
            return Ok(podmon_v1::ValidateVolumeHostConnectivityResponse {
                connected: false,
                ios_in_progress: false,
                messages: vec!["ValidateVolumeHostConnectivity is implemented".into()],
            });
        }
        let node =
            crate::rules::required_within(&request.node_id, "node_id", crate::rules::MAX_NODE_ID)?;
        let mut messages = Vec::new();
        let connected = match self.store.heartbeat_age_ms(node) {
            Some(age) if u128::from(age) < HEARTBEAT_STALE.as_millis() => {
                messages.push(format!("node {node} last heartbeat {age}ms ago"));
                true
            }
            Some(age) => {
                messages.push(format!("node {node} heartbeat is stale ({age}ms old)"));
                false
            }
            None => {
                messages.push(format!("node {node} never registered"));
                false
            }
        };
        let window = u64::try_from(request.io_sample_time_seconds)
            .ok()
            .filter(|s| *s > 0)
            .map_or(DEFAULT_IO_SAMPLE, Duration::from_secs);
        let since = SystemTime::now() - window;
        let state = self.store.read()?;
        let mut ios_in_progress = false;
        for id in &request.volume_ids {
            let Some(volume) = state.volumes.get(id).filter(|v| v.phase == Phase::Ready) else {
                messages.push(format!("volume {id} not found"));
                continue;
            };
            let written = data::last_write(&self.store.volume_data(id, volume.layout()))
                .is_ok_and(|at| at >= since);
            if written {
                ios_in_progress = true;
                messages.push(format!(
                    "volume {id} written within the last {}s",
                    window.as_secs()
                ));
            }
        }
        Ok(podmon_v1::ValidateVolumeHostConnectivityResponse {
            connected,
            ios_in_progress,
            messages,
        })
    }
}

crate::driver::blocking_service! {
    PodmonService: Podmon {
        validate_volume_host_connectivity(podmon_v1::ValidateVolumeHostConnectivityRequest) -> podmon_v1::ValidateVolumeHostConnectivityResponse => |d, r| d.connectivity(&r);
    }
}

//! Serving the driver: load the state (refusing a corrupt one), recover what a crash
//! interrupted (controllers), bind the Unix socket, serve the services the mode selects, and on node
//! instances keep a heartbeat and the fencing watch running.

use std::sync::Arc;
use std::time::Duration;

use csi_grpc::conn::{ConnError, Endpoint};
use csi_grpc::grpc_server;
use csi_proto::csi::v1::controller_server::ControllerServer;
use csi_proto::csi::v1::group_controller_server::GroupControllerServer;
use csi_proto::csi::v1::identity_server::IdentityServer;
use csi_proto::csi::v1::node_server::NodeServer;
use csi_proto::csi::v1::snapshot_metadata_server::SnapshotMetadataServer;
use csi_proto::podmon::v1::podmon_server::PodmonServer;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::controller::ControllerService;
use crate::driver::Driver;
use crate::group::GroupControllerService;
use crate::identity::{IdentityService, PodmonService};
use crate::legacy::LegacyHealth;
use crate::metadata::SnapshotMetadataService;
use crate::node::NodeService;
use crate::recovery;
use crate::state::{Store, StoreError};

/// How often node instances beat and check fencing (fencing must take < 1 s).
pub const NODE_LOOP_PERIOD: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    State(#[from] StoreError),
    #[error(transparent)]
    Endpoint(#[from] ConnError),
    #[error("cannot listen on {endpoint}: {source}")]
    Listen {
        endpoint: Endpoint,
        #[source]
        source: std::io::Error,
    },
    #[error("recovering the node's records: {0}")]
    Records(crate::error::DriverError),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Serves until `shutdown` is cancelled.
pub async fn run(
    config: Config,
    endpoint: Endpoint,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let store = Store::open(&config.state_dir)?;
    let instance = store.register_instance()?;
    let driver = Driver::new(config, store, instance);
    if driver.config.mode.controller() {
        let recovering = driver.clone();
        tokio::task::spawn_blocking(move || recovery::recover(&recovering))
            .await
            .map_err(|e| StoreError::Io {
                path: driver.store.state_file(),
                source: std::io::Error::other(e),
            })??;
    }
    let listener = endpoint.listen().map_err(|source| ServeError::Listen {
        endpoint: endpoint.clone(),
        source,
    })?;
    if driver.config.mode.node() {
        driver.respell_node_records().map_err(ServeError::Records)?;
        driver.recover_ephemeral().map_err(ServeError::Records)?;
        driver.store.beat(&driver.config.node_id)?;
        tokio::spawn(heartbeat_loop(driver.clone(), shutdown.clone()));
        tokio::spawn(fencing_loop(driver.clone(), shutdown.clone()));
    }
    let mode = driver.config.mode;
    let mut router = grpc_server::builder()
        .add_service(IdentityServer::new(IdentityService::new(driver.clone())))
        .add_optional_service(
            driver
                .config
                .podmon_extension
                .then(|| PodmonServer::new(PodmonService::new(driver.clone()))),
        );
    // The VolumeCondition generation needs three Controller and Node methods answered in
    // v1.12's messages.
    let legacy = driver.config.volume_health.volume_condition();
    if mode.controller() {
        let controller = ControllerServer::new(ControllerService::new(driver.clone()));
        router = if legacy {
            router.add_service(LegacyHealth::new(controller, driver.clone()))
        } else {
            router.add_service(controller)
        };
        router = router
            .add_service(GroupControllerServer::new(GroupControllerService::new(
                driver.clone(),
            )))
            .add_optional_service(driver.config.snapshot_metadata.then(|| {
                SnapshotMetadataServer::new(SnapshotMetadataService::new(driver.clone()))
            }));
    }
    if mode.node() {
        let node = NodeServer::new(NodeService::new(driver.clone()));
        router = if legacy {
            router.add_service(LegacyHealth::new(node, driver.clone()))
        } else {
            router.add_service(node)
        };
    }
    tracing::info!(%endpoint, driver = %driver.config.driver_name, node = %driver.config.node_id, ?mode, volume_health = ?driver.config.volume_health, "serving CSI");
    let served = router
        .serve_with_incoming_shutdown(grpc_server::incoming(listener), shutdown.cancelled())
        .await;
    let _ = std::fs::remove_file(endpoint.path());
    served.map_err(ServeError::from)
}

/// Heartbeat of a node instance, on its own task so slow fencing never delays it.
async fn heartbeat_loop(driver: Arc<Driver>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(NODE_LOOP_PERIOD) => {}
        }
        let beating = driver.clone();
        match tokio::task::spawn_blocking(move || beating.store.beat(&beating.config.node_id)).await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "node heartbeat failed"),
            Err(error) => tracing::warn!(%error, "node heartbeat task failed"),
        }
    }
}

/// Fencing watch of a node instance.
async fn fencing_loop(driver: Arc<Driver>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(NODE_LOOP_PERIOD) => {}
        }
        let fencing = driver.clone();
        match tokio::task::spawn_blocking(move || fencing.reconcile_fencing()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "fencing check failed"),
            Err(error) => tracing::warn!(%error, "fencing task failed"),
        }
    }
}

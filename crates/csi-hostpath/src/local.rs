//! Several driver instances on one machine, in this process: one controller instance and one
//! node instance per simulated node, sharing a state directory, each on its own Unix socket,
//! each with a connected client. The demo, the benchmarks and the conformance tests run on it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_grpc::conn::{ConnError, CsiConnection, Endpoint, connect};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1 as csi;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, DEFAULT_DRIVER_NAME, Mode};
use crate::health::HealthApi;
use crate::server::{ServeError, run};

/// Node ID of the controller instance.
pub const CONTROLLER_NODE: &str = "controller";

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Connect(#[from] ConnError),
    #[error("driver instance {name} stopped: {source}")]
    Stopped {
        name: String,
        #[source]
        source: ServeError,
    },
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One running instance.
#[derive(Debug)]
pub struct Instance {
    pub node_id: String,
    pub endpoint: Endpoint,
    pub csi: CsiConnection,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServeError>>,
}

/// A controller and node instances under one root directory.
#[derive(Debug)]
pub struct LocalCluster {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub controller: Instance,
    pub nodes: Vec<Instance>,
}

/// The configuration every instance of a local cluster shares; `tune` adjusts it.
pub fn base_config(root: &Path) -> Config {
    Config {
        driver_name: DEFAULT_DRIVER_NAME.to_string(),
        node_id: CONTROLLER_NODE.to_string(),
        mode: Mode::Controller,
        state_dir: root.join("state"),
        capacity: Default::default(),
        max_volume_size: 1 << 40,
        max_volumes_per_node: 0,
        enable_attach: true,
        podmon_extension: true,
        snapshot_metadata: true,
        accepted_mutable_parameters: Default::default(),
        allowed_path_roots: vec![root.join("kubelet")],
        volume_health: HealthApi::V1_13,
        vendor_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

impl LocalCluster {
    /// Starts the controller and one node instance per name, and connects to each.
    pub async fn start(
        root: &Path,
        node_names: &[&str],
        tune: impl Fn(&mut Config),
    ) -> Result<Self, LocalError> {
        let mut config = base_config(root);
        tune(&mut config);
        for dir in [root.join("sockets"), root.join("kubelet")] {
            std::fs::create_dir_all(&dir).map_err(|source| LocalError::Io {
                path: dir.clone(),
                source,
            })?;
        }
        let controller = Self::instance(root, config.clone()).await?;
        let mut nodes = Vec::new();
        for name in node_names {
            let mut node = config.clone();
            node.mode = Mode::Node;
            node.node_id = (*name).to_string();
            nodes.push(Self::instance(root, node).await?);
        }
        Ok(Self {
            root: root.to_path_buf(),
            state_dir: config.state_dir,
            controller,
            nodes,
        })
    }

    async fn instance(root: &Path, config: Config) -> Result<Instance, LocalError> {
        let node_id = config.node_id.clone();
        let endpoint = Endpoint::from_path(root.join("sockets").join(format!("{node_id}.sock")))?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(config, endpoint.clone(), shutdown.clone()));
        let connected = connect(
            &endpoint,
            Duration::from_secs(10),
            CsiOperationMetrics::unregistered(),
        )
        .await;
        let csi = match connected {
            Ok(csi) => csi,
            Err(error) => {
                if task.is_finished()
                    && let Ok(Err(source)) = task.await
                {
                    return Err(LocalError::Stopped {
                        name: node_id,
                        source,
                    });
                }
                return Err(error.into());
            }
        };
        Ok(Instance {
            node_id,
            endpoint,
            csi,
            shutdown,
            task,
        })
    }

    pub fn node(&self, name: &str) -> &Instance {
        self.nodes
            .iter()
            .find(|n| n.node_id == name)
            .unwrap_or_else(|| panic!("no node instance {name}"))
    }

    /// Where the simulated kubelet of `node` keeps staging and target paths.
    pub fn kubelet_dir(&self, node: &str) -> PathBuf {
        self.root.join("kubelet").join(node)
    }

    /// Stops every instance and waits for them.
    pub async fn stop(self) {
        for instance in std::iter::once(self.controller).chain(self.nodes) {
            instance.stop().await;
        }
    }

    /// Stops one node instance, as a node that fails: it serves and fences nothing more.
    pub async fn fail_node(&mut self, name: &str) {
        let at = self.nodes.iter().position(|n| n.node_id == name);
        let instance = self
            .nodes
            .remove(at.unwrap_or_else(|| panic!("no node instance {name}")));
        instance.stop().await;
    }
}

impl Instance {
    async fn stop(self) {
        self.shutdown.cancel();
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(node = %self.node_id, %error, "instance failed"),
            Err(error) => tracing::warn!(node = %self.node_id, %error, "instance task failed"),
        }
    }
}

/// CreateVolume of a plain filesystem volume for a single writer, as an administrator makes
/// one by hand at the storage (the tests' and benchmarks' pre-existing volumes).
pub async fn create_plain_volume(
    csi: &CsiConnection,
    name: &str,
    bytes: i64,
    timeout: Duration,
) -> Result<csi::Volume, tonic::Status> {
    let capability = csi_kinds::capability::volume_capability(
        &csi_kinds::capability::AccessKind::from_volume_mode(None, "", vec![]),
        csi::volume_capability::access_mode::Mode::SingleNodeWriter,
    );
    let request = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        ..Default::default()
    };
    let response = csi.create_volume(request, timeout).await?;
    response
        .volume
        .ok_or_else(|| tonic::Status::internal("CreateVolume returned no volume"))
}

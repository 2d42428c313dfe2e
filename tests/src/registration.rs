//! A stand-in for node-driver-registrar in scenarios: serves kubelet's `pluginregistration`
//! API on `<registry>/<driver>-reg.sock` with the answers a test chooses, and records what the
//! kubelet reported back.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use csi_grpc::grpc_server;
use csi_proto::pluginregistration::registration_server::{
    Registration, RegistrationServer as Service,
};
use csi_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

#[derive(Debug)]
struct Answers {
    info: PluginInfo,
    reported: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for Answers {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A running registration socket.
#[derive(Debug)]
pub struct RegistrationServer {
    pub socket: PathBuf,
    reported: Arc<Mutex<Vec<RegistrationStatus>>>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RegistrationServer {
    /// Serves `{CSIPlugin, driver, endpoint, versions}` on `<registry>/<driver>-reg.sock`.
    pub async fn start(
        registry: &Path,
        driver: &str,
        endpoint: &str,
        versions: &[&str],
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(registry)?;
        let socket = registry.join(format!("{driver}-reg.sock"));
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        let reported = Arc::new(Mutex::new(Vec::new()));
        let answers = Answers {
            info: PluginInfo {
                r#type: "CSIPlugin".to_string(),
                name: driver.to_string(),
                endpoint: endpoint.to_string(),
                supported_versions: versions.iter().map(|v| v.to_string()).collect(),
            },
            reported: reported.clone(),
        };
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(
            grpc_server::builder()
                .add_service(Service::new(answers))
                .serve_with_incoming_shutdown(grpc_server::incoming(listener), async move {
                    stop.cancelled().await
                }),
        );
        Ok(Self {
            socket,
            reported,
            shutdown,
            task,
        })
    }

    /// What the kubelet reported through NotifyRegistrationStatus, in order.
    pub fn reported(&self) -> Vec<RegistrationStatus> {
        self.reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Stops serving and removes the socket — how a registrar de-registers.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

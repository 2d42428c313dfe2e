//! node-driver-registrar (cmd/csi-node-driver-registrar): learn the driver's name, serve
//! kubelet's `pluginregistration.Registration` on `<plugin-registration-path>/<driver>-reg.sock`,
//! exit 1 when kubelet reports the registration failed (kubelet never retries by itself; the
//! restart makes a new socket it registers again), remove the socket on SIGTERM (de-register).

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use csi_grpc::conn::{ConnError, Endpoint, check_socket_path, connect};
use csi_grpc::grpc_server;
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use csi_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::flags::{REGISTRATION_PROBE_MODE, RegistrarArgs};

/// The plugin type kubelet's CSI handler takes.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions we tell kubelet the driver supports.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    #[error(transparent)]
    Csi(#[from] ConnError),
    #[error("GetPluginInfo: {0}")]
    PluginInfo(Status),
    #[error("the driver returned an empty name")]
    EmptyDriverName,
    #[error("{}: {source}", path.display())]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} exists and is not a socket; not removing it", .0.display())]
    NotASocket(PathBuf),
    #[error("kubelet could not register the plugin: {0}")]
    Rejected(String),
    #[error("serving the registration socket: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error(transparent)]
    Http(#[from] csi_grpc::http::HttpError),
}

/// `<dir>/<driver>-reg.sock`.
pub fn registration_socket(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// What GetInfo answers: the driver and the endpoint kubelet reaches it at.
pub fn plugin_info(driver: &str, endpoint: &str) -> PluginInfo {
    PluginInfo {
        r#type: CSI_PLUGIN_TYPE.to_string(),
        name: driver.to_string(),
        endpoint: endpoint.to_string(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
    }
}

struct Registrar {
    info: PluginInfo,
    rejected: mpsc::UnboundedSender<String>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!("kubelet asked for the plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "kubelet registered the driver");
        } else {
            tracing::error!(driver = %self.info.name, error = %status.error, "kubelet could not register the driver");
            let _ = self.rejected.send(status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds `socket` owner-only, replacing a stale socket (never another kind of file).
fn bind(socket: &Path) -> Result<tokio::net::UnixListener, RegistrarError> {
    check_socket_path(socket)?;
    let io = |source| RegistrarError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(socket).map_err(io)?,
        Ok(_) => return Err(RegistrarError::NotASocket(socket.to_path_buf())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(error)),
    }
    let listener = tokio::net::UnixListener::bind(socket).map_err(io)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}

/// Serves `info` on `socket` until `shutdown` (then removes the socket: kubelet de-registers
/// the plugin) or until kubelet reports a failed registration ([`RegistrarError::Rejected`]).
pub async fn serve(
    socket: &Path,
    info: PluginInfo,
    shutdown: CancellationToken,
) -> Result<(), RegistrarError> {
    let listener = bind(socket)?;
    tracing::info!(socket = %socket.display(), driver = %info.name, "serving the registration socket");
    let (rejected, mut rejections) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let stopping = stop.clone();
    let server = grpc_server::builder()
        .add_service(RegistrationServer::new(Registrar { info, rejected }))
        .serve_with_incoming_shutdown(grpc_server::incoming(listener), async move {
            stopping.cancelled().await
        });
    let mut server = std::pin::pin!(server);
    let outcome = tokio::select! {
        served = &mut server => served.map_err(RegistrarError::from),
        () = shutdown.cancelled() => Ok(()),
        Some(error) = rejections.recv() => Err(RegistrarError::Rejected(error)),
    };
    stop.cancel();
    if outcome.is_ok() {
        let _ = server.await;
        match std::fs::remove_file(socket) {
            Ok(()) => tracing::info!(socket = %socket.display(), "removed the registration socket"),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(socket = %socket.display(), %error, "removing the registration socket failed")
            }
        }
    }
    outcome
}

/// `/healthz`: 404 when the socket is missing, else GetInfo over it — 200 only when it names
/// `driver` (upstream #322: a socket that exists is not enough). The server logs a failure.
pub async fn health(socket: &Path, driver: &str, timeout: Duration) -> (StatusCode, String) {
    match std::fs::symlink_metadata(socket) {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return (
                StatusCode::NOT_FOUND,
                "registration socket does not exist".to_string(),
            );
        }
        Err(error) => return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
    let answer = async {
        let endpoint = Endpoint::from_path(socket).map_err(|e| e.to_string())?;
        let connection = connect(&endpoint, timeout, CsiOperationMetrics::unregistered())
            .await
            .map_err(|e| e.to_string())?;
        let mut request = Request::new(InfoRequest {});
        request.set_timeout(timeout);
        RegistrationClient::new(connection.channel())
            .get_info(request)
            .await
            .map(Response::into_inner)
            .map_err(|status| format!("GetInfo: {}", status.message()))
    };
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(info)) if info.name == driver => (StatusCode::OK, "ok".to_string()),
        Ok(Ok(info)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the registration socket serves {:?}, not {driver:?}",
                info.name
            ),
        ),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, error),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no GetInfo answer within {timeout:?}"),
        ),
    }
}

/// The registrar: connect (bounded), GetPluginInfo, serve the socket (and /healthz).
pub async fn run(args: RegistrarArgs, shutdown: CancellationToken) -> Result<(), RegistrarError> {
    if args.mode == REGISTRATION_PROBE_MODE {
        tracing::warn!("--mode={REGISTRATION_PROBE_MODE} is deprecated and does nothing");
        return Ok(());
    }
    if args.connection_timeout.is_some() {
        tracing::warn!("--connection-timeout is deprecated and has no effect");
    }
    let endpoint = args.csi.endpoint()?;
    let csi = connect(
        &endpoint,
        csi_grpc::conn::DEFAULT_CONNECT_WAIT,
        CsiOperationMetrics::unregistered(),
    )
    .await?;
    let driver = csi
        .get_plugin_info(
            csi_proto::csi::v1::GetPluginInfoRequest {},
            args.csi.timeout,
        )
        .await
        .map_err(RegistrarError::PluginInfo)?
        .name;
    if driver.is_empty() {
        return Err(RegistrarError::EmptyDriverName);
    }
    tracing::info!(%driver, "detected CSI driver");
    let socket = registration_socket(Path::new(&args.plugin_registration_path), &driver);
    if let Some(address) = args.health_address() {
        let (socket, driver, timeout) = (socket.clone(), driver.clone(), args.csi.timeout);
        let app = axum::Router::new().route(
            "/healthz",
            axum::routing::get(move || {
                let (socket, driver) = (socket.clone(), driver.clone());
                async move { crate::logged(health(&socket, &driver, timeout).await) }
            }),
        );
        csi_grpc::http::serve(&address, app, shutdown.clone()).await?;
    }
    serve(
        &socket,
        plugin_info(&driver, &args.kubelet_registration_path),
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(2);

    #[tokio::test]
    async fn health_answers_by_what_the_socket_serves() {
        let dir = tempfile::tempdir().unwrap();
        let socket = registration_socket(dir.path(), "a.driver");
        assert_eq!(
            health(&socket, "a.driver", TIMEOUT).await.0,
            StatusCode::NOT_FOUND,
            "no socket"
        );
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert_eq!(
            health(&socket, "a.driver", TIMEOUT).await.0,
            StatusCode::INTERNAL_SERVER_ERROR,
            "a socket nobody serves"
        );
        let shutdown = CancellationToken::new();
        let served = tokio::spawn({
            let (socket, shutdown) = (socket.clone(), shutdown.clone());
            async move { serve(&socket, plugin_info("a.driver", "/csi.sock"), shutdown).await }
        });
        let deadline = std::time::Instant::now() + TIMEOUT;
        while health(&socket, "a.driver", TIMEOUT).await.0 != StatusCode::OK {
            assert!(std::time::Instant::now() < deadline, "never healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (code, why) = health(&socket, "b.driver", TIMEOUT).await;
        assert_eq!(
            code,
            StatusCode::INTERNAL_SERVER_ERROR,
            "another driver's socket"
        );
        assert!(why.contains("a.driver"), "{why}");
        shutdown.cancel();
        served.await.unwrap().unwrap();
        assert!(!socket.exists(), "removed on shutdown");
    }

    #[tokio::test]
    async fn sockets_that_cannot_be_served_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let long = dir.path().join("x".repeat(120));
        let error = serve(&long, plugin_info("d", "/e"), CancellationToken::new())
            .await
            .unwrap_err();
        assert!(error.to_string().contains("108"), "{error}");
        let file = dir.path().join("d-reg.sock");
        std::fs::write(&file, b"not a socket").unwrap();
        let error = serve(&file, plugin_info("d", "/e"), CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(error, RegistrarError::NotASocket(_)), "{error}");
        assert!(file.exists(), "another kind of file is never removed");
    }
}

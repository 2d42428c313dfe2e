//! Startup as upstream's sidecar: check the flags, load the key pair, connect to the Kubernetes
//! API and to the driver (its name from GetPluginInfo, Probe until ready, the plugin
//! capability SNAPSHOT_METADATA_SERVICE required), then serve the SnapshotMetadata API over TLS
//! on `--port` and `/health` (and `/metrics` unless `--disable-metrics`) on `--http-endpoint`,
//! until SIGTERM. No leader election: every replica serves.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use csi_grpc::conn::{Services, StartupOrder};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_grpc::shutdown::{GRACE_PERIOD, Stopped, run_until_cancelled};
use csi_grpc::tls::{self, ReloadingCertificate, TlsError};
use csi_proto::grpc::health::v1::health_server::HealthServer;
use csi_proto::snapshotmetadata::snapshot_metadata_server::SnapshotMetadataServer;
use csi_sidecar::startup::StartupError;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::flags::SnapshotMetadataArgs;
use crate::health::HealthService;
use crate::metrics::RequestMetrics;
use crate::server::{Service, Settings};

/// Upstream's readiness path.
pub const HEALTH_PATH: &str = "/health";

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Upstream's `Args.Validate` messages.
    #[error("{0}")]
    Invalid(String),
    #[error("failed to start certwatcher: {0}")]
    Certificate(TlsError),
    #[error(transparent)]
    Tls(TlsError),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("CSI driver {0} does not support the SNAPSHOT_METADATA_SERVICE")]
    NoSnapshotMetadataService(String),
    #[error("GRPC server failed: {0}")]
    Serve(tonic::transport::Error),
}

csi_sidecar::startup_error_conversions!(RunError);

/// Where a started sidecar listens (the ports chosen when the flags say port 0).
#[derive(Debug, Clone, Copy)]
pub struct Listening {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

/// Runs the sidecar until `shutdown`. `started` hears where it listens once it serves.
pub async fn run(
    args: SnapshotMetadataArgs,
    shutdown: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<Listening>>,
) -> Result<(), RunError> {
    args.check().map_err(RunError::Invalid)?;
    let options = args.tls.options().map_err(RunError::Tls)?;
    for name in options.not_implemented() {
        tracing::warn!(name = %name, "TLS setting not implemented here (rustls), skipped");
    }
    if options.suites_ignored() {
        tracing::warn!(
            "TLS 1.3+ ignores the configured cipher suites; cipher suite setting has no effect"
        );
    }
    let certificate = ReloadingCertificate::load(
        &args.tls.tls_cert,
        &args.tls.tls_key,
        Arc::new(options.provider()),
    )
    .map_err(RunError::Certificate)?;
    let tls_config = tls::server_config(&options, Arc::new(certificate)).map_err(RunError::Tls)?;

    let client = csi_sidecar::kube::client(&args.kube).await?;
    let mut registry = Registry::default();
    let csi_metrics = CsiOperationMetrics::register(&mut registry);
    let services = Services {
        plugin: true,
        controller: false,
        node: false,
    };
    let (csi, driver) = csi_sidecar::startup::connect_driver(
        &args.csi,
        csi_metrics,
        services,
        StartupOrder::NameThenProbe,
    )
    .await
    .map_err(StartupError::from)?;
    tracing::info!(driver = %driver.name, "CSI driver name");
    if !driver.plugin.snapshot_metadata_service {
        return Err(RunError::NoSnapshotMetadataService(driver.name));
    }
    let metrics = RequestMetrics::register(&mut registry, &driver.name);

    let (ready, readiness) = watch::channel(false);
    let service = Service::new(
        client,
        csi,
        Settings {
            driver_name: driver.name.clone(),
            audience: args.audience.clone(),
            max_streaming_duration: args.max_streaming_duration(),
        },
        metrics,
        readiness.clone(),
    );
    let port =
        u16::try_from(args.port).map_err(|_| RunError::Invalid("invalid GRPCPort".into()))?;
    let listener = csi_grpc::http::bind(&format!(":{port}"))
        .await
        .map_err(StartupError::from)?;
    let grpc = listener
        .local_addr()
        .map_err(|error| RunError::Invalid(format!("gRPC listener: {error}")))?;
    tracing::info!(%grpc, "GRPC server started listening");

    let http = csi_grpc::http::serve(
        &args.http_endpoint,
        diagnostics(&args, Arc::new(registry), readiness.clone()),
        shutdown.clone(),
    )
    .await
    .map_err(StartupError::from)?
    .ok_or_else(|| RunError::Invalid("no HTTP endpoint".into()))?;
    tracing::info!(%http, health = HEALTH_PATH, metrics = !args.disable_metrics, "HTTP server listening");

    let stopping = shutdown.clone();
    let server = tonic::transport::Server::builder()
        .add_service(SnapshotMetadataServer::new(service))
        .add_service(HealthServer::new(HealthService::new(readiness)))
        .serve_with_incoming_shutdown(tls::incoming(listener, tls_config), async move {
            stopping.cancelled().await;
        });
    tracing::info!("Setting status to SERVING");
    ready.send_replace(true);
    if let Some(started) = started {
        let _ = started.send(Listening { grpc, http });
    }
    let stopped = shutdown.clone();
    tokio::spawn(async move {
        stopped.cancelled().await;
        tracing::info!("Shutting down: setting status to NOT_SERVING");
        ready.send_replace(false);
    });
    match run_until_cancelled(&shutdown, GRACE_PERIOD, server).await {
        Stopped::Finished(result) | Stopped::Drained(result) => result.map_err(RunError::Serve)?,
        Stopped::TimedOut => tracing::warn!("streams still open after the grace period were cut"),
    }
    tracing::info!("Shutdown complete");
    Ok(())
}

/// `/health` (200 "ok" when serving, 503 "not ready" otherwise, as upstream) and the metrics.
fn diagnostics(
    args: &SnapshotMetadataArgs,
    registry: Arc<Registry>,
    ready: watch::Receiver<bool>,
) -> Router {
    let health = get(move || {
        let ready = *ready.borrow();
        async move {
            if ready {
                (StatusCode::OK, "ok")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "not ready")
            }
        }
    });
    let router = if args.disable_metrics {
        Router::new()
    } else {
        csi_grpc::http::router(&args.metrics_path, registry, Vec::new(), false)
    };
    router.route(HEALTH_PATH, health)
}

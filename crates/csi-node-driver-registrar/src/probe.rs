//! livenessprobe (cmd/livenessprobe): `/healthz` opens a fresh connection to the driver for
//! every request (a deleted socket must fail the probe, upstream #68) and calls Probe within
//! `--probe-timeout`. The HTTP server starts before the driver is reachable, so early probes
//! fail instead of the sidecar crash-looping (upstream #236).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use csi_grpc::conn::{ConnError, Endpoint, connect};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_grpc::metrics::process::{ProcessCollector, ProcessFamilies};
use csi_proto::csi::v1 as csi;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::flags::ProbeArgs;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Csi(#[from] ConnError),
    #[error("GetPluginInfo: {0}")]
    PluginInfo(tonic::Status),
    #[error(transparent)]
    Http(#[from] csi_grpc::http::HttpError),
}

/// One liveness check: connect afresh, Probe. 200 `ok`; 500 with the reason, which is also
/// logged as an error (as upstream: the container log says why kubelet restarts the driver).
pub async fn check(
    endpoint: &Endpoint,
    timeout: Duration,
    metrics: &CsiOperationMetrics,
) -> (StatusCode, String) {
    crate::logged(answer(endpoint, timeout, metrics).await)
}

async fn answer(
    endpoint: &Endpoint,
    timeout: Duration,
    metrics: &CsiOperationMetrics,
) -> (StatusCode, String) {
    let probe = async {
        let connection = connect(endpoint, timeout, metrics.clone())
            .await
            .map_err(|e| e.to_string())?;
        connection
            .probe(csi::ProbeRequest {}, timeout)
            .await
            .map_err(|status| format!("Probe: {}", status.message()))
    };
    match tokio::time::timeout(timeout, probe).await {
        // An absent `ready` counts as ready (CSI spec).
        Ok(Ok(response)) if response.ready.is_none_or(|ready| ready) => {
            (StatusCode::OK, "ok".to_string())
        }
        Ok(Ok(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "driver responded but is not ready".to_string(),
        ),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, error),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no Probe answer within {timeout:?}"),
        ),
    }
}

/// Serves `/healthz` (and the Probe metrics), then learns the driver's name.
pub async fn run(args: ProbeArgs, shutdown: CancellationToken) -> Result<(), ProbeError> {
    let endpoint = Endpoint::parse(&args.csi_address)?;
    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register(&mut registry);
    registry.register_collector(Box::new(ProcessCollector::new(ProcessFamilies::StartTime)));
    let registry = Arc::new(registry);
    let timeout = args.probe_timeout;
    let (probed, probe_metrics) = (endpoint.clone(), metrics.clone());
    let mut app = axum::Router::new().route(
        "/healthz",
        axum::routing::get(move || {
            let (endpoint, metrics) = (probed.clone(), probe_metrics.clone());
            async move { check(&endpoint, timeout, &metrics).await }
        }),
    );
    let metrics_app = csi_grpc::http::router(&args.http.metrics_path, registry, Vec::new(), false);
    if args.http.metrics_address.is_empty() {
        app = app.merge(metrics_app);
    } else {
        csi_grpc::http::serve(&args.http.metrics_address, metrics_app, shutdown.clone()).await?;
    }
    csi_grpc::http::serve(&args.health_address(), app, shutdown.clone()).await?;
    // Wait for the driver as long as it takes: kubelet's probes report it meanwhile.
    let forever = Duration::from_secs(u64::from(u32::MAX));
    let csi = connect(&endpoint, forever, metrics.clone()).await?;
    let info = csi
        .get_plugin_info(csi::GetPluginInfoRequest {}, timeout)
        .await
        .map_err(ProbeError::PluginInfo)?;
    metrics.set_driver_name(&info.name);
    tracing::info!(driver = %info.name, "probing the CSI driver");
    drop(csi);
    shutdown.cancelled().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use csi::identity_server::{Identity, IdentityServer};
    use tonic::{Request, Response, Status};

    use super::*;

    /// A driver whose Probe answers `ready`.
    struct Readiness(Option<bool>);

    #[tonic::async_trait]
    impl Identity for Readiness {
        async fn get_plugin_info(
            &self,
            _: Request<csi::GetPluginInfoRequest>,
        ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
            Err(Status::unimplemented("not needed"))
        }

        async fn get_plugin_capabilities(
            &self,
            _: Request<csi::GetPluginCapabilitiesRequest>,
        ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
            Err(Status::unimplemented("not needed"))
        }

        async fn probe(
            &self,
            _: Request<csi::ProbeRequest>,
        ) -> Result<Response<csi::ProbeResponse>, Status> {
            Ok(Response::new(csi::ProbeResponse { ready: self.0 }))
        }
    }

    async fn serve(socket: &std::path::Path, ready: Option<bool>) {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        tokio::spawn(
            csi_grpc::grpc_server::builder()
                .add_service(IdentityServer::new(Readiness(ready)))
                .serve_with_incoming(csi_grpc::grpc_server::incoming(listener)),
        );
    }

    #[tokio::test]
    async fn probe_answers() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = CsiOperationMetrics::unregistered();
        let timeout = Duration::from_secs(2);
        for (ready, expected) in [
            (Some(true), (StatusCode::OK, "ok")),
            (None, (StatusCode::OK, "ok")),
            (
                Some(false),
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "driver responded but is not ready",
                ),
            ),
        ] {
            let socket = dir.path().join(format!("{ready:?}.sock"));
            serve(&socket, ready).await;
            let endpoint = Endpoint::from_path(&socket).unwrap();
            let (code, body) = check(&endpoint, timeout, &metrics).await;
            assert_eq!((code, body.as_str()), expected, "ready = {ready:?}");
        }
        let gone = Endpoint::from_path(dir.path().join("gone.sock")).unwrap();
        let (code, _) = check(&gone, Duration::from_millis(300), &metrics).await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR, "no socket");
    }
}

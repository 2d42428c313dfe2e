//! The diagnostics HTTP server: `--metrics-path` (Prometheus) always, and with
//! `--http-endpoint` also `/healthz` plus one `/healthz/<name>` per registered check (e.g.
//! `/healthz/leader-election`), as csi-lib-utils' `healthz.InstallPathHandler` lays them out.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::flags::{HttpArgs, HttpServing};

/// A named health check: `Ok` is healthy, `Err` says why not.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {address:?}: {source}")]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

/// Builds the router. `checks` are only served when `health` is true (`--http-endpoint`).
pub fn router(
    metrics_path: &str,
    registry: Arc<Registry>,
    checks: Vec<(String, HealthCheck)>,
    health: bool,
) -> Router {
    let metrics = get(move || {
        let registry = registry.clone();
        async move {
            (
                [(header::CONTENT_TYPE, crate::metrics::text::CONTENT_TYPE)],
                crate::metrics::encode(&registry),
            )
        }
    });
    let mut router = Router::new().route(metrics_path, metrics);
    if !health {
        return router;
    }
    let checks = Arc::new(checks);
    let all = checks.clone();
    router = router.route("/healthz", get(move || async move { report(&all) }));
    for (index, (name, _)) in checks.iter().enumerate() {
        let checks = checks.clone();
        router = router.route(
            &format!("/healthz/{name}"),
            get(move || async move { report(&checks[index..=index]) }),
        );
    }
    router
}

/// healthz-style body: `ok`, or one `[-]name failed: reason` line per failing check.
fn report(checks: &[(String, HealthCheck)]) -> impl IntoResponse + use<> {
    let failures: Vec<String> = checks
        .iter()
        .filter_map(|(name, check)| check().err().map(|why| format!("[-]{name} failed: {why}")))
        .collect();
    if failures.is_empty() {
        (StatusCode::OK, "ok".to_string())
    } else {
        tracing::warn!(failures = ?failures, "health check failed");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\nhealthz check failed\n", failures.join("\n")),
        )
    }
}

/// Binds an address in Go's `net.Listen` syntax: `:8080` means every interface.
pub async fn bind(address: &str) -> Result<TcpListener, HttpError> {
    let bind_error = |source| HttpError::Bind {
        address: address.to_string(),
        source,
    };
    match address.strip_prefix(':') {
        Some(port) => {
            let port: u16 = port.parse().map_err(|_| {
                bind_error(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "invalid port",
                ))
            })?;
            // Dual-stack when the host has IPv6, else IPv4 only.
            match TcpListener::bind(SocketAddr::from(([0u16; 8], port))).await {
                Ok(listener) => Ok(listener),
                Err(_) => TcpListener::bind(SocketAddr::from(([0u8; 4], port)))
                    .await
                    .map_err(bind_error),
            }
        }
        None => TcpListener::bind(address).await.map_err(bind_error),
    }
}

/// Starts the server the flags ask for (binding now, so a bad address fails at startup) and
/// returns the address it listens on. It stops when `shutdown` is cancelled.
pub async fn start(
    args: &HttpArgs,
    registry: Arc<Registry>,
    checks: Vec<(String, HealthCheck)>,
    shutdown: CancellationToken,
) -> Result<Option<SocketAddr>, HttpError> {
    let (address, health) = match args.serving() {
        HttpServing::Disabled => return Ok(None),
        HttpServing::MetricsOnly(address) => (address, false),
        HttpServing::MetricsAndHealth(address) => (address, true),
    };
    serve(
        &address,
        router(&args.metrics_path, registry, checks, health),
        shutdown,
    )
    .await
}

/// Serves `app` on `address` (Go `net.Listen` syntax; bound now, so a bad address fails at
/// startup) until `shutdown`; returns the address it listens on.
pub async fn serve(
    address: &str,
    app: Router,
    shutdown: CancellationToken,
) -> Result<Option<SocketAddr>, HttpError> {
    let listener = bind(address).await?;
    let local = listener.local_addr().map_err(|source| HttpError::Bind {
        address: address.to_string(),
        source,
    })?;
    // Go's ServeMux answer to a path nobody serves, so a mistyped probe or scrape path reads
    // as it does with the Go sidecars instead of an empty 404.
    let app = app.fallback(|| async {
        (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "404 page not found\n",
        )
    });
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "diagnostics HTTP server failed");
        }
    });
    tracing::info!(address = %local, "serving diagnostics over HTTP");
    Ok(Some(local))
}

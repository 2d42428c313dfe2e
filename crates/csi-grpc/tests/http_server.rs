//! The diagnostics server as Prometheus and kubelet probes see it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use csi_grpc::flags::HttpArgs;
use csi_grpc::http::{HealthCheck, start};
use csi_grpc::metrics::CsiOperationMetrics;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn args(http_endpoint: &str, metrics_address: &str, metrics_path: &str) -> HttpArgs {
    HttpArgs {
        http_endpoint: http_endpoint.into(),
        metrics_address: metrics_address.into(),
        metrics_path: metrics_path.into(),
    }
}

fn registry() -> Arc<Registry> {
    let mut registry = Registry::default();
    let metrics = CsiOperationMetrics::register(&mut registry);
    metrics.set_driver_name("http.csi.test");
    metrics.record(
        "/csi.v1.Identity/Probe",
        tonic::Code::Ok,
        std::time::Duration::from_millis(1),
    );
    Arc::new(registry)
}

#[tokio::test]
async fn http_endpoint_serves_metrics_and_health_checks() {
    let healthy = Arc::new(AtomicBool::new(true));
    let flag = healthy.clone();
    let leader: HealthCheck = Arc::new(move || {
        if flag.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("lease not renewed".into())
        }
    });
    let shutdown = CancellationToken::new();
    let addr = start(
        &args("127.0.0.1:0", "", "/custom-metrics"),
        registry(),
        vec![("leader-election".into(), leader)],
        shutdown.clone(),
    )
    .await
    .unwrap()
    .unwrap();

    let (status, body) = get(addr, "/custom-metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"csi_sidecar_operations_seconds_count{driver_name="http.csi.test""#),
        "{body}"
    );
    assert_eq!(get(addr, "/healthz").await, (200, "ok".into()));
    assert_eq!(
        get(addr, "/healthz/leader-election").await,
        (200, "ok".into())
    );
    assert_eq!(
        get(addr, "/metrics").await,
        (404, "404 page not found\n".into()),
        "only --metrics-path is served, and a wrong path is told as Go's ServeMux tells it"
    );

    healthy.store(false, Ordering::SeqCst);
    let (status, body) = get(addr, "/healthz/leader-election").await;
    assert_eq!(status, 500);
    assert!(
        body.contains("[-]leader-election failed: lease not renewed"),
        "{body}"
    );
    assert_eq!(get(addr, "/healthz").await.0, 500);

    shutdown.cancel();
}

#[tokio::test]
async fn deprecated_metrics_address_serves_metrics_only() {
    let check: HealthCheck = Arc::new(|| Ok(()));
    let addr = start(
        &args("", "127.0.0.1:0", "/metrics"),
        registry(),
        vec![("leader-election".into(), check)],
        CancellationToken::new(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(get(addr, "/metrics").await.0, 200);
    assert_eq!(get(addr, "/healthz/leader-election").await.0, 404);
}

#[tokio::test]
async fn disabled_when_no_address_is_given() {
    let started = start(
        &args("", "", "/metrics"),
        registry(),
        vec![],
        CancellationToken::new(),
    )
    .await;
    assert!(started.unwrap().is_none());
}

#[tokio::test]
async fn unusable_address_fails_at_startup() {
    let error = start(
        &args("256.0.0.1:80", "", "/metrics"),
        registry(),
        vec![],
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("256.0.0.1:80"), "{error}");
    let error = csi_grpc::http::bind(":notaport")
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains(":notaport"), "{error}");
}

#[tokio::test]
async fn go_style_port_only_address_listens_on_all_interfaces() {
    let listener = csi_grpc::http::bind(":0").await.unwrap();
    assert!(listener.local_addr().unwrap().ip().is_unspecified());
}

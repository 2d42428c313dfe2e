//! CSI payload logging never shows secrets. Its own test binary: the subscriber that captures
//! the logs must be the process-wide one (tracing caches per-callsite interest globally, so a
//! thread-local subscriber can miss events another test thread registered first).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_grpc::conn::{Endpoint, connect};
use csi_grpc::metrics::CsiOperationMetrics;
use csi_proto::csi::v1 as csi;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn logged_requests_never_show_secrets() {
    let captured = Captured::default();
    tracing_subscriber::fmt()
        .with_env_filter("csi_grpc=trace")
        .with_ansi(false)
        .with_writer(captured.clone())
        .init();

    // A gRPC server with no services: every call is answered Unimplemented, and the request
    // is logged either way.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(tonic::service::Routes::default())
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let endpoint = Endpoint::from_path(&path).unwrap();
    let connection = connect(
        &endpoint,
        Duration::from_secs(5),
        CsiOperationMetrics::unregistered(),
    )
    .await
    .unwrap();

    let secrets = || [("password".to_string(), "s3cr3t".to_string())].into();
    let _ = connection
        .create_volume(
            csi::CreateVolumeRequest {
                name: "pvc-logged".into(),
                secrets: secrets(),
                ..Default::default()
            },
            Duration::from_secs(1),
        )
        .await;
    let _ = connection
        .node_stage_volume(
            csi::NodeStageVolumeRequest {
                volume_id: "vol-staged".into(),
                secrets: secrets(),
                ..Default::default()
            },
            Duration::from_secs(1),
        )
        .await;

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    for expected in [
        "pvc-logged",
        "/csi.v1.Controller/CreateVolume",
        "vol-staged",
        "/csi.v1.Node/NodeStageVolume",
    ] {
        assert!(
            logs.contains(expected),
            "{expected} must be logged:\n{logs}"
        );
    }
    assert!(!logs.contains("s3cr3t"), "secret leaked:\n{logs}");
    assert!(!logs.contains("password"), "secret key leaked:\n{logs}");
}

//! What the registrar's integration tests share.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The registrar binary for the driver at `csi`, telling kubelet `kubelet_path`, with its
/// socket in `registry`, /healthz on `http` and its log to `stderr`.
pub fn registrar(
    csi: &Path,
    kubelet_path: &Path,
    registry: &Path,
    http: std::net::SocketAddr,
    stderr: Stdio,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_csi-node-driver-registrar"))
        .arg(format!("--csi-address={}", csi.display()))
        .arg(format!(
            "--kubelet-registration-path={}",
            kubelet_path.display()
        ))
        .arg(format!("--plugin-registration-path={}", registry.display()))
        .arg(format!("--http-endpoint={http}"))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

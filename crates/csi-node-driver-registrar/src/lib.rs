//! csi-node-driver-registrar and livenessprobe, drop-ins for the upstream sidecars of the same
//! names: [`registrar`] serves kubelet's plugin registration for the driver, [`probe`] answers
//! kubelet's liveness probes of the driver; [`flags`] has both command lines.

pub mod flags;
pub mod probe;
pub mod registrar;

use axum::http::StatusCode;

/// A `/healthz` answer; a failure is also logged as an error with its reason, as upstream's
/// "Health check failed", so the container log says why kubelet restarts the container.
fn logged((code, body): (StatusCode, String)) -> (StatusCode, String) {
    if code == StatusCode::OK {
        tracing::debug!("health check succeeded");
    } else {
        tracing::error!(reason = %body, "health check failed");
    }
    (code, body)
}

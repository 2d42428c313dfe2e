//! Prometheus metrics shared by the sidecars, with csi-lib-utils' names, labels and buckets so
//! existing dashboards and alerts keep working.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::Code;

/// csi-lib-utils' buckets for `csi_sidecar_operations_seconds`.
pub const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub driver_name: String,
    /// The full gRPC method, e.g. `/csi.v1.Controller/CreateVolume`.
    pub method_name: String,
    /// Go's `codes.Code.String()` spelling, e.g. `OK`, `DeadlineExceeded`.
    pub grpc_status_code: String,
}

type OperationFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// `csi_sidecar_operations_seconds{driver_name,method_name,grpc_status_code}`.
#[derive(Clone, Debug)]
pub struct CsiOperationMetrics {
    operations: OperationFamily,
    driver_name: Arc<RwLock<String>>,
}

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

impl CsiOperationMetrics {
    /// Registers the histogram in `registry` (as `csi_sidecar_operations_seconds`).
    pub fn register(registry: &mut Registry) -> Self {
        let operations: OperationFamily = Family::new_with_constructor(operation_histogram);
        registry.register(
            "csi_sidecar_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            operations.clone(),
        );
        Self {
            operations,
            driver_name: Arc::default(),
        }
    }

    /// Metrics that are recorded nowhere (for tools that do not serve metrics).
    pub fn unregistered() -> Self {
        Self {
            operations: Family::new_with_constructor(operation_histogram),
            driver_name: Arc::default(),
        }
    }

    /// The driver name is learnt from GetPluginInfo; calls before that carry an empty label,
    /// as upstream.
    pub fn set_driver_name(&self, name: &str) {
        *self.driver_name.write().unwrap_or_else(|p| p.into_inner()) = name.to_string();
    }

    pub fn record(&self, method: &str, code: Code, elapsed: Duration) {
        let labels = OperationLabels {
            driver_name: self
                .driver_name
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            method_name: method.to_string(),
            grpc_status_code: go_code_name(code).to_string(),
        };
        self.operations
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

/// gRPC codes as Go's `codes.Code.String()` prints them (the label values upstream emits).
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Renders a registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_with_upstream_names_and_labels() {
        let mut registry = Registry::default();
        let metrics = CsiOperationMetrics::register(&mut registry);
        metrics.record("/csi.v1.Identity/Probe", Code::Ok, Duration::from_millis(3));
        metrics.set_driver_name("hostpath.csi.k8s.io");
        metrics.record(
            "/csi.v1.Controller/CreateVolume",
            Code::DeadlineExceeded,
            Duration::from_secs(20),
        );
        let text = encode(&registry);
        assert!(
            text.contains("# TYPE csi_sidecar_operations_seconds histogram"),
            "{text}"
        );
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="",method_name="/csi.v1.Identity/Probe",grpc_status_code="OK"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_bucket{le="25.0",driver_name="hostpath.csi.k8s.io",method_name="/csi.v1.Controller/CreateVolume",grpc_status_code="DeadlineExceeded"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_bucket{le="15.0",driver_name="hostpath.csi.k8s.io",method_name="/csi.v1.Controller/CreateVolume",grpc_status_code="DeadlineExceeded"} 0"#
        ), "{text}");
    }

    #[test]
    fn code_names_match_go() {
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(Code::FailedPrecondition), "FailedPrecondition");
        assert_eq!(go_code_name(Code::Ok), "OK");
    }
}

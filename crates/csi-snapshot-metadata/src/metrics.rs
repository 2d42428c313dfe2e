//! `snapshot_metadata_controller_operations_seconds`: upstream's csi-lib-utils metrics manager
//! with subsystem `snapshot_metadata_controller` and the extra labels `target_snapshot` and
//! `base_snapshot`, one sample per SnapshotMetadata request (validation, authorization,
//! resolution and the whole stream), named by upstream's operation names.
//!
//! Upstream records GetMetadataDelta under `MetadataAllocated` too (its delta handler passes
//! the allocated operation name); the sample is told apart only by its non-empty
//! `base_snapshot`. Dashboards built on upstream see exactly that, so it is kept. Upstream's
//! manager also records the unary CSI calls (with empty snapshot labels); here those are
//! csi-grpc's `csi_sidecar_operations_seconds`, like every other sidecar's.

use std::sync::Arc;
use std::time::Duration;

use csi_grpc::metrics::{OPERATION_BUCKETS, UNKNOWN_DRIVER, go_code_name, register_as_upstream};
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::Code;

/// The family's name, with upstream's subsystem.
pub const OPERATIONS: &str = "snapshot_metadata_controller_operations_seconds";
/// Upstream's operation name of both RPCs (see the module docs).
pub const METADATA_ALLOCATED: &str = "MetadataAllocated";

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Labels {
    driver_name: Arc<str>,
    method_name: &'static str,
    grpc_status_code: &'static str,
    target_snapshot: String,
    base_snapshot: String,
}

impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("driver_name", &*self.driver_name),
            ("method_name", self.method_name),
            ("grpc_status_code", self.grpc_status_code),
            ("target_snapshot", self.target_snapshot.as_str()),
            ("base_snapshot", self.base_snapshot.as_str()),
        ]
        .encode(encoder)
    }
}

type Operations = Family<Labels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// The request histogram, labelled with the driver's name.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    operations: Operations,
    driver_name: Arc<str>,
}

impl RequestMetrics {
    pub fn register(registry: &mut Registry, driver_name: &str) -> Self {
        let operations: Operations = Family::new_with_constructor(histogram);
        register_as_upstream(
            registry,
            OPERATIONS,
            "[ALPHA] Container Storage Interface operation duration with gRPC error code status total",
            operations.clone(),
        );
        let driver_name = if driver_name.is_empty() {
            UNKNOWN_DRIVER
        } else {
            driver_name
        };
        Self {
            operations,
            driver_name: driver_name.into(),
        }
    }

    /// One finished request: `target` is `namespace/name`, `base` a delta's base handle
    /// (empty for GetMetadataAllocated).
    pub fn record(&self, target: String, base: String, code: Code, elapsed: Duration) {
        let labels = Labels {
            driver_name: Arc::clone(&self.driver_name),
            method_name: METADATA_ALLOCATED,
            grpc_status_code: go_code_name(code),
            target_snapshot: target,
            base_snapshot: base,
        };
        self.operations
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_recorded_with_upstreams_names_and_labels() {
        let mut registry = Registry::default();
        let metrics = RequestMetrics::register(&mut registry, "hostpath.csi.k8s.io");
        metrics.record(
            "ns/snap".into(),
            String::new(),
            Code::Ok,
            Duration::from_millis(300),
        );
        metrics.record(
            "ns/snap-2".into(),
            "handle-1".into(),
            Code::PermissionDenied,
            Duration::from_secs(2),
        );
        let text = csi_grpc::metrics::encode(&registry);
        assert!(text.contains(
            "# HELP snapshot_metadata_controller_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total\n"
        ), "{text}");
        assert!(text.contains(
            r#"snapshot_metadata_controller_operations_seconds_bucket{base_snapshot="",driver_name="hostpath.csi.k8s.io",grpc_status_code="OK",method_name="MetadataAllocated",target_snapshot="ns/snap",le="0.5"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"snapshot_metadata_controller_operations_seconds_count{base_snapshot="handle-1",driver_name="hostpath.csi.k8s.io",grpc_status_code="PermissionDenied",method_name="MetadataAllocated",target_snapshot="ns/snap-2"} 1"#
        ), "{text}");
    }
}

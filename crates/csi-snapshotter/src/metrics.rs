//! The snapshot-controller's operation metrics, with upstream's names, labels and buckets
//! (external-snapshotter `pkg/metrics`): `snapshot_controller_operation_total_seconds` from the
//! moment the controller first sees an operation to its end — CreateSnapshot until the
//! snapshot's `creationTime` is set, CreateSnapshotAndReady until it is ready to use,
//! DeleteSnapshot until the VolumeSnapshot is gone, and CreateGroupSnapshot,
//! CreateGroupSnapshotAndReady and DeleteGroupSnapshot the same for a VolumeGroupSnapshot — and
//! `snapshot_controller_operations_in_flight`. A snapshot (or group) deleted before it was cut or
//! ready ends its create operations as `cancel`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use csi_sidecar::lock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upstream's buckets.
const BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    CreateSnapshot,
    CreateSnapshotAndReady,
    DeleteSnapshot,
    CreateGroupSnapshot,
    CreateGroupSnapshotAndReady,
    DeleteGroupSnapshot,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Self::CreateSnapshot => "CreateSnapshot",
            Self::CreateSnapshotAndReady => "CreateSnapshotAndReady",
            Self::DeleteSnapshot => "DeleteSnapshot",
            Self::CreateGroupSnapshot => "CreateGroupSnapshot",
            Self::CreateGroupSnapshotAndReady => "CreateGroupSnapshotAndReady",
            Self::DeleteGroupSnapshot => "DeleteGroupSnapshot",
        }
    }
}

/// How an operation ended.
pub const SUCCESS: &str = "success";
pub const CANCEL: &str = "cancel";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    driver_name: String,
    operation_name: String,
    snapshot_type: String,
    operation_status: String,
}

#[derive(Debug)]
struct Started {
    at: Instant,
    driver: String,
    snapshot_type: &'static str,
}

type Seconds = Family<OperationLabels, Histogram, fn() -> Histogram>;

#[derive(Debug)]
pub struct OperationMetrics {
    seconds: Seconds,
    in_flight: Gauge,
    started: Mutex<HashMap<(Operation, String), Started>>,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

impl OperationMetrics {
    /// Registers both metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        let subsystem = registry.sub_registry_with_prefix("snapshot_controller");
        csi_grpc::metrics::register_as_upstream(
            subsystem,
            "operation_total_seconds",
            "[ALPHA] Total number of seconds spent by the controller on an operation",
            metrics.seconds.clone(),
        );
        csi_grpc::metrics::register_as_upstream(
            subsystem,
            "operations_in_flight",
            "[ALPHA] Total number of operations in flight",
            metrics.in_flight.clone(),
        );
        metrics
    }

    /// Metrics recorded nowhere (a controller run in a test).
    pub fn unregistered() -> Self {
        Self {
            seconds: Family::new_with_constructor(histogram),
            in_flight: Gauge::default(),
            started: Mutex::default(),
        }
    }

    /// Starts `operation` of the snapshot `uid` unless it runs already. `pre_provisioned`
    /// decides the `snapshot_type`; an empty driver is `unknown`, as upstream.
    pub fn start(&self, operation: Operation, uid: &str, driver: &str, pre_provisioned: bool) {
        let mut started = lock(&self.started);
        started
            .entry((operation, uid.to_string()))
            .or_insert_with(|| Started {
                at: Instant::now(),
                driver: if driver.is_empty() {
                    "unknown".to_string()
                } else {
                    driver.to_string()
                },
                snapshot_type: if pre_provisioned {
                    "pre-provisioned"
                } else {
                    "dynamic"
                },
            });
        self.in_flight
            .set(i64::try_from(started.len()).unwrap_or(i64::MAX));
    }

    /// Ends `operation` of `uid` with `status` (nothing if it was not started).
    pub fn finish(&self, operation: Operation, uid: &str, status: &str) {
        let mut started = lock(&self.started);
        if let Some(begun) = started.remove(&(operation, uid.to_string())) {
            self.seconds
                .get_or_create(&OperationLabels {
                    driver_name: begun.driver,
                    operation_name: operation.name().to_string(),
                    snapshot_type: begun.snapshot_type.to_string(),
                    operation_status: status.to_string(),
                })
                .observe(begun.at.elapsed().as_secs_f64());
        }
        self.in_flight
            .set(i64::try_from(started.len()).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `/metrics` serves.
    fn text(registry: &Registry) -> String {
        csi_grpc::metrics::encode(registry)
    }

    #[test]
    fn operations_are_timed_under_upstreams_names() {
        let mut registry = Registry::default();
        let metrics = OperationMetrics::register(&mut registry);
        metrics.start(Operation::CreateSnapshot, "u1", "d.csi", false);
        metrics.start(Operation::CreateSnapshotAndReady, "u1", "d.csi", false);
        metrics.start(Operation::CreateSnapshot, "u1", "other", true);
        assert!(text(&registry).contains("snapshot_controller_operations_in_flight 2"));
        metrics.finish(Operation::CreateSnapshot, "u1", SUCCESS);
        metrics.finish(Operation::CreateSnapshotAndReady, "u1", CANCEL);
        metrics.finish(Operation::DeleteSnapshot, "u1", SUCCESS);
        let out = text(&registry);
        assert!(
            out.contains("snapshot_controller_operations_in_flight 0"),
            "{out}"
        );
        assert!(
            out.contains("# HELP snapshot_controller_operations_in_flight [ALPHA] Total number of operations in flight\n"),
            "component-base's help: {out}"
        );
        assert!(
            out.contains(
                "snapshot_controller_operation_total_seconds_count{driver_name=\"d.csi\",operation_name=\"CreateSnapshot\",operation_status=\"success\",snapshot_type=\"dynamic\"} 1"
            ),
            "the first start counts: {out}"
        );
        assert!(out.contains("operation_name=\"CreateSnapshotAndReady\",operation_status=\"cancel\",snapshot_type=\"dynamic\"} 1"));
        assert!(
            !out.contains("DeleteSnapshot"),
            "never started, never recorded"
        );
    }

    #[test]
    fn group_operations_are_timed_under_upstreams_names() {
        let mut registry = Registry::default();
        let metrics = OperationMetrics::register(&mut registry);
        for operation in [
            Operation::CreateGroupSnapshot,
            Operation::CreateGroupSnapshotAndReady,
            Operation::DeleteGroupSnapshot,
        ] {
            metrics.start(operation, "g1", "d.csi", true);
            metrics.finish(operation, "g1", SUCCESS);
        }
        let out = text(&registry);
        for name in [
            "CreateGroupSnapshot",
            "CreateGroupSnapshotAndReady",
            "DeleteGroupSnapshot",
        ] {
            assert!(
                out.contains(&format!("operation_name=\"{name}\",operation_status=\"success\",snapshot_type=\"pre-provisioned\"}} 1")),
                "{name}: {out}"
            );
        }
    }

    #[test]
    fn an_unknown_driver_is_named_so() {
        let mut registry = Registry::default();
        let metrics = OperationMetrics::register(&mut registry);
        metrics.start(Operation::DeleteSnapshot, "u2", "", true);
        metrics.finish(Operation::DeleteSnapshot, "u2", SUCCESS);
        assert!(text(&registry).contains("driver_name=\"unknown\",operation_name=\"DeleteSnapshot\",operation_status=\"success\",snapshot_type=\"pre-provisioned\""));
    }
}

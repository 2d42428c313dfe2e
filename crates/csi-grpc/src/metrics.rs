//! Prometheus metrics shared by the sidecars, with csi-lib-utils' names, labels and buckets so
//! existing dashboards and alerts keep working.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder,
};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::Code;

pub mod process;
pub mod text;

/// Registers `metric` under upstream's exact help text. `Registry::register` appends a "." to
/// every help text, which upstream's texts either end with already or lack on purpose:
/// component-base prefixes its metrics' texts with their stability level ("[ALPHA] ") and
/// adds nothing at the end. Counters still get their `_total` samples.
pub fn register_as_upstream(
    registry: &mut Registry,
    name: &'static str,
    help: &'static str,
    metric: impl EncodeMetric + std::fmt::Debug + Send + Sync + 'static,
) {
    registry.register_collector(Box::new(UpstreamHelp { name, help, metric }));
}

#[derive(Debug)]
struct UpstreamHelp<M> {
    name: &'static str,
    help: &'static str,
    metric: M,
}

impl<M: EncodeMetric + std::fmt::Debug + Send + Sync + 'static> Collector for UpstreamHelp<M> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_as_upstream(&mut encoder, self.name, self.help, &self.metric)
    }
}

/// One family of a collector, with `help` as given (nothing appended).
pub fn encode_as_upstream(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(family)
}

/// csi-lib-utils' `driver_name` label before the driver has told its name.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// csi-lib-utils' buckets for `csi_sidecar_operations_seconds`.
pub const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// The CSI drivers that replace an in-tree plugin (csi-translation-lib's `inTreePlugins`).
pub const MIGRATION_TARGETS: [&str; 7] = [
    "pd.csi.storage.gke.io",
    "ebs.csi.aws.com",
    "cinder.csi.openstack.org",
    "disk.csi.azure.com",
    "file.csi.azure.com",
    "csi.vsphere.vmware.com",
    "pxd.portworx.com",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct OperationLabels {
    pub driver_name: String,
    /// The full gRPC method, e.g. `/csi.v1.Controller/CreateVolume`.
    pub method_name: String,
    /// Go's `codes.Code.String()` spelling, e.g. `OK`, `DeadlineExceeded`.
    pub grpc_status_code: String,
    /// `migrated`, present only where upstream adds it: in the provisioner, attacher and
    /// resizer of a migration-target driver. Always "false": we do not translate in-tree
    /// volumes, so no call is for a migrated one.
    pub migrated: Option<&'static str>,
}

impl EncodeLabelSet for OperationLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let mut labels = vec![
            ("driver_name", self.driver_name.as_str()),
            ("method_name", self.method_name.as_str()),
            ("grpc_status_code", self.grpc_status_code.as_str()),
        ];
        labels.extend(self.migrated.map(|migrated| ("migrated", migrated)));
        labels.encode(encoder)
    }
}

type OperationFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// `csi_sidecar_operations_seconds{driver_name,method_name,grpc_status_code[,migrated]}`.
#[derive(Clone, Debug)]
pub struct CsiOperationMetrics {
    operations: OperationFamily,
    driver: Arc<RwLock<DriverLabels>>,
    /// Whether this component labels calls of a migration-target driver with `migrated`.
    labels_migration: bool,
}

#[derive(Debug)]
struct DriverLabels {
    name: String,
    migrated: Option<&'static str>,
}

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

impl CsiOperationMetrics {
    /// Registers the histogram in `registry` (as `csi_sidecar_operations_seconds`).
    pub fn register(registry: &mut Registry) -> Self {
        let operations: OperationFamily = Family::new_with_constructor(operation_histogram);
        register_as_upstream(
            registry,
            "csi_sidecar_operations_seconds",
            "[ALPHA] Container Storage Interface operation duration with gRPC error code status total",
            operations.clone(),
        );
        Self::with_family(operations, false)
    }

    /// [`register`](Self::register) for the sidecars that use csi-lib-utils' `WithMigration`
    /// (provisioner, attacher, resizer): once the driver is known to be a migration target,
    /// every call also carries `migrated="false"`.
    pub fn register_with_migration(registry: &mut Registry) -> Self {
        let metrics = Self::register(registry);
        Self {
            labels_migration: true,
            ..metrics
        }
    }

    fn with_family(operations: OperationFamily, labels_migration: bool) -> Self {
        Self {
            operations,
            driver: Arc::new(RwLock::new(DriverLabels {
                name: UNKNOWN_DRIVER.to_string(),
                migrated: None,
            })),
            labels_migration,
        }
    }

    /// Metrics that are recorded nowhere (for tools that do not serve metrics).
    pub fn unregistered() -> Self {
        Self::with_family(Family::new_with_constructor(operation_histogram), false)
    }

    /// Whether the calls of driver `name` carry `migrated` (a migration target, in a sidecar
    /// that labels them).
    pub fn labels_migration_of(&self, name: &str) -> bool {
        self.labels_migration && MIGRATION_TARGETS.contains(&name)
    }

    /// The driver name is learnt from GetPluginInfo; calls before that (and after an empty
    /// answer) carry [`UNKNOWN_DRIVER`], as csi-lib-utils' `SetDriverName`. A migration
    /// target starts the family afresh: upstream then serves a second metrics manager, made
    /// `WithMigration`, and the calls recorded before it are not served.
    pub fn set_driver_name(&self, name: &str) {
        let name = if name.is_empty() {
            UNKNOWN_DRIVER
        } else {
            name
        };
        let migrated = self.labels_migration_of(name).then_some("false");
        let mut driver = self.driver.write().unwrap_or_else(|p| p.into_inner());
        if migrated.is_some() && driver.migrated.is_none() {
            self.operations.clear();
        }
        *driver = DriverLabels {
            name: name.to_string(),
            migrated,
        };
    }

    pub fn record(&self, method: &str, code: Code, elapsed: Duration) {
        let labels = {
            let driver = self.driver.read().unwrap_or_else(|p| p.into_inner());
            OperationLabels {
                driver_name: driver.name.clone(),
                method_name: method.to_string(),
                grpc_status_code: go_code_name(code).to_string(),
                migrated: driver.migrated,
            }
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

/// Renders a registry in the Prometheus text format the Go sidecars serve ([`text`]).
pub fn encode(registry: &Registry) -> String {
    let mut openmetrics = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut openmetrics, registry);
    text::from_openmetrics(&openmetrics)
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
        assert!(
            text.contains("# HELP csi_sidecar_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total\n"),
            "component-base's help: {text}"
        );
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_bucket{driver_name="hostpath.csi.k8s.io",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume",le="25"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_bucket{driver_name="hostpath.csi.k8s.io",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume",le="15"} 0"#
        ), "{text}");
    }

    #[test]
    fn an_empty_driver_name_is_unknown_driver() {
        let mut registry = Registry::default();
        let metrics = CsiOperationMetrics::register(&mut registry);
        metrics.set_driver_name("hostpath.csi.k8s.io");
        metrics.set_driver_name("");
        metrics.record("/csi.v1.Identity/Probe", Code::Ok, Duration::from_millis(1));
        let text = encode(&registry);
        assert!(
            text.contains(r#"{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"}"#),
            "{text}"
        );
    }

    #[test]
    fn migration_targets_get_the_migrated_label_where_upstream_adds_it() {
        // (driver, WithMigration, migrated label, calls before the name still served)
        let table = [
            ("ebs.csi.aws.com", true, Some("false"), false),
            ("pd.csi.storage.gke.io", true, Some("false"), false),
            ("hostpath.csi.k8s.io", true, None, true),
            ("ebs.csi.aws.com", false, None, true),
        ];
        for (driver, labels_migration, want, earlier_served) in table {
            let mut registry = Registry::default();
            let metrics = if labels_migration {
                CsiOperationMetrics::register_with_migration(&mut registry)
            } else {
                CsiOperationMetrics::register(&mut registry)
            };
            metrics.record("/csi.v1.Identity/Probe", Code::Ok, Duration::from_millis(1));
            metrics.set_driver_name(driver);
            metrics.record("/csi.v1.Identity/Probe", Code::Ok, Duration::from_millis(1));
            let text = encode(&registry);
            let before = r#"_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#;
            assert_eq!(text.contains(before), earlier_served, "{driver}: {text}");
            let migrated = want
                .map(|m| format!(r#",migrated="{m}""#))
                .unwrap_or_default();
            let after = format!(
                r#"_count{{driver_name="{driver}",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"{migrated}}} 1"#
            );
            assert!(
                text.contains(&after),
                "{driver} {labels_migration}: {after} not in {text}"
            );
        }
    }

    #[test]
    fn code_names_match_go() {
        assert_eq!(go_code_name(Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(Code::FailedPrecondition), "FailedPrecondition");
        assert_eq!(go_code_name(Code::Ok), "OK");
    }
}

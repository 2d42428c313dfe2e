//! The provisioning and deletion metrics of sig-storage-lib-external-provisioner, with its names,
//! labels and buckets (Prometheus' DefBuckets), so dashboards keep working.

use std::time::Duration;

use csi_grpc::metrics::register_as_upstream;
use csi_sidecar::workqueue_metrics::WorkqueueMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Prometheus' default buckets (client_golang `DefBuckets`).
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProvisionLabels {
    pub class: String,
    /// The claim's `spec.dataSource.kind` (empty without one).
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeleteLabels {
    pub class: String,
}

fn histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// `controller_persistentvolumeclaim_provision_*` and `controller_persistentvolume_delete_*`.
#[derive(Clone, Debug)]
pub struct ProvisionerMetrics {
    provisioned: Family<ProvisionLabels, Counter>,
    provision_failed: Family<ProvisionLabels, Counter>,
    provision_duration: Histograms<ProvisionLabels>,
    deleted: Family<DeleteLabels, Counter>,
    delete_failed: Family<DeleteLabels, Counter>,
    delete_duration: Histograms<DeleteLabels>,
    /// client-go's `workqueue_*`: the provisioner's queues "claims" and "volumes".
    pub workqueues: WorkqueueMetrics,
}

impl Default for ProvisionerMetrics {
    /// Families that are not exported (for in-process use without an HTTP endpoint).
    fn default() -> Self {
        Self {
            provisioned: Family::default(),
            provision_failed: Family::default(),
            provision_duration: Family::new_with_constructor(histogram),
            deleted: Family::default(),
            delete_failed: Family::default(),
            delete_duration: Family::new_with_constructor(histogram),
            workqueues: WorkqueueMetrics::default(),
        }
    }
}

impl ProvisionerMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            workqueues: WorkqueueMetrics::register(registry),
            ..Self::default()
        };
        // prometheus-client appends `_total` to counters. ("succesfully" is upstream's spelling.)
        register_as_upstream(
            registry,
            "controller_persistentvolumeclaim_provision",
            "Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
            metrics.provisioned.clone(),
        );
        register_as_upstream(
            registry,
            "controller_persistentvolumeclaim_provision_failed",
            "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim.",
            metrics.provision_failed.clone(),
        );
        register_as_upstream(
            registry,
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim.",
            metrics.provision_duration.clone(),
        );
        register_as_upstream(
            registry,
            "controller_persistentvolume_delete",
            "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
            metrics.deleted.clone(),
        );
        register_as_upstream(
            registry,
            "controller_persistentvolume_delete_failed",
            "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
            metrics.delete_failed.clone(),
        );
        register_as_upstream(
            registry,
            "controller_persistentvolume_delete_duration_seconds",
            "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
            metrics.delete_duration.clone(),
        );
        metrics
    }

    pub fn provisioned(&self, labels: &ProvisionLabels, took: Duration) {
        self.provisioned.get_or_create(labels).inc();
        self.provision_duration
            .get_or_create(labels)
            .observe(took.as_secs_f64());
    }

    pub fn provision_failed(&self, labels: &ProvisionLabels) {
        self.provision_failed.get_or_create(labels).inc();
    }

    pub fn deleted(&self, class: &str, took: Duration) {
        let labels = DeleteLabels {
            class: class.to_string(),
        };
        self.deleted.get_or_create(&labels).inc();
        self.delete_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub fn delete_failed(&self, class: &str) {
        self.delete_failed
            .get_or_create(&DeleteLabels {
                class: class.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_and_labels() {
        let mut registry = Registry::default();
        let metrics = ProvisionerMetrics::register(&mut registry);
        let labels = ProvisionLabels {
            class: "fast".into(),
            source: String::new(),
        };
        metrics.provisioned(&labels, Duration::from_millis(30));
        metrics.provision_failed(&labels);
        metrics.deleted("fast", Duration::from_millis(5));
        metrics.delete_failed("fast");
        let text = csi_grpc::metrics::encode(&registry);
        for line in [
            "controller_persistentvolumeclaim_provision_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_duration_seconds_count{class=\"fast\"} 1",
            // sig-storage-lib's texts, registered on a plain registry: no prefix, one ".".
            "# HELP controller_persistentvolumeclaim_provision_total Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.\n",
            "# HELP controller_persistentvolume_delete_duration_seconds Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.\n",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}

//! What `report --serve` exposes: one gauge per finding kind, so an alert fires on a leak.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::report::{KINDS, Report};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SideLabel {
    pub side: String,
}

#[derive(Clone, Debug, Default)]
pub struct InventoryMetrics {
    pub findings: Family<KindLabel, Gauge>,
    pub objects: Family<SideLabel, Gauge>,
    pub last_scan: Gauge,
    pub scan_errors: Counter,
}

impl InventoryMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "csi_inventory_findings",
            "Findings of the last scan, by kind (orphaned, orphanedEphemeral, missing, mismatched, abnormal, orphanedSnapshot, missingSnapshot)",
            metrics.findings.clone(),
        );
        registry.register(
            "csi_inventory_objects",
            "Volumes on the storage and PersistentVolumes of the driver at the last scan",
            metrics.objects.clone(),
        );
        registry.register(
            "csi_inventory_last_scan_timestamp_seconds",
            "Unix time of the last complete scan",
            metrics.last_scan.clone(),
        );
        registry.register(
            "csi_inventory_scan_errors",
            "Scans that failed",
            metrics.scan_errors.clone(),
        );
        metrics
    }

    pub fn record(&self, report: &Report, unix_seconds: i64) {
        for kind in KINDS {
            let count = i64::try_from(report.count(kind)).unwrap_or(i64::MAX);
            self.findings
                .get_or_create(&KindLabel { kind: kind.into() })
                .set(count);
        }
        for (side, count) in [
            ("storage", report.volumes_on_storage),
            ("cluster", report.persistent_volumes),
        ] {
            self.objects
                .get_or_create(&SideLabel { side: side.into() })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.last_scan.set(unix_seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Inputs, StorageVolume, compare};

    #[test]
    fn a_scan_sets_every_kind_even_the_empty_ones() {
        let mut registry = Registry::default();
        let metrics = InventoryMetrics::register(&mut registry);
        let report = compare(
            "hostpath",
            &Inputs {
                volumes: vec![StorageVolume {
                    id: "vol-1".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        metrics.record(&report, 1_700_000_000);
        let text = csi_grpc::metrics::encode(&registry);
        assert!(
            text.contains("csi_inventory_findings{kind=\"orphaned\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("csi_inventory_findings{kind=\"missing\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("csi_inventory_objects{side=\"storage\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("csi_inventory_last_scan_timestamp_seconds 1.7e+09"),
            "{text}"
        );
        assert!(text.contains("csi_inventory_scan_errors_total 0"), "{text}");
    }
}

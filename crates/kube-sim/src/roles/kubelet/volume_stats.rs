//! kubelet's volume stats calculator (pkg/kubelet/server/stats/volume_stat_calculator.go and
//! pkg/volume/csi/csi_client.go `NodeGetVolumeStats`): every `--volume-stats-agg-period`
//! (jittered up to twice that), NodeGetVolumeStats on each published volume of each pod whose
//! driver has GET_VOLUME_STATS. That is where node-side volume health reaches Kubernetes: with
//! the `CSIVolumeHealth` gate (alpha since 1.21, off by default, still alpha), for a driver that
//! advertises the node VOLUME_CONDITION capability, an abnormal `volume_condition` becomes a
//! Warning `VolumeConditionAbnormal` Event on the pod — recorded again every pass while it
//! lasts (the Event correlator turns repeats into a count), nothing when it recovers — and the
//! `kubelet_volume_stats_health_status_abnormal` gauge of the claim.
//!
//! Kubelets through 1.36 speak CSI v1.12 here: the field and the capability are the ones CSI
//! v1.13 removed. So this kubelet reads the response as v1.12, and a driver that serves only
//! v1.13's health RPCs gets no node-side Events from it, as from a real one.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi::node_service_capability::rpc::Type as NodeCapability;
use csi::volume_usage::Unit;
use csi_proto::csi::v1 as csi;
use csi_proto::csi::v1_12;
use csi_sidecar::events::EventType;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::plugins::CSI_TIMEOUT;
use super::volumes::Published;
use crate::roles::lock;

/// The Event reason kubelet records on a pod with an abnormal volume.
pub const VOLUME_CONDITION_ABNORMAL: &str = "VolumeConditionAbnormal";

/// kubelet's `--volume-stats-agg-period` default.
pub const DEFAULT_VOLUME_STATS_AGG_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// What kubelet's volume stats collector exports for one claim: the `kubelet_volume_stats_*`
/// gauges, labelled `namespace` and `persistentvolumeclaim`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub namespace: String,
    pub persistent_volume_claim: String,
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
    /// `kubelet_volume_stats_health_status_abnormal`: present only with the gate on and a
    /// driver that advertises VOLUME_CONDITION.
    pub abnormal: Option<bool>,
}

/// One NodeGetVolumeStats answer as kubelet's `volume.Metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Metrics {
    capacity_bytes: u64,
    available_bytes: u64,
    used_bytes: u64,
    inodes: u64,
    inodes_free: u64,
    inodes_used: u64,
    /// `(abnormal, message)` when the condition is read.
    condition: Option<(bool, String)>,
}

/// kubelet's reading of a response: no usage is an error (the volume gets no stats at all),
/// the condition counts only when `read_condition` (gate on, capability advertised), and
/// negative values, which the spec forbids, count as zero.
fn metrics_of(
    response: &v1_12::NodeGetVolumeStatsResponse,
    read_condition: bool,
) -> Result<Metrics, String> {
    if response.usage.is_empty() {
        return Err("failed to get usage from response. usage is nil".to_string());
    }
    let mut metrics = Metrics::default();
    if read_condition {
        let condition = response.volume_condition.clone().unwrap_or_default();
        metrics.condition = Some((condition.abnormal, condition.message));
    }
    let value = |n: i64| u64::try_from(n).unwrap_or(0);
    for usage in &response.usage {
        match Unit::try_from(usage.unit) {
            Ok(Unit::Bytes) => {
                metrics.available_bytes = value(usage.available);
                metrics.capacity_bytes = value(usage.total);
                metrics.used_bytes = value(usage.used);
            }
            Ok(Unit::Inodes) => {
                metrics.inodes_free = value(usage.available);
                metrics.inodes = value(usage.total);
                metrics.inodes_used = value(usage.used);
            }
            _ => tracing::warn!(unit = usage.unit, "unknown unit in VolumeUsage"),
        }
    }
    Ok(metrics)
}

/// The Event message for an abnormal volume, named as the pod names it.
fn abnormal_message(pod_volume: &str, metrics: &Metrics) -> Option<String> {
    match &metrics.condition {
        Some((true, message)) => Some(format!("Volume {pod_volume}: {message}")),
        _ => None,
    }
}

/// The calculator's loop; its results are what [`super::Kubelet::volume_stats`] reports.
pub(super) async fn calculate(shared: Arc<Shared>, pods: Store<Pod>, token: CancellationToken) {
    let period = shared.config.volume_stats_agg_period;
    loop {
        if !shared.partitioned() {
            let latest = pass(&shared, &pods).await;
            *lock(&shared.volume_stats) = latest;
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(csi_sidecar::backoff::jitter(period, 1.0)) => {}
        }
    }
}

/// Stats of every published volume of every pod still on the node, by pod UID.
async fn pass(shared: &Shared, pods: &Store<Pod>) -> BTreeMap<String, Vec<VolumeStats>> {
    let published = shared.volumes.lock().await.published();
    let mut latest = BTreeMap::new();
    for pod in pods.state() {
        let uid = pod.uid().unwrap_or_default();
        let Some(volumes) = published.get(&uid) else {
            continue;
        };
        let mut stats = Vec::new();
        for volume in volumes {
            let Some(metrics) = volume_metrics(shared, &pod, volume).await else {
                continue;
            };
            if let Some(message) = abnormal_message(&volume.pod_volume, &metrics) {
                shared
                    .events
                    .publish(
                        &pod.object_ref(&()),
                        EventType::Warning,
                        VOLUME_CONDITION_ABNORMAL,
                        &message,
                    )
                    .await;
            }
            if let Some(claim) = claim_of(&pod, &volume.pod_volume) {
                stats.push(VolumeStats {
                    namespace: pod.namespace().unwrap_or_default(),
                    persistent_volume_claim: claim,
                    capacity_bytes: metrics.capacity_bytes,
                    available_bytes: metrics.available_bytes,
                    used_bytes: metrics.used_bytes,
                    inodes: metrics.inodes,
                    inodes_free: metrics.inodes_free,
                    inodes_used: metrics.inodes_used,
                    abnormal: metrics.condition.map(|(abnormal, _)| abnormal),
                });
            }
        }
        latest.insert(uid, stats);
    }
    latest
}

/// NodeGetVolumeStats for one volume, or `None` (logged) where kubelet gets no metrics.
async fn volume_metrics(shared: &Shared, pod: &Pod, volume: &Published) -> Option<Metrics> {
    let driver = shared.drivers.get(&volume.driver_name)?;
    if !driver.can(NodeCapability::GetVolumeStats) {
        return None;
    }
    let staged = driver.can(NodeCapability::StageUnstageVolume);
    let request = v1_12::NodeGetVolumeStatsRequest {
        volume_id: volume.volume_handle.clone(),
        volume_path: volume.target_path.display().to_string(),
        staging_target_path: if staged {
            volume.staging_path.display().to_string()
        } else {
            String::new()
        },
    };
    let read_condition = shared.config.csi_volume_health && driver.volume_condition;
    let outcome = driver
        .csi
        .legacy_node_get_volume_stats(request, CSI_TIMEOUT)
        .await
        .map_err(|status| status.message().to_string())
        .and_then(|response| metrics_of(&response, read_condition));
    match outcome {
        Ok(metrics) => Some(metrics),
        Err(error) => {
            tracing::debug!(node = %shared.config.node, pod = %pod.name_any(), volume = %volume.pod_volume, %error, "failed to calculate volume metrics");
            None
        }
    }
}

/// The claim a pod volume names: its `persistentVolumeClaim`, or the claim of a generic
/// ephemeral volume (`<pod>-<volume>`).
fn claim_of(pod: &Pod, pod_volume: &str) -> Option<String> {
    let volume = pod
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == pod_volume)?;
    if let Some(source) = &volume.persistent_volume_claim {
        return Some(source.claim_name.clone());
    }
    volume
        .ephemeral
        .as_ref()
        .map(|_| format!("{}-{pod_volume}", pod.name_any()))
}

/// The collector's view: one entry per claim (the first pod's, as kubelet's), by namespace
/// and name.
pub(super) fn by_claim(latest: &BTreeMap<String, Vec<VolumeStats>>) -> Vec<VolumeStats> {
    let mut claims: BTreeMap<(String, String), VolumeStats> = BTreeMap::new();
    for stats in latest.values().flatten() {
        let key = (
            stats.namespace.clone(),
            stats.persistent_volume_claim.clone(),
        );
        claims.entry(key).or_insert_with(|| stats.clone());
    }
    claims.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(unit: Unit, available: i64, total: i64, used: i64) -> v1_12::VolumeUsage {
        v1_12::VolumeUsage {
            available,
            total,
            used,
            unit: unit as i32,
        }
    }

    fn response(
        usage: Vec<v1_12::VolumeUsage>,
        condition: Option<(bool, &str)>,
    ) -> v1_12::NodeGetVolumeStatsResponse {
        v1_12::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: condition.map(|(abnormal, message)| v1_12::VolumeCondition {
                abnormal,
                message: message.to_string(),
            }),
        }
    }

    #[test]
    fn a_response_becomes_kubelets_metrics_and_event() {
        let bytes = usage(Unit::Bytes, 700, 1000, 300);
        let inodes = usage(Unit::Inodes, 90, 100, 10);
        struct Case {
            name: &'static str,
            response: v1_12::NodeGetVolumeStatsResponse,
            read_condition: bool,
            condition: Option<(bool, &'static str)>,
            event: Option<&'static str>,
        }
        let cases = [
            Case {
                name: "abnormal, read",
                response: response(vec![bytes, inodes], Some((true, "disk gone"))),
                read_condition: true,
                condition: Some((true, "disk gone")),
                event: Some("Volume data: disk gone"),
            },
            Case {
                name: "abnormal, gate off or capability missing",
                response: response(vec![bytes], Some((true, "disk gone"))),
                read_condition: false,
                condition: None,
                event: None,
            },
            Case {
                name: "normal",
                response: response(vec![bytes], Some((false, "fine"))),
                read_condition: true,
                condition: Some((false, "fine")),
                event: None,
            },
            Case {
                name: "capability advertised, condition left out: normal",
                response: response(vec![bytes], None),
                read_condition: true,
                condition: Some((false, "")),
                event: None,
            },
        ];
        for case in cases {
            let metrics = metrics_of(&case.response, case.read_condition).unwrap();
            assert_eq!(metrics.capacity_bytes, 1000, "{}", case.name);
            assert_eq!(metrics.used_bytes, 300, "{}", case.name);
            assert_eq!(
                metrics.condition,
                case.condition.map(|(a, m)| (a, m.to_string())),
                "{}",
                case.name
            );
            assert_eq!(
                abnormal_message("data", &metrics).as_deref(),
                case.event,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn units_fill_their_own_gauges_and_negatives_count_as_zero() {
        let metrics = metrics_of(
            &response(
                vec![
                    usage(Unit::Bytes, -5, 1000, 300),
                    usage(Unit::Inodes, 90, 100, 10),
                    usage(Unit::Unknown, 1, 2, 3),
                ],
                None,
            ),
            false,
        )
        .unwrap();
        assert_eq!(
            metrics,
            Metrics {
                capacity_bytes: 1000,
                available_bytes: 0,
                used_bytes: 300,
                inodes: 100,
                inodes_free: 90,
                inodes_used: 10,
                condition: None,
            }
        );
    }

    #[test]
    fn no_usage_is_no_stats_even_when_abnormal() {
        let error = metrics_of(&response(vec![], Some((true, "gone"))), true).unwrap_err();
        assert!(error.contains("usage is nil"), "{error}");
    }

    #[test]
    fn the_collector_keeps_one_entry_per_claim() {
        let stats = |claim: &str, used| VolumeStats {
            namespace: "ns".into(),
            persistent_volume_claim: claim.into(),
            used_bytes: used,
            ..VolumeStats::default()
        };
        let latest = BTreeMap::from([
            ("a".to_string(), vec![stats("shared", 1), stats("own", 2)]),
            ("b".to_string(), vec![stats("shared", 3)]),
        ]);
        let claims = by_claim(&latest);
        assert_eq!(
            claims
                .iter()
                .map(|s| (s.persistent_volume_claim.as_str(), s.used_bytes))
                .collect::<Vec<_>>(),
            [("own", 2), ("shared", 1)]
        );
    }
}

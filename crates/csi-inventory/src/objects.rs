//! The two sides as the inventory compares them: CSI listing entries and the driver's
//! PersistentVolumes, VolumeSnapshotContents and pods' inline volumes, reduced to what
//! [`crate::report`] reads. Pure.

use std::collections::BTreeSet;

use csi::VolumeHealthErrorType;
use csi_kinds::snapshot::VolumeSnapshotContent;
use csi_proto::csi::{v1 as csi, v1_12};
use k8s_openapi::api::core::v1::{NodeSelectorTerm, PersistentVolume, Pod};
use kube::ResourceExt;

use crate::report::{
    ClusterSnapshot, ClusterVolume, Condition, InlineVolume, PvTopology, Segments, StorageSnapshot,
    StorageVolume, inline_volume_handle,
};

/// A listed volume; `condition` comes from wherever the driver reports health.
pub fn storage_volume(
    entry: &csi::list_volumes_response::Entry,
    condition: Option<Condition>,
) -> Option<StorageVolume> {
    let volume = entry.volume.as_ref()?;
    Some(StorageVolume {
        id: volume.volume_id.clone(),
        capacity_bytes: volume.capacity_bytes,
        context: volume.volume_context.clone().into_iter().collect(),
        topology: volume
            .accessible_topology
            .iter()
            .map(|t| t.segments.clone().into_iter().collect())
            .collect(),
        published_nodes: entry.status.as_ref().map(|s| s.published_node_ids.clone()),
        condition,
    })
}

/// A volume listed by a driver of the VolumeCondition generation, with its condition.
pub fn legacy_storage_volume(entry: &v1_12::list_volumes_response::Entry) -> Option<StorageVolume> {
    let condition = entry
        .status
        .as_ref()
        .and_then(|s| s.volume_condition.as_ref())
        .map(|c| Condition {
            abnormal: c.abnormal,
            message: c.message.clone(),
        });
    // The shared fields decode as v1.13's entry; only the condition is v1.12's.
    let current: csi::list_volumes_response::Entry = csi_grpc::conn::rewire(entry).ok()?;
    storage_volume(&current, condition)
}

/// A volume's condition from its v1.13 health entries (none: healthy). Statuses this build
/// does not know are left out, as the spec tells COs to ignore them.
pub fn health_condition(entries: &[csi::volume_health::VolumeHealthEntry]) -> Condition {
    let known: Vec<String> = entries
        .iter()
        .filter(|e| {
            VolumeHealthErrorType::try_from(e.status)
                .is_ok_and(|s| s != VolumeHealthErrorType::UnknownVolumeHealthType)
        })
        .map(|e| {
            let status =
                VolumeHealthErrorType::try_from(e.status).map_or("UNKNOWN", |s| s.as_str_name());
            if e.message.is_empty() {
                format!("{status} {}", e.reason)
            } else {
                format!("{status} {}: {}", e.reason, e.message)
            }
        })
        .collect();
    Condition {
        abnormal: !known.is_empty(),
        message: known.join("; "),
    }
}

pub fn storage_snapshot(entry: &csi::list_snapshots_response::Entry) -> Option<StorageSnapshot> {
    let snapshot = entry.snapshot.as_ref()?;
    Some(StorageSnapshot {
        id: snapshot.snapshot_id.clone(),
        source_volume_id: snapshot.source_volume_id.clone(),
        size_bytes: snapshot.size_bytes,
        ready: snapshot.ready_to_use,
    })
}

/// The PV as the inventory sees it, when it is a CSI PV of `driver`.
pub fn cluster_volume(pv: &PersistentVolume, driver: &str) -> Option<ClusterVolume> {
    let spec = pv.spec.as_ref()?;
    let source = spec.csi.as_ref().filter(|csi| csi.driver == driver)?;
    Some(ClusterVolume {
        pv: pv.name_any(),
        uid: pv.uid().unwrap_or_default(),
        handle: source.volume_handle.clone(),
        class: spec.storage_class_name.clone().unwrap_or_default(),
        capacity_bytes: spec
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .and_then(|q| csi_kinds::quantity::bytes(&q.0).ok()),
        topology: pv_topology(
            spec.node_affinity
                .as_ref()
                .and_then(|a| a.required.as_ref())
                .map_or(&[][..], |r| &r.node_selector_terms),
        ),
        claim: spec.claim_ref.as_ref().map(|c| {
            format!(
                "{}/{}",
                c.namespace.as_deref().unwrap_or_default(),
                c.name.as_deref().unwrap_or_default()
            )
        }),
        deleting: pv.metadata.deletion_timestamp.is_some(),
    })
}

/// The pod's CSI ephemeral inline volumes of `driver`, with the handles the kubelet gives them.
/// Every pod the API holds counts, whatever its phase: the kubelet unpublishes a finished or
/// deleted pod's volumes after the fact.
pub fn inline_volumes(pod: &Pod, driver: &str) -> Vec<InlineVolume> {
    let Some(uid) = pod.metadata.uid.as_deref() else {
        return Vec::new();
    };
    let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter(|volume| volume.csi.as_ref().is_some_and(|csi| csi.driver == driver))
        .map(|volume| InlineVolume {
            pod: name.clone(),
            volume: volume.name.clone(),
            handle: inline_volume_handle(uid, &volume.name),
        })
        .collect()
}

/// The segment maps node selector terms admit: each term of `key In [values]` expressions is
/// every combination of its values (the provisioner writes one value per key).
pub fn pv_topology(terms: &[NodeSelectorTerm]) -> PvTopology {
    if terms.is_empty() {
        return PvTopology::Everywhere;
    }
    let mut all = BTreeSet::new();
    for term in terms {
        if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
            return PvTopology::Other;
        }
        let mut combinations = vec![Segments::new()];
        for expression in term.match_expressions.iter().flatten() {
            let values = expression.values.clone().unwrap_or_default();
            if expression.operator != "In" || values.is_empty() {
                return PvTopology::Other;
            }
            combinations = combinations
                .into_iter()
                .flat_map(|segments| {
                    values.iter().map(move |value| {
                        let mut segments = segments.clone();
                        segments.insert(expression.key.clone(), value.clone());
                        segments
                    })
                })
                .collect();
        }
        all.extend(combinations.into_iter().filter(|s| !s.is_empty()));
    }
    PvTopology::Segments(all)
}

/// The content as the inventory sees it, when it is `driver`'s and names a snapshot.
pub fn cluster_snapshot(content: &VolumeSnapshotContent, driver: &str) -> Option<ClusterSnapshot> {
    if content.spec.driver != driver {
        return None;
    }
    let handle = content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.clone())
        .or_else(|| content.spec.source.snapshot_handle.clone())?;
    Some(ClusterSnapshot {
        content: content.name_any(),
        uid: content.uid().unwrap_or_default(),
        handle,
        class: content
            .spec
            .volume_snapshot_class_name
            .clone()
            .unwrap_or_default(),
        deleting: content.metadata.deletion_timestamp.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(affinity: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "uid": "u1"},
            "spec": {"capacity": {"storage": "1Gi"}, "storageClassName": "fast",
                "claimRef": {"namespace": "shop", "name": "data"},
                "csi": {"driver": "hostpath", "volumeHandle": "vol-1"},
                "nodeAffinity": affinity}
        }))
        .unwrap()
    }

    fn segments(pairs: &[(&str, &str)]) -> Segments {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_pv_of_the_driver_is_read_with_its_size_claim_and_topology() {
        let read = cluster_volume(
            &pv(json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                      {"key": "rack", "operator": "In", "values": ["1", "2"]}]}]}})),
            "hostpath",
        )
        .unwrap();
        assert_eq!(read.capacity_bytes, Some(1 << 30));
        assert_eq!(read.claim.as_deref(), Some("shop/data"));
        assert_eq!(read.class, "fast");
        assert_eq!(
            read.topology,
            PvTopology::Segments(
                [
                    segments(&[("zone", "a"), ("rack", "1")]),
                    segments(&[("zone", "a"), ("rack", "2")])
                ]
                .into()
            )
        );
        assert!(cluster_volume(&pv(json!(null)), "other").is_none());
    }

    #[test]
    fn a_pods_inline_volumes_of_the_driver_get_the_kubelets_handles() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "web-0",
                "uid": "9f1c2b7e-3d4a-4e5f-8a6b-7c8d9e0f1a2b"},
            "spec": {"containers": [{"name": "app"}], "volumes": [
                {"name": "scratch", "csi": {"driver": "hostpath"}},
                {"name": "other", "csi": {"driver": "other.example.com"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            ]}
        }))
        .unwrap();
        // printf '%s' 9f1c2b7e-3d4a-4e5f-8a6b-7c8d9e0f1a2bscratch | sha256sum
        let handle = "csi-aa9e2015c4cff5a8009d6d9119aabae2994a3a0d8a5c6b84579a1f52ca5d8d9c";
        assert_eq!(
            inline_volumes(&pod, "hostpath"),
            vec![InlineVolume {
                pod: "shop/web-0".into(),
                volume: "scratch".into(),
                handle: handle.into(),
            }]
        );
        let unsaved: Pod = serde_json::from_value(json!({"metadata": {"name": "web-1"},
            "spec": {"containers": [], "volumes": [{"name": "scratch", "csi": {"driver": "hostpath"}}]}}))
        .unwrap();
        assert_eq!(inline_volumes(&unsaved, "hostpath"), vec![]);
    }

    #[test]
    fn node_affinity_the_comparison_cannot_model_is_other() {
        let rows = [
            (json!(null), PvTopology::Everywhere),
            (
                json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}}),
                PvTopology::Other,
            ),
            (
                json!({"required": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}),
                PvTopology::Other,
            ),
        ];
        for (affinity, expected) in rows {
            assert_eq!(
                cluster_volume(&pv(affinity.clone()), "hostpath")
                    .unwrap()
                    .topology,
                expected,
                "{affinity}"
            );
        }
    }

    #[test]
    fn a_listed_volume_keeps_its_status() {
        let entry = csi::list_volumes_response::Entry {
            volume: Some(csi::Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: 5,
                accessible_topology: vec![csi::Topology {
                    segments: [("zone".to_string(), "a".to_string())].into(),
                }],
                ..Default::default()
            }),
            status: Some(csi::list_volumes_response::VolumeStatus {
                published_node_ids: vec!["n1".into()],
            }),
        };
        let volume = storage_volume(&entry, None).unwrap();
        assert_eq!(volume.published_nodes, Some(vec!["n1".to_string()]));
        assert_eq!(volume.topology, vec![segments(&[("zone", "a")])]);
        assert_eq!(volume.condition, None);
    }

    #[test]
    fn a_legacy_entry_keeps_its_fields_and_condition() {
        let entry = v1_12::list_volumes_response::Entry {
            volume: Some(v1_12::Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: 5,
                ..Default::default()
            }),
            status: Some(v1_12::list_volumes_response::VolumeStatus {
                published_node_ids: vec!["n1".into()],
                volume_condition: Some(v1_12::VolumeCondition {
                    abnormal: true,
                    message: "gone".into(),
                }),
            }),
        };
        let volume = legacy_storage_volume(&entry).unwrap();
        assert_eq!((volume.id.as_str(), volume.capacity_bytes), ("vol-1", 5));
        assert_eq!(volume.published_nodes, Some(vec!["n1".to_string()]));
        assert_eq!(
            volume.condition,
            Some(Condition {
                abnormal: true,
                message: "gone".into()
            })
        );
    }

    #[test]
    fn health_entries_fold_into_a_condition() {
        let entry =
            |status: i32, reason: &str, message: &str| csi::volume_health::VolumeHealthEntry {
                status,
                reason: reason.into(),
                message: message.into(),
            };
        let table = [
            (vec![], false, ""),
            (
                vec![entry(
                    VolumeHealthErrorType::DataLoss as i32,
                    "VolumeDataMissing",
                    "gone",
                )],
                true,
                "DATA_LOSS VolumeDataMissing: gone",
            ),
            (
                vec![
                    entry(VolumeHealthErrorType::Degraded as i32, "NodeFenced", ""),
                    entry(99, "FromTheFuture", "ignored"),
                ],
                true,
                "DEGRADED NodeFenced",
            ),
            (vec![entry(99, "FromTheFuture", "ignored")], false, ""),
        ];
        for (entries, abnormal, message) in table {
            assert_eq!(
                health_condition(&entries),
                Condition {
                    abnormal,
                    message: message.into()
                },
                "{entries:?}"
            );
        }
    }
}

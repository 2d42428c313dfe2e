//! The inventory's pure core: what the storage holds (ListVolumes, ListSnapshots) against
//! what the cluster records (PersistentVolumes and VolumeSnapshotContents of the driver, and
//! the pods' CSI ephemeral inline volumes of the driver).
//!
//! The two sides cannot be read at one instant. The cluster side is therefore read twice,
//! before and after the storage listing: a volume is orphaned only when neither reading has
//! a PV or a pod for it (a PV or pod created while the storage was listed is in the second; a
//! pod deleted meanwhile, whose volume the kubelet has yet to unpublish, is in the first), and
//! a PV is missing its volume only when it is in both readings, not being deleted (a PV whose
//! volume was made after the storage listing began is only in the second; a released volume
//! is deleted before its PV).
//!
//! An inline volume has no PV: the kubelet names it `csi-` and the hex SHA-256 of the pod's
//! UID and the volume's name in the pod ([`inline_volume_handle`]), and the driver lists it.
//! A volume of that shape no pod explains is an orphaned ephemeral volume, not an orphan to
//! import: the kubelet left it behind (its NodeUnpublishVolume never reached the driver).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The claim the provisioner made a volume for, from `--extra-create-metadata`.
pub const CLAIM_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const CLAIM_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// One topology segment map (`key → value`), as CSI's `Topology`.
pub type Segments = BTreeMap<String, String>;

/// A volume as the driver lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StorageVolume {
    pub id: String,
    /// 0: unknown (allowed by CSI).
    pub capacity_bytes: i64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub topology: Vec<Segments>,
    /// `None` when the driver does not report published nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_nodes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<Condition>,
}

impl StorageVolume {
    /// `namespace/name` of the claim the volume was provisioned for, when its context says.
    pub fn claim(&self) -> Option<String> {
        let name = self.context.get(CLAIM_NAME_KEY)?;
        let namespace = self.context.get(CLAIM_NAMESPACE_KEY)?;
        Some(format!("{namespace}/{name}"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
}

/// A PersistentVolume of the driver.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterVolume {
    pub pv: String,
    pub uid: String,
    pub handle: String,
    /// `""`: no class.
    pub class: String,
    /// `spec.capacity.storage` in bytes; `None` when absent or unreadable.
    pub capacity_bytes: Option<i64>,
    /// The segments the PV's node affinity admits.
    pub topology: PvTopology,
    /// `namespace/name` of the claim it is bound or reserved to.
    pub claim: Option<String>,
    /// Has a deletionTimestamp.
    pub deleting: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub enum PvTopology {
    /// No node affinity: every node.
    #[default]
    Everywhere,
    /// Exactly these segment maps.
    Segments(BTreeSet<Segments>),
    /// Terms this comparison does not model (operators other than `In`, field selectors).
    Other,
}

/// A snapshot as the driver lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StorageSnapshot {
    pub id: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub ready: bool,
}

/// A VolumeSnapshotContent of the driver with a snapshot handle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub content: String,
    pub uid: String,
    pub handle: String,
    pub class: String,
    pub deleting: bool,
}

/// A pod's CSI ephemeral inline volume of the driver (`spec.volumes[].csi`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InlineVolume {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The volume's name in the pod.
    pub volume: String,
    /// The kubelet's volume handle, [`inline_volume_handle`].
    pub handle: String,
}

/// The volume handle the kubelet gives a pod's inline volume: `csi-` and the hex SHA-256 of
/// the pod's UID followed by the volume's name in the pod (kubelet's `makeVolumeHandle`).
pub fn inline_volume_handle(pod_uid: &str, volume: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(pod_uid);
    digest.update(volume);
    format!("csi-{}", hex::encode(digest.finalize()))
}

/// Whether a volume ID has the shape of the kubelet's inline volume handles.
pub fn is_inline_handle(id: &str) -> bool {
    id.strip_prefix("csi-").is_some_and(|digest| {
        digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Everything one scan read.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub volumes: Vec<StorageVolume>,
    pub pvs_before: Vec<ClusterVolume>,
    pub pvs_after: Vec<ClusterVolume>,
    /// The inline volumes of the driver in the pods read before and after the storage listing.
    pub inline_before: Vec<InlineVolume>,
    pub inline_after: Vec<InlineVolume>,
    /// `None`: snapshots were not compared (no LIST_SNAPSHOTS, or the API is not served).
    pub snapshots: Option<SnapshotInputs>,
}

#[derive(Debug, Clone, Default)]
pub struct SnapshotInputs {
    pub snapshots: Vec<StorageSnapshot>,
    pub contents_before: Vec<ClusterSnapshot>,
    pub contents_after: Vec<ClusterSnapshot>,
}

/// What a scan found wrong.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Finding {
    /// On the storage, no PV, and not an inline volume's handle.
    Orphaned {
        volume: StorageVolume,
        /// The claim it was made for (`--extra-create-metadata`).
        #[serde(skip_serializing_if = "Option::is_none")]
        claim: Option<String>,
    },
    /// An inline volume's handle on the storage that no pod has: to unpublish or delete on
    /// its node, never to import as a PV.
    OrphanedEphemeral { volume: StorageVolume },
    /// A PV whose volume the driver does not list.
    #[serde(rename_all = "camelCase")]
    Missing {
        pv: String,
        volume_id: String,
        class: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        claim: Option<String>,
    },
    /// The PV and the storage disagree.
    #[serde(rename_all = "camelCase")]
    Mismatched {
        pv: String,
        volume_id: String,
        class: String,
        differences: Vec<Difference>,
    },
    /// The driver reports the volume abnormal.
    #[serde(rename_all = "camelCase")]
    Abnormal {
        volume_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pv: Option<String>,
        class: String,
        message: String,
    },
    /// A snapshot on the storage without a VolumeSnapshotContent.
    OrphanedSnapshot { snapshot: StorageSnapshot },
    /// A VolumeSnapshotContent whose snapshot the driver does not list.
    #[serde(rename_all = "camelCase")]
    MissingSnapshot {
        content: String,
        snapshot_id: String,
        class: String,
    },
}

impl Finding {
    /// The metric label and table heading of the finding's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Finding::Orphaned { .. } => "orphaned",
            Finding::OrphanedEphemeral { .. } => "orphanedEphemeral",
            Finding::Missing { .. } => "missing",
            Finding::Mismatched { .. } => "mismatched",
            Finding::Abnormal { .. } => "abnormal",
            Finding::OrphanedSnapshot { .. } => "orphanedSnapshot",
            Finding::MissingSnapshot { .. } => "missingSnapshot",
        }
    }

    /// The storage class it counts under (`""`: none known).
    pub fn class(&self) -> &str {
        match self {
            Finding::Missing { class, .. }
            | Finding::Mismatched { class, .. }
            | Finding::Abnormal { class, .. }
            | Finding::MissingSnapshot { class, .. } => class,
            Finding::Orphaned { .. }
            | Finding::OrphanedEphemeral { .. }
            | Finding::OrphanedSnapshot { .. } => "",
        }
    }
}

/// Every kind a finding can be, in report order.
pub const KINDS: [&str; 7] = [
    "orphaned",
    "orphanedEphemeral",
    "missing",
    "mismatched",
    "abnormal",
    "orphanedSnapshot",
    "missingSnapshot",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "field", rename_all = "camelCase")]
pub enum Difference {
    #[serde(rename_all = "camelCase")]
    Size { pv_bytes: i64, storage_bytes: i64 },
    #[serde(rename_all = "camelCase")]
    Topology { pv: String, storage: String },
}

/// Per storage class: how many PVs, and how many findings of each kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassCounts {
    pub persistent_volumes: usize,
    pub findings: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub driver: String,
    pub volumes_on_storage: usize,
    pub persistent_volumes: usize,
    /// The pods' inline volumes of the driver (second reading).
    pub inline_volumes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshots_on_storage: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_contents: Option<usize>,
    pub findings: Vec<Finding>,
    /// Keyed by class name; `""` holds what no class is known for (orphans).
    pub classes: BTreeMap<String, ClassCounts>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// How many findings of `kind`.
    pub fn count(&self, kind: &str) -> usize {
        self.findings.iter().filter(|f| f.kind() == kind).count()
    }
}

/// Compares the two sides.
pub fn compare(driver: &str, inputs: &Inputs) -> Report {
    let mut findings = Vec::new();
    let known: BTreeSet<&str> = inputs
        .pvs_before
        .iter()
        .chain(&inputs.pvs_after)
        .map(|pv| pv.handle.as_str())
        .chain(
            inputs
                .inline_before
                .iter()
                .chain(&inputs.inline_after)
                .map(|inline| inline.handle.as_str()),
        )
        .collect();
    let listed: BTreeMap<&str, &StorageVolume> =
        inputs.volumes.iter().map(|v| (v.id.as_str(), v)).collect();
    let by_handle: BTreeMap<&str, &ClusterVolume> = inputs
        .pvs_after
        .iter()
        .map(|pv| (pv.handle.as_str(), pv))
        .collect();
    for volume in &inputs.volumes {
        if !known.contains(volume.id.as_str()) {
            findings.push(if is_inline_handle(&volume.id) {
                Finding::OrphanedEphemeral {
                    volume: volume.clone(),
                }
            } else {
                Finding::Orphaned {
                    claim: volume.claim(),
                    volume: volume.clone(),
                }
            });
        }
        if let Some(condition) = volume.condition.as_ref().filter(|c| c.abnormal) {
            let pv = by_handle.get(volume.id.as_str());
            findings.push(Finding::Abnormal {
                volume_id: volume.id.clone(),
                pv: pv.map(|pv| pv.pv.clone()),
                class: pv.map(|pv| pv.class.clone()).unwrap_or_default(),
                message: condition.message.clone(),
            });
        }
    }
    let before: BTreeSet<&str> = inputs.pvs_before.iter().map(|pv| pv.uid.as_str()).collect();
    for pv in &inputs.pvs_after {
        match listed.get(pv.handle.as_str()) {
            None if before.contains(pv.uid.as_str()) && !pv.deleting => {
                findings.push(Finding::Missing {
                    pv: pv.pv.clone(),
                    volume_id: pv.handle.clone(),
                    class: pv.class.clone(),
                    claim: pv.claim.clone(),
                });
            }
            None => {}
            Some(volume) => {
                let differences = differences(pv, volume);
                if !differences.is_empty() {
                    findings.push(Finding::Mismatched {
                        pv: pv.pv.clone(),
                        volume_id: pv.handle.clone(),
                        class: pv.class.clone(),
                        differences,
                    });
                }
            }
        }
    }
    if let Some(snapshots) = &inputs.snapshots {
        findings.extend(compare_snapshots(snapshots));
    }
    let mut classes: BTreeMap<String, ClassCounts> = BTreeMap::new();
    for pv in &inputs.pvs_after {
        classes
            .entry(pv.class.clone())
            .or_default()
            .persistent_volumes += 1;
    }
    for finding in &findings {
        *classes
            .entry(finding.class().to_string())
            .or_default()
            .findings
            .entry(finding.kind().to_string())
            .or_default() += 1;
    }
    Report {
        driver: driver.to_string(),
        volumes_on_storage: inputs.volumes.len(),
        persistent_volumes: inputs.pvs_after.len(),
        inline_volumes: inputs.inline_after.len(),
        snapshots_on_storage: inputs.snapshots.as_ref().map(|s| s.snapshots.len()),
        snapshot_contents: inputs.snapshots.as_ref().map(|s| s.contents_after.len()),
        findings,
        classes,
    }
}

fn compare_snapshots(inputs: &SnapshotInputs) -> Vec<Finding> {
    let known: BTreeSet<&str> = inputs
        .contents_before
        .iter()
        .chain(&inputs.contents_after)
        .map(|c| c.handle.as_str())
        .collect();
    let listed: BTreeSet<&str> = inputs.snapshots.iter().map(|s| s.id.as_str()).collect();
    let before: BTreeSet<&str> = inputs
        .contents_before
        .iter()
        .map(|c| c.uid.as_str())
        .collect();
    let orphaned = inputs
        .snapshots
        .iter()
        .filter(|s| !known.contains(s.id.as_str()))
        .map(|s| Finding::OrphanedSnapshot {
            snapshot: s.clone(),
        });
    let missing = inputs
        .contents_after
        .iter()
        .filter(|c| {
            before.contains(c.uid.as_str()) && !c.deleting && !listed.contains(c.handle.as_str())
        })
        .map(|c| Finding::MissingSnapshot {
            content: c.content.clone(),
            snapshot_id: c.handle.clone(),
            class: c.class.clone(),
        });
    orphaned.chain(missing).collect()
}

/// Where a PV and its volume disagree. A size of 0 on the storage is "unknown" (CSI) and a
/// volume without topology is accessible everywhere as far as the driver says, so neither is
/// compared.
fn differences(pv: &ClusterVolume, volume: &StorageVolume) -> Vec<Difference> {
    let mut differences = Vec::new();
    if let Some(pv_bytes) = pv.capacity_bytes
        && volume.capacity_bytes > 0
        && pv_bytes != volume.capacity_bytes
    {
        differences.push(Difference::Size {
            pv_bytes,
            storage_bytes: volume.capacity_bytes,
        });
    }
    if !volume.topology.is_empty() {
        let storage: BTreeSet<Segments> = volume.topology.iter().cloned().collect();
        let differs = match &pv.topology {
            PvTopology::Everywhere => true,
            PvTopology::Segments(segments) => *segments != storage,
            PvTopology::Other => false,
        };
        if differs {
            differences.push(Difference::Topology {
                pv: describe_pv_topology(&pv.topology),
                storage: describe_segments(storage.iter()),
            });
        }
    }
    differences
}

/// `zone=a,node=x | zone=b` — one group per segment map.
pub fn describe_segments<'a>(segments: impl Iterator<Item = &'a Segments>) -> String {
    segments
        .map(|s| {
            s.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn describe_pv_topology(topology: &PvTopology) -> String {
    match topology {
        PvTopology::Everywhere => "no node affinity".to_string(),
        PvTopology::Segments(segments) => describe_segments(segments.iter()),
        PvTopology::Other => "node affinity with other operators".to_string(),
    }
}

#[cfg(test)]
mod tests;

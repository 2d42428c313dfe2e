//! The record of provisionings in flight: what protects a volume from leaking while it exists
//! at the driver without a PV yet. Before its first CreateVolume a claim is entered in one
//! Lease per provisioner, written for many claims at once; once its PV exists (or nothing was
//! created) the entry goes in a later write. A claim deleted meanwhile, or a provisioner that
//! dies meanwhile, leaves its entry: the provisioner then finishes the provisioning from the
//! entry alone — CreateVolume is idempotent by name, so it returns the volume already made —
//! and creates the PV, which the PV controller releases and reclaims as any PV of a deleted
//! claim. (Upstream keeps this in memory only and leaks on restart: external-provisioner #486;
//! before this record we kept a finalizer on each claim: two claim writes per volume.)
//!
//! An entry holds the claim as it was (name, namespace, UID, labels, annotations, spec) and
//! the StorageClass the attempt used ([`crate::protection::record`]): what CreateVolume and
//! the PV need, secrets by name only. The Lease is one object, so its annotations — one per
//! entry — are bounded by [`MAX_RECORD_BYTES`]; a claim waits while the record is full. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

/// The annotation prefix of an entry; the claim's UID follows.
pub const ENTRY_PREFIX: &str = "inflight.csi-suite.io/";

/// What a record may hold, below the API server's 256 KiB for all of an object's annotations.
pub const MAX_RECORD_BYTES: usize = 200 * 1024;

/// The Lease holding the record of the provisioner of `driver` (and with `--node-deployment`
/// of `node`), in the leader election namespace.
pub fn lease_name(driver: &str, node: Option<&str>) -> String {
    let driver = csi_sidecar::leader::sanitize_name(driver);
    match node {
        Some(node) => format!("{driver}-provisioning-{node}"),
        None => format!("{driver}-provisioning"),
    }
}

/// One provisioning in flight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub claim: PersistentVolumeClaim,
    pub class: StorageClass,
}

impl Entry {
    /// The entry of an attempt on `claim` with `class`: the claim without what does not
    /// decide its volume (status, managed fields, finalizers, versions).
    pub fn new(claim: &PersistentVolumeClaim, class: &StorageClass) -> Self {
        let meta = &claim.metadata;
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
                labels: meta.labels.clone(),
                annotations: meta.annotations.clone(),
                ..ObjectMeta::default()
            },
            spec: claim.spec.clone(),
            status: None,
        };
        let class = StorageClass {
            metadata: ObjectMeta {
                name: Some(class.name_any()),
                ..ObjectMeta::default()
            },
            ..class.clone()
        };
        Self { claim, class }
    }

    pub fn uid(&self) -> String {
        self.claim.uid().unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("entry {key}: {source}")]
    Entry {
        key: String,
        source: serde_json::Error,
    },
    #[error("encoding the entry of claim {uid}: {source}")]
    Encode {
        uid: String,
        source: serde_json::Error,
    },
}

/// The entries of a record, by claim UID, as the Lease's annotations hold them, and the
/// errors of those that cannot be read (they cannot be finished; the others still can).
/// Other annotations are not ours and are kept by the writer.
pub fn entries_of(
    annotations: &BTreeMap<String, String>,
) -> (BTreeMap<String, Entry>, Vec<RecordError>) {
    let mut entries = BTreeMap::new();
    let mut broken = Vec::new();
    for (key, value) in annotations {
        let Some(uid) = key.strip_prefix(ENTRY_PREFIX) else {
            continue;
        };
        match serde_json::from_str(value) {
            Ok(entry) => {
                entries.insert(uid.to_string(), entry);
            }
            Err(source) => broken.push(RecordError::Entry {
                key: key.clone(),
                source,
            }),
        }
    }
    (entries, broken)
}

/// One entry as its annotation (key, value).
pub fn annotation_of(entry: &Entry) -> Result<(String, String), RecordError> {
    let uid = entry.uid();
    let value = serde_json::to_string(entry).map_err(|source| RecordError::Encode {
        uid: uid.clone(),
        source,
    })?;
    Ok((format!("{ENTRY_PREFIX}{uid}"), value))
}

/// The bytes an annotation counts for (key and value, as the API server sums them).
pub fn size_of(annotation: &(String, String)) -> usize {
    annotation.0.len() + annotation.1.len()
}

/// The record's annotations after a batch: `others` (annotations not ours) kept, the entries
/// removed gone, the added ones in, as long as they fit in [`MAX_RECORD_BYTES`]. Returns the
/// annotations and the UIDs of the added entries that did not fit (they wait for room).
pub fn apply(
    current: &BTreeMap<String, String>,
    removed: &[String],
    added: &[(String, String)],
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut annotations = current.clone();
    for uid in removed {
        annotations.remove(&format!("{ENTRY_PREFIX}{uid}"));
    }
    let mut used: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut waiting = Vec::new();
    for (key, value) in added {
        let replaced = annotations.get(key).map_or(0, |old| key.len() + old.len());
        let size = key.len() + value.len();
        if used - replaced + size > MAX_RECORD_BYTES {
            waiting.push(key.trim_start_matches(ENTRY_PREFIX).to_string());
            continue;
        }
        used = used - replaced + size;
        annotations.insert(key.clone(), value.clone());
    }
    (annotations, waiting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(uid: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": uid, "resourceVersion": "9",
                "finalizers": ["kubernetes.io/pvc-protection"],
                "annotations": {"volume.kubernetes.io/storage-provisioner": "csi.example.com"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"},
        }))
        .unwrap()
    }

    fn class() -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": "fast", "uid": "c1", "resourceVersion": "3"},
            "provisioner": "csi.example.com",
            "parameters": {"kind": "ssd"},
        }))
        .unwrap()
    }

    #[test]
    fn an_entry_keeps_what_decides_the_volume_and_round_trips() {
        let entry = Entry::new(&claim("u1"), &class());
        let meta = &entry.claim.metadata;
        assert_eq!(meta.uid.as_deref(), Some("u1"));
        assert_eq!(meta.resource_version, None);
        assert_eq!(meta.finalizers, None);
        assert_eq!(meta.managed_fields, None);
        assert!(entry.claim.status.is_none());
        assert_eq!(entry.claim.spec, claim("u1").spec);
        assert_eq!(entry.class.metadata.uid, None);
        assert_eq!(entry.class.parameters, class().parameters);

        let annotation = annotation_of(&entry).unwrap();
        assert_eq!(annotation.0, "inflight.csi-suite.io/u1");
        let mut annotations = BTreeMap::from([annotation]);
        annotations.insert("other.example.com/x".into(), "kept".into());
        let (entries, broken) = entries_of(&annotations);
        assert!(broken.is_empty());
        assert_eq!(entries.len(), 1);
        assert_eq!(entries["u1"], entry);
    }

    #[test]
    fn a_broken_entry_is_an_error_naming_it_and_the_others_are_read() {
        let good = annotation_of(&Entry::new(&claim("u2"), &class())).unwrap();
        let annotations = BTreeMap::from([(format!("{ENTRY_PREFIX}u1"), "{".to_string()), good]);
        let (entries, broken) = entries_of(&annotations);
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["u2"]);
        assert_eq!(broken.len(), 1);
        let error = broken[0].to_string();
        assert!(error.contains("inflight.csi-suite.io/u1"), "{error}");
    }

    #[test]
    fn batches_add_and_remove_within_the_bound() {
        let entry = |uid: &str| annotation_of(&Entry::new(&claim(uid), &class())).unwrap();
        let others = BTreeMap::from([("other.example.com/x".to_string(), "kept".to_string())]);
        let (after, waiting) = apply(&others, &[], &[entry("a"), entry("b")]);
        assert!(waiting.is_empty());
        assert_eq!(after.len(), 3);
        let (after, waiting) = apply(&after, &["a".to_string()], &[entry("b")]);
        assert!(waiting.is_empty());
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            ["inflight.csi-suite.io/b", "other.example.com/x"]
        );
        // Past the bound, entries wait; a removal in the same batch makes room first.
        let per_entry = size_of(&entry("n0000"));
        let fit = MAX_RECORD_BYTES / per_entry;
        let many: Vec<_> = (0..fit + 3).map(|n| entry(&format!("n{n:04}"))).collect();
        let (full, waiting) = apply(&BTreeMap::new(), &[], &many);
        assert_eq!(waiting.len(), 3, "{} fit", fit);
        assert!(full.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() <= MAX_RECORD_BYTES);
        let (_, waiting) = apply(&full, &["n0000".to_string()], &[entry("late")]);
        assert!(waiting.is_empty());
    }

    #[test]
    fn lease_names() {
        assert_eq!(
            lease_name("hostpath.csi.k8s.io", None),
            "hostpath-csi-k8s-io-provisioning"
        );
        assert_eq!(
            lease_name("hostpath.csi.k8s.io", Some("node-1")),
            "hostpath-csi-k8s-io-provisioning-node-1"
        );
    }
}

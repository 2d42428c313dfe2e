//! From names to what the SnapshotMetadata API takes, as upstream's iterator resolves them
//! (pkg/iterator/iter.go): the driver of the snapshot's content, the CSI handle of a previous
//! snapshot given by name, the caller's own ServiceAccount. Pure: the objects are read by the
//! adapter.

use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use kube::ResourceExt;

/// What to enumerate: the allocated blocks of `snapshot`, or with `previous` the blocks
/// changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub namespace: String,
    pub snapshot: String,
    pub previous: Option<Previous>,
    pub starting_offset: i64,
    /// Tuples per message; 0 lets the driver choose.
    pub max_results: i32,
}

/// The base of a delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous {
    /// A VolumeSnapshot in the query's namespace, resolved to its content's snapshot handle.
    Name(String),
    /// A CSI snapshot handle, used as it is.
    Id(String),
}

/// The ServiceAccount a security token is made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

/// Why a snapshot cannot be used, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("VolumeSnapshot({namespace}/{name}) has no bound VolumeSnapshotContent")]
    NoBoundContent { namespace: String, name: String },
    #[error("VolumeSnapshot {namespace}/{name} is not yet ready")]
    SnapshotNotReady { namespace: String, name: String },
    #[error("VolumeSnapshot {namespace}/{name} boundVolumeSnapshotContentName not set")]
    BoundContentNotSet { namespace: String, name: String },
    #[error(
        "VolumeSnapshotContent({content}) volumeSnapshotRef.UID does not identify VolumeSnapshot({namespace}/{name})"
    )]
    ForeignUid {
        content: String,
        namespace: String,
        name: String,
    },
    #[error(
        "VolumeSnapshotContent({content}) volumeSnapshotRef does not identify VolumeSnapshot({namespace}/{name})"
    )]
    ForeignRef {
        content: String,
        namespace: String,
        name: String,
    },
    #[error("VolumeSnapshotContent({0}) is not yet ready")]
    ContentNotReady(String),
    #[error("VolumeSnapshotContent({0}) snapshot handle not set")]
    NoHandle(String),
    #[error("invalid argument: ServiceAccount unspecified and default cannot be determined")]
    NoDefaultServiceAccount,
}

fn ids(snapshot: &VolumeSnapshot) -> (String, String) {
    (
        snapshot.namespace().unwrap_or_default(),
        snapshot.name_any(),
    )
}

fn bound_content(snapshot: &VolumeSnapshot) -> Option<&str> {
    snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.as_deref())
}

/// The content whose `spec.driver` names the SnapshotMetadataService of the target snapshot
/// (not checked for readiness here: the service refuses a snapshot that is not ready).
pub fn target_content(snapshot: &VolumeSnapshot) -> Result<&str, ResolveError> {
    bound_content(snapshot).ok_or_else(|| {
        let (namespace, name) = ids(snapshot);
        ResolveError::NoBoundContent { namespace, name }
    })
}

/// The content of a previous snapshot given by name: it must not be known unready and must
/// be bound.
pub fn previous_content(snapshot: &VolumeSnapshot) -> Result<&str, ResolveError> {
    let (namespace, name) = ids(snapshot);
    let status = snapshot.status.as_ref();
    if status.and_then(|s| s.ready_to_use) == Some(false) {
        return Err(ResolveError::SnapshotNotReady { namespace, name });
    }
    bound_content(snapshot).ok_or(ResolveError::BoundContentNotSet { namespace, name })
}

/// The CSI handle of a previous snapshot from its content, which must point back at it (by
/// UID when the content records one), not be known unready and have a handle.
pub fn previous_handle(
    snapshot: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
) -> Result<String, ResolveError> {
    let (namespace, name) = ids(snapshot);
    let content_name = content.name_any();
    let reference = &content.spec.volume_snapshot_ref;
    let uid = reference.uid.as_deref().unwrap_or_default();
    if !uid.is_empty() && Some(uid) != snapshot.metadata.uid.as_deref() {
        return Err(ResolveError::ForeignUid {
            content: content_name,
            namespace,
            name,
        });
    }
    if reference.namespace.as_deref() != Some(namespace.as_str())
        || reference.name.as_deref() != Some(name.as_str())
    {
        return Err(ResolveError::ForeignRef {
            content: content_name,
            namespace,
            name,
        });
    }
    let status = content.status.as_ref();
    if status.and_then(|s| s.ready_to_use) == Some(false) {
        return Err(ResolveError::ContentNotReady(content_name));
    }
    status
        .and_then(|s| s.snapshot_handle.clone())
        .ok_or(ResolveError::NoHandle(content_name))
}

/// The ServiceAccount behind an authenticated user name (`system:serviceaccount:<ns>:<name>`).
pub fn service_account_of(username: &str) -> Result<ServiceAccountRef, ResolveError> {
    let fields: Vec<&str> = username.split(':').collect();
    match fields[..] {
        ["system", "serviceaccount", namespace, name] => Ok(ServiceAccountRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
        _ => Err(ResolveError::NoDefaultServiceAccount),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snapshot(status: serde_json::Value) -> VolumeSnapshot {
        serde_json::from_value(json!({"apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "snap", "namespace": "ns", "uid": "uid-1"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}}, "status": status}))
        .unwrap()
    }

    fn content(reference: serde_json::Value, status: serde_json::Value) -> VolumeSnapshotContent {
        serde_json::from_value(json!({"apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContent", "metadata": {"name": "snapcontent-1"},
            "spec": {"volumeSnapshotRef": reference, "deletionPolicy": "Delete",
                "driver": "hostpath.csi.k8s.io", "source": {"volumeHandle": "vol-1"}},
            "status": status}))
        .unwrap()
    }

    #[test]
    fn the_target_needs_a_bound_content_only() {
        let bound = snapshot(json!({"boundVolumeSnapshotContentName": "c", "readyToUse": false}));
        assert_eq!(target_content(&bound), Ok("c"));
        assert_eq!(
            target_content(&snapshot(json!({})))
                .unwrap_err()
                .to_string(),
            "VolumeSnapshot(ns/snap) has no bound VolumeSnapshotContent"
        );
    }

    #[test]
    fn a_previous_snapshot_must_be_ready_and_bound() {
        let cases = [
            (
                json!({"boundVolumeSnapshotContentName": "c", "readyToUse": true}),
                Ok("c"),
            ),
            (json!({"boundVolumeSnapshotContentName": "c"}), Ok("c")),
            (
                json!({"boundVolumeSnapshotContentName": "c", "readyToUse": false}),
                Err("VolumeSnapshot ns/snap is not yet ready"),
            ),
            (
                json!({"readyToUse": true}),
                Err("VolumeSnapshot ns/snap boundVolumeSnapshotContentName not set"),
            ),
        ];
        for (status, want) in cases {
            let snapshot = snapshot(status.clone());
            let got = previous_content(&snapshot).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{status}");
        }
    }

    #[test]
    fn the_previous_handle_comes_from_a_content_that_points_back() {
        let snap = snapshot(json!({"boundVolumeSnapshotContentName": "snapcontent-1"}));
        let ours = json!({"name": "snap", "namespace": "ns", "uid": "uid-1"});
        let ready = json!({"readyToUse": true, "snapshotHandle": "snap-handle"});
        let cases = [
            (ours.clone(), ready.clone(), Ok("snap-handle")),
            (
                json!({"name": "snap", "namespace": "ns"}),
                json!({"snapshotHandle": "snap-handle"}),
                Ok("snap-handle"),
            ),
            (
                json!({"name": "snap", "namespace": "ns", "uid": "uid-2"}),
                ready.clone(),
                Err(
                    "VolumeSnapshotContent(snapcontent-1) volumeSnapshotRef.UID does not identify VolumeSnapshot(ns/snap)",
                ),
            ),
            (
                json!({"name": "other", "namespace": "ns", "uid": "uid-1"}),
                ready.clone(),
                Err(
                    "VolumeSnapshotContent(snapcontent-1) volumeSnapshotRef does not identify VolumeSnapshot(ns/snap)",
                ),
            ),
            (
                ours.clone(),
                json!({"readyToUse": false, "snapshotHandle": "snap-handle"}),
                Err("VolumeSnapshotContent(snapcontent-1) is not yet ready"),
            ),
            (
                ours,
                json!({"readyToUse": true}),
                Err("VolumeSnapshotContent(snapcontent-1) snapshot handle not set"),
            ),
        ];
        for (reference, status, want) in cases {
            let content = content(reference.clone(), status.clone());
            let got = previous_handle(&snap, &content).map_err(|e| e.to_string());
            assert_eq!(
                got,
                want.map(str::to_string).map_err(str::to_string),
                "{reference} {status}"
            );
        }
    }

    #[test]
    fn the_default_service_account_is_the_callers() {
        assert_eq!(
            service_account_of("system:serviceaccount:apps:backup"),
            Ok(ServiceAccountRef {
                namespace: "apps".into(),
                name: "backup".into()
            })
        );
        for user in [
            "kubernetes-admin",
            "system:serviceaccount:apps",
            "system:node:n1",
        ] {
            assert_eq!(
                service_account_of(user),
                Err(ResolveError::NoDefaultServiceAccount),
                "{user}"
            );
        }
    }
}

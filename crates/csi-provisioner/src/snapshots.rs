//! Restoring from a VolumeSnapshot (external-provisioner `getSnapshotSource`): the pure checks
//! that turn a snapshot and its content (`csi_kinds::snapshot`) into the CSI snapshot id.

use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use crate::claims::{ClaimError, requested_size};

/// The finalizer a VolumeSnapshot carries while a claim is restored from it (v6.2+).
pub const SOURCE_PROTECTION: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// Lets a restore change the volume mode of the snapshot's source volume.
pub const ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";

/// The content a usable snapshot is bound to. A snapshot being deleted is only usable when it
/// carries our finalizer: provisioning had started before (external-provisioner #1448).
pub fn bound_content(snapshot: &VolumeSnapshot) -> Result<String, ClaimError> {
    let name = snapshot.name_any();
    if snapshot.metadata.deletion_timestamp.is_some()
        && !snapshot.finalizers().iter().any(|f| f == SOURCE_PROTECTION)
    {
        return Err(fail(format!("snapshot {name} is being deleted")));
    }
    snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.clone())
        .filter(|c| !c.is_empty())
        .ok_or_else(|| fail(format!("snapshot {name} not bound")))
}

/// Validates a restore (upstream's `getSnapshotSource`, in its order and words) and returns
/// the snapshot handle: the content bound back to the snapshot, of this driver (`class`
/// names the claim's StorageClass), ready, with a handle; the request not smaller than the
/// snapshot's restore size; no volume-mode change unless the content allows it (when
/// `prevent_mode_conversion`).
pub fn snapshot_source(
    claim: &PersistentVolumeClaim,
    driver: &str,
    class: &str,
    snapshot: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
    prevent_mode_conversion: bool,
) -> Result<String, ClaimError> {
    let name = snapshot.name_any();
    let content_name = content.name_any();
    let reference = &content.spec.volume_snapshot_ref;
    let bound_back = reference.name.as_deref() == Some(name.as_str())
        && reference.namespace == snapshot.namespace()
        && reference.uid == snapshot.metadata.uid;
    if !bound_back {
        return Err(fail(format!(
            "snapshotcontent {content_name} for snapshot {name} is bound to a different snapshot"
        )));
    }
    if content.spec.driver != driver {
        return Err(fail(format!(
            "snapshotcontent {content_name} for snapshot {name} is not handled by CSI driver of StorageClass {class}"
        )));
    }
    let status = snapshot.status.as_ref();
    if !status.and_then(|s| s.ready_to_use).unwrap_or(false) {
        return Err(fail(format!("snapshot {name} is not Ready")));
    }
    let Some(handle) = content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.clone())
        .filter(|h| !h.is_empty())
    else {
        return Err(fail(format!("snapshot handle {name} is not available")));
    };
    // As upstream: the snapshot's restore size, when it has one.
    if let Some(size) = status.and_then(|s| s.restore_size.as_ref()) {
        let size = csi_kinds::quantity::bytes(&size.0)
            .map_err(|error| fail(format!("restore size of snapshot {name}: {error}")))?;
        let requested = requested_size(claim)?;
        if requested < size {
            return Err(fail(format!(
                "requested volume size {requested} is less than the size {size} for the source snapshot {name}"
            )));
        }
    }
    let claim_mode = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
    if prevent_mode_conversion
        && let (Some(source), Some(target)) =
            (content.spec.source_volume_mode.as_deref(), claim_mode)
        && source != target
    {
        let refused = |why: String| {
            fail(format!(
                "requested volume {}/{} modifies the mode of the source volume but does not have permission to do so. {why}",
                claim.namespace().unwrap_or_default(),
                claim.name_any(),
            ))
        };
        let Some(allowed) = content.annotations().get(ALLOW_VOLUME_MODE_CHANGE) else {
            return Err(refused(format!(
                "{ALLOW_VOLUME_MODE_CHANGE} annotation is not present on snapshotcontent {content_name}"
            )));
        };
        match csi_grpc::flags::parse_go_bool(allowed) {
            Ok(true) => {}
            Ok(false) => {
                return Err(refused(format!(
                    "{ALLOW_VOLUME_MODE_CHANGE} is set to false on snapshotcontent {content_name}"
                )));
            }
            Err(_) => {
                return Err(refused(format!(
                    "failed to convert {ALLOW_VOLUME_MODE_CHANGE} annotation value to boolean with error: strconv.ParseBool: parsing {allowed:?}: invalid syntax"
                )));
            }
        }
    }
    Ok(handle)
}

fn fail(message: String) -> ClaimError {
    ClaimError::DataSource(message)
}

#[cfg(test)]
mod tests {
    use csi_kinds::snapshot::VolumeSnapshotSpec;
    use serde_json::json;

    use super::*;

    const DRIVER: &str = "hostpath.csi-suite.io";

    fn snapshot(extra: serde_json::Value) -> VolumeSnapshot {
        let mut value = json!({
            "metadata": {"name": "snap", "namespace": "apps", "uid": "s1"},
            "spec": {"source": {"volumeSnapshotContentName": "content"}},
            "status": {"boundVolumeSnapshotContentName": "content", "readyToUse": true,
                       "restoreSize": "1Gi"}
        });
        merge(&mut value, extra);
        serde_json::from_value(value).unwrap()
    }

    fn content(extra: serde_json::Value) -> VolumeSnapshotContent {
        let mut value = json!({
            "metadata": {"name": "content"},
            "spec": {"driver": DRIVER, "sourceVolumeMode": "Filesystem",
                     "deletionPolicy": "Delete", "source": {"snapshotHandle": "snap-1"},
                     "volumeSnapshotRef": {"name": "snap", "namespace": "apps", "uid": "s1"}},
            "status": {"snapshotHandle": "snap-1", "restoreSize": 1073741824}
        });
        merge(&mut value, extra);
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn bodies_name_their_kind() {
        let body = serde_json::to_value(snapshot(json!({}))).unwrap();
        assert_eq!(body["apiVersion"], "snapshot.storage.k8s.io/v1");
        assert_eq!(body["kind"], "VolumeSnapshot");
        assert_eq!(body["metadata"]["name"], "snap");
        assert_eq!(body["status"]["readyToUse"], true);
        let body = serde_json::to_value(content(json!({}))).unwrap();
        assert_eq!(body["kind"], "VolumeSnapshotContent");
        assert_eq!(body["spec"]["driver"], DRIVER);
        let bare =
            serde_json::to_value(VolumeSnapshot::new("", VolumeSnapshotSpec::default())).unwrap();
        assert!(bare.get("status").is_none(), "no status: none written");
    }

    fn claim(size: &str, mode: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "restored", "namespace": "apps"},
            "spec": {"volumeMode": mode, "resources": {"requests": {"storage": size}}}
        }))
        .unwrap()
    }

    fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        json_patch::merge(base, &extra);
    }

    /// Name, claim, snapshot, content, mode-conversion guard, handle or error text.
    type Case = (
        &'static str,
        PersistentVolumeClaim,
        VolumeSnapshot,
        VolumeSnapshotContent,
        bool,
        Result<&'static str, &'static str>,
    );

    #[test]
    fn restores() {
        let cases: Vec<Case> = vec![
            (
                "usable",
                claim("1Gi", "Filesystem"),
                snapshot(json!({})),
                content(json!({})),
                true,
                Ok("snap-1"),
            ),
            (
                "bigger request",
                claim("2Gi", "Filesystem"),
                snapshot(json!({})),
                content(json!({})),
                true,
                Ok("snap-1"),
            ),
            (
                "smaller request",
                claim("1Mi", "Filesystem"),
                snapshot(json!({})),
                content(json!({})),
                true,
                Err(
                    "requested volume size 1048576 is less than the size 1073741824 for the source snapshot snap",
                ),
            ),
            (
                "only the snapshot's restore size counts, as upstream",
                claim("1Mi", "Filesystem"),
                snapshot(json!({"status": {"restoreSize": null}})),
                content(json!({})),
                true,
                Ok("snap-1"),
            ),
            (
                "not ready",
                claim("1Gi", "Filesystem"),
                snapshot(json!({"status": {"readyToUse": false}})),
                content(json!({})),
                true,
                Err("snapshot snap is not Ready"),
            ),
            (
                "other driver",
                claim("1Gi", "Filesystem"),
                snapshot(json!({})),
                content(json!({"spec": {"driver": "other"}})),
                true,
                Err(
                    "snapshotcontent content for snapshot snap is not handled by CSI driver of StorageClass fast",
                ),
            ),
            (
                "bound to another snapshot",
                claim("1Gi", "Filesystem"),
                snapshot(json!({})),
                content(json!({"spec": {"volumeSnapshotRef": {"uid": "s2"}}})),
                true,
                Err("snapshotcontent content for snapshot snap is bound to a different snapshot"),
            ),
            (
                "no handle",
                claim("1Gi", "Filesystem"),
                snapshot(json!({})),
                content(json!({"status": {"snapshotHandle": null}})),
                true,
                Err("snapshot handle snap is not available"),
            ),
            (
                "mode change",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({})),
                true,
                Err(
                    "requested volume apps/restored modifies the mode of the source volume but does not have permission to do so. snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content",
                ),
            ),
            (
                "mode change allowed",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({"metadata": {"annotations": {ALLOW_VOLUME_MODE_CHANGE: "true"}}})),
                true,
                Ok("snap-1"),
            ),
            (
                "mode change allowed, Go's spelling",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({"metadata": {"annotations": {ALLOW_VOLUME_MODE_CHANGE: "T"}}})),
                true,
                Ok("snap-1"),
            ),
            (
                "mode change refused by the content",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({"metadata": {"annotations": {ALLOW_VOLUME_MODE_CHANGE: "false"}}})),
                true,
                Err(
                    "requested volume apps/restored modifies the mode of the source volume but does not have permission to do so. snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content",
                ),
            ),
            (
                "mode change, not a boolean",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({"metadata": {"annotations": {ALLOW_VOLUME_MODE_CHANGE: "yes"}}})),
                true,
                Err(
                    "requested volume apps/restored modifies the mode of the source volume but does not have permission to do so. failed to convert snapshot.storage.kubernetes.io/allow-volume-mode-change annotation value to boolean with error: strconv.ParseBool: parsing \"yes\": invalid syntax",
                ),
            ),
            (
                "mode change not guarded",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({})),
                false,
                Ok("snap-1"),
            ),
            (
                "unknown source mode",
                claim("1Gi", "Block"),
                snapshot(json!({})),
                content(json!({"spec": {"sourceVolumeMode": null}})),
                true,
                Ok("snap-1"),
            ),
        ];
        for (name, claim, snapshot, content, guard, expected) in cases {
            let got = snapshot_source(&claim, DRIVER, "fast", &snapshot, &content, guard);
            let got = got.map_err(|error| error.to_string());
            assert_eq!(
                got.as_deref(),
                expected.map_err(str::to_string).as_deref(),
                "{name}"
            );
        }
    }

    #[test]
    fn bound_contents() {
        assert_eq!(
            bound_content(&snapshot(json!({}))),
            Ok("content".to_string())
        );
        let unbound = snapshot(json!({"status": {"boundVolumeSnapshotContentName": null}}));
        assert!(bound_content(&unbound).is_err());
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
        assert!(bound_content(&snapshot(deleting.clone())).is_err());
        let mut protected = deleting;
        protected["metadata"]["finalizers"] = json!([SOURCE_PROTECTION]);
        assert_eq!(
            bound_content(&snapshot(protected)),
            Ok("content".to_string()),
            "provisioning had started before the delete"
        );
    }
}

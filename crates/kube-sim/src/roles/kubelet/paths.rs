//! Where kubelet's CSI volume plugin (pkg/volume/csi: csi_attacher.go `makeDeviceMountPath`,
//! csi_mounter.go `GetPath`, csi_block.go `getStagingPath`/`getPublishPath`) puts a volume on a
//! node, and the VolumeAttachment name it waits for (csi_attacher.go `getAttachmentName`).
//! kube-sim keeps its own rather than the sidecars', so that a bug there is not mirrored by the
//! kubelet node-podmon is tested against.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The CSI plugin's directory under kubelet's root.
const PLUGIN_DIR: &str = "plugins/kubernetes.io/csi";

/// The global (staging) path: `<plugin dir>/<driver>/<sha256(volumeHandle)>/globalmount` (since
/// v1.20: a hash keeps it short whatever the handle), for a block volume
/// `<plugin dir>/volumeDevices/staging/<pv>`.
pub fn staging_path(root: &Path, driver: &str, handle: &str, pv: &str, block: bool) -> PathBuf {
    let plugin = root.join(PLUGIN_DIR);
    if block {
        return plugin.join("volumeDevices").join("staging").join(pv);
    }
    let handle_hash = hex::encode(Sha256::digest(handle));
    plugin.join(driver).join(handle_hash).join("globalmount")
}

/// The global path of kubelets up to v1.19: `<plugin dir>/pv/<pv>/globalmount`.
pub fn legacy_staging_path(root: &Path, pv: &str) -> PathBuf {
    root.join(PLUGIN_DIR)
        .join("pv")
        .join(pv)
        .join("globalmount")
}

/// A pod's directory of the volume: `pods/<uid>/volumes/kubernetes.io~csi/<pv>` (the plugin
/// name with `/` escaped as `~`).
pub fn pod_volume_dir(root: &Path, pod_uid: &str, pv: &str) -> PathBuf {
    root.join("pods")
        .join(pod_uid)
        .join("volumes")
        .join("kubernetes.io~csi")
        .join(pv)
}

/// The publish path: `<pod volume dir>/mount`, for a block volume
/// `<plugin dir>/volumeDevices/publish/<pv>/<uid>`.
pub fn target_path(root: &Path, pod_uid: &str, pv: &str, block: bool) -> PathBuf {
    if block {
        return root
            .join(PLUGIN_DIR)
            .join("volumeDevices")
            .join("publish")
            .join(pv)
            .join(pod_uid);
    }
    pod_volume_dir(root, pod_uid, pv).join("mount")
}

/// `csi-` and the hex SHA-256 of the volume handle, driver and node name run together.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let mut digest = Sha256::new();
    for part in [handle, driver, node] {
        digest.update(part);
    }
    format!("csi-{}", hex::encode(digest.finalize()))
}

#[cfg(test)]
mod tests {
    //! Digests computed with sha256sum; the legacy layout's vector is the one
    //! pkg/volume/csi tests use (`pvc-431ceccf-…/globalmount`).

    use super::*;

    #[test]
    fn kubelet_layout() {
        let root = Path::new("/var/lib/kubelet");
        let table = [
            (
                staging_path(root, "hostpath.csi-suite.io", "vol-1", "pv-1", false),
                "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi-suite.io/d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49/globalmount",
            ),
            (
                staging_path(root, "d", "vol-1", "pv-1", true),
                "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pv-1",
            ),
            (
                legacy_staging_path(root, "pvc-431ceccf-7999-11ea-ab4a-fa163ffd8213"),
                "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pvc-431ceccf-7999-11ea-ab4a-fa163ffd8213/globalmount",
            ),
            (
                pod_volume_dir(root, "uid-1", "pv-1"),
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1",
            ),
            (
                target_path(root, "uid-1", "pv-1", false),
                "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount",
            ),
            (
                target_path(root, "uid-1", "pv-1", true),
                "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid-1",
            ),
        ];
        for (path, want) in table {
            assert_eq!(path, Path::new(want));
        }
    }

    #[test]
    fn attachment_names() {
        let table = [
            (
                ("vol-1", "hostpath.csi-suite.io", "node-a"),
                "csi-3b3ac9ff20959ea0248f3222babc53d3f5d702df4f89cb86b99bdfd3031d7687",
            ),
            (
                ("test-volume-handle", "csi.example.com", "node-1"),
                "csi-1f21eb86449eea7e5720ff116a0c1bca332071e886d702c92a0f8e5d97f800be",
            ),
        ];
        for ((handle, driver, node), want) in table {
            assert_eq!(attachment_name(handle, driver, node), want);
        }
    }
}

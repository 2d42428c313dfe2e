//! Where kubelet (pkg/volume/csi) puts a CSI volume on a node, and what the attach/detach
//! controller names its VolumeAttachment. The simulated kubelet mounts there and node-podmon
//! cleans up there; controller-podmon deletes attachments by that name.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The global (staging) path kubelet gives a CSI volume:
/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`, or for a
/// block volume `<root>/plugins/kubernetes.io/csi/volumeDevices/staging/<pv>`.
pub fn staging_path(root: &Path, driver: &str, handle: &str, pv: &str, block: bool) -> PathBuf {
    let csi = root.join("plugins/kubernetes.io/csi");
    if block {
        csi.join("volumeDevices/staging").join(pv)
    } else {
        let digest = hex::encode(Sha256::digest(handle.as_bytes()));
        csi.join(driver).join(digest).join("globalmount")
    }
}

/// Where older kubelets (v1.19 among them) stage a filesystem volume:
/// `<root>/plugins/kubernetes.io/csi/pv/<pv>/globalmount`, named after the PV rather than a
/// hash of the volume handle.
pub fn legacy_staging_path(root: &Path, pv: &str) -> PathBuf {
    root.join("plugins/kubernetes.io/csi/pv")
        .join(pv)
        .join("globalmount")
}

/// The directory of a pod's CSI volume: `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>`.
pub fn pod_volume_dir(root: &Path, pod_uid: &str, pv: &str) -> PathBuf {
    root.join("pods")
        .join(pod_uid)
        .join("volumes/kubernetes.io~csi")
        .join(pv)
}

/// The per-pod publish path: `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`, or for a
/// block volume `<root>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>`.
pub fn target_path(root: &Path, pod_uid: &str, pv: &str, block: bool) -> PathBuf {
    if block {
        root.join("plugins/kubernetes.io/csi/volumeDevices/publish")
            .join(pv)
            .join(pod_uid)
    } else {
        pod_volume_dir(root, pod_uid, pv).join("mount")
    }
}

/// The VolumeAttachment name: `csi-` + hex sha256(volumeHandle + driverName + nodeName)
/// (pkg/volume/csi/csi_attacher.go `getAttachmentName`).
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_layouts() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            staging_path(root, "d", "vol-1", "pv-1", false),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/d")
                .join(hex::encode(Sha256::digest(b"vol-1")))
                .join("globalmount")
        );
        assert_eq!(
            legacy_staging_path(root, "pv-1"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-1/globalmount")
        );
    }
}

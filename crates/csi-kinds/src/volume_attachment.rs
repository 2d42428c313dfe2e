//! What the attacher and podmon share about VolumeAttachments: the node ID an attach recorded,
//! and the ControllerUnpublishVolume that takes a volume away from a node (the attacher's
//! detach, podmon's fence).

use std::collections::HashMap;

use csi_proto::csi::v1 as csi;

/// The VolumeAttachment annotation with the CSI node ID the volume was attached with: the
/// fallback for detaching once the CSINode has lost the driver (node deleted, driver pod gone).
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

pub fn unpublish_request(
    volume_id: &str,
    node_id: &str,
    secrets: HashMap<String, String>,
) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: volume_id.to_string(),
        node_id: node_id.to_string(),
        secrets,
    }
}

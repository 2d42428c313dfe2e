//! VolumeAttributesClass discovery: whether the API server serves storage.k8s.io/v1
//! VolumeAttributesClass, and the gate that follows (`csi_kinds::vac::support`).

use csi_kinds::vac::{DISABLED_MESSAGE, GROUP, KIND, Support, VERSION, support};

/// Asks discovery whether the server serves storage.k8s.io/v1 VolumeAttributesClass
/// (upstream's `IsVolumeAttributesClassV1Enabled`); `None` when discovery failed.
pub async fn served(client: &kube::Client) -> Option<bool> {
    match client
        .list_api_group_resources(&format!("{GROUP}/{VERSION}"))
        .await
    {
        Ok(list) => Some(list.resources.iter().any(|r| r.kind == KIND)),
        Err(kube::Error::Api(status)) if status.code == 404 => Some(false),
        Err(error) => {
            tracing::warn!(%error, "discovery of {GROUP}/{VERSION} failed; the VolumeAttributesClass gate stays as set");
            None
        }
    }
}

/// The gate after discovery, logging upstream's line when it is turned off.
pub async fn discover(client: &kube::Client, enabled: bool, explicitly_set: bool) -> Support {
    if !enabled {
        return Support::Disabled;
    }
    let support = support(enabled, explicitly_set, served(client).await);
    if support == Support::Disabled {
        tracing::info!("{DISABLED_MESSAGE}");
    }
    support
}

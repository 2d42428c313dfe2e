//! VolumeAttributesClass (storage.k8s.io/v1, GA in Kubernetes 1.34), shared by the
//! provisioner (CreateVolume's `mutable_parameters`) and the resizer (ControllerModifyVolume):
//! the type, and whether the gate stays on once discovery has said whether the API is served
//! (the discovery itself is `csi_sidecar::vac`).

use std::collections::BTreeMap;

use k8s_openapi::ClusterResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

pub const GROUP: &str = "storage.k8s.io";
pub const VERSION: &str = "v1";
pub const KIND: &str = "VolumeAttributesClass";

/// The fields the provisioner and the resizer read (the type is not in k8s-openapi's v1_33 API
/// set).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttributesClass {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub driver_name: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

crate::fixed_resource!(
    VolumeAttributesClass,
    ClusterResourceScope,
    GROUP,
    VERSION,
    KIND,
    "volumeattributesclasses"
);

/// What a sidecar does with claims' classes, from the gate and the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Gate off: classes are ignored (no mutable parameters, no class on the PV).
    Disabled,
    /// Gate on and the v1 API served: classes are read from a cache.
    Served,
    /// Gate set on explicitly but the v1 API not served: claims naming a class fail.
    NotServed,
}

/// upstream's log line when discovery turns the gate off (cmd/csi-provisioner, cmd/csi-resizer).
pub const DISABLED_MESSAGE: &str = "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass v1 API is not available";

/// The gate after discovery, as upstream: a gate left at its default is turned off when the
/// server does not serve the v1 API; an explicit setting stays; a failed discovery (`None`)
/// changes nothing.
pub fn support(enabled: bool, explicitly_set: bool, served: Option<bool>) -> Support {
    match (enabled, served) {
        (false, _) => Support::Disabled,
        (true, Some(false)) if explicitly_set => Support::NotServed,
        (true, Some(false)) => Support::Disabled,
        (true, _) => Support::Served,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_turns_only_a_default_gate_off() {
        let table = [
            ("off", false, false, Some(true), Support::Disabled),
            ("default, served", true, false, Some(true), Support::Served),
            (
                "default, not served",
                true,
                false,
                Some(false),
                Support::Disabled,
            ),
            (
                "explicit, not served",
                true,
                true,
                Some(false),
                Support::NotServed,
            ),
            ("discovery failed", true, false, None, Support::Served),
        ];
        for (what, enabled, explicit, served, expected) in table {
            assert_eq!(support(enabled, explicit, served), expected, "{what}");
        }
    }
}

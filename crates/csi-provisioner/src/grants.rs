//! Cross-namespace data sources (gate `CrossNamespaceVolumeDataSource`, alpha): a claim's
//! `dataSourceRef` may name a claim or snapshot in another namespace when a
//! gateway.networking.k8s.io/v1beta1 ReferenceGrant there allows it (external-provisioner's
//! `dataSource` and `IsGranted`). Pure: the grants come from a cache.

use csi_sidecar::feature_gates::FeatureGate;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde::Deserialize;

/// external-provisioner's gate: alpha, off by default.
pub const GATE: FeatureGate = crate::gates::CROSS_NAMESPACE_VOLUME_DATA_SOURCE;

const GROUP: &str = "gateway.networking.k8s.io";
/// The version upstream's informer reads (gateway-api's v1beta1 client).
const VERSION: &str = "v1beta1";

/// The fields the provisioner reads (Gateway API, a CRD).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ReferenceGrant {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    /// None or empty: every object of the kind.
    pub name: Option<String>,
}

csi_kinds::fixed_resource!(
    ReferenceGrant,
    NamespaceResourceScope,
    GROUP,
    VERSION,
    "ReferenceGrant",
    "referencegrants"
);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "accessing {namespace}/{name} of {kind} dataSource from {claim_namespace}/{claim_name} isn't allowed"
)]
pub struct NotGranted {
    namespace: String,
    name: String,
    kind: String,
    claim_namespace: String,
    claim_name: String,
}

/// Whether the claim may use its data source: always when it is in the claim's namespace (or
/// `spec.dataSource` names it, which has no namespace); else some grant in the source's
/// namespace must allow claims of the claim's namespace (group "", kind
/// PersistentVolumeClaim) to reach the source's group and kind, by its name or all names.
pub fn check<'a>(
    claim: &PersistentVolumeClaim,
    grants: impl IntoIterator<Item = &'a ReferenceGrant>,
) -> Result<(), NotGranted> {
    let spec = claim.spec.clone().unwrap_or_default();
    let claim_namespace = claim.namespace().unwrap_or_default();
    let Some(source) = spec.data_source_ref.filter(|_| spec.data_source.is_none()) else {
        return Ok(());
    };
    let namespace = source.namespace.clone().unwrap_or_default();
    if namespace.is_empty() || namespace == claim_namespace {
        return Ok(());
    }
    let group = source.api_group.clone().unwrap_or_default();
    let allows = |grant: &ReferenceGrant| {
        grant.namespace().as_deref() == Some(namespace.as_str())
            && grant.spec.from.iter().any(|from| {
                from.group.is_empty()
                    && from.kind == "PersistentVolumeClaim"
                    && from.namespace == claim_namespace
            })
            && grant.spec.to.iter().any(|to| {
                to.group == group
                    && to.kind == source.kind
                    && to
                        .name
                        .as_deref()
                        .is_none_or(|name| name.is_empty() || name == source.name)
            })
    };
    if grants.into_iter().any(allows) {
        return Ok(());
    }
    Err(NotGranted {
        namespace,
        name: source.name,
        kind: source.kind,
        claim_namespace,
        claim_name: claim.name_any(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn grant(namespace: &str, from: Value, to: Value) -> ReferenceGrant {
        serde_json::from_value(json!({"metadata": {"name": "g", "namespace": namespace},
            "spec": {"from": [from], "to": [to]}}))
        .unwrap()
    }

    fn claim(source: Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "copy", "namespace": "apps"},
            "spec": {"dataSourceRef": source}}))
        .unwrap()
    }

    #[test]
    fn a_grant_in_the_source_namespace_allows_the_reference() {
        let snapshot = claim(json!({"apiGroup": "snapshot.storage.k8s.io",
            "kind": "VolumeSnapshot", "name": "snap", "namespace": "data"}));
        let clone = claim(json!({"kind": "PersistentVolumeClaim", "name": "src",
            "namespace": "data"}));
        let from_apps = json!({"group": "", "kind": "PersistentVolumeClaim", "namespace": "apps"});
        let snapshots = json!({"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"});
        let table = [
            (
                "all snapshots",
                &snapshot,
                grant("data", from_apps.clone(), snapshots.clone()),
                true,
            ),
            (
                "this snapshot by name",
                &snapshot,
                grant(
                    "data",
                    from_apps.clone(),
                    json!({"group": "snapshot.storage.k8s.io",
                    "kind": "VolumeSnapshot", "name": "snap"}),
                ),
                true,
            ),
            (
                "another snapshot by name",
                &snapshot,
                grant(
                    "data",
                    from_apps.clone(),
                    json!({"group": "snapshot.storage.k8s.io",
                    "kind": "VolumeSnapshot", "name": "other"}),
                ),
                false,
            ),
            (
                "grant in another namespace",
                &snapshot,
                grant("apps", from_apps.clone(), snapshots.clone()),
                false,
            ),
            (
                "from another namespace",
                &snapshot,
                grant(
                    "data",
                    json!({"group": "", "kind": "PersistentVolumeClaim", "namespace": "web"}),
                    snapshots.clone(),
                ),
                false,
            ),
            (
                "from another kind",
                &snapshot,
                grant(
                    "data",
                    json!({"group": "", "kind": "Pod", "namespace": "apps"}),
                    snapshots.clone(),
                ),
                false,
            ),
            (
                "snapshots, not claims",
                &clone,
                grant("data", from_apps.clone(), snapshots),
                false,
            ),
            (
                "claims (core group)",
                &clone,
                grant(
                    "data",
                    from_apps,
                    json!({"group": "", "kind": "PersistentVolumeClaim"}),
                ),
                true,
            ),
        ];
        for (what, claim, grant, allowed) in table {
            assert_eq!(check(claim, [&grant]).is_ok(), allowed, "{what}");
        }
        assert_eq!(
            check(&snapshot, []).unwrap_err().to_string(),
            "accessing data/snap of VolumeSnapshot dataSource from apps/copy isn't allowed"
        );
    }

    #[test]
    fn sources_in_the_claims_namespace_need_no_grant() {
        let local = [
            claim(json!({"kind": "PersistentVolumeClaim", "name": "src"})),
            claim(json!({"kind": "PersistentVolumeClaim", "name": "src", "namespace": "apps"})),
            claim(json!({"kind": "PersistentVolumeClaim", "name": "src", "namespace": ""})),
        ];
        for claim in &local {
            assert_eq!(check(claim, []), Ok(()));
        }
    }
}

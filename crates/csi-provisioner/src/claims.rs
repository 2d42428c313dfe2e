//! Which claims the provisioner acts on, and what their data source is (external-provisioner
//! `shouldProvision`, `dataSource`, `getPVCSource`). Pure: inputs from the caches.

use csi_kinds::cached::CachedClaim;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use csi_kinds::annotations::{BETA_STORAGE_PROVISIONER, SELECTED_NODE, STORAGE_PROVISIONER};
use csi_kinds::migration::{MIGRATED_TO, Plugin};
const ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
/// The finalizer a clone's source claim carries while the clone is provisioned.
pub const CLONING_PROTECTION: &str = "provisioner.storage.kubernetes.io/cloning-protection";
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("storageclass.storage.k8s.io \"{0}\" not found")]
    MissingClass(String),
    #[error("claim Selector is not supported")]
    Selector,
    #[error("{0}")]
    DataSource(String),
    #[error("{0}")]
    CloneSource(String),
    /// The source claim's volume is missing or not the one it should be; upstream says no
    /// more in the Event (and logs the detail, as the controller does with this one's).
    #[error("claim in dataSource not bound or invalid")]
    CloneSourceInvalid(String),
    /// A storage request that is no size in bytes: never sent to the driver as 0 bytes.
    #[error("storage request of claim {claim}: {source}")]
    StorageRequest {
        claim: String,
        source: csi_kinds::quantity::QuantityError,
    },
}

/// What to do with one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Already bound, or another provisioner's.
    Ignore,
    /// WaitForFirstConsumer without a selected node yet.
    WaitForNode,
    Provision {
        selected_node: Option<String>,
    },
    /// The class names another provisioner: upstream's library logs "Unknown provisioner
    /// requested in claim's StorageClass" and leaves the claim. A class naming an in-tree
    /// plugin lands here unless it is the plugin the driver migrated from
    /// ([`csi_kinds::migration::Plugin::for_driver`]): for any other plugin there is no
    /// translation, and the claim is not provisioned with untranslated in-tree parameters.
    ForeignClass {
        provisioner: String,
    },
}

/// The claim is ours and ready to provision? It must be [`annotated_for`] the driver, as
/// upstream's `shouldProvision`, and its class must name the driver or the in-tree plugin the
/// driver migrated from (CSI migration: its parameters are translated); a WaitForFirstConsumer
/// class needs selected-node.
pub fn decide(
    claim: &PersistentVolumeClaim,
    driver: &str,
    class: Option<&StorageClass>,
) -> Result<ClaimDecision, ClaimError> {
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return Ok(ClaimDecision::Ignore);
    }
    if !annotated_for(claim, driver) {
        return Ok(ClaimDecision::Ignore);
    }
    let annotations = claim.annotations();
    let class_name = spec.storage_class_name.unwrap_or_default();
    let class = class.ok_or(ClaimError::MissingClass(class_name))?;
    let selected_node = annotations
        .get(SELECTED_NODE)
        .or_else(|| annotations.get(ALPHA_SELECTED_NODE))
        .filter(|n| !n.is_empty())
        .cloned();
    let delayed = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
    if delayed && selected_node.is_none() {
        return Ok(ClaimDecision::WaitForNode);
    }
    if class.provisioner != driver && migrated_from(driver) != Some(class.provisioner.as_str()) {
        return Ok(ClaimDecision::ForeignClass {
            provisioner: class.provisioner.clone(),
        });
    }
    Ok(ClaimDecision::Provision { selected_node })
}

/// The claim's storage-provisioner annotation (GA, else beta) names `driver`, or under CSI
/// migration names the in-tree plugin `driver` migrated from while `pv.kubernetes.io/migrated-to`
/// names `driver` (upstream's `ShouldProvision` with the in-tree name among the library's
/// known provisioners; `migrated-to` alone does not make a claim ours): the claim is this
/// driver's to provision, and only then is our finalizer on it this provisioner's to remove
/// (every driver's provisioner uses the same finalizer name).
pub fn annotated_for(claim: &PersistentVolumeClaim, driver: &str) -> bool {
    let annotations = claim.annotations();
    let Some(provisioner) = annotations
        .get(STORAGE_PROVISIONER)
        .or_else(|| annotations.get(BETA_STORAGE_PROVISIONER))
    else {
        return false;
    };
    provisioner == driver
        || (migrated_from(driver) == Some(provisioner.as_str())
            && annotations.get(MIGRATED_TO).is_some_and(|d| d == driver))
}

/// The in-tree plugin `driver` took over under CSI migration, if any.
pub fn migrated_from(driver: &str) -> Option<&'static str> {
    Plugin::for_driver(driver).map(Plugin::in_tree_name)
}

/// A claim's data source after normalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    None,
    Claim {
        name: String,
        namespace: String,
    },
    Snapshot {
        name: String,
        namespace: String,
    },
    /// Any other kind: a volume populator's job; the provisioner leaves the claim alone.
    Populator {
        kind: String,
        api_group: String,
    },
}

/// `spec.dataSource` wins (in the claim's namespace), else `spec.dataSourceRef`, in its
/// `namespace` with the CrossNamespaceVolumeDataSource gate (`cross_namespace`; whether a
/// ReferenceGrant allows it is [`crate::grants::check`]'s question), refused without.
pub fn data_source(
    claim: &PersistentVolumeClaim,
    cross_namespace: bool,
) -> Result<DataSource, ClaimError> {
    let spec = claim.spec.clone().unwrap_or_default();
    let mut namespace = claim.namespace().unwrap_or_default();
    let (kind, api_group, name) = if let Some(source) = spec.data_source {
        (
            source.kind,
            source.api_group.unwrap_or_default(),
            source.name,
        )
    } else if let Some(source) = spec.data_source_ref {
        match source.namespace.filter(|ns| !ns.is_empty()) {
            Some(other) if cross_namespace => namespace = other,
            // Upstream refuses any namespace without the gate; the claim's own is harmless.
            Some(other) if other != namespace => {
                return Err(ClaimError::DataSource(
                    "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled".to_string(),
                ));
            }
            _ => {}
        }
        (
            source.kind,
            source.api_group.unwrap_or_default(),
            source.name,
        )
    } else {
        return Ok(DataSource::None);
    };
    if name.is_empty() {
        return Err(ClaimError::DataSource(format!(
            "the PVC source not found for PVC {}",
            claim.name_any()
        )));
    }
    Ok(match (kind.as_str(), api_group.as_str()) {
        ("PersistentVolumeClaim", "") => DataSource::Claim { name, namespace },
        ("VolumeSnapshot", SNAPSHOT_GROUP) => DataSource::Snapshot { name, namespace },
        ("VolumeSnapshot", other) => {
            return Err(ClaimError::DataSource(format!(
                "the PVC source does not belong to the right APIGroup. Expected {SNAPSHOT_GROUP}, Got {other}"
            )));
        }
        _ => DataSource::Populator { kind, api_group },
    })
}

/// Whether a Pending claim other than `except` (a UID) still has `source` as its data source:
/// a source keeps its protection finalizer until none does (`CloningProtectionController`,
/// `SnapshotFinalizerController`; both look at `dataSource` and `dataSourceRef`).
///
/// With `cross_namespace`, claims of other namespaces count too (upstream's
/// `CloningProtectionController` looks in the source's namespace only, and would let a source
/// go while a cross-namespace clone still copies from it).
pub fn still_needed_by_pending_claims<'a>(
    claims: impl IntoIterator<Item = &'a CachedClaim>,
    source: &DataSource,
    except: Option<&str>,
    cross_namespace: bool,
) -> bool {
    claims.into_iter().any(|claim| {
        let pending = matches!(
            claim.status.as_ref().and_then(|s| s.phase.as_deref()),
            None | Some("") | Some("Pending")
        );
        // Only the few pending claims are built whole to read their source.
        pending
            && claim.metadata.uid.as_deref() != except
            && data_source(&claim.to_claim(), cross_namespace).as_ref() == Ok(source)
    })
}

/// The claim's storage request in bytes; none at all is 0, as upstream's `Quantity.Value()`
/// of an absent request.
pub fn requested_size(claim: &PersistentVolumeClaim) -> Result<i64, ClaimError> {
    let request = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"));
    let Some(request) = request else {
        return Ok(0);
    };
    csi_kinds::quantity::bytes(&request.0).map_err(|source| ClaimError::StorageRequest {
        claim: claim.name_any(),
        source,
    })
}

/// Validates a clone source (`getPVCSource`, in its order and words, but that a claim not
/// Bound is named by its phase where Go prints its whole status struct) and returns the source
/// volume's handle: the source claim Bound, not being deleted, both claims with a class, the
/// request not smaller than the source's; its PV a Bound CSI volume of the same driver, bound
/// back to it, of the same volume mode.
pub fn clone_source(
    target: &PersistentVolumeClaim,
    driver: &str,
    source: &PersistentVolumeClaim,
    source_volume: Option<&PersistentVolume>,
) -> Result<String, ClaimError> {
    let fail = |message: String| Err(ClaimError::CloneSource(message));
    let invalid = |detail: String| Err(ClaimError::CloneSourceInvalid(detail));
    let name = source.name_any();
    let phase = source.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Bound") {
        return fail(format!(
            "the PVC DataSource {name} must have a status of Bound.  Got {}",
            phase.unwrap_or_default()
        ));
    }
    // Upstream refuses a source being deleted even when its own cloning-protection finalizer
    // holds it: the clone then stays Pending and the finalizer is never removed. The finalizer
    // means provisioning had started and the source's data is still there, so it may go on.
    if source.metadata.deletion_timestamp.is_some()
        && !source.finalizers().iter().any(|f| f == CLONING_PROTECTION)
    {
        return fail(format!(
            "the PVC DataSource {name} is currently being deleted"
        ));
    }
    let source_spec = source.spec.clone().unwrap_or_default();
    let target_spec = target.spec.clone().unwrap_or_default();
    if source_spec.storage_class_name.is_none() {
        return fail(format!(
            "the source PVC ({name}) storageclass cannot be empty"
        ));
    }
    if target_spec.storage_class_name.is_none() {
        return fail(format!(
            "the requested PVC ({}) storageclass cannot be empty",
            target.name_any()
        ));
    }
    let (requested, available) = (requested_size(target)?, requested_size(source)?);
    if requested < available {
        return fail(format!(
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {available}"
        ));
    }
    let volume_name = source_spec.volume_name.unwrap_or_default();
    if volume_name.is_empty() {
        return fail(format!("volume name is empty in source PVC {name}"));
    }
    let Some(volume) = source_volume else {
        return invalid(format!("volume {volume_name} of PVC {name} is not found"));
    };
    let volume_spec = volume.spec.clone().unwrap_or_default();
    let Some(csi) = volume_spec.csi else {
        return invalid(format!(
            "volume {volume_name} of PVC {name} is not a CSI volume"
        ));
    };
    if csi.driver != driver {
        return invalid(format!(
            "volume {volume_name} of PVC {name} is handled by driver {}, not {driver}",
            csi.driver
        ));
    }
    let bound_back = volume_spec.claim_ref.is_some_and(|r| {
        r.uid == source.metadata.uid
            && r.name.as_deref() == Some(&name)
            && r.namespace == source.namespace()
    });
    if !bound_back {
        return invalid(format!("volume {volume_name} is not bound to PVC {name}"));
    }
    let volume_phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
    if volume_phase != Some("Bound") {
        return invalid(format!(
            "volume {volume_name} of PVC {name} is {:?}, not Bound",
            volume_phase.unwrap_or_default()
        ));
    }
    // The target's mode against the source PV's (absent is Filesystem).
    let target_block = target_spec.volume_mode.as_deref() == Some("Block");
    let source_block = volume_spec.volume_mode.as_deref() == Some("Block");
    match (source_block, target_block) {
        (true, false) => fail(
            "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem".to_string(),
        ),
        (false, true) => fail(
            "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block".to_string(),
        ),
        _ => Ok(csi.volume_handle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const DRIVER: &str = "csi.example.com";

    fn claim(value: Value) -> PersistentVolumeClaim {
        serde_json::from_value(value).unwrap()
    }

    fn class(mode: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "fast"}, "provisioner": DRIVER, "volumeBindingMode": mode}),
        )
        .unwrap()
    }

    #[test]
    fn which_claims() {
        let immediate = class("Immediate");
        let delayed = class("WaitForFirstConsumer");
        let in_tree = StorageClass {
            provisioner: "kubernetes.io/gce-pd".into(),
            ..class("Immediate")
        };
        let ours = |annotations: Value| {
            claim(
                json!({"metadata": {"name": "c", "annotations": annotations}, "spec": {"storageClassName": "fast"}}),
            )
        };
        let table = [
            (
                "GA annotation",
                ours(json!({STORAGE_PROVISIONER: DRIVER})),
                Some(&immediate),
                Ok(ClaimDecision::Provision {
                    selected_node: None,
                }),
            ),
            (
                "beta annotation",
                ours(json!({BETA_STORAGE_PROVISIONER: DRIVER})),
                Some(&immediate),
                Ok(ClaimDecision::Provision {
                    selected_node: None,
                }),
            ),
            (
                "migrated-to alone",
                ours(json!({STORAGE_PROVISIONER: "kubernetes.io/gce-pd", MIGRATED_TO: DRIVER})),
                Some(&immediate),
                Ok(ClaimDecision::Ignore),
            ),
            (
                "migrated, no translation",
                ours(json!({STORAGE_PROVISIONER: DRIVER, MIGRATED_TO: DRIVER})),
                Some(&in_tree),
                Ok(ClaimDecision::ForeignClass {
                    provisioner: "kubernetes.io/gce-pd".into(),
                }),
            ),
            (
                "class of another provisioner",
                ours(json!({STORAGE_PROVISIONER: DRIVER})),
                Some(&in_tree),
                Ok(ClaimDecision::ForeignClass {
                    provisioner: "kubernetes.io/gce-pd".into(),
                }),
            ),
            (
                "other provisioner",
                ours(json!({STORAGE_PROVISIONER: "other"})),
                Some(&immediate),
                Ok(ClaimDecision::Ignore),
            ),
            (
                "no annotation",
                ours(json!({})),
                Some(&immediate),
                Ok(ClaimDecision::Ignore),
            ),
            (
                "WFFC without node",
                ours(json!({STORAGE_PROVISIONER: DRIVER})),
                Some(&delayed),
                Ok(ClaimDecision::WaitForNode),
            ),
            (
                "WFFC with node",
                ours(json!({STORAGE_PROVISIONER: DRIVER, SELECTED_NODE: "n1"})),
                Some(&delayed),
                Ok(ClaimDecision::Provision {
                    selected_node: Some("n1".into()),
                }),
            ),
            (
                "missing class",
                ours(json!({STORAGE_PROVISIONER: DRIVER})),
                None,
                Err(ClaimError::MissingClass("fast".into())),
            ),
        ];
        for (what, claim, class, expected) in table {
            assert_eq!(decide(&claim, DRIVER, class), expected, "{what}");
        }
        // The GCE PD driver's provisioner takes the claims of gce-pd classes the PV controller
        // handed to it (as a 1.28 kube-controller-manager does: the CSI name in
        // storage-provisioner, and migrated-to), and no other plugin's.
        const PD: &str = "pd.csi.storage.gke.io";
        let provision = Ok(ClaimDecision::Provision {
            selected_node: None,
        });
        let migrated = [
            (
                "handed over",
                ours(json!({STORAGE_PROVISIONER: PD, MIGRATED_TO: PD})),
                "kubernetes.io/gce-pd",
                provision.clone(),
            ),
            (
                "in-tree name and migrated-to",
                ours(json!({BETA_STORAGE_PROVISIONER: "kubernetes.io/gce-pd", MIGRATED_TO: PD})),
                "kubernetes.io/gce-pd",
                provision.clone(),
            ),
            (
                "in-tree name, not migrated",
                ours(json!({STORAGE_PROVISIONER: "kubernetes.io/gce-pd"})),
                "kubernetes.io/gce-pd",
                Ok(ClaimDecision::Ignore),
            ),
            (
                "another plugin's class",
                ours(json!({STORAGE_PROVISIONER: PD, MIGRATED_TO: PD})),
                "kubernetes.io/aws-ebs",
                Ok(ClaimDecision::ForeignClass {
                    provisioner: "kubernetes.io/aws-ebs".into(),
                }),
            ),
            (
                "its own CSI class",
                ours(json!({STORAGE_PROVISIONER: PD})),
                PD,
                provision,
            ),
        ];
        for (what, claim, provisioner, expected) in migrated {
            let class = StorageClass {
                provisioner: provisioner.into(),
                ..class("Immediate")
            };
            assert_eq!(decide(&claim, PD, Some(&class)), expected, "{what}");
        }
        let bound = claim(
            json!({"metadata": {"name": "c", "annotations": {STORAGE_PROVISIONER: DRIVER}}, "spec": {"volumeName": "pv"}}),
        );
        assert_eq!(decide(&bound, DRIVER, None), Ok(ClaimDecision::Ignore));
        // Provisioning refuses a selector (after its Provisioning Event, as upstream).
        let selector = claim(
            json!({"metadata": {"name": "c", "annotations": {STORAGE_PROVISIONER: DRIVER}}, "spec": {"storageClassName": "fast", "selector": {"matchLabels": {"a": "b"}}}}),
        );
        assert_eq!(
            decide(&selector, DRIVER, Some(&immediate)),
            Ok(ClaimDecision::Provision {
                selected_node: None
            })
        );
    }

    #[test]
    fn data_sources() {
        let with = |spec: Value| {
            claim(json!({"metadata": {"name": "c", "namespace": "apps"}, "spec": spec}))
        };
        let table = [
            (with(json!({})), Ok(DataSource::None)),
            (
                with(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}})),
                Ok(DataSource::Claim {
                    name: "src".into(),
                    namespace: "apps".into(),
                }),
            ),
            (
                with(
                    json!({"dataSourceRef": {"kind": "VolumeSnapshot", "apiGroup": SNAPSHOT_GROUP, "name": "snap"}}),
                ),
                Ok(DataSource::Snapshot {
                    name: "snap".into(),
                    namespace: "apps".into(),
                }),
            ),
            (
                with(
                    json!({"dataSourceRef": {"kind": "Backup", "apiGroup": "example.com", "name": "b"}}),
                ),
                Ok(DataSource::Populator {
                    kind: "Backup".into(),
                    api_group: "example.com".into(),
                }),
            ),
        ];
        for (claim, expected) in table {
            assert_eq!(data_source(&claim, false), expected);
        }
        let wrong_group = with(
            json!({"dataSource": {"kind": "VolumeSnapshot", "apiGroup": "example.com", "name": "s"}}),
        );
        assert_eq!(
            data_source(&wrong_group, false),
            Err(ClaimError::DataSource(
                "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got example.com".into()
            ))
        );
        let cross = with(
            json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "s", "namespace": "other"}}),
        );
        assert_eq!(
            data_source(&cross, false),
            Err(ClaimError::DataSource(
                "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled".to_string()
            ))
        );
        assert_eq!(
            data_source(&cross, true),
            Ok(DataSource::Claim {
                name: "s".into(),
                namespace: "other".into()
            })
        );
        let own = with(
            json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "s", "namespace": "apps"}}),
        );
        assert_eq!(
            data_source(&own, false),
            Ok(DataSource::Claim {
                name: "s".into(),
                namespace: "apps".into()
            })
        );
        let unnamed = with(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": ""}}));
        assert_eq!(
            data_source(&unnamed, false),
            Err(ClaimError::DataSource(
                "the PVC source not found for PVC c".into()
            ))
        );
    }

    /// Case, target spec, source claim, its PV, the handle or upstream's refusal.
    type CloneCase = (
        &'static str,
        Value,
        PersistentVolumeClaim,
        Option<PersistentVolume>,
        Result<String, ClaimError>,
    );

    #[test]
    fn clone_sources() {
        let target = |spec: Value| {
            let mut value = json!({"metadata": {"name": "copy", "namespace": "apps"}, "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "2Gi"}}}});
            json_patch::merge(&mut value["spec"], &spec);
            claim(value)
        };
        let source = |extra: Value| {
            let mut value = json!({"metadata": {"name": "src", "namespace": "apps", "uid": "u1"}, "spec": {"storageClassName": "fast", "volumeName": "pv-src", "resources": {"requests": {"storage": "1Gi"}}}, "status": {"phase": "Bound"}});
            json_patch::merge(&mut value, &extra);
            claim(value)
        };
        let volume = |extra: Value| {
            let mut value = json!({"metadata": {"name": "pv-src"}, "spec": {
                "csi": {"driver": DRIVER, "volumeHandle": "vol-src"}, "claimRef": {"name": "src", "namespace": "apps", "uid": "u1"}}, "status": {"phase": "Bound"}});
            json_patch::merge(&mut value, &extra);
            serde_json::from_value::<PersistentVolume>(value).unwrap()
        };
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let mut protected = deleting.clone();
        protected["metadata"]["finalizers"] = json!([CLONING_PROTECTION]);
        let refused = |text: &str| Err(ClaimError::CloneSource(text.to_string()));
        let invalid = |detail: &str| Err(ClaimError::CloneSourceInvalid(detail.to_string()));
        let cases: Vec<CloneCase> = vec![
            (
                "usable",
                json!({}),
                source(json!({})),
                Some(volume(json!({}))),
                Ok("vol-src".into()),
            ),
            (
                "source Pending",
                json!({}),
                source(json!({"status": {"phase": "Pending"}})),
                Some(volume(json!({}))),
                refused("the PVC DataSource src must have a status of Bound.  Got Pending"),
            ),
            (
                "source being deleted",
                json!({}),
                source(deleting),
                Some(volume(json!({}))),
                refused("the PVC DataSource src is currently being deleted"),
            ),
            (
                "deleted, held by our finalizer",
                json!({}),
                source(protected),
                Some(volume(json!({}))),
                Ok("vol-src".into()),
            ),
            (
                "source without class",
                json!({}),
                source(json!({"spec": {"storageClassName": null}})),
                Some(volume(json!({}))),
                refused("the source PVC (src) storageclass cannot be empty"),
            ),
            (
                "target without class",
                json!({"storageClassName": null}),
                source(json!({})),
                Some(volume(json!({}))),
                refused("the requested PVC (copy) storageclass cannot be empty"),
            ),
            (
                "smaller request",
                json!({"resources": {"requests": {"storage": "1Mi"}}}),
                source(json!({})),
                Some(volume(json!({}))),
                refused(
                    "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 1048576 but source is 1073741824",
                ),
            ),
            (
                "no volume name",
                json!({}),
                source(json!({"spec": {"volumeName": null}})),
                None,
                refused("volume name is empty in source PVC src"),
            ),
            (
                "no PV",
                json!({}),
                source(json!({})),
                None,
                invalid("volume pv-src of PVC src is not found"),
            ),
            (
                "not CSI",
                json!({}),
                source(json!({})),
                Some(volume(json!({"spec": {"csi": null}}))),
                invalid("volume pv-src of PVC src is not a CSI volume"),
            ),
            (
                "other driver",
                json!({}),
                source(json!({})),
                Some(volume(json!({"spec": {"csi": {"driver": "other"}}}))),
                invalid("volume pv-src of PVC src is handled by driver other, not csi.example.com"),
            ),
            (
                "bound elsewhere",
                json!({}),
                source(json!({})),
                Some(volume(json!({"spec": {"claimRef": {"uid": "u2"}}}))),
                invalid("volume pv-src is not bound to PVC src"),
            ),
            (
                "PV Released",
                json!({}),
                source(json!({})),
                Some(volume(json!({"status": {"phase": "Released"}}))),
                invalid("volume pv-src of PVC src is \"Released\", not Bound"),
            ),
            (
                "Block source, Filesystem target",
                json!({}),
                source(json!({})),
                Some(volume(json!({"spec": {"volumeMode": "Block"}}))),
                refused(
                    "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem",
                ),
            ),
            (
                "Filesystem source, Block target",
                json!({"volumeMode": "Block"}),
                source(json!({})),
                Some(volume(json!({}))),
                refused(
                    "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block",
                ),
            ),
            (
                "Block both",
                json!({"volumeMode": "Block"}),
                source(json!({})),
                Some(volume(json!({"spec": {"volumeMode": "Block"}}))),
                Ok("vol-src".into()),
            ),
        ];
        for (case, spec, source, volume, want) in cases {
            assert_eq!(
                clone_source(&target(spec), DRIVER, &source, volume.as_ref()),
                want,
                "{case}"
            );
        }
        assert_eq!(
            ClaimError::CloneSourceInvalid("detail".into()).to_string(),
            "claim in dataSource not bound or invalid"
        );
        let unreadable = target(json!({"resources": {"requests": {"storage": "-2Gi"}}}));
        assert!(matches!(
            clone_source(
                &unreadable,
                DRIVER,
                &source(json!({})),
                Some(&volume(json!({})))
            ),
            Err(ClaimError::StorageRequest { .. })
        ));
    }

    /// Every form the API server stores is read in whole bytes, rounded up; a request that is
    /// no size is an error naming the claim, never 0 bytes.
    #[test]
    fn storage_requests_in_bytes() {
        let with = |request: Option<&str>| {
            let requests = request.map(|q| json!({"storage": q}));
            claim(json!({"metadata": {"name": "data", "namespace": "apps"},
                "spec": {"resources": {"requests": requests}}}))
        };
        let table: &[(Option<&str>, Result<i64, &str>)] = &[
            (None, Ok(0)),
            (Some("1126400m"), Ok(1127)),
            (Some("5e9"), Ok(5_000_000_000)),
            (Some("1.5Gi"), Ok(3 << 29)),
            (Some("+1Ki"), Ok(1024)),
            (Some("-1Gi"), Err("negative")),
            (Some("1e30"), Err("more than 9223372036854775807 bytes")),
            (Some("lots"), Err("malformed")),
        ];
        for (request, want) in table {
            let got = requested_size(&with(*request)).map_err(|e| e.to_string());
            match (want, &got) {
                (Ok(bytes), Ok(got)) => assert_eq!(got, bytes, "{request:?}"),
                (Err(text), Err(message)) => assert!(
                    message.starts_with("storage request of claim data: ")
                        && message.contains(text),
                    "{request:?}: {message}"
                ),
                _ => panic!("{request:?}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn sources_still_needed() {
        let source = DataSource::Claim {
            name: "src".to_string(),
            namespace: "apps".to_string(),
        };
        let cached = |value| serde_json::from_value::<CachedClaim>(value).unwrap();
        let target = |phase: Option<&str>, namespace: &str, reference: &str| {
            cached(json!({
                "metadata": {"name": "copy", "namespace": namespace, "uid": "t1"},
                "spec": {reference: {"kind": "PersistentVolumeClaim", "name": "src"}},
                "status": phase.map(|p| json!({"phase": p})).unwrap_or(json!({}))
            }))
        };
        let cases = [
            (
                "pending clone",
                target(Some("Pending"), "apps", "dataSource"),
                None,
                true,
            ),
            (
                "no phase yet",
                target(None, "apps", "dataSource"),
                None,
                true,
            ),
            (
                "via dataSourceRef",
                target(Some("Pending"), "apps", "dataSourceRef"),
                None,
                true,
            ),
            (
                "bound clone",
                target(Some("Bound"), "apps", "dataSource"),
                None,
                false,
            ),
            (
                "other namespace",
                target(Some("Pending"), "web", "dataSource"),
                None,
                false,
            ),
            (
                "the excepted claim",
                target(Some("Pending"), "apps", "dataSource"),
                Some("t1"),
                false,
            ),
        ];
        for (name, claim, except, expected) in cases {
            assert_eq!(
                still_needed_by_pending_claims([&claim], &source, except, false),
                expected,
                "{name}"
            );
        }
        let cross = cached(json!({
            "metadata": {"name": "copy", "namespace": "web", "uid": "t2"},
            "spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src", "namespace": "apps"}},
        }));
        assert!(
            still_needed_by_pending_claims([&cross], &source, None, true),
            "a pending clone from another namespace"
        );
        assert!(!still_needed_by_pending_claims(
            [&cross],
            &source,
            None,
            false
        ));
    }
}

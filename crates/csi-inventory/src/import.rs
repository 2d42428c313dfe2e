//! A PersistentVolume for a volume that exists on the storage (`csi-inventory import`): what an
//! administrator would otherwise write by hand. Pure: the volume as ListVolumes gave it, the
//! class, and the PVs of the driver in → the PV (or why not) out.

use std::collections::{BTreeMap, BTreeSet};

use csi_kinds::annotations::PROVISIONED_BY;
use csi_kinds::names::is_dns1123_subdomain;
use csi_kinds::pv::node_affinity;
use csi_kinds::quantity::binary_si;
use csi_kinds::secrets::{FS_TYPE_KEY, SecretRef, SecretRefs, SecretsError, TemplateInputs};
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::SecretReference;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::report::{ClusterVolume, PV_NAME_KEY, StorageVolume, is_inline_handle};

/// What the PV is made of besides the volume.
#[derive(Debug, Clone)]
pub struct ImportSpec<'a> {
    pub pv_name: &'a str,
    pub driver: &'a str,
    pub class: &'a StorageClass,
    /// `namespace/name`: the PV is reserved for this claim (`claimRef`).
    pub claim: Option<&'a str>,
    /// `Retain` or `Delete`.
    pub reclaim_policy: &'a str,
    pub access_modes: &'a [String],
    /// `Filesystem` or `Block`.
    pub volume_mode: &'a str,
    /// The size to record when the driver reports none (0).
    pub capacity_bytes: Option<i64>,
    /// The driver has VOLUME_ACCESSIBILITY_CONSTRAINTS: the volume's topology becomes the PV's
    /// node affinity.
    pub topology: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("volume {0} is not listed by the driver")]
    NotListed(String),
    #[error(
        "volume {0} is a CSI ephemeral inline volume (the kubelet's csi-<sha256> handle): it belongs to a pod and is deleted by its NodeUnpublishVolume, never imported as a PersistentVolume"
    )]
    Ephemeral(String),
    #[error("volume {volume} already has the PersistentVolume {pv}")]
    AlreadyImported { volume: String, pv: String },
    #[error("a PersistentVolume named {0} exists")]
    NameTaken(String),
    #[error("{0:?} is not a valid PersistentVolume name")]
    BadName(String),
    #[error("StorageClass {class} provisions for {provisioner}, not for {driver}")]
    OtherDriver {
        class: String,
        provisioner: String,
        driver: String,
    },
    #[error("reclaim policy must be Retain or Delete, not {0:?}")]
    ReclaimPolicy(String),
    #[error("volume mode must be Filesystem or Block, not {0:?}")]
    VolumeMode(String),
    #[error(
        "access mode {0:?} is none of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod"
    )]
    AccessMode(String),
    #[error("--claim must be namespace/name, not {0:?}")]
    ClaimRef(String),
    #[error("the driver reports no size for volume {0}; give --capacity")]
    NoSize(String),
    #[error("the StorageClass's secret parameters: {0}")]
    Secrets(#[from] SecretsError),
}

const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// The PV for `volume`, refused when it is an inline volume's, or a PV of the driver already
/// names it or has its name.
pub fn persistent_volume(
    volume: &StorageVolume,
    pvs: &[ClusterVolume],
    taken_names: &BTreeSet<String>,
    spec: &ImportSpec<'_>,
) -> Result<Value, Refusal> {
    if is_inline_handle(&volume.id) {
        return Err(Refusal::Ephemeral(volume.id.clone()));
    }
    if let Some(existing) = pvs.iter().find(|pv| pv.handle == volume.id) {
        return Err(Refusal::AlreadyImported {
            volume: volume.id.clone(),
            pv: existing.pv.clone(),
        });
    }
    if !is_dns1123_subdomain(spec.pv_name) {
        return Err(Refusal::BadName(spec.pv_name.to_string()));
    }
    if taken_names.contains(spec.pv_name) {
        return Err(Refusal::NameTaken(spec.pv_name.to_string()));
    }
    if spec.class.provisioner != spec.driver {
        return Err(Refusal::OtherDriver {
            class: spec.class.name_any(),
            provisioner: spec.class.provisioner.clone(),
            driver: spec.driver.to_string(),
        });
    }
    if !["Retain", "Delete"].contains(&spec.reclaim_policy) {
        return Err(Refusal::ReclaimPolicy(spec.reclaim_policy.to_string()));
    }
    if !["Filesystem", "Block"].contains(&spec.volume_mode) {
        return Err(Refusal::VolumeMode(spec.volume_mode.to_string()));
    }
    if let Some(mode) = spec
        .access_modes
        .iter()
        .find(|m| !ACCESS_MODES.contains(&m.as_str()))
    {
        return Err(Refusal::AccessMode(mode.clone()));
    }
    let claim = spec
        .claim
        .map(|claim| match claim.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
                Ok((namespace, name))
            }
            _ => Err(Refusal::ClaimRef(claim.to_string())),
        })
        .transpose()?;
    let bytes = match (volume.capacity_bytes, spec.capacity_bytes) {
        (_, Some(bytes)) => bytes,
        (0, None) => return Err(Refusal::NoSize(volume.id.clone())),
        (bytes, None) => bytes,
    };
    let parameters: BTreeMap<String, String> = spec.class.parameters.clone().unwrap_or_default();
    let (claim_namespace, claim_name) = claim.unwrap_or_default();
    let secrets = SecretRefs::resolve(
        &parameters,
        &TemplateInputs {
            pv_name: spec.pv_name,
            pvc_name: claim_name,
            pvc_namespace: claim_namespace,
            pvc_annotations: &BTreeMap::new(),
        },
    )?;
    let reference =
        |r: &Option<SecretRef>| -> Option<SecretReference> { r.clone().map(Into::into) };
    let mut source = json!({
        "driver": spec.driver,
        "volumeHandle": volume.id,
        "volumeAttributes": volume.context,
        "controllerPublishSecretRef": reference(&secrets.controller_publish),
        "nodeStageSecretRef": reference(&secrets.node_stage),
        "nodePublishSecretRef": reference(&secrets.node_publish),
        "controllerExpandSecretRef": reference(&secrets.controller_expand),
        "nodeExpandSecretRef": reference(&secrets.node_expand),
    });
    if let Some(fs_type) = parameters
        .get(FS_TYPE_KEY)
        .filter(|_| spec.volume_mode != "Block")
    {
        source["fsType"] = json!(fs_type);
    }
    let mut pv_spec = json!({
        "accessModes": spec.access_modes,
        "capacity": {"storage": binary_si(bytes)},
        "csi": source,
        "persistentVolumeReclaimPolicy": spec.reclaim_policy,
        "storageClassName": spec.class.name_any(),
        "volumeMode": spec.volume_mode,
    });
    if let Some(options) = spec.class.mount_options.clone().filter(|o| !o.is_empty()) {
        pv_spec["mountOptions"] = json!(options);
    }
    if let Some((namespace, name)) = claim {
        pv_spec["claimRef"] = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": namespace, "name": name});
    }
    let topology: Vec<csi::Topology> = volume
        .topology
        .iter()
        .map(|segments| csi::Topology {
            segments: segments.clone().into_iter().collect(),
        })
        .collect();
    if spec.topology
        && let Some(affinity) = node_affinity(&topology)
    {
        pv_spec["nodeAffinity"] = json!(affinity);
    }
    Ok(strip_nulls(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        // With the provisioned-by annotation a Delete policy is carried out by the driver's
        // provisioner when the PV is released, as for a volume it made itself.
        "metadata": {"name": spec.pv_name, "annotations": {PROVISIONED_BY: spec.driver}},
        "spec": pv_spec,
    })))
}

/// A name for an orphan's PV: the one the provisioner gave it (from `--extra-create-metadata`)
/// when still free, else `imported-<volume id>` made a valid name, numbered when taken.
pub fn orphan_pv_name(volume: &StorageVolume, taken: &BTreeSet<String>) -> String {
    if let Some(name) = volume.context.get(PV_NAME_KEY)
        && is_dns1123_subdomain(name)
        && !taken.contains(name)
    {
        return name.clone();
    }
    let cleaned: String = volume
        .id
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut base = format!("imported-{}", cleaned.trim_matches('-'));
    base.truncate(240);
    let base = base.trim_end_matches('-').to_string();
    std::iter::once(base.clone())
        .chain((2..).map(|n| format!("{base}-{n}")))
        .find(|name| !taken.contains(name))
        .unwrap_or(base)
}

/// Drops the `null` secret references (absent rather than null in the object).
fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;

    fn class(provisioner: &str, parameters: serde_json::Value) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "fast"}, "provisioner": provisioner,
            "parameters": parameters, "mountOptions": ["noatime"]}),
        )
        .unwrap()
    }

    fn volume() -> StorageVolume {
        StorageVolume {
            id: "vol-1".into(),
            capacity_bytes: 1 << 30,
            context: [("origin".to_string(), "array".to_string())].into(),
            topology: vec![[("zone".to_string(), "a".to_string())].into()],
            ..Default::default()
        }
    }

    fn spec<'a>(class: &'a StorageClass, modes: &'a [String]) -> ImportSpec<'a> {
        ImportSpec {
            pv_name: "restored",
            driver: "hostpath",
            class,
            claim: Some("shop/data"),
            reclaim_policy: "Retain",
            access_modes: modes,
            volume_mode: "Filesystem",
            capacity_bytes: None,
            topology: true,
        }
    }

    #[test]
    fn the_pv_carries_the_volume_the_class_and_the_claim() {
        let class = class(
            "hostpath",
            json!({"csi.storage.k8s.io/fstype": "ext4",
                "csi.storage.k8s.io/node-stage-secret-name": "stage-${pv.name}",
                "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}"}),
        );
        let modes = ["ReadWriteOnce".to_string()];
        let pv =
            persistent_volume(&volume(), &[], &BTreeSet::new(), &spec(&class, &modes)).unwrap();
        let typed: PersistentVolume = serde_json::from_value(pv.clone()).unwrap();
        let spec = typed.spec.unwrap();
        let source = spec.csi.unwrap();
        assert_eq!(source.volume_handle, "vol-1");
        assert_eq!(source.fs_type.as_deref(), Some("ext4"));
        assert_eq!(source.volume_attributes.unwrap()["origin"], "array");
        let stage = source.node_stage_secret_ref.unwrap();
        assert_eq!(
            (stage.name.as_deref(), stage.namespace.as_deref()),
            (Some("stage-restored"), Some("shop"))
        );
        assert!(pv["spec"]["csi"].get("nodePublishSecretRef").is_none());
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        let claim = spec.claim_ref.unwrap();
        assert_eq!(
            (claim.namespace.as_deref(), claim.name.as_deref()),
            (Some("shop"), Some("data"))
        );
        let terms = spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");
        assert_eq!(
            typed.metadata.annotations.unwrap()[PROVISIONED_BY],
            "hostpath"
        );
    }

    #[test]
    fn imports_that_would_be_wrong_are_refused() {
        let ours = class("hostpath", json!({}));
        let theirs = class("other.csi", json!({}));
        let modes = ["ReadWriteOnce".to_string()];
        let bad_modes = ["ReadWriteSometimes".to_string()];
        let imported = ClusterVolume {
            pv: "pv-1".into(),
            handle: "vol-1".into(),
            ..Default::default()
        };
        let taken: BTreeSet<String> = ["restored".to_string()].into();
        let no_size = StorageVolume {
            capacity_bytes: 0,
            ..volume()
        };
        let base = spec(&ours, &modes);
        type Row<'a> = (
            &'static str,
            StorageVolume,
            Vec<ClusterVolume>,
            BTreeSet<String>,
            ImportSpec<'a>,
        );
        let inline = StorageVolume {
            id: format!("csi-{}", "5e".repeat(32)),
            ..volume()
        };
        let rows: Vec<Row> = vec![
            (
                "an inline volume's",
                inline.clone(),
                vec![],
                BTreeSet::new(),
                base.clone(),
            ),
            (
                "already imported",
                volume(),
                vec![imported],
                BTreeSet::new(),
                base.clone(),
            ),
            ("name taken", volume(), vec![], taken, base.clone()),
            (
                "bad name",
                volume(),
                vec![],
                BTreeSet::new(),
                ImportSpec {
                    pv_name: "Not_A_Name",
                    ..base.clone()
                },
            ),
            (
                "other driver's class",
                volume(),
                vec![],
                BTreeSet::new(),
                ImportSpec {
                    class: &theirs,
                    ..base.clone()
                },
            ),
            (
                "reclaim",
                volume(),
                vec![],
                BTreeSet::new(),
                ImportSpec {
                    reclaim_policy: "Recycle",
                    ..base.clone()
                },
            ),
            (
                "volume mode",
                volume(),
                vec![],
                BTreeSet::new(),
                ImportSpec {
                    volume_mode: "Disk",
                    ..base.clone()
                },
            ),
            (
                "access mode",
                volume(),
                vec![],
                BTreeSet::new(),
                ImportSpec {
                    access_modes: &bad_modes,
                    ..base.clone()
                },
            ),
            (
                "claim",
                volume(),
                vec![],
                BTreeSet::new(),
                ImportSpec {
                    claim: Some("data"),
                    ..base.clone()
                },
            ),
            (
                "no size",
                no_size.clone(),
                vec![],
                BTreeSet::new(),
                base.clone(),
            ),
        ];
        let inline_refusal = format!(
            "volume {} is a CSI ephemeral inline volume (the kubelet's csi-<sha256> handle): it belongs to a pod and is deleted by its NodeUnpublishVolume, never imported as a PersistentVolume",
            inline.id
        );
        let expected = [
            inline_refusal.as_str(),
            "volume vol-1 already has the PersistentVolume pv-1",
            "a PersistentVolume named restored exists",
            "\"Not_A_Name\" is not a valid PersistentVolume name",
            "StorageClass fast provisions for other.csi, not for hostpath",
            "reclaim policy must be Retain or Delete, not \"Recycle\"",
            "volume mode must be Filesystem or Block, not \"Disk\"",
            "access mode \"ReadWriteSometimes\" is none of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod",
            "--claim must be namespace/name, not \"data\"",
            "the driver reports no size for volume vol-1; give --capacity",
        ];
        for ((name, volume, pvs, taken, spec), expected) in rows.into_iter().zip(expected) {
            let refused = persistent_volume(&volume, &pvs, &taken, &spec).expect_err(name);
            assert_eq!(refused.to_string(), expected, "{name}");
        }
        let sized = persistent_volume(
            &no_size,
            &[],
            &BTreeSet::new(),
            &ImportSpec {
                capacity_bytes: Some(5 << 20),
                ..base
            },
        )
        .unwrap();
        assert_eq!(sized["spec"]["capacity"]["storage"], "5Mi");
    }

    #[test]
    fn a_block_import_has_no_fs_type_and_no_claim_without_one() {
        let class = class("hostpath", json!({"csi.storage.k8s.io/fstype": "ext4"}));
        let modes = ["ReadWriteOnce".to_string()];
        let pv = persistent_volume(
            &volume(),
            &[],
            &BTreeSet::new(),
            &ImportSpec {
                volume_mode: "Block",
                claim: None,
                topology: false,
                ..spec(&class, &modes)
            },
        )
        .unwrap();
        assert!(pv["spec"]["csi"].get("fsType").is_none());
        assert!(pv["spec"].get("claimRef").is_none());
        assert!(pv["spec"].get("nodeAffinity").is_none());
        assert_eq!(pv["spec"]["volumeMode"], "Block");
    }

    #[test]
    fn orphans_are_named_after_their_old_pv_when_free() {
        let mut orphan = volume();
        orphan.context.insert(PV_NAME_KEY.into(), "pvc-1234".into());
        assert_eq!(orphan_pv_name(&orphan, &BTreeSet::new()), "pvc-1234");
        let taken: BTreeSet<String> = ["pvc-1234".to_string(), "imported-vol-1".to_string()].into();
        assert_eq!(orphan_pv_name(&orphan, &taken), "imported-vol-1-2");
        let odd = StorageVolume {
            id: "Vol/ID_9".into(),
            ..Default::default()
        };
        assert_eq!(orphan_pv_name(&odd, &BTreeSet::new()), "imported-vol-id-9");
    }
}

//! The PersistentVolume for a provisioned volume (external-provisioner `Provision` plus the
//! library's `provisionClaimOperation`). Pure.

use std::collections::BTreeMap;

use csi_kinds::migration::{MigrationError, Plugin};
use csi_kinds::quantity::binary_si;
use csi_kinds::secrets::{SecretRefs, deletion_secret_annotations, modify_secret_annotations};
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, SecretReference};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::deletion::PV_FINALIZER;
use csi_kinds::annotations::PROVISIONED_BY;
use csi_kinds::pv::node_affinity;

/// The volume attribute naming the provisioner instance that created the volume.
pub const PROVISIONER_IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";

/// What the PV is built from.
#[derive(Debug)]
pub struct PvInputs<'a> {
    pub name: &'a str,
    pub driver: &'a str,
    /// `<start time ms>-<random>-<driver>`, fixed per process.
    pub identity: &'a str,
    pub claim: &'a PersistentVolumeClaim,
    pub class: &'a StorageClass,
    pub volume: &'a csi::Volume,
    pub bytes: i64,
    pub fs_type: &'a str,
    pub secrets: &'a SecretRefs,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
    /// Whether the driver has VOLUME_ACCESSIBILITY_CONSTRAINTS (else no node affinity).
    pub topology: bool,
    /// The claim's VolumeAttributesClass whose parameters the volume was created with (see
    /// [`crate::vac::class_name`]).
    pub attributes_class: Option<&'a str>,
}

/// The PV as JSON for a create.
pub fn persistent_volume(inputs: &PvInputs<'_>) -> Value {
    let claim = inputs.claim;
    let claim_spec = claim.spec.clone().unwrap_or_default();
    let access_modes = claim_spec.access_modes.clone().unwrap_or_default();
    let block = claim_spec.volume_mode.as_deref() == Some("Block");
    let mut annotations: BTreeMap<&str, String> =
        BTreeMap::from([(PROVISIONED_BY, inputs.class.provisioner.clone())]);
    annotations.extend(deletion_secret_annotations(
        inputs.secrets.provisioner.as_ref(),
    ));
    annotations.extend(modify_secret_annotations(
        inputs.secrets.controller_modify.as_ref(),
    ));
    let mut attributes: BTreeMap<String, String> = BTreeMap::from([(
        PROVISIONER_IDENTITY_KEY.to_string(),
        inputs.identity.to_string(),
    )]);
    // The driver's volume context may overwrite the identity key, as upstream.
    attributes.extend(inputs.volume.volume_context.clone());
    let reference = |r: &Option<csi_kinds::secrets::SecretRef>| -> Option<SecretReference> {
        r.clone().map(Into::into)
    };
    let read_only = inputs.controller_publish_readonly
        && !access_modes.is_empty()
        && access_modes.iter().all(|m| m == "ReadOnlyMany");
    let mut csi_source = json!({
        "driver": inputs.driver,
        "volumeHandle": inputs.volume.volume_id,
        "volumeAttributes": attributes,
        "controllerPublishSecretRef": reference(&inputs.secrets.controller_publish),
        "nodeStageSecretRef": reference(&inputs.secrets.node_stage),
        "nodePublishSecretRef": reference(&inputs.secrets.node_publish),
        "controllerExpandSecretRef": reference(&inputs.secrets.controller_expand),
        "nodeExpandSecretRef": reference(&inputs.secrets.node_expand),
    });
    if read_only {
        csi_source["readOnly"] = json!(true);
    }
    if !block && !inputs.fs_type.is_empty() {
        csi_source["fsType"] = json!(inputs.fs_type);
    }
    let mut spec = json!({
        "accessModes": access_modes,
        "capacity": {"storage": binary_si(inputs.bytes)},
        "csi": csi_source,
        "persistentVolumeReclaimPolicy": inputs.class.reclaim_policy.clone().unwrap_or_else(|| "Delete".to_string()),
        "storageClassName": inputs.class.name_any(),
        "volumeMode": claim_spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".to_string()),
        "claimRef": {
            "kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": claim.namespace(), "name": claim.name_any(),
            "uid": claim.uid(), "resourceVersion": claim.resource_version(),
        },
    });
    if let Some(options) = inputs.class.mount_options.clone().filter(|o| !o.is_empty()) {
        spec["mountOptions"] = json!(options);
    }
    if let Some(class) = inputs.attributes_class {
        spec["volumeAttributesClassName"] = json!(class);
    }
    if inputs.topology
        && let Some(affinity) = node_affinity(&inputs.volume.accessible_topology)
    {
        spec["nodeAffinity"] = json!(affinity);
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": inputs.name, "annotations": annotations, "finalizers": [PV_FINALIZER]},
        "spec": spec,
    })
}

/// Why a created volume's PV cannot be written as the in-tree plugin's.
#[derive(Debug, thiserror::Error)]
pub enum InTreeError {
    #[error("failed to translate CSI PV to in-tree: {0}")]
    Translation(#[from] MigrationError),
    #[error("building the PV: {0}")]
    Json(#[from] serde_json::Error),
}

/// CSI migration: the PV of [`persistent_volume`] as the in-tree plugin's PV, which is how the
/// PV controller and everything before migration know the volume (upstream's
/// `TranslateCSIPVToInTree` after `Provision`).
pub fn in_tree_volume(pv: Value, plugin: Plugin) -> Result<Value, InTreeError> {
    let mut volume: PersistentVolume = serde_json::from_value(pv)?;
    plugin.csi_to_in_tree(&mut volume)?;
    Ok(serde_json::to_value(volume)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_kinds::secrets::SecretRef;

    #[test]
    fn the_pv_carries_claim_class_volume_and_secrets() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "u1", "resourceVersion": "7"},
            "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "fast"}, "provisioner": "csi.example.com", "reclaimPolicy": "Retain", "mountOptions": ["noatime"],
        }))
        .unwrap();
        let volume = csi::Volume {
            volume_id: "vol-1".into(),
            capacity_bytes: 1 << 30,
            volume_context: [("origin".to_string(), "test".to_string())].into(),
            accessible_topology: vec![csi::Topology {
                segments: [("zone".to_string(), "a".to_string())].into(),
            }],
            ..Default::default()
        };
        let secrets = SecretRefs {
            provisioner: Some(SecretRef {
                name: "p".into(),
                namespace: "apps".into(),
            }),
            node_stage: Some(SecretRef {
                name: "s".into(),
                namespace: "apps".into(),
            }),
            ..Default::default()
        };
        let value = persistent_volume(&PvInputs {
            name: "pvc-u1",
            driver: "csi.example.com",
            identity: "1-2-csi.example.com",
            claim: &claim,
            class: &class,
            volume: &volume,
            bytes: 1 << 30,
            fs_type: "ext4",
            secrets: &secrets,
            controller_publish_readonly: true,
            topology: true,
            attributes_class: Some("gold"),
        });
        let pv: PersistentVolume = serde_json::from_value(value).expect("a valid PersistentVolume");
        assert_eq!(pv.finalizers(), [PV_FINALIZER]);
        let annotations = pv.annotations();
        assert_eq!(annotations[PROVISIONED_BY], "csi.example.com");
        assert_eq!(
            annotations["volume.kubernetes.io/provisioner-deletion-secret-name"],
            "p"
        );
        let spec = pv.spec.unwrap();
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some("u1"));
        let source = spec.csi.unwrap();
        assert_eq!(source.volume_handle, "vol-1");
        assert_eq!(source.fs_type.as_deref(), Some("ext4"));
        assert_eq!(
            source.read_only,
            Some(true),
            "ReadOnlyMany only, with --controller-publish-readonly"
        );
        assert_eq!(
            source.node_stage_secret_ref.unwrap().name.as_deref(),
            Some("s")
        );
        assert!(source.controller_publish_secret_ref.is_none());
        let attributes = source.volume_attributes.unwrap();
        assert_eq!(attributes[PROVISIONER_IDENTITY_KEY], "1-2-csi.example.com");
        assert_eq!(attributes["origin"], "test");
        assert!(spec.node_affinity.is_some());
        assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));
    }

    #[test]
    fn migrated_volumes_are_written_as_in_tree_volumes() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp2"},
        }))
        .unwrap();
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "gp2"}, "provisioner": "kubernetes.io/aws-ebs",
            "parameters": {"type": "gp2", "fsType": "ext4"},
        }))
        .unwrap();
        let volume = csi::Volume {
            volume_id: "vol-0abc".into(),
            capacity_bytes: 1 << 30,
            accessible_topology: vec![csi::Topology {
                segments: [(
                    "topology.ebs.csi.aws.com/zone".to_string(),
                    "us-east-1a".to_string(),
                )]
                .into(),
            }],
            ..Default::default()
        };
        let value = persistent_volume(&PvInputs {
            name: "pvc-u1",
            driver: "ebs.csi.aws.com",
            identity: "1-2-ebs.csi.aws.com",
            claim: &claim,
            class: &class,
            volume: &volume,
            bytes: 1 << 30,
            fs_type: "ext4",
            secrets: &SecretRefs::default(),
            controller_publish_readonly: false,
            topology: true,
            attributes_class: None,
        });
        let written = in_tree_volume(value, Plugin::AwsEbs).unwrap();
        let pv: PersistentVolume = serde_json::from_value(written).unwrap();
        assert_eq!(pv.annotations()[PROVISIONED_BY], "kubernetes.io/aws-ebs");
        assert_eq!(pv.finalizers(), [PV_FINALIZER]);
        assert_eq!(pv.labels()["topology.kubernetes.io/zone"], "us-east-1a");
        assert_eq!(pv.labels()["topology.kubernetes.io/region"], "us-east-1");
        let spec = pv.spec.unwrap();
        assert!(spec.csi.is_none());
        let ebs = spec.aws_elastic_block_store.unwrap();
        assert_eq!(ebs.volume_id, "vol-0abc");
        assert_eq!(ebs.fs_type.as_deref(), Some("ext4"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("gp2"));
        let terms = spec
            .node_affinity
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms;
        let keys: Vec<&str> = terms[0]
            .match_expressions
            .iter()
            .flatten()
            .map(|r| r.key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "topology.kubernetes.io/zone",
                "topology.kubernetes.io/region"
            ]
        );
        let mut not_csi = json!({"metadata": {"name": "pvc-u1"}, "spec": {}});
        not_csi["spec"]["csi"] = Value::Null;
        assert!(matches!(
            in_tree_volume(not_csi, Plugin::AwsEbs),
            Err(InTreeError::Translation(MigrationError::NotCsi))
        ));
    }
}

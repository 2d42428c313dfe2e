//! CSI migration of the in-tree volume plugins (k8s.io/csi-translation-lib, as the sidecars
//! vendor it for Kubernetes 1.36): which CSI driver replaces which in-tree plugin, and the
//! translations the sidecars serving such a driver make.
//!
//! - a StorageClass naming the in-tree plugin → the parameters and allowed topologies
//!   CreateVolume gets ([`Plugin::storage_class_to_csi`]);
//! - the CSI PV of a volume created so → the in-tree PV the provisioner writes
//!   ([`Plugin::csi_to_in_tree`]);
//! - an in-tree PV → the CSI PV the attacher, the provisioner's deletion and the resizer work
//!   with ([`in_tree_to_csi`]).
//!
//! Pure: plain k8s-openapi objects in, objects or a [`MigrationError`] out. The volume handles,
//! attribute keys and topology keys are upstream's, so a volume crosses between an upstream
//! sidecar and ours either way.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    PersistentVolumeSpec, PortworxVolumeSource, SecretReference, TopologySelectorLabelRequirement,
    TopologySelectorTerm, VolumeNodeAffinity, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

/// The annotation the PV controller puts on claims and PVs of a migrated in-tree plugin: the
/// CSI driver that now serves them.
pub const MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

const FS_TYPE: &str = "fstype";
const CSI_FS_TYPE: &str = "csi.storage.k8s.io/fstype";
const ZONE: &str = "zone";
const ZONES: &str = "zones";
const PARTITION: &str = "partition";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
/// Joins the zones of a multi-zone volume in its zone label.
const MULTI_ZONE_DELIMITER: &str = "__";
const GCE_UNSPECIFIED: &str = "UNSPECIFIED";
const AZURE_MANAGED: &str = "Managed";
const AZURE_FILE_RESOURCE_GROUP: &str = "kubernetes.io/azure-file-resource-group";
const PORTWORX_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const PORTWORX_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";
/// The secret kinds a Portworx class's auth secret stands for, as `csi.storage.k8s.io/` keys.
const PORTWORX_SECRET_KINDS: [&str; 6] = [
    "provisioner",
    "controller-publish",
    "node-publish",
    "node-stage",
    "controller-expand",
    "node-expand",
];
/// vSphere class parameters and the keys the vSphere CSI driver reads them under.
const VSPHERE_PARAMETERS: [(&str, &str); 10] = [
    ("storagepolicyname", "storagepolicyname"),
    ("datastore", "datastore-migrationparam"),
    ("diskformat", "diskformat-migrationparam"),
    (
        "hostfailurestotolerate",
        "hostfailurestotolerate-migrationparam",
    ),
    ("forceprovisioning", "forceprovisioning-migrationparam"),
    ("cachereservation", "cachereservation-migrationparam"),
    ("diskstripes", "diskstripes-migrationparam"),
    (
        "objectspacereservation",
        "objectspacereservation-migrationparam",
    ),
    ("iopslimit", "iopslimit-migrationparam"),
    (FS_TYPE, CSI_FS_TYPE),
];

/// An in-tree volume plugin csi-translation-lib translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plugin {
    AwsEbs,
    GcePd,
    AzureDisk,
    AzureFile,
    Cinder,
    VsphereVolume,
    PortworxVolume,
}

/// Why an object cannot be translated (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigrationError {
    #[error("cannot simultaneously set allowed topologies and zone/zones parameters")]
    ZonesAndAllowedTopologies,
    #[error("pv is nil or CSI source not defined on pv")]
    NotCsi,
    #[error("failed to convert partition {0} to integer")]
    Partition(String),
    #[error("failed to get id components.Got: {0}, wanted 6 components or more. ")]
    GceVolumeId(usize),
    #[error("could not get disk name from {0}")]
    AzureDiskUri(String),
    #[error("error parsing volume id: {0:?}, should at least contain two #")]
    AzureFileVolumeId(String),
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileNamespace,
    #[error("Invalid format for AWS volume ({0})")]
    AwsVolumeId(String),
    #[error("failed to translate topology: {0}")]
    Topology(String),
}

impl Plugin {
    pub const ALL: [Plugin; 7] = [
        Plugin::AwsEbs,
        Plugin::GcePd,
        Plugin::AzureDisk,
        Plugin::AzureFile,
        Plugin::Cinder,
        Plugin::VsphereVolume,
        Plugin::PortworxVolume,
    ];

    /// The in-tree plugin's name: StorageClass `provisioner`, PV `provisioned-by`.
    pub fn in_tree_name(self) -> &'static str {
        match self {
            Plugin::AwsEbs => "kubernetes.io/aws-ebs",
            Plugin::GcePd => "kubernetes.io/gce-pd",
            Plugin::AzureDisk => "kubernetes.io/azure-disk",
            Plugin::AzureFile => "kubernetes.io/azure-file",
            Plugin::Cinder => "kubernetes.io/cinder",
            Plugin::VsphereVolume => "kubernetes.io/vsphere-volume",
            Plugin::PortworxVolume => "kubernetes.io/portworx-volume",
        }
    }

    /// The CSI driver the plugin migrated to.
    pub fn csi_driver(self) -> &'static str {
        match self {
            Plugin::AwsEbs => "ebs.csi.aws.com",
            Plugin::GcePd => "pd.csi.storage.gke.io",
            Plugin::AzureDisk => "disk.csi.azure.com",
            Plugin::AzureFile => "file.csi.azure.com",
            Plugin::Cinder => "cinder.csi.openstack.org",
            Plugin::VsphereVolume => "csi.vsphere.vmware.com",
            Plugin::PortworxVolume => "pxd.portworx.com",
        }
    }

    /// The zone topology key of the CSI driver (none for the file and Portworx drivers).
    fn zone_key(self) -> Option<&'static str> {
        match self {
            Plugin::AwsEbs => Some("topology.ebs.csi.aws.com/zone"),
            Plugin::GcePd => Some("topology.gke.io/zone"),
            Plugin::AzureDisk => Some("topology.disk.csi.azure.com/zone"),
            Plugin::Cinder => Some("topology.cinder.csi.openstack.org/zone"),
            Plugin::VsphereVolume => Some("topology.csi.vmware.com/zone"),
            Plugin::AzureFile | Plugin::PortworxVolume => None,
        }
    }

    /// The plugin whose volumes the CSI driver `driver` serves.
    pub fn for_driver(driver: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.csi_driver() == driver)
    }

    /// The plugin named `name` (a StorageClass's `provisioner`).
    pub fn for_in_tree_name(name: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.in_tree_name() == name)
    }

    /// The plugin of a PV's in-tree source, if it has one that migrates.
    pub fn of_spec(spec: &PersistentVolumeSpec) -> Option<Plugin> {
        if spec.aws_elastic_block_store.is_some() {
            Some(Plugin::AwsEbs)
        } else if spec.gce_persistent_disk.is_some() {
            Some(Plugin::GcePd)
        } else if spec.azure_disk.is_some() {
            Some(Plugin::AzureDisk)
        } else if spec.azure_file.is_some() {
            Some(Plugin::AzureFile)
        } else if spec.cinder.is_some() {
            Some(Plugin::Cinder)
        } else if spec.vsphere_volume.is_some() {
            Some(Plugin::VsphereVolume)
        } else if spec.portworx_volume.is_some() {
            Some(Plugin::PortworxVolume)
        } else {
            None
        }
    }

    /// The StorageClass CreateVolume is built from: its parameters translated (`fstype` →
    /// `csi.storage.k8s.io/fstype`, `zone`/`zones` → allowed topologies of the driver's zone
    /// key, ...), its allowed topologies re-keyed. Everything else stays, `provisioner` too (it
    /// is what the PV's `provisioned-by` names). Parameter names match case-insensitively.
    pub fn storage_class_to_csi(
        self,
        class: &StorageClass,
    ) -> Result<StorageClass, MigrationError> {
        let mut translated = class.clone();
        let parameters: BTreeMap<String, String> = class.parameters.clone().unwrap_or_default();
        let mut out = BTreeMap::new();
        let mut zones: Option<Vec<String>> = None;
        for (key, value) in parameters {
            let lower = key.to_lowercase();
            match (self, lower.as_str()) {
                (Plugin::AzureFile, _) => {
                    out.insert(key, value);
                }
                (Plugin::VsphereVolume, name) => {
                    // Parameters the vSphere CSI driver does not know are dropped, as upstream.
                    if let Some((_, csi_key)) = VSPHERE_PARAMETERS.iter().find(|(k, _)| *k == name)
                    {
                        out.insert(csi_key.to_string(), value);
                    }
                }
                (Plugin::PortworxVolume, PORTWORX_SECRET_NAME | PORTWORX_SECRET_NAMESPACE) => {
                    let field = if lower == PORTWORX_SECRET_NAME {
                        "secret-name"
                    } else {
                        "secret-namespace"
                    };
                    for kind in PORTWORX_SECRET_KINDS {
                        out.insert(format!("csi.storage.k8s.io/{kind}-{field}"), value.clone());
                    }
                }
                (Plugin::PortworxVolume, _) => {
                    out.insert(key, value);
                }
                (Plugin::AwsEbs | Plugin::GcePd | Plugin::Cinder, FS_TYPE) => {
                    out.insert(CSI_FS_TYPE.to_string(), value);
                }
                (Plugin::AwsEbs | Plugin::GcePd | Plugin::AzureDisk, ZONE) => {
                    zones = Some(vec![value]);
                }
                (Plugin::AwsEbs | Plugin::GcePd | Plugin::AzureDisk, ZONES) => {
                    zones = Some(value.split(',').map(str::to_string).collect());
                }
                (Plugin::AwsEbs, "iopspergb") => {
                    out.insert(key, value);
                    out.insert("allowautoiopspergbincrease".to_string(), "true".to_string());
                }
                _ => {
                    out.insert(key, value);
                }
            }
        }
        if self == Plugin::VsphereVolume {
            out.insert("csimigration".to_string(), "true".to_string());
        }
        let allowed = class.allowed_topologies.clone().unwrap_or_default();
        if let (Some(zones), Some(key)) = (zones, self.zone_key()) {
            if !allowed.is_empty() {
                return Err(MigrationError::ZonesAndAllowedTopologies);
            }
            translated.allowed_topologies = Some(vec![TopologySelectorTerm {
                match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                    key: key.to_string(),
                    values: zones,
                }]),
            }]);
        } else if let (false, Some(key)) = (allowed.is_empty(), self.zone_key()) {
            translated.allowed_topologies = Some(rekey_allowed_topologies(allowed, key));
        }
        if self == Plugin::AzureDisk {
            // A zone value of only digits is the driver's "no zone" (an unzoned region).
            for term in translated.allowed_topologies.iter_mut().flatten() {
                for requirement in term.match_label_expressions.iter_mut().flatten() {
                    if Some(requirement.key.as_str()) == self.zone_key() {
                        for value in &mut requirement.values {
                            if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                                value.clear();
                            }
                        }
                    }
                }
            }
        }
        // Portworx leaves a class without parameters as it was.
        if self != Plugin::PortworxVolume || !out.is_empty() {
            translated.parameters = Some(out);
        }
        Ok(translated)
    }

    /// The in-tree PV the provisioner writes for a volume it created through CSI: the CSI
    /// source replaced by the plugin's, the driver's zone topology by the Kubernetes zone (and
    /// region) labels and node affinity.
    pub fn csi_to_in_tree(self, pv: &mut PersistentVolume) -> Result<(), MigrationError> {
        let spec = pv.spec.get_or_insert_with(Default::default);
        let csi = spec.csi.take().ok_or(MigrationError::NotCsi)?;
        let attributes = csi.volume_attributes.clone().unwrap_or_default();
        let fs_type = csi.fs_type.clone().filter(|f| !f.is_empty());
        let read_only = csi.read_only.filter(|r| *r);
        match self {
            Plugin::AwsEbs => {
                spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: csi.volume_handle,
                    fs_type,
                    read_only,
                    partition: partition(&attributes)?,
                });
            }
            Plugin::GcePd => {
                let parts: Vec<&str> = csi.volume_handle.split('/').collect();
                if parts.len() < 6 {
                    return Err(MigrationError::GceVolumeId(parts.len()));
                }
                spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: parts[5].to_string(),
                    fs_type,
                    read_only,
                    partition: partition(&attributes)?,
                });
            }
            Plugin::AzureDisk => {
                let mut source = AzureDiskVolumeSource {
                    disk_name: azure_disk_name(&csi.volume_handle)?,
                    disk_uri: csi.volume_handle.clone(),
                    fs_type: Some(csi.fs_type.clone().unwrap_or_default()),
                    read_only: Some(csi.read_only.unwrap_or(false)),
                    kind: Some(AZURE_MANAGED.to_string()),
                    caching_mode: None,
                };
                for (key, value) in &attributes {
                    match key.to_lowercase().as_str() {
                        "cachingmode" if !value.is_empty() => {
                            source.caching_mode = Some(value.clone())
                        }
                        FS_TYPE if !value.is_empty() => source.fs_type = Some(value.clone()),
                        _ => {}
                    }
                }
                spec.azure_disk = Some(source);
            }
            Plugin::AzureFile => {
                let mut source = AzureFilePersistentVolumeSource {
                    read_only,
                    ..Default::default()
                };
                for (key, value) in &attributes {
                    match key.to_lowercase().as_str() {
                        "sharename" => source.share_name = value.clone(),
                        "secretname" => source.secret_name = value.clone(),
                        "secretnamespace" => source.secret_namespace = Some(value.clone()),
                        _ => {}
                    }
                }
                if let Some(secret) = csi
                    .node_stage_secret_ref
                    .as_ref()
                    .filter(|s| s.name.as_deref().is_some_and(|n| !n.is_empty()))
                {
                    source.secret_name = secret.name.clone().unwrap_or_default();
                    source.secret_namespace = Some(secret.namespace.clone().unwrap_or_default());
                }
                let mut resource_group = String::new();
                if source.share_name.is_empty() || source.secret_name.is_empty() {
                    let parts: Vec<&str> = csi.volume_handle.split('#').collect();
                    if parts.len() < 3 {
                        return Err(MigrationError::AzureFileVolumeId(csi.volume_handle));
                    }
                    if source.share_name.is_empty() {
                        source.share_name = parts[2].to_string();
                    }
                    if source.secret_name.is_empty() {
                        source.secret_name = format!("azure-storage-account-{}-secret", parts[1]);
                    }
                    resource_group = parts[0].to_string();
                }
                source
                    .secret_namespace
                    .get_or_insert_with(|| "default".to_string());
                spec.azure_file = Some(source);
                if !resource_group.is_empty() {
                    pv.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .insert(AZURE_FILE_RESOURCE_GROUP.to_string(), resource_group);
                }
            }
            Plugin::Cinder => {
                spec.cinder = Some(CinderPersistentVolumeSource {
                    volume_id: csi.volume_handle,
                    fs_type,
                    read_only,
                    secret_ref: None,
                });
            }
            Plugin::VsphereVolume => {
                spec.vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
                    volume_path: attributes
                        .get("initialvolumefilepath")
                        .cloned()
                        .unwrap_or_default(),
                    fs_type,
                    ..Default::default()
                });
            }
            Plugin::PortworxVolume => {
                spec.portworx_volume = Some(PortworxVolumeSource {
                    volume_id: csi.volume_handle,
                    fs_type,
                    read_only,
                });
            }
        }
        match self {
            Plugin::AwsEbs => topology_to_in_tree(pv, self, Some(aws_region)),
            Plugin::GcePd => topology_to_in_tree(pv, self, Some(gce_region)),
            Plugin::Cinder => topology_to_in_tree(pv, self, None),
            Plugin::VsphereVolume => {
                vsphere_topology_to_in_tree(pv);
                Ok(())
            }
            Plugin::AzureDisk | Plugin::AzureFile | Plugin::PortworxVolume => Ok(()),
        }
    }
}

/// The CSI PV of an in-tree PV whose plugin migrates (`Ok(None)`: none does, the PV is left
/// to whoever serves it): the in-tree source replaced by the CSI driver's, the zone labels and
/// node affinity by the driver's topology keys. What the attacher attaches and the
/// provisioner deletes.
pub fn in_tree_to_csi(pv: &PersistentVolume) -> Result<Option<PersistentVolume>, MigrationError> {
    let Some(plugin) = pv.spec.as_ref().and_then(Plugin::of_spec) else {
        return Ok(None);
    };
    let mut pv = pv.clone();
    let name = pv.metadata.name.clone().unwrap_or_default();
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let spec = pv.spec.as_mut().expect("an in-tree source has a spec");
    let claim_namespace = spec.claim_ref.as_ref().and_then(|c| c.namespace.clone());
    let mut csi = CSIPersistentVolumeSource {
        driver: plugin.csi_driver().to_string(),
        volume_attributes: Some(BTreeMap::new()),
        ..Default::default()
    };
    let mut attributes = BTreeMap::new();
    match plugin {
        Plugin::AwsEbs => {
            let source = spec
                .aws_elastic_block_store
                .take()
                .expect("the plugin's source");
            csi.volume_handle = ebs_volume_id(&source.volume_id)?;
            csi.read_only = source.read_only.filter(|r| *r);
            csi.fs_type = source.fs_type.filter(|f| !f.is_empty());
            attributes.insert(
                PARTITION.to_string(),
                source.partition.unwrap_or(0).to_string(),
            );
        }
        Plugin::GcePd => {
            let source = spec
                .gce_persistent_disk
                .take()
                .expect("the plugin's source");
            let zones_label = labels
                .get(BETA_ZONE_LABEL)
                .filter(|z| !z.is_empty())
                .or_else(|| labels.get(ZONE_LABEL))
                .cloned()
                .unwrap_or_default();
            let zones: Vec<String> = zones_label
                .split(MULTI_ZONE_DELIMITER)
                .map(str::to_string)
                .collect();
            csi.volume_handle = if zones.len() > 1 {
                let region = gce_region(&zones).map_err(MigrationError::Topology)?;
                format!(
                    "projects/{GCE_UNSPECIFIED}/regions/{region}/disks/{}",
                    source.pd_name
                )
            } else {
                let zone = Some(zones_label.as_str())
                    .filter(|z| !z.is_empty())
                    .unwrap_or(GCE_UNSPECIFIED);
                format!(
                    "projects/{GCE_UNSPECIFIED}/zones/{zone}/disks/{}",
                    source.pd_name
                )
            };
            csi.read_only = source.read_only.filter(|r| *r);
            csi.fs_type = source.fs_type.filter(|f| !f.is_empty());
            let partition = source
                .partition
                .filter(|p| *p != 0)
                .map(|p| p.to_string())
                .unwrap_or_default();
            attributes.insert(PARTITION.to_string(), partition);
            spec.access_modes = spec.access_modes.take().map(gce_access_modes);
        }
        Plugin::AzureDisk => {
            let source = spec.azure_disk.take().expect("the plugin's source");
            if let Some(kind) = source
                .kind
                .as_ref()
                .filter(|k| !k.eq_ignore_ascii_case(AZURE_MANAGED))
            {
                return Err(MigrationError::AzureDiskKind(kind.clone()));
            }
            csi.volume_handle = source.disk_uri;
            if let Some(mode) = source.caching_mode {
                attributes.insert("cachingmode".to_string(), mode);
            }
            if let Some(fs_type) = source.fs_type {
                csi.fs_type = Some(fs_type.clone()).filter(|f| !f.is_empty());
                attributes.insert(FS_TYPE.to_string(), fs_type);
            }
            attributes.insert("kind".to_string(), AZURE_MANAGED.to_string());
            csi.read_only = source.read_only.filter(|r| *r);
        }
        Plugin::AzureFile => {
            let source = spec.azure_file.take().expect("the plugin's source");
            let account = azure_file_account(&source.secret_name);
            let resource_group = annotations
                .get(AZURE_FILE_RESOURCE_GROUP)
                .cloned()
                .unwrap_or_default();
            let namespace = source
                .secret_namespace
                .clone()
                .or(claim_namespace)
                .filter(|n| !n.is_empty())
                .ok_or(MigrationError::AzureFileNamespace)?;
            csi.volume_handle = format!(
                "{resource_group}#{account}#{}#{name}#{namespace}",
                source.share_name
            );
            csi.node_stage_secret_ref = Some(SecretReference {
                name: Some(source.secret_name.clone()),
                namespace: Some(namespace),
            });
            csi.read_only = source.read_only.filter(|r| *r);
            attributes.insert("sharename".to_string(), source.share_name);
        }
        Plugin::Cinder => {
            let source = spec.cinder.take().expect("the plugin's source");
            csi.volume_handle = source.volume_id;
            csi.read_only = source.read_only.filter(|r| *r);
            csi.fs_type = source.fs_type.filter(|f| !f.is_empty());
        }
        Plugin::VsphereVolume => {
            let source = spec.vsphere_volume.take().expect("the plugin's source");
            csi.volume_handle = source.volume_path;
            csi.fs_type = source.fs_type.filter(|f| !f.is_empty());
            if let Some(policy) = source.storage_policy_name.filter(|p| !p.is_empty()) {
                attributes.insert("storagepolicyname".to_string(), policy);
            }
        }
        Plugin::PortworxVolume => {
            let source = spec.portworx_volume.take().expect("the plugin's source");
            csi.volume_handle = source.volume_id;
            csi.fs_type = source.fs_type.filter(|f| !f.is_empty());
            if let (Some(name), Some(namespace)) = (
                annotations.get(PORTWORX_SECRET_NAME),
                annotations.get(PORTWORX_SECRET_NAMESPACE),
            ) {
                let secret = Some(SecretReference {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                });
                csi.controller_publish_secret_ref = secret.clone();
                csi.node_stage_secret_ref = secret.clone();
                csi.node_publish_secret_ref = secret.clone();
                csi.controller_expand_secret_ref = secret.clone();
                csi.node_expand_secret_ref = secret;
            }
        }
    }
    csi.volume_attributes = Some(attributes);
    spec.csi = Some(csi);
    match plugin {
        Plugin::VsphereVolume => vsphere_topology_to_csi(&mut pv),
        Plugin::AwsEbs | Plugin::GcePd | Plugin::Cinder => topology_to_csi(&mut pv, plugin),
        Plugin::AzureDisk | Plugin::AzureFile | Plugin::PortworxVolume => {}
    }
    Ok(Some(pv))
}

fn partition(attributes: &BTreeMap<String, String>) -> Result<Option<i32>, MigrationError> {
    match attributes.get(PARTITION).filter(|p| !p.is_empty()) {
        None => Ok(None),
        Some(value) => value
            .parse::<i32>()
            .map(|p| Some(p).filter(|p| *p != 0))
            .map_err(|_| MigrationError::Partition(value.clone())),
    }
}

/// `aws://<zone>/vol-…` (the in-tree plugin's form) → `vol-…`; anything else as it is.
fn ebs_volume_id(id: &str) -> Result<String, MigrationError> {
    let Some(rest) = id.strip_prefix("aws://") else {
        return Ok(id.to_string());
    };
    let path = rest.split_once('/').map(|(_, path)| path).unwrap_or("");
    let volume = path.trim_matches('/');
    if volume.starts_with("vol-") && !volume.contains('/') {
        Ok(volume.to_string())
    } else {
        Err(MigrationError::AwsVolumeId(id.to_string()))
    }
}

/// The storage account a secret named `azure-storage-account-<account>-secret` is for; any
/// other secret name stands for itself.
fn azure_file_account(secret: &str) -> String {
    const PREFIX: &str = "azure-storage-account-";
    secret
        .find(PREFIX)
        .map(|at| &secret[at + PREFIX.len()..])
        .and_then(|rest| rest.rfind("-secret").map(|end| &rest[..end]))
        .filter(|account| !account.is_empty())
        .unwrap_or(secret)
        .to_string()
}

/// The disk name at the end of a managed disk's resource ID or an unmanaged disk's blob URI.
fn azure_disk_name(uri: &str) -> Result<String, MigrationError> {
    let unmanaged = uri.len() > 4 && uri[..4].eq_ignore_ascii_case("http");
    let marker = if unmanaged {
        "/vhds/"
    } else {
        "/providers/Microsoft.Compute/disks/"
    };
    let valid = if unmanaged {
        uri.contains("://")
    } else {
        uri.contains("/subscriptions/") && uri.contains("/resourceGroups/")
    };
    match uri.rfind(marker).map(|at| &uri[at + marker.len()..]) {
        Some(name) if valid && !name.is_empty() => Ok(name.to_string()),
        _ => Err(MigrationError::AzureDiskUri(uri.to_string())),
    }
}

/// In-tree GCE PD access modes as the PD driver takes them: ReadWriteMany was never a
/// multi-writer PD, and a read-write disk attached read-only elsewhere is ReadWriteOnce.
fn gce_access_modes(modes: Vec<String>) -> Vec<String> {
    let modes: BTreeSet<&str> = modes
        .iter()
        .map(|m| {
            if m == "ReadWriteMany" {
                "ReadWriteOnce"
            } else {
                m.as_str()
            }
        })
        .collect();
    let mode = if modes.contains("ReadOnlyMany") && !modes.contains("ReadWriteOnce") {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    vec![mode.to_string()]
}

/// The AWS region of zones (`us-east-1a` → `us-east-1`; local and wavelength zones too).
fn aws_region(zones: &[String]) -> Result<String, String> {
    one_region(zones, |zone| {
        let mut parts: Vec<&str> = zone.split('-').collect();
        let last = parts.last().copied().unwrap_or("");
        if matches!(parts.len(), 3 | 4) && last.len() == 2 {
            let trimmed = &last[..1];
            let end = parts.len() - 1;
            parts[end] = trimmed;
            Ok(parts.join("-"))
        } else if matches!(parts.len(), 5 | 7) {
            Ok(parts[..3].join("-"))
        } else {
            Err(format!(
                "Unexpected zone format: {zone} is not a valid AWS zone"
            ))
        }
    })
}

/// The GCE region of zones (`us-central1-a` → `us-central1`).
fn gce_region(zones: &[String]) -> Result<String, String> {
    one_region(zones, |zone| {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() == 3 {
            Ok(parts[..2].join("-"))
        } else {
            Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ))
        }
    })
}

fn one_region(
    zones: &[String],
    region: impl Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_string());
    }
    let regions = zones
        .iter()
        .map(|z| region(z))
        .collect::<Result<BTreeSet<String>, String>>()?;
    match regions.len() {
        1 => Ok(regions.into_iter().next().expect("one region")),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {regions:?}"
        )),
    }
}

/// `topology.kubernetes.io/zone` or `failure-domain.beta.kubernetes.io/zone` in allowed
/// topologies → the driver's zone key; other keys stay.
fn rekey_allowed_topologies(
    terms: Vec<TopologySelectorTerm>,
    key: &str,
) -> Vec<TopologySelectorTerm> {
    terms
        .into_iter()
        .map(|term| TopologySelectorTerm {
            match_label_expressions: term.match_label_expressions.map(|expressions| {
                expressions
                    .into_iter()
                    .map(|mut e| {
                        if e.key == BETA_ZONE_LABEL || e.key == ZONE_LABEL {
                            e.key = key.to_string();
                        }
                        e
                    })
                    .collect()
            }),
        })
        .collect()
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    pv.spec
        .as_mut()?
        .node_affinity
        .as_mut()?
        .required
        .as_mut()
        .map(|r| &mut r.node_selector_terms)
}

fn requirements(pv: &PersistentVolume) -> impl Iterator<Item = &NodeSelectorRequirement> {
    pv.spec
        .iter()
        .filter_map(|s| s.node_affinity.as_ref())
        .filter_map(|a| a.required.as_ref())
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
}

fn has_key(pv: &PersistentVolume, key: &str) -> bool {
    requirements(pv).any(|r| r.key == key)
}

/// The values of `key` over all terms, sorted, without repeats.
fn values_of(pv: &PersistentVolume, key: &str) -> Vec<String> {
    requirements(pv)
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten().cloned())
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect()
}

fn replace_key(pv: &mut PersistentVolume, old: &str, new: &str) {
    for term in terms_mut(pv).into_iter().flatten() {
        for requirement in term.match_expressions.iter_mut().flatten() {
            if requirement.key == old {
                requirement.key = new.to_string();
            }
        }
    }
}

/// Adds `key In zones` to every term (one term if there are none).
fn add_requirement(pv: &mut PersistentVolume, key: &str, zones: &[String]) {
    let zones: Vec<String> = zones
        .iter()
        .map(|z| z.trim().to_string())
        .filter(|z| !z.is_empty())
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    if zones.is_empty() {
        return;
    }
    let spec = pv.spec.get_or_insert_with(Default::default);
    let required = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default)
        .required
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(NodeSelectorRequirement {
                key: key.to_string(),
                operator: "In".to_string(),
                values: Some(zones.clone()),
            });
    }
}

/// The zone and region labels a PV's topology uses: GA unless its affinity or labels use the
/// beta ones.
fn zone_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    if has_key(pv, ZONE_LABEL) {
        (ZONE_LABEL, REGION_LABEL)
    } else if has_key(pv, BETA_ZONE_LABEL) {
        (BETA_ZONE_LABEL, BETA_REGION_LABEL)
    } else if labels.contains_key(ZONE_LABEL) {
        (ZONE_LABEL, REGION_LABEL)
    } else if labels.contains_key(BETA_ZONE_LABEL) {
        (BETA_ZONE_LABEL, BETA_REGION_LABEL)
    } else {
        (ZONE_LABEL, REGION_LABEL)
    }
}

fn set_label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata
        .labels
        .get_or_insert_with(Default::default)
        .entry(key.to_string())
        .or_insert(value);
}

fn topology_to_csi(pv: &mut PersistentVolume, plugin: Plugin) {
    let key = plugin.zone_key().expect("a zoned plugin");
    let (zone_label, region_label) = zone_labels(pv);
    if !values_of(pv, zone_label).is_empty() {
        replace_key(pv, zone_label, key);
    } else if let Some(label) = pv
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(zone_label))
        .cloned()
    {
        let zones: Vec<String> = label
            .split(MULTI_ZONE_DELIMITER)
            .map(str::to_string)
            .collect();
        add_requirement(pv, key, &zones);
    }
    if region_label == BETA_REGION_LABEL && !values_of(pv, region_label).is_empty() {
        replace_key(pv, region_label, REGION_LABEL);
    }
}

/// Derives the one region of a volume's zones (an error names what is wrong).
type RegionOf = fn(&[String]) -> Result<String, String>;

fn topology_to_in_tree(
    pv: &mut PersistentVolume,
    plugin: Plugin,
    region_of: Option<RegionOf>,
) -> Result<(), MigrationError> {
    let key = plugin.zone_key().expect("a zoned plugin");
    let (zone_label, region_label) = zone_labels(pv);
    replace_key(pv, key, zone_label);
    if let Some(region_of) = region_of {
        let mut regions = Vec::new();
        for term in terms_mut(pv).into_iter().flatten() {
            let expressions = term.match_expressions.get_or_insert_with(Vec::new);
            if expressions.iter().any(|r| r.key == region_label) {
                continue;
            }
            let zones: Vec<String> = expressions
                .iter()
                .filter(|r| r.key == zone_label)
                .flat_map(|r| r.values.iter().flatten().cloned())
                .collect();
            let region = region_of(&zones).map_err(MigrationError::Topology)?;
            regions.push(region.clone());
            expressions.push(NodeSelectorRequirement {
                key: region_label.to_string(),
                operator: "In".to_string(),
                values: Some(vec![region]),
            });
        }
        let all = values_of(pv, region_label);
        if let [region] = all.as_slice() {
            set_label_if_absent(pv, region_label, region.clone());
        }
    }
    let zones = values_of(pv, zone_label);
    if !zones.is_empty() {
        set_label_if_absent(pv, zone_label, zones.join(MULTI_ZONE_DELIMITER));
    }
    Ok(())
}

const VSPHERE_REGION_KEY: &str = "topology.csi.vmware.com/region";

fn vsphere_topology_to_csi(pv: &mut PersistentVolume) {
    let zone_key = Plugin::VsphereVolume.zone_key().expect("vSphere has zones");
    let (zone_label, region_label) = zone_labels(pv);
    for (label, key) in [(zone_label, zone_key), (region_label, VSPHERE_REGION_KEY)] {
        if !values_of(pv, label).is_empty() {
            replace_key(pv, label, key);
        } else if let Some(value) = pv
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(label))
            .filter(|v| !v.is_empty())
            .cloned()
        {
            add_requirement(pv, key, &[value]);
        }
    }
}

fn vsphere_topology_to_in_tree(pv: &mut PersistentVolume) {
    let zone_key = Plugin::VsphereVolume.zone_key().expect("vSphere has zones");
    let (zone_label, region_label) = zone_labels(pv);
    for (label, key) in [(zone_label, zone_key), (region_label, VSPHERE_REGION_KEY)] {
        replace_key(pv, key, label);
        if let Some(first) = values_of(pv, label).into_iter().next() {
            set_label_if_absent(pv, label, first);
        }
    }
}

#[cfg(test)]
mod tests;

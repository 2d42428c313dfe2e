//! What one provisioning does, decided from the claim, its class, the driver and the caches
//! before any API request or CSI call (external-provisioner `prepareProvision`): the checks in
//! upstream's order, then everything the CreateVolume request holds except what only I/O
//! brings (the provisioner secret and a snapshot's handle). The controller carries out a
//! [`ProvisionPlan`] step by step.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_grpc::conn::DriverInfo;
use csi_kinds::secrets::{self, SecretRefs, SecretsError, TemplateInputs};
use csi_proto::csi::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use crate::claims::{self, ClaimError, DataSource};
use crate::grants::{self, NotGranted, ReferenceGrant};
use crate::request::{self, RequestError};
use crate::topology::{self, PinnedTopology, TopologyError};
use crate::vac::{self, VacError};
use csi_kinds::vac::VolumeAttributesClass;

/// The flags and driver facts a plan depends on.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    pub driver: &'a DriverInfo,
    /// `--default-fstype`.
    pub default_fstype: &'a str,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// The Topology gate.
    pub topology: bool,
    /// `--strict-topology`.
    pub strict_topology: bool,
    /// `--immediate-topology`.
    pub immediate_topology: bool,
    /// The CrossNamespaceVolumeDataSource gate.
    pub cross_namespace_data_sources: bool,
    /// VolumeAttributesClasses, after discovery.
    pub volume_attributes_classes: csi_kinds::vac::Support,
}

impl Policy<'_> {
    /// Whether requests carry topology: the gate and the driver's capability.
    pub fn topology_supported(&self) -> bool {
        self.topology && self.driver.plugin.volume_accessibility_constraints
    }
}

/// What a plan reads from the caches, asked only when a check needs it (the topology of
/// nodes, for one, is gathered once per claim and pinned there, so retries send the same
/// request).
pub trait Lookups {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    /// The ReferenceGrants; `None` without the CrossNamespaceVolumeDataSource gate.
    fn reference_grants(&self) -> Option<Vec<Arc<ReferenceGrant>>>;
    /// The VolumeAttributesClass `name` (`Ok(None)`: there is none); an error when the cache
    /// cannot say.
    fn attributes_class(&self, name: &str) -> Result<Option<Arc<VolumeAttributesClass>>, VacError>;
    /// The topology inputs of the claim with `uid`, pinned at its first attempt.
    fn node_topology(&self, uid: &str, selected_node: Option<&str>) -> PinnedTopology;
}

/// One claim to provision.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub claim: &'a PersistentVolumeClaim,
    pub class: &'a StorageClass,
    /// The volume name: CreateVolume's idempotency key and the PV's name.
    pub name: &'a str,
    pub selected_node: Option<&'a str>,
    /// Used instead of the claim-name hash in topology when the name is empty.
    pub fallback_hash: u32,
}

/// Why a claim is not provisioned; the message of its `ProvisioningFailed` Event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    NotGranted(#[from] NotGranted),
    #[error(
        "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"
    )]
    NoControllerService,
    #[error(
        "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"
    )]
    NoProvisioning,
    #[error(
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    )]
    NoSnapshots,
    #[error(
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    )]
    NoCloning,
    /// Upstream wraps every error of reading a data source so.
    #[error(
        "error getting handle for DataSource Type PersistentVolumeClaim by Name {name}: {cause}"
    )]
    CloneSource { name: String, cause: ClaimError },
    #[error(transparent)]
    AttributesClass(#[from] VacError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Parameters(#[from] SecretsError),
    /// A class of the in-tree plugin the driver migrated from that cannot be translated.
    #[error("failed to translate storage class: {0}")]
    Migration(#[from] csi_kinds::migration::MigrationError),
    /// Upstream wraps every GenerateAccessibilityRequirements error so.
    #[error("error generating accessibility requirements: {0}")]
    Topology(#[from] TopologyError),
}

/// What to do with a claim that is ours to provision.
#[derive(Debug, Clone)]
pub enum Decision {
    Provision(Box<ProvisionPlan>),
    /// Another data source kind: an external populator provisions the volume.
    Populator {
        kind: String,
    },
    /// The selected node has no CSINode: the scheduler should choose again.
    Reschedule {
        node: String,
    },
}

/// Where the volume's data comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PlannedSource {
    Empty,
    /// A restore: the snapshot and its content are read live when the plan is carried out
    /// (no cache holds snapshots).
    Snapshot {
        name: String,
        namespace: String,
    },
    /// A clone: the source claim (protected while the driver copies) and its volume's handle.
    Clone {
        source: Arc<PersistentVolumeClaim>,
        volume_handle: String,
    },
}

/// A provisioning decided: the CreateVolume request but its secrets and content source, and
/// what the PV is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvisionPlan {
    pub name: String,
    pub requested_bytes: i64,
    pub fs_type: String,
    pub source: PlannedSource,
    pub secret_refs: SecretRefs,
    pub attributes_class: Option<String>,
    /// Whether the request carries topology (and the PV gets node affinity).
    pub topology_supported: bool,
    pub capabilities: Vec<csi::VolumeCapability>,
    pub parameters: BTreeMap<String, String>,
    pub mutable_parameters: BTreeMap<String, String>,
    pub accessibility: Option<csi::TopologyRequirement>,
}

/// Checks the claim as upstream does, in its order, and plans its provisioning.
pub fn plan(
    claim: &Claim<'_>,
    policy: &Policy<'_>,
    lookups: &impl Lookups,
) -> Result<Decision, Refusal> {
    let Claim {
        claim: pvc, class, ..
    } = *claim;
    let driver = policy.driver;
    // Checked first: a request we cannot read must never reach the driver as 0 bytes (a
    // default-sized volume that no claim binds to).
    let requested_bytes = claims::requested_size(pvc)?;
    let data_source = claims::data_source(pvc, policy.cross_namespace_data_sources);
    if data_source.is_ok()
        && let Some(grants) = lookups.reference_grants()
    {
        grants::check(pvc, grants.iter().map(|g| &**g))?;
    }
    let data_source = data_source?;
    if let DataSource::Populator { kind, .. } = &data_source {
        return Ok(Decision::Populator { kind: kind.clone() });
    }
    // upstream's checkDriverCapabilities: the plugin's and controller's, then what the data
    // source and a VolumeAttributesClass need.
    if !driver.plugin.controller_service {
        return Err(Refusal::NoControllerService);
    }
    if !driver.has_controller(ControllerCapability::CreateDeleteVolume) {
        return Err(Refusal::NoProvisioning);
    }
    match &data_source {
        DataSource::Snapshot { .. }
            if !driver.has_controller(ControllerCapability::CreateDeleteSnapshot) =>
        {
            return Err(Refusal::NoSnapshots);
        }
        DataSource::Claim { .. } if !driver.has_controller(ControllerCapability::CloneVolume) => {
            return Err(Refusal::NoCloning);
        }
        _ => {}
    }
    let spec = pvc.spec.clone().unwrap_or_default();
    let attributes_class = vac::class_name(pvc, policy.volume_attributes_classes);
    if attributes_class.is_some() && !driver.has_controller(ControllerCapability::ModifyVolume) {
        return Err(VacError::NoModifyVolume.into());
    }
    if spec.selector.is_some() {
        return Err(ClaimError::Selector.into());
    }
    let class_parameters = class.parameters.clone().unwrap_or_default();
    let fs_type = request::fs_type(&class_parameters, policy.default_fstype)?;
    let capabilities = request::volume_capabilities(
        &spec.access_modes.unwrap_or_default(),
        spec.volume_mode.as_deref(),
        &fs_type,
        &class.mount_options.clone().unwrap_or_default(),
        driver.has_controller(ControllerCapability::SingleNodeMultiWriter),
    )?;
    let source = match data_source {
        DataSource::None | DataSource::Populator { .. } => PlannedSource::Empty,
        DataSource::Snapshot { name, namespace } => PlannedSource::Snapshot { name, namespace },
        DataSource::Claim { name, namespace } => {
            let (source, volume_handle) =
                clone_source(pvc, &name, &namespace, &driver.name, lookups)
                    .map_err(|cause| Refusal::CloneSource { name, cause })?;
            PlannedSource::Clone {
                source,
                volume_handle,
            }
        }
    };
    let topology_supported = policy.topology_supported();
    let accessibility = if topology_supported {
        match accessibility(claim, policy, lookups) {
            Err(TopologyError::Reschedule(node)) => return Ok(Decision::Reschedule { node }),
            requirement => requirement?,
        }
    } else {
        None
    };
    let claim_name = pvc.name_any();
    let namespace = pvc.namespace().unwrap_or_default();
    let secret_refs = SecretRefs::resolve(
        &class_parameters,
        &TemplateInputs {
            pv_name: claim.name,
            pvc_name: &claim_name,
            pvc_namespace: &namespace,
            pvc_annotations: pvc.annotations(),
        },
    )?;
    let mut parameters = secrets::remove_reserved_parameters(&class_parameters)?;
    let mutable_parameters = match &attributes_class {
        None => BTreeMap::new(),
        Some(name) => {
            let class = lookups.attributes_class(name)?;
            vac::mutable_parameters(name, class.as_deref(), &driver.name)?
        }
    };
    if policy.extra_create_metadata {
        request::add_extra_metadata(&mut parameters, &claim_name, &namespace, claim.name);
    }
    Ok(Decision::Provision(Box::new(ProvisionPlan {
        name: claim.name.to_string(),
        requested_bytes,
        fs_type,
        source,
        secret_refs,
        attributes_class,
        topology_supported,
        capabilities,
        parameters,
        mutable_parameters,
        accessibility,
    })))
}

/// The source claim (from the cache, as upstream's lister) and its volume's handle.
fn clone_source(
    target: &PersistentVolumeClaim,
    name: &str,
    namespace: &str,
    driver: &str,
    lookups: &impl Lookups,
) -> Result<(Arc<PersistentVolumeClaim>, String), ClaimError> {
    let Some(source) = lookups.claim(namespace, name) else {
        // The lister's NotFound, quoted as upstream does (with the target's namespace).
        return Err(ClaimError::CloneSource(format!(
            "error getting PVC {name} (namespace \"{}\") from api server: persistentvolumeclaim \"{name}\" not found",
            target.namespace().unwrap_or_default()
        )));
    };
    let source_volume = source
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .and_then(|v| lookups.volume(v));
    let handle = claims::clone_source(target, driver, &source, source_volume.as_deref())?;
    Ok((source, handle))
}

/// Requisite and preferred topology from the claim's pinned node topology.
fn accessibility(
    claim: &Claim<'_>,
    policy: &Policy<'_>,
    lookups: &impl Lookups,
) -> Result<Option<csi::TopologyRequirement>, TopologyError> {
    let pinned = lookups.node_topology(&claim.claim.uid().unwrap_or_default(), claim.selected_node);
    let allowed = claim.class.allowed_topologies.clone().unwrap_or_default();
    let inputs = topology::Inputs {
        selected_node: pinned.selected.as_ref(),
        immediate_keys: &pinned.immediate_keys,
        node_labels: &pinned.node_labels,
        allowed_topologies: &allowed,
        strict: policy.strict_topology,
        immediate_topology: policy.immediate_topology,
        claim_name: &claim.claim.name_any(),
        fallback_hash: claim.fallback_hash,
    };
    Ok(topology::requirements(&inputs)?.map(|r| r.to_csi()))
}

#[cfg(test)]
pub(crate) mod tests;

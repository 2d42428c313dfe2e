//! The next step of a claim's provisioning, decided from the claim and what the sync read of
//! the caches (its class, its PV, an infeasible wait) before any API request or CSI call, as
//! the attacher's `attach::plan` is for a VolumeAttachment.
//! The controller's claim sync is one `match` over a [`ClaimStep`].

use std::sync::Arc;
use std::time::Duration;

use csi_kinds::migration::Plugin;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use crate::claims::{self, ClaimDecision, ClaimError};
use crate::node_deployment::{NodeCheck, NodeDeployment};
use crate::protection::{self, PROVISIONING_PROTECTION};
use crate::provision::{self, Decision, Lookups, Policy, ProvisionPlan, Refusal};
use crate::request::RequestError;

/// What a claim's sync does next.
#[derive(Debug)]
pub enum ClaimStep {
    /// Nothing to do: not annotated for our driver, waiting for a node, another node's, or
    /// deleted before anything was created.
    Nothing,
    /// The cache does not show the PV we created (or deleted) yet.
    Wait,
    /// No volume name for the claim; `fatal` (`--volume-name-uuid-length` past the UID) stops
    /// the provisioner, as upstream's name slicing panics.
    NoVolumeName { error: RequestError, fatal: bool },
    /// The PV exists or the claim is bound: the pinned topology and the in-flight entry go,
    /// and the provisioning-protection finalizer with them when `release`.
    Finished { release: bool },
    /// The class is not cached (nor recorded): retried, without an Event, as upstream's
    /// getStorageClass failure.
    NoClass(ClaimError),
    /// The class names another provisioner: logged, the claim left alone.
    ForeignClass { provisioner: String },
    /// `--node-deployment` with an Immediate claim this node may serve: try to own it.
    BecomeOwner { class: Arc<StorageClass> },
    /// Refused as infeasible with this class: not tried again before `wait` has passed.
    Infeasible { wait: Duration },
    /// Another data source kind: an external populator provisions the volume.
    Populator { kind: String },
    /// The selected node has no CSINode: the scheduler should choose again.
    Reschedule { node: String },
    /// The claim cannot be provisioned as it is: a `ProvisioningFailed` Event.
    Refused(Refusal),
    /// CreateVolume, the PV and the release of the claim, by the plan.
    Provision(Box<Provisioning>),
}

/// A provisioning decided.
#[derive(Debug)]
pub struct Provisioning {
    pub plan: Box<ProvisionPlan>,
    /// The live class, or once protected, the one recorded when provisioning started.
    pub class: Arc<StorageClass>,
    pub selected_node: Option<String>,
    /// The in-tree plugin of the class under CSI migration: the PV is written as its volume.
    pub migration: Option<Plugin>,
}

/// Whether the claim's volume is in the PV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Volume {
    Absent,
    Cached,
    /// The cache does not show our create (or delete) of it yet.
    Lags,
}

/// What the sync read for the claim.
#[derive(Debug)]
pub struct Observed {
    /// The claim's volume name ([`crate::request::volume_name`]).
    pub volume_name: Result<String, RequestError>,
    /// The PV of that name (`Absent` without a name).
    pub volume: Volume,
    /// The claim's class in the cache.
    pub class: Option<Arc<StorageClass>>,
    /// The class of the claim's entry in the in-flight record ([`crate::inflight`]): its
    /// volume may exist at the driver.
    pub in_flight: Option<Arc<StorageClass>>,
    /// Used instead of the claim-name hash in topology when the name is empty.
    pub fallback_hash: u32,
}

/// What the decision asks of the caches beyond [`Observed`], only when it gets that far.
pub trait ClaimLookups: Lookups {
    /// How long the claim with `uid`, refused as infeasible under the class with `class_uid`,
    /// still waits.
    fn infeasible(&self, uid: &str, class_uid: &str) -> Option<Duration>;
}

/// The next step of `claim` (read from the cache at its current version). `node`: the node a
/// `--node-deployment` instance serves.
pub fn next_step(
    claim: &PersistentVolumeClaim,
    observed: Observed,
    policy: &Policy<'_>,
    node: Option<&NodeDeployment>,
    lookups: &impl ClaimLookups,
) -> ClaimStep {
    let name = match observed.volume_name {
        Ok(name) => name,
        Err(error) => {
            let fatal = matches!(error, RequestError::UuidLength { .. });
            return ClaimStep::NoVolumeName { error, fatal };
        }
    };
    // Another driver's claim may carry the same finalizer, released by its own provisioner.
    if !claims::annotated_for(claim, &policy.driver.name) {
        return ClaimStep::Nothing;
    }
    // The finalizer of claims protected before the in-flight record, or where it cannot be
    // written.
    let finalized = claim
        .finalizers()
        .iter()
        .any(|f| f == PROVISIONING_PROTECTION);
    let protected = finalized || observed.in_flight.is_some();
    let bound = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    match observed.volume {
        Volume::Lags => return ClaimStep::Wait,
        Volume::Cached => return ClaimStep::Finished { release: finalized },
        Volume::Absent if bound => return ClaimStep::Finished { release: finalized },
        Volume::Absent => {}
    }
    // A claim deleted before any CreateVolume has nothing to clean up; one deleted after
    // keeps being provisioned (CreateVolume is idempotent by name) until its PV exists, so
    // the volume is released through the PV like any other.
    if claim.metadata.deletion_timestamp.is_some() && !protected {
        return ClaimStep::Nothing;
    }
    // Once protected, a class deleted meanwhile is replaced by its record: the volume may
    // exist, and only a CreateVolume like the first can find it.
    let class = match observed.class {
        None if protected => observed.in_flight.or_else(|| recorded_class(claim)),
        live => live,
    };
    // A class not (yet) in the cache is retried without an Event: a class created just
    // before its claim may not have reached the cache, and the API server's binder already
    // reports a claim whose class does not exist.
    let decision = match claims::decide(claim, &policy.driver.name, class.as_deref()) {
        Ok(decision) => decision,
        Err(error) => return ClaimStep::NoClass(error),
    };
    let selected_node = match decision {
        ClaimDecision::Provision { selected_node } => selected_node,
        ClaimDecision::ForeignClass { provisioner } => {
            return ClaimStep::ForeignClass { provisioner };
        }
        ClaimDecision::Ignore | ClaimDecision::WaitForNode => return ClaimStep::Nothing,
    };
    let Some(class) = class else {
        return ClaimStep::Nothing;
    };
    if let Some(node) = node {
        match node.check(
            selected_node.as_deref(),
            &class,
            policy.topology_supported(),
            policy.strict_topology,
        ) {
            NodeCheck::Provision => {}
            NodeCheck::Ignore => return ClaimStep::Nothing,
            NodeCheck::BecomeOwner => return ClaimStep::BecomeOwner { class },
        }
    }
    let uid = claim.uid().unwrap_or_default();
    if let Some(wait) = lookups.infeasible(&uid, &class.uid().unwrap_or_default()) {
        return ClaimStep::Infeasible { wait };
    }
    // CSI migration: a class naming the in-tree plugin the driver took over is translated for
    // CreateVolume; the PV is built from the class as it is, and written as an in-tree PV.
    let migration = Plugin::for_in_tree_name(&class.provisioner)
        .filter(|plugin| plugin.csi_driver() == policy.driver.name);
    let translated = match migration.map(|plugin| plugin.storage_class_to_csi(&class)) {
        None => None,
        Some(Ok(translated)) => Some(translated),
        Some(Err(error)) => return ClaimStep::Refused(Refusal::Migration(error)),
    };
    let inputs = provision::Claim {
        claim,
        class: translated.as_ref().unwrap_or(&class),
        name: &name,
        selected_node: selected_node.as_deref(),
        fallback_hash: observed.fallback_hash,
    };
    match provision::plan(&inputs, policy, lookups) {
        Ok(Decision::Provision(plan)) => ClaimStep::Provision(Box::new(Provisioning {
            plan,
            class,
            selected_node,
            migration,
        })),
        Ok(Decision::Populator { kind }) => ClaimStep::Populator { kind },
        Ok(Decision::Reschedule { node }) => ClaimStep::Reschedule { node },
        Err(refusal) => ClaimStep::Refused(refusal),
    }
}

/// The class a protected claim's provisioning started with (a broken record is logged).
fn recorded_class(claim: &PersistentVolumeClaim) -> Option<Arc<StorageClass>> {
    match protection::recorded_class(claim.annotations())? {
        Ok(class) => Some(Arc::new(class)),
        Err(error) => {
            tracing::warn!(claim = %claim.name_any(), %error, "the recorded StorageClass is unreadable");
            None
        }
    }
}

#[cfg(test)]
mod tests;

//! Node ownership (`--node-deployment`): an instance serving one node takes an Immediate
//! claim by setting selected-node to its node, after a per-claim delay and a capacity check.

use std::collections::BTreeMap;
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as ControllerCapability;
use csi_proto::csi::v1 as csi;
use csi_sidecar::workers::Synced;
use csi_sidecar::writes::patch_or_update;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::json;

use crate::claims;
use crate::node_deployment::{NodeDeployment, OwnerBackoff};
use crate::sync_error::SyncError;
use csi_kinds::annotations::SELECTED_NODE;

use super::{Provisioner, claim_ref};

/// The node of a `--node-deployment` instance, and the delays before it tries to own
/// Immediate claims.
pub(super) struct OwnNode {
    pub(super) deployment: NodeDeployment,
    pub(super) backoff: OwnerBackoff,
}

/// A number in [0, 1) that differs between instances and calls (`RandomState` is seeded
/// randomly), for the jitter that keeps node instances from trying to own a claim at once.
fn random_fraction(uid: &str) -> f64 {
    use std::hash::BuildHasher;
    let hash = std::collections::hash_map::RandomState::new().hash_one(uid);
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

impl Provisioner {
    /// Upstream's `becomeOwner`: waits this claim's delay (watching the cache for another
    /// node taking it meanwhile), checks that the node has room for it, then sets
    /// selected-node to this node. The write carries the resourceVersion read, so of
    /// instances writing at once only one succeeds; the others see the winner in their cache.
    pub(super) async fn become_owner(
        &self,
        node: &OwnNode,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<Synced, SyncError> {
        let (nd, backoff) = (&node.deployment, &node.backoff);
        let uid = claim.uid().unwrap_or_default();
        let delay = backoff.next(&uid, random_fraction(&uid));
        tracing::debug!(claim = %claim.name_any(), ?delay, "will try to become owner of the claim");
        // A high base delay means checking less often; many instances waiting at once make it
        // likely that one wins early, so not much less often either.
        let poll = (nd.base_delay / 100).max(Duration::from_millis(10));
        let reference = claim_ref(claim);
        let deadline = tokio::time::Instant::now() + delay;
        let current = loop {
            let current = self.caches.claims.get(&reference);
            let Some(current) = current.filter(|c| c.uid().as_deref() == Some(uid.as_str())) else {
                backoff.forget(&uid);
                return Ok(Synced::Done);
            };
            let owned = current
                .annotations()
                .get(SELECTED_NODE)
                .is_some_and(|n| !n.is_empty());
            if owned {
                // Another instance was faster (or, upstream's sanity check, this one already
                // owns it): its update brings the claim back. A reschedule later starts from
                // the base delay.
                backoff.forget(&uid);
                return Ok(Synced::Done);
            }
            if tokio::time::Instant::now() >= deadline {
                break current.to_claim();
            }
            tokio::time::sleep(poll.min(deadline - tokio::time::Instant::now())).await;
        };
        // As upstream, a failed check does not keep the claim from being owned: provisioning
        // then fails the same way and says so in an event.
        match self.enough_capacity(nd, &current, class).await {
            Ok(false) => {
                tracing::debug!(claim = %claim.name_any(), "not enough capacity on this node");
                return Ok(Synced::Done);
            }
            Ok(true) => {}
            Err(error) => {
                tracing::info!(claim = %claim.name_any(), %error, "becoming owner although the capacity check failed");
            }
        }
        let api: Api<PersistentVolumeClaim> = Api::namespaced(
            self.client.clone(),
            &current.namespace().unwrap_or_default(),
        );
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "annotations": {SELECTED_NODE: nd.node_name},
        }});
        let read_version = current.resource_version();
        let edit = |fresh: &mut ObjectMeta| {
            fresh.resource_version == read_version && {
                fresh
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(SELECTED_NODE.to_string(), nd.node_name.clone());
                true
            }
        };
        let namespace = current.namespace();
        let name = current.name_any();
        let patch = Patch::Merge(&patch);
        let write = self.claim_writes.writing(claim_ref(&current), &current);
        match patch_or_update(&api, namespace.as_deref(), &name, &patch, edit).await {
            Ok(None) => Ok(Synced::Done),
            Ok(Some(updated)) => {
                backoff.forget(&uid);
                write.answered(Some(&updated));
                tracing::info!(claim = %claim.name_any(), node = %nd.node_name, "became owner of the claim");
                Ok(Synced::Done)
            }
            // Lost the race (or another change came first): the newer claim in the cache is
            // offered again and tried with the next, longer delay unless someone owns it.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Synced::Waiting),
            Err(source) => Err(SyncError::Api {
                what: format!("selecting node {:?} for the claim", nd.node_name),
                source,
            }),
        }
    }

    /// Upstream's `checkCapacity`: GetCapacity for this node's topology with the parameters
    /// and capabilities CreateVolume would get; a driver without GET_CAPACITY always has room.
    async fn enough_capacity(
        &self,
        nd: &NodeDeployment,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<bool, SyncError> {
        let requested = claims::requested_size(claim)?;
        if requested == 0
            || !self
                .settings
                .driver
                .has_controller(ControllerCapability::GetCapacity)
        {
            return Ok(true);
        }
        let spec = claim.spec.clone().unwrap_or_default();
        let shape = crate::capacity::VolumeShape {
            access_modes: spec.access_modes.as_deref().unwrap_or_default(),
            volume_mode: spec.volume_mode.as_deref(),
            single_node_multi_writer: self
                .settings
                .driver
                .has_controller(ControllerCapability::SingleNodeMultiWriter),
        };
        let request = crate::capacity::get_capacity_request(
            class,
            &self.settings.default_fstype,
            &shape,
            &nd.segments,
        )?;
        let response = self
            .csi
            .get_capacity(request, self.settings.timeout)
            .await
            .map_err(crate::capacity::CapacityError::GetCapacity)?;
        Ok(requested <= response.available_capacity)
    }
}

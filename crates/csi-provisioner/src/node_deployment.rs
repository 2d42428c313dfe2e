//! Distributed provisioning (`--node-deployment`), as upstream's `NodeDeployment`: one
//! provisioner per node next to a driver for node-local storage. Each handles the claims whose
//! selected node is its own node, and (with `--node-deployment-immediate-binding`) competes for
//! Immediate claims by setting selected-node to itself after a randomized, per-claim exponential
//! delay, so that usually one instance wins without a conflict.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::topology::{self, Inputs, SelectedNode};

/// Who this instance is: from `NODE_NAME` and the driver's NodeGetInfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDeployment {
    pub node_name: String,
    /// NodeGetInfo's accessible topology: the only topology this instance provisions for (it
    /// stands in for the Node and CSINode objects, which upstream does not watch here).
    pub segments: BTreeMap<String, String>,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay`.
    pub base_delay: Duration,
    /// `--node-deployment-max-delay`.
    pub max_delay: Duration,
}

/// What this node's instance does with a claim that is ready to provision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCheck {
    /// Selected-node names this node.
    Provision,
    /// Another node's claim, a WaitForFirstConsumer claim, or an Immediate one this node may
    /// not take.
    Ignore,
    /// An Immediate claim this node may serve: try to set selected-node to this node.
    BecomeOwner,
}

impl NodeDeployment {
    /// Upstream's `checkNode`. `topology_supported` (the driver's capability and the Topology
    /// gate) and `strict` (`--strict-topology`) say how a class's allowedTopologies are judged.
    pub fn check(
        &self,
        selected_node: Option<&str>,
        class: &StorageClass,
        topology_supported: bool,
        strict: bool,
    ) -> NodeCheck {
        match selected_node {
            Some(node) if node == self.node_name => NodeCheck::Provision,
            Some(_) => NodeCheck::Ignore,
            None if class.volume_binding_mode.as_deref() != Some("Immediate")
                || !self.immediate_binding =>
            {
                NodeCheck::Ignore
            }
            None => {
                let allowed = class.allowed_topologies.clone().unwrap_or_default();
                if !allowed.is_empty() && topology_supported && !self.serves(&allowed, strict) {
                    return NodeCheck::Ignore;
                }
                NodeCheck::BecomeOwner
            }
        }
    }

    /// Whether requirements can be made for this node within the class's allowed topologies
    /// (upstream tries `GenerateAccessibilityRequirements` with this node selected).
    fn serves(
        &self,
        allowed: &[k8s_openapi::api::core::v1::TopologySelectorTerm],
        strict: bool,
    ) -> bool {
        let node = self.selected_node();
        let inputs = Inputs {
            selected_node: Some(&node),
            immediate_keys: &[],
            node_labels: std::slice::from_ref(&self.segments),
            allowed_topologies: allowed,
            strict,
            // Only consulted without a selected node.
            immediate_topology: true,
            claim_name: "",
            fallback_hash: 0,
        };
        topology::requirements(&inputs).is_ok()
    }

    /// This node as the topology code sees a selected node: its keys and labels are the
    /// NodeGetInfo segments (upstream's fake CSINode and Node).
    pub fn selected_node(&self) -> SelectedNode {
        SelectedNode {
            name: self.node_name.clone(),
            keys: Some(self.segments.keys().cloned().collect()),
            labels: self.segments.clone(),
        }
    }

    /// Upstream's `VolumeIsAccessible`: a PV is this instance's to delete when its node
    /// affinity admits this node's topology (no affinity or no topology: every PV).
    pub fn created_here(&self, volume: &PersistentVolume) -> bool {
        let required = volume
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref());
        match required {
            // Upstream matches a Node that has the segments as labels and no name.
            Some(selector) if !self.segments.is_empty() => {
                csi_kinds::node_selector::matches(selector, "", &self.segments)
            }
            _ => true,
        }
    }
}

/// The delays before trying to own an Immediate claim, per claim UID: upstream's
/// exponential failure rate limiter (base doubling per attempt, capped at max) minus a random
/// jitter of up to one base delay, so competing instances rarely try at the same moment.
#[derive(Debug)]
pub struct OwnerBackoff {
    base: Duration,
    max: Duration,
    attempts: Mutex<HashMap<String, u32>>,
}

impl OwnerBackoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempts: Mutex::default(),
        }
    }

    /// The next delay for `uid` (counts an attempt); `random` in [0, 1) picks the jitter.
    pub fn next(&self, uid: &str, random: f64) -> Duration {
        let mut attempts = self
            .attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let attempt = attempts.entry(uid.to_string()).or_default();
        let exponential = self
            .base
            .checked_mul(2u32.saturating_pow(*attempt))
            .map_or(self.max, |d| d.min(self.max));
        *attempt = attempt.saturating_add(1);
        exponential.saturating_sub(self.base.mul_f64(random.clamp(0.0, 1.0)))
    }

    /// Start from the base delay again: the claim was owned (by us or another) or is gone.
    pub fn forget(&self, uid: &str) {
        self.attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(uid);
    }

    /// Drop the state of claims that are gone.
    pub fn retain(&self, uids: &std::collections::HashSet<String>) {
        self.attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|uid, _| uids.contains(uid));
    }
}

#[cfg(test)]
mod tests;

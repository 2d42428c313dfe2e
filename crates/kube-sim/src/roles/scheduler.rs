//! A simple kube-scheduler: binds pending pods to a Ready, schedulable node whose taints they
//! tolerate, that matches their node selector and required node affinity, and that their
//! volumes can reach. WaitForFirstConsumer claims get `volume.kubernetes.io/selected-node` (or a
//! matching static PV pre-bound) first, and the pod waits until they are bound — as the
//! VolumeBinding plugin does (pkg/scheduler/framework/plugins/volumebinding), including its
//! storage capacity check for drivers with `storageCapacity: true`. Score: fewest pods.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::scheduling::{
    claim_matches_pv, label_selector_matches, node_ready_status, node_selector_matches,
    parse_quantity, pv_matches_node, untolerated,
};
use super::{Informers, RoleError, Timing, merge_patch, merge_patch_status, now, reconcile_loop};
use csi_kinds::annotations::SELECTED_NODE;

pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

struct Caches {
    pods: Store<Pod>,
    nodes: Store<Node>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    drivers: Store<CSIDriver>,
    capacities: Store<CSIStorageCapacity>,
}

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let mut informers = Informers::new(&client, &shutdown);
    let caches = Arc::new(Caches {
        pods: informers.all(),
        nodes: informers.all(),
        claims: informers.all(),
        volumes: informers.all(),
        classes: informers.all(),
        drivers: informers.all(),
        capacities: informers.all(),
    });
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    reconcile_loop("scheduler", wake, timing.resync, shutdown, || {
        pass(client.clone(), caches.clone())
    })
    .await;
    Ok(())
}

/// What to do with one pending pod.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Bind(String),
    /// Set selected-node on these claims, pre-bind these (PV, claim) pairs, then wait.
    PrepareVolumes {
        node: String,
        select: Vec<String>,
        prebind: Vec<(String, String)>,
    },
    /// Volumes are being provisioned or bound for the chosen node.
    Wait,
    Unschedulable(String),
}

fn is_pending(pod: &Pod) -> bool {
    let spec = pod.spec.clone().unwrap_or_default();
    spec.node_name.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && spec
            .scheduler_name
            .as_deref()
            .is_none_or(|s| s == DEFAULT_SCHEDULER)
}

async fn pass(client: Client, caches: Arc<Caches>) -> Result<(), RoleError> {
    for pod in caches.pods.state().into_iter().filter(|p| is_pending(p)) {
        let decision = decide(&caches, &pod);
        if let Err(error) = act(&client, &caches, &pod, decision).await {
            tracing::warn!(pod = %pod.name_any(), %error, "scheduler: acting failed");
        }
    }
    Ok(())
}

/// Why a node does not fit the pod, in kube-scheduler's words; `None` when it fits.
fn unfit(
    caches: &Caches,
    pod: &Pod,
    claims: &[Arc<PersistentVolumeClaim>],
    node: &Node,
) -> Option<String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let node_spec = node.spec.clone().unwrap_or_default();
    if node_ready_status(node) != Some("True") {
        return Some("node(s) were not ready".to_string());
    }
    if node_spec.unschedulable == Some(true) {
        return Some("node(s) were unschedulable".to_string());
    }
    let taints = node_spec.taints.unwrap_or_default();
    if let Some(taint) = untolerated(
        &taints,
        &spec.tolerations.unwrap_or_default(),
        &["NoSchedule", "NoExecute"],
    ) {
        return Some(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.clone().unwrap_or_default()
        ));
    }
    let selector_ok = spec
        .node_selector
        .unwrap_or_default()
        .iter()
        .all(|(k, v)| node.labels().get(k) == Some(v));
    let affinity_ok = spec
        .affinity
        .and_then(|a| a.node_affinity)
        .and_then(|a| a.required_during_scheduling_ignored_during_execution)
        .is_none_or(|required| node_selector_matches(&required, node));
    if !selector_ok || !affinity_ok {
        return Some("node(s) didn't match Pod's node affinity/selector".to_string());
    }
    for claim in claims {
        let bound = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|n| !n.is_empty());
        if let Some(volume) = bound {
            if !caches
                .volumes
                .get(&ObjectRef::new(&volume))
                .is_some_and(|pv| pv_matches_node(&pv, node))
            {
                return Some("node(s) had volume node affinity conflict".to_string());
            }
            continue;
        }
        if let Some(selected) = claim.annotations().get(SELECTED_NODE)
            && *selected != node.name_any()
        {
            return Some(
                "node(s) didn't match the node selected for the pod's volumes".to_string(),
            );
        }
        if static_candidate(caches, claim, node).is_none() {
            if !can_provision(caches, claim, node) {
                return Some(
                    "node(s) didn't find available persistent volumes to bind".to_string(),
                );
            }
            if !has_enough_capacity(caches, claim, node) {
                return Some("node(s) did not have enough free storage".to_string());
            }
        }
    }
    None
}

fn class_of(caches: &Caches, claim: &PersistentVolumeClaim) -> Option<Arc<StorageClass>> {
    let name = claim
        .spec
        .as_ref()?
        .storage_class_name
        .clone()
        .filter(|n| !n.is_empty())?;
    caches.classes.get(&ObjectRef::new(&name))
}

fn is_delayed(caches: &Caches, claim: &PersistentVolumeClaim) -> bool {
    class_of(caches, claim)
        .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

fn static_candidate(
    caches: &Caches,
    claim: &PersistentVolumeClaim,
    node: &Node,
) -> Option<Arc<PersistentVolume>> {
    caches
        .volumes
        .state()
        .into_iter()
        .filter(|v| {
            v.spec.as_ref().is_some_and(|s| s.claim_ref.is_none())
                && v.metadata.deletion_timestamp.is_none()
        })
        .filter(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released"))
        .find(|v| claim_matches_pv(claim, v) && pv_matches_node(v, node))
}

/// The class has a provisioner and its allowedTopologies admit the node.
fn can_provision(caches: &Caches, claim: &PersistentVolumeClaim, node: &Node) -> bool {
    let Some(class) = class_of(caches, claim) else {
        return false;
    };
    if class.provisioner == "kubernetes.io/no-provisioner" {
        return false;
    }
    let terms = class.allowed_topologies.clone().unwrap_or_default();
    terms.is_empty()
        || terms.iter().any(|term| {
            term.match_label_expressions.iter().flatten().all(|e| {
                node.labels()
                    .get(&e.key)
                    .is_some_and(|v| e.values.contains(v))
            })
        })
}

/// For a driver with `storageCapacity: true`, some CSIStorageCapacity of the claim's class
/// whose topology matches the node must hold the claim's request (its maximumVolumeSize when
/// set, else its capacity): volumebinding `hasEnoughCapacity` and `capacitySufficient`. An
/// object without nodeTopology gives no node access (`nodeHasAccess`).
fn has_enough_capacity(caches: &Caches, claim: &PersistentVolumeClaim, node: &Node) -> bool {
    let Some(class) = class_of(caches, claim) else {
        return false;
    };
    let tracked = caches
        .drivers
        .get(&ObjectRef::new(&class.provisioner))
        .is_some_and(|d| d.spec.storage_capacity == Some(true));
    if !tracked {
        return true;
    }
    let requested = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(parse_quantity)
        .unwrap_or_default();
    caches.capacities.state().iter().any(|capacity| {
        let limit = capacity
            .maximum_volume_size
            .as_ref()
            .or(capacity.capacity.as_ref())
            .and_then(parse_quantity);
        capacity.storage_class_name == class.name_any()
            && limit.is_some_and(|limit| limit >= requested)
            && capacity
                .node_topology
                .as_ref()
                .is_some_and(|selector| label_selector_matches(Some(selector), node.labels()))
    })
}

fn decide(caches: &Caches, pod: &Pod) -> Decision {
    let namespace = pod.namespace().unwrap_or_default();
    let mut claims = Vec::new();
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
    {
        let Some(source) = volume.persistent_volume_claim else {
            continue;
        };
        match caches
            .claims
            .get(&ObjectRef::new(&source.claim_name).within(&namespace))
        {
            None => {
                return Decision::Unschedulable(format!(
                    "persistentvolumeclaim \"{}\" not found",
                    source.claim_name
                ));
            }
            Some(claim) if claim.metadata.deletion_timestamp.is_some() => {
                return Decision::Unschedulable(format!(
                    "persistentvolumeclaim \"{}\" is being deleted",
                    source.claim_name
                ));
            }
            Some(claim) => claims.push(claim),
        }
    }
    let unbound: Vec<&Arc<PersistentVolumeClaim>> = claims
        .iter()
        .filter(|c| {
            c.spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_none_or(str::is_empty)
        })
        .collect();
    if unbound.iter().any(|c| !is_delayed(caches, c)) {
        return Decision::Unschedulable(
            "pod has unbound immediate PersistentVolumeClaims".to_string(),
        );
    }
    let nodes = caches.nodes.state();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut feasible = Vec::new();
    for node in &nodes {
        match unfit(caches, pod, &claims, node) {
            None => feasible.push(node.clone()),
            Some(reason) => *reasons.entry(reason).or_default() += 1,
        }
    }
    let pods = caches.pods.state();
    let load = |node: &Node| {
        pods.iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node.name_any())
            })
            .count()
    };
    let Some(chosen) = feasible.into_iter().min_by_key(|n| (load(n), n.name_any())) else {
        let detail: Vec<String> = reasons
            .iter()
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect();
        return Decision::Unschedulable(format!(
            "0/{} nodes are available: {}.",
            nodes.len(),
            detail.join(", ")
        ));
    };
    if unbound.is_empty() {
        return Decision::Bind(chosen.name_any());
    }
    let mut select = Vec::new();
    let mut prebind = Vec::new();
    for claim in unbound {
        if claim.annotations().contains_key(SELECTED_NODE) {
            continue;
        }
        match static_candidate(caches, claim, &chosen) {
            Some(volume) => prebind.push((volume.name_any(), claim.name_any())),
            None => select.push(claim.name_any()),
        }
    }
    if select.is_empty() && prebind.is_empty() {
        Decision::Wait
    } else {
        Decision::PrepareVolumes {
            node: chosen.name_any(),
            select,
            prebind,
        }
    }
}

async fn act(
    client: &Client,
    caches: &Caches,
    pod: &Pod,
    decision: Decision,
) -> Result<(), RoleError> {
    let namespace = pod.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    match decision {
        Decision::Bind(node) => {
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.name_any(), "namespace": namespace, "uid": pod.uid()},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            });
            match pods
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    &pod.name_any(),
                    &PostParams::default(),
                    &binding,
                )
                .await
            {
                Ok(_) => tracing::info!(pod = %pod.name_any(), %node, "scheduled"),
                // Already bound (a stale cache): nothing to do.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => return Err(error.into()),
            }
        }
        Decision::PrepareVolumes {
            node,
            select,
            prebind,
        } => {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
            for claim in select {
                merge_patch(
                    &claims,
                    &claim,
                    json!({"metadata": {"annotations": {SELECTED_NODE: node}}}),
                )
                .await?;
                tracing::info!(%claim, %node, "selected node for provisioning");
            }
            let volumes: Api<PersistentVolume> = Api::all(client.clone());
            for (volume, claim) in prebind {
                let Some(claim_object) = caches
                    .claims
                    .get(&ObjectRef::new(&claim).within(&namespace))
                else {
                    continue;
                };
                let Some(pv) = caches.volumes.get(&ObjectRef::new(&volume)) else {
                    continue;
                };
                let patch = json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": pv.metadata.resource_version},
                    {"op": "add", "path": "/spec/claimRef", "value": {
                        "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": namespace,
                        "name": claim, "uid": claim_object.metadata.uid,
                    }},
                ]);
                let patch: json_patch::Patch =
                    serde_json::from_value(patch).map_err(|e| RoleError::Invalid(e.to_string()))?;
                match volumes
                    .patch(&volume, &PatchParams::default(), &Patch::Json::<()>(patch))
                    .await
                {
                    Ok(_) => tracing::info!(%volume, %claim, %node, "pre-bound static volume"),
                    Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {}
                    Err(error) => return Err(error.into()),
                }
            }
        }
        Decision::Wait => {}
        Decision::Unschedulable(message) => {
            let current = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
                .and_then(|c| c.message.clone());
            if current.as_deref() != Some(&message) {
                tracing::info!(pod = %pod.name_any(), %message, "unschedulable");
                let condition = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message, "lastTransitionTime": now()});
                merge_patch_status(
                    &pods,
                    &pod.name_any(),
                    json!({"status": {"conditions": [condition]}}),
                )
                .await?;
            }
        }
    }
    Ok(())
}

//! The node lifecycle controller, taint eviction and pod GC of kube-controller-manager
//! (pkg/controller/nodelifecycle, pkg/controller/tainteviction, pkg/controller/podgc): a node
//! whose heartbeats (Lease and Ready condition) are older than the grace period turns Unknown
//! and gets the `node.kubernetes.io/unreachable` NoSchedule and NoExecute taints (`not-ready`
//! for Ready=False); pods that do not tolerate a NoExecute taint are evicted (after their
//! tolerationSeconds); pods bound to a node that no longer exists are force-deleted.
//!
//! NoExecute taints follow kube-controller-manager's zone disruption judgement: no new ones in
//! a partially disrupted small zone, and none at all (existing ones removed) while every zone
//! is fully disrupted, since the controller then assumes it is the one cut off.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::kubelet::NODE_LEASE_NAMESPACE;
use super::scheduling::tolerates;
use super::{
    Informers, RoleError, Timing, age_seconds, force_delete_pod, lock, merge_patch_status, now,
    reconcile_loop,
};

pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

struct Caches {
    nodes: Store<Node>,
    leases: Store<Lease>,
    pods: Store<Pod>,
}

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let mut informers = Informers::new(&client, &shutdown);
    let caches = Arc::new(Caches {
        nodes: informers.all(),
        leases: informers.watch(
            Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            watcher::Config::default(),
        ),
        pods: informers.all(),
    });
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let missing_since = Arc::new(Mutex::new(HashMap::new()));
    reconcile_loop("node-lifecycle", wake, timing.resync, shutdown, || {
        pass(
            client.clone(),
            caches.clone(),
            timing.clone(),
            missing_since.clone(),
        )
    })
    .await;
    Ok(())
}

fn timestamp<T: serde::Serialize>(time: &T) -> Option<String> {
    serde_json::to_value(time)
        .ok()?
        .as_str()
        .map(str::to_string)
}

/// Seconds since the node's last heartbeat: the newer of its Lease renewal and its Ready
/// condition's lastHeartbeatTime.
fn silence(caches: &Caches, node: &Node) -> Option<f64> {
    let lease = caches
        .leases
        .get(&ObjectRef::new(&node.name_any()).within(NODE_LEASE_NAMESPACE))
        .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().and_then(timestamp))
        .map(|t| age_seconds(&t));
    let condition = ready_condition(node)
        .and_then(|c| c.last_heartbeat_time.as_ref().and_then(timestamp))
        .map(|t| age_seconds(&t));
    match (lease, condition) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// `--unhealthy-zone-threshold`: the share of not-Ready nodes (more than two) that makes a
/// zone partially disrupted.
const UNHEALTHY_ZONE_THRESHOLD: f64 = 0.55;
/// `--large-cluster-size-threshold`: a partially disrupted zone of more nodes still evicts,
/// slowly; a smaller one stops.
const LARGE_CLUSTER_THRESHOLD: usize = 50;

/// A zone's health, as kube-controller-manager's `ComputeZoneState` judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ZoneState {
    Normal,
    PartialDisruption,
    FullDisruption,
}

/// The zone a node belongs to: region and zone labels (GA, else the beta ones), as
/// `GetZoneKey`; nodes without them share one zone.
fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let label = |ga: &str, beta: &str| {
        labels
            .get(ga)
            .or_else(|| labels.get(beta))
            .cloned()
            .unwrap_or_default()
    };
    format!(
        "{}:\0:{}",
        label(
            "topology.kubernetes.io/region",
            "failure-domain.beta.kubernetes.io/region"
        ),
        label(
            "topology.kubernetes.io/zone",
            "failure-domain.beta.kubernetes.io/zone"
        )
    )
}

fn zone_state(ready: usize, not_ready: usize) -> ZoneState {
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2
        && not_ready as f64 / (not_ready + ready) as f64 >= UNHEALTHY_ZONE_THRESHOLD
    {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// What may happen to a node's unreachable/not-ready NoExecute taints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NoExecute {
    /// Added when the node's condition wants them (a healthy or fully disrupted zone).
    Taint,
    /// Kept where present, none added (a partially disrupted small zone).
    Hold,
    /// Removed: every zone is fully disrupted.
    Lift,
}

/// The NoExecute policy per zone, from each node's zone and whether it is Ready.
fn no_execute_policies(nodes: &[(String, bool)]) -> BTreeMap<String, NoExecute> {
    let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (zone, ready) in nodes {
        let (r, n) = counts.entry(zone).or_default();
        if *ready {
            *r += 1;
        } else {
            *n += 1;
        }
    }
    let states: BTreeMap<&str, ZoneState> = counts
        .iter()
        .map(|(zone, (r, n))| (*zone, zone_state(*r, *n)))
        .collect();
    let all_down = states.values().all(|s| *s == ZoneState::FullDisruption);
    states
        .into_iter()
        .map(|(zone, state)| {
            let (r, n) = counts[zone];
            let policy = match state {
                _ if all_down => NoExecute::Lift,
                ZoneState::PartialDisruption if r + n <= LARGE_CLUSTER_THRESHOLD => NoExecute::Hold,
                _ => NoExecute::Taint,
            };
            (zone.to_string(), policy)
        })
        .collect()
}

/// The taint key the node should carry, from its (possibly just-updated) Ready status.
fn wanted_taint(stale: bool, ready: Option<&str>) -> Option<&'static str> {
    match (stale, ready) {
        (true, _) | (false, Some("Unknown")) => Some(UNREACHABLE_TAINT),
        (false, Some("False")) => Some(NOT_READY_TAINT),
        _ => None,
    }
}

/// The node's taints with ours replaced by `wanted` (NoSchedule, and NoExecute as `no_execute`
/// allows), keeping the timeAdded of taints that stay.
fn with_taints(current: &[Taint], wanted: Option<&str>, no_execute: NoExecute) -> Vec<Taint> {
    let ours = [UNREACHABLE_TAINT, NOT_READY_TAINT];
    let mut taints: Vec<Taint> = current
        .iter()
        .filter(|t| {
            !ours.contains(&t.key.as_str())
                || (Some(t.key.as_str()) == wanted
                    && (t.effect != "NoExecute" || no_execute != NoExecute::Lift))
        })
        .cloned()
        .collect();
    if let Some(key) = wanted {
        for effect in ["NoSchedule", "NoExecute"] {
            if effect == "NoExecute" && no_execute != NoExecute::Taint {
                continue;
            }
            if !taints.iter().any(|t| t.key == key && t.effect == effect) {
                taints.push(Taint {
                    key: key.to_string(),
                    effect: effect.to_string(),
                    value: None,
                    time_added: (effect == "NoExecute")
                        .then(|| Time(k8s_openapi::jiff::Timestamp::now())),
                });
            }
        }
    }
    taints
}

async fn pass(
    client: Client,
    caches: Arc<Caches>,
    timing: Timing,
    missing_since: Arc<Mutex<HashMap<String, Instant>>>,
) -> Result<(), RoleError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let grace = timing.node_grace_period.as_secs_f64();
    let mut health = Vec::new();
    for node in caches.nodes.state() {
        let name = node.name_any();
        // A node that never reported gets the grace period from its creation, as upstream.
        let created = node
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(timestamp)
            .map(|t| age_seconds(&t));
        let stale = silence(&caches, &node)
            .or(created)
            .is_none_or(|s| s > grace);
        let mut ready = ready_condition(&node).map(|c| c.status.clone());
        if stale && ready.as_deref() != Some("Unknown") {
            mark_unknown(&nodes, &node).await?;
            tracing::warn!(node = %name, "node stopped posting status; marked Unknown");
            ready = Some("Unknown".to_string());
        }
        if stale {
            mark_pods_not_ready(&client, &caches, &name).await?;
        }
        health.push((node, stale, ready));
    }
    let zones: Vec<(String, bool)> = health
        .iter()
        .map(|(node, _, ready)| (zone_key(node), ready.as_deref() == Some("True")))
        .collect();
    let policies = no_execute_policies(&zones);
    for ((node, stale, ready), (zone, _)) in health.into_iter().zip(zones) {
        let name = node.name_any();
        let current = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let taints = with_taints(
            &current,
            wanted_taint(stale, ready.as_deref()),
            policies[&zone],
        );
        if taints != current {
            let patch = json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": node.metadata.resource_version},
                {"op": "add", "path": "/spec/taints", "value": taints},
            ]);
            let patch: json_patch::Patch =
                serde_json::from_value(patch).map_err(|e| RoleError::Invalid(e.to_string()))?;
            match nodes
                .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(node = %name, taints = ?taints.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect::<Vec<_>>(), "node taints updated")
                }
                // Someone else changed the node: the next pass starts from its new taints.
                Err(kube::Error::Api(status))
                    if status.code == 422 || status.code == 409 || status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
        evict(&client, &caches, &name, &taints).await?;
    }
    collect_orphans(&client, &caches, &timing, &missing_since).await
}

async fn mark_unknown(nodes: &Api<Node>, node: &Node) -> Result<(), RoleError> {
    let now = now();
    let conditions: Vec<serde_json::Value> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            json!({
                "type": c.type_, "status": "Unknown", "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": c.last_heartbeat_time, "lastTransitionTime": now,
            })
        })
        .collect();
    let conditions = if conditions.is_empty() {
        vec![
            json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusNeverUpdated", "message": "Kubelet never posted node status.", "lastTransitionTime": now}),
        ]
    } else {
        conditions
    };
    merge_patch_status(
        nodes,
        &node.name_any(),
        json!({"status": {"conditions": conditions}}),
    )
    .await?;
    Ok(())
}

/// The pods of a node that stopped reporting are no longer Ready: their Ready condition turns
/// False, as `MarkPodsNotReady` (pkg/controller/util/node/controller_utils.go) does.
async fn mark_pods_not_ready(
    client: &Client,
    caches: &Caches,
    node: &str,
) -> Result<(), RoleError> {
    for pod in caches.pods.state() {
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
            continue;
        }
        let conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        if !conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
        {
            continue;
        }
        let conditions: Vec<serde_json::Value> = conditions
            .into_iter()
            .map(|mut c| {
                if c.type_ == "Ready" {
                    c.status = "False".to_string();
                    c.last_transition_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
                }
                c
            })
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        match merge_patch_status(
            &pods,
            &pod.name_any(),
            json!({"status": {"conditions": conditions}}),
        )
        .await
        {
            Ok(_) => {
                tracing::info!(pod = %pod.name_any(), %node, "pod marked not ready: its node stopped reporting")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Taint eviction: pods that do not tolerate a NoExecute taint go at once; tolerated with
/// tolerationSeconds, once that much time passed since the taint was added.
async fn evict(
    client: &Client,
    caches: &Caches,
    node: &str,
    taints: &[Taint],
) -> Result<(), RoleError> {
    let no_execute: Vec<&Taint> = taints.iter().filter(|t| t.effect == "NoExecute").collect();
    if no_execute.is_empty() {
        return Ok(());
    }
    for pod in caches.pods.state() {
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node)
            || pod.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let due = no_execute.iter().any(|taint| {
            let matching: Vec<_> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
            if matching.is_empty() {
                return true;
            }
            // The shortest tolerationSeconds wins; one toleration without a limit keeps the pod.
            let limit = matching
                .iter()
                .map(|t| t.toleration_seconds)
                .try_fold(i64::MAX, |min, s| s.map(|s| min.min(s)));
            let added = taint
                .time_added
                .as_ref()
                .and_then(timestamp)
                .map_or(0.0, |t| age_seconds(&t));
            limit.is_some_and(|seconds| added >= seconds.max(0) as f64)
        });
        if !due {
            continue;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let condition = json!({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager", "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": now()});
        let mut conditions: Vec<serde_json::Value> = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ != "DisruptionTarget")
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        conditions.push(condition);
        let _ = merge_patch_status(
            &pods,
            &pod.name_any(),
            json!({"status": {"conditions": conditions}}),
        )
        .await;
        match pods.delete(&pod.name_any(), &DeleteParams::default()).await {
            Ok(_) => tracing::warn!(pod = %pod.name_any(), %node, "evicted by NoExecute taint"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Pod GC: pods bound to a node that has been gone for the grace period are force-deleted.
async fn collect_orphans(
    client: &Client,
    caches: &Caches,
    timing: &Timing,
    missing_since: &Mutex<HashMap<String, Instant>>,
) -> Result<(), RoleError> {
    let mut seen = HashMap::new();
    for pod in caches.pods.state() {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        if caches.nodes.get(&ObjectRef::new(&node)).is_some() {
            continue;
        }
        let since = *lock(missing_since)
            .entry(node.clone())
            .or_insert_with(Instant::now);
        seen.insert(node.clone(), since);
        if since.elapsed() < timing.node_grace_period {
            continue;
        }
        if force_delete_pod(client, &pod).await? {
            tracing::warn!(pod = %pod.name_any(), %node, "deleted pod of a node that no longer exists");
        }
    }
    *lock(missing_since) = seen;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    #[test]
    fn zone_disruption() {
        let zone = |z: &str, ready: bool| (format!(":\0:{z}"), ready);
        let policy =
            |nodes: &[(String, bool)], z: &str| no_execute_policies(nodes)[&format!(":\0:{z}")];
        // One node down of two: a normal zone.
        assert_eq!(
            policy(&[zone("a", true), zone("a", false)], "a"),
            NoExecute::Taint
        );
        // The only zone fully down: the controller assumes it is cut off itself.
        assert_eq!(policy(&[zone("a", false)], "a"), NoExecute::Lift);
        assert_eq!(
            policy(&[zone("a", false), zone("b", false)], "b"),
            NoExecute::Lift
        );
        // A zone fully down while another is healthy: evicted at the normal rate.
        assert_eq!(
            policy(&[zone("a", false), zone("b", true)], "a"),
            NoExecute::Taint
        );
        // Three of four down: partial disruption; a small zone stops evicting.
        let partial = [
            zone("a", false),
            zone("a", false),
            zone("a", false),
            zone("a", true),
        ];
        assert_eq!(policy(&partial, "a"), NoExecute::Hold);
        // Two of three down is not "more than two".
        assert_eq!(
            policy(&[zone("a", false), zone("a", false), zone("a", true)], "a"),
            NoExecute::Taint
        );
        let mut large = vec![zone("a", true); 20];
        large.extend(vec![zone("a", false); 40]);
        assert_eq!(
            policy(&large, "a"),
            NoExecute::Taint,
            "a large zone evicts slowly"
        );
    }

    #[test]
    fn taint_plans() {
        assert_eq!(wanted_taint(true, Some("True")), Some(UNREACHABLE_TAINT));
        assert_eq!(
            wanted_taint(false, Some("Unknown")),
            Some(UNREACHABLE_TAINT)
        );
        assert_eq!(wanted_taint(false, Some("False")), Some(NOT_READY_TAINT));
        assert_eq!(wanted_taint(false, Some("True")), None);

        let other = taint("podmon", "NoSchedule");
        let added = with_taints(
            std::slice::from_ref(&other),
            Some(UNREACHABLE_TAINT),
            NoExecute::Taint,
        );
        let keys: Vec<_> = added
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("podmon", "NoSchedule"),
                (UNREACHABLE_TAINT, "NoSchedule"),
                (UNREACHABLE_TAINT, "NoExecute")
            ]
        );
        assert!(added[2].time_added.is_some());
        assert_eq!(
            with_taints(&added, Some(UNREACHABLE_TAINT), NoExecute::Taint),
            added,
            "existing taints are kept as they are"
        );
        assert_eq!(
            with_taints(&added, Some(UNREACHABLE_TAINT), NoExecute::Hold),
            added,
            "a held zone keeps the NoExecute taints it has"
        );
        assert_eq!(
            with_taints(&added[..2], Some(UNREACHABLE_TAINT), NoExecute::Hold),
            added[..2],
            "a held zone gets no new NoExecute taint"
        );
        assert_eq!(
            with_taints(&added, Some(UNREACHABLE_TAINT), NoExecute::Lift),
            added[..2],
            "every zone down: NoExecute taints lifted, NoSchedule kept"
        );
        assert_eq!(
            with_taints(&added, None, NoExecute::Taint),
            vec![other.clone()]
        );
        let switched = with_taints(&added, Some(NOT_READY_TAINT), NoExecute::Taint);
        assert!(switched.iter().all(|t| t.key != UNREACHABLE_TAINT));
        assert_eq!(
            switched.iter().filter(|t| t.key == NOT_READY_TAINT).count(),
            2
        );
    }
}

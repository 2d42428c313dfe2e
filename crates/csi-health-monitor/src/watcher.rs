//! The node watcher (`--enable-node-watcher`): judges every node on each change of a Node and
//! every `--node-list-add-interval`, and tells the claims of the driver's bound volumes used by
//! pods on a failed node ([`node`]'s plan).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use csi_kinds::cached::CachedVolume;
use csi_sidecar::events::{EventRecorder, EventType};
use k8s_openapi::api::core::v1::{Node, NodeStatus, ObjectReference, Pod};
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::monitor::monitored;
use crate::node::{self, NodeHealth, NodeStep};

/// What the watcher keeps of a Node: its Ready condition.
pub fn keep_ready_condition(node: &mut Node) {
    node.spec = None;
    node.status = node.status.take().map(|status| NodeStatus {
        conditions: status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .filter(|c| c.type_ == "Ready")
                .collect()
        }),
        ..NodeStatus::default()
    });
}

/// The node watcher of one driver.
#[derive(Debug)]
pub struct NodeWatcher {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub pvs: Store<CachedVolume>,
    pub events: Arc<EventRecorder>,
    pub driver_name: String,
    pub interval: Duration,
    /// Woken by every change of a Node.
    pub wake: Arc<Notify>,
}

impl NodeWatcher {
    pub async fn run(self, shutdown: CancellationToken) {
        // The claims told each node failed, and every node seen (a node gone from the cache
        // after being seen was deleted).
        let mut told: HashMap<String, Vec<ObjectReference>> = HashMap::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        loop {
            let recheck = self.judge(&mut told, &mut seen).await;
            let wait = recheck.map_or(self.interval, |r| r.min(self.interval));
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Judges every node seen; the soonest a NotReady node must be looked at again.
    async fn judge(
        &self,
        told: &mut HashMap<String, Vec<ObjectReference>>,
        seen: &mut BTreeSet<String>,
    ) -> Option<Duration> {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let nodes: BTreeMap<String, Arc<Node>> = self
            .nodes
            .state()
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        seen.extend(nodes.keys().cloned());
        let mut recheck: Option<Duration> = None;
        for name in seen.clone() {
            let health = match nodes.get(&name) {
                Some(node) => node::node_health(ready_condition(node), now),
                None => NodeHealth::Gone,
            };
            match node::node_step(health, told.contains_key(&name)) {
                NodeStep::Nothing => {}
                NodeStep::RecheckIn(after) => {
                    recheck = Some(recheck.map_or(after, |r| r.min(after)));
                }
                NodeStep::TellFailed => {
                    tracing::info!(node = %name, "node is broken");
                    let claims = self.claims_used_on(&name);
                    for (claim, pods) in &claims {
                        let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
                        let message = node::failed_message(
                            &pods,
                            claim.name.as_deref().unwrap_or_default(),
                            claim.namespace.as_deref().unwrap_or_default(),
                            &name,
                        );
                        self.events
                            .publish(claim, EventType::Warning, node::NODE_FAILED, &message)
                            .await;
                    }
                    told.insert(name.clone(), claims.into_iter().map(|(c, _)| c).collect());
                }
                NodeStep::TellRecovered => {
                    let message = node::recovered_message(&name);
                    for claim in told.remove(&name).unwrap_or_default() {
                        self.events
                            .publish(&claim, EventType::Warning, node::NODE_RECOVERED, &message)
                            .await;
                    }
                }
            }
            if health == NodeHealth::Gone && told.contains_key(&name) {
                // Told once; a node deleted for good is not judged again.
                seen.remove(&name);
            }
        }
        recheck
    }

    /// The claims of the driver's bound volumes used by pods on `node`, each with its pods.
    fn claims_used_on(&self, node: &str) -> Vec<(ObjectReference, Vec<String>)> {
        let pvs = self.pvs.state();
        let volumes = monitored(pvs.iter().map(Arc::as_ref), &self.driver_name);
        let by_claim: HashMap<(&str, &str), &ObjectReference> = volumes
            .iter()
            .filter_map(|v| {
                Some((
                    (v.claim.namespace.as_deref()?, v.claim.name.as_deref()?),
                    &v.claim,
                ))
            })
            .collect();
        let mut used: BTreeMap<(String, String), (ObjectReference, Vec<String>)> = BTreeMap::new();
        for pod in self.pods.state() {
            let Some(spec) = pod
                .spec
                .as_ref()
                .filter(|s| s.node_name.as_deref() == Some(node))
            else {
                continue;
            };
            let namespace = pod.namespace().unwrap_or_default();
            for volume in spec.volumes.iter().flatten() {
                let Some(source) = &volume.persistent_volume_claim else {
                    continue;
                };
                let Some(claim) = by_claim.get(&(namespace.as_str(), source.claim_name.as_str()))
                else {
                    continue;
                };
                used.entry((namespace.clone(), source.claim_name.clone()))
                    .or_insert_with(|| ((*claim).clone(), Vec::new()))
                    .1
                    .push(pod.name_any());
            }
        }
        used.into_values().collect()
    }
}

/// The Ready condition's status and last transition (seconds since the epoch; the Unix epoch
/// when it has none, so a NotReady node without a time counts as down long since).
fn ready_condition(node: &Node) -> Option<(&str, i64)> {
    let condition = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    let since = condition
        .last_transition_time
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    Some((condition.status.as_str(), since))
}

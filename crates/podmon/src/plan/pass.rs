//! One pass of controller-podmon as data: which nodes' pods to clean up and why, which cleanups
//! wait and why, which crash-looping pods to delete, which VolumeAttachments undo a fence —
//! decided on the caches' objects, podmon's [`Memory`] and the clock, with no I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_kinds::cached::CachedAttachment;
use csi_sidecar::backoff::delay_for;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::ResourceExt;

use super::{
    CrashLoopDeletes, Extension, FencedTaint, MAINTENANCE_ANNOTATION, NO_SCHEDULE, NodeSignals,
    Objects, PodAction, Trigger, breaker_allows, evacuation_limit, has_taint, is_ready,
    loss_after_sample, node_name, pod_action, volumes_of,
};

/// How long crash-loop deletes of a pod that is gone are remembered (its StatefulSet may
/// recreate it).
pub const CRASH_LOOP_MEMORY: Duration = Duration::from_secs(600);

/// How long a node just tainted by a cleanup counts as tainted before the cache shows it.
pub const TAINT_CACHE_GRACE: Duration = Duration::from_secs(30);

/// What podmon remembers between passes.
#[derive(Debug, Default)]
pub struct Memory {
    /// Nodes with a cleanup running.
    pub busy: HashSet<String>,
    /// Per node: when to try again and how many cleanups failed in a row.
    pub backoff: HashMap<String, (Instant, u32)>,
    /// Crash-loop deletes per pod (namespace/name, so a recreated pod counts on; reset when
    /// the pod is Ready) and when the last was.
    pub crash_deletes: HashMap<String, (CrashLoopDeletes, Instant)>,
    /// Consecutive "not connected" samples per node.
    pub loss: HashMap<String, u32>,
    /// Nodes whose hold (breaker or maintenance) was already reported.
    pub held: HashSet<String>,
    /// UIDs of pods force-deleted, until the cache no longer shows them.
    pub cleaned: HashSet<String>,
    /// The nodes this controller fenced and tainted itself, with the PVs fenced (and when),
    /// kept fenced while the node carries our taint. Only on these is our taint believed
    /// ([`FencedTaint`]).
    pub fenced: HashMap<String, (BTreeSet<String>, Instant)>,
    /// Whether the driver serves the podmon extension; asked again until known.
    pub extension: Extension,
}

impl Memory {
    /// The fences still to keep: a node's entry stays while the node carries our taint, and
    /// until the cache shows the taint a cleanup just wrote.
    pub fn kept_fences(
        &mut self,
        fenced_nodes: &BTreeSet<String>,
        now: Instant,
    ) -> BTreeMap<String, BTreeSet<String>> {
        self.fenced.retain(|node, (_, since)| {
            fenced_nodes.contains(node) || now.duration_since(*since) < TAINT_CACHE_GRACE
        });
        self.fenced
            .iter()
            .map(|(node, (volumes, _))| (node.clone(), volumes.clone()))
            .collect()
    }

    /// Whether the crash-looping `pod` may be deleted now (at most
    /// [`super::MAX_CRASH_LOOP_DELETES`] times per pod name, once per incarnation); records it.
    pub fn admit_crash_delete(&mut self, pod: &Pod, now: Instant) -> bool {
        let (deletes, last) = self
            .crash_deletes
            .entry(key(pod))
            .or_insert_with(|| (CrashLoopDeletes::default(), now));
        if !deletes.admit(&uid(pod)) {
            return false;
        }
        *last = now;
        true
    }

    /// A cleanup fenced `volumes` from `node` and tainted it: the volumes stay fenced, and the
    /// node's taint is ours.
    pub fn tainted(&mut self, node: &str, volumes: &BTreeSet<String>, now: Instant) {
        let entry = self
            .fenced
            .entry(node.to_string())
            .or_insert_with(|| (BTreeSet::new(), now));
        entry.0.extend(volumes.iter().cloned());
        entry.1 = now;
    }

    /// A node's cleanup finished: its backoff and loss count go, and the pods it force-deleted
    /// are not looked at again. Whether it was a failover (it force-deleted pods: nothing left
    /// to clean, the pods gone meanwhile, is none).
    pub fn cleanup_succeeded(&mut self, node: &str, pods: Vec<String>) -> bool {
        self.busy.remove(node);
        self.backoff.remove(node);
        self.loss.remove(node);
        let failover = !pods.is_empty();
        self.cleaned.extend(pods);
        failover
    }

    /// A node's cleanup did not finish: it is retried after the returned delay (`start`,
    /// doubled on each failure in a row up to `max`).
    pub fn cleanup_failed(
        &mut self,
        node: &str,
        now: Instant,
        start: Duration,
        max: Duration,
    ) -> Duration {
        self.busy.remove(node);
        let failures = self.backoff.get(node).map_or(0, |(_, failures)| *failures);
        let delay = delay_for(start, max, failures);
        self.backoff
            .insert(node.to_string(), (now + delay, failures.saturating_add(1)));
        delay
    }

    /// Counts one connectivity sample of `node` ([`loss_after_sample`]); the new count.
    pub fn record_sample(&mut self, node: &str, connected: bool, plugin_up: bool) -> u32 {
        let previous = self.loss.get(node).copied().unwrap_or(0);
        let count = loss_after_sample(previous, connected, plugin_up);
        if count == 0 {
            self.loss.remove(node);
        } else {
            self.loss.insert(node.to_string(), count);
        }
        count
    }
}

/// `namespace/name` of a pod.
pub fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The nodes carrying our fenced taint, whoever put it there.
pub fn fenced_nodes(nodes: &[Arc<Node>], fenced_key: &str) -> BTreeSet<String> {
    nodes
        .iter()
        .filter(|n| has_taint(n, fenced_key, NO_SCHEDULE))
        .map(|n| n.name_any())
        .collect()
}

/// How many nodes run the driver (their CSINode lists it): the circuit breaker's base. Nodes
/// without the driver can neither fail over our pods nor be fenced by us, and counting them
/// would let a mass failure of the driver's nodes through in a cluster that has many others.
pub fn driver_node_count(csi_nodes: &[Arc<CSINode>], driver: &str) -> usize {
    csi_nodes
        .iter()
        .filter(|n| n.spec.drivers.iter().any(|d| d.name == driver))
        .count()
}

/// Per node hosting driver node pods: whether one of them is Ready. The driver-offline taint
/// follows it: a node whose driver pods are all not Ready gets it, one with a Ready one loses
/// it.
pub fn driver_readiness(driver_pods: &[Arc<Pod>]) -> BTreeMap<String, bool> {
    let mut ready_by_node: BTreeMap<String, bool> = BTreeMap::new();
    for pod in driver_pods {
        if let Some(node) = node_name(pod) {
            *ready_by_node.entry(node.to_string()).or_default() |= is_ready(pod);
        }
    }
    ready_by_node
}

/// The VolumeAttachments that undo a fence, per node: one of a volume a cleanup fenced from a
/// node still kept fenced, that no pod there uses (the attach/detach controller may re-create
/// it from a cache that still shows the deleted pod). Deleted, the attacher unpublishes it
/// again, so the zombie never gets its access back.
pub fn refenced_attachments(
    fences: &BTreeMap<String, BTreeSet<String>>,
    pods: &[Arc<Pod>],
    attachments: &[Arc<CachedAttachment>],
    objects: &impl Objects,
    driver: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut stale = BTreeMap::new();
    for (node, volumes) in fences {
        let in_use: BTreeSet<String> = pods
            .iter()
            .filter(|p| node_name(p) == Some(node.as_str()))
            .filter_map(|p| volumes_of(p, objects, driver).ok())
            .flatten()
            .map(|pv| pv.name_any())
            .collect();
        let names: BTreeSet<String> = attachments
            .iter()
            .filter(|va| &va.spec.node_name == node && va.spec.attacher == driver)
            .filter(|va| va.metadata.deletion_timestamp.is_none())
            .filter(|va| {
                va.spec
                    .source
                    .persistent_volume_name
                    .as_ref()
                    .is_some_and(|pv| volumes.contains(pv) && !in_use.contains(pv))
            })
            .map(|va| va.name_any())
            .collect();
        if !names.is_empty() {
            stale.insert(node.clone(), names);
        }
    }
    stale
}

/// The protected pods of one node to clean up, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub trigger: Trigger,
    pub signals: NodeSignals,
    pub pods: Vec<Arc<Pod>>,
}

/// What [`node_groups`] found.
#[derive(Debug, Default, PartialEq)]
pub struct Groups {
    /// Per node, the pods to clean up.
    pub nodes: BTreeMap<String, Group>,
    /// Crash-looping pods on healthy nodes, to delete if [`Memory::admit_crash_delete`] lets.
    pub crash_looping: Vec<Arc<Pod>>,
    /// Ready pods (`namespace/name`): their crash-loop deletes are forgotten.
    pub ready: Vec<String>,
}

/// Groups the protected pods by node: not Ready on a failed node → NodeFailure
/// ([`pod_action`]); on a node the driver reported disconnected for the loss threshold, with
/// our volumes and not being deleted → ArrayConnectivityLoss. Pods already force-deleted
/// (`cleaned`) are skipped.
pub fn node_groups(
    pods: &[Arc<Pod>],
    cleaned: &HashSet<String>,
    disconnected: &BTreeSet<String>,
    objects: &impl Objects,
    driver: &str,
    fenced: &FencedTaint<'_>,
) -> Groups {
    let mut groups = Groups::default();
    for pod in pods.iter().filter(|p| !cleaned.contains(&uid(p))) {
        let Some(node_name) = node_name(pod) else {
            continue;
        };
        let node = objects.node(node_name);
        match pod_action(pod, node.as_deref(), fenced) {
            PodAction::Nothing => {
                if is_ready(pod) {
                    groups.ready.push(key(pod));
                }
                // Connectivity concerns pods with our volumes only: the driver can say nothing
                // about the others.
                if disconnected.contains(node_name)
                    && pod.metadata.deletion_timestamp.is_none()
                    && volumes_of(pod, objects, driver).is_ok_and(|v| !v.is_empty())
                {
                    let signals = node
                        .map(|n| NodeSignals::of(&n, fenced))
                        .unwrap_or_default();
                    let group = groups.nodes.entry(node_name.to_string()).or_insert(Group {
                        trigger: Trigger::ArrayConnectivityLoss,
                        signals,
                        pods: Vec::new(),
                    });
                    // A node failed by Kubernetes' account is cleaned on that account; its
                    // Ready pods wait to be judged by the stricter rule of their own.
                    if group.trigger == Trigger::ArrayConnectivityLoss {
                        group.pods.push(pod.clone());
                    }
                }
            }
            PodAction::CleanUp(signals) => {
                let group = groups.nodes.entry(node_name.to_string()).or_insert(Group {
                    trigger: Trigger::NodeFailure,
                    signals,
                    pods: Vec::new(),
                });
                if group.trigger != Trigger::NodeFailure {
                    group.pods.clear();
                }
                group.trigger = Trigger::NodeFailure;
                group.signals = signals;
                group.pods.push(pod.clone());
            }
            PodAction::DeleteCrashLooping => groups.crash_looping.push(pod.clone()),
        }
    }
    groups
}

/// Why a node's cleanup waits (the Event's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Hold {
    #[error("the driver has not said yet whether it serves the podmon extension")]
    ExtensionUnknown,
    #[error("maintenance: PODMON_MAINTENANCE is on")]
    Maintenance,
    #[error("maintenance: the node is annotated for maintenance")]
    NodeMaintenance,
    #[error("circuit breaker: {evacuated} of {nodes} nodes already evacuated (limit {limit})")]
    CircuitBreaker {
        evacuated: usize,
        nodes: usize,
        limit: usize,
    },
}

/// What a pass does, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A (graceful, same UID only) delete of a crash-looping pod on a healthy node.
    DeleteCrashLooping(Arc<Pod>),
    /// Report that the node's cleanup waits (once per hold: the Events and the metric).
    Hold {
        node: String,
        group: Group,
        why: Hold,
    },
    /// Start the node's cleanup ([`super::cleanup`]); the node counts as busy from now.
    CleanUp {
        node: String,
        group: Group,
        extension: Extension,
    },
}

/// What a pass looks at besides the cached objects and podmon's memory.
#[derive(Debug, Clone, Copy)]
pub struct PassInput<'a> {
    /// The protected pods.
    pub pods: &'a [Arc<Pod>],
    /// The nodes carrying our fenced taint ([`fenced_nodes`]), whoever put it there: the
    /// circuit breaker counts them all (a forged taint may hold a cleanup, never start one).
    pub fenced_nodes: &'a BTreeSet<String>,
    /// How many nodes run the driver ([`driver_node_count`], the circuit breaker's base).
    pub node_count: usize,
    /// `PODMON_MAINTENANCE`.
    pub maintenance: bool,
    pub max_evacuated_fraction: f64,
    pub loss_threshold: u32,
    pub driver: &'a str,
    pub fenced_key: &'a str,
}

/// One pass: forgets what is gone, groups the pods by node ([`node_groups`]), admits
/// crash-loop deletes, and for each node with pods to clean — unless its cleanup runs or
/// backs off — holds it (the extension's answer unknown, maintenance, the circuit breaker) or
/// starts it. Records in `memory` what it decides (busy nodes, reported holds, crash-loop
/// deletes).
pub fn pass(
    memory: &mut Memory,
    input: &PassInput<'_>,
    objects: &impl Objects,
    now: Instant,
) -> Vec<Action> {
    let uids: HashSet<String> = input.pods.iter().map(|p| uid(p)).collect();
    memory.cleaned.retain(|uid| uids.contains(uid));
    let present: HashSet<String> = input.pods.iter().map(|p| key(p)).collect();
    memory.crash_deletes.retain(|key, (_, last)| {
        present.contains(key) || now.duration_since(*last) < CRASH_LOOP_MEMORY
    });
    let disconnected: BTreeSet<String> = memory
        .loss
        .iter()
        .filter(|(_, count)| **count >= input.loss_threshold)
        .map(|(node, _)| node.clone())
        .collect();
    let ours: BTreeSet<String> = memory.fenced.keys().cloned().collect();
    let fenced = FencedTaint {
        key: input.fenced_key,
        ours: &ours,
    };
    let groups = node_groups(
        input.pods,
        &memory.cleaned,
        &disconnected,
        objects,
        input.driver,
        &fenced,
    );
    for ready in &groups.ready {
        memory.crash_deletes.remove(ready);
    }
    let mut actions: Vec<Action> = groups
        .crash_looping
        .into_iter()
        .filter(|pod| memory.admit_crash_delete(pod, now))
        .map(Action::DeleteCrashLooping)
        .collect();
    for (node, group) in groups.nodes {
        let backing_off = memory.backoff.get(&node).is_some_and(|(at, _)| *at > now);
        if memory.busy.contains(&node) || backing_off {
            continue;
        }
        match admission(memory, input, objects, &node) {
            Some(why) => {
                if memory.held.insert(node.clone()) {
                    actions.push(Action::Hold { node, group, why });
                }
            }
            None => {
                memory.held.remove(&node);
                memory.busy.insert(node.clone());
                actions.push(Action::CleanUp {
                    node,
                    group,
                    extension: memory.extension,
                });
            }
        }
    }
    actions
}

/// Why `node`'s cleanup may not start now, if it may not.
fn admission(
    memory: &Memory,
    input: &PassInput<'_>,
    objects: &impl Objects,
    node: &str,
) -> Option<Hold> {
    if memory.extension == Extension::Unknown {
        return Some(Hold::ExtensionUnknown);
    }
    let paused_node = objects
        .node(node)
        .and_then(|n| n.annotations().get(MAINTENANCE_ANNOTATION).cloned())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if input.maintenance {
        return Some(Hold::Maintenance);
    }
    if paused_node {
        return Some(Hold::NodeMaintenance);
    }
    // Evacuated: tainted by us, being cleaned up, or cleaned up with the taint not yet in the
    // cache (the next pass can come before the taint's watch event does).
    let evacuated: BTreeSet<&str> = input
        .fenced_nodes
        .iter()
        .chain(memory.busy.iter())
        .chain(memory.fenced.keys())
        .map(String::as_str)
        .collect();
    if breaker_allows(
        node,
        evacuated.iter().copied(),
        input.node_count,
        input.max_evacuated_fraction,
    ) {
        None
    } else {
        Some(Hold::CircuitBreaker {
            evacuated: evacuated.len(),
            nodes: input.node_count,
            limit: evacuation_limit(input.node_count, input.max_evacuated_fraction),
        })
    }
}

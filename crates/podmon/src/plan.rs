//! The pure core: what podmon's taints are called, when a protected pod must be cleaned up,
//! whether the driver's connectivity answer allows it, whether the circuit breaker does, and
//! how node mode judges a remembered pod; controller-podmon's pass ([`pass()`]) and a node's
//! cleanup ([`cleanup()`]) as plans the adapter executes. No I/O here.

use std::collections::BTreeSet;
use std::sync::Arc;

use csi_kinds::cached::{CachedClaim, CachedVolume};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

mod cleanup;
mod pass;

pub use cleanup::{
    Cleanup, CleanupInput, PENDING_RETRIES, Recheck, Refusal, Step, cleanup, cleanup_taints,
    confirmed, fence_retry, node_id, volumes_of,
};
pub use pass::{
    Action, CRASH_LOOP_MEMORY, Group, Groups, Hold, Memory, PassInput, TAINT_CACHE_GRACE,
    driver_node_count, driver_readiness, fenced_nodes, key, node_groups, pass,
    refenced_attachments, uid,
};

/// The cached objects the plans look up by name: the controller's reflector stores, plain maps
/// in tests.
pub trait Objects {
    fn node(&self, name: &str) -> Option<Arc<Node>>;
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<CachedClaim>>;
    fn volume(&self, name: &str) -> Option<Arc<CachedVolume>>;
    fn csi_node(&self, name: &str) -> Option<Arc<CSINode>>;
}

pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// A node annotation (value `true`) that pauses podmon's cleanup of that node.
pub const MAINTENANCE_ANNOTATION: &str = "podmon.csi-suite.io/maintenance";

/// CrashLoopBackOff deletes per pod before podmon gives up on it (Dell's limit).
pub const MAX_CRASH_LOOP_DELETES: u32 = 5;

/// The crash-loop deletes of one pod name, until it is Ready again.
#[derive(Debug, Clone, Default)]
pub struct CrashLoopDeletes {
    count: u32,
    /// The incarnation deleted last: a cache that has not seen its deletion yet still shows it
    /// crash-looping, and deleting it again would spend one of the five on nothing.
    last_uid: String,
}

impl CrashLoopDeletes {
    /// Whether the pod incarnation `uid` may be deleted now; records the delete when it may.
    pub fn admit(&mut self, uid: &str) -> bool {
        if self.count >= MAX_CRASH_LOOP_DELETES || self.last_uid == uid {
            return false;
        }
        self.count += 1;
        self.last_uid = uid.to_string();
        true
    }
}

/// The Node annotation kubelet writes on plugin registration: a JSON map of driver name → CSI
/// node ID, one entry per registered driver. Not the VolumeAttachment annotation of the node ID
/// an attach used (`csi_kinds::volume_attachment::NODE_ID_ANNOTATION`, another string).
pub const NODE_IDS_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// The first DNS label of the driver name, lower-cased, other characters as '-':
/// `hostpath.csi-suite.io` → `hostpath`.
pub fn short_driver_name(driver: &str) -> String {
    let first = driver.split('.').next().unwrap_or(driver);
    let short: String = first
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let short = short.trim_matches('-');
    if short.is_empty() {
        "csi".to_string()
    } else {
        short.to_string()
    }
}

/// The taint podmon puts on a node it fenced (NoSchedule): `<short>.podmon.storage/fenced`.
pub fn fenced_taint_key(driver: &str) -> String {
    format!("{}.podmon.storage/fenced", short_driver_name(driver))
}

/// The taint on a node whose driver node pod is not Ready (NoSchedule):
/// `<short>.podmon.storage/driver-offline`.
pub fn offline_taint_key(driver: &str) -> String {
    format!(
        "{}.podmon.storage/driver-offline",
        short_driver_name(driver)
    )
}

/// The Lease of the elected controller: `podmon-<driver>` (Dell's `podmon-1` is not
/// instance-scoped, so two drivers' podmons would share it).
pub fn lease_name(driver: &str) -> String {
    format!("podmon-{driver}")
}

pub fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    taints(node)
        .iter()
        .any(|t| t.key == key && t.effect == effect)
}

pub fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// `current` with the taint added first (as Dell does), or `None` when it is already there
/// (matched on key and effect).
pub fn with_taint(
    current: &[Taint],
    key: &str,
    value: &str,
    effect: &str,
    now: Time,
) -> Option<Vec<Taint>> {
    if current.iter().any(|t| t.key == key && t.effect == effect) {
        return None;
    }
    let taint = Taint {
        key: key.to_string(),
        value: (!value.is_empty()).then(|| value.to_string()),
        effect: effect.to_string(),
        time_added: Some(now),
    };
    Some(
        std::iter::once(taint)
            .chain(current.iter().cloned())
            .collect(),
    )
}

/// `current` without the taints of `key` (any effect), or `None` when there is none.
pub fn without_taint(current: &[Taint], key: &str) -> Option<Vec<Taint>> {
    current
        .iter()
        .any(|t| t.key == key)
        .then(|| current.iter().filter(|t| t.key != key).cloned().collect())
}

/// Our fenced taint as evidence that a node failed: its key, and the nodes this controller
/// tainted itself ([`Memory::fenced`]). Node-podmon may write Nodes to lift the taint — on a
/// cluster without the chart's admission policy (Kubernetes before 1.30), any Node — so the
/// key on any other node may be forged: it never starts a cleanup, nor outweighs the driver's
/// "connected". (After a restart, until a node fails again, none is believed: podmon then
/// waits for Kubernetes' unreachable taint, as on a first failure.)
#[derive(Debug, Clone, Copy)]
pub struct FencedTaint<'a> {
    pub key: &'a str,
    pub ours: &'a BTreeSet<String>,
}

impl FencedTaint<'_> {
    /// The node carries the taint, and this controller put it there.
    pub fn on(&self, node: &Node) -> bool {
        has_taint(node, self.key, NO_SCHEDULE)
            && node
                .metadata
                .name
                .as_ref()
                .is_some_and(|name| self.ours.contains(name))
    }
}

/// What the node's taints say about it. The driver-offline taint is not among them, unlike
/// Dell's: a driver node pod that is not Ready (a DaemonSet rollout restarts each one) says
/// nothing about the node's pods or storage, so it keeps new pods away (NoSchedule) and no
/// more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeSignals {
    pub unreachable_no_schedule: bool,
    pub unreachable_no_execute: bool,
    /// Our fenced taint, put there by this controller ([`FencedTaint::on`]): podmon fenced the
    /// node before.
    pub podmon: bool,
}

impl NodeSignals {
    pub fn of(node: &Node, fenced: &FencedTaint<'_>) -> Self {
        Self {
            unreachable_no_schedule: has_taint(node, UNREACHABLE_TAINT, NO_SCHEDULE),
            unreachable_no_execute: has_taint(node, UNREACHABLE_TAINT, NO_EXECUTE),
            podmon: fenced.on(node),
        }
    }

    pub fn failed(self) -> bool {
        self.unreachable() || self.podmon
    }

    fn unreachable(self) -> bool {
        self.unreachable_no_schedule || self.unreachable_no_execute
    }
}

/// The node's Ready condition is True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn is_crash_looping(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| {
            statuses.iter().any(|s| {
                s.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
            })
        })
}

pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The claims a pod's volumes use: `persistentVolumeClaim` ones and the claims of generic
/// ephemeral volumes (`<pod>-<volume>`).
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(
            |volume| match (&volume.persistent_volume_claim, &volume.ephemeral) {
                (Some(claim), _) => Some(claim.claim_name.clone()),
                (None, Some(_)) => Some(format!(
                    "{}-{}",
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    volume.name
                )),
                _ => None,
            },
        )
        .collect()
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// What the controller does about one protected pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    Nothing,
    /// Not Ready on a failed node: fence, taint, delete its VolumeAttachments, force-delete.
    CleanUp(NodeSignals),
    /// Crash-looping on a healthy node: a (graceful) delete, so it is recreated.
    DeleteCrashLooping,
}

/// Dell's trigger: a scheduled pod that is not Ready, on a node with the unreachable taint
/// (NoSchedule or NoExecute) or our fenced taint (one we put there) → clean up; else not
/// Ready and crash-looping → delete. Finished pods are left alone, and so are pods someone
/// already deletes (forcing that deletion would race whoever decided it).
pub fn pod_action(pod: &Pod, node: Option<&Node>, fenced: &FencedTaint<'_>) -> PodAction {
    if is_ready(pod)
        || node_name(pod).is_none()
        || matches!(phase(pod), Some("Succeeded" | "Failed"))
    {
        return PodAction::Nothing;
    }
    let signals = node.map(|n| NodeSignals::of(n, fenced)).unwrap_or_default();
    // A pod being deleted on a failed node (e.g. evicted by the unreachable NoExecute taint)
    // stays Terminating until its kubelet confirms, which a dead kubelet never does: it is
    // cleaned up like any other.
    if signals.failed() {
        PodAction::CleanUp(signals)
    } else if is_crash_looping(pod) && pod.metadata.deletion_timestamp.is_none() {
        PodAction::DeleteCrashLooping
    } else {
        PodAction::Nothing
    }
}

/// Whether the driver serves the podmon extension (`podmon.v1.Podmon`), as far as podmon knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Extension {
    Served,
    NotServed,
    /// The presence probe got no answer yet: no cleanup may rest on taints alone meanwhile.
    #[default]
    Unknown,
}

impl Extension {
    /// From the presence probe (an empty ValidateVolumeHostConnectivity): an answer means
    /// served, only UNIMPLEMENTED means not served; any other error (a timeout, the driver
    /// unavailable or restarting) says nothing.
    pub fn from_probe(outcome: Result<(), tonic::Code>) -> Self {
        match outcome {
            Ok(()) => Self::Served,
            Err(tonic::Code::Unimplemented) => Self::NotServed,
            Err(_) => Self::Unknown,
        }
    }
}

/// Why a cleanup was triggered (the Event reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    NodeFailure,
    ArrayConnectivityLoss,
}

impl Trigger {
    pub fn reason(self) -> &'static str {
        match self {
            Trigger::NodeFailure => "NodeFailure",
            Trigger::ArrayConnectivityLoss => "ArrayConnectivityLoss",
        }
    }
}

/// The driver's connectivity answer for a node and the pods' volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connectivity {
    Answer {
        connected: bool,
        ios_in_progress: bool,
    },
    /// The call failed: we know nothing.
    Error,
}

/// Whether cleanup may go on after the driver's answer.
///
/// NodeFailure (Dell's rule): abort when the node is still connected (unless our fenced taint
/// says it failed before), when I/O is in progress (ignored for ReadWriteMany volumes, which
/// several nodes may write), or on an error — unless `--skipArrayConnectionValidation` and the
/// node has the unreachable NoExecute taint.
///
/// ArrayConnectivityLoss — Ready pods on a node Kubernetes still sees Ready: only the driver's
/// own "not connected and no I/O in progress" for the pods' volumes, asked right before acting,
/// allows it. Nothing overrides it (as Dell, which ignores its taints on this path; and unlike
/// Dell, not RWX either: a Ready pod's own I/O on such a volume shows the node reaches it).
pub fn validation_allows(
    trigger: Trigger,
    answer: Connectivity,
    rwx: bool,
    signals: NodeSignals,
    skip_validation: bool,
) -> Result<(), &'static str> {
    if trigger == Trigger::ArrayConnectivityLoss {
        return match answer {
            Connectivity::Answer {
                connected: false,
                ios_in_progress: false,
            } => Ok(()),
            Connectivity::Answer { .. } => Err("array connected or recent I/O"),
            Connectivity::Error => Err("due to error while validating volume host connectivity"),
        };
    }
    let verdict = match answer {
        Connectivity::Error => Err("due to error while validating volume host connectivity"),
        Connectivity::Answer {
            connected,
            ios_in_progress,
        } => {
            if (connected && !signals.podmon) || (ios_in_progress && !rwx) {
                Err("array connected or recent I/O")
            } else {
                Ok(())
            }
        }
    };
    if verdict.is_err() && skip_validation && signals.unreachable_no_execute {
        return Ok(());
    }
    verdict
}

/// The loss count of a node after one connectivity sample: "connected" resets it, and so does
/// a sample taken while the node's driver plugin is down (not Ready): a plugin that is not
/// running cannot report the node, and its silence (a heartbeat gap, a rollout) is no evidence
/// that the node lost its storage.
pub fn loss_after_sample(previous: u32, connected: bool, plugin_up: bool) -> u32 {
    if connected || !plugin_up {
        0
    } else {
        previous + 1
    }
}

/// Whether the driver's node plugin on a node can be believed running: the node has no
/// driver-offline taint and, if it has driver node pods, one of them is Ready and not being
/// deleted. (Without driver node pods podmon cannot tell, and goes by the driver's word.)
pub fn plugin_up<'a>(
    node: Option<&Node>,
    offline_key: &str,
    driver_pods: impl IntoIterator<Item = &'a Pod>,
) -> bool {
    if node.is_some_and(|n| has_taint(n, offline_key, NO_SCHEDULE)) {
        return false;
    }
    let mut any = false;
    for pod in driver_pods {
        if is_ready(pod) && pod.metadata.deletion_timestamp.is_none() {
            return true;
        }
        any = true;
    }
    !any
}

/// Whether the node still shows the failure a NodeFailure cleanup was decided on, read live
/// right before acting: decided on the unreachable taint, the node must still carry it and not
/// be Ready; decided on our fenced taint alone (one we put there), that taint must still be
/// there.
pub fn node_still_failed(
    decided: NodeSignals,
    live: &Node,
    fenced_key: &str,
) -> Result<(), &'static str> {
    if decided.unreachable() {
        if !has_taint(live, UNREACHABLE_TAINT, NO_SCHEDULE)
            && !has_taint(live, UNREACHABLE_TAINT, NO_EXECUTE)
        {
            return Err("the node is no longer unreachable");
        }
        if node_is_ready(live) {
            return Err("the node is Ready again");
        }
        Ok(())
    } else if has_taint(live, fenced_key, NO_SCHEDULE) {
        Ok(())
    } else {
        Err("the node's podmon taint is gone")
    }
}

/// Whether the pod decided on (by UID) may still be force-deleted, read live right before: it
/// must still be that pod. A graceful deletion already under way (taint eviction) is finished
/// with grace 0, since the failed node's kubelet will never confirm it.
pub fn pod_still_to_delete(uid: &str, live: Option<&Pod>) -> Result<(), &'static str> {
    match live {
        None => Err("the pod is gone"),
        Some(pod) if pod.metadata.uid.as_deref() != Some(uid) => Err("the pod was replaced"),
        Some(_) => Ok(()),
    }
}

/// The circuit breaker: how many nodes may be evacuated (fenced and tainted) at once — the
/// fraction of the driver's nodes, rounded down, but never less than one.
pub fn evacuation_limit(total_nodes: usize, fraction: f64) -> usize {
    let limit = (total_nodes as f64 * fraction + 1e-9).floor() as usize;
    limit.max(1)
}

/// May `node` be evacuated, given the nodes already fenced or being cleaned (`evacuated`)?
pub fn breaker_allows<'a>(
    node: &str,
    evacuated: impl IntoIterator<Item = &'a str>,
    total_nodes: usize,
    fraction: f64,
) -> bool {
    let mut others = 0;
    for name in evacuated {
        if name == node {
            return true;
        }
        others += 1;
    }
    others < evacuation_limit(total_nodes, fraction)
}

/// The pods (as `namespace/name`) other than `except_uid` and not finished that use the claim
/// `namespace/claim`.
pub fn pods_using_claim(
    pods: &[Pod],
    namespace: &str,
    claim: &str,
    except_uid: &str,
) -> Vec<String> {
    pods.iter()
        .filter(|p| p.metadata.uid.as_deref() != Some(except_uid))
        .filter(|p| !matches!(phase(p), Some("Succeeded" | "Failed")))
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| claim_names(p).iter().any(|c| c == claim))
        .map(|p| {
            format!(
                "{namespace}/{}",
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

/// How node mode judges a remembered pod against what the API says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remembered {
    /// The same pod (same UID) still exists: the controller has not replaced it; its volumes
    /// stay and the taint stays.
    StillThere,
    /// Gone or replaced (a new UID): a zombie whose mounts must be cleaned.
    Zombie,
}

pub fn judge(remembered_uid: &str, current: Option<&Pod>) -> Remembered {
    match current {
        Some(pod) if pod.metadata.uid.as_deref() == Some(remembered_uid) => Remembered::StillThere,
        _ => Remembered::Zombie,
    }
}

#[cfg(test)]
mod tests;

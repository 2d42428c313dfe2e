//! One node's cleanup as data: which pods and volumes, the node ID, the VolumeAttachments, and
//! the steps in the order the adapter runs them — decided on the caches' objects, with no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use csi_kinds::cached::{CachedAttachment, CachedVolume};
use csi_kinds::kubelet_paths;
use csi_kinds::secrets::SecretRef;
use csi_kinds::volume_attachment::{NODE_ID_ANNOTATION, unpublish_request};
use csi_proto::csi::v1 as csi;
use csi_proto::podmon::v1 as podmon_v1;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::pass::{Group, key, uid};
use super::{
    Extension, NO_EXECUTE, NO_SCHEDULE, NODE_IDS_ANNOTATION, NodeSignals, OUT_OF_SERVICE_TAINT,
    OUT_OF_SERVICE_VALUE, Objects, Trigger, claim_names, node_name, with_taint,
};

/// ControllerUnpublishVolume attempts while the driver answers ABORTED (an operation on the
/// volume is pending).
pub const PENDING_RETRIES: u32 = 20;

/// Why a cleanup stops before it finished, as far as the plans tell (the Event's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("due to missing CSI annotations")]
    MissingNodeId,
    #[error("the pods changed since the decision")]
    PodsChanged,
    /// The driver's answer or the live node does not allow it ([`super::validation_allows`],
    /// [`super::node_still_failed`]).
    #[error("{0}")]
    Refused(&'static str),
    #[error("PersistentVolume {pv} of pod {pod} is not known yet")]
    UnknownVolume { pv: String, pod: String },
}

impl Refusal {
    /// The evidence does not allow the cleanup (else a cached object it needs is missing).
    pub fn aborted(&self) -> bool {
        !matches!(self, Refusal::UnknownVolume { .. })
    }
}

/// Our driver's PVs a pod uses through bound claims (also generic ephemeral volumes'); a bound
/// PV not cached yet is an error.
pub fn volumes_of(
    pod: &Pod,
    objects: &impl Objects,
    driver: &str,
) -> Result<Vec<Arc<CachedVolume>>, Refusal> {
    let namespace = pod.namespace().unwrap_or_default();
    let mut volumes = Vec::new();
    for claim in claim_names(pod) {
        let Some(claim) = objects.claim(&namespace, &claim) else {
            continue;
        };
        let Some(pv_name) = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let pv = objects
            .volume(&pv_name)
            .ok_or_else(|| Refusal::UnknownVolume {
                pv: pv_name.clone(),
                pod: key(pod),
            })?;
        let ours = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == driver);
        if ours {
            volumes.push(pv);
        } else {
            tracing::warn!(pod = %key(pod), pv = %pv_name, "the pod uses a volume of another driver; podmon cannot fence it");
        }
    }
    Ok(volumes)
}

/// The CSI node ID of a node for `driver`: the attacher's annotation on a VolumeAttachment
/// there, else the CSINode, else kubelet's node annotation.
pub fn node_id(
    driver: &str,
    attachments: &[Arc<CachedAttachment>],
    csi_node: Option<&CSINode>,
    node: Option<&Node>,
) -> Option<String> {
    let from_attachment = attachments.iter().find_map(|va| {
        va.annotations()
            .get(NODE_ID_ANNOTATION)
            .filter(|id| !id.is_empty())
            .cloned()
    });
    let from_csi_node = || {
        csi_node?
            .spec
            .drivers
            .iter()
            .find(|d| d.name == driver)
            .map(|d| d.node_id.clone())
    };
    let from_annotation = || {
        let ids: BTreeMap<String, String> =
            serde_json::from_str(node?.annotations().get(NODE_IDS_ANNOTATION)?).ok()?;
        ids.get(driver).cloned()
    };
    from_attachment
        .or_else(from_csi_node)
        .or_else(from_annotation)
        .filter(|id| !id.is_empty())
}

/// The node's taints after a cleanup tainted it: our fenced taint and, with
/// `--out-of-service-taint`, Kubernetes' out-of-service taint; `None` when both are there.
pub fn cleanup_taints(
    current: &[Taint],
    fenced_key: &str,
    out_of_service: bool,
    now: &Time,
) -> Option<Vec<Taint>> {
    let taints = with_taint(current, fenced_key, "", NO_SCHEDULE, now.clone());
    if !out_of_service {
        return taints;
    }
    let base = taints.clone().unwrap_or_else(|| current.to_vec());
    with_taint(
        &base,
        OUT_OF_SERVICE_TAINT,
        OUT_OF_SERVICE_VALUE,
        NO_EXECUTE,
        now.clone(),
    )
    .or(taints)
}

/// Whether a ControllerUnpublishVolume that failed with `code` on attempt `attempt` is tried
/// again: ABORTED means another operation on the volume is pending — usually the attacher's
/// own unpublish of the VolumeAttachment just deleted. Dell retries its driver's "pending"
/// errors the same way.
pub fn fence_retry(code: tonic::Code, attempt: u32) -> bool {
    code == tonic::Code::Aborted && attempt < PENDING_RETRIES
}

/// What the live node and pods must still show, read right before a step: with `node` (a
/// NodeFailure, decided on those signals) the node must still be failed
/// ([`super::node_still_failed`]); the pods must still be the ones decided on
/// ([`super::pod_still_to_delete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recheck {
    pub node: Option<NodeSignals>,
}

/// One step of a node's cleanup.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Ask the driver (podmon extension) whether the node may be cleaned up;
    /// [`super::validation_allows`] judges the answer (`rwx`: a volume is ReadWriteMany).
    Validate {
        request: podmon_v1::ValidateVolumeHostConnectivityRequest,
        rwx: bool,
    },
    /// The caches may lag: before the first step that cannot be undone, the live objects must
    /// still show what the decision rested on — every pod of the cleanup, or it aborts
    /// ([`confirmed`]).
    ConfirmLive(Recheck),
    /// Delete these VolumeAttachments (gone ones are fine). A deleting VolumeAttachment is one
    /// the attacher will not publish again (its reconcile re-publishes attached ones the
    /// driver lost), so they go before the fence.
    DeleteAttachments(BTreeSet<String>),
    /// ControllerUnpublishVolume of a PV from the node (the request without the secrets of
    /// `secret`, to be read): after it, the node's writes cannot reach the volume.
    Fence {
        pv: String,
        request: csi::ControllerUnpublishVolumeRequest,
        secret: Option<SecretRef>,
    },
    /// The driver cannot unpublish volumes: the node is tainted without fencing (a warning).
    CannotFence,
    /// Taint the node ([`cleanup_taints`]).
    Taint,
    /// Fencing and tainting took time: read again right before, then force-delete the pods
    /// that are still the ones decided on (the others are left out).
    ForceDelete(Recheck),
}

/// A node's cleanup: its pods (`namespace/name`), the PVs fenced, the steps in order. No pods,
/// no steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cleanup {
    pub pods: BTreeMap<String, Arc<Pod>>,
    pub volumes: BTreeSet<String>,
    pub steps: Vec<Step>,
}

/// What a node's cleanup rests on besides the cached objects.
#[derive(Debug, Clone, Copy)]
pub struct CleanupInput<'a> {
    pub node: &'a str,
    /// The pods as decided by the pass.
    pub group: &'a Group,
    pub extension: Extension,
    /// The protected pods cached now.
    pub pods: &'a [Arc<Pod>],
    /// The VolumeAttachments cached now.
    pub attachments: &'a [Arc<CachedAttachment>],
    pub driver: &'a str,
    /// The driver can fence (PUBLISH_UNPUBLISH_VOLUME).
    pub can_fence: bool,
    pub ignore_volumeless_pods: bool,
}

/// Plans a node's cleanup. The pods are the group's as the cache has them now (a replaced pod
/// has a new UID and is skipped), plus the protected pods on the node that share a volume with
/// them (fencing is per node and volume, so pods sharing a volume there share its fate);
/// volumeless ones are left out with `--ignoreVolumelessPods`. With volumes, the node ID must be
/// known, and the driver is asked when it serves the extension.
pub fn cleanup(input: &CleanupInput<'_>, objects: &impl Objects) -> Result<Cleanup, Refusal> {
    let (node, driver) = (input.node, input.driver);
    let cached: BTreeMap<String, &Arc<Pod>> = input
        .pods
        .iter()
        .filter(|p| node_name(p) == Some(node))
        .map(|p| (key(p), p))
        .collect();
    let mut pods: BTreeMap<String, Arc<Pod>> = input
        .group
        .pods
        .iter()
        .filter_map(|p| {
            cached
                .get(&key(p))
                .filter(|c| uid(c) == uid(p))
                .map(|c| (key(c), Arc::clone(c)))
        })
        .collect();
    let mut volumes: BTreeMap<String, Arc<CachedVolume>> = BTreeMap::new();
    for pod in pods.values() {
        for pv in volumes_of(pod, objects, driver)? {
            volumes.insert(pv.name_any(), pv);
        }
    }
    for (name, pod) in &cached {
        if pods.contains_key(name) {
            continue;
        }
        if volumes_of(pod, objects, driver)?
            .iter()
            .any(|pv| volumes.contains_key(&pv.name_any()))
        {
            tracing::warn!(pod = %name, node = %node, "cleaning a pod that shares a fenced volume on the node");
            pods.insert(name.clone(), Arc::clone(pod));
        }
    }
    if input.ignore_volumeless_pods {
        let mut kept = BTreeMap::new();
        for (name, pod) in pods {
            if !volumes_of(&pod, objects, driver)?.is_empty() {
                kept.insert(name, pod);
            }
        }
        pods = kept;
    }
    if pods.is_empty() {
        return Ok(Cleanup::default());
    }
    let attachments: Vec<Arc<CachedAttachment>> = input
        .attachments
        .iter()
        .filter(|va| va.spec.node_name == node && va.spec.attacher == driver)
        .filter(|va| {
            va.spec
                .source
                .persistent_volume_name
                .as_ref()
                .is_some_and(|pv| volumes.contains_key(pv))
        })
        .cloned()
        .collect();
    // The VolumeAttachments to delete: the cached ones and the names the attach/detach
    // controller gives (a VA it re-creates may not be cached yet).
    let mut attachment_names: BTreeSet<String> =
        attachments.iter().map(|va| va.name_any()).collect();
    attachment_names.extend(volumes.values().filter_map(|pv| {
        let handle = &pv.spec.as_ref()?.csi.as_ref()?.volume_handle;
        Some(kubelet_paths::attachment_name(handle, driver, node))
    }));

    let Group {
        trigger, signals, ..
    } = *input.group;
    let recheck = Recheck {
        node: (trigger == Trigger::NodeFailure).then_some(signals),
    };
    let mut steps = Vec::new();
    let mut fences = Vec::new();
    if !volumes.is_empty() {
        let node_id = node_id(
            driver,
            &attachments,
            objects.csi_node(node).as_deref(),
            objects.node(node).as_deref(),
        )
        .ok_or(Refusal::MissingNodeId)?;
        if input.extension == Extension::Served {
            steps.push(Step::Validate {
                request: podmon_v1::ValidateVolumeHostConnectivityRequest {
                    volume_ids: volumes
                        .values()
                        .filter_map(|pv| {
                            Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone())
                        })
                        .collect(),
                    node_id: node_id.clone(),
                    ..Default::default()
                },
                rwx: volumes.values().any(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.access_modes.as_ref())
                        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteMany"))
                }),
            });
        }
        if input.can_fence {
            fences.extend(volumes.iter().filter_map(|(pv_name, pv)| {
                let source = pv.spec.as_ref()?.csi.as_ref()?;
                Some(Step::Fence {
                    pv: pv_name.clone(),
                    request: unpublish_request(&source.volume_handle, &node_id, Default::default()),
                    secret: source
                        .controller_publish_secret_ref
                        .as_ref()
                        .map(|r| SecretRef {
                            name: r.name.clone().unwrap_or_default(),
                            namespace: r.namespace.clone().unwrap_or_default(),
                        }),
                })
            }));
        } else {
            fences.push(Step::CannotFence);
        }
    }
    steps.push(Step::ConfirmLive(recheck));
    steps.push(Step::DeleteAttachments(attachment_names));
    steps.extend(fences);
    steps.push(Step::Taint);
    steps.push(Step::ForceDelete(recheck));
    Ok(Cleanup {
        pods,
        volumes: volumes.into_keys().collect(),
        steps,
    })
}

/// After [`Step::ConfirmLive`]: every pod decided on must still be there.
pub fn confirmed(
    decided: &BTreeMap<String, Arc<Pod>>,
    still: &BTreeMap<String, Arc<Pod>>,
) -> Result<(), Refusal> {
    if still.len() == decided.len() {
        Ok(())
    } else {
        Err(Refusal::PodsChanged)
    }
}

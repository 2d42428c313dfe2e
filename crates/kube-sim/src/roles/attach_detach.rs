//! The attach/detach controller of kube-controller-manager for CSI volumes
//! (pkg/controller/volume/attachdetach, pkg/volume/csi/csi_attacher.go): every CSI volume a
//! scheduled pod uses gets a VolumeAttachment `csi-<sha256(handle + driver + node)>` when its
//! driver requires attach; it is deleted once no pod on that node uses the volume and the
//! kubelet no longer reports it in use (or the node is gone, or out of service).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::kubelet::{CONTROLLER_MANAGED_ATTACH_ANNOTATION, attachment_name, unique_volume_name};
use super::scheduling::node_ready_status;
use super::{Informers, RoleError, Timing, is_benign, lock, merge_patch_status, reconcile_loop};

/// How long a detach waits for the kubelet to unmount (`maxWaitForUnmountDuration`).
pub const MAX_WAIT_FOR_UNMOUNT: Duration = Duration::from_secs(6 * 60);

/// How often the controller checks that what it attached is still attached
/// (`--attach-detach-reconcile-sync-period`, 1m): a VolumeAttachment someone else deleted is
/// noticed — and re-created if a pod still wants it — only then, not at once (the real
/// controller keeps its actual state of the world in memory).
pub const RECONCILE_SYNC_PERIOD: Duration = Duration::from_secs(60);

/// The taint that lets a volume be detached from a node that is down without unmounting.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

struct Caches {
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    drivers: Store<CSIDriver>,
    attachments: Store<VolumeAttachment>,
    nodes: Store<Node>,
}

/// A VolumeAttachment the controller wants.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Desired {
    name: String,
    driver: String,
    node: String,
    volume: String,
}

pub async fn run(
    client: Client,
    timing: Timing,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let mut informers = Informers::new(&client, &shutdown);
    let caches = Arc::new(Caches {
        pods: informers.all(),
        claims: informers.all(),
        volumes: informers.all(),
        drivers: informers.all(),
        attachments: informers.all(),
        nodes: informers.all(),
    });
    let Some(wake) = informers.synced().await else {
        return Ok(());
    };
    let waiting_since = Arc::new(Mutex::new(HashMap::new()));
    let attached = Arc::new(Mutex::new(HashMap::new()));
    reconcile_loop("attach-detach", wake, timing.resync, shutdown, || {
        pass(
            client.clone(),
            caches.clone(),
            waiting_since.clone(),
            attached.clone(),
        )
    })
    .await;
    Ok(())
}

fn controller_managed(node: &Node) -> bool {
    node.annotations()
        .get(CONTROLLER_MANAGED_ATTACH_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// The attachments scheduled, non-terminated pods need.
fn desired(caches: &Caches) -> BTreeMap<String, Desired> {
    let mut wanted = BTreeMap::new();
    for pod in caches.pods.state() {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        if !caches
            .nodes
            .get(&ObjectRef::new(&node))
            .is_some_and(|n| controller_managed(&n))
        {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        for volume in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default()
        {
            let Some(source) = volume.persistent_volume_claim else {
                continue;
            };
            let Some(pv_name) = caches
                .claims
                .get(&ObjectRef::new(&source.claim_name).within(&namespace))
                .and_then(|c| c.spec.as_ref()?.volume_name.clone())
            else {
                continue;
            };
            let Some(csi) = caches
                .volumes
                .get(&ObjectRef::new(&pv_name))
                .and_then(|pv| pv.spec.clone()?.csi)
            else {
                continue;
            };
            let attach_required = caches
                .drivers
                .get(&ObjectRef::new(&csi.driver))
                .is_none_or(|d| d.spec.attach_required.unwrap_or(true));
            if !attach_required {
                continue;
            }
            let name = attachment_name(&csi.volume_handle, &csi.driver, &node);
            wanted.insert(
                name.clone(),
                Desired {
                    name,
                    driver: csi.driver,
                    node: node.clone(),
                    volume: pv_name,
                },
            );
        }
    }
    wanted
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// The volume's name in `node.status.volumesInUse` / `volumesAttached`.
fn unique_name_of(caches: &Caches, attachment: &VolumeAttachment) -> Option<String> {
    let pv = attachment.spec.source.persistent_volume_name.as_deref()?;
    let csi = caches.volumes.get(&ObjectRef::new(pv))?.spec.clone()?.csi?;
    Some(unique_volume_name(&csi.driver, &csi.volume_handle))
}

/// `attached`: the actual state of the world — VolumeAttachments this controller saw, and
/// since when one it saw is gone (`None`: still there).
async fn pass(
    client: Client,
    caches: Arc<Caches>,
    waiting_since: Arc<Mutex<HashMap<String, Instant>>>,
    attached: Arc<Mutex<HashMap<String, Option<Instant>>>>,
) -> Result<(), RoleError> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let wanted = desired(&caches);
    lock(&attached).retain(|name, _| wanted.contains_key(name));
    for want in wanted.values() {
        if caches
            .attachments
            .get(&ObjectRef::new(&want.name))
            .is_some()
        {
            lock(&attached).insert(want.name.clone(), None);
            continue;
        }
        {
            let mut attached = lock(&attached);
            match attached.get(&want.name) {
                Some(None) => {
                    attached.insert(want.name.clone(), Some(Instant::now()));
                    continue;
                }
                Some(Some(gone)) if gone.elapsed() < RECONCILE_SYNC_PERIOD => continue,
                _ => {}
            }
        }
        let attachment: VolumeAttachment = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": want.name},
            "spec": {"attacher": want.driver, "nodeName": want.node, "source": {"persistentVolumeName": want.volume}},
        }))
        .map_err(|e| RoleError::Invalid(e.to_string()))?;
        match api.create(&PostParams::default(), &attachment).await {
            Ok(_) => {
                lock(&attached).insert(want.name.clone(), None);
                tracing::info!(attachment = %want.name, volume = %want.volume, node = %want.node, "attach requested")
            }
            Err(error) if is_benign(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    for attachment in caches.attachments.state() {
        let name = attachment.name_any();
        if wanted.contains_key(&name)
            || !name.starts_with("csi-")
            || attachment.metadata.deletion_timestamp.is_some()
        {
            lock(&waiting_since).remove(&name);
            continue;
        }
        let node = caches
            .nodes
            .get(&ObjectRef::new(&attachment.spec.node_name));
        let safe = match &node {
            None => true,
            Some(node) => {
                let in_use = unique_name_of(&caches, &attachment).is_some_and(|unique| {
                    node.status
                        .as_ref()
                        .and_then(|s| s.volumes_in_use.as_ref())
                        .is_some_and(|v| v.contains(&unique))
                });
                let out_of_service = has_taint(node, OUT_OF_SERVICE_TAINT)
                    && node_ready_status(node) != Some("True");
                let since = *lock(&waiting_since)
                    .entry(name.clone())
                    .or_insert_with(Instant::now);
                !in_use || out_of_service || since.elapsed() >= MAX_WAIT_FOR_UNMOUNT
            }
        };
        if !safe {
            continue;
        }
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(attachment = %name, "detach requested"),
            Err(error) if is_benign(&error) => {}
            Err(error) => return Err(error.into()),
        }
        lock(&waiting_since).remove(&name);
    }
    report_attached(&client, &caches).await
}

/// `node.status.volumesAttached`: the attached CSI volumes of each controller-managed node.
async fn report_attached(client: &Client, caches: &Caches) -> Result<(), RoleError> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in caches
        .nodes
        .state()
        .into_iter()
        .filter(|n| controller_managed(n))
    {
        let attached: BTreeSet<String> = caches
            .attachments
            .state()
            .iter()
            .filter(|va| {
                va.spec.node_name == node.name_any()
                    && va.status.as_ref().is_some_and(|s| s.attached)
            })
            .filter_map(|va| unique_name_of(caches, va))
            .collect();
        let reported: BTreeSet<String> = node
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.as_ref())
            .map(|v| v.iter().map(|a| a.name.clone()).collect())
            .unwrap_or_default();
        if attached == reported {
            continue;
        }
        let list: Vec<_> = attached
            .iter()
            .map(|name| json!({"name": name, "devicePath": ""}))
            .collect();
        match merge_patch_status(
            &nodes,
            &node.name_any(),
            json!({"status": {"volumesAttached": list}}),
        )
        .await
        {
            Ok(_) => {}
            Err(error) if is_benign(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

//! The volume manager and pod lifecycle of the simulated kubelet: for each pod bound to the
//! node, wait for its VolumeAttachments, NodeStage and NodePublish at kubelet's paths, start
//! the simulated containers and report the pod Running; on deletion stop them, unpublish,
//! unstage and remove the pod. Behaviour of pkg/kubelet/volumemanager and
//! pkg/volume/csi/{csi_attacher.go,csi_mounter.go}.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use csi::node_service_capability::rpc::Type as NodeCapability;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_grpc::conn::GoStatus;
use csi_proto::csi::v1 as csi;
use csi_sidecar::events::EventType;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, SecretReference,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;

use super::plugins::{CSI_TIMEOUT, RegisteredDriver};
use super::{Shared, StagingLayout, WRITE_TO_ANNOTATION};
use crate::roles::{
    Informers, RoleError, force_delete_pod, lock, merge_patch_status, now, reconcile_loop,
};

/// kubelet's per-volume bookkeeping file next to a publish target, used to reconstruct
/// volumes after a restart.
const VOL_DATA: &str = "vol_data.json";

pub use super::paths::{attachment_name, staging_path, target_path};
use super::paths::{legacy_staging_path, pod_volume_dir};

/// The name kubelet reports in `node.status.volumesInUse`.
pub fn unique_volume_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// One published volume of one pod, as recorded in `vol_data.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Published {
    pub driver_name: String,
    pub volume_handle: String,
    spec_vol_id: String,
    pub pod_volume: String,
    pub staging_path: PathBuf,
    pub target_path: PathBuf,
    block: bool,
    node_name: String,
}

impl Published {
    fn unique(&self) -> String {
        unique_volume_name(&self.driver_name, &self.volume_handle)
    }
}

#[derive(Debug, Default)]
struct PodRecord {
    volumes: Vec<Published>,
    writer: Option<Child>,
    /// The status last reported, so it is only written when it changes.
    reported: Option<PodState>,
    /// The last FailedMount message, so the Event is only recorded when it changes.
    failed_mount: Option<String>,
    /// Node expansions done (PV name, bytes).
    expanded: HashSet<(String, i64)>,
    /// The last FileSystemResizeFailed message, so the Event is only recorded when it changes.
    resize_failed: Option<String>,
    crash_started: Option<Instant>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PodState {
    Running,
    CrashLoop { restarts: u32 },
}

#[derive(Debug, Default)]
pub(super) struct VolumeState {
    /// By pod UID.
    pods: HashMap<String, PodRecord>,
    /// Whether the disk has been read since the (re)start.
    reconstructed: bool,
    /// volumesInUse last reported.
    reported_in_use: Option<BTreeSet<String>>,
}

impl VolumeState {
    /// The volumes published for each pod, by pod UID.
    pub fn published(&self) -> HashMap<String, Vec<Published>> {
        self.pods
            .iter()
            .map(|(uid, record)| (uid.clone(), record.volumes.clone()))
            .collect()
    }

    pub async fn kill_writers(&mut self) {
        for record in self.pods.values_mut() {
            stop_writer(record).await;
        }
    }
}

async fn stop_writer(record: &mut PodRecord) {
    if let Some(mut child) = record.writer.take() {
        let _ = child.kill().await;
    }
}

/// Unmounts every mount under the node's root, deepest first, as a reboot loses them.
pub(super) fn unmount_everything_under(root: &Path) -> Result<(), RoleError> {
    let points = csi_grpc::mounts::mount_points_under(root)
        .map_err(|e| RoleError::Invalid(format!("reading the mount table: {e}")))?;
    for point in points {
        rustix::mount::unmount(&point, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| RoleError::Invalid(format!("unmounting {}: {e}", point.display())))?;
    }
    Ok(())
}

struct Caches {
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    drivers: Store<CSIDriver>,
    attachments: Store<VolumeAttachment>,
    node: Store<Node>,
}

/// The volume manager loop.
pub(super) async fn manage(shared: Arc<Shared>, token: CancellationToken) {
    let on_node =
        watcher::Config::default().fields(&format!("spec.nodeName={}", shared.config.node));
    let own_node =
        watcher::Config::default().fields(&format!("metadata.name={}", shared.config.node));
    let mut informers = Informers::new(&shared.client, &token);
    let caches = Arc::new(Caches {
        pods: informers.watch(Api::all(shared.client.clone()), on_node),
        claims: informers.all(),
        volumes: informers.all(),
        drivers: informers.all(),
        attachments: informers.all(),
        node: informers.watch(Api::all(shared.client.clone()), own_node),
    });
    let Some(wake) = informers.synced().await else {
        return;
    };
    tokio::spawn(super::volume_stats::calculate(
        shared.clone(),
        caches.pods.clone(),
        token.clone(),
    ));
    // Registrations and fault injection wake the volume manager too.
    let kubelet_wake = shared.wake.clone();
    let forward = wake.clone();
    let forwarding = token.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = forwarding.cancelled() => return,
                () = kubelet_wake.notified() => forward.notify_one(),
            }
        }
    });
    reconcile_loop("kubelet", wake, shared.config.timing.resync, token, || {
        sync(shared.clone(), caches.clone())
    })
    .await;
}

/// One pass over every pod of the node.
async fn sync(shared: Arc<Shared>, caches: Arc<Caches>) -> Result<(), RoleError> {
    if shared.partitioned() {
        return Ok(());
    }
    let mut state = shared.volumes.lock().await;
    if !state.reconstructed {
        reconstruct(&shared.config.root, &mut state);
        state.reconstructed = true;
    }
    let pods = caches.pods.state();
    let present: HashSet<String> = pods.iter().map(|p| p.uid().unwrap_or_default()).collect();
    let mut in_use = BTreeSet::new();
    for pod in &pods {
        let uid = pod.uid().unwrap_or_default();
        let terminated = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if pod.metadata.deletion_timestamp.is_some() || terminated {
            if tear_down(&shared, &mut state, &uid).await
                && pod.metadata.deletion_timestamp.is_some()
            {
                force_delete_pod(&shared.client, pod).await?;
            }
            continue;
        }
        let record = state.pods.entry(uid.clone()).or_default();
        let outcome = set_up(&shared, &caches, pod, record).await;
        in_use.extend(record.volumes.iter().map(Published::unique));
        in_use.extend(outcome.desired.iter().cloned());
        match outcome.waiting {
            None => {
                record.failed_mount = None;
                run_containers(&shared, pod, record).await?;
            }
            Some(message) => {
                warn_once(
                    &shared,
                    pod,
                    "FailedMount",
                    message,
                    &mut record.failed_mount,
                )
                .await;
            }
        }
    }
    let orphans: Vec<String> = state
        .pods
        .keys()
        .filter(|uid| !present.contains(*uid))
        .cloned()
        .collect();
    for uid in orphans {
        if !tear_down(&shared, &mut state, &uid).await
            && let Some(record) = state.pods.get(&uid)
        {
            in_use.extend(record.volumes.iter().map(Published::unique));
        }
    }
    report_volumes_in_use(&shared, &caches, &mut state, in_use).await
}

/// A warning Event on the pod, unless `last` (the previous one of this kind) said the same.
async fn warn_once(
    shared: &Shared,
    pod: &Pod,
    reason: &str,
    message: String,
    last: &mut Option<String>,
) {
    if last.as_deref() == Some(&message) {
        return;
    }
    tracing::info!(node = %shared.config.node, pod = %pod.name_any(), reason, %message, "a volume of the pod is not ready");
    shared
        .events
        .publish(&pod.object_ref(&()), EventType::Warning, reason, &message)
        .await;
    *last = Some(message);
}

/// Reads back the volumes published before a restart from their `vol_data.json` files.
fn reconstruct(root: &Path, state: &mut VolumeState) {
    let Ok(pods) = std::fs::read_dir(root.join("pods")) else {
        return;
    };
    for pod in pods.filter_map(Result::ok) {
        let uid = pod.file_name().to_string_lossy().into_owned();
        let Ok(volumes) = std::fs::read_dir(pod.path().join("volumes/kubernetes.io~csi")) else {
            continue;
        };
        for volume in volumes.filter_map(Result::ok) {
            let data = std::fs::read(volume.path().join(VOL_DATA))
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Published>(&bytes).ok());
            if let Some(published) = data {
                tracing::info!(pod = %uid, volume = %published.spec_vol_id, "reconstructed volume");
                state
                    .pods
                    .entry(uid.clone())
                    .or_default()
                    .volumes
                    .push(published);
            }
        }
    }
}

/// A pod volume backed by a CSI PV, resolved through its claim.
#[derive(Clone, Debug)]
struct CsiVolume {
    pod_volume: String,
    claim: Arc<PersistentVolumeClaim>,
    pv: PersistentVolume,
    pv_name: String,
    driver: String,
    handle: String,
    read_only: bool,
    block: bool,
}

struct SetUpOutcome {
    /// Unique names of the volumes the pod needs (they count as in use from the start).
    desired: Vec<String>,
    /// Why the pod cannot start yet.
    waiting: Option<String>,
}

/// Mounts what the pod needs. Returns the first reason it is not ready yet.
async fn set_up(
    shared: &Shared,
    caches: &Caches,
    pod: &Pod,
    record: &mut PodRecord,
) -> SetUpOutcome {
    let mut desired = Vec::new();
    let mut waiting = None;
    let namespace = pod.namespace().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    let pod_volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut wanted = Vec::new();
    for volume in &pod_volumes {
        let Some(claim) = &volume.persistent_volume_claim else {
            continue;
        };
        match resolve(
            caches,
            &namespace,
            &claim.claim_name,
            claim.read_only.unwrap_or(false),
            &volume.name,
        ) {
            Ok(resolved) => {
                desired.push(unique_volume_name(&resolved.driver, &resolved.handle));
                wanted.push(resolved);
            }
            Err(reason) => {
                waiting.get_or_insert(reason);
            }
        }
    }
    // A reconstructed volume whose mount did not survive (a reboot) is cleaned up in the driver
    // first and published again below; it stays recorded until the cleanup succeeded, and the
    // simulated containers wait for it.
    let lost: Vec<Published> = record
        .volumes
        .iter()
        .filter(|p| !p.block && !csi_grpc::mounts::is_mount_point(&p.target_path).unwrap_or(false))
        .cloned()
        .collect();
    if !lost.is_empty() {
        stop_writer(record).await;
    }
    for published in lost {
        match unpublish(shared, &published, &[]).await {
            Ok(()) => record.volumes.retain(|p| *p != published),
            Err(error) => {
                waiting.get_or_insert(error);
            }
        }
    }
    for volume in wanted {
        let published = match record
            .volumes
            .iter()
            .find(|p| p.pod_volume == volume.pod_volume)
        {
            Some(published) => published.clone(),
            None => match publish(shared, caches, pod, &uid, &volume).await {
                Ok(published) => {
                    record.volumes.push(published.clone());
                    published
                }
                Err(reason) => {
                    waiting.get_or_insert(reason);
                    continue;
                }
            },
        };
        let Some(bytes) = node_expansion_due(&volume) else {
            continue;
        };
        // Until the claim's new status reaches the cache, the same expansion is not redone.
        let expansion = (volume.pv_name.clone(), bytes);
        if record.expanded.contains(&expansion) {
            continue;
        }
        match expand_on_node(shared, pod, &volume, &published, bytes).await {
            Ok(()) => {
                record.expanded.insert(expansion);
                record.resize_failed = None;
            }
            Err(message) => {
                let last = &mut record.resize_failed;
                warn_once(shared, pod, "FileSystemResizeFailed", message, last).await;
            }
        }
    }
    SetUpOutcome { desired, waiting }
}

fn resolve(
    caches: &Caches,
    namespace: &str,
    claim_name: &str,
    read_only: bool,
    pod_volume: &str,
) -> Result<CsiVolume, String> {
    let claim = caches
        .claims
        .get(&ObjectRef::new(claim_name).within(namespace))
        .ok_or_else(|| format!("persistentvolumeclaim \"{claim_name}\" not found"))?;
    let pv_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("persistentvolumeclaim \"{claim_name}\" is not bound"))?;
    let pv = caches
        .volumes
        .get(&ObjectRef::new(&pv_name))
        .ok_or_else(|| format!("persistentvolume \"{pv_name}\" not found"))?;
    let spec = pv.spec.clone().unwrap_or_default();
    let source = spec
        .csi
        .ok_or_else(|| format!("persistentvolume \"{pv_name}\" is not a CSI volume"))?;
    Ok(CsiVolume {
        pod_volume: pod_volume.to_string(),
        claim,
        pv_name,
        driver: source.driver,
        handle: source.volume_handle,
        read_only: read_only || source.read_only.unwrap_or(false),
        block: spec.volume_mode.as_deref() == Some("Block"),
        pv: (*pv).clone(),
    })
}

/// WaitForAttach (when the driver requires attach), NodeStage (when the driver stages) and
/// NodePublish.
async fn publish(
    shared: &Shared,
    caches: &Caches,
    pod: &Pod,
    uid: &str,
    volume: &CsiVolume,
) -> Result<Published, String> {
    let node = &shared.config.node;
    let driver = shared.drivers.get(&volume.driver).ok_or_else(|| {
        format!(
            "driver name {} not found in the list of registered CSI drivers",
            volume.driver
        )
    })?;
    let csi_driver = caches.drivers.get(&ObjectRef::new(&volume.driver));
    let driver_spec = csi_driver.map(|d| d.spec.clone()).unwrap_or_default();
    let mut publish_context = BTreeMap::new();
    if driver_spec.attach_required.unwrap_or(true) {
        let name = attachment_name(&volume.handle, &volume.driver, node);
        let attachment = caches
            .attachments
            .get(&ObjectRef::new(&name))
            .ok_or_else(|| format!("waiting for VolumeAttachment {name} to be created"))?;
        let status = attachment.status.clone().unwrap_or_default();
        if !status.attached {
            let error = status
                .attach_error
                .and_then(|e| e.message)
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            return Err(format!(
                "volume {} is not attached to node {node} yet{error}",
                volume.pv_name
            ));
        }
        publish_context = status.attachment_metadata.unwrap_or_default();
    }
    let spec = volume.pv.spec.clone().unwrap_or_default();
    let source = spec.csi.clone().unwrap_or_default();
    let root = &shared.config.root;
    let staging = match shared.config.staging_layout {
        StagingLayout::PvName if !volume.block => legacy_staging_path(root, &volume.pv_name),
        _ => staging_path(
            root,
            &volume.driver,
            &volume.handle,
            &volume.pv_name,
            volume.block,
        ),
    };
    let target = target_path(root, uid, &volume.pv_name, volume.block);
    let capability = capability_of(&driver, &volume.pv);
    let mut volume_context: HashMap<String, String> = source
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let stages = driver.can(NodeCapability::StageUnstageVolume);
    if stages {
        let secrets = secrets(&shared.client, source.node_stage_secret_ref.as_ref()).await?;
        std::fs::create_dir_all(&staging)
            .map_err(|e| format!("creating {}: {e}", staging.display()))?;
        driver
            .csi
            .node_stage_volume(
                csi::NodeStageVolumeRequest {
                    volume_id: volume.handle.clone(),
                    publish_context: publish_context.clone().into_iter().collect(),
                    staging_target_path: staging.display().to_string(),
                    volume_capability: Some(capability.clone()),
                    secrets,
                    volume_context: volume_context.clone(),
                },
                CSI_TIMEOUT,
            )
            .await
            .map_err(|s| {
                format!(
                    "MountVolume.MountDevice failed for volume \"{}\": {}",
                    volume.pv_name,
                    GoStatus(&s)
                )
            })?;
    }
    if driver_spec.pod_info_on_mount.unwrap_or(false) {
        let spec = pod.spec.clone().unwrap_or_default();
        volume_context.extend([
            ("csi.storage.k8s.io/pod.name".to_string(), pod.name_any()),
            (
                "csi.storage.k8s.io/pod.namespace".to_string(),
                pod.namespace().unwrap_or_default(),
            ),
            ("csi.storage.k8s.io/pod.uid".to_string(), uid.to_string()),
            (
                "csi.storage.k8s.io/serviceAccount.name".to_string(),
                spec.service_account_name
                    .unwrap_or_else(|| "default".to_string()),
            ),
            (
                "csi.storage.k8s.io/ephemeral".to_string(),
                "false".to_string(),
            ),
        ]);
    }
    let published = Published {
        driver_name: volume.driver.clone(),
        volume_handle: volume.handle.clone(),
        spec_vol_id: volume.pv_name.clone(),
        pod_volume: volume.pod_volume.clone(),
        staging_path: if stages {
            staging.clone()
        } else {
            PathBuf::new()
        },
        target_path: target.clone(),
        block: volume.block,
        node_name: shared.config.node.clone(),
    };
    // The bookkeeping file goes first, so a crash right after NodePublish still leaves a
    // volume the kubelet can find and clean up.
    let data_dir = pod_volume_dir(root, uid, &volume.pv_name);
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| format!("creating {}: {e}", data_dir.display()))?;
    let data = serde_json::to_vec(&published).map_err(|e| e.to_string())?;
    std::fs::write(data_dir.join(VOL_DATA), data)
        .map_err(|e| format!("writing {VOL_DATA}: {e}"))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    let secrets = secrets(&shared.client, source.node_publish_secret_ref.as_ref()).await?;
    driver
        .csi
        .node_publish_volume(
            csi::NodePublishVolumeRequest {
                volume_id: volume.handle.clone(),
                publish_context: publish_context.into_iter().collect(),
                staging_target_path: if stages {
                    staging.display().to_string()
                } else {
                    String::new()
                },
                target_path: target.display().to_string(),
                volume_capability: Some(capability),
                readonly: volume.read_only,
                secrets,
                volume_context,
            },
            CSI_TIMEOUT,
        )
        .await
        .map_err(|s| {
            format!(
                "MountVolume.SetUp failed for volume \"{}\": {}",
                volume.pv_name,
                GoStatus(&s)
            )
        })?;
    tracing::info!(node = %shared.config.node, pod = %pod.name_any(), volume = %volume.pv_name, target = %target.display(), "volume published");
    Ok(published)
}

/// The volume capability kubelet sends for `pv` to `driver` (pkg/volume/csi: csi_mounter.go,
/// csi_attacher.go, csi_block.go): the PV's first access mode (ReadWriteOnce when it has none),
/// a block device or a mount with the CSI source's fsType and the PV's mount options.
fn capability_of(driver: &RegisteredDriver, pv: &PersistentVolume) -> csi::VolumeCapability {
    let spec = pv.spec.clone().unwrap_or_default();
    let first_mode = spec.access_modes.as_ref().and_then(|m| m.first().cloned());
    let mode = access_mode(
        first_mode.as_deref().unwrap_or("ReadWriteOnce"),
        driver.can(NodeCapability::SingleNodeMultiWriter),
    );
    let access_type = if spec.volume_mode.as_deref() == Some("Block") {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: spec.csi.and_then(|c| c.fs_type).unwrap_or_default(),
            mount_flags: spec.mount_options.unwrap_or_default(),
            volume_mount_group: String::new(),
        })
    };
    csi::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode.into() }),
    }
}

/// kubelet's access mode mappers (csi_client.go `asCSIAccessModeV1`, and with the driver's
/// SINGLE_NODE_MULTI_WRITER capability `asSingleNodeMultiWriterCapableCSIAccessModeV1`); a
/// mode they do not know is UNKNOWN, not an error.
fn access_mode(kubernetes: &str, single_node_multi_writer: bool) -> Mode {
    match (kubernetes, single_node_multi_writer) {
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadWriteOnce" | "ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        _ => Mode::Unknown,
    }
}

/// The size a published volume's filesystem must grow to: the PV's capacity, when the claim's
/// `status.capacity` is smaller (the resizer expanded the volume and left the rest to the
/// node, as kubelet's `volumeRequiresFSResize`). Read-only volumes are not grown.
fn node_expansion_due(volume: &CsiVolume) -> Option<i64> {
    let storage = |capacity: Option<&BTreeMap<String, Quantity>>| {
        capacity
            .and_then(|c| c.get("storage"))
            .and_then(crate::roles::scheduling::parse_quantity)
    };
    let wanted = storage(volume.pv.spec.as_ref()?.capacity.as_ref())?;
    let current = storage(volume.claim.status.as_ref()?.capacity.as_ref())?;
    (current < wanted && !volume.read_only).then(|| wanted.value())?
}

/// kubelet's online expansion (`ExpandInUseVolume`): NodeExpandVolume on the published
/// volume, Events `FileSystemResizeSuccessful` on the pod and the claim, then the claim's
/// `status.capacity` set to the PV's and its resize conditions removed (`MarkFSResizeFinished`).
async fn expand_on_node(
    shared: &Shared,
    pod: &Pod,
    volume: &CsiVolume,
    published: &Published,
    bytes: i64,
) -> Result<(), String> {
    let driver = shared
        .drivers
        .get(&volume.driver)
        .ok_or_else(|| format!("driver {} is not registered", volume.driver))?;
    let failed = |detail: String| {
        format!(
            "MountVolume.NodeExpandVolume failed for volume \"{}\" : {detail}",
            volume.pv_name
        )
    };
    if !driver.can(NodeCapability::ExpandVolume) {
        return Err(failed(
            "NodeExpand is not supported by the CSI driver".into(),
        ));
    }
    let source = volume
        .pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .unwrap_or_default();
    let secrets = secrets(&shared.client, source.node_expand_secret_ref.as_ref()).await?;
    driver
        .csi
        .node_expand_volume(
            csi::NodeExpandVolumeRequest {
                volume_id: volume.handle.clone(),
                volume_path: published.target_path.display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                staging_target_path: published.staging_path.display().to_string(),
                volume_capability: Some(capability_of(&driver, &volume.pv)),
                secrets,
            },
            CSI_TIMEOUT,
        )
        .await
        .map_err(|s| failed(GoStatus(&s).to_string()))?;
    let message = format!(
        "MountVolume.NodeExpandVolume succeeded for volume \"{}\"",
        volume.pv_name
    );
    for object in [pod.object_ref(&()), volume.claim.object_ref(&())] {
        shared
            .events
            .publish(
                &object,
                EventType::Normal,
                "FileSystemResizeSuccessful",
                &message,
            )
            .await;
    }
    let capacity = volume
        .pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage").cloned());
    let conditions: Vec<_> = volume
        .claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "Resizing" && c.type_ != "FileSystemResizePending")
        .collect();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(
        shared.client.clone(),
        &volume.claim.namespace().unwrap_or_default(),
    );
    merge_patch_status(
        &claims,
        &volume.claim.name_any(),
        json!({"status": {"capacity": {"storage": capacity}, "conditions": conditions}}),
    )
    .await
    .map_err(|e| {
        format!(
            "marking the file system resize of {} finished: {e}",
            volume.pv_name
        )
    })?;
    tracing::info!(node = %shared.config.node, pod = %pod.name_any(), volume = %volume.pv_name, bytes, "volume expanded on the node");
    Ok(())
}

/// A Secret's data as CSI secrets (kubelet GETs it each time; it keeps no secret cache).
async fn secrets(
    client: &Client,
    reference: Option<&SecretReference>,
) -> Result<HashMap<String, String>, String> {
    let Some(reference) = reference else {
        return Ok(HashMap::new());
    };
    let name = reference.name.clone().unwrap_or_default();
    let namespace = reference
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = api
        .get(&name)
        .await
        .map_err(|e| format!("fetching secret {namespace}/{name}: {e}"))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// NodeUnpublish, and NodeUnstage when no pod in `remaining` still uses the staged volume.
async fn unpublish(
    shared: &Shared,
    published: &Published,
    remaining: &[&Published],
) -> Result<(), String> {
    let driver: RegisteredDriver = shared.drivers.get(&published.driver_name).ok_or_else(|| {
        format!(
            "cannot unmount volume {}: driver {} is not registered",
            published.spec_vol_id, published.driver_name
        )
    })?;
    driver
        .csi
        .node_unpublish_volume(
            csi::NodeUnpublishVolumeRequest {
                volume_id: published.volume_handle.clone(),
                target_path: published.target_path.display().to_string(),
            },
            CSI_TIMEOUT,
        )
        .await
        .map_err(|s| {
            format!(
                "UnmountVolume.TearDown failed for volume {}: {}",
                published.spec_vol_id,
                s.message()
            )
        })?;
    let data_dir = published.target_path.parent().map(Path::to_path_buf);
    if let Some(dir) = data_dir.filter(|_| !published.block) {
        let _ = std::fs::remove_dir_all(dir);
    }
    let still_staged = remaining
        .iter()
        .any(|other| other.unique() == published.unique());
    if !published.staging_path.as_os_str().is_empty() && !still_staged {
        driver
            .csi
            .node_unstage_volume(
                csi::NodeUnstageVolumeRequest {
                    volume_id: published.volume_handle.clone(),
                    staging_target_path: published.staging_path.display().to_string(),
                },
                CSI_TIMEOUT,
            )
            .await
            .map_err(|s| {
                format!(
                    "UnmountDevice failed for volume {}: {}",
                    published.spec_vol_id,
                    s.message()
                )
            })?;
    }
    tracing::info!(node = %shared.config.node, volume = %published.spec_vol_id, target = %published.target_path.display(), "volume unpublished");
    Ok(())
}

/// Stops the pod's containers and unmounts its volumes. True when nothing is left.
async fn tear_down(shared: &Shared, state: &mut super::volumes::VolumeState, uid: &str) -> bool {
    let Some(mut record) = state.pods.remove(uid) else {
        return true;
    };
    stop_writer(&mut record).await;
    let others: Vec<Published> = state
        .pods
        .values()
        .flat_map(|r| r.volumes.iter().cloned())
        .collect();
    let mut left = Vec::new();
    for published in std::mem::take(&mut record.volumes) {
        let remaining: Vec<&Published> = others.iter().chain(left.iter()).collect();
        if let Err(error) = unpublish(shared, &published, &remaining).await {
            tracing::warn!(node = %shared.config.node, pod = %uid, %error, "volume teardown failed, retrying");
            left.push(published);
        }
    }
    let done = left.is_empty();
    if done {
        let _ = std::fs::remove_dir_all(shared.config.root.join("pods").join(uid));
    } else {
        record.volumes = left;
        state.pods.insert(uid.to_string(), record);
    }
    done
}

/// Starts the simulated containers (and the writer) and reports the pod's status.
async fn run_containers(
    shared: &Shared,
    pod: &Pod,
    record: &mut PodRecord,
) -> Result<(), RoleError> {
    let key = (pod.namespace().unwrap_or_default(), pod.name_any());
    let crashing = lock(&shared.crash_looping).contains(&key);
    let state = if crashing {
        stop_writer(record).await;
        let started = *record.crash_started.get_or_insert_with(Instant::now);
        // Restarts grow with kubelet's back-off; one per four heartbeats is close enough.
        let period = shared
            .config
            .timing
            .heartbeat_interval
            .saturating_mul(4)
            .max(std::time::Duration::from_millis(1));
        let restarts = 1 + u32::try_from(started.elapsed().as_millis() / period.as_millis())
            .unwrap_or(u32::MAX);
        PodState::CrashLoop { restarts }
    } else {
        if record.writer.is_none() {
            record.writer = start_writer(pod, record)?;
        }
        PodState::Running
    };
    // kubelet's status manager compares with the API server's copy too
    // (pkg/kubelet/status/status_manager.go `needsReconcile`), so a Ready condition someone
    // else changed — the node lifecycle controller's MarkPodsNotReady — is put right.
    let api_ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if record.reported.as_ref() == Some(&state) && api_ready == matches!(state, PodState::Running) {
        return Ok(());
    }
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    merge_patch_status(&api, &pod.name_any(), pod_status(pod, &state)).await?;
    record.reported = Some(state);
    Ok(())
}

/// The status kubelet reports for a running (or crash-looping) pod.
fn pod_status(pod: &Pod, state: &PodState) -> serde_json::Value {
    let now = now();
    let ready = matches!(state, PodState::Running);
    let ready_text = if ready { "True" } else { "False" };
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| serde_json::to_value(t).unwrap_or_default())
        .unwrap_or_else(|| json!(now));
    let containers: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|container| {
            let (container_state, restarts) = match state {
                PodState::Running => (json!({"running": {"startedAt": now}}), 0),
                PodState::CrashLoop { restarts } => (
                    json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off restarting failed container {}", container.name)}}),
                    *restarts,
                ),
            };
            json!({
                "name": container.name,
                "image": container.image.unwrap_or_default(),
                "imageID": "",
                "containerID": format!("kube-sim://{}", container.name),
                "ready": ready,
                "started": ready,
                "restartCount": restarts,
                "state": container_state,
            })
        })
        .collect();
    let condition = |kind: &str, status: &str| json!({"type": kind, "status": status, "lastTransitionTime": now});
    json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": started,
        "conditions": [
            condition("PodReadyToStartContainers", "True"),
            condition("Initialized", "True"),
            condition("Ready", ready_text),
            condition("ContainersReady", ready_text),
            condition("PodScheduled", "True"),
        ],
        "containerStatuses": containers,
    }})
}

/// The simulated container's writes: a real process holding `<mount>/<pod>.log` open and
/// appending a numbered line every 50 ms — visible to the driver's fencing like any writer.
fn start_writer(pod: &Pod, record: &PodRecord) -> Result<Option<Child>, RoleError> {
    let Some(volume) = pod.annotations().get(WRITE_TO_ANNOTATION) else {
        return Ok(None);
    };
    let Some(published) = record
        .volumes
        .iter()
        .find(|p| &p.pod_volume == volume && !p.block)
    else {
        return Err(RoleError::Invalid(format!(
            "pod {} asks to write to volume {volume:?}, which is not a mounted CSI volume of the pod",
            pod.name_any()
        )));
    };
    let log = published
        .target_path
        .join(format!("{}.log", pod.name_any()));
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(r#"exec 3>>"$0"; n=0; while :; do n=$((n+1)); echo "$1 $n" >&3 || exit 1; sleep 0.05; done"#)
        .arg(&log)
        .arg(pod.uid().unwrap_or_default())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| RoleError::Invalid(format!("starting the writer of {}: {e}", pod.name_any())))?;
    Ok(Some(child))
}

/// Keeps `node.status.volumesInUse` equal to what is mounted or about to be, so the
/// attach/detach controller never detaches a mounted volume.
async fn report_volumes_in_use(
    shared: &Shared,
    caches: &Caches,
    state: &mut VolumeState,
    in_use: BTreeSet<String>,
) -> Result<(), RoleError> {
    let cached: Option<BTreeSet<String>> = caches
        .node
        .get(&ObjectRef::new(&shared.config.node))
        .map(|n| {
            n.status
                .clone()
                .unwrap_or_default()
                .volumes_in_use
                .unwrap_or_default()
                .into_iter()
                .collect()
        });
    if cached.as_ref() == Some(&in_use) && state.reported_in_use.as_ref() == Some(&in_use) {
        return Ok(());
    }
    merge_patch_status(
        &shared.node_api(),
        &shared.config.node,
        json!({"status": {"volumesInUse": in_use}}),
    )
    .await?;
    state.reported_in_use = Some(in_use);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of csi_client.go's two mappers: plain, then with SINGLE_NODE_MULTI_WRITER.
    #[test]
    fn access_modes_as_kubelet_maps_them() {
        let table = [
            (
                "ReadWriteOnce",
                Mode::SingleNodeWriter,
                Mode::SingleNodeMultiWriter,
            ),
            (
                "ReadOnlyMany",
                Mode::MultiNodeReaderOnly,
                Mode::MultiNodeReaderOnly,
            ),
            (
                "ReadWriteMany",
                Mode::MultiNodeMultiWriter,
                Mode::MultiNodeMultiWriter,
            ),
            (
                "ReadWriteOncePod",
                Mode::SingleNodeWriter,
                Mode::SingleNodeSingleWriter,
            ),
            ("ReadWriteSometimes", Mode::Unknown, Mode::Unknown),
        ];
        for (kubernetes, plain, multi_writer) in table {
            assert_eq!(access_mode(kubernetes, false), plain, "{kubernetes}");
            assert_eq!(access_mode(kubernetes, true), multi_writer, "{kubernetes}");
        }
    }

    #[test]
    fn unique_volume_names() {
        assert_eq!(unique_volume_name("d", "h"), "kubernetes.io/csi/d^h");
    }

    #[test]
    fn crash_loop_status() {
        let pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let status = pod_status(&pod, &PodState::CrashLoop { restarts: 3 });
        let container = &status["status"]["containerStatuses"][0];
        assert_eq!(container["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(container["restartCount"], 3);
        assert_eq!(status["status"]["conditions"][2]["status"], "False");
        let running = pod_status(&pod, &PodState::Running);
        assert_eq!(running["status"]["conditions"][2]["status"], "True");
        assert_eq!(running["status"]["containerStatuses"][0]["ready"], true);
    }
}

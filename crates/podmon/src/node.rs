//! node-podmon: remembers the protected pods of its node and their volumes — persisted, so a
//! restart or a reboot does not forget a zombie — and once controller-podmon has fenced and
//! tainted the node, cleans up what the replaced pods left behind (NodeUnpublishVolume,
//! unmount and remove the target, NodeUnstageVolume when no other pod here uses the volume —
//! protected or not, by kubelet's directories and the live API —, unmount and remove the
//! staging path). The taint goes only when every remembered pod is
//! cleaned and no protected pod is bound to the node any more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use csi_kinds::kubelet_paths;
use csi_proto::csi::v1 as csi;
use csi_sidecar::informers::Informers;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::metrics::PodmonMetrics;
use crate::plan::{self, Remembered};
use crate::taints::update_taints;

/// Polls that must see the taint before cleaning starts (Dell's TaintCountDelay): kubelet
/// gets time to catch up with the API after a partition first.
pub const TAINT_POLLS_BEFORE_CLEANUP: u32 = 4;

#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub node_name: String,
    pub driver_name: String,
    pub label_key: String,
    pub label_value: String,
    pub kubelet_dir: PathBuf,
    pub state_file: PathBuf,
    pub poll_interval: Duration,
    /// The driver has STAGE_UNSTAGE_VOLUME.
    pub stage_unstage: bool,
    pub ignore_volumeless_pods: bool,
    /// Also remove `node.kubernetes.io/out-of-service` with our taint.
    pub out_of_service_taint: bool,
    pub timeout: Duration,
    pub metrics: PodmonMetrics,
}

/// One volume of a remembered pod, with kubelet's paths for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub pv: String,
    pub volume_handle: String,
    pub block: bool,
    pub target_path: PathBuf,
    pub staging_path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub volumes: Vec<VolumeRecord>,
    /// The claims already resolved to volumes (of any driver).
    #[serde(default)]
    pub claims: BTreeSet<String>,
}

/// What node mode persists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// The node's boot ID when the inventory was last written.
    pub boot_id: String,
    /// Remembered pods by UID.
    pub pods: BTreeMap<String, PodRecord>,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot read the inventory {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the inventory {path} is corrupt: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write the inventory {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Inventory {
    /// Loads the inventory; a missing file is an empty one.
    pub fn load(path: &Path) -> Result<Self, NodeError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| NodeError::Corrupt {
                path: path.to_path_buf(),
                source,
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(NodeError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Writes atomically and durably (a crash or power cut must not forget a zombie).
    pub fn save(&self, path: &Path) -> Result<(), NodeError> {
        let write = |source| NodeError::Write {
            path: path.to_path_buf(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| write(std::io::Error::other(e)))?;
        csi_grpc::durable::replace(path, &bytes).map_err(write)
    }
}

struct NodeAgent {
    client: Client,
    csi: CsiConnection,
    settings: NodeSettings,
    pods: Store<Pod>,
    /// The pod cache has its first list (until then, its emptiness proves nothing).
    listed: Arc<AtomicBool>,
    inventory: Inventory,
    taint_polls: u32,
    api_lost: bool,
}

/// Runs node-podmon until `shutdown`.
pub async fn run(
    client: Client,
    csi: CsiConnection,
    settings: NodeSettings,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    let inventory = Inventory::load(&settings.state_file)?;
    // Written at once, so an unwritable state directory stops podmon now, not mid-cleanup.
    inventory.save(&settings.state_file)?;
    tracing::info!(node = %settings.node_name, remembered = inventory.pods.len(), state_file = %settings.state_file.display(), "node-podmon starting");
    let mut informers = Informers::new(&client, &shutdown);
    let selector = format!("{}={}", settings.label_key, settings.label_value);
    let pods = informers.watch(
        Api::all(client.clone()),
        watcher::Config::default()
            .labels(&selector)
            .fields(&format!("spec.nodeName={}", settings.node_name)),
    );
    // Not waiting for the first list (a node starting while partitioned): the remembered
    // inventory is acted on regardless, with live reads. A pod is remembered as soon as the
    // watch shows it, not at the next poll: a node may fail right after a pod started.
    let wake = informers.wake();
    drop(informers);
    let listed = Arc::new(AtomicBool::new(false));
    let reader = pods.clone();
    let flag = listed.clone();
    tokio::spawn(async move {
        if reader.wait_until_ready().await.is_ok() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    let mut agent = NodeAgent {
        client,
        csi,
        settings,
        pods,
        listed,
        inventory,
        taint_polls: 0,
        api_lost: false,
    };
    let mut next_poll = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = wake.notified() => agent.remember_new_pods().await,
            () = tokio::time::sleep_until(next_poll) => {
                agent.tick().await;
                next_poll = tokio::time::Instant::now() + agent.settings.poll_interval;
            }
        }
    }
}

impl NodeAgent {
    fn save(&self) {
        if let Err(error) = self.inventory.save(&self.settings.state_file) {
            tracing::error!(%error, "cannot persist the inventory");
        }
    }

    async fn tick(&mut self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = match nodes.get(&self.settings.node_name).await {
            Ok(node) => node,
            Err(error) => {
                if !self.api_lost {
                    tracing::warn!(node = %self.settings.node_name, %error, "Lost API connectivity from node");
                }
                self.api_lost = true;
                self.taint_polls = 0;
                return;
            }
        };
        if std::mem::take(&mut self.api_lost) {
            tracing::info!(node = %self.settings.node_name, "API connectivity restored");
        }
        let boot_id = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default();
        if boot_id != self.inventory.boot_id {
            if !self.inventory.boot_id.is_empty() {
                tracing::warn!(node = %self.settings.node_name, remembered = self.inventory.pods.len(), "the node rebooted: the remembered pods' processes are gone; their leftovers are still cleaned");
            }
            self.inventory.boot_id = boot_id;
            self.save();
        }
        self.remember_new_pods().await;
        let fenced_key = plan::fenced_taint_key(&self.settings.driver_name);
        if !plan::has_taint(&node, &fenced_key, plan::NO_SCHEDULE) {
            if self.taint_polls > 0 {
                tracing::info!(node = %self.settings.node_name, "taint removed");
            }
            self.taint_polls = 0;
            self.forget_deleted_pods();
            return;
        }
        self.taint_polls += 1;
        if self.taint_polls < TAINT_POLLS_BEFORE_CLEANUP {
            return;
        }
        let started = std::time::Instant::now();
        if self.clean_up().await {
            let out_of_service = self.settings.out_of_service_taint;
            let removed = update_taints(&nodes, node, |current| {
                let mut taints = plan::without_taint(current, &fenced_key);
                if out_of_service {
                    let base = taints.clone().unwrap_or_else(|| current.to_vec());
                    taints = plan::without_taint(&base, plan::OUT_OF_SERVICE_TAINT).or(taints);
                }
                taints
            })
            .await;
            match removed {
                Ok(_) => {
                    self.settings
                        .metrics
                        .cleanup_took(started.elapsed().as_secs_f64());
                    tracing::info!(node = %self.settings.node_name, "node cleaned; podmon taint removed");
                    self.taint_polls = 0;
                }
                Err(error) => tracing::warn!(%error, "cannot remove the podmon taint; retrying"),
            }
        } else {
            tracing::warn!(node = %self.settings.node_name, "Couldn't completely cleanup node- taint not removed- cleanup will be retried");
        }
    }

    /// Records the protected pods bound here that are not remembered yet (or have gained
    /// volumes); an inventory never shrinks while volumes are torn down.
    async fn remember_new_pods(&mut self) {
        let mut changed = false;
        for pod in self.pods.state() {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            // A pod's volumes never change: once every claim is resolved, no more reads.
            let claims: BTreeSet<String> = plan::claim_names(&pod).into_iter().collect();
            if self
                .inventory
                .pods
                .get(&uid)
                .is_some_and(|r| r.claims.is_superset(&claims))
            {
                continue;
            }
            let (volumes, resolved) = match self.volume_records(&pod).await {
                Ok(found) => found,
                Err(error) => {
                    tracing::warn!(pod = %pod.name_any(), %error, "cannot resolve the pod's volumes yet");
                    continue;
                }
            };
            if self.settings.ignore_volumeless_pods && volumes.is_empty() {
                continue;
            }
            let known = self.inventory.pods.get(&uid).map_or(0, |r| r.volumes.len());
            if self.inventory.pods.contains_key(&uid) && volumes.len() <= known {
                continue;
            }
            tracing::info!(pod = %pod.name_any(), volumes = volumes.len(), "remembering protected pod");
            self.inventory.pods.insert(
                uid.clone(),
                PodRecord {
                    namespace: pod.namespace().unwrap_or_default(),
                    name: pod.name_any(),
                    uid,
                    volumes,
                    claims: resolved,
                },
            );
            changed = true;
        }
        if changed {
            self.save();
        }
    }

    /// Without the taint, pods deleted the normal way were torn down by kubelet: forget them.
    /// (The controller taints before it force-deletes, so a zombie is never forgotten here.)
    fn forget_deleted_pods(&mut self) {
        if !self.listed.load(Ordering::SeqCst) {
            return;
        }
        let present: Vec<String> = self
            .pods
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let before = self.inventory.pods.len();
        self.inventory.pods.retain(|uid, _| present.contains(uid));
        if self.inventory.pods.len() != before {
            self.save();
        }
    }

    /// Our driver's volumes of a pod, from its claims (live reads: only for new pods).
    /// Also returns the claims resolved (bound; of any driver).
    async fn volume_records(
        &self,
        pod: &Pod,
    ) -> Result<(Vec<VolumeRecord>, BTreeSet<String>), kube::Error> {
        let namespace = pod.namespace().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut records = Vec::new();
        let mut resolved = BTreeSet::new();
        for claim_name in plan::claim_names(pod) {
            let Some(claim) = claims.get_opt(&claim_name).await? else {
                continue;
            };
            let Some(pv_name) = claim
                .spec
                .and_then(|s| s.volume_name)
                .filter(|n| !n.is_empty())
            else {
                continue;
            };
            let Some(pv) = pvs.get_opt(&pv_name).await? else {
                continue;
            };
            resolved.insert(claim_name);
            let Some(spec) = pv.spec else { continue };
            let Some(source) = spec.csi.filter(|c| c.driver == self.settings.driver_name) else {
                continue;
            };
            let block = spec.volume_mode.as_deref() == Some("Block");
            let root = &self.settings.kubelet_dir;
            records.push(VolumeRecord {
                target_path: kubelet_paths::target_path(root, &uid, &pv_name, block),
                staging_path: kubelet_paths::staging_path(
                    root,
                    &self.settings.driver_name,
                    &source.volume_handle,
                    &pv_name,
                    block,
                ),
                pv: pv_name,
                volume_handle: source.volume_handle,
                block,
            });
        }
        Ok((records, resolved))
    }

    /// Cleans every remembered pod that is gone or replaced; true when nothing is left that
    /// keeps the taint.
    async fn clean_up(&mut self) -> bool {
        let mut clean = true;
        let records: Vec<PodRecord> = self.inventory.pods.values().cloned().collect();
        for record in records {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &record.namespace);
            let current = match pods.get_opt(&record.name).await {
                Ok(current) => current,
                Err(error) => {
                    tracing::warn!(pod = %record.name, %error, "cannot read the pod; not cleaning on a guess");
                    clean = false;
                    continue;
                }
            };
            if plan::judge(&record.uid, current.as_ref()) == Remembered::StillThere {
                tracing::info!(pod = %record.name, uid = %record.uid, "protected pod not replaced yet; keeping the taint");
                clean = false;
                continue;
            }
            match self.clean_pod(&record).await {
                Ok(()) => {
                    tracing::info!(pod = %record.name, uid = %record.uid, "cleaned the leftovers of a replaced pod");
                    self.inventory.pods.remove(&record.uid);
                    self.save();
                }
                Err(error) => {
                    tracing::warn!(pod = %record.name, uid = %record.uid, %error, "cleanup failed; retrying");
                    clean = false;
                }
            }
        }
        if !clean {
            return false;
        }
        let selector = format!("{}={}", self.settings.label_key, self.settings.label_value);
        let params = ListParams::default()
            .labels(&selector)
            .fields(&format!("spec.nodeName={}", self.settings.node_name));
        match Api::<Pod>::all(self.client.clone()).list(&params).await {
            Ok(list) if list.items.is_empty() => true,
            Ok(list) => {
                let names: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
                tracing::info!(pods = ?names, "protected pods are still bound to the node; keeping the taint");
                false
            }
            Err(error) => {
                tracing::warn!(%error, "cannot list the node's protected pods; keeping the taint");
                false
            }
        }
    }

    async fn clean_pod(&self, record: &PodRecord) -> Result<(), String> {
        for volume in &record.volumes {
            let unpublish = csi::NodeUnpublishVolumeRequest {
                volume_id: volume.volume_handle.clone(),
                target_path: volume.target_path.display().to_string(),
            };
            ignore_not_found(
                self.csi
                    .node_unpublish_volume(unpublish, self.settings.timeout)
                    .await,
            )
            .map_err(|e| format!("NodeUnpublishVolume {}: {e}", volume.pv))?;
            remove_unmounted(&volume.target_path)?;
            if !volume.block {
                // kubelet's per-volume directory (vol_data.json) of the gone pod.
                if let Some(dir) = volume.target_path.parent() {
                    remove_unmounted(dir)?;
                }
            }
            if !self.settings.stage_unstage {
                continue;
            }
            let users = self.other_users(record, volume).await?;
            if !users.is_empty() {
                tracing::info!(pv = %volume.pv, ?users, "other pods on the node still use the volume: not unstaging it");
                continue;
            }
            let staging = self.staging_path_of(volume);
            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id: volume.volume_handle.clone(),
                staging_target_path: staging.display().to_string(),
            };
            ignore_not_found(
                self.csi
                    .node_unstage_volume(unstage, self.settings.timeout)
                    .await,
            )
            .map_err(|e| format!("NodeUnstageVolume {}: {e}", volume.pv))?;
            remove_unmounted(&staging)?;
        }
        Ok(())
    }

    /// The pods on this node other than the zombie `record` that still use `volume` (its
    /// staging is theirs too): remembered protected pods, pods kubelet's directories still
    /// hold the volume for, and pods bound here (live) whose claim is the volume's.
    async fn other_users(
        &self,
        record: &PodRecord,
        volume: &VolumeRecord,
    ) -> Result<BTreeSet<String>, String> {
        let mut users: BTreeSet<String> = self
            .inventory
            .pods
            .values()
            .filter(|other| other.uid != record.uid)
            .filter(|other| {
                other
                    .volumes
                    .iter()
                    .any(|v| v.volume_handle == volume.volume_handle)
            })
            .map(|other| format!("{}/{}", other.namespace, other.name))
            .collect();
        let on_disk = users_on_disk(&self.settings.kubelet_dir, &volume.pv, &record.uid)
            .map_err(|e| format!("reading kubelet's pod directories: {e}"))?;
        users.extend(on_disk.into_iter().map(|uid| format!("uid {uid}")));
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(&volume.pv)
            .await
            .map_err(|e| format!("reading PersistentVolume {}: {e}", volume.pv))?;
        let Some(claim) = pv.and_then(|pv| pv.spec?.claim_ref) else {
            return Ok(users);
        };
        let params =
            ListParams::default().fields(&format!("spec.nodeName={}", self.settings.node_name));
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&params)
            .await
            .map_err(|e| format!("listing the node's pods: {e}"))?;
        users.extend(plan::pods_using_claim(
            &pods.items,
            claim.namespace.as_deref().unwrap_or_default(),
            claim.name.as_deref().unwrap_or_default(),
            &record.uid,
        ));
        Ok(users)
    }

    /// Where kubelet staged `volume`: the older layout (`csi/pv/<pv>/globalmount`, kubelet
    /// v1.19 among others) where its directory exists, else the recorded current one.
    fn staging_path_of(&self, volume: &VolumeRecord) -> PathBuf {
        let legacy = kubelet_paths::legacy_staging_path(&self.settings.kubelet_dir, &volume.pv);
        if !volume.block && legacy.parent().is_some_and(Path::exists) {
            legacy
        } else {
            volume.staging_path.clone()
        }
    }
}

/// The UIDs of the pods other than `except_uid` whose volume `pv` kubelet's directories on this
/// node still hold: a filesystem volume's `pods/<uid>/volumes/kubernetes.io~csi/<pv>`, a block
/// volume's `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>`.
fn users_on_disk(root: &Path, pv: &str, except_uid: &str) -> std::io::Result<BTreeSet<String>> {
    let mut users: BTreeSet<String> = entries(&root.join("pods"))?
        .into_iter()
        .filter(|uid| kubelet_paths::pod_volume_dir(root, uid, pv).exists())
        .collect();
    if let Some(published) = kubelet_paths::target_path(root, except_uid, pv, true).parent() {
        users.extend(entries(published)?);
    }
    users.remove(except_uid);
    Ok(users)
}

/// The names in a directory; none when it does not exist.
fn entries(dir: &Path) -> std::io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(read) => read
            .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

fn ignore_not_found<T>(result: Result<T, tonic::Status>) -> Result<(), String> {
    match result {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
    }
}

/// Unmounts `path` and removes it — never anything with a mount point left inside (that would
/// delete volume data).
fn remove_unmounted(path: &Path) -> Result<(), String> {
    if !path.exists() {
        return Ok(());
    }
    if let Err(error) = csi_grpc::mounts::unmount_all(path) {
        tracing::warn!(path = %path.display(), %error, "unmount failed");
    }
    let mounted = csi_grpc::mounts::mount_points_under(path)
        .map_err(|e| format!("reading the mount table: {e}"))?;
    if !mounted.is_empty() {
        return Err(format!("{} is still mounted: {mounted:?}", path.display()));
    }
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(format!("removing {}: {error}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inventory_survives_a_restart_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugins/driver/podmon-node-state.json");
        assert_eq!(Inventory::load(&path).unwrap(), Inventory::default());
        let mut inventory = Inventory {
            boot_id: "b1".into(),
            ..Default::default()
        };
        inventory.pods.insert(
            "u1".into(),
            PodRecord {
                namespace: "ns".into(),
                name: "app-0".into(),
                uid: "u1".into(),
                volumes: vec![VolumeRecord {
                    pv: "pv-1".into(),
                    volume_handle: "vol-1".into(),
                    block: false,
                    target_path: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-1/mount"
                        .into(),
                    staging_path: "/var/lib/kubelet/plugins/kubernetes.io/csi/d/x/globalmount"
                        .into(),
                }],
                claims: ["data-app-0".to_string()].into(),
            },
        );
        inventory.save(&path).unwrap();
        assert_eq!(Inventory::load(&path).unwrap(), inventory);
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(
            Inventory::load(&path),
            Err(NodeError::Corrupt { .. })
        ));
    }

    #[test]
    fn kubelets_directories_show_which_other_pods_hold_a_volume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(users_on_disk(root, "pv-1", "u1").unwrap().is_empty());
        for (uid, pv) in [("u1", "pv-1"), ("u2", "pv-1"), ("u3", "pv-2")] {
            std::fs::create_dir_all(kubelet_paths::pod_volume_dir(root, uid, pv)).unwrap();
        }
        for uid in ["u1", "u4"] {
            std::fs::create_dir_all(kubelet_paths::target_path(root, uid, "pv-b", true)).unwrap();
        }
        let uids = |list: &[&str]| list.iter().map(|u| u.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(users_on_disk(root, "pv-1", "u1").unwrap(), uids(&["u2"]));
        assert_eq!(users_on_disk(root, "pv-2", "u3").unwrap(), uids(&[]));
        assert_eq!(users_on_disk(root, "pv-b", "u1").unwrap(), uids(&["u4"]));
    }

    #[test]
    fn removing_refuses_a_path_with_a_mount_inside_and_tolerates_absence() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("mount");
        std::fs::create_dir_all(target.join("sub")).unwrap();
        remove_unmounted(&target).unwrap();
        assert!(!target.exists());
        remove_unmounted(&target).unwrap();
        assert_eq!(
            ignore_not_found::<()>(Err(tonic::Status::not_found("gone"))),
            Ok(())
        );
        assert!(
            ignore_not_found::<()>(Err(tonic::Status::internal("io")))
                .unwrap_err()
                .contains("Internal")
        );
    }
}

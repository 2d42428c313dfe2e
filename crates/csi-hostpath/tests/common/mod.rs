//! Shared helpers of the driver's integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_grpc::conn::CsiConnection;
use csi_hostpath::local::LocalCluster;
use csi_proto::csi::v1 as csi;
use tonic::{Code, Status};

pub const T: Duration = Duration::from_secs(30);
pub const GI: i64 = 1 << 30;

pub fn mount(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn block(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume::default())),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn code<T>(result: Result<T, Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

pub fn create_request(
    name: &str,
    bytes: i64,
    capability: csi::VolumeCapability,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        ..Default::default()
    }
}

pub async fn create(csi: &CsiConnection, name: &str, bytes: i64) -> csi::Volume {
    csi.create_volume(
        create_request(name, bytes, mount(Mode::SingleNodeWriter)),
        T,
    )
    .await
    .unwrap_or_else(|e| panic!("CreateVolume {name}: {e}"))
    .volume
    .unwrap()
}

/// True when real mounts can be tested; otherwise says why the caller skips.
pub fn root_or_skip(test: &str) -> bool {
    !csi_hostpath::mounts::skip_without_root(test)
}

/// Mount points under `root` still present (to prove cleanup).
pub fn mounts_under(root: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&*root.to_string_lossy()))
        .map(str::to_string)
        .collect()
}

/// Starts a local cluster with the settings most tests use.
pub async fn cluster(root: &std::path::Path) -> LocalCluster {
    LocalCluster::start(root, &["node-a", "node-b"], |config| {
        config.capacity = [(String::new(), 10 << 30), ("fast".to_string(), 2 << 30)].into();
        config.max_volumes_per_node = 3;
        config.accepted_mutable_parameters = ["iops".to_string()].into();
    })
    .await
    .unwrap()
}

/// Unmounts everything under a test's root and detaches its loop devices when dropped, so a
/// failing test leaves nothing behind. Declare it after the temporary directory.
pub struct MountCleanup(pub std::path::PathBuf);

impl Drop for MountCleanup {
    fn drop(&mut self) {
        drop_mounts_and_loop_devices(&self.0);
    }
}

/// Takes away every mount under `root` and every loop device of its volumes, as a restart of
/// the machine does (the driver's state stays).
pub fn drop_mounts_and_loop_devices(root: &Path) {
    let mut points = mounts_under(root);
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = rustix::mount::unmount(point.as_str(), rustix::mount::UnmountFlags::DETACH);
    }
    let volumes = root.join("state").join("volumes");
    for entry in std::fs::read_dir(volumes).into_iter().flatten().flatten() {
        if let Ok(Some(device)) = csi_hostpath::mounts::loop_device_of(&entry.path()) {
            let _ = csi_hostpath::mounts::loop_detach(&device);
        }
    }
}

pub fn publish_to(
    volume: &str,
    node: &str,
    capability: csi::VolumeCapability,
) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(capability),
        ..Default::default()
    }
}

pub fn stage(
    volume: &str,
    staging: &Path,
    capability: csi::VolumeCapability,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability),
        ..Default::default()
    }
}

pub fn publish(
    volume: &str,
    staging: &Path,
    target: &Path,
    capability: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish(volume: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume.into(),
        target_path: target.display().to_string(),
    }
}

pub fn unstage(volume: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
    }
}

/// Paths the simulated kubelet of `node` would use for `volume`.
pub fn paths(cluster: &LocalCluster, node: &str, volume: &str) -> (PathBuf, PathBuf) {
    let base = cluster.kubelet_dir(node);
    let staging = base.join("plugins").join(volume).join("globalmount");
    std::fs::create_dir_all(&staging).unwrap();
    let pod = base.join("pods").join("pod-1").join("volumes");
    std::fs::create_dir_all(&pod).unwrap();
    (staging, pod.join(volume))
}

/// ControllerPublish to `node`, then NodeStage and NodePublish there, as the attach/detach
/// controller and the kubelet would; returns the staging and target paths.
pub async fn attach_and_mount(
    cluster: &LocalCluster,
    node: &str,
    volume: &str,
    cap: &csi::VolumeCapability,
) -> (PathBuf, PathBuf) {
    let (staging, target) = paths(cluster, node, volume);
    let csi = &cluster.node(node).csi;
    cluster
        .controller
        .csi
        .controller_publish_volume(publish_to(volume, node, cap.clone()), T)
        .await
        .unwrap();
    csi.node_stage_volume(stage(volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    csi.node_publish_volume(publish(volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    (staging, target)
}

pub async fn teardown(node: &CsiConnection, volume: &str, staging: &Path, target: &Path) {
    node.node_unpublish_volume(unpublish(volume, target), T)
        .await
        .unwrap();
    node.node_unstage_volume(unstage(volume, staging), T)
        .await
        .unwrap();
}

/// ControllerUnpublish of `volume` from `node`, which must succeed.
pub async fn unpublish_from(cluster: &LocalCluster, node: &str, volume: &str) {
    cluster
        .controller
        .csi
        .controller_unpublish_volume(
            csi::ControllerUnpublishVolumeRequest {
                volume_id: volume.into(),
                node_id: node.into(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
}

/// [`unpublish_from`] `node`, then DeleteVolume: both must succeed (no record holds it).
pub async fn unpublish_and_delete(cluster: &LocalCluster, node: &str, volume: &str) {
    unpublish_from(cluster, node, volume).await;
    cluster
        .controller
        .csi
        .delete_volume(
            csi::DeleteVolumeRequest {
                volume_id: volume.into(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
}

/// Loop devices whose backing file lies under `root`, as `(device, backing file)`: a file
/// deleted since still counts (the kernel names it `<path> (deleted)`; the suffix is cut).
pub fn loop_devices_under(root: &Path) -> Vec<(String, String)> {
    let root = root.to_string_lossy();
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    devices
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let file = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            let file = file.trim_end_matches('\n');
            let file = file.strip_suffix(" (deleted)").unwrap_or(file);
            file.starts_with(&*root)
                .then(|| (format!("/dev/{name}"), file.to_string()))
        })
        .collect()
}

/// A connection to a driver process serving `socket`, once its Probe says ready.
pub async fn connect_ready(socket: &Path) -> CsiConnection {
    let endpoint = csi_grpc::conn::Endpoint::from_path(socket).unwrap();
    let csi = csi_grpc::conn::connect(
        &endpoint,
        Duration::from_secs(20),
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .unwrap();
    csi.probe_until_ready(T).await.unwrap();
    csi
}

/// The mount options of each mount at exactly `path` (mounts stacked there count each), as
/// `/proc/self/mountinfo` has them: the mount's own flags (`ro,nosuid,nodev,...`).
pub fn mounts_at(path: &Path) -> Vec<String> {
    let point = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .filter(|fields| fields.get(4) == Some(&point.as_str()))
        .map(|fields| fields[5].to_string())
        .collect()
}

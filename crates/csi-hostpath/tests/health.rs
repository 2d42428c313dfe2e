//! Volume health, both generations: the conditions the driver observes for real (data
//! removed or replaced, a volume over its capacity, paths unmounted, the state directory
//! gone, its file system full or read-only), ControllerListVolumeHealth's paging and error codes, and the v1.12 VolumeCondition
//! answers of `--volume-health=v1.12|both` as an old client reads them.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use csi::VolumeHealthErrorType::{DataLoss, Degraded, Inaccessible};
use csi::volume_capability::access_mode::Mode;
use csi_grpc::conn::{CsiConnection, DriverInfo, Services, VolumeConditionSupport};
use csi_hostpath::health::HealthApi;
use csi_hostpath::local::LocalCluster;
use csi_proto::csi::{v1 as csi, v1_12};
use tonic::Code;

async fn cluster_with(root: &Path, api: HealthApi) -> LocalCluster {
    LocalCluster::start(root, &["node-a"], |config| {
        config.capacity = [(String::new(), 10 << 30)].into();
        config.volume_health = api;
    })
    .await
    .unwrap()
}

fn data_dir(cluster: &LocalCluster, volume: &str) -> PathBuf {
    cluster.state_dir.join("volumes").join(volume)
}

async fn controller_health(c: &CsiConnection, volume: &str) -> Vec<(i32, String)> {
    let request = csi::ControllerGetVolumeHealthRequest {
        volume_id: volume.into(),
        ..Default::default()
    };
    let health = c.controller_get_volume_health(request, T).await.unwrap();
    let health = health.volume_health.unwrap();
    assert_eq!(health.volume_id, volume);
    health
        .health_statuses
        .into_iter()
        .map(|h| (h.status, h.reason))
        .collect()
}

async fn node_health(n: &CsiConnection, volume: &str) -> Vec<(i32, String)> {
    let request = csi::NodeGetVolumeHealthRequest {
        volume_id: volume.into(),
        ..Default::default()
    };
    let health = n.node_get_volume_health(request, T).await.unwrap();
    let health = health.volume_health.unwrap();
    health
        .health_statuses
        .into_iter()
        .map(|h| (h.status, h.reason))
        .collect()
}

/// NodeGetStorageHealth's answer, as (status, reason) pairs.
async fn storage_health(n: &CsiConnection) -> Vec<(i32, String)> {
    n.node_get_storage_health(Default::default(), T)
        .await
        .unwrap()
        .backend_health
        .into_iter()
        .map(|h| (h.status, h.reason))
        .collect()
}

fn is(status: csi::VolumeHealthErrorType, reason: &str) -> Vec<(i32, String)> {
    vec![(status as i32, reason.to_string())]
}

#[tokio::test]
async fn observed_conditions_paging_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with(dir.path(), HealthApi::V1_13).await;
    let c = &cluster.controller.csi;
    let n = &cluster.node("node-a").csi;
    let healthy = create(c, "healthy", 1 << 20).await.volume_id;
    let missing = create(c, "missing", 1 << 20).await.volume_id;
    let replaced = create(c, "replaced", 1 << 20).await.volume_id;
    let over = create(c, "over", 1 << 20).await.volume_id;
    std::fs::remove_dir_all(data_dir(&cluster, &missing)).unwrap();
    std::fs::remove_dir_all(data_dir(&cluster, &replaced)).unwrap();
    std::fs::write(data_dir(&cluster, &replaced), b"not a directory").unwrap();
    std::fs::write(data_dir(&cluster, &over).join("big"), vec![1u8; 2 << 20]).unwrap();

    let table = [
        (&healthy, vec![]),
        (&missing, is(DataLoss, "VolumeDataMissing")),
        (&replaced, is(Inaccessible, "VolumeDataUnreadable")),
        (&over, is(Degraded, "CapacityExceeded")),
    ];
    for (volume, want) in &table {
        assert_eq!(&controller_health(c, volume).await, want, "{volume}");
        // The node sees the same data conditions (the volume is not used there).
        assert_eq!(&node_health(n, volume).await, want, "{volume} on node-a");
    }

    // The list holds the abnormal volumes only, one per page here, in ID order.
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let request = csi::ControllerListVolumeHealthRequest {
            max_entries: 1,
            starting_token: token.clone(),
            ..Default::default()
        };
        let page = c.controller_list_volume_health(request, T).await.unwrap();
        assert!(page.entries.len() <= 1);
        listed.extend(page.entries.into_iter().map(|e| e.volume_id));
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    let mut abnormal = vec![missing.clone(), replaced.clone(), over.clone()];
    abnormal.sort();
    assert_eq!(listed, abnormal);
    let all = c
        .controller_list_volume_health(Default::default(), T)
        .await
        .unwrap();
    assert_eq!(all.entries.len(), 3);
    assert!(all.next_token.is_empty());

    let list = |max_entries: i32, starting_token: &str| csi::ControllerListVolumeHealthRequest {
        max_entries,
        starting_token: starting_token.into(),
        ..Default::default()
    };
    let get = |volume_id: &str| csi::ControllerGetVolumeHealthRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    };
    let node_get = |volume_id: &str| csi::NodeGetVolumeHealthRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    };
    let unknown = "3f2c7b5e-0000-4000-8000-000000000000";
    assert_eq!(
        code(c.controller_list_volume_health(list(0, "bogus"), T).await),
        Code::Aborted
    );
    assert_eq!(
        code(c.controller_list_volume_health(list(-1, ""), T).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.controller_get_volume_health(get(""), T).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.controller_get_volume_health(get(unknown), T).await),
        Code::NotFound
    );
    assert_eq!(
        code(n.node_get_volume_health(node_get(""), T).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(n.node_get_volume_health(node_get(unknown), T).await),
        Code::NotFound
    );

    // Repaired behind the driver's back: healthy again.
    std::fs::remove_file(data_dir(&cluster, &over).join("big")).unwrap();
    assert_eq!(controller_health(c, &over).await, []);
    cluster.stop().await;
}

#[tokio::test]
async fn storage_health_follows_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with(dir.path(), HealthApi::V1_13).await;
    let n = &cluster.node("node-a").csi;
    let storage = || storage_health(n);
    assert_eq!(storage().await, []);
    let aside = dir.path().join("moved-away");
    std::fs::rename(&cluster.state_dir, &aside).unwrap();
    assert_eq!(
        storage().await,
        [(
            csi::StorageHealthErrorType::StorageUnreachable as i32,
            "StateDirectoryUnreadable".to_string()
        )]
    );
    std::fs::rename(&aside, &cluster.state_dir).unwrap();
    assert_eq!(storage().await, []);
    cluster.stop().await;
}

#[tokio::test]
async fn unmounted_paths_and_fencing_are_seen_from_both_sides() {
    if !root_or_skip("unmounted_paths_and_fencing_are_seen_from_both_sides") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster_with(dir.path(), HealthApi::V1_13).await;
    let c = &cluster.controller.csi;
    let n = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(c, "mounted", 1 << 20).await.volume_id;
    let (staging, target) = attach_and_mount(&cluster, "node-a", &volume, &cap).await;
    assert_eq!(node_health(n, &volume).await, []);
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    assert_eq!(
        node_health(n, &volume).await,
        is(Inaccessible, "PublishPathNotMounted")
    );
    rustix::mount::unmount(&staging, rustix::mount::UnmountFlags::empty()).unwrap();
    assert_eq!(
        node_health(n, &volume).await,
        [
            (Inaccessible as i32, "PublishPathNotMounted".to_string()),
            (Inaccessible as i32, "StagingPathNotMounted".to_string()),
        ]
    );
    // The CO may name a path where publishing failed.
    let named = csi::NodeGetVolumeHealthRequest {
        volume_id: volume.clone(),
        volume_publish_path: dir.path().join("never-published").display().to_string(),
        ..Default::default()
    };
    let health = n.node_get_volume_health(named, T).await.unwrap();
    let message = &health.volume_health.unwrap().health_statuses[0].message;
    assert!(message.contains("never-published"), "{message}");
    assert_eq!(controller_health(c, &volume).await, [], "the data is fine");

    // Unpublished while staged: the node fences itself.
    unpublish_from(&cluster, "node-a", &volume).await;
    let mut fenced = vec![];
    for _ in 0..50 {
        fenced = controller_health(c, &volume).await;
        if !fenced.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(fenced, is(Degraded, "NodeFenced"));
    assert!(
        node_health(n, &volume)
            .await
            .contains(&(Inaccessible as i32, "NodeFenced".to_string()))
    );
    cluster.stop().await;
}

/// A v1.12-mode driver advertises VOLUME_CONDITION, not the health RPCs, and answers the old
/// fields from the same checks; `both` serves the two generations.
#[tokio::test]
async fn v1_12_mode_answers_volume_condition() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with(dir.path(), HealthApi::V1_12).await;
    let c = &cluster.controller.csi;
    let n = &cluster.node("node-a").csi;
    let controller = DriverInfo::discover(c, T, Services::CONTROLLER)
        .await
        .unwrap();
    let node = DriverInfo::discover(
        n,
        T,
        Services {
            plugin: false,
            controller: false,
            node: true,
        },
    )
    .await
    .unwrap();
    use csi::controller_service_capability::rpc::Type as Rpc;
    use csi::node_service_capability::rpc::Type as NodeRpc;
    assert_eq!(
        controller.volume_condition,
        VolumeConditionSupport {
            controller: true,
            node: false
        }
    );
    assert_eq!(
        node.volume_condition,
        VolumeConditionSupport {
            controller: false,
            node: true
        }
    );
    assert!(!controller.has_controller(Rpc::GetVolumeHealth));
    assert!(!controller.has_controller(Rpc::ListVolumeHealth));
    assert!(!node.has_node(NodeRpc::GetVolumeHealth));
    assert!(!node.has_node(NodeRpc::GetStorageHealth));

    let healthy = create(c, "healthy", 1 << 20).await.volume_id;
    let missing = create(c, "missing", 1 << 20).await.volume_id;
    std::fs::remove_dir_all(data_dir(&cluster, &missing)).unwrap();
    let listed = c
        .legacy_list_volumes(v1_12::ListVolumesRequest::default(), T)
        .await
        .unwrap();
    let condition = |id: &str| {
        listed
            .entries
            .iter()
            .find(|e| e.volume.as_ref().unwrap().volume_id == id)
            .and_then(|e| e.status.clone()?.volume_condition)
            .unwrap()
    };
    assert!(!condition(&healthy).abnormal);
    let gone = condition(&missing);
    assert!(
        gone.abnormal && gone.message.contains("VolumeDataMissing"),
        "{gone:?}"
    );
    let got = c
        .legacy_controller_get_volume(
            v1_12::ControllerGetVolumeRequest {
                volume_id: missing.clone(),
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(got.status.unwrap().volume_condition, Some(gone));
    // A v1.13 client of the same methods reads everything but the condition.
    let current = c.list_volumes(Default::default(), T).await.unwrap();
    assert_eq!(current.entries.len(), 2);

    for result in [
        code(c.controller_list_volume_health(Default::default(), T).await),
        code(
            c.controller_get_volume_health(
                csi::ControllerGetVolumeHealthRequest {
                    volume_id: healthy.clone(),
                    ..Default::default()
                },
                T,
            )
            .await,
        ),
        code(n.node_get_storage_health(Default::default(), T).await),
    ] {
        assert_eq!(result, Code::Unimplemented);
    }

    if csi_hostpath::mounts::skip_without_root("v1_12_mode_answers_volume_condition (node stats)") {
        cluster.stop().await;
        return;
    }
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let (_staging, target) =
        attach_and_mount(&cluster, "node-a", &healthy, &mount(Mode::SingleNodeWriter)).await;
    let stats = |volume_path: &Path| v1_12::NodeGetVolumeStatsRequest {
        volume_id: healthy.clone(),
        volume_path: volume_path.display().to_string(),
        staging_target_path: String::new(),
    };
    let answer = n
        .legacy_node_get_volume_stats(stats(&target), T)
        .await
        .unwrap();
    assert!(!answer.usage.is_empty());
    assert_eq!(answer.volume_condition.map(|c| c.abnormal), Some(false));
    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    let answer = n
        .legacy_node_get_volume_stats(stats(&target), T)
        .await
        .unwrap();
    let condition = answer.volume_condition.unwrap();
    assert!(condition.abnormal && condition.message.contains("PublishPathNotMounted"));
    cluster.stop().await;
}

#[tokio::test]
async fn both_mode_serves_both_generations() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with(dir.path(), HealthApi::Both).await;
    let c = &cluster.controller.csi;
    let controller = DriverInfo::discover(c, T, Services::CONTROLLER)
        .await
        .unwrap();
    use csi::controller_service_capability::rpc::Type as Rpc;
    assert!(controller.volume_condition.controller);
    assert!(controller.has_controller(Rpc::ListVolumeHealth));
    let missing = create(c, "missing", 1 << 20).await.volume_id;
    std::fs::remove_dir_all(data_dir(&cluster, &missing)).unwrap();
    assert_eq!(
        controller_health(c, &missing).await,
        is(DataLoss, "VolumeDataMissing")
    );
    let listed = c.legacy_list_volumes(Default::default(), T).await.unwrap();
    let status = listed.entries[0].status.clone().unwrap();
    assert!(status.volume_condition.unwrap().abnormal);
    cluster.stop().await;
}

/// Runs `mount` with `args`, failing the test with its message.
fn run_mount(args: &[&str]) {
    let output = std::process::Command::new("mount")
        .args(args)
        .output()
        .expect("mount runs");
    assert!(
        output.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The driver's state on a small file system of its own (a tmpfs): filled up, the storage is
/// reported full; made read-only, a volume's data and the storage are reported read-only.
#[tokio::test]
async fn a_full_or_read_only_file_system_is_seen() {
    if !root_or_skip("a_full_or_read_only_file_system_is_seen") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    run_mount(&[
        "-t",
        "tmpfs",
        "-o",
        "size=8m",
        "tmpfs",
        &small.to_string_lossy(),
    ]);
    let _detach = Detach(small.clone());
    let cluster = cluster_with(&small, HealthApi::V1_13).await;
    let c = &cluster.controller.csi;
    let n = &cluster.node("node-a").csi;
    let volume = create(c, "on-tmpfs", 1 << 20).await.volume_id;
    let storage = || storage_health(n);
    assert_eq!(storage().await, []);

    // Fill the file system: the storage is full (the volume itself is within its capacity).
    let filler = small.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 1 << 20];
    while std::io::Write::write_all(&mut file, &chunk).is_ok() {}
    drop(file);
    let degraded = csi::StorageHealthErrorType::StorageDegraded as i32;
    assert_eq!(storage().await, [(degraded, "StorageFull".to_string())]);
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(storage().await, []);

    // Read-only, by read-only bind mounts (a remount of the tmpfs is refused while the driver
    // holds files open for writing): over one volume's data, that volume cannot be written;
    // over the whole state directory, the storage cannot take a volume.
    let data = data_dir(&cluster, &volume).to_string_lossy().to_string();
    run_mount(&["--bind", &data, &data]);
    run_mount(&["-o", "remount,bind,ro", &data]);
    assert_eq!(
        controller_health(c, &volume).await,
        is(Degraded, "BackingFilesystemReadOnly")
    );
    unmount(&data);
    assert_eq!(controller_health(c, &volume).await, []);
    let state = cluster.state_dir.to_string_lossy().to_string();
    run_mount(&["--bind", &state, &state]);
    run_mount(&["-o", "remount,bind,ro", &state]);
    let read_only = storage().await;
    let volume_read_only = controller_health(c, &volume).await;
    unmount(&state);
    assert_eq!(read_only, [(degraded, "StorageReadOnly".to_string())]);
    assert_eq!(volume_read_only, is(Degraded, "BackingFilesystemReadOnly"));
    assert_eq!(storage().await, []);

    cluster.stop().await;
}

/// A volume's data on a file system whose device fails (an ext4 image on a loop device whose
/// backing file is cut short, caches dropped): reading it gives EIO, reported as the backing
/// file system failing, and it is back to normal once the device is gone from under it.
#[tokio::test]
async fn a_failing_file_system_under_a_volume_is_seen() {
    if !root_or_skip("a_failing_file_system_under_a_volume_is_seen") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with(dir.path(), HealthApi::V1_13).await;
    let c = &cluster.controller.csi;
    let volume = create(c, "failing", 1 << 20).await.volume_id;
    let data = data_dir(&cluster, &volume);
    let image = dir.path().join("failing.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mkfs = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&image)
        .status()
        .expect("mkfs.ext4 runs");
    assert!(mkfs.success());
    let image_arg = image.to_string_lossy().to_string();
    let data_arg = data.to_string_lossy().to_string();
    run_mount(&["-o", "loop", &image_arg, &data_arg]);
    let _detach = Detach(data.clone());
    // Enough entries that the directory has blocks of its own to read back.
    for n in 0..64 {
        std::fs::write(data.join(format!("file-{n}")), b"data").unwrap();
    }
    // Remounted, so that nothing of the directory waits in the journal or in memory.
    unmount(&data_arg);
    run_mount(&["-o", "loop", &image_arg, &data_arg]);
    assert_eq!(controller_health(c, &volume).await, []);

    std::fs::File::options()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(0)
        .unwrap();
    let device = std::process::Command::new("losetup")
        .args(["-j", &image_arg, "-O", "NAME", "-n"])
        .output()
        .expect("losetup runs");
    let device = String::from_utf8_lossy(&device.stdout).trim().to_string();
    assert!(!device.is_empty(), "the image's loop device");
    let resized = std::process::Command::new("losetup")
        .args(["-c", &device])
        .status()
        .expect("losetup runs");
    assert!(resized.success());
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("caches dropped");
    let failing = controller_health(c, &volume).await;
    unmount(&data_arg);
    assert_eq!(failing, is(Inaccessible, "BackingFilesystemError"));
    assert_eq!(controller_health(c, &volume).await, []);
    cluster.stop().await;
}

/// Detaches a mount, and whatever is mounted under it, when dropped: a failed test leaves
/// nothing mounted.
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Runs `umount` on `path`, failing the test with its message.
fn unmount(path: &str) {
    let output = std::process::Command::new("umount")
        .arg(path)
        .output()
        .expect("umount runs");
    assert!(
        output.status.success(),
        "umount {path}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

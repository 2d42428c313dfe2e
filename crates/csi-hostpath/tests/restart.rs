//! The node's records against what the machine really has (root only; skipped with a reason
//! otherwise): after a restart every mount and loop device is gone while the records stay, and
//! a loop number freed by one volume can be taken by another. NodeStage and NodePublish must
//! then stage and publish again, never answer from the record alone, and never hand a pod, or
//! detach, a loop device that is another volume's.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi_proto::csi::v1 as csi;

/// Writes `marker` at the start of the block volume `volume`'s image.
fn mark_image(state: &Path, volume: &str, marker: &[u8]) {
    let mut image = std::fs::OpenOptions::new()
        .write(true)
        .open(state.join("volumes").join(format!("{volume}.img")))
        .unwrap();
    image.write_all(marker).unwrap();
    image.sync_all().unwrap();
}

fn first_bytes(path: &Path, count: usize) -> Vec<u8> {
    let mut file = std::fs::File::open(path).unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    let mut bytes = vec![0; count];
    let read = file.read(&mut bytes).unwrap();
    bytes.truncate(read);
    bytes
}

#[tokio::test]
async fn after_a_restart_a_filesystem_volume_is_staged_and_published_again() {
    if !root_or_skip("after_a_restart_a_filesystem_volume_is_staged_and_published_again") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(&cluster.controller.csi, "fs", 16 << 20)
        .await
        .volume_id;
    let (staging, target) = attach_and_mount(&cluster, "node-a", &volume, &cap).await;
    assert_eq!(mounts_under(dir.path()).len(), 2);

    drop_mounts_and_loop_devices(dir.path());
    // kubelet after the restart: stage, then publish, as it did before.
    a.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    assert_eq!(
        mounts_under(dir.path()).len(),
        2,
        "staging and target mounted again"
    );
    std::fs::write(target.join("after-restart.txt"), b"kept").unwrap();
    let stored = cluster.state_dir.join("volumes").join(&volume);
    assert_eq!(
        std::fs::read(stored.join("after-restart.txt")).unwrap(),
        b"kept",
        "the pod's writes land in the volume, not in the kubelet's directory"
    );

    teardown(a, &volume, &staging, &target).await;
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

#[tokio::test]
async fn a_reused_loop_device_is_never_handed_to_another_volume() {
    if !root_or_skip("a_reused_loop_device_is_never_handed_to_another_volume") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = &cluster.node("node-a").csi;
    let cap = block(Mode::SingleNodeWriter);
    let mut ids = Vec::new();
    for name in ["blk-a", "blk-b"] {
        let created = c
            .create_volume(create_request(name, 16 << 20, cap.clone()), T)
            .await
            .unwrap();
        ids.push(created.volume.unwrap().volume_id);
    }
    let (volume_a, volume_b) = (&ids[0], &ids[1]);
    mark_image(&cluster.state_dir, volume_a, b"volume A");
    mark_image(&cluster.state_dir, volume_b, b"volume B");
    let (staging, target) = attach_and_mount(&cluster, "node-a", volume_a, &cap).await;
    assert_eq!(first_bytes(&target, 8), b"volume A");
    let image_a = cluster
        .state_dir
        .join("volumes")
        .join(format!("{volume_a}.img"));
    let image_b = cluster
        .state_dir
        .join("volumes")
        .join(format!("{volume_b}.img"));
    let device = csi_hostpath::mounts::loop_device_of(&image_a)
        .unwrap()
        .expect("volume A's loop device");

    // A restart, after which volume B gets the loop number A had.
    drop_mounts_and_loop_devices(dir.path());
    let bound = std::process::Command::new("losetup")
        .args([device.as_str(), &image_b.display().to_string()])
        .status()
        .unwrap();
    assert!(bound.success(), "losetup {device} onto volume B's image");

    a.node_stage_volume(stage(volume_a, &staging, cap.clone()), T)
        .await
        .unwrap();
    a.node_publish_volume(publish(volume_a, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    assert_eq!(
        first_bytes(&target, 8),
        b"volume A",
        "the pod of volume A reads volume A"
    );
    let device_a = csi_hostpath::mounts::loop_device_of(&image_a)
        .unwrap()
        .expect("volume A attached again");
    assert_ne!(device_a, device);

    teardown(a, volume_a, &staging, &target).await;
    assert_eq!(
        csi_hostpath::mounts::loop_device_of(&image_b).unwrap(),
        Some(device.clone()),
        "volume B's device is left bound to B"
    );
    assert_eq!(
        csi_hostpath::mounts::loop_device_of(&image_a).unwrap(),
        None,
        "volume A's own device detached"
    );
    cluster.stop().await;
}

//! Node RPCs with real bind mounts and loop devices (root only; skipped with a reason
//! otherwise), the fencing guarantee, and cleanup of every mount and loop device.

mod common;

use csi::VolumeHealthErrorType::Inaccessible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi_proto::csi::v1 as csi;
use tonic::Code;

#[tokio::test]
async fn filesystem_volume_lifecycle_and_error_table() {
    if !root_or_skip("filesystem_volume_lifecycle_and_error_table") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(c, "fs", GI / 4).await.volume_id;
    let (staging, target) = paths(&cluster, "node-a", &volume);

    assert_eq!(
        code(
            a.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
                .await
        ),
        Code::FailedPrecondition,
        "not published to node-a yet"
    );
    c.controller_publish_volume(publish_to(&volume, "node-a", cap.clone()), T)
        .await
        .unwrap();
    assert_eq!(
        code(
            a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
                .await
        ),
        Code::FailedPrecondition,
        "not staged yet"
    );
    a.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    a.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    assert_eq!(
        mounts_under(dir.path()).len(),
        2,
        "staging and target are mounted once each"
    );

    // Data written through the target lands in the volume.
    std::fs::write(target.join("data.txt"), b"written on node-a").unwrap();
    let stored = cluster
        .state_dir
        .join("volumes")
        .join(&volume)
        .join("data.txt");
    assert_eq!(std::fs::read(&stored).unwrap(), b"written on node-a");

    let other_staging = staging.with_file_name("elsewhere");
    std::fs::create_dir_all(&other_staging).unwrap();
    let second_target = target.with_file_name("second");
    let outside = PathBuf::from("/etc/csi-target");
    let table = [
        (
            "stage: missing volume id",
            code(
                a.node_stage_volume(stage("", &staging, cap.clone()), T)
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "stage: missing staging path",
            code(
                a.node_stage_volume(stage(&volume, Path::new(""), cap.clone()), T)
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "stage: unknown volume",
            code(
                a.node_stage_volume(stage("unknown", &staging, cap.clone()), T)
                    .await,
            ),
            Code::NotFound,
        ),
        (
            "stage: already staged elsewhere",
            code(
                a.node_stage_volume(stage(&volume, &other_staging, cap.clone()), T)
                    .await,
            ),
            Code::AlreadyExists,
        ),
        (
            "stage: block capability on a filesystem volume",
            code(
                a.node_stage_volume(stage(&volume, &staging, block(Mode::SingleNodeWriter)), T)
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "publish: missing target",
            code(
                a.node_publish_volume(
                    publish(&volume, &staging, Path::new(""), cap.clone(), false),
                    T,
                )
                .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "publish: target outside the allowed roots",
            code(
                a.node_publish_volume(publish(&volume, &staging, &outside, cap.clone(), false), T)
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "publish: same target read-only",
            code(
                a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), true), T)
                    .await,
            ),
            Code::AlreadyExists,
        ),
        (
            "publish: single writer at a second target",
            code(
                a.node_publish_volume(
                    publish(&volume, &staging, &second_target, cap.clone(), false),
                    T,
                )
                .await,
            ),
            Code::FailedPrecondition,
        ),
        (
            "publish: no capability",
            code(
                a.node_publish_volume(
                    csi::NodePublishVolumeRequest {
                        volume_capability: None,
                        ..publish(&volume, &staging, &target, cap.clone(), false)
                    },
                    T,
                )
                .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "unpublish: unknown volume",
            code(
                a.node_unpublish_volume(unpublish("unknown", &target), T)
                    .await,
            ),
            Code::NotFound,
        ),
        (
            "unpublish: missing target",
            code(
                a.node_unpublish_volume(unpublish(&volume, Path::new("")), T)
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            "unstage: missing volume id",
            code(a.node_unstage_volume(unstage("", &staging), T).await),
            Code::InvalidArgument,
        ),
    ];
    for (case, got, want) in table {
        assert_eq!(got, want, "{case}");
    }
    assert!(!outside.exists(), "nothing was created outside the roots");

    // A multi-writer capability may publish at a second target, read-only.
    let multi = mount(Mode::SingleNodeMultiWriter);
    a.node_publish_volume(publish(&volume, &staging, &second_target, multi, true), T)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(second_target.join("data.txt")).unwrap(),
        b"written on node-a"
    );
    let refused = std::fs::write(second_target.join("nope"), b"x").unwrap_err();
    assert_eq!(
        refused.raw_os_error(),
        Some(30),
        "EROFS on the read-only target: {refused}"
    );

    // Stats and expansion.
    let stats = a
        .node_get_volume_stats(
            csi::NodeGetVolumeStatsRequest {
                volume_id: volume.clone(),
                volume_path: target.display().to_string(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert_eq!((bytes.total, bytes.used), (GI / 4, 17));
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32 && u.used >= 2)
    );
    let wrong_path = csi::NodeGetVolumeStatsRequest {
        volume_id: volume.clone(),
        volume_path: "/tmp/not-it".into(),
        ..Default::default()
    };
    assert_eq!(
        code(a.node_get_volume_stats(wrong_path, T).await),
        Code::NotFound
    );
    let unknown = csi::NodeGetVolumeStatsRequest {
        volume_id: "unknown".into(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    assert_eq!(
        code(a.node_get_volume_stats(unknown, T).await),
        Code::NotFound
    );
    let grow = csi::ControllerExpandVolumeRequest {
        volume_id: volume.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: GI / 2,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    c.controller_expand_volume(grow, T).await.unwrap();
    let expanded = a
        .node_expand_volume(
            csi::NodeExpandVolumeRequest {
                volume_id: volume.clone(),
                volume_path: target.display().to_string(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(expanded.capacity_bytes, GI / 2);

    // Teardown is idempotent and removes the target path; the data stays in the volume.
    a.node_unpublish_volume(unpublish(&volume, &second_target), T)
        .await
        .unwrap();
    teardown(a, &volume, &staging, &target).await;
    teardown(a, &volume, &staging, &target).await;
    assert!(
        !target.exists(),
        "NodeUnpublishVolume removes the target path"
    );
    assert!(
        mounts_under(dir.path()).is_empty(),
        "no mounts left: {:?}",
        mounts_under(dir.path())
    );
    assert_eq!(std::fs::read(&stored).unwrap(), b"written on node-a");
    unpublish_and_delete(&cluster, "node-a", &volume).await;
    cluster.stop().await;
}

#[tokio::test]
async fn block_volume_lifecycle_uses_a_loop_device() {
    if !root_or_skip("block_volume_lifecycle_uses_a_loop_device") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = &cluster.node("node-a").csi;
    let cap = block(Mode::SingleNodeWriter);
    let volume = c
        .create_volume(create_request("blk", 16 << 20, cap.clone()), T)
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id;
    let (staging, target) = attach_and_mount(&cluster, "node-a", &volume, &cap).await;
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata(&target)
            .unwrap()
            .file_type()
            .is_block_device(),
        "the target is the loop device"
    );
    let image = cluster
        .state_dir
        .join("volumes")
        .join(format!("{volume}.img"));
    let device = csi_hostpath::mounts::loop_device_of(&image)
        .unwrap()
        .expect("a loop device backs the image");

    // Writes to the device reach the image.
    use std::io::{Seek, SeekFrom, Write};
    let mut dev = std::fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .unwrap();
    dev.seek(SeekFrom::Start(4096)).unwrap();
    dev.write_all(b"block data").unwrap();
    dev.sync_all().unwrap();
    drop(dev);
    let raw = std::fs::read(&image).unwrap();
    assert_eq!(&raw[4096..4106], b"block data");

    // Expansion needs the node step for block volumes.
    let grow = csi::ControllerExpandVolumeRequest {
        volume_id: volume.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 32 << 20,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert!(
        c.controller_expand_volume(grow, T)
            .await
            .unwrap()
            .node_expansion_required
    );
    a.node_expand_volume(
        csi::NodeExpandVolumeRequest {
            volume_id: volume.clone(),
            volume_path: target.display().to_string(),
            ..Default::default()
        },
        T,
    )
    .await
    .unwrap();
    let size = std::fs::read_to_string(format!(
        "/sys/block/{}/size",
        device.trim_start_matches("/dev/")
    ))
    .unwrap();
    assert_eq!(
        size.trim().parse::<u64>().unwrap() * 512,
        32 << 20,
        "the loop device sees the new size"
    );

    teardown(a, &volume, &staging, &target).await;
    assert!(!target.exists());
    assert_eq!(
        csi_hostpath::mounts::loop_device_of(&image).unwrap(),
        None,
        "loop device detached"
    );
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

#[tokio::test]
async fn controller_unpublish_fences_the_node_within_a_second() {
    if !root_or_skip("controller_unpublish_fences_the_node_within_a_second") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = &cluster.node("node-a").csi;
    let b = &cluster.node("node-b").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(c, "fenced", GI / 4).await.volume_id;
    let (staging, target) = attach_and_mount(&cluster, "node-a", &volume, &cap).await;

    // A "zombie" writer on node-a holds the file open and keeps appending.
    let log = target.join("log");
    let mut writer = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec 3>>{}; while :; do echo line >&3; sleep 0.01; done",
            log.display()
        ))
        .spawn()
        .unwrap();
    let stored = cluster.state_dir.join("volumes").join(&volume).join("log");
    let size = || std::fs::metadata(&stored).map_or(0, |m| m.len());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(size() > 0, "the writer is writing");

    let unpublished = std::time::Instant::now();
    c.controller_unpublish_volume(
        csi::ControllerUnpublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: "node-a".into(),
            ..Default::default()
        },
        T,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(unpublished.elapsed())).await;
    let after_one_second = size();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        size(),
        after_one_second,
        "no byte from node-a lands after 1 s"
    );
    let status = writer.try_wait().unwrap();
    assert!(status.is_some(), "the writer was stopped");
    let _ = writer.wait();
    // New writes through node-a's mounts fail.
    assert!(std::fs::write(target.join("late"), b"x").is_err());
    let health = node_health(a, &volume).await;
    assert!(
        health
            .iter()
            .any(|h| h.reason == "NodeFenced" && h.status == Inaccessible as i32),
        "{health:?}"
    );

    // Failover: node-b gets the volume and sees node-a's data.
    c.controller_publish_volume(publish_to(&volume, "node-b", cap.clone()), T)
        .await
        .unwrap();
    let (staging_b, target_b) = paths(&cluster, "node-b", &volume);
    b.node_stage_volume(stage(&volume, &staging_b, cap.clone()), T)
        .await
        .unwrap();
    b.node_publish_volume(
        publish(&volume, &staging_b, &target_b, cap.clone(), false),
        T,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::metadata(target_b.join("log")).unwrap().len(),
        after_one_second
    );
    std::fs::write(target_b.join("from-b"), b"node-b writes").unwrap();

    // The kubelet of node-a still cleans up its fenced mounts.
    teardown(a, &volume, &staging, &target).await;
    teardown(b, &volume, &staging_b, &target_b).await;
    assert!(
        mounts_under(dir.path()).is_empty(),
        "{:?}",
        mounts_under(dir.path())
    );
    cluster.stop().await;
}

#[tokio::test]
async fn publishing_to_a_fenced_node_again_lifts_the_fence() {
    if !root_or_skip("publishing_to_a_fenced_node_again_lifts_the_fence") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(c, "refenced", GI / 4).await.volume_id;
    let (staging, target) = attach_and_mount(&cluster, "node-a", &volume, &cap).await;
    let unpublish = csi::ControllerUnpublishVolumeRequest {
        volume_id: volume.clone(),
        node_id: "node-a".into(),
        ..Default::default()
    };
    c.controller_unpublish_volume(unpublish, T).await.unwrap();
    let mut fenced = false;
    for _ in 0..50 {
        if node_health(a, &volume)
            .await
            .iter()
            .any(|h| h.reason == "NodeFenced")
        {
            fenced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fenced, "node-a is fenced");
    assert!(std::fs::write(target.join("blocked"), b"x").is_err());

    // Published again: the same (idempotent) stage and publish give write access back at once.
    c.controller_publish_volume(publish_to(&volume, "node-a", cap.clone()), T)
        .await
        .unwrap();
    a.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    std::fs::write(target.join("allowed"), b"writable again").unwrap();
    let health = node_health(a, &volume).await;
    assert_eq!(health, [], "healthy again");
    teardown(a, &volume, &staging, &target).await;
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

/// NodeGetVolumeHealth of a volume, as the CO asks it without paths.
async fn node_health(
    node: &csi_grpc::conn::CsiConnection,
    volume: &str,
) -> Vec<csi::volume_health::VolumeHealthEntry> {
    let request = csi::NodeGetVolumeHealthRequest {
        volume_id: volume.to_string(),
        ..Default::default()
    };
    let response = node.node_get_volume_health(request, T).await.unwrap();
    response.volume_health.unwrap().health_statuses
}

/// The user the driver runs as when the test itself runs as root (as in CI): `nobody`.
const UNPRIVILEGED: u32 = 65534;

/// Without the privileges to mount, NodeStageVolume fails with FAILED_PRECONDITION and says
/// why, mounting nothing. The real binary runs without root: as this test's own user, or (when
/// the test runs as root) as `nobody`, so the test always runs.
#[tokio::test]
async fn node_rpcs_without_root_fail_cleanly() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let socket = root.join("csi.sock");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_csi-hostpath"));
    command
        .args(["--mode=both", "--nodeid=node-a"])
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!("--statedir={}", root.join("state").display()))
        .arg(format!("--allowed-path-roots={}", root.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(root, Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
        command.uid(UNPRIVILEGED).gid(UNPRIVILEGED);
    }
    let mut driver = command.spawn().unwrap();
    let endpoint = csi_grpc::conn::Endpoint::from_path(&socket).unwrap();
    let csi = csi_grpc::conn::connect(
        &endpoint,
        T,
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .unwrap();
    csi.probe_until_ready(T).await.unwrap();
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(&csi, "unprivileged", GI / 4).await.volume_id;
    csi.controller_publish_volume(publish_to(&volume, "node-a", cap.clone()), T)
        .await
        .unwrap();
    let staging = root.join("staging");
    let refused = csi
        .node_stage_volume(stage(&volume, &staging, cap), T)
        .await
        .expect_err("staging without root");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("root"), "{}", refused.message());
    assert!(mounts_under(root).is_empty(), "nothing mounted");
    driver.kill().unwrap();
    driver.wait().unwrap();
}

//! ext4 volumes (fs_type ext4): images each node reaches through its own export, and the
//! data-layer fence that cutting an export is (root only; skipped with a reason otherwise).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_grpc::conn::CsiConnection;
use csi_hostpath::local::LocalCluster;
use csi_proto::csi::v1 as csi;
use tonic::Code;

const MI: i64 = 1 << 20;

fn ext4(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..MountVolume::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

async fn create_ext4(c: &CsiConnection, name: &str, bytes: i64) -> csi::Volume {
    c.create_volume(create_request(name, bytes, ext4(Mode::SingleNodeWriter)), T)
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {name}: {e}"))
        .volume
        .unwrap()
}

async fn unmount_and_detach(
    cluster: &LocalCluster,
    node: &str,
    volume: &str,
    at: (PathBuf, PathBuf),
) {
    teardown(&cluster.node(node).csi, volume, &at.0, &at.1).await;
    unpublish_from(cluster, node, volume).await;
}

/// What a container would run: its own mount and PID namespaces (so neither a host-side
/// unmount nor a host-side search of its mounts reaches it), appending a numbered record per
/// write, each write its own open of the file, and one more through a file held open.
fn writer_in_own_namespaces(dir: &Path, errors: &Path) -> Child {
    Command::new("unshare")
        .args(["--mount", "--pid", "--fork", "--kill-child", "sh", "-c"])
        .arg(format!(
            "exec 3>>{dir}/held; i=0; while :; do i=$((i+1)); echo $i >> {dir}/records; echo $i >&3; sleep 0.01; done",
            dir = dir.display()
        ))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(errors).unwrap())
        .spawn()
        .unwrap()
}

/// The whole records of a file (a line the writer is still writing is left out).
fn records(path: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|line| {
            line.parse()
                .unwrap_or_else(|_| panic!("a torn record {line:?}"))
        })
        .collect()
}

/// The root (within its filesystem) of the mount at `point`, from mountinfo.
fn mount_root(point: &Path) -> String {
    let point = point.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .rev()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .find(|fields| fields[4] == point)
        .map(|fields| fields[3].to_string())
        .unwrap_or_else(|| panic!("{point} is not mounted"))
}

/// Whether this process has CAP_SYS_RESOURCE, which online ext4 resizing needs.
fn image_is_clean(image: &Path) {
    let check = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "e2fsck {}: {}",
        image.display(),
        String::from_utf8_lossy(&check.stdout)
    );
}

#[tokio::test]
async fn a_cut_export_stops_a_writer_of_a_failed_node_in_its_own_namespaces() {
    if !root_or_skip("a_cut_export_stops_a_writer_of_a_failed_node_in_its_own_namespaces") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let mut cluster = cluster(dir.path()).await;
    let volume = create_ext4(&cluster.controller.csi, "fenced", 64 * MI)
        .await
        .volume_id;
    let at_a = attach_and_mount(&cluster, "node-a", &volume, &ext4(Mode::SingleNodeWriter)).await;
    let errors = dir.path().join("writer-errors");
    let mut writer = writer_in_own_namespaces(&at_a.1, &errors);
    let written = || records(&at_a.1.join("records")).len();
    for _ in 0..200 {
        if written() > 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(written() > 20, "the writer is writing");

    // node-a fails: its plugin is gone, so nothing on node-a cooperates with the fence.
    cluster.fail_node("node-a").await;
    unpublish_from(&cluster, "node-a", &volume).await;

    let at_b = attach_and_mount(&cluster, "node-b", &volume, &ext4(Mode::SingleNodeWriter)).await;
    let at_fence = records(&at_b.1.join("records"));
    let held_at_fence = records(&at_b.1.join("held"));
    assert!(
        at_fence.len() > 20,
        "records written before the fence are kept"
    );
    assert_eq!(
        at_fence,
        (1..=at_fence.len() as u64).collect::<Vec<_>>(),
        "the records are whole and contiguous"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the writer still runs: the fence did not depend on stopping it"
    );
    assert_eq!(
        records(&at_b.1.join("records")),
        at_fence,
        "no record after the fence"
    );
    assert_eq!(
        records(&at_b.1.join("held")),
        held_at_fence,
        "nothing through the held file"
    );
    assert!(
        std::fs::read_to_string(&errors)
            .unwrap()
            .contains("I/O error"),
        "the writer's writes fail: {}",
        std::fs::read_to_string(&errors).unwrap()
    );
    assert!(
        std::fs::write(at_a.1.join("late"), "x").is_err(),
        "node-a's mounts refuse writes"
    );
    std::fs::write(at_b.1.join("from-b"), "node-b writes").unwrap();

    let _ = writer.kill();
    let _ = writer.wait();
    unmount_and_detach(&cluster, "node-b", &volume, at_b).await;
    // node-a's kubelet never came back; its mounts go with the node (here: the test).
    for path in [&at_a.1, &at_a.0] {
        rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH).unwrap();
    }
    let image = cluster
        .state_dir
        .join("volumes")
        .join(format!("{volume}.img"));
    image_is_clean(&image);
    assert!(
        csi_hostpath::mounts::loop_device_of(&image)
            .unwrap()
            .is_none(),
        "no loop device is left on the image"
    );
    let exports = cluster.state_dir.join("exports");
    assert!(
        mounts_under(&exports).is_empty(),
        "{:?}",
        mounts_under(&exports)
    );
    cluster.stop().await;
}

#[tokio::test]
async fn ext4_volumes_export_clone_snapshot_expand_and_refuse_what_ext4_cannot_do() {
    if !root_or_skip("ext4_volumes_export_clone_snapshot_expand_and_refuse_what_ext4_cannot_do") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;

    let refused = [
        create_request("multi", 64 * MI, ext4(Mode::MultiNodeMultiWriter)),
        create_request("xfs", 64 * MI, {
            let mut cap = ext4(Mode::SingleNodeWriter);
            if let Some(AccessType::Mount(m)) = &mut cap.access_type {
                m.fs_type = "xfs".into();
            }
            cap
        }),
    ];
    for request in refused {
        let name = request.name.clone();
        assert_eq!(
            code(c.create_volume(request, T).await),
            Code::InvalidArgument,
            "{name}"
        );
    }
    let tiny = create_ext4(c, "tiny", 1).await;
    assert_eq!(
        tiny.capacity_bytes,
        16 * MI,
        "rounded up to the smallest ext4 volume"
    );

    let volume = create_ext4(c, "data", 32 * MI).await.volume_id;
    // NodeStage needs the export ControllerPublish makes.
    let staging = cluster.kubelet_dir("node-a").join("early");
    std::fs::create_dir_all(&staging).unwrap();
    let early = cluster
        .node("node-a")
        .csi
        .node_stage_volume(
            csi::NodeStageVolumeRequest {
                volume_id: volume.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(ext4(Mode::SingleNodeWriter)),
                ..Default::default()
            },
            T,
        )
        .await;
    assert_eq!(code(early), Code::FailedPrecondition);

    let at = attach_and_mount(&cluster, "node-a", &volume, &ext4(Mode::SingleNodeWriter)).await;
    // The kubelet refuses to unstage while another mount shares the staging mount's device
    // and root: the export's root must differ.
    let export = cluster.state_dir.join("exports/node-a").join(&volume);
    assert_eq!(mount_root(&export), "/");
    assert_eq!(mount_root(&at.0), "/volume");
    std::fs::write(at.1.join("proof"), "written on node-a").unwrap();
    let snapshot = c
        .create_snapshot(
            csi::CreateSnapshotRequest {
                name: "snap".into(),
                source_volume_id: volume.clone(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap()
        .snapshot
        .unwrap();
    let source = |source: csi::volume_content_source::Type| {
        let mut request = create_request("", 32 * MI, ext4(Mode::SingleNodeWriter));
        request.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(source),
        });
        request
    };
    let mut restore = source(csi::volume_content_source::Type::Snapshot(
        csi::volume_content_source::SnapshotSource {
            snapshot_id: snapshot.snapshot_id.clone(),
        },
    ));
    restore.name = "restored".into();
    let mut clone = source(csi::volume_content_source::Type::Volume(
        csi::volume_content_source::VolumeSource {
            volume_id: volume.clone(),
        },
    ));
    clone.name = "cloned".into();
    let mut copies = Vec::new();
    for request in [restore, clone] {
        copies.push(
            c.create_volume(request, T)
                .await
                .unwrap()
                .volume
                .unwrap()
                .volume_id,
        );
    }
    // A directory volume cannot come from an ext4 one.
    let mut directory_clone =
        create_request("as-directory", 32 * MI, mount(Mode::SingleNodeWriter));
    directory_clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: volume.clone(),
            },
        )),
    });
    assert_eq!(
        code(c.create_volume(directory_clone, T).await),
        Code::InvalidArgument
    );

    // Online expansion: the image and the export grow on the controller, the filesystem on
    // the node.
    let node_a = &cluster.node("node-a").csi;
    let stats = |path: &Path| csi::NodeGetVolumeStatsRequest {
        volume_id: volume.clone(),
        volume_path: path.display().to_string(),
        ..Default::default()
    };
    let before = node_a.node_get_volume_stats(stats(&at.1), T).await.unwrap();
    let health = node_a
        .node_get_volume_health(
            csi::NodeGetVolumeHealthRequest {
                volume_id: volume.clone(),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
    assert_eq!(health.volume_health.unwrap().health_statuses, []);
    let expanded = c
        .controller_expand_volume(
            csi::ControllerExpandVolumeRequest {
                volume_id: volume.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 64 * MI,
                    limit_bytes: 0,
                }),
                ..Default::default()
            },
            T,
        )
        .await
        .unwrap();
    assert!(expanded.node_expansion_required);
    let grown = node_a
        .node_expand_volume(
            csi::NodeExpandVolumeRequest {
                volume_id: volume.clone(),
                volume_path: at.1.display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 64 * MI,
                    limit_bytes: 0,
                }),
                ..Default::default()
            },
            T,
        )
        .await;
    if csi_hostpath::export::can_resize_online() {
        grown.unwrap();
        let after = node_a.node_get_volume_stats(stats(&at.1), T).await.unwrap();
        assert!(
            after.usage[0].total > before.usage[0].total + 24 * MI,
            "{before:?} -> {after:?}"
        );
    } else {
        // Containers without CAP_SYS_RESOURCE (this machine's, say) cannot resize online.
        let refused = grown.unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert!(
            refused.message().contains("CAP_SYS_RESOURCE"),
            "{refused:?}"
        );
    }
    unmount_and_detach(&cluster, "node-a", &volume, at).await;

    for copy in &copies {
        let at = attach_and_mount(&cluster, "node-b", copy, &ext4(Mode::SingleNodeWriter)).await;
        assert_eq!(
            std::fs::read_to_string(at.1.join("proof")).unwrap(),
            "written on node-a",
            "{copy}"
        );
        unmount_and_detach(&cluster, "node-b", copy, at).await;
    }
    for id in copies.iter().chain([&volume]) {
        image_is_clean(&cluster.state_dir.join("volumes").join(format!("{id}.img")));
    }
    assert!(
        mounts_under(dir.path()).is_empty(),
        "{:?}",
        mounts_under(dir.path())
    );
    cluster.stop().await;
}

/// Without attach (no ControllerPublishVolume), NodeStageVolume opens the node's export itself
/// and NodeUnstageVolume closes it cleanly: nothing stays mounted and the image needs no
/// journal replay.
#[tokio::test]
async fn without_attach_staging_opens_and_unstaging_closes_the_export() {
    if !root_or_skip("without_attach_staging_opens_and_unstaging_closes_the_export") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = LocalCluster::start(dir.path(), &["node-a"], |config| {
        config.enable_attach = false;
    })
    .await
    .unwrap();
    let volume = create_ext4(&cluster.controller.csi, "unattached", 32 * MI)
        .await
        .volume_id;
    let cap = ext4(Mode::SingleNodeWriter);
    let (staging, target) = paths(&cluster, "node-a", &volume);
    let node = &cluster.node("node-a").csi;
    node.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    node.node_publish_volume(publish(&volume, &staging, &target, cap, false), T)
        .await
        .unwrap();
    let export = cluster.state_dir.join("exports/node-a").join(&volume);
    assert_eq!(mount_root(&export), "/");
    std::fs::write(target.join("proof"), "kept").unwrap();
    teardown(node, &volume, &staging, &target).await;
    assert!(
        mounts_under(dir.path()).is_empty(),
        "{:?}",
        mounts_under(dir.path())
    );
    image_is_clean(
        &cluster
            .state_dir
            .join("volumes")
            .join(format!("{volume}.img")),
    );
    cluster.stop().await;
}

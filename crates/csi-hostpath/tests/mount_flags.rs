//! Mount flags (a PV's `mountOptions`) on the driver's bind mounts (root only; skipped with a
//! reason otherwise): those a bind mount carries are applied to the staging and target mounts
//! and kept through a fence; any other is refused, named.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_proto::csi::v1 as csi;
use tonic::Code;

fn with_flags(flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeMultiWriter as i32,
        }),
    }
}

/// The flags of the one mount at `path`.
fn flags_at(path: &Path) -> Vec<String> {
    let mounts = mounts_at(path);
    assert_eq!(mounts.len(), 1, "{}: {mounts:?}", path.display());
    mounts[0].split(',').map(str::to_string).collect()
}

fn has_all(path: &Path, wanted: &[&str]) -> bool {
    let flags = flags_at(path);
    wanted.iter().all(|w| flags.iter().any(|f| f == w))
}

#[tokio::test]
async fn bind_mount_flags_are_applied_and_kept_through_a_fence() {
    if !root_or_skip("bind_mount_flags_are_applied_and_kept_through_a_fence") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let (c, a) = (&cluster.controller.csi, &cluster.node("node-a").csi);
    let stage_cap = with_flags(&["nosuid", "nodev", "noexec", "noatime"]);
    let publish_cap = with_flags(&["nosuid", "nodev", "noexec", "noatime", "nodiratime"]);
    let volume = create(c, "flags", GI / 4).await.volume_id;
    let (staging, target) = paths(&cluster, "node-a", &volume);
    c.controller_publish_volume(publish_to(&volume, "node-a", stage_cap.clone()), T)
        .await
        .unwrap();
    // Staged and published as the kubelet does, again after a fence too.
    let stage_and_publish = || async {
        a.node_stage_volume(stage(&volume, &staging, stage_cap.clone()), T)
            .await
            .unwrap();
        a.node_publish_volume(
            publish(&volume, &staging, &target, publish_cap.clone(), false),
            T,
        )
        .await
        .unwrap();
    };
    stage_and_publish().await;
    let staged = ["rw", "nosuid", "nodev", "noexec", "noatime"];
    assert!(has_all(&staging, &staged), "{:?}", flags_at(&staging));
    assert!(
        has_all(
            &target,
            &["rw", "nosuid", "nodev", "noexec", "noatime", "nodiratime"]
        ),
        "{:?}",
        flags_at(&target)
    );
    std::fs::write(target.join("written"), b"rw").unwrap();

    // Idempotent with the same flags; another publication's flags are another publication.
    stage_and_publish().await;
    let other = with_flags(&["nosuid"]);
    assert_eq!(
        code(
            a.node_stage_volume(stage(&volume, &staging, other.clone()), T)
                .await
        ),
        Code::AlreadyExists
    );
    assert_eq!(
        code(
            a.node_publish_volume(publish(&volume, &staging, &target, other, false), T)
                .await
        ),
        Code::AlreadyExists
    );

    // A second publication with `ro` among its flags is read-only.
    let second = target.with_file_name("second");
    let read_only = with_flags(&["ro", "nosuid", "nodev", "noexec", "noatime"]);
    a.node_publish_volume(publish(&volume, &staging, &second, read_only, false), T)
        .await
        .unwrap();
    assert!(
        has_all(&second, &["ro", "nosuid", "nodev", "noexec"]),
        "{:?}",
        flags_at(&second)
    );

    // The fence makes every mount read-only and keeps the rest.
    unpublish_from(&cluster, "node-a", &volume).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !has_all(&target, &["ro"]) {
        assert!(
            Instant::now() < deadline,
            "not fenced: {:?}",
            flags_at(&target)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for path in [&staging, &target, &second] {
        assert!(
            has_all(path, &["ro", "nosuid", "nodev", "noexec", "noatime"]),
            "{}: {:?}",
            path.display(),
            flags_at(path)
        );
    }
    // Published again: writable again, still without suid, devices, exec.
    c.controller_publish_volume(publish_to(&volume, "node-a", stage_cap.clone()), T)
        .await
        .unwrap();
    stage_and_publish().await;
    assert!(
        has_all(&target, &["rw", "nosuid", "nodev", "noexec", "noatime"]),
        "{:?}",
        flags_at(&target)
    );
    assert!(has_all(&staging, &staged), "{:?}", flags_at(&staging));
    assert!(
        has_all(&second, &["ro", "nosuid"]),
        "{:?}",
        flags_at(&second)
    );

    a.node_unpublish_volume(unpublish(&volume, &second), T)
        .await
        .unwrap();
    teardown(a, &volume, &staging, &target).await;
    unpublish_and_delete(&cluster, "node-a", &volume).await;
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

#[tokio::test]
async fn flags_a_bind_mount_cannot_carry_are_refused_by_name() {
    if !root_or_skip("flags_a_bind_mount_cannot_carry_are_refused_by_name") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let (c, a) = (&cluster.controller.csi, &cluster.node("node-a").csi);
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(c, "refused", GI / 4).await.volume_id;
    let (staging, target) = attach_and_mount(&cluster, "node-a", &volume, &cap).await;
    for flag in ["discard", "sync", "uid=1000", "bind", "remount", "defaults"] {
        let refused = with_flags(&["nosuid", flag]);
        let answers = [
            a.node_stage_volume(stage(&volume, &staging, refused.clone()), T)
                .await
                .map(drop),
            a.node_publish_volume(
                publish(&volume, &staging, &target, refused.clone(), false),
                T,
            )
            .await
            .map(drop),
            c.create_volume(create_request("other", GI / 4, refused.clone()), T)
                .await
                .map(drop),
        ];
        for answer in answers {
            let status = answer.unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument, "{flag}: {status:?}");
            assert!(
                status.message().contains(&format!("mount flag {flag:?}")),
                "{flag}: {}",
                status.message()
            );
        }
    }
    assert!(
        has_all(&target, &["rw"]) && !has_all(&target, &["nosuid"]),
        "the publication is unchanged: {:?}",
        flags_at(&target)
    );
    teardown(a, &volume, &staging, &target).await;
    unpublish_and_delete(&cluster, "node-a", &volume).await;
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

//! Hostile staging and target paths (root only; skipped with a reason otherwise): a symbolic
//! link anywhere below the allowed root is refused (INVALID_ARGUMENT) and nothing outside the
//! root is mounted on, created or truncated; the allowed root itself is no target; and the
//! spellings of one path (`a//t`, `a/./t`, `t/`) are one target; a mount at the path that is
//! not the volume's is refused and left alone. An allowed root that is itself a symlink (a
//! kubelet directory moved elsewhere) works.

mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi_proto::csi::v1 as csi;
use tonic::Code;

/// The volume published to node-a and staged at its usual staging path.
async fn staged(
    cluster: &csi_hostpath::local::LocalCluster,
    cap: &csi::VolumeCapability,
) -> (String, PathBuf, PathBuf) {
    let c = &cluster.controller.csi;
    let created = c
        .create_volume(create_request("v", 16 << 20, cap.clone()), T)
        .await
        .unwrap();
    let volume = created.volume.unwrap().volume_id;
    c.controller_publish_volume(publish_to(&volume, "node-a", cap.clone()), T)
        .await
        .unwrap();
    let (staging, target) = paths(cluster, "node-a", &volume);
    cluster
        .node("node-a")
        .csi
        .node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    (volume, staging, target)
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test]
async fn symlinks_below_the_allowed_root_are_refused() {
    if !root_or_skip("symlinks_below_the_allowed_root_are_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let a = &cluster.node("node-a").csi;
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"host data").unwrap();

    // A filesystem volume: a target that is a symlink out of the root, and one below a
    // symlinked directory.
    let fs_cap = mount(Mode::SingleNodeWriter);
    let (volume, staging, target) = staged(&cluster, &fs_cap).await;
    symlink(&outside, &target).unwrap();
    let linked_parent = target.with_file_name("linked-dir");
    symlink(&outside, &linked_parent).unwrap();
    for hostile in [target.clone(), linked_parent.join("t")] {
        let refused = a
            .node_publish_volume(
                publish(&volume, &staging, &hostile, fs_cap.clone(), false),
                T,
            )
            .await;
        assert_eq!(
            code(refused),
            Code::InvalidArgument,
            "{}",
            hostile.display()
        );
        assert_eq!(
            code(
                a.node_unpublish_volume(unpublish(&volume, &hostile), T)
                    .await
            ),
            Code::InvalidArgument,
            "unpublish of {} is no success",
            hostile.display()
        );
    }
    // A staging path below a symlink.
    let linked_staging = linked_parent.join("globalmount");
    assert_eq!(
        code(
            a.node_stage_volume(stage(&volume, &linked_staging, fs_cap.clone()), T)
                .await
        ),
        Code::InvalidArgument
    );
    assert!(
        mounts_under(&outside).is_empty(),
        "nothing mounted outside the root"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing created outside the root"
    );

    // A block volume whose target is a symlink to a host file: refused, the file untouched.
    let block_cap = block(Mode::SingleNodeWriter);
    let (block_volume, block_staging, block_target) = {
        let created = cluster
            .controller
            .csi
            .create_volume(create_request("b", 16 << 20, block_cap.clone()), T)
            .await
            .unwrap();
        let id = created.volume.unwrap().volume_id;
        cluster
            .controller
            .csi
            .controller_publish_volume(publish_to(&id, "node-a", block_cap.clone()), T)
            .await
            .unwrap();
        let (staging, target) = paths(&cluster, "node-a", &id);
        a.node_stage_volume(stage(&id, &staging, block_cap.clone()), T)
            .await
            .unwrap();
        (id, staging, target)
    };
    symlink(outside.join("precious"), &block_target).unwrap();
    let refused = a
        .node_publish_volume(
            publish(
                &block_volume,
                &block_staging,
                &block_target,
                block_cap.clone(),
                false,
            ),
            T,
        )
        .await;
    assert_eq!(code(refused), Code::InvalidArgument);
    assert_eq!(
        std::fs::read(outside.join("precious")).unwrap(),
        b"host data",
        "the host file is not truncated"
    );
    assert!(mounts_under(&outside).is_empty());

    a.node_unstage_volume(unstage(&volume, &staging), T)
        .await
        .unwrap();
    a.node_unstage_volume(unstage(&block_volume, &block_staging), T)
        .await
        .unwrap();
    cluster.stop().await;
}

#[tokio::test]
async fn one_path_is_one_target_and_the_root_is_none() {
    if !root_or_skip("one_path_is_one_target_and_the_root_is_none") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let (volume, staging, target) = staged(&cluster, &cap).await;

    let root = dir.path().join("kubelet");
    assert_eq!(
        code(
            a.node_publish_volume(publish(&volume, &staging, &root, cap.clone(), false), T)
                .await
        ),
        Code::InvalidArgument,
        "the allowed root itself is no target"
    );

    // Published under one spelling, idempotent under the others, unpublished under a fourth.
    let parent = text(target.parent().unwrap());
    let name = target.file_name().unwrap().to_str().unwrap();
    let spellings = [
        format!("{parent}//{name}"),
        format!("{parent}/./{name}"),
        format!("{parent}/{name}/"),
    ];
    for spelling in &spellings {
        a.node_publish_volume(
            publish(&volume, &staging, Path::new(spelling), cap.clone(), false),
            T,
        )
        .await
        .unwrap();
    }
    assert_eq!(mounts_under(&target).len(), 1, "one mount at the target");
    a.node_unpublish_volume(unpublish(&volume, &target), T)
        .await
        .unwrap();
    a.node_unstage_volume(unstage(&volume, &staging), T)
        .await
        .unwrap();
    // No record is left behind to hold the volume.
    unpublish_and_delete(&cluster, "node-a", &volume).await;
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

/// Mounts an empty tmpfs at `path`: somebody else's mount.
fn foreign_mount(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    rustix::mount::mount(
        "tmpfs",
        path,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=1m",
    )
    .unwrap();
}

#[tokio::test]
async fn a_mount_that_is_not_the_volume_is_left_alone() {
    if !root_or_skip("a_mount_that_is_not_the_volume_is_left_alone") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let (volume, staging, target) = staged(&cluster, &cap).await;
    a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();

    // Stacked on the volume's target, and at a path the volume was never published to.
    foreign_mount(&target);
    let elsewhere = target.with_file_name("elsewhere");
    foreign_mount(&elsewhere);
    for path in [&target, &elsewhere] {
        assert_eq!(
            code(a.node_unpublish_volume(unpublish(&volume, path), T).await),
            Code::FailedPrecondition,
            "{}",
            path.display()
        );
    }
    assert_eq!(
        mounts_under(&target).len(),
        2,
        "the foreign mount stays on the target"
    );
    assert_eq!(mounts_under(&elsewhere).len(), 1, "and elsewhere");

    rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
    a.node_unpublish_volume(unpublish(&volume, &target), T)
        .await
        .unwrap();
    assert!(
        mounts_under(&target).is_empty(),
        "the volume's own mount is gone"
    );
    a.node_unstage_volume(unstage(&volume, &staging), T)
        .await
        .unwrap();
    cluster.stop().await;
}

#[tokio::test]
async fn a_kubelet_root_that_is_a_symlink_works() {
    if !root_or_skip("a_kubelet_root_that_is_a_symlink_works") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let moved = symlinked_kubelet_root(dir.path());
    let cluster = behind(dir.path(), &moved).await;
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let (volume, staging, target) = mounted_through(&cluster, dir.path(), &moved).await;
    a.node_publish_volume(publish(&volume, &staging, &target, cap.clone(), false), T)
        .await
        .unwrap();
    assert_eq!(
        mounts_under(dir.path()).len(),
        2,
        "staged and published once each"
    );
    let stats = a
        .node_get_volume_stats(
            csi::NodeGetVolumeStatsRequest {
                volume_id: volume.clone(),
                volume_path: text(&target),
                ..Default::default()
            },
            T,
        )
        .await;
    assert!(stats.is_ok(), "{stats:?}");
    teardown(a, &volume, &staging, &target).await;
    assert!(mounts_under(dir.path()).is_empty(), "nothing left mounted");
    unpublish_and_delete(&cluster, "node-a", &volume).await;
    cluster.stop().await;
}

/// A driver before c993429 recorded paths under a symlinked root by the link's spelling; on
/// its first start the node instance respells them below the real place, so the kubelet's
/// NodeUnpublish and NodeUnstage (through the link) find and remove them, and the volume can
/// be deleted.
#[tokio::test]
async fn records_spelled_through_a_symlinked_root_are_found_after_an_upgrade() {
    if !root_or_skip("records_spelled_through_a_symlinked_root_are_found_after_an_upgrade") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let moved = symlinked_kubelet_root(dir.path());
    let cluster = behind(dir.path(), &moved).await;
    let (volume, staging, target) = mounted_through(&cluster, dir.path(), &moved).await;
    let real_target = paths(&cluster, "node-a", &volume).1;
    cluster.stop().await;

    // The records as the older driver wrote them: the link's spelling.
    let store = csi_hostpath::state::Store::open(&dir.path().join("state")).unwrap();
    store
        .update(|state| {
            let usage = state
                .volumes
                .get_mut(&volume)
                .and_then(|v| v.nodes.get_mut("node-a"))
                .expect("node-a's records");
            usage.staged.as_mut().unwrap().path = text(&staging);
            let kept = usage
                .targets
                .remove(&text(&real_target))
                .expect("the target record");
            usage.targets.insert(text(&target), kept);
            Ok::<_, csi_hostpath::error::DriverError>(())
        })
        .unwrap();
    drop(store);

    let cluster = behind(dir.path(), &moved).await;
    teardown(&cluster.node("node-a").csi, &volume, &staging, &target).await;
    assert!(mounts_under(dir.path()).is_empty(), "nothing left mounted");
    let records = csi_hostpath::state::Store::open(&dir.path().join("state"))
        .unwrap()
        .read()
        .unwrap()
        .volumes[&volume]
        .nodes
        .clone();
    assert!(records.is_empty(), "records left: {records:?}");
    unpublish_and_delete(&cluster, "node-a", &volume).await;
    cluster.stop().await;
}

/// The kubelet's directory moved to another disk, its usual path left as a symlink: returns
/// the link, `kubelet-link` in `dir`, to `dir`'s `kubelet`.
fn symlinked_kubelet_root(dir: &Path) -> PathBuf {
    let moved = dir.join("kubelet-link");
    symlink(dir.join("kubelet"), &moved).unwrap();
    moved
}

/// A driver on node-a (and its controller) in `dir` whose allowed root is the link `moved`.
async fn behind(dir: &Path, moved: &Path) -> csi_hostpath::local::LocalCluster {
    csi_hostpath::local::LocalCluster::start(dir, &["node-a"], |config| {
        config.allowed_path_roots = vec![moved.to_path_buf()];
    })
    .await
    .unwrap()
}

/// A new filesystem volume published to node-a, then staged and published there through the
/// link `moved`, as a kubelet that still uses the link's path does; returns the volume and
/// its staging and target paths through the link.
async fn mounted_through(
    cluster: &csi_hostpath::local::LocalCluster,
    dir: &Path,
    moved: &Path,
) -> (String, PathBuf, PathBuf) {
    let a = &cluster.node("node-a").csi;
    let cap = mount(Mode::SingleNodeWriter);
    let volume = create(&cluster.controller.csi, "v", 16 << 20)
        .await
        .volume_id;
    cluster
        .controller
        .csi
        .controller_publish_volume(publish_to(&volume, "node-a", cap.clone()), T)
        .await
        .unwrap();
    let (staging, target) = paths(cluster, "node-a", &volume);
    let through_link = |path: &Path| moved.join(path.strip_prefix(dir.join("kubelet")).unwrap());
    let (staging, target) = (through_link(&staging), through_link(&target));
    a.node_stage_volume(stage(&volume, &staging, cap.clone()), T)
        .await
        .unwrap();
    a.node_publish_volume(publish(&volume, &staging, &target, cap, false), T)
        .await
        .unwrap();
    (volume, staging, target)
}

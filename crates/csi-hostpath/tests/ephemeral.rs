//! CSI ephemeral inline volumes, as the kubelet uses them (root only: real bind mounts;
//! skipped with a reason otherwise): NodePublishVolume without staging makes the volume,
//! NodeUnpublishVolume deletes it, and nothing else handles it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_hostpath::local::LocalCluster;
use csi_hostpath::state::{Ephemeral, Phase, Store, Volume};
use csi_proto::csi::v1 as csi;
use tonic::Code;

/// The kubelet's volume handle of an inline volume: `csi-` and a SHA-256 in hex.
fn handle(n: u8) -> String {
    format!("csi-{}", format!("{n:02x}").repeat(32))
}

/// What the kubelet sends, with `podInfoOnMount: true`, for a pod's inline volume.
fn context() -> HashMap<String, String> {
    [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "shop"),
        ("csi.storage.k8s.io/pod.uid", "9d3f"),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        (
            "csi.storage.k8s.io/serviceAccount.tokens",
            "{\"\":{\"token\":\"secret-token\"}}",
        ),
        ("color", "blue"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The kubelet's target path of pod `pod`'s inline volume on `node`.
fn target(cluster: &LocalCluster, node: &str, pod: &str) -> PathBuf {
    let volumes = cluster
        .kubelet_dir(node)
        .join("pods")
        .join(pod)
        .join("volumes/kubernetes.io~csi/scratch");
    std::fs::create_dir_all(&volumes).unwrap();
    volumes.join("mount")
}

fn inline(id: &str, target: &Path, readonly: bool) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        readonly,
        volume_context: context(),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_inline_volume_is_made_by_its_publish_and_gone_with_its_unpublish() {
    if !root_or_skip("an_inline_volume_is_made_by_its_publish_and_gone_with_its_unpublish") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let (c, a) = (&cluster.controller.csi, &cluster.node("node-a").csi);
    let id = handle(1);
    let target = target(&cluster, "node-a", "pod-1");
    let data = cluster.state_dir.join("volumes").join(&id);

    a.node_publish_volume(inline(&id, &target, false), T)
        .await
        .unwrap();
    a.node_publish_volume(inline(&id, &target, false), T)
        .await
        .unwrap();
    assert_eq!(mounts_at(&target).len(), 1, "published once");
    std::fs::write(target.join("proof"), b"written by the pod").unwrap();
    assert_eq!(
        std::fs::read(data.join("proof")).unwrap(),
        b"written by the pod"
    );

    let store = Store::open(&cluster.state_dir).unwrap();
    let record = store.read().unwrap().volumes.get(&id).cloned().unwrap();
    assert_eq!(record.phase, Phase::Ready);
    assert_eq!(record.capacity_bytes, 100 << 20, "upstream's fixed size");
    assert_eq!(
        record.ephemeral,
        Some(Ephemeral {
            node: "node-a".into(),
            target: target.display().to_string()
        })
    );
    assert_eq!(
        record.parameters.keys().collect::<Vec<_>>(),
        ["color"],
        "the kubelet's keys are not kept"
    );
    let state_file = std::fs::read_to_string(store.state_file()).unwrap();
    assert!(!state_file.contains("secret-token"), "no token on disk");
    let stats = csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    a.node_get_volume_stats(stats, T).await.unwrap();

    // Never ControllerPublished, yet not fenced: its node alone has it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    std::fs::write(target.join("later"), b"still writable").unwrap();

    // Only its own node's NodePublishVolume and NodeUnpublishVolume handle it.
    let cap = mount(Mode::SingleNodeWriter);
    let elsewhere = target.with_file_name("other");
    let refusals = [
        (
            code(
                c.delete_volume(
                    csi::DeleteVolumeRequest {
                        volume_id: id.clone(),
                        ..Default::default()
                    },
                    T,
                )
                .await,
            ),
            Code::FailedPrecondition,
            "DeleteVolume",
        ),
        (
            code(
                c.controller_publish_volume(publish_to(&id, "node-a", cap.clone()), T)
                    .await,
            ),
            Code::FailedPrecondition,
            "ControllerPublishVolume",
        ),
        (
            code(
                a.node_stage_volume(stage(&id, &elsewhere, cap.clone()), T)
                    .await,
            ),
            Code::FailedPrecondition,
            "NodeStageVolume",
        ),
        (
            code(
                c.create_volume(create_request(&format!("ephemeral-{id}"), GI, cap), T)
                    .await,
            ),
            Code::AlreadyExists,
            "CreateVolume of its name",
        ),
        (
            code(
                a.node_publish_volume(inline(&id, &elsewhere, false), T)
                    .await,
            ),
            Code::AlreadyExists,
            "published at another target",
        ),
        (
            code(a.node_publish_volume(inline(&id, &target, true), T).await),
            Code::AlreadyExists,
            "published again read-only",
        ),
        (
            code(
                cluster
                    .node("node-b")
                    .csi
                    .node_publish_volume(inline(&id, &target, false), T)
                    .await,
            ),
            Code::AlreadyExists,
            "node-a's volume published on node-b",
        ),
    ];
    for (got, want, what) in refusals {
        assert_eq!(got, want, "{what}");
    }

    a.node_unpublish_volume(unpublish(&id, &target), T)
        .await
        .unwrap();
    assert!(mounts_at(&target).is_empty(), "unmounted");
    assert!(!target.exists(), "the target directory is removed");
    assert!(!data.exists(), "the data is deleted");
    assert!(
        !store.read().unwrap().volumes.contains_key(&id),
        "no record"
    );
    a.node_unpublish_volume(unpublish(&id, &target), T)
        .await
        .unwrap();
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

#[tokio::test]
async fn an_inline_volume_is_read_only_when_asked_and_bad_requests_make_nothing() {
    if !root_or_skip("an_inline_volume_is_read_only_when_asked_and_bad_requests_make_nothing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let a = &cluster.node("node-a").csi;
    let target = target(&cluster, "node-a", "pod-2");

    let id = handle(2);
    a.node_publish_volume(inline(&id, &target, true), T)
        .await
        .unwrap();
    let options = mounts_at(&target);
    assert!(options[0].split(',').any(|o| o == "ro"), "{options:?}");
    assert!(std::fs::write(target.join("x"), b"x").is_err(), "read-only");
    a.node_unpublish_volume(unpublish(&id, &target), T)
        .await
        .unwrap();

    let with = |change: &dyn Fn(&mut csi::NodePublishVolumeRequest)| {
        let mut request = inline(&handle(3), &target, false);
        change(&mut request);
        request
    };
    let fs_type = |fs_type: &str| csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let bad = [
        (
            "block access",
            with(&|r| r.volume_capability = Some(block(Mode::SingleNodeWriter))),
        ),
        (
            "an fs_type",
            with(&|r| r.volume_capability = Some(fs_type("ext4"))),
        ),
        (
            "a staging path",
            with(&|r| {
                r.staging_target_path = target.with_file_name("staging").display().to_string()
            }),
        ),
        (
            "an ID with a slash",
            with(&|r| r.volume_id = "../../etc".into()),
        ),
        (
            "an ID with a dot",
            with(&|r| r.volume_id = "csi-a.img".into()),
        ),
        (
            "a persistent volume's ID",
            with(&|r| r.volume_id = "6f1c2b9e-3c51-4c1e-9d4a-2b1f0c3d4e5f".into()),
        ),
        (
            "a target outside the roots",
            with(&|r| r.target_path = "/etc/x".into()),
        ),
        (
            "an unsupported mount flag",
            with(&|r| {
                r.volume_capability = Some(csi::VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume {
                        mount_flags: vec!["discard".into()],
                        ..Default::default()
                    })),
                    ..mount(Mode::SingleNodeWriter)
                })
            }),
        ),
    ];
    for (what, request) in bad {
        let got = a.node_publish_volume(request, T).await;
        assert_eq!(code(got), Code::InvalidArgument, "{what}");
    }
    let store = Store::open(&cluster.state_dir).unwrap();
    assert!(store.read().unwrap().volumes.is_empty(), "no record made");
    let data: Vec<_> = std::fs::read_dir(cluster.state_dir.join("volumes"))
        .unwrap()
        .collect();
    assert!(data.is_empty(), "no data made: {data:?}");
    assert!(mounts_under(dir.path()).is_empty());
    cluster.stop().await;
}

/// A crash between the record of an inline volume and its publishing leaves a record
/// `Creating` by an instance that is gone, its data, maybe its mount: the node's next start
/// deletes all of it.
#[tokio::test]
async fn a_node_start_deletes_an_inline_volume_a_crash_left_half_made() {
    if !root_or_skip("a_node_start_deletes_an_inline_volume_a_crash_left_half_made") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let state_dir = dir.path().join("state");
    let store = Store::open(&state_dir).unwrap();
    let gone = store.register_instance().unwrap();
    let (mounted, unmounted) = (handle(4), handle(5));
    let pods = dir.path().join("kubelet/node-a/pods");
    for id in [&mounted, &unmounted] {
        let target = pods.join(id).join("mount");
        let data = state_dir.join("volumes").join(id);
        std::fs::create_dir_all(&target).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        if id == &mounted {
            rustix::mount::mount_bind(&data, &target).unwrap();
        }
        store
            .update(|state| {
                let volume = Volume {
                    id: id.to_string(),
                    name: format!("ephemeral-{id}"),
                    capacity_bytes: 100 << 20,
                    access_type: csi_hostpath::state::AccessType::Mount,
                    filesystem: None,
                    phase: Phase::Creating,
                    home_node: "node-a".into(),
                    kind: String::new(),
                    accessible_nodes: vec!["node-a".into()],
                    parameters: Default::default(),
                    mutable_parameters: Default::default(),
                    source: None,
                    published: Default::default(),
                    nodes: Default::default(),
                    fenced: Default::default(),
                    exports: Default::default(),
                    creator: Some(gone.id.clone()),
                    ephemeral: Some(Ephemeral {
                        node: "node-a".into(),
                        target: target.display().to_string(),
                    }),
                };
                state.volumes.insert(id.to_string(), volume);
                Ok::<_, csi_hostpath::state::StoreError>(())
            })
            .unwrap();
    }
    drop(gone);

    let cluster = cluster(dir.path()).await;
    for id in [&mounted, &unmounted] {
        let target = pods.join(id).join("mount");
        assert!(mounts_at(&target).is_empty(), "{id}: unmounted");
        assert!(!target.exists(), "{id}: target removed");
        assert!(!state_dir.join("volumes").join(id).exists(), "{id}: data");
    }
    assert!(store.read().unwrap().volumes.is_empty(), "no record left");
    // The kubelet, unsure of the publishing, unpublishes: done already.
    cluster
        .node("node-a")
        .csi
        .node_unpublish_volume(unpublish(&mounted, &pods.join(&mounted).join("mount")), T)
        .await
        .unwrap();
    cluster.stop().await;
}

/// ListVolumes pages through inline volumes too: a page ending on one (the kubelet's
/// `csi-<sha256>` ID) gives a token the next call takes.
#[tokio::test]
async fn volume_listings_page_through_inline_volumes() {
    if !root_or_skip("volume_listings_page_through_inline_volumes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = MountCleanup(dir.path().to_path_buf());
    let cluster = cluster(dir.path()).await;
    let (c, a) = (&cluster.controller.csi, &cluster.node("node-a").csi);
    let persistent = create(c, "listed", 1 << 20).await.volume_id;
    let inline_ids = [handle(7), handle(8)];
    let targets: Vec<PathBuf> = inline_ids
        .iter()
        .enumerate()
        .map(|(n, _)| target(&cluster, "node-a", &format!("pod-list-{n}")))
        .collect();
    for (id, target) in inline_ids.iter().zip(&targets) {
        a.node_publish_volume(inline(id, target, false), T)
            .await
            .unwrap();
    }

    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_volumes(
                csi::ListVolumesRequest {
                    max_entries: 1,
                    starting_token: token.clone(),
                },
                T,
            )
            .await
            .unwrap();
        listed.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    let mut expected = vec![persistent, inline_ids[0].clone(), inline_ids[1].clone()];
    expected.sort();
    assert_eq!(listed, expected, "every volume once, one per page");

    for (id, target) in inline_ids.iter().zip(&targets) {
        a.node_unpublish_volume(unpublish(id, target), T)
            .await
            .unwrap();
    }
    cluster.stop().await;
}

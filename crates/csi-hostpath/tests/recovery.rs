//! What failed or interrupted creations leave: a creation whose data cannot be made is rolled
//! back at once (no record holding pool capacity, no partial data); at startup, creations whose
//! instance is gone are rolled back and data no record names is removed, while a creation
//! another running instance holds is left to it.

mod common;

use std::path::Path;

use common::*;
use csi::volume_capability::access_mode::Mode;
use csi_hostpath::local::LocalCluster;
use csi_hostpath::state::{Phase, Store, StoreError};
use csi_proto::csi::v1 as csi;
use tonic::Code;

fn store(root: &Path) -> Store {
    Store::open(&root.join("state")).unwrap()
}

/// Names of the records of `kind` (`volumes`, `snapshots`, `groups`) in the state.
fn names(root: &Path, kind: &str) -> Vec<String> {
    let state = store(root).read().unwrap();
    let mut names: Vec<String> = match kind {
        "volumes" => state.volumes.values().map(|v| v.name.clone()).collect(),
        "snapshots" => state.snapshots.values().map(|s| s.name.clone()).collect(),
        "groups" => state.groups.values().map(|g| g.name.clone()).collect(),
        _ => panic!("no records of kind {kind}"),
    };
    names.sort();
    names
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn in_pool(mut request: csi::CreateVolumeRequest, kind: &str) -> csi::CreateVolumeRequest {
    request.parameters = [("kind".to_string(), kind.to_string())].into();
    request
}

#[tokio::test]
async fn a_failed_clone_is_rolled_back_and_frees_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let capacity = || {
        c.get_capacity(
            csi::GetCapacityRequest {
                parameters: [("kind".to_string(), "fast".to_string())].into(),
                ..Default::default()
            },
            T,
        )
    };
    let source = c
        .create_volume(
            in_pool(
                create_request("source", GI, mount(Mode::SingleNodeWriter)),
                "fast",
            ),
            T,
        )
        .await
        .unwrap()
        .volume
        .unwrap();
    let available = capacity().await.unwrap().available_capacity;
    // The source's data is gone, so copying it fails.
    std::fs::remove_dir_all(cluster.state_dir.join("volumes").join(&source.volume_id)).unwrap();
    let mut clone = in_pool(
        create_request("clone", GI, mount(Mode::SingleNodeWriter)),
        "fast",
    );
    clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: source.volume_id.clone(),
            },
        )),
    });
    assert_eq!(code(c.create_volume(clone, T).await), Code::Internal);
    assert_eq!(
        capacity().await.unwrap().available_capacity,
        available,
        "the failed clone holds no capacity"
    );
    assert_eq!(names(dir.path(), "volumes"), ["source"]);
    assert!(entries(&cluster.state_dir.join("volumes")).is_empty());
    cluster.stop().await;
}

#[tokio::test]
async fn failed_snapshots_leave_no_record_and_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let c = &cluster.controller.csi;
    let a = create(c, "a", GI / 8).await.volume_id;
    let b = create(c, "b", GI / 8).await.volume_id;
    // b's data is gone, so snapshots of it fail.
    std::fs::remove_dir_all(cluster.state_dir.join("volumes").join(&b)).unwrap();
    let snapshot = csi::CreateSnapshotRequest {
        name: "snap".into(),
        source_volume_id: b.clone(),
        ..Default::default()
    };
    assert_eq!(code(c.create_snapshot(snapshot, T).await), Code::Internal);
    let group = csi::CreateVolumeGroupSnapshotRequest {
        name: "group".into(),
        source_volume_ids: vec![a, b],
        ..Default::default()
    };
    assert_eq!(
        code(c.create_volume_group_snapshot(group, T).await),
        Code::Internal
    );
    assert!(names(dir.path(), "snapshots").is_empty());
    assert!(names(dir.path(), "groups").is_empty());
    assert!(entries(&cluster.state_dir.join("snapshots")).is_empty());
    cluster.stop().await;
}

/// Rewrites the record of `kind` (`volumes` or `snapshots`) named `name`: its phase, and its
/// creator (None: no creator), as an instance that crashed or still runs would have left it.
fn set_record(root: &Path, kind: &str, name: &str, phase: Phase, creator: Option<&str>) -> String {
    store(root)
        .update(|state| {
            let (id, record_phase, record_creator) = match kind {
                "volumes" => {
                    let v = state.volumes.by_name_mut(name).unwrap();
                    (v.id.clone(), &mut v.phase, &mut v.creator)
                }
                "snapshots" => {
                    let s = state.snapshots.by_name_mut(name).unwrap();
                    (s.id.clone(), &mut s.phase, &mut s.creator)
                }
                _ => panic!("no records of kind {kind}"),
            };
            *record_phase = phase;
            *record_creator = creator.map(String::from);
            Ok::<_, StoreError>(id)
        })
        .unwrap()
}

async fn controller_only(root: &Path) -> LocalCluster {
    LocalCluster::start(root, &[], |_| {}).await.unwrap()
}

#[tokio::test]
async fn startup_rolls_back_abandoned_creations_and_removes_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cluster = controller_only(root).await;
    let c = &cluster.controller.csi;
    let kept = create(c, "kept", GI / 8).await.volume_id;
    for name in ["crashed", "old", "in-flight"] {
        create(c, name, GI / 8).await;
    }
    for name in ["kept-snap", "crashed-snap"] {
        let request = csi::CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: kept.clone(),
            ..Default::default()
        };
        c.create_snapshot(request, T).await.unwrap();
    }
    cluster.stop().await;

    let store = Store::open(&root.join("state")).unwrap();
    let crashed_instance = store.register_instance().unwrap();
    let crashed_id = crashed_instance.id.clone();
    drop(crashed_instance);
    let running = store.register_instance().unwrap();
    // Killed mid-creation; the oldest record names no creator (written before creators were).
    let crashed = set_record(
        root,
        "volumes",
        "crashed",
        Phase::Creating,
        Some(&crashed_id),
    );
    let old = set_record(root, "volumes", "old", Phase::Creating, None);
    let in_flight = set_record(
        root,
        "volumes",
        "in-flight",
        Phase::Creating,
        Some(&running.id),
    );
    let crashed_snap = set_record(
        root,
        "snapshots",
        "crashed-snap",
        Phase::Creating,
        Some(&crashed_id),
    );
    let snapshots = root.join("state/snapshots");
    std::fs::rename(
        snapshots.join(format!("{crashed_snap}.tar")),
        snapshots.join(format!("{crashed_snap}.tar.partial")),
    )
    .unwrap();
    // Left by an older version: a failed snapshot's partial file, and data without a record.
    let stray = uuid::Uuid::new_v4().to_string();
    std::fs::write(snapshots.join(format!("{stray}.tar.partial")), b"").unwrap();
    std::fs::create_dir(root.join("state/volumes").join(&stray)).unwrap();

    let cluster = controller_only(root).await;
    assert_eq!(names(root, "volumes"), ["in-flight", "kept"]);
    assert_eq!(names(root, "snapshots"), ["kept-snap"]);
    let volumes = entries(&root.join("state/volumes"));
    for id in [&crashed, &old, &stray] {
        assert!(!volumes.contains(id), "data of {id} left in {volumes:?}");
    }
    assert!(
        volumes.contains(&in_flight),
        "the running instance's data kept"
    );
    assert_eq!(entries(&snapshots).len(), 1, "{:?}", entries(&snapshots));
    assert!(
        !root.join("state/instances").join(&crashed_id).exists(),
        "the gone instance is forgotten"
    );
    assert!(root.join("state/instances").join(&running.id).exists());
    drop(running);
    cluster.stop().await;
}

#[tokio::test]
async fn a_creation_another_running_instance_holds_is_left_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cluster = controller_only(root).await;
    let c = &cluster.controller.csi;
    let id = create(c, "vol", GI / 8).await.volume_id;
    let running = Store::open(&root.join("state"))
        .unwrap()
        .register_instance()
        .unwrap();
    set_record(root, "volumes", "vol", Phase::Creating, Some(&running.id));
    let again = || {
        c.create_volume(
            create_request("vol", GI / 8, mount(Mode::SingleNodeWriter)),
            T,
        )
    };
    assert_eq!(code(again().await), Code::Aborted);
    // Gone (its lock released as by a crash): this instance takes the creation over.
    drop(running);
    assert_eq!(again().await.unwrap().volume.unwrap().volume_id, id);
    let state = store(root).read().unwrap();
    assert_eq!(state.volumes.get(&id).unwrap().phase, Phase::Ready);
    cluster.stop().await;
}

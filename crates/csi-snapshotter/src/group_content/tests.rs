use k8s_openapi::jiff::Timestamp;

use super::*;
use csi_kinds::crd::ObjectReference;
use csi_kinds::groupsnapshot::{
    GroupSnapshotHandles, VolumeGroupSnapshotContentSource, VolumeGroupSnapshotContentSpec,
};
use csi_kinds::snapshot::SnapshotError;

const DRIVER: &str = "hostpath.csi.k8s.io";

fn dynamic() -> VolumeGroupSnapshotContent {
    let mut content = VolumeGroupSnapshotContent::new(
        "groupsnapcontent-1",
        VolumeGroupSnapshotContentSpec {
            volume_group_snapshot_ref: ObjectReference {
                name: Some("g".into()),
                namespace: Some("ns".into()),
                uid: Some("1".into()),
                ..ObjectReference::default()
            },
            deletion_policy: DeletionPolicy::Delete,
            driver: DRIVER.into(),
            volume_group_snapshot_class_name: Some("c".into()),
            source: VolumeGroupSnapshotContentSource {
                volume_handles: Some(vec!["vol-a".into(), "vol-b".into()]),
                group_snapshot_handles: None,
            },
        },
    );
    content.metadata.finalizers = Some(vec![GROUP_CONTENT_BOUND_FINALIZER.into()]);
    content
}

fn pre_provisioned(uid: Option<&str>) -> VolumeGroupSnapshotContent {
    let mut content = dynamic();
    content.spec.source = VolumeGroupSnapshotContentSource {
        volume_handles: None,
        group_snapshot_handles: Some(GroupSnapshotHandles {
            volume_group_snapshot_handle: "group-9".into(),
            volume_snapshot_handles: vec!["s1".into(), "s2".into()],
        }),
    };
    content.spec.volume_group_snapshot_ref.uid = uid.map(str::to_string);
    content
}

fn csi_snapshot(volume: &str, snapshot: &str, ready: bool) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: 1024,
        snapshot_id: snapshot.into(),
        source_volume_id: volume.into(),
        creation_time: Some(prost_types::Timestamp {
            seconds: 2,
            nanos: 5,
        }),
        ready_to_use: ready,
        group_snapshot_id: "group-1".into(),
        accessible_topology: Vec::new(),
    }
}

fn answer(ready: bool) -> csi::VolumeGroupSnapshot {
    csi::VolumeGroupSnapshot {
        group_snapshot_id: "group-1".into(),
        snapshots: vec![
            csi_snapshot("vol-a", "snap-a", ready),
            csi_snapshot("vol-b", "snap-b", ready),
        ],
        creation_time: Some(prost_types::Timestamp {
            seconds: 2,
            nanos: 0,
        }),
        ready_to_use: ready,
    }
}

fn cut(mut content: VolumeGroupSnapshotContent, ready: bool) -> VolumeGroupSnapshotContent {
    content.status = status_after(None, &answer(ready), Time(Timestamp::UNIX_EPOCH));
    content
}

fn annotated(mut content: VolumeGroupSnapshotContent, keys: &[&str]) -> VolumeGroupSnapshotContent {
    content.metadata.annotations = Some(
        keys.iter()
            .map(|k| (k.to_string(), "yes".to_string()))
            .collect(),
    );
    content
}

fn deleting(mut content: VolumeGroupSnapshotContent) -> VolumeGroupSnapshotContent {
    content.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    content
}

#[test]
fn plans_follow_upstreams_sync_of_group_contents() {
    let members = GroupDeletion {
        group_snapshot_id: "group-1".into(),
        snapshot_ids: vec!["snap-a".into(), "snap-b".into()],
    };
    let cases: Vec<(&str, VolumeGroupSnapshotContent, GroupContentPlan)> = vec![
        ("new dynamic", dynamic(), GroupContentPlan::Create),
        (
            "cut, not ready",
            cut(dynamic(), false),
            GroupContentPlan::Create,
        ),
        ("ready", cut(dynamic(), true), GroupContentPlan::Nothing),
        (
            "ready, still marked",
            annotated(cut(dynamic(), true), &[BEING_CREATED]),
            GroupContentPlan::ClearBeingCreated,
        ),
        (
            "group deleted, cut",
            deleting(annotated(cut(dynamic(), true), &[BEING_DELETED])),
            GroupContentPlan::Delete {
                delete: Some(members.clone()),
                remove_finalizer: true,
            },
        ),
        (
            "group deleted while being cut",
            deleting(annotated(
                cut(dynamic(), false),
                &[BEING_DELETED, BEING_CREATED],
            )),
            GroupContentPlan::Create,
        ),
        (
            "group deleted before it was cut",
            deleting(annotated(dynamic(), &[BEING_DELETED])),
            GroupContentPlan::Delete {
                delete: None,
                remove_finalizer: true,
            },
        ),
        (
            "pre-provisioned",
            pre_provisioned(Some("1")),
            GroupContentPlan::Refresh(GroupDeletion {
                group_snapshot_id: "group-9".into(),
                snapshot_ids: vec!["s1".into(), "s2".into()],
            }),
        ),
        (
            "pre-provisioned, unbound, deleted",
            deleting(pre_provisioned(None)),
            GroupContentPlan::Delete {
                delete: None,
                remove_finalizer: true,
            },
        ),
    ];
    for (name, content, expected) in cases {
        assert_eq!(plan(&content, DRIVER), expected, "{name}");
    }
    // Deleted without its group being deleted: a ready content has nothing to do.
    assert_eq!(
        plan(&deleting(cut(dynamic(), true)), DRIVER),
        GroupContentPlan::Nothing
    );
    let mut retained = deleting(annotated(cut(dynamic(), true), &[BEING_DELETED]));
    retained.spec.deletion_policy = DeletionPolicy::Retain;
    assert_eq!(
        plan(&retained, DRIVER),
        GroupContentPlan::Delete {
            delete: None,
            remove_finalizer: true
        }
    );
    assert_eq!(plan(&dynamic(), "other"), GroupContentPlan::NotOurs);
}

#[test]
fn the_answer_fills_the_status_and_both_member_lists_once() {
    let status = status_after(None, &answer(false), Time(Timestamp::UNIX_EPOCH)).unwrap();
    assert_eq!(
        status.volume_group_snapshot_handle.as_deref(),
        Some("group-1")
    );
    assert_eq!(status.ready_to_use, Some(false));
    assert_eq!(
        status.creation_time,
        Some(Time(Timestamp::from_second(2).unwrap()))
    );
    let members = status.volume_snapshot_info_list.clone().unwrap();
    assert_eq!(
        members[0],
        VolumeSnapshotInfo {
            volume_handle: Some("vol-a".into()),
            snapshot_handle: Some("snap-a".into()),
            creation_time: Some(2_000_000_005),
            ready_to_use: Some(false),
            restore_size: Some(1024),
        }
    );
    assert_eq!(status.volume_snapshot_handle_pair_list.unwrap().len(), 2);
    // The same answer again changes nothing; a ready one flips readiness and clears the error.
    let mut failed = status_after(None, &answer(false), Time(Timestamp::UNIX_EPOCH)).unwrap();
    assert_eq!(
        status_after(Some(&failed), &answer(false), Time(Timestamp::UNIX_EPOCH)),
        None
    );
    failed.error = Some(SnapshotError::default());
    let ready = status_after(Some(&failed), &answer(true), Time(Timestamp::UNIX_EPOCH)).unwrap();
    assert_eq!(ready.ready_to_use, Some(true));
    assert_eq!(ready.error, None);
    assert!(ready.members().iter().all(|m| m.ready_to_use == Some(true)));
    // Without a creation time from the driver, now.
    let mut bare = answer(true);
    bare.creation_time = None;
    let now = Time(Timestamp::from_second(99).unwrap());
    assert_eq!(
        status_after(None, &bare, now.clone())
            .unwrap()
            .creation_time,
        Some(now)
    );
}

#[test]
fn group_snapshot_names_follow_the_flags() {
    assert_eq!(
        group_snapshot_name("groupsnapshot", "a-b-c", -1).unwrap(),
        "groupsnapshot-a-b-c"
    );
    assert_eq!(group_snapshot_name("g", "a-b-c", 2).unwrap(), "g-ab");
    assert_eq!(
        group_snapshot_name("g", "", -1).unwrap_err(),
        "group snapshot object is missing UID"
    );
    let mut parameters = HashMap::new();
    add_extra_metadata(&mut parameters, &dynamic());
    assert_eq!(parameters[GROUP_NAME_KEY], "g");
    assert_eq!(parameters[GROUP_NAMESPACE_KEY], "ns");
    assert_eq!(parameters[GROUP_CONTENT_NAME_KEY], "groupsnapcontent-1");
}

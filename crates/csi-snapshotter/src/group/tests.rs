use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference as CoreReference, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec, TypedLocalObjectReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;
use csi_kinds::groupsnapshot::{
    IS_DEFAULT_CLASS, VolumeGroupSnapshotContentStatus, VolumeGroupSnapshotSource,
    VolumeGroupSnapshotSpec,
};
use csi_kinds::snapshot::{DeletionPolicy, VolumeSnapshotStatus};

const DRIVER: &str = "hostpath.csi.k8s.io";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn group(class: Option<&str>) -> VolumeGroupSnapshot {
    let mut group = VolumeGroupSnapshot::new(
        "g",
        VolumeGroupSnapshotSpec {
            source: VolumeGroupSnapshotSource {
                selector: Some(LabelSelector {
                    match_labels: Some(labels(&[("app", "db")])),
                    ..LabelSelector::default()
                }),
                volume_group_snapshot_content_name: None,
            },
            volume_group_snapshot_class_name: class.map(str::to_string),
        },
    );
    group.metadata.namespace = Some("ns".into());
    group.metadata.uid = Some("g-uid".into());
    group
}

fn protected(mut group: VolumeGroupSnapshot) -> VolumeGroupSnapshot {
    group.metadata.finalizers = Some(vec![GROUP_SNAPSHOT_BOUND_FINALIZER.into()]);
    group
}

fn deleting(mut group: VolumeGroupSnapshot) -> VolumeGroupSnapshot {
    group.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    group
}

fn class(name: &str, default: bool) -> VolumeGroupSnapshotClass {
    let mut class = VolumeGroupSnapshotClass {
        driver: DRIVER.into(),
        deletion_policy: DeletionPolicy::Delete,
        ..VolumeGroupSnapshotClass::default()
    };
    class.metadata.name = Some(name.into());
    if default {
        class.metadata.annotations = Some(labels(&[(IS_DEFAULT_CLASS, "true")]));
    }
    class
}

fn claim(name: &str, app: &str, bound: bool) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("{name}-uid")),
            labels: Some(labels(&[("app", app)])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: bound.then(|| format!("pv-{name}")),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some(if bound { "Bound" } else { "Pending" }.into()),
            ..PersistentVolumeClaimStatus::default()
        }),
    }
}

fn volume(claim: &str, driver: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("pv-{claim}")),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: format!("vol-{claim}"),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: Some(CoreReference {
                name: Some(claim.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("{claim}-uid")),
                ..CoreReference::default()
            }),
            volume_mode: Some("Filesystem".into()),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

struct World {
    content: Option<VolumeGroupSnapshotContent>,
    classes: Vec<VolumeGroupSnapshotClass>,
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    members: Vec<VolumeSnapshot>,
    member_contents: Vec<VolumeSnapshotContent>,
}

impl World {
    /// Claims a and b (app=db, bound) and c (app=web), a default class "fast".
    fn new() -> Self {
        World {
            content: None,
            classes: vec![class("fast", true)],
            claims: vec![
                claim("b", "db", true),
                claim("a", "db", true),
                claim("c", "web", true),
            ],
            volumes: vec![
                volume("a", DRIVER),
                volume("b", DRIVER),
                volume("c", DRIVER),
            ],
            members: Vec::new(),
            member_contents: Vec::new(),
        }
    }

    fn plan(&self, group: &VolumeGroupSnapshot) -> GroupStep {
        let classes: Vec<_> = self.classes.iter().collect();
        let claims: Vec<_> = self.claims.iter().collect();
        let volumes: Vec<_> = self.volumes.iter().collect();
        let members: Vec<_> = self.members.iter().collect();
        let member_contents: Vec<_> = self.member_contents.iter().collect();
        plan(
            group,
            &GroupInputs {
                content: self.content.as_ref(),
                classes: &classes,
                claims: &claims,
                volumes: &volumes,
                members: &members,
                member_contents: &member_contents,
            },
        )
    }

    /// The group's content as created by the plan, with the status the sidecar writes.
    fn cut(&mut self, group: &VolumeGroupSnapshot, ready: bool) {
        let GroupStep::CreateContent(content) = self.plan(group) else {
            panic!("no content to create");
        };
        let mut content = *content;
        let mut status = VolumeGroupSnapshotContentStatus {
            volume_group_snapshot_handle: Some("group-1".into()),
            ready_to_use: Some(ready),
            creation_time: Some(Time(Timestamp::UNIX_EPOCH)),
            ..VolumeGroupSnapshotContentStatus::default()
        };
        status.set_members(
            ["a", "b"]
                .iter()
                .map(|c| VolumeSnapshotInfo {
                    volume_handle: Some(format!("vol-{c}")),
                    snapshot_handle: Some(format!("snap-{c}")),
                    creation_time: Some(7),
                    ready_to_use: Some(ready),
                    restore_size: Some(1024),
                })
                .collect(),
        );
        content.status = Some(status);
        self.content = Some(content);
    }

    /// Member snapshots and contents created as the plan asks, the snapshots given UIDs.
    fn create_members(&mut self, group: &VolumeGroupSnapshot) {
        let GroupStep::CreateMemberSnapshots(snapshots) = self.plan(group) else {
            panic!("no members to create");
        };
        for mut snapshot in snapshots {
            snapshot.metadata.uid = Some(format!("{}-uid", snapshot.name_any()));
            self.members.push(snapshot);
        }
        let GroupStep::CreateMemberContents(contents) = self.plan(group) else {
            panic!("no member contents to create");
        };
        self.member_contents = contents;
    }
}

fn failure(step: GroupStep) -> (&'static str, String) {
    match step {
        GroupStep::Fail(f) => (f.reason, f.message),
        other => panic!("not a failure: {other:?}"),
    }
}

#[test]
fn member_names_are_upstreams_hash_of_group_uid_and_volume_handle() {
    let hash = "d8333f37c3bcaea8ec4dd529431b028360b9b1f6ba6c281490d72d69036f3790";
    assert_eq!(
        member_snapshot_name("g-uid", "vol-a"),
        format!("snapshot-{hash}")
    );
    assert_eq!(
        member_content_name("g-uid", "vol-a"),
        format!("snapcontent-{hash}")
    );
    assert_eq!(dynamic_content_name(&group(None)), "groupsnapcontent-g-uid");
}

#[test]
fn a_dynamic_group_gets_its_class_its_finalizer_then_its_content() {
    let mut world = World::new();
    assert_eq!(world.plan(&group(None)), GroupStep::SetClass("fast".into()));
    world.classes.push(class("other", true));
    assert_eq!(
        failure(world.plan(&group(None))),
        (
            reason::SET_DEFAULT_CLASS_FAILED,
            "Failed to set default group snapshot class with error 2 default snapshot classes were found".into()
        )
    );
    world.classes.truncate(1);
    assert_eq!(
        failure(world.plan(&group(Some("gone")))).0,
        reason::GET_CLASS_FAILED
    );
    assert_eq!(world.plan(&group(Some("fast"))), GroupStep::AddFinalizer);
    let GroupStep::CreateContent(content) = world.plan(&protected(group(Some("fast")))) else {
        panic!("no content");
    };
    assert_eq!(content.name_any(), "groupsnapcontent-g-uid");
    assert_eq!(
        content.spec.source.volume_handles,
        Some(vec!["vol-a".to_string(), "vol-b".to_string()])
    );
    assert_eq!(
        content.spec.volume_group_snapshot_ref.uid.as_deref(),
        Some("g-uid")
    );
    assert_eq!(
        content
            .spec
            .volume_group_snapshot_ref
            .api_version
            .as_deref(),
        Some("groupsnapshot.storage.k8s.io/v1")
    );
    assert_eq!(content.spec.driver, DRIVER);
    assert_eq!(
        content.metadata.finalizers,
        Some(vec![GROUP_CONTENT_BOUND_FINALIZER.to_string()])
    );
    assert_eq!(content.metadata.annotations, None);
}

#[test]
fn the_selector_with_expressions_picks_the_claims() {
    let world = World::new();
    let mut g = protected(group(Some("fast")));
    g.spec.source.selector = Some(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: Some(vec!["web".into()]),
            },
        ]),
        ..LabelSelector::default()
    });
    let GroupStep::CreateContent(content) = world.plan(&g) else {
        panic!("no content");
    };
    assert_eq!(
        content.spec.source.volume_handles,
        Some(vec!["vol-c".to_string()])
    );
}

#[test]
fn a_group_that_cannot_be_cut_says_why() {
    let g = protected(group(Some("fast")));
    let mut world = World::new();
    world.claims[0] = claim("b", "db", false);
    assert_eq!(
        failure(world.plan(&g)),
        (
            reason::CONTENT_CREATION_FAILED,
            "failed to create group snapshot content with error failed to get input parameters to create group snapshot g: \"the PVC b is not yet bound to a PV, will not attempt to take a group snapshot\"".into()
        )
    );
    let mut world = World::new();
    world.volumes[1] = volume("b", "other.csi.k8s.io");
    assert_eq!(
        failure(world.plan(&g)),
        (
            reason::CREATE_CONTENT_FAILED,
            format!(
                "Volume CSI driver (other.csi.k8s.io) mismatch with VolumeGroupSnapshotClass ({DRIVER}) ns/g: pv-b"
            )
        )
    );
    let mut world = World::new();
    world.claims.clear();
    assert_eq!(
        failure(world.plan(&g)).1,
        "failed to create group snapshot content with error failed to get input parameters to create group snapshot g: \"label selector app=db for group snapshot not applied to any PVC\""
    );
    let mut both = g.clone();
    both.spec.source.volume_group_snapshot_content_name = Some("x".into());
    assert_eq!(failure(world.plan(&both)).0, reason::VALIDATION_ERROR);
}

#[test]
fn the_group_secret_is_recorded_on_the_content_and_its_members() {
    let mut world = World::new();
    world.classes[0].parameters = Some(labels(&[
        (
            GROUP_SNAPSHOTTER.name,
            "secret-${volumegroupsnapshotcontent.name}",
        ),
        (GROUP_SNAPSHOTTER.namespace, "vault"),
    ]));
    let g = protected(group(Some("fast")));
    world.cut(&g, true);
    let annotations = world.content.as_ref().unwrap().metadata.annotations.clone();
    assert_eq!(
        annotations,
        Some(labels(&[
            (DELETION_SECRET_NAME, "secret-groupsnapcontent-g-uid"),
            (DELETION_SECRET_NAMESPACE, "vault"),
        ]))
    );
    world.create_members(&g);
    let member = world.member_contents[0]
        .metadata
        .annotations
        .clone()
        .unwrap();
    assert_eq!(
        member[snapshots::DELETION_SECRET_NAME],
        "secret-groupsnapcontent-g-uid"
    );
    assert_eq!(member[GROUP_SNAPSHOT_HANDLE], "group-1");
}

#[test]
fn a_cut_group_gets_its_members_once_then_is_ready_with_them() {
    let g = protected(group(Some("fast")));
    let mut world = World::new();
    world.cut(&g, true);
    let GroupStep::CreateMemberSnapshots(snapshots) = world.plan(&g) else {
        panic!("no members");
    };
    assert_eq!(snapshots.len(), 2);
    let a = &snapshots[0];
    assert_eq!(a.name_any(), member_snapshot_name("g-uid", "vol-a"));
    assert_eq!(a.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(
        a.spec.source.persistent_volume_claim_name.as_deref(),
        Some("a")
    );
    let owner = &a.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        (
            "groupsnapshot.storage.k8s.io/v1",
            "VolumeGroupSnapshot",
            "g",
            "g-uid"
        )
    );
    assert_eq!(owner.controller, None);
    assert_eq!(
        a.metadata.finalizers,
        Some(vec![
            IN_GROUP_FINALIZER.to_string(),
            SNAPSHOT_AS_SOURCE_FINALIZER.to_string()
        ])
    );
    assert!(owning_group(a).is_some());
    world.create_members(&g);
    let content = &world.member_contents[0];
    assert_eq!(content.name_any(), member_content_name("g-uid", "vol-a"));
    assert_eq!(
        content.spec.volume_snapshot_ref.uid,
        world.members[0].metadata.uid
    );
    // As upstream writes it: kind, name, namespace and uid, no apiVersion.
    assert_eq!(content.spec.volume_snapshot_ref.api_version, None);
    assert_eq!(content.spec.source.volume_handle.as_deref(), Some("vol-a"));
    assert_eq!(
        content.spec.source_volume_mode.as_deref(),
        Some("Filesystem")
    );
    assert_eq!(content.spec.deletion_policy, DeletionPolicy::Delete);
    let GroupStep::SetMemberContentStatus(statuses) = world.plan(&g) else {
        panic!("no member status");
    };
    assert_eq!(
        statuses[1],
        (
            member_content_name("g-uid", "vol-b"),
            VolumeSnapshotContentStatus {
                snapshot_handle: Some("snap-b".into()),
                volume_group_snapshot_handle: Some("group-1".into()),
                creation_time: Some(7),
                restore_size: Some(1024),
                ready_to_use: Some(true),
                error: None,
            }
        )
    );
    for (content, (_, status)) in world.member_contents.iter_mut().zip(statuses) {
        content.status = Some(status);
    }
    // The content is ready, the member snapshots not yet: bound, created, not ready.
    let GroupStep::UpdateStatus { status, events } = world.plan(&g) else {
        panic!("no status");
    };
    assert_eq!(status.ready_to_use, Some(false));
    assert_eq!(
        status.bound_volume_group_snapshot_content_name.as_deref(),
        Some("groupsnapcontent-g-uid")
    );
    assert_eq!(
        events.iter().map(|e| e.0).collect::<Vec<_>>(),
        [reason::CREATED]
    );
    let g = VolumeGroupSnapshot {
        status: Some(*status),
        ..g
    };
    for member in &mut world.members {
        member.status = Some(VolumeSnapshotStatus {
            ready_to_use: Some(true),
            ..VolumeSnapshotStatus::default()
        });
    }
    let GroupStep::UpdateStatus { status, events } = world.plan(&g) else {
        panic!("no status");
    };
    assert_eq!(status.ready_to_use, Some(true));
    assert_eq!(
        events,
        vec![(
            reason::READY,
            "GroupSnapshot ns/g is ready to use.".to_string()
        )]
    );
    let g = VolumeGroupSnapshot {
        status: Some(*status),
        ..g
    };
    assert_eq!(world.plan(&g), GroupStep::Nothing);
    // A ready group whose content is gone is not cut again.
    world.content = None;
    assert_eq!(failure(world.plan(&g)).0, reason::CONTENT_MISSING);
}

#[test]
fn a_content_of_another_group_is_refused() {
    let g = protected(group(Some("fast")));
    let mut world = World::new();
    world.cut(&g, false);
    world
        .content
        .as_mut()
        .unwrap()
        .spec
        .volume_group_snapshot_ref
        .uid = Some("other".into());
    assert_eq!(
        failure(world.plan(&g)),
        (
            reason::CONTENT_MISBOUND,
            "VolumeGroupSnapshotContent [groupsnapcontent-g-uid] is bound to a different group snapshot".into()
        )
    );
}

fn pre_provisioned_content(uid: Option<&str>) -> VolumeGroupSnapshotContent {
    VolumeGroupSnapshotContent::new(
        "imported",
        VolumeGroupSnapshotContentSpec {
            volume_group_snapshot_ref: ObjectReference {
                name: Some("g".into()),
                namespace: Some("ns".into()),
                uid: uid.map(str::to_string),
                ..ObjectReference::default()
            },
            deletion_policy: DeletionPolicy::Retain,
            driver: DRIVER.into(),
            volume_group_snapshot_class_name: None,
            source: VolumeGroupSnapshotContentSource {
                volume_handles: None,
                group_snapshot_handles: Some(groupsnapshot::GroupSnapshotHandles {
                    volume_group_snapshot_handle: "group-9".into(),
                    volume_snapshot_handles: vec!["s1".into()],
                }),
            },
        },
    )
}

#[test]
fn a_pre_provisioned_group_binds_the_content_it_names() {
    let mut g = protected(group(None));
    g.spec.source = VolumeGroupSnapshotSource {
        selector: None,
        volume_group_snapshot_content_name: Some("imported".into()),
    };
    let mut world = World::new();
    assert_eq!(failure(world.plan(&g)).0, reason::CONTENT_MISSING);
    world.content = Some(pre_provisioned_content(None));
    assert_eq!(
        world.plan(&g),
        GroupStep::Bind {
            content: "imported".into(),
            uid: "g-uid".into(),
            class: None
        }
    );
    world.content = Some(pre_provisioned_content(Some("g-uid")));
    world.content.as_mut().unwrap().status = Some(VolumeGroupSnapshotContentStatus {
        volume_group_snapshot_handle: Some("group-9".into()),
        ready_to_use: Some(true),
        ..VolumeGroupSnapshotContentStatus::default()
    });
    let GroupStep::UpdateStatus { status, .. } = world.plan(&g) else {
        panic!("no status");
    };
    assert_eq!(status.ready_to_use, Some(true));
    let mut dynamic = world.content.clone().unwrap();
    dynamic.spec.source = VolumeGroupSnapshotContentSource {
        volume_handles: Some(vec!["vol-a".into()]),
        group_snapshot_handles: None,
    };
    world.content = Some(dynamic);
    assert_eq!(failure(world.plan(&g)).0, reason::CONTENT_MISMATCH);
}

#[test]
fn a_deleted_group_tells_deletes_its_content_and_members_then_goes() {
    let g = protected(group(Some("fast")));
    let mut world = World::new();
    world.cut(&g, true);
    world.create_members(&g);
    let gone = deleting(g.clone());
    // A member being restored holds the deletion.
    let mut restore = claim("r", "x", false);
    restore.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: world.members[0].name_any(),
    });
    world.claims.push(restore);
    assert_eq!(failure(world.plan(&gone)).0, reason::DELETE_PENDING);
    world.claims.pop();
    assert_eq!(
        world.plan(&gone),
        GroupStep::MarkContentBeingDeleted("groupsnapcontent-g-uid".into())
    );
    let content = world.content.as_mut().unwrap();
    content.metadata.annotations = Some(labels(&[(groupsnapshot::BEING_DELETED, "yes")]));
    assert_eq!(
        world.plan(&gone),
        GroupStep::DeleteContent("groupsnapcontent-g-uid".into())
    );
    world.content.as_mut().unwrap().metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let GroupStep::DeleteMembers(names) = world.plan(&gone) else {
        panic!("no members to delete");
    };
    assert_eq!(names.len(), 2);
    world.members.clear();
    assert_eq!(
        world.plan(&gone),
        GroupStep::Nothing,
        "waits for its content"
    );
    world.content = None;
    assert_eq!(world.plan(&gone), GroupStep::RemoveFinalizer);
    // Retain: the content stays, the finalizer goes.
    let mut world = World::new();
    world.classes[0].deletion_policy = DeletionPolicy::Retain;
    world.cut(&g, true);
    let content = world.content.as_mut().unwrap();
    content.metadata.annotations = Some(labels(&[(groupsnapshot::BEING_DELETED, "yes")]));
    assert_eq!(world.plan(&gone), GroupStep::RemoveFinalizer);
    // Without our finalizer, nothing is ours to do.
    assert_eq!(world.plan(&deleting(group(None))), GroupStep::Nothing);
}

#[test]
fn a_group_content_is_validated_and_protected_once_bound() {
    let mut content = pre_provisioned_content(None);
    assert_eq!(content_plan(&content), GroupContentStep::Nothing);
    content.spec.volume_group_snapshot_ref.uid = Some("g-uid".into());
    assert_eq!(content_plan(&content), GroupContentStep::AddFinalizer);
    content.spec.source.volume_handles = Some(vec!["x".into()]);
    assert_eq!(
        content_plan(&content),
        GroupContentStep::Invalid(
            "Exactly one of GroupSnapshotHandles and VolumeHandles should be specified".into()
        )
    );
}

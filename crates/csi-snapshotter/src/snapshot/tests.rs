use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

use super::*;
use csi_kinds::groupsnapshot::IN_GROUP_FINALIZER;
use csi_kinds::snapshot::{
    IS_DEFAULT_CLASS, SnapshotError, VolumeSnapshotContentStatus, VolumeSnapshotSource,
    VolumeSnapshotSpec,
};

const DRIVER: &str = "hostpath.csi.k8s.io";

fn snapshot(source: VolumeSnapshotSource, class: Option<&str>) -> VolumeSnapshot {
    let mut s = VolumeSnapshot::new(
        "snap",
        VolumeSnapshotSpec {
            source,
            volume_snapshot_class_name: class.map(str::to_string),
        },
    );
    s.metadata.namespace = Some("ns".into());
    s.metadata.uid = Some("u1".into());
    s
}

fn dynamic(class: Option<&str>) -> VolumeSnapshot {
    snapshot(
        VolumeSnapshotSource {
            persistent_volume_claim_name: Some("data".into()),
            volume_snapshot_content_name: None,
        },
        class,
    )
}

fn pre_provisioned() -> VolumeSnapshot {
    snapshot(
        VolumeSnapshotSource {
            persistent_volume_claim_name: None,
            volume_snapshot_content_name: Some("imported".into()),
        },
        None,
    )
}

fn finalized(mut s: VolumeSnapshot, finalizers: &[&str]) -> VolumeSnapshot {
    s.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    s
}

fn bound(mut s: VolumeSnapshot, content: &str, ready: bool) -> VolumeSnapshot {
    s.status = Some(VolumeSnapshotStatus {
        bound_volume_snapshot_content_name: Some(content.into()),
        ready_to_use: Some(ready),
        ..VolumeSnapshotStatus::default()
    });
    s
}

fn deleting(mut s: VolumeSnapshot) -> VolumeSnapshot {
    s.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    s
}

fn class(name: &str, default: bool) -> VolumeSnapshotClass {
    serde_json::from_value(json!({"metadata": {"name": name,
        "annotations": {IS_DEFAULT_CLASS: default.to_string()}},
        "driver": DRIVER, "deletionPolicy": "Delete",
        "parameters": {"csi.storage.k8s.io/snapshotter-secret-name": "s",
                       "csi.storage.k8s.io/snapshotter-secret-namespace": "${volumesnapshot.namespace}"}}))
    .unwrap()
}

fn claim(phase: &str, finalizers: &[&str]) -> PersistentVolumeClaim {
    serde_json::from_value(
        json!({"metadata": {"name": "data", "namespace": "ns", "uid": "c1",
        "finalizers": finalizers},
        "spec": {"volumeName": "pv-1"}, "status": {"phase": phase}}),
    )
    .unwrap()
}

fn volume() -> PersistentVolume {
    serde_json::from_value(json!({"metadata": {"name": "pv-1"},
        "spec": {"volumeMode": "Filesystem",
                 "claimRef": {"name": "data", "namespace": "ns", "uid": "c1"},
                 "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}}))
    .unwrap()
}

fn content(
    name: &str,
    policy: DeletionPolicy,
    dynamic: bool,
    uid: Option<&str>,
) -> VolumeSnapshotContent {
    let source = if dynamic {
        json!({"volumeHandle": "vol-1"})
    } else {
        json!({"snapshotHandle": "snap-1"})
    };
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"driver": DRIVER, "deletionPolicy": policy, "source": source,
                 "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": uid}}}))
    .unwrap()
}

struct World {
    content: Option<VolumeSnapshotContent>,
    claim: Option<PersistentVolumeClaim>,
    volume: Option<PersistentVolume>,
    classes: Vec<VolumeSnapshotClass>,
    restoring: bool,
    held_by_group: bool,
    /// `--enable-distributed-snapshotting`'s Nodes.
    nodes: Option<Vec<Node>>,
}

impl World {
    fn new() -> Self {
        World {
            content: None,
            claim: Some(claim("Bound", &[PVC_AS_SOURCE_FINALIZER])),
            volume: Some(volume()),
            classes: vec![class("default", true), class("other", false)],
            restoring: false,
            held_by_group: false,
            nodes: None,
        }
    }

    fn with_content(mut self, content: VolumeSnapshotContent) -> Self {
        self.content = Some(content);
        self
    }

    fn plan(&self, snapshot: &VolumeSnapshot) -> Step {
        let classes: Vec<&VolumeSnapshotClass> = self.classes.iter().collect();
        let nodes: Option<Vec<&Node>> = self.nodes.as_ref().map(|n| n.iter().collect());
        plan(
            snapshot,
            &Inputs {
                content: self.content.as_ref(),
                claim: self.claim.as_ref(),
                volume: self.volume.as_ref(),
                classes: &classes,
                restoring: self.restoring,
                prevent_volume_mode_conversion: true,
                held_by_group: self.held_by_group,
                nodes: nodes.as_deref(),
            },
        )
    }
}

fn failure(step: Step) -> (&'static str, String) {
    match step {
        Step::Fail(f) => (f.reason, f.message),
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// A content refused: the failure's reason and message, and the error its Event quotes.
fn refusal(step: Step) -> (&'static str, String, String) {
    match step {
        Step::RefuseContent { failure, error } => (failure.reason, failure.message, error),
        other => panic!("expected a refused content, got {other:?}"),
    }
}

const BOTH: &[&str] = &[SNAPSHOT_AS_SOURCE_FINALIZER, SNAPSHOT_BOUND_FINALIZER];

#[test]
fn a_dynamic_snapshot_goes_class_finalizer_claim_content_status() {
    let world = World::new();
    assert_eq!(world.plan(&dynamic(None)), Step::SetClass("default".into()));
    assert_eq!(
        world.plan(&dynamic(Some("default"))),
        Step::AddFinalizers {
            source: true,
            bound: false
        }
    );
    let ready_to_cut = finalized(dynamic(Some("default")), &[SNAPSHOT_AS_SOURCE_FINALIZER]);
    let unprotected = World {
        claim: Some(claim("Bound", &[])),
        ..World::new()
    };
    assert_eq!(
        unprotected.plan(&ready_to_cut),
        Step::ProtectClaim("data".into())
    );
    let Step::CreateContent {
        content: created,
        placement: Placement::Central,
    } = world.plan(&ready_to_cut)
    else {
        panic!("expected a content");
    };
    assert_eq!(created.metadata.labels, None);
    assert_eq!(created.metadata.name.as_deref(), Some("snapcontent-u1"));
    assert_eq!(created.spec.source.volume_handle.as_deref(), Some("vol-1"));
    assert_eq!(created.spec.volume_snapshot_ref.uid.as_deref(), Some("u1"));
    assert_eq!(
        created.metadata.finalizers.as_deref(),
        Some(&[csi_kinds::snapshot::CONTENT_BOUND_FINALIZER.to_string()][..]),
        "born with the bound finalizer: no window in which a deletion loses the snapshot"
    );
    assert_eq!(
        created.spec.source_volume_mode.as_deref(),
        Some("Filesystem")
    );
    assert_eq!(
        created.metadata.annotations.as_ref().unwrap()
            [csi_kinds::snapshot::DELETION_SECRET_NAMESPACE],
        "ns",
        "the secret template resolved with the snapshot's namespace"
    );
    let mut cut = content("snapcontent-u1", DeletionPolicy::Delete, true, Some("u1"));
    let with_content = World::new().with_content(cut.clone());
    let Step::UpdateStatus { status, events } = with_content.plan(&ready_to_cut) else {
        panic!("expected a status");
    };
    assert_eq!(
        status.bound_volume_snapshot_content_name.as_deref(),
        Some("snapcontent-u1")
    );
    assert_eq!(status.ready_to_use, Some(false));
    assert!(events.is_empty());
    let bound_unready = bound(ready_to_cut.clone(), "snapcontent-u1", false);
    assert_eq!(
        with_content.plan(&bound_unready),
        Step::AddFinalizers {
            source: false,
            bound: true
        },
        "bound to a content that deletes: the bound finalizer"
    );
    cut.status = Some(VolumeSnapshotContentStatus {
        ready_to_use: Some(true),
        restore_size: Some(2 * 1024 * 1024),
        creation_time: Some(1_700_000_000_000_000_000),
        snapshot_handle: Some("h".into()),
        ..VolumeSnapshotContentStatus::default()
    });
    let world = World::new().with_content(cut);
    let Step::UpdateStatus { status, events } = world.plan(&finalized(bound_unready, BOTH)) else {
        panic!("expected a status");
    };
    assert_eq!(status.ready_to_use, Some(true));
    assert_eq!(
        status.restore_size.as_ref().map(|q| q.0.as_str()),
        Some("2Mi")
    );
    assert!(status.creation_time.is_some());
    let reasons: Vec<_> = events.iter().map(|(r, _)| *r).collect();
    assert_eq!(reasons, [reason::SNAPSHOT_CREATED, reason::SNAPSHOT_READY]);
    assert_eq!(events[1].1, "Snapshot ns/snap is ready to use.");
}

/// `--enable-distributed-snapshotting`: a content of a node-local volume carries its node.
#[test]
fn a_distributed_content_is_labelled_with_its_volume_node() {
    let ready_to_cut = finalized(dynamic(Some("default")), &[SNAPSHOT_AS_SOURCE_FINALIZER]);
    let nodes: Vec<Node> = ["node-a", "node-b"]
        .iter()
        .map(|name| {
            serde_json::from_value(json!({"metadata": {"name": name,
                "labels": {"topology.hostpath.csi/node": name}}}))
            .unwrap()
        })
        .collect();
    let local = |node: &str| {
        let mut volume = volume();
        volume.spec.as_mut().unwrap().node_affinity = Some(
            serde_json::from_value(json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.hostpath.csi/node",
                                       "operator": "In", "values": [node]}]}]}}))
            .unwrap(),
        );
        volume
    };
    for (case, volume, nodes, placement, label) in [
        (
            "on node-b",
            local("node-b"),
            Some(nodes.clone()),
            Placement::Node("node-b".into()),
            Some("node-b"),
        ),
        (
            "not node-local",
            volume(),
            Some(nodes.clone()),
            Placement::NotNodeLocal,
            None,
        ),
        (
            "on a node that is gone",
            local("node-gone"),
            Some(nodes.clone()),
            Placement::NoNode,
            None,
        ),
        (
            "distributed off",
            local("node-b"),
            None,
            Placement::Central,
            None,
        ),
    ] {
        let world = World {
            volume: Some(volume),
            nodes,
            ..World::new()
        };
        let Step::CreateContent {
            content,
            placement: placed,
        } = world.plan(&ready_to_cut)
        else {
            panic!("{case}: expected a content");
        };
        assert_eq!(placed, placement, "{case}");
        let labelled = content
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("snapshot.storage.kubernetes.io/managed-by"));
        assert_eq!(labelled.map(String::as_str), label, "{case}");
    }
}

#[test]
fn bad_inputs_fail_with_upstream_reasons() {
    let world = World::new();
    let unbound_claim = World {
        claim: Some(claim("Pending", &[])),
        ..World::new()
    };
    assert_eq!(
        failure(unbound_claim.plan(&dynamic(None))),
        (
            reason::SET_DEFAULT_CLASS_FAILED,
            "Failed to set default snapshot class with error the PVC data is not yet bound to a PV, will not attempt to take a snapshot".into()
        )
    );
    let two_defaults = World {
        classes: vec![class("a", true), class("b", true)],
        ..World::new()
    };
    assert_eq!(
        failure(two_defaults.plan(&dynamic(None))).1,
        "Failed to set default snapshot class with error 2 default snapshot classes were found"
    );
    assert_eq!(
        failure(world.plan(&dynamic(Some("missing")))).0,
        reason::GET_SNAPSHOT_CLASS_FAILED
    );
    let both = snapshot(
        VolumeSnapshotSource {
            persistent_volume_claim_name: Some("data".into()),
            volume_snapshot_content_name: Some("c".into()),
        },
        Some("default"),
    );
    assert_eq!(failure(world.plan(&both)).0, reason::VALIDATION_ERROR);
    let pre = World::new().with_content(content("imported", DeletionPolicy::Retain, true, None));
    assert_eq!(
        refusal(pre.plan(&pre_provisioned())),
        (
            reason::CONTENT_MISMATCH,
            "VolumeSnapshotContent is dynamically provisioned while expecting a pre-provisioned one"
                .into(),
            "snapshot ns/snap expects a pre-provisioned VolumeSnapshotContent imported \
             but gets a dynamically provisioned one"
                .into()
        )
    );
    let other = World::new().with_content(content(
        "imported",
        DeletionPolicy::Retain,
        false,
        Some("someone-else"),
    ));
    let misbound = "VolumeSnapshotContent [imported] is bound to a different snapshot";
    assert_eq!(
        refusal(other.plan(&pre_provisioned())),
        (reason::CONTENT_MISBOUND, misbound.into(), misbound.into())
    );
    let missing = finalized(pre_provisioned(), &[SNAPSHOT_AS_SOURCE_FINALIZER]);
    assert_eq!(
        failure(world.plan(&missing)),
        (
            reason::CONTENT_MISSING,
            "VolumeSnapshotContent is missing".into()
        )
    );
}

#[test]
fn a_pre_provisioned_content_is_bound_then_its_status_copied() {
    let snapshot = finalized(pre_provisioned(), &[SNAPSHOT_AS_SOURCE_FINALIZER]);
    let world = World::new().with_content(content("imported", DeletionPolicy::Retain, false, None));
    assert_eq!(
        world.plan(&snapshot),
        Step::Bind {
            content: "imported".into(),
            uid: "u1".into(),
            class: None
        }
    );
    let bound_content = World::new().with_content(content(
        "imported",
        DeletionPolicy::Retain,
        false,
        Some("u1"),
    ));
    assert!(matches!(
        bound_content.plan(&snapshot),
        Step::UpdateStatus { .. }
    ));
}

#[test]
fn deletion_marks_deletes_then_releases() {
    let snapshot = deleting(bound(
        finalized(dynamic(Some("default")), BOTH),
        "snapcontent-u1",
        true,
    ));
    let cut = content("snapcontent-u1", DeletionPolicy::Delete, true, Some("u1"));
    let world = World::new().with_content(cut.clone());
    assert_eq!(
        world.plan(&snapshot),
        Step::MarkContentBeingDeleted("snapcontent-u1".into())
    );
    let mut marked = cut.clone();
    marked.metadata.annotations = Some([(BEING_DELETED.to_string(), "yes".to_string())].into());
    let world = World::new().with_content(marked.clone());
    assert_eq!(
        world.plan(&snapshot),
        Step::DeleteContent("snapcontent-u1".into())
    );
    marked.metadata.deletion_timestamp = snapshot.metadata.deletion_timestamp.clone();
    let world = World::new().with_content(marked);
    assert_eq!(
        world.plan(&snapshot),
        Step::RemoveFinalizers {
            source: true,
            bound: false,
            in_group: false
        },
        "the bound finalizer stays until the content is gone"
    );
    let gone = finalized(snapshot.clone(), &[SNAPSHOT_BOUND_FINALIZER]);
    assert_eq!(
        World::new().plan(&gone),
        Step::RemoveFinalizers {
            source: false,
            bound: true,
            in_group: false
        }
    );
    let mut retained = cut;
    retained.spec.deletion_policy = DeletionPolicy::Retain;
    retained.metadata.annotations = Some([(BEING_DELETED.to_string(), "yes".to_string())].into());
    assert_eq!(
        World::new().with_content(retained).plan(&snapshot),
        Step::RemoveFinalizers {
            source: true,
            bound: true,
            in_group: false
        },
        "Retain: the content stays, the snapshot goes"
    );
    let restoring = World {
        restoring: true,
        ..World::new().with_content(content(
            "snapcontent-u1",
            DeletionPolicy::Delete,
            true,
            Some("u1"),
        ))
    };
    assert_eq!(failure(restoring.plan(&snapshot)).0, reason::DELETE_PENDING);
    assert_eq!(World::new().plan(&deleting(dynamic(None))), Step::Nothing);
}

#[test]
fn contents_get_their_finalizer_and_hear_of_deletion() {
    let cut = content("snapcontent-u1", DeletionPolicy::Delete, true, Some("u1"));
    assert_eq!(content_plan(&cut, None), ContentStep::AddFinalizer);
    let mut protected = cut.clone();
    protected.metadata.finalizers = Some(vec![CONTENT_BOUND_FINALIZER.into()]);
    assert_eq!(content_plan(&protected, None), ContentStep::Nothing);
    let going = deleting(finalized(dynamic(Some("default")), BOTH));
    assert_eq!(
        content_plan(&protected, Some(&going)),
        ContentStep::MarkBeingDeleted
    );
    let unbound = content("imported", DeletionPolicy::Retain, false, None);
    assert_eq!(content_plan(&unbound, None), ContentStep::Nothing);
    let mut invalid = cut;
    invalid.spec.source.snapshot_handle = Some("h".into());
    assert!(matches!(
        content_plan(&invalid, None),
        ContentStep::Invalid(_)
    ));
}

#[test]
fn the_claim_protection_goes_once_no_snapshot_can_still_be_cut() {
    let failed = |mut s: VolumeSnapshot| {
        s.status.get_or_insert_default().error = Some(SnapshotError {
            message: Some("failed to get input parameters to create snapshot".into()),
            time: None,
        });
        s
    };
    let fresh = dynamic(Some("default"));
    // (snapshot, whether its content is in the cache, whether it holds the claim)
    let cases = [
        (fresh.clone(), false, true),
        (fresh.clone(), true, true),
        (bound(fresh.clone(), "c", false), false, true),
        (bound(fresh.clone(), "c", true), true, false),
        // #1305: a missing class; the claim is released.
        (failed(dynamic(Some("missing"))), false, false),
        // Failed with a content: CreateSnapshot is retried.
        (failed(bound(fresh.clone(), "c", false)), true, true),
        (failed(fresh.clone()), true, true),
        (deleting(fresh.clone()), false, false),
        (deleting(fresh.clone()), true, true),
        (deleting(bound(fresh.clone(), "c", false)), false, true),
    ];
    let claim = claim("Bound", &[PVC_AS_SOURCE_FINALIZER]);
    for (i, (snapshot, has_content, holds)) in cases.iter().enumerate() {
        assert_eq!(may_still_be_cut(snapshot, *has_content), *holds, "case {i}");
        assert_eq!(
            claim_protection_removable(&claim, [snapshot], |_| *has_content),
            !holds,
            "case {i}"
        );
    }
    assert!(claim_protection_removable(&claim, [], |_| false));
    let plain = self::claim("Bound", &[]);
    assert!(!claim_protection_removable(&plain, [], |_| false));
    let mut other = fresh;
    other.spec.source.persistent_volume_claim_name = Some("other".into());
    assert!(claim_protection_removable(&claim, [&other], |_| false));
}

#[test]
fn a_failed_claim_release_is_reported_on_each_snapshot_of_the_claim() {
    let named = |name: &str, mut s: VolumeSnapshot| {
        s.metadata.name = Some(name.into());
        s
    };
    let mut elsewhere = dynamic(Some("default"));
    elsewhere.metadata.namespace = Some("other".into());
    let mut other_claim = dynamic(Some("default"));
    other_claim.spec.source.persistent_volume_claim_name = Some("logs".into());
    let cases = [
        ("ready", bound(dynamic(Some("default")), "c", true), true),
        ("cutting", dynamic(Some("default")), true),
        ("deleted", deleting(bound(dynamic(None), "c", true)), true),
        ("elsewhere", elsewhere, false),
        ("other-claim", other_claim, false),
        ("pre-provisioned", pre_provisioned(), false),
    ];
    let snapshots: Vec<VolumeSnapshot> = cases
        .iter()
        .map(|(name, s, _)| named(name, s.clone()))
        .collect();
    let claim = claim("Bound", &[PVC_AS_SOURCE_FINALIZER]);
    let reported: Vec<String> = snapshots_of_claim(&claim, &snapshots)
        .map(|s| s.name_any())
        .collect();
    for (name, _, expected) in &cases {
        assert_eq!(
            reported.contains(&name.to_string()),
            *expected,
            "{name}: reported {reported:?}"
        );
    }
}

#[test]
fn a_claim_that_cannot_be_protected_fails_the_content_creation() {
    let mut going = claim("Bound", &[]);
    going.metadata.deletion_timestamp = deleting(dynamic(None)).metadata.deletion_timestamp;
    let mut protected_going = claim("Bound", &[PVC_AS_SOURCE_FINALIZER]);
    protected_going.metadata.deletion_timestamp = going.metadata.deletion_timestamp.clone();
    let being_deleted = World {
        claim: Some(going),
        ..World::new()
    };
    // Still held by another snapshot's protection: no new cut starts either.
    let protected_being_deleted = World {
        claim: Some(protected_going),
        ..World::new()
    };
    let ready_to_cut = finalized(dynamic(Some("default")), &[SNAPSHOT_AS_SOURCE_FINALIZER]);
    let cases = [
        (
            "the claim is being deleted (planned)",
            being_deleted.plan(&ready_to_cut),
            "Failed to create snapshot content with error snapshot controller failed to update data on API server: cannot add finalizer on claim because it is being deleted",
        ),
        (
            "the claim is being deleted, still protected",
            protected_being_deleted.plan(&ready_to_cut),
            "Failed to create snapshot content with error snapshot controller failed to update data on API server: cannot add finalizer on claim because it is being deleted",
        ),
        (
            "the finalizer patch fails (the adapter's failure)",
            Step::Fail(Failure::content_creation(
                "snapshot controller failed to update data on API server: refused",
            )),
            "Failed to create snapshot content with error snapshot controller failed to update data on API server: refused",
        ),
    ];
    for (case, step, message) in cases {
        let Step::Fail(failure) = step else {
            panic!("{case}: expected a failure, got {step:?}");
        };
        assert_eq!(
            failure,
            Failure {
                reason: reason::CONTENT_CREATION_FAILED,
                message: message.into(),
                status: Some(true),
            },
            "{case}"
        );
    }
}

#[test]
fn restores_are_pending_claims_with_the_snapshot_as_source() {
    let restore: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "r", "namespace": "ns"},
        "spec": {"dataSource": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "snap"}},
        "status": {"phase": "Pending"}}))
    .unwrap();
    assert!(restores_from(&restore, &dynamic(None)));
    let mut done = restore.clone();
    done.status.as_mut().unwrap().phase = Some("Bound".into());
    assert!(!restores_from(&done, &dynamic(None)));
}

/// A member snapshot of group `g`, as the group's sync creates it.
fn member() -> VolumeSnapshot {
    let mut s = finalized(
        dynamic(None),
        &[IN_GROUP_FINALIZER, SNAPSHOT_AS_SOURCE_FINALIZER],
    );
    s.metadata.name = Some("snapshot-abc".into());
    s.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "groupsnapshot.storage.k8s.io/v1".into(),
            kind: "VolumeGroupSnapshot".into(),
            name: "g".into(),
            uid: "g-uid".into(),
            ..Default::default()
        },
    ]);
    s
}

#[test]
fn a_group_member_is_bound_by_its_group_and_goes_with_it() {
    let snapshot = member();
    assert_eq!(content_name(&snapshot).as_deref(), Some("snapcontent-abc"));
    // No class, no claim protection, no content of its own: its group makes the content.
    assert_eq!(World::new().plan(&snapshot), Step::Nothing);
    let mut made = content("snapcontent-abc", DeletionPolicy::Delete, true, Some("u1"));
    made.spec.volume_snapshot_ref.name = Some("snapshot-abc".into());
    made.status = Some(VolumeSnapshotContentStatus {
        snapshot_handle: Some("snap-a".into()),
        volume_group_snapshot_handle: Some("group-1".into()),
        creation_time: Some(1_000),
        ready_to_use: Some(true),
        restore_size: Some(1024),
        error: None,
    });
    let Step::UpdateStatus { status, events } =
        World::new().with_content(made.clone()).plan(&snapshot)
    else {
        panic!("no status");
    };
    assert_eq!(
        status.bound_volume_snapshot_content_name.as_deref(),
        Some("snapcontent-abc")
    );
    assert_eq!(status.volume_group_snapshot_name.as_deref(), Some("g"));
    assert_eq!(status.ready_to_use, Some(true));
    assert_eq!(events.len(), 2);
    let bound = VolumeSnapshot {
        status: Some(*status),
        ..snapshot.clone()
    };
    assert_eq!(
        World::new().with_content(made.clone()).plan(&bound),
        Step::Nothing,
        "no bound finalizer: the content goes with the group"
    );
    let gone = deleting(bound);
    let held = World {
        held_by_group: true,
        ..World::new().with_content(made.clone())
    };
    assert_eq!(
        failure(held.plan(&gone)),
        (
            reason::DELETE_PENDING,
            "deletion of the individual volume snapshot ns/snapshot-abc is not allowed as it belongs to group snapshot ns/g. Deleting the group snapshot will trigger the deletion of all the individual volume snapshots that are part of the group.".into()
        )
    );
    let mut marked = made;
    marked.metadata.annotations = Some([(BEING_DELETED.to_string(), "yes".to_string())].into());
    marked.metadata.deletion_timestamp = gone.metadata.deletion_timestamp.clone();
    assert_eq!(
        World::new().with_content(marked).plan(&gone),
        Step::RemoveFinalizers {
            source: true,
            bound: false,
            in_group: true
        }
    );
}

#[test]
fn a_failure_is_recorded_once_in_either_status() {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    let failure = |status| Failure {
        reason: reason::VALIDATION_ERROR,
        message: "boom".into(),
        status,
    };
    assert_eq!(
        failure(None).recording::<VolumeSnapshotStatus>(None, now.clone()),
        Recording::EventOnly
    );
    let Recording::Status(written) = failure(Some(true)).recording(
        Some(&VolumeSnapshotStatus {
            ready_to_use: Some(true),
            ..VolumeSnapshotStatus::default()
        }),
        now.clone(),
    ) else {
        panic!("no status written");
    };
    assert_eq!(written.ready_to_use, Some(false));
    assert_eq!(written.recorded_error(), Some("boom"));
    assert_eq!(
        failure(Some(true)).recording(Some(&written), now.clone()),
        Recording::Recorded
    );
    let group = csi_kinds::groupsnapshot::VolumeGroupSnapshotStatus {
        ready_to_use: Some(true),
        ..Default::default()
    };
    let Recording::Status(kept) = failure(Some(false)).recording(Some(&group), now) else {
        panic!("no group status written");
    };
    assert_eq!(
        kept.ready_to_use,
        Some(true),
        "readiness kept when not asked"
    );
    assert_eq!(kept.recorded_error(), Some("boom"));
}

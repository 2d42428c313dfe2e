//! Volume group snapshots (groupsnapshot.storage.k8s.io) with snapshot-controller, csi-snapshotter
//! and the reference driver's GroupController: a group of claims picked by a label selector is
//! cut at once, gets one member VolumeSnapshot per claim, and a member restores into a new
//! claim with the data written before the cut; a member is not deleted on its own; deleting the
//! group deletes its members and the driver's snapshots (policy Delete) or keeps them (Retain),
//! and a group snapshot that exists is imported as a pre-provisioned group with its members; a
//! driver that refuses the group is reported on the content and the group. The group CRDs are
//! read and written through each served version.

use csi_kinds::groupsnapshot::{
    GROUP_SNAPSHOT_BOUND_FINALIZER, VolumeGroupSnapshot, VolumeGroupSnapshotClass,
    VolumeGroupSnapshotContent, member_snapshot_name,
};
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::fixtures::{
    bound, claim, install_snapshot_crds, read_records, static_pv, static_pvc, write_records,
};
use csi_suite_scenarios::{Cluster, Sidecar, skip_without_root};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, TypeMeta,
};
use serde_json::json;
use std::time::Duration;

/// The components of a group-snapshot scenario.
struct Running {
    sidecars: Vec<Sidecar>,
    storage_class: String,
}

async fn start(cluster: &Cluster) -> Running {
    install_snapshot_crds(&cluster.client).await;
    let sidecars = vec![
        cluster.start_provisioner().await,
        cluster.start_attacher().await,
        cluster.start_snapshot_controller(),
        cluster.start_snapshotter().await,
    ];
    let storage_class = cluster
        .storage_class("groups", "Immediate", "Delete", json!({}))
        .await;
    Running {
        sidecars,
        storage_class,
    }
}

impl Running {
    async fn stop(self, cluster: Cluster) {
        for sidecar in self.sidecars {
            sidecar.stop().await;
        }
        cluster.stop().await;
    }
}

/// A VolumeGroupSnapshotClass `<namespace>-<suffix>` of the cluster's driver.
async fn group_class(cluster: &Cluster, suffix: &str, policy: &str, default: bool) -> String {
    let name = format!("{}-{suffix}", cluster.namespace);
    cluster.delete_at_cleanup::<VolumeGroupSnapshotClass>(None, &name);
    let annotations = if default {
        json!({"groupsnapshot.storage.kubernetes.io/is-default-class": "true"})
    } else {
        json!({})
    };
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeGroupSnapshotClass>(),
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1",
                "kind": "VolumeGroupSnapshotClass",
                "metadata": {"name": name, "annotations": annotations},
                "driver": cluster.driver_name, "deletionPolicy": policy}),
        )
        .await;
    name
}

/// Claims `names` of `class` labelled `app=<app>`, each Bound with records written into it.
async fn claims_with_records(cluster: &Cluster, class: &str, app: &str, names: &[&str]) {
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    for name in names {
        let mut labelled = claim(name, class);
        labelled["metadata"]["labels"] = json!({"app": app});
        cluster.create(&claims, labelled).await;
        write_records(cluster, name).await;
    }
}

fn ready<K>(status: impl Fn(&K) -> Option<bool>) -> impl Fn(&K) -> bool {
    move |object| status(object) == Some(true)
}

fn group_ready(group: &VolumeGroupSnapshot) -> Option<bool> {
    group.status.as_ref()?.ready_to_use
}

/// The snapshot IDs the driver lists.
async fn driver_snapshots(cluster: &Cluster) -> Vec<String> {
    let response = cluster
        .driver
        .controller
        .csi
        .list_snapshots(
            csi::ListSnapshotsRequest::default(),
            Duration::from_secs(10),
        )
        .await
        .expect("ListSnapshots");
    response
        .entries
        .into_iter()
        .filter_map(|e| e.snapshot)
        .map(|s| s.snapshot_id)
        .collect()
}

/// The member snapshots of `group` (by owner reference) in the scenario's namespace.
async fn members(cluster: &Cluster, group: &VolumeGroupSnapshot) -> Vec<VolumeSnapshot> {
    let uid = group.uid().unwrap_or_default();
    cluster
        .namespaced::<VolumeSnapshot>()
        .list(&ListParams::default())
        .await
        .expect("listing VolumeSnapshots")
        .items
        .into_iter()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
        .collect()
}

#[tokio::test]
async fn a_group_of_claims_is_cut_restored_and_deleted_with_its_members() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("group-snapshots").await;
    let running = start(&cluster).await;
    let app = format!("{}-db", cluster.namespace);
    claims_with_records(
        &cluster,
        &running.storage_class,
        &app,
        &["db-0", "db-1", "db-2"],
    )
    .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .create(&claims, claim("unrelated", &running.storage_class))
        .await;
    group_class(&cluster, "groups", "Delete", true).await;

    // No class named: the driver's default group class is recorded in the group's spec.
    let groups = cluster.namespaced::<VolumeGroupSnapshot>();
    cluster
        .create(
            &groups,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
                "metadata": {"name": "group"},
                "spec": {"source": {"selector": {"matchLabels": {"app": app}}}}}),
        )
        .await;
    let group = cluster
        .wait_for(&groups, "group", "the group ready", ready(group_ready))
        .await;
    assert_eq!(
        group.spec.volume_group_snapshot_class_name.as_deref(),
        Some(format!("{}-groups", cluster.namespace).as_str())
    );
    assert!(
        group
            .finalizers()
            .iter()
            .any(|f| f == GROUP_SNAPSHOT_BOUND_FINALIZER)
    );
    let uid = group.uid().unwrap();
    let content_name = format!("groupsnapcontent-{uid}");
    let status = group.status.clone().unwrap();
    assert_eq!(
        status.bound_volume_group_snapshot_content_name.as_deref(),
        Some(content_name.as_str())
    );
    assert!(status.creation_time.is_some());
    let contents = cluster.cluster_scoped::<VolumeGroupSnapshotContent>();
    let content = contents.get(&content_name).await.unwrap();
    let content_status = content.status.clone().unwrap();
    let group_handle = content_status.volume_group_snapshot_handle.clone().unwrap();
    let listed = content_status.members();
    assert_eq!(listed.len(), 3, "one member per selected claim");
    assert_eq!(
        content_status
            .volume_snapshot_handle_pair_list
            .as_ref()
            .map(Vec::len),
        Some(3),
        "the v1beta1 list too"
    );
    for event in [
        "CreatingGroupSnapshot",
        "GroupSnapshotCreated",
        "GroupSnapshotReady",
    ] {
        cluster.wait_for_event("group", event, "group").await;
    }

    // One ready member snapshot per volume, named as upstream, naming its group.
    let member_snapshots = members(&cluster, &group).await;
    assert_eq!(member_snapshots.len(), 3);
    let mut member_of_db0 = None;
    for member in &member_snapshots {
        let status = member.status.clone().unwrap_or_default();
        assert_eq!(status.ready_to_use, Some(true), "{}", member.name_any());
        assert_eq!(status.volume_group_snapshot_name.as_deref(), Some("group"));
        let handle = listed
            .iter()
            .find(|m| {
                member_snapshot_name(&uid, m.volume_handle.as_deref().unwrap()) == member.name_any()
            })
            .expect("a member of the listed volumes");
        assert!(
            driver_snapshots(&cluster)
                .await
                .contains(handle.snapshot_handle.as_ref().unwrap())
        );
        if member.spec.source.persistent_volume_claim_name.as_deref() == Some("db-0") {
            member_of_db0 = Some(member.name_any());
        }
    }
    let member_of_db0 = member_of_db0.expect("the member of db-0 names its claim");

    // A member restores into a new claim, read on another node, with the data written before.
    let mut restored = claim("restored", &running.storage_class);
    restored["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": member_of_db0});
    cluster.create(&claims, restored).await;
    cluster
        .wait_for(&claims, "restored", "the restored claim Bound", bound)
        .await;
    assert!(
        read_records(&cluster, "restored").await.lines().count() > 0,
        "the restored member has db-0's records"
    );

    // A member is not deleted on its own.
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    snapshots
        .delete(&member_of_db0, &DeleteParams::default())
        .await
        .unwrap();
    let message = cluster
        .wait_for_event(
            &member_of_db0,
            "SnapshotDeletePending",
            "belongs to group snapshot",
        )
        .await;
    assert!(message.contains(&format!("{}/group", cluster.namespace)));
    assert!(snapshots.get_opt(&member_of_db0).await.unwrap().is_some());

    // The group goes with its content, its members and the driver's snapshots.
    cluster
        .delete_and_wait(&groups, "group", "the group gone")
        .await;
    cluster
        .wait_gone(&contents, &content_name, "the group content gone")
        .await;
    for member in &member_snapshots {
        cluster
            .wait_gone(&snapshots, &member.name_any(), "the member snapshot gone")
            .await;
    }
    let member_contents = cluster.cluster_scoped::<VolumeSnapshotContent>();
    for member in &listed {
        let name = csi_kinds::groupsnapshot::member_content_name(
            &uid,
            member.volume_handle.as_deref().unwrap(),
        );
        cluster
            .wait_gone(&member_contents, &name, "the member content gone")
            .await;
    }
    let handles: Vec<String> = listed
        .iter()
        .filter_map(|m| m.snapshot_handle.clone())
        .collect();
    cluster
        .eventually_async("the driver's group snapshot deleted", || async {
            let left = driver_snapshots(&cluster).await;
            !handles.iter().any(|h| left.contains(h))
        })
        .await;
    assert!(!group_handle.is_empty());
    running.stop(cluster).await;
}

#[tokio::test]
async fn a_retained_group_snapshot_is_imported_as_a_pre_provisioned_group() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("group-import").await;
    let running = start(&cluster).await;
    let app = format!("{}-db", cluster.namespace);
    claims_with_records(&cluster, &running.storage_class, &app, &["a", "b"]).await;
    let class = group_class(&cluster, "retain", "Retain", false).await;
    let groups = cluster.namespaced::<VolumeGroupSnapshot>();
    cluster
        .create(
            &groups,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
                "metadata": {"name": "kept"},
                "spec": {"volumeGroupSnapshotClassName": class,
                         "source": {"selector": {"matchLabels": {"app": app}}}}}),
        )
        .await;
    let kept = cluster
        .wait_for(&groups, "kept", "the group ready", ready(group_ready))
        .await;
    let contents = cluster.cluster_scoped::<VolumeGroupSnapshotContent>();
    let content_name = format!("groupsnapcontent-{}", kept.uid().unwrap());
    let cut = contents.get(&content_name).await.unwrap().status.unwrap();
    let group_handle = cut.volume_group_snapshot_handle.clone().unwrap();
    let snapshot_handles: Vec<String> = cut
        .members()
        .iter()
        .filter_map(|m| m.snapshot_handle.clone())
        .collect();

    // Retain: the group goes, its content and the driver's snapshots stay.
    cluster
        .delete_and_wait(&groups, "kept", "the retained group gone")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(contents.get_opt(&content_name).await.unwrap().is_some());
    let on_driver = driver_snapshots(&cluster).await;
    assert!(snapshot_handles.iter().all(|h| on_driver.contains(h)));
    cluster
        .delete_and_wait(&contents, &content_name, "the retained content released")
        .await;

    // The same group snapshot imported: bound, ready, with its members, deleted at the end.
    let imported = format!("{}-imported", cluster.namespace);
    cluster.delete_at_cleanup::<VolumeGroupSnapshotContent>(None, &imported);
    cluster
        .create(
            &contents,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1",
                "kind": "VolumeGroupSnapshotContent", "metadata": {"name": imported},
                "spec": {"driver": cluster.driver_name, "deletionPolicy": "Delete",
                    "volumeGroupSnapshotRef": {"name": "imported", "namespace": cluster.namespace},
                    "source": {"groupSnapshotHandles": {"volumeGroupSnapshotHandle": group_handle,
                        "volumeSnapshotHandles": snapshot_handles}}}}),
        )
        .await;
    cluster
        .create(
            &groups,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
                "metadata": {"name": "imported"},
                "spec": {"source": {"volumeGroupSnapshotContentName": imported}}}),
        )
        .await;
    let group = cluster
        .wait_for(
            &groups,
            "imported",
            "the imported group ready",
            ready(group_ready),
        )
        .await;
    let bound_content = contents.get(&imported).await.unwrap();
    assert_eq!(
        bound_content.spec.volume_group_snapshot_ref.uid,
        group.metadata.uid
    );
    cluster
        .eventually_async("the imported group's members ready", || async {
            let members = members(&cluster, &group).await;
            members.len() == 2
                && members
                    .iter()
                    .all(|m| m.status.as_ref().and_then(|s| s.ready_to_use) == Some(true))
        })
        .await;
    cluster
        .delete_and_wait(&groups, "imported", "the imported group gone")
        .await;
    cluster
        .wait_gone(&contents, &imported, "the imported content gone")
        .await;
    cluster
        .eventually_async("the driver's snapshots deleted", || async {
            let left = driver_snapshots(&cluster).await;
            !snapshot_handles.iter().any(|h| left.contains(h))
        })
        .await;
    running.stop(cluster).await;
}

#[tokio::test]
async fn a_group_the_driver_refuses_is_reported() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("group-refused").await;
    let running = start(&cluster).await;
    let app = format!("{}-db", cluster.namespace);
    claims_with_records(&cluster, &running.storage_class, &app, &["a"]).await;
    // A claim of a volume the driver does not have.
    let volume = format!("{}-missing", cluster.namespace);
    cluster.delete_at_cleanup::<PersistentVolume>(None, &volume);
    cluster
        .create(
            &cluster.cluster_scoped::<PersistentVolume>(),
            static_pv(
                &volume,
                &cluster.driver_name,
                "no-such-volume",
                "2Mi",
                Some((&cluster.namespace, "ghost")),
            ),
        )
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let mut ghost = static_pvc("ghost", "2Mi", &volume);
    ghost["metadata"]["labels"] = json!({"app": app});
    cluster.create(&claims, ghost).await;
    cluster
        .wait_for(&claims, "ghost", "the ghost claim Bound", bound)
        .await;
    let class = group_class(&cluster, "refused", "Delete", false).await;
    let groups = cluster.namespaced::<VolumeGroupSnapshot>();
    cluster
        .create(
            &groups,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
                "metadata": {"name": "group"},
                "spec": {"volumeGroupSnapshotClassName": class,
                         "source": {"selector": {"matchLabels": {"app": app}}}}}),
        )
        .await;
    let group = cluster
        .wait_for(&groups, "group", "the driver's refusal on the group", |g| {
            g.status
                .as_ref()
                .and_then(|s| s.error.as_ref())
                .is_some_and(|e| {
                    e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("no-such-volume"))
                })
        })
        .await;
    assert_ne!(group_ready(&group), Some(true));
    let content = format!("groupsnapcontent-{}", group.uid().unwrap());
    let contents: Api<VolumeGroupSnapshotContent> = cluster.cluster_scoped();
    let message = contents
        .get(&content)
        .await
        .unwrap()
        .status
        .and_then(|s| s.error)
        .and_then(|e| e.message)
        .unwrap_or_default();
    assert!(
        message.starts_with(
            "Failed to create group snapshot: failed to take group snapshot of the volumes"
        ),
        "{message}"
    );
    // Nothing was cut, so the group goes at once.
    cluster
        .delete_and_wait(&groups, "group", "the refused group gone")
        .await;
    cluster
        .wait_gone(&contents, &content, "the refused group's content gone")
        .await;
    running.stop(cluster).await;
}

/// `kind`'s API at `version` of the group API, namespaced in the scenario's namespace or not.
fn dynamic_api(cluster: &Cluster, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(csi_kinds::groupsnapshot::GROUP, version, kind),
        plural,
    );
    if kind == "VolumeGroupSnapshot" {
        Api::namespaced_with(cluster.client.clone(), &cluster.namespace, &resource)
    } else {
        Api::all_with(cluster.client.clone(), &resource)
    }
}

/// Every kind written through each served version reads back the same through every other:
/// conversion None between schemas that hold the same fields (both member lists of a content
/// included), so no version prunes what another wrote. The objects name a class that does not
/// exist and no group UID, so no controller of a shared cluster acts on them.
#[tokio::test]
async fn every_group_kind_reads_and_writes_through_every_served_version() {
    let cluster = Cluster::start("group-versions").await;
    install_snapshot_crds(&cluster.client).await;
    let versions = csi_kinds::groupsnapshot::SERVED_VERSIONS;
    for written in versions {
        let class_name = format!("{}-{written}", cluster.namespace);
        let content_name = format!("{}-{written}", cluster.namespace);
        cluster.delete_at_cleanup::<VolumeGroupSnapshotClass>(None, &class_name);
        cluster.delete_at_cleanup::<VolumeGroupSnapshotContent>(None, &content_name);
        let objects = [
            (
                "VolumeGroupSnapshotClass",
                "volumegroupsnapshotclasses",
                json!({"metadata": {"name": class_name}, "driver": cluster.driver_name,
                    "deletionPolicy": "Retain", "parameters": {"written": written}}),
            ),
            (
                "VolumeGroupSnapshot",
                "volumegroupsnapshots",
                json!({"metadata": {"name": format!("g-{written}")},
                    "spec": {"volumeGroupSnapshotClassName": "none",
                        "source": {"selector": {"matchLabels": {"written": written}}}}}),
            ),
            (
                "VolumeGroupSnapshotContent",
                "volumegroupsnapshotcontents",
                json!({"metadata": {"name": content_name},
                    "spec": {"driver": cluster.driver_name, "deletionPolicy": "Delete",
                        "volumeGroupSnapshotRef": {"name": "g", "namespace": cluster.namespace},
                        "source": {"volumeHandles": ["vol-a", written]}}}),
            ),
        ];
        for (kind, plural, body) in objects {
            let api = dynamic_api(&cluster, written, kind, plural);
            let mut object: DynamicObject = serde_json::from_value(body.clone()).unwrap();
            object.types = Some(TypeMeta {
                api_version: format!("{}/{written}", csi_kinds::groupsnapshot::GROUP),
                kind: kind.into(),
            });
            let created = api
                .create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("creating a {kind} through {written}: {e}"));
            let mut expected = body.clone();
            if kind == "VolumeGroupSnapshotContent" {
                let members = json!({"status": {
                    "volumeGroupSnapshotHandle": format!("group-{written}"),
                    "volumeSnapshotInfoList": [{"volumeHandle": "vol-a", "snapshotHandle": "s-a",
                        "creationTime": 7, "readyToUse": true, "restoreSize": 1024}],
                    "volumeSnapshotHandlePairList": [{"volumeHandle": "vol-a", "snapshotHandle": "s-a"}]}});
                api.patch_status(
                    &created.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&members),
                )
                .await
                .unwrap_or_else(|e| panic!("writing a content's status through {written}: {e}"));
                expected["status"] = members["status"].clone();
            }
            for read in versions {
                let got = dynamic_api(&cluster, read, kind, plural)
                    .get(&created.name_any())
                    .await
                    .unwrap_or_else(|e| panic!("reading a {kind} through {read}: {e}"));
                let got = serde_json::to_value(&got).unwrap();
                // What was written; a status a controller of a shared cluster may add is not.
                for field in ["spec", "status", "driver", "deletionPolicy", "parameters"]
                    .into_iter()
                    .filter(|f| !expected[*f].is_null())
                {
                    assert_eq!(
                        got[field], expected[field],
                        "{kind} written through {written}, read through {read}: {field}"
                    );
                }
                assert_eq!(
                    got["apiVersion"],
                    format!("{}/{read}", csi_kinds::groupsnapshot::GROUP)
                );
            }
            api.delete(&created.name_any(), &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("deleting a {kind} through {written}: {e}"));
        }
    }
    cluster.stop().await;
}

/// The 422 refusal `result` must be, with `message` among its causes.
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, message: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains(message), "{}", status.message);
        }
        other => panic!("expected a 422 saying {message:?}, got {other:?}"),
    }
}

/// Upstream's CEL rules hold on servers that enforce them (1.25 on; older servers drop the
/// rules from the CRD, which this scenario reads back to know): exactly one source, no empty
/// class name, an immutable class driver (but through v1beta1, which lacks the rule upstream),
/// and a content's group UID that may be set once but not changed.
#[tokio::test]
async fn the_group_kinds_follow_upstreams_cel_rules() {
    const SCENARIO: &str = "the_group_kinds_follow_upstreams_cel_rules";
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let cluster = Cluster::start("group-cel").await;
    install_snapshot_crds(&cluster.client).await;
    let crd = cluster
        .cluster_scoped::<CustomResourceDefinition>()
        .get("volumegroupsnapshots.groupsnapshot.storage.k8s.io")
        .await
        .unwrap();
    if !serde_json::to_string(&crd.spec.versions)
        .unwrap()
        .contains("x-kubernetes-validations")
    {
        csi_suite_scenarios::report_skip(
            SCENARIO,
            "the server dropped the CRDs' x-kubernetes-validations (CEL rules need Kubernetes 1.25)",
        );
        cluster.stop().await;
        return;
    }
    let groups = cluster.namespaced::<VolumeGroupSnapshot>();
    let group = |name: &str, source: serde_json::Value, class: Option<&str>| {
        let mut spec = json!({"source": source});
        if let Some(class) = class {
            spec["volumeGroupSnapshotClassName"] = json!(class);
        }
        serde_json::from_value::<VolumeGroupSnapshot>(json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap()
    };
    refused(
        groups
            .create(
                &PostParams::default(),
                &group(
                    "both",
                    json!({"selector": {}, "volumeGroupSnapshotContentName": "c"}),
                    Some("none"),
                ),
            )
            .await,
        "exactly one of selector and volumeGroupSnapshotContentName must be set",
    );
    refused(
        groups
            .create(
                &PostParams::default(),
                &group("empty-class", json!({"selector": {}}), Some("")),
            )
            .await,
        "volumeGroupSnapshotClassName must not be the empty string when set",
    );

    let class = format!("{}-cel", cluster.namespace);
    cluster.delete_at_cleanup::<VolumeGroupSnapshotClass>(None, &class);
    let classes = cluster.cluster_scoped::<VolumeGroupSnapshotClass>();
    cluster
        .create(
            &classes,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1",
                "kind": "VolumeGroupSnapshotClass", "metadata": {"name": class},
                "driver": cluster.driver_name, "deletionPolicy": "Delete"}),
        )
        .await;
    let other_driver = json!({"driver": "other.example.com"});
    refused(
        classes
            .patch(
                &class,
                &PatchParams::default(),
                &Patch::Merge(&other_driver),
            )
            .await,
        "driver is immutable once set",
    );
    dynamic_api(
        &cluster,
        "v1beta1",
        "VolumeGroupSnapshotClass",
        "volumegroupsnapshotclasses",
    )
    .patch(
        &class,
        &PatchParams::default(),
        &Patch::Merge(&other_driver),
    )
    .await
    .expect("v1beta1 has no immutable driver upstream");

    let content = format!("{}-cel", cluster.namespace);
    cluster.delete_at_cleanup::<VolumeGroupSnapshotContent>(None, &content);
    let contents = cluster.cluster_scoped::<VolumeGroupSnapshotContent>();
    cluster
        .create(
            &contents,
            json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1",
                "kind": "VolumeGroupSnapshotContent", "metadata": {"name": content},
                "spec": {"driver": "cel.example.com", "deletionPolicy": "Retain",
                    "volumeGroupSnapshotRef": {"name": "g", "namespace": cluster.namespace},
                    "source": {"volumeHandles": ["v"]}}}),
        )
        .await;
    let uid = |uid: &str| {
        json!({"spec": {"volumeGroupSnapshotRef": {"name": "g",
            "namespace": cluster.namespace, "uid": uid}}})
    };
    contents
        .patch(
            &content,
            &PatchParams::default(),
            &Patch::Merge(&uid("first")),
        )
        .await
        .expect("the group's UID may be set once");
    refused(
        contents
            .patch(
                &content,
                &PatchParams::default(),
                &Patch::Merge(&uid("second")),
            )
            .await,
        "volumeGroupSnapshotRef.uid is immutable once set",
    );
    let both = json!({"spec": {"source": {"volumeHandles": ["v"],
        "groupSnapshotHandles": {"volumeGroupSnapshotHandle": "g", "volumeSnapshotHandles": ["s"]}}}});
    refused(
        contents
            .patch(&content, &PatchParams::default(), &Patch::Merge(&both))
            .await,
        "exactly one of volumeHandles and groupSnapshotHandles must be set",
    );
    contents
        .delete(&content, &DeleteParams::default())
        .await
        .unwrap();
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    cluster.stop().await;
}

//! Snapshots through the real pipeline: the snapshot-controller binds VolumeSnapshots to
//! contents and the csi-snapshotter sidecar cuts and deletes them at the driver; the
//! provisioner restores from them. Missing secrets are reported and recovered from; Delete and
//! Retain policies; a pre-provisioned snapshot imported by its handle; a snapshot of a volume
//! whose pod is writing.

use std::time::Duration;

use csi_kinds::snapshot::{
    CONTENT_BOUND_FINALIZER, PVC_AS_SOURCE_FINALIZER, SNAPSHOT_AS_SOURCE_FINALIZER,
    SNAPSHOT_BOUND_FINALIZER, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent,
};
use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::fixtures::{
    bound, claim, install_snapshot_crds, is_running, pod, read_records, secret, volume_of,
    write_records,
};
use csi_suite_scenarios::rbac::{self, Rule};
use csi_suite_scenarios::service_accounts::{claim_patch_refused, skip_without_service_accounts};
use csi_suite_scenarios::{Cluster, Options, Sidecar, skip_without_root};
use http::StatusCode;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

pub(crate) fn ready(snapshot: &VolumeSnapshot) -> bool {
    snapshot
        .status
        .as_ref()
        .and_then(|s| s.ready_to_use)
        .unwrap_or(false)
}

fn has(finalizers: &[String], finalizer: &str) -> bool {
    finalizers.iter().any(|f| f == finalizer)
}

/// The snapshot ids the driver holds.
async fn driver_snapshots(cluster: &Cluster) -> Vec<String> {
    let listed = cluster
        .driver
        .controller
        .csi
        .list_snapshots(
            csi::ListSnapshotsRequest::default(),
            Duration::from_secs(10),
        )
        .await
        .expect("ListSnapshots");
    listed
        .entries
        .into_iter()
        .filter_map(|e| e.snapshot)
        .map(|s| s.snapshot_id)
        .collect()
}

fn handle_of(content: &VolumeSnapshotContent) -> String {
    content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.clone())
        .expect("a cut snapshot has a handle")
}

async fn class(cluster: &Cluster, suffix: &str, policy: &str, default: bool) -> String {
    let name = format!("{}-{suffix}", cluster.namespace);
    let classes = cluster.cluster_scoped::<VolumeSnapshotClass>();
    cluster
        .create(
            &classes,
            json!({"metadata": {"name": name, "annotations": {
                    "snapshot.storage.kubernetes.io/is-default-class": default.to_string()}},
                "driver": cluster.driver_name, "deletionPolicy": policy,
                "parameters": {
                    "csi.storage.k8s.io/snapshotter-secret-name": "snapshotter",
                    "csi.storage.k8s.io/snapshotter-secret-namespace": "${volumesnapshot.namespace}"}}),
        )
        .await;
    cluster.delete_at_cleanup::<VolumeSnapshotClass>(None, &name);
    name
}

/// The snapshot CRDs, a Bound claim `source` of a new Immediate class, the provisioner and
/// the snapshot-controller running (no csi-snapshotter yet), the snapshotter's secret, and a
/// snapshot class named after `suffix` (policy Delete); returns the two sidecars and the
/// class's name.
async fn bound_source(cluster: &Cluster, suffix: &str) -> (Sidecar, Sidecar, String) {
    install_snapshot_crds(&cluster.client).await;
    let storage = cluster
        .storage_class("snap", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("source", &storage)).await;
    let provisioner = cluster.start_provisioner().await;
    let controller = cluster.start_snapshot_controller();
    secret(cluster, "snapshotter", "s3cret").await;
    let snapshot_class = class(cluster, suffix, "Delete", false).await;
    cluster
        .wait_for(&claims, "source", "the source claim Bound", bound)
        .await;
    (provisioner, controller, snapshot_class)
}

/// Cuts a snapshot `name` of `claim` with `class` and waits until it is ready; returns it and
/// the name of its content.
async fn cut_snapshot(
    cluster: &Cluster,
    name: &str,
    claim: &str,
    class: &str,
) -> (VolumeSnapshot, String) {
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": name},
                "spec": {"source": {"persistentVolumeClaimName": claim},
                         "volumeSnapshotClassName": class}}),
        )
        .await;
    let snapshot = cluster
        .wait_for(&snapshots, name, "the snapshot ready", ready)
        .await;
    let content = snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.clone())
        .expect("a ready snapshot names its content");
    (snapshot, content)
}

/// Snapshot of a claim with data → ready → restored elsewhere with the data; the class's
/// secret missing at first is reported in the snapshot's status and recovered from; with
/// policy Delete the snapshot goes from the driver with its VolumeSnapshot, with Retain it
/// stays, and is imported back as a pre-provisioned snapshot.
#[tokio::test]
async fn a_snapshot_is_cut_restored_and_deleted_through_the_pipeline() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("snapshot-pipeline").await;
    install_snapshot_crds(&cluster.client).await;
    let provisioner = cluster.start_provisioner().await;
    let attacher = cluster.start_attacher().await;
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let storage = cluster
        .storage_class("snap", "Immediate", "Delete", json!({}))
        .await;
    // On a shared cluster another default class of this driver would make the default
    // ambiguous: the scenario's driver name is its own.
    let default_class = class(&cluster, "snap-delete", "Delete", true).await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("source", &storage)).await;
    write_records(&cluster, "source").await;
    let before = driver_snapshots(&cluster).await.len();

    // No class named: the default one is chosen. Its secret does not exist yet.
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": "snap"},
                "spec": {"source": {"persistentVolumeClaimName": "source"}}}),
        )
        .await;
    let failed = cluster
        .wait_for(&snapshots, "snap", "the missing secret reported", |s| {
            s.status
                .as_ref()
                .and_then(|s| s.error.as_ref())
                .and_then(|e| e.message.as_deref())
                .is_some_and(|m| m.contains("cannot get credentials"))
        })
        .await;
    assert_eq!(
        failed.spec.volume_snapshot_class_name.as_deref(),
        Some(default_class.as_str())
    );
    assert!(!ready(&failed));
    let source = claims.get("source").await.unwrap();
    assert!(
        has(source.finalizers(), PVC_AS_SOURCE_FINALIZER),
        "the source claim is protected while its snapshot is cut"
    );
    secret(&cluster, "snapshotter", "s3cret").await;
    let snap = cluster
        .wait_for(&snapshots, "snap", "the snapshot ready", ready)
        .await;
    let status = snap.status.clone().unwrap();
    assert!(status.error.is_none(), "ready clears the error");
    assert!(status.creation_time.is_some() && status.restore_size.is_some());
    assert!(has(snap.finalizers(), SNAPSHOT_AS_SOURCE_FINALIZER));
    assert!(has(snap.finalizers(), SNAPSHOT_BOUND_FINALIZER));
    let content_name = status.bound_volume_snapshot_content_name.unwrap();
    assert_eq!(content_name, format!("snapcontent-{}", snap.uid().unwrap()));
    let contents = cluster.cluster_scoped::<VolumeSnapshotContent>();
    let content = contents.get(&content_name).await.unwrap();
    assert!(has(content.finalizers(), CONTENT_BOUND_FINALIZER));
    let handle = handle_of(&content);
    assert!(driver_snapshots(&cluster).await.contains(&handle));
    assert_eq!(driver_snapshots(&cluster).await.len(), before + 1);
    cluster
        .wait_for(&claims, "source", "the source protection released", |c| {
            !has(c.finalizers(), PVC_AS_SOURCE_FINALIZER)
        })
        .await;

    // Restored on another node, with the data.
    let mut restored = claim("restored", &storage);
    restored["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": "snap"});
    cluster.create(&claims, restored).await;
    cluster
        .wait_for(&claims, "restored", "the restored claim Bound", bound)
        .await;
    assert!(
        read_records(&cluster, "restored").await.lines().count() > 0,
        "the restored volume has the snapshot's records"
    );

    // Policy Delete: deleting the VolumeSnapshot deletes its content and the driver's snapshot.
    cluster
        .delete_and_wait(&snapshots, "snap", "the snapshot deleted")
        .await;
    cluster
        .wait_gone(&contents, &content_name, "its content deleted")
        .await;
    assert!(!driver_snapshots(&cluster).await.contains(&handle));

    // Policy Retain: the content and the driver's snapshot stay.
    let retain_class = class(&cluster, "snap-retain", "Retain", false).await;
    let (_, kept_content) = cut_snapshot(&cluster, "kept", "source", &retain_class).await;
    let kept_handle = handle_of(&contents.get(&kept_content).await.unwrap());
    cluster
        .delete_and_wait(&snapshots, "kept", "the retained snapshot deleted")
        .await;
    assert!(
        contents.get(&kept_content).await.is_ok(),
        "Retain keeps the content"
    );
    assert!(driver_snapshots(&cluster).await.contains(&kept_handle));
    cluster
        .delete_and_wait(&contents, &kept_content, "the retained content deleted")
        .await;
    assert!(
        driver_snapshots(&cluster).await.contains(&kept_handle),
        "deleting a Retain content keeps the snapshot on the storage"
    );

    // Imported by its handle as a pre-provisioned snapshot, then deleted with policy Delete.
    let imported = format!("{}-imported", cluster.namespace);
    cluster
        .create(
            &contents,
            json!({"metadata": {"name": imported},
                "spec": {"driver": cluster.driver_name, "deletionPolicy": "Delete",
                         "source": {"snapshotHandle": kept_handle},
                         "volumeSnapshotRef": {"name": "imported", "namespace": cluster.namespace}}}),
        )
        .await;
    cluster.delete_at_cleanup::<VolumeSnapshotContent>(None, &imported);
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": "imported"},
                "spec": {"source": {"volumeSnapshotContentName": imported}}}),
        )
        .await;
    let snapshot = cluster
        .wait_for(&snapshots, "imported", "the imported snapshot ready", ready)
        .await;
    let content = contents.get(&imported).await.unwrap();
    assert_eq!(
        content.spec.volume_snapshot_ref.uid, snapshot.metadata.uid,
        "the content is bound to the snapshot"
    );
    cluster
        .delete_and_wait(&snapshots, "imported", "the imported snapshot deleted")
        .await;
    cluster
        .wait_gone(&contents, &imported, "the imported content deleted")
        .await;
    assert!(!driver_snapshots(&cluster).await.contains(&kept_handle));

    for claim in ["restored", "source"] {
        cluster
            .delete_and_wait(&claims, claim, "the claim deleted")
            .await;
    }
    let classes: Api<VolumeSnapshotClass> = cluster.cluster_scoped();
    for name in [&default_class, &retain_class] {
        classes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    snapshotter.stop().await;
    controller.stop().await;
    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A snapshot of a claim whose pod is writing: cut while mounted, restored on another node
/// with the records written before it; the writer keeps running throughout.
#[tokio::test]
async fn a_volume_in_use_is_snapshotted_while_its_pod_writes() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("snapshot-in-use").await;
    install_snapshot_crds(&cluster.client).await;
    let provisioner = cluster.start_provisioner().await;
    let attacher = cluster.start_attacher().await;
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let storage = cluster
        .storage_class("in-use", "Immediate", "Delete", json!({}))
        .await;
    secret(&cluster, "snapshotter", "s3cret").await;
    let snapshot_class = class(&cluster, "in-use", "Delete", false).await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("busy", &storage)).await;
    let pods = cluster.namespaced::<Pod>();
    let writer: Pod = cluster
        .create(
            &pods,
            pod("writer", &cluster.node("node-a"), Some("busy"), true),
        )
        .await;
    cluster
        .wait_for(&pods, "writer", "the writer Running", is_running)
        .await;
    let volume = volume_of(&cluster, "busy").await;
    let log = kube_sim::roles::kubelet::target_path(
        &cluster.driver.kubelet_dir(&cluster.node("node-a")),
        &writer.uid().unwrap(),
        &volume,
        false,
    )
    .join("writer.log");
    cluster
        .eventually("records written", || {
            std::fs::metadata(&log).is_ok_and(|m| m.len() > 0)
        })
        .await;

    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cut_snapshot(&cluster, "busy-snap", "busy", &snapshot_class).await;
    let still = pods.get("writer").await.unwrap();
    assert!(
        is_running(&still) && still.uid() == writer.uid(),
        "the writer kept running"
    );
    let mut restored = claim("busy-restored", &storage);
    restored["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": "busy-snap"});
    cluster.create(&claims, restored).await;
    cluster
        .wait_for(&claims, "busy-restored", "the restore Bound", bound)
        .await;
    assert!(
        read_records(&cluster, "busy-restored")
            .await
            .lines()
            .count()
            > 0,
        "the restore has the records written before the snapshot"
    );
    cluster
        .delete_and_wait(&snapshots, "busy-snap", "the snapshot deleted")
        .await;
    cluster
        .delete_and_wait(&pods, "writer", "the writer gone")
        .await;
    for name in ["busy-restored", "busy"] {
        cluster
            .delete_and_wait(&claims, name, "the claim deleted")
            .await;
    }
    cluster
        .cluster_scoped::<VolumeSnapshotClass>()
        .delete(&snapshot_class, &DeleteParams::default())
        .await
        .unwrap();
    snapshotter.stop().await;
    controller.stop().await;
    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A drop-in snapshot-controller runs under upstream's RBAC: its `rbac-snapshot-controller.yaml`
/// grants claims `update` but not `patch`, so the source claim's protection finalizer is
/// written by GET and update; the snapshot is cut and the protection released as under our
/// chart. Real clusters only: kube-sim enforces no RBAC.
#[tokio::test]
async fn a_snapshot_is_cut_under_upstream_rbac() {
    const SCENARIO: &str = "a_snapshot_is_cut_under_upstream_rbac";
    if skip_without_service_accounts(SCENARIO) {
        return;
    }
    let cluster = Cluster::start("snapshot-upstream-rbac").await;
    install_snapshot_crds(&cluster.client).await;
    // snapshot-controller v8's ClusterRole snapshot-controller-runner, without the group
    // snapshot rules (no group snapshots here).
    let upstream = Rule::of_role(&json!({"rules": [
        {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"],
            "verbs": ["get", "list", "watch", "update"]},
        {"apiGroups": [""], "resources": ["events"],
            "verbs": ["list", "watch", "create", "update", "patch"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshotclasses"],
            "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshotcontents"],
            "verbs": ["create", "get", "list", "watch", "update", "delete", "patch"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshotcontents/status"],
            "verbs": ["patch"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"],
            "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
        {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots/status"],
            "verbs": ["update", "patch"]},
    ]}));
    let account = "upstream-snapshot-controller";
    let client = cluster
        .service_account_client(rbac::SNAPSHOT_CONTROLLER, account, &upstream)
        .await;
    let storage = cluster
        .storage_class("snap", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("source", &storage)).await;
    if !claim_patch_refused(&client, &cluster.namespace, "source", SCENARIO).await {
        cluster.stop().await;
        return;
    }
    let provisioner = cluster.start_provisioner().await;
    let controller = cluster.start_snapshot_controller_as(client);
    let snapshotter = cluster.start_snapshotter().await;
    secret(&cluster, "snapshotter", "s3cret").await;
    let snapshot_class = class(&cluster, "upstream-rbac", "Delete", false).await;
    cluster
        .wait_for(&claims, "source", "the source claim Bound", bound)
        .await;

    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    let (_, content_name) = cut_snapshot(&cluster, "snap", "source", &snapshot_class).await;
    let contents = cluster.cluster_scoped::<VolumeSnapshotContent>();
    let handle = handle_of(&contents.get(&content_name).await.unwrap());
    assert!(driver_snapshots(&cluster).await.contains(&handle));
    cluster
        .wait_for(&claims, "source", "the source protection released", |c| {
            !has(c.finalizers(), PVC_AS_SOURCE_FINALIZER)
        })
        .await;
    cluster
        .delete_and_wait(&snapshots, "snap", "the snapshot deleted")
        .await;
    cluster
        .wait_gone(&contents, &content_name, "its content deleted")
        .await;
    assert!(!driver_snapshots(&cluster).await.contains(&handle));

    snapshotter.stop().await;
    controller.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A source claim whose protection cannot be released is reported on its snapshot
/// (`ErrorPVCFinalizer`, as upstream), and released once the API server takes the write.
#[tokio::test]
async fn a_failed_release_of_the_source_claim_is_reported_on_its_snapshot() {
    let cluster = Cluster::start_with("snapshot-release-fails", Options::with_api_faults()).await;
    let (provisioner, controller, snapshot_class) = bound_source(&cluster, "release-fails").await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();

    // No csi-snapshotter yet: the snapshot stays unready and its claim protected.
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": "snap"},
                "spec": {"source": {"persistentVolumeClaimName": "source"},
                         "volumeSnapshotClassName": snapshot_class}}),
        )
        .await;
    cluster
        .wait_for(&claims, "source", "the source claim protected", |c| {
            has(c.finalizers(), PVC_AS_SOURCE_FINALIZER)
        })
        .await;
    cluster.faults().fail_next(
        "PATCH",
        "persistentvolumeclaims",
        StatusCode::INTERNAL_SERVER_ERROR,
        3,
        None,
    );
    let snapshotter = cluster.start_snapshotter().await;
    cluster
        .wait_for_event(
            "snap",
            "ErrorPVCFinalizer",
            "Error check and remove PVC Finalizer for VolumeSnapshot",
        )
        .await;
    cluster
        .wait_for(&claims, "source", "the source protection released", |c| {
            !has(c.finalizers(), PVC_AS_SOURCE_FINALIZER)
        })
        .await;
    assert!(ready(&snapshots.get("snap").await.unwrap()));

    snapshotter.stop().await;
    controller.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A snapshot that can never be cut (its class does not exist) does not keep its source claim
/// Terminating once the snapshots that were cut are done (upstream external-snapshotter
/// #1305: upstream keeps the claim for every snapshot not ready).
#[tokio::test]
async fn a_snapshot_that_can_never_be_cut_does_not_hold_its_claim() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("snapshot-never-cut").await;
    let (provisioner, controller, snapshot_class) = bound_source(&cluster, "never-cut").await;
    let snapshotter = cluster.start_snapshotter().await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": "broken"},
                "spec": {"source": {"persistentVolumeClaimName": "source"},
                         "volumeSnapshotClassName": format!("{}-missing", cluster.namespace)}}),
        )
        .await;
    cluster
        .wait_for(&snapshots, "broken", "the broken snapshot failed", |s| {
            s.status.as_ref().is_some_and(|s| s.error.is_some())
        })
        .await;
    // The good one protects the claim while it is cut; the broken one must not keep it after.
    cut_snapshot(&cluster, "good", "source", &snapshot_class).await;
    cluster
        .wait_for(&claims, "source", "the source claim released", |c| {
            !has(c.finalizers(), PVC_AS_SOURCE_FINALIZER)
        })
        .await;

    claims
        .delete("source", &DeleteParams::default())
        .await
        .expect("delete the source claim");
    cluster
        .wait_gone(&claims, "source", "the source claim deleted")
        .await;
    let broken = snapshots.get("broken").await.expect("the broken snapshot");
    assert!(!ready(&broken), "it was never cut");
    assert!(ready(&snapshots.get("good").await.unwrap()));

    for name in ["broken", "good"] {
        snapshots
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete a snapshot");
        cluster
            .wait_gone(&snapshots, name, "the snapshot deleted")
            .await;
    }
    assert_eq!(driver_snapshots(&cluster).await, Vec::<String>::new());

    snapshotter.stop().await;
    controller.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A pre-provisioned snapshot naming a content bound to another snapshot is refused as
/// upstream's snapshot-controller refuses it: `SnapshotContentMisbound` once with the error in
/// the snapshot's status, and `SnapshotFinalizerError` on every try; neither the snapshot
/// nor the content gets a finalizer, and the refused snapshot goes when deleted.
#[tokio::test]
async fn a_content_bound_to_another_snapshot_is_refused_as_upstream() {
    let cluster = Cluster::start("snapshot-misbound").await;
    install_snapshot_crds(&cluster.client).await;
    let content_name = format!("{}-taken", cluster.namespace);
    let contents = cluster.cluster_scoped::<VolumeSnapshotContent>();
    cluster
        .create(
            &contents,
            json!({"metadata": {"name": content_name},
                "spec": {"deletionPolicy": "Retain", "driver": cluster.driver_name,
                         "source": {"snapshotHandle": "handle-of-another"},
                         "volumeSnapshotRef": {"name": "someone-else",
                                               "namespace": cluster.namespace}}}),
        )
        .await;
    cluster.delete_at_cleanup::<VolumeSnapshotContent>(None, &content_name);
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .create(
            &snapshots,
            json!({"metadata": {"name": "misbound"},
                "spec": {"source": {"volumeSnapshotContentName": content_name}}}),
        )
        .await;
    // Started once both exist: its first sync of the snapshot sees the content (a controller
    // whose cache did not have it yet would protect the snapshot first, as upstream's does).
    let controller = cluster.start_snapshot_controller();
    let misbound =
        format!("VolumeSnapshotContent [{content_name}] is bound to a different snapshot");
    let message = cluster
        .wait_for_event(
            "misbound",
            "SnapshotContentMisbound",
            "bound to a different",
        )
        .await;
    assert_eq!(message, misbound);
    let message = cluster
        .wait_for_event("misbound", "SnapshotFinalizerError", "bound to a different")
        .await;
    assert_eq!(
        message,
        format!("Failed to check and update snapshot: {misbound}")
    );
    let snapshot = snapshots.get("misbound").await.unwrap();
    let status = snapshot.status.as_ref().expect("a status");
    assert_eq!(
        status.error.as_ref().and_then(|e| e.message.as_deref()),
        Some(misbound.as_str())
    );
    assert_eq!(status.ready_to_use, Some(false));
    assert!(
        snapshot.finalizers().is_empty(),
        "refused before its finalizers: {:?}",
        snapshot.finalizers()
    );
    let content = contents.get(&content_name).await.unwrap();
    assert_eq!(
        content.spec.volume_snapshot_ref.name.as_deref(),
        Some("someone-else"),
        "the content keeps its binding"
    );
    assert!(
        content.finalizers().is_empty(),
        "{:?}",
        content.finalizers()
    );
    cluster
        .delete_and_wait(&snapshots, "misbound", "the refused snapshot deleted")
        .await;
    controller.stop().await;
    cluster.stop().await;
}

/// The faults not met among those only this scenario's components can meet: its contents'
/// writes (its csi-snapshotter alone cuts and deletes its driver's snapshots). The
/// snapshot-controller serves every namespace, so on a shared cluster another scenario's
/// controller may create or update these snapshots and contents first, outside the faults.
fn sidecar_faults_unspent(faults: &kube_sim::faults::Faults) -> Vec<String> {
    faults
        .unspent()
        .into_iter()
        .filter(|fault| fault.starts_with("PATCH volumesnapshotcontents "))
        .collect()
}

/// The snapshot-controller and csi-snapshotter under a slow and failing API server: every
/// request 50 ms late, new contents throttled (429 with `Retry-After`), content and snapshot
/// writes failing (500, 503), and the watches cut, some resumes refused as expired (410 Gone).
/// Every snapshot is still cut once and ready, and deleting them leaves no snapshot at the
/// driver and no content.
#[tokio::test]
async fn snapshots_survive_a_slow_and_failing_api_server() {
    const SNAPSHOTS: usize = 4;
    let cluster = Cluster::start_with("snapshot-unreliable", Options::with_api_faults()).await;
    let (provisioner, controller, snapshot_class) = bound_source(&cluster, "unreliable").await;
    let snapshotter = cluster.start_snapshotter().await;
    let before = driver_snapshots(&cluster).await.len();

    let faults = cluster.slow_and_failing_api(&[
        (
            "POST",
            "volumesnapshotcontents",
            StatusCode::TOO_MANY_REQUESTS,
            Some(1),
        ),
        (
            "PATCH",
            "volumesnapshotcontents",
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
        ),
        (
            "PATCH",
            "volumesnapshots",
            StatusCode::SERVICE_UNAVAILABLE,
            None,
        ),
    ]);
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    for i in 0..SNAPSHOTS {
        cluster
            .create(
                &snapshots,
                json!({"metadata": {"name": format!("s{i}")},
                    "spec": {"source": {"persistentVolumeClaimName": "source"},
                             "volumeSnapshotClassName": snapshot_class}}),
            )
            .await;
        if i == SNAPSHOTS / 2 {
            faults.expire_watch_resumes(3);
            faults.cut_watches();
        }
    }
    let mut contents = Vec::new();
    for i in 0..SNAPSHOTS {
        let snapshot = cluster
            .wait_for(&snapshots, &format!("s{i}"), "the snapshot ready", ready)
            .await;
        contents.extend(
            snapshot
                .status
                .and_then(|s| s.bound_volume_snapshot_content_name),
        );
    }
    assert_eq!(
        sidecar_faults_unspent(&faults),
        [] as [String; 0],
        "every fault met"
    );
    assert_eq!(
        driver_snapshots(&cluster).await.len(),
        before + SNAPSHOTS,
        "one snapshot cut per VolumeSnapshot"
    );
    contents.sort();
    contents.dedup();
    assert_eq!(contents.len(), SNAPSHOTS, "a content of its own for each");

    faults.fail_next(
        "PATCH",
        "volumesnapshotcontents",
        StatusCode::INTERNAL_SERVER_ERROR,
        3,
        None,
    );
    faults.fail_next(
        "PATCH",
        "volumesnapshots",
        StatusCode::SERVICE_UNAVAILABLE,
        3,
        None,
    );
    faults.expire_watch_resumes(3);
    faults.cut_watches();
    for i in 0..SNAPSHOTS {
        snapshots
            .delete(&format!("s{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let all_contents = cluster.cluster_scoped::<VolumeSnapshotContent>();
    for content in &contents {
        cluster
            .wait_gone(&all_contents, content, "the content deleted")
            .await;
    }
    cluster
        .eventually_async("the snapshots gone from the driver", || async {
            driver_snapshots(&cluster).await.len() == before
        })
        .await;
    assert_eq!(
        sidecar_faults_unspent(&faults),
        [] as [String; 0],
        "every fault met"
    );
    faults.set_latency(Duration::ZERO);
    snapshotter.stop().await;
    controller.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

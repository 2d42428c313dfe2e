//! Volumes with content: clones of claims and restores of VolumeSnapshots carry the source's
//! data, and the source is protected by a finalizer while the driver copies from it.

use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use csi_provisioner::claims::CLONING_PROTECTION;
use csi_provisioner::snapshots::SOURCE_PROTECTION;
use csi_suite_scenarios::fixtures::{
    bound, claim, cut_snapshot, handle_of, install_snapshot_crds, read_records, write_records,
};
use csi_suite_scenarios::{Cluster, skip_without_root};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;

/// A clone has its source's data; the source claim, deleted while the clone is made, stays
/// until the clone is provisioned (cloning-protection) and then goes with its volume.
#[tokio::test]
async fn a_clone_has_its_source_data_and_protects_the_source() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("provision-clone").await;
    let provisioner = cluster.start_provisioner().await;
    let attacher = cluster.start_attacher().await;
    let class_name = cluster
        .storage_class("clone", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("source", &class_name)).await;
    let source_volume = write_records(&cluster, "source").await;
    let source_handle = handle_of(&cluster, &source_volume).await;

    let mut copy = claim("copy", &class_name);
    copy["spec"]["dataSource"] = json!({"kind": "PersistentVolumeClaim", "name": "source"});
    cluster.create(&claims, copy).await;
    cluster
        .wait_for(&claims, "source", "the cloning-protection finalizer", |c| {
            c.finalizers().iter().any(|f| f == CLONING_PROTECTION)
        })
        .await;
    claims
        .delete("source", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_for(&claims, "copy", "the clone Bound", bound)
        .await;
    assert!(
        read_records(&cluster, "copy").await.lines().count() > 0,
        "the clone has the source's records"
    );
    cluster
        .wait_gone(&claims, "source", "the source claim released")
        .await;
    let volumes = cluster.cluster_scoped::<PersistentVolume>();
    cluster
        .wait_gone(&volumes, &source_volume, "the source PV deleted")
        .await;
    assert!(
        !cluster.driver_volumes().await.contains(&source_handle),
        "the source volume was deleted at the driver"
    );
    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// A claim restored from a VolumeSnapshot has the snapshot's data. A restore asked for before
/// the snapshot exists is reported and succeeds once it is ready; the snapshot carries the
/// source-protection finalizer only while restores are pending, and the sweeper removes it
/// once a pending restore is withdrawn.
#[tokio::test]
async fn a_restore_has_the_snapshot_data() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("provision-restore").await;
    install_snapshot_crds(&cluster.client).await;
    let provisioner = cluster.start_provisioner().await;
    let attacher = cluster.start_attacher().await;
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let class_name = cluster
        .storage_class("restore", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("source", &class_name)).await;
    write_records(&cluster, "source").await;

    let mut restored = claim("restored", &class_name);
    restored["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": "snap"});
    cluster.create(&claims, restored).await;
    let message = cluster
        .wait_for_event(
            "restored",
            "ProvisioningFailed",
            "snapshot snap from api server",
        )
        .await;
    assert_eq!(
        message,
        "error getting handle for DataSource Type VolumeSnapshot by Name snap: error getting \
         snapshot snap from api server: volumesnapshots.snapshot.storage.k8s.io \"snap\" not found",
        "upstream's words, the API server's NotFound quoted"
    );

    let content = cut_snapshot(&cluster, &cluster.namespace, "snap", "source").await;
    cluster
        .wait_for(&claims, "restored", "the restored claim Bound", bound)
        .await;
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    cluster
        .wait_for(&snapshots, "snap", "the source protection released", |s| {
            !s.finalizers().iter().any(|f| f == SOURCE_PROTECTION)
        })
        .await;

    // A restore the driver refuses (larger than its maximum volume size) stays Pending and
    // keeps the snapshot from going away until the claim is withdrawn.
    let mut stuck = claim("stuck", &class_name);
    stuck["spec"]["resources"]["requests"]["storage"] = json!("2Ti");
    stuck["spec"]["dataSource"] = json!({"kind": "VolumeSnapshot",
        "apiGroup": "snapshot.storage.k8s.io", "name": "snap"});
    cluster.create(&claims, stuck).await;
    cluster
        .wait_for_event(
            "stuck",
            "ProvisioningFailed",
            "rpc error: code = OutOfRange desc = ",
        )
        .await;
    let protected = |s: &VolumeSnapshot| s.finalizers().iter().any(|f| f == SOURCE_PROTECTION);
    assert!(protected(&snapshots.get("snap").await.unwrap()));
    snapshots
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    let held = snapshots.get("snap").await.expect("the snapshot is held");
    assert!(held.metadata.deletion_timestamp.is_some() && protected(&held));
    claims
        .delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(
            &snapshots,
            "snap",
            "the orphaned snapshot swept and deleted",
        )
        .await;
    // The source's data was cut into the snapshot; the source itself is gone by now.
    cluster
        .delete_and_wait(&claims, "source", "the source claim deleted")
        .await;
    assert!(
        read_records(&cluster, "restored").await.lines().count() > 0,
        "the restored volume has the snapshot's records"
    );

    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeSnapshotContent>(),
            &content,
            "the snapshot's content deleted with it (policy Delete)",
        )
        .await;
    snapshotter.stop().await;
    controller.stop().await;
    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

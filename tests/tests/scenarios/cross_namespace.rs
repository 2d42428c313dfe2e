//! Cross-namespace data sources (csi-provisioner's CrossNamespaceVolumeDataSource gate): a
//! claim clones a claim, or restores a VolumeSnapshot, of another namespace only once a
//! ReferenceGrant in that namespace allows it.

use csi_kinds::snapshot::VolumeSnapshotContent;
use csi_provisioner::grants::ReferenceGrant;
use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::{
    bound, bound_volume, claim, cut_snapshot, driver_state, install_reference_grant_crd,
    install_snapshot_crds,
};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;

#[tokio::test]
async fn clones_and_restores_from_another_namespace_need_a_reference_grant() {
    let cluster = Cluster::start("provision-cross-ns").await;
    if !cluster.keeps_cross_namespace_data_sources().await {
        cluster.stop().await;
        return;
    }
    install_snapshot_crds(&cluster.client).await;
    install_reference_grant_crd(&cluster.client).await;
    let provisioner = cluster
        .start_provisioner_with(|settings| settings.cross_namespace_data_sources = true)
        .await;
    let controller = cluster.start_snapshot_controller();
    let snapshotter = cluster.start_snapshotter().await;
    let class_name = cluster
        .storage_class("cross", "Immediate", "Delete", json!({}))
        .await;

    // The sources: a claim and a snapshot of it in a namespace of their own.
    let data = format!("{}-data", cluster.namespace);
    cluster.delete_at_cleanup::<Namespace>(None, &data);
    cluster
        .create(
            &cluster.cluster_scoped::<Namespace>(),
            json!({"metadata": {"name": data}}),
        )
        .await;
    let data_claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), &data);
    cluster
        .create(&data_claims, claim("source", &class_name))
        .await;
    bound_volume(&cluster, &data_claims, "source", "the source claim Bound").await;
    let content = cut_snapshot(&cluster, &data, "snap", "source").await;
    cluster.delete_at_cleanup::<VolumeSnapshotContent>(None, &content);

    // Without a grant, both are refused with upstream's message.
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let mut clone = claim("clone", &class_name);
    clone["spec"]["dataSourceRef"] =
        json!({"kind": "PersistentVolumeClaim", "name": "source", "namespace": data});
    cluster.create(&claims, clone).await;
    let mut restore = claim("restore", &class_name);
    restore["spec"]["dataSourceRef"] = json!({"apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot", "name": "snap", "namespace": data});
    cluster.create(&claims, restore).await;
    let namespace = &cluster.namespace;
    for (name, source, kind) in [
        ("clone", "source", "PersistentVolumeClaim"),
        ("restore", "snap", "VolumeSnapshot"),
    ] {
        let refused = format!(
            "accessing {data}/{source} of {kind} dataSource from {namespace}/{name} isn't allowed"
        );
        cluster
            .wait_for_event(name, "ProvisioningFailed", &refused)
            .await;
        assert!(!bound(&claims.get(name).await.unwrap()), "{name} refused");
    }

    // A grant in the source namespace: claims of this namespace may use the source claim (by
    // name) and every snapshot.
    let resource = ApiResource::erase::<ReferenceGrant>(&());
    let grants: Api<DynamicObject> = Api::namespaced_with(cluster.client.clone(), &data, &resource);
    let mut grant = DynamicObject::new("from-apps", &resource);
    grant.data = json!({"spec": {
        "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": namespace}],
        "to": [{"group": "", "kind": "PersistentVolumeClaim", "name": "source"},
               {"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}]}});
    grants
        .create(&PostParams::default(), &grant)
        .await
        .expect("creating the ReferenceGrant");
    for name in ["clone", "restore"] {
        let granted = bound_volume(&cluster, &claims, name, "the granted claim Bound").await;
        let handle = granted.csi.unwrap().volume_handle;
        assert!(
            driver_state(&cluster).volumes[&handle].source.is_some(),
            "{name} was created from its source"
        );
    }

    // The source claim goes once nothing clones from it (its cloning protection released).
    cluster
        .delete_and_wait(&data_claims, "source", "the source claim deleted")
        .await;
    // The snapshot goes with its content while the snapshot controllers still run.
    let snapshots: Api<csi_kinds::snapshot::VolumeSnapshot> =
        Api::namespaced(cluster.client.clone(), &data);
    cluster
        .delete_and_wait(&snapshots, "snap", "the snapshot deleted")
        .await;
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeSnapshotContent>(),
            &content,
            "its content deleted",
        )
        .await;
    snapshotter.stop().await;
    controller.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

//! Static provisioning: an administrator's pre-created volume, a PV for it, a claim that binds
//! to it, a pod that mounts it on the node it is scheduled to. Runs unchanged against a real
//! apiserver + kube-controller-manager + kube-scheduler (`KUBECONFIG`), where only the kubelets
//! are simulated.

use csi_suite_scenarios::fixtures::{file_size, running_pod_with_static_volume};
use csi_suite_scenarios::{Cluster, Options, skip_without_root};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{DeleteParams, ListParams};
use kube_sim::roles::kubelet::attachment_name;
use serde_json::json;

fn phase(volume: &PersistentVolume) -> Option<&str> {
    volume.status.as_ref()?.phase.as_deref()
}

/// Deletes the pod and checks its kubelet unmounted everything before removing it.
async fn delete_pod_and_check_unmounted(cluster: &Cluster, node: &str, target: &std::path::Path) {
    cluster
        .namespaced::<Pod>()
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(
            &cluster.namespaced::<Pod>(),
            "app",
            "the pod removed by its kubelet",
        )
        .await;
    assert!(!target.exists(), "unpublished and cleaned up");
    let left = csi_grpc::mounts::mount_points_under(&cluster.driver.kubelet_dir(node)).unwrap();
    assert!(left.is_empty(), "unstaged: {left:?}");
}

#[tokio::test]
async fn static_pv_pod_runs_with_the_volume_mounted_on_its_node() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start("static-pv").await;
    let driver = cluster.driver_name.clone();
    let attacher = cluster.start_attacher().await;
    let (running, pv_name, target) =
        running_pod_with_static_volume(&cluster, "app", &cluster.node("node-b"), |_| {}).await;
    assert_eq!(
        running.spec.unwrap().node_name.as_deref(),
        Some(cluster.node("node-b").as_str()),
        "scheduled to the node it selects"
    );

    let claim = cluster
        .namespaced::<PersistentVolumeClaim>()
        .get("app")
        .await
        .unwrap();
    assert_eq!(
        claim.spec.unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    assert_eq!(claim.status.unwrap().phase.as_deref(), Some("Bound"));
    let pv = cluster
        .cluster_scoped::<PersistentVolume>()
        .get(&pv_name)
        .await
        .unwrap();
    assert_eq!(phase(&pv), Some("Bound"));
    let handle = pv
        .spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone();
    assert_eq!(
        pv.spec.unwrap().claim_ref.unwrap().name.as_deref(),
        Some("app")
    );

    let va_name = attachment_name(&handle, &driver, &cluster.node("node-b"));
    let va = cluster
        .cluster_scoped::<VolumeAttachment>()
        .get(&va_name)
        .await
        .expect("the attach/detach controller's VolumeAttachment");
    assert_eq!(
        (va.spec.attacher.as_str(), va.spec.node_name.as_str()),
        (driver.as_str(), cluster.node("node-b").as_str())
    );
    assert_eq!(
        va.spec.source.persistent_volume_name.as_deref(),
        Some(pv_name.as_str())
    );

    assert!(
        csi_grpc::mounts::is_mount_point(&target).unwrap(),
        "mounted at kubelet's path on node-b"
    );
    let log = target.join("app.log");
    cluster
        .eventually("the pod writing to its volume", || file_size(&log) > 0)
        .await;
    for other in [&cluster.node("node-a"), &cluster.node("node-c")] {
        let mounts =
            csi_grpc::mounts::mount_points_under(&cluster.driver.kubelet_dir(other)).unwrap();
        assert!(mounts.is_empty(), "nothing mounted on {other}: {mounts:?}");
    }

    delete_pod_and_check_unmounted(&cluster, &cluster.node("node-b"), &target).await;
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            &va_name,
            "the VolumeAttachment deleted after unmount",
        )
        .await;
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_gone(
            &cluster.namespaced::<PersistentVolumeClaim>(),
            "app",
            "the claim deleted",
        )
        .await;
    cluster
        .wait_for(
            &cluster.cluster_scoped::<PersistentVolume>(),
            &pv_name,
            "the Retain PV Released",
            |pv| phase(pv) == Some("Released"),
        )
        .await;
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn static_pv_with_a_driver_that_needs_no_attach_gets_no_volume_attachment() {
    if skip_without_root() {
        return;
    }
    let options = Options {
        driver_name: "noattach.csi-suite.io".to_string(),
        attach_required: false,
        nodes: vec!["node-a".to_string(), "node-b".to_string()],
        ..Options::default()
    };
    let cluster = Cluster::start_with("static-noattach", options).await;
    let driver = cluster.driver_name.clone();
    cluster
        .create(
            &cluster.cluster_scoped::<CSIDriver>(),
            json!({"metadata": {"name": driver}, "spec": {"attachRequired": false, "podInfoOnMount": true}}),
        )
        .await;
    let (_, pv_name, target) =
        running_pod_with_static_volume(&cluster, "app", &cluster.node("node-a"), |_| {}).await;
    cluster
        .eventually("the pod writing", || file_size(&target.join("app.log")) > 0)
        .await;
    let attachments = cluster
        .cluster_scoped::<VolumeAttachment>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        attachments
            .items
            .iter()
            .all(|va| va.spec.source.persistent_volume_name.as_deref() != Some(pv_name.as_str())),
        "no VolumeAttachment for a driver with attachRequired=false"
    );
    delete_pod_and_check_unmounted(&cluster, &cluster.node("node-a"), &target).await;
    cluster.stop().await;
}

//! CSI migration: the provisioner, the attacher and the resizer of a driver named after the CSI driver an
//! in-tree plugin migrated to (`ebs.csi.aws.com` ← `kubernetes.io/aws-ebs`, as on EKS, whose
//! default `gp2` class still names the in-tree plugin) serve that plugin's claims and PVs,
//! translated as upstream's sidecars translate them with csi-translation-lib. The reference
//! driver runs under that name in its own directory; the scenario's cluster driver is not used.
//!
//! The PV controller hands such claims to the CSI driver only where its CSIMigrationAWS gate is
//! on (default from Kubernetes 1.23, locked from 1.25): a real cluster older than that provisions
//! them in-tree, so the provisioning part is skipped there by name.

use csi_hostpath::local::LocalCluster;
use csi_kinds::annotations::{PROVISIONED_BY, STORAGE_PROVISIONER};
use csi_kinds::migration::MIGRATED_TO;
use csi_suite_scenarios::csi_proxy::CsiProxy;
use csi_suite_scenarios::fixtures::{bound, claim, provision_static_volume};
use csi_suite_scenarios::{Cluster, rbac, real_cluster, report_skip};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

const EBS: &str = "ebs.csi.aws.com";
const IN_TREE: &str = "kubernetes.io/aws-ebs";
/// The node instance of the EBS-named driver (its NodeGetInfo node ID).
const EBS_NODE: &str = "ebs-node";

/// The reference driver named `ebs.csi.aws.com` (controller and one node instance) under the
/// scenario's scratch directory, and a recording proxy in front of its controller.
async fn ebs_driver(cluster: &Cluster) -> (LocalCluster, CsiProxy, csi_grpc::conn::CsiConnection) {
    let root = cluster.root().join("ebs");
    let driver = LocalCluster::start(&root, &[EBS_NODE], |config| {
        config.driver_name = EBS.to_string();
    })
    .await
    .expect("the reference driver as ebs.csi.aws.com");
    let socket = root.join("sockets").join("proxy.sock");
    let proxy = CsiProxy::start(&socket, driver.controller.endpoint.path());
    let endpoint = csi_grpc::conn::Endpoint::from_path(socket).expect("the proxy endpoint");
    let csi = csi_grpc::conn::connect(
        &endpoint,
        std::time::Duration::from_secs(10),
        csi_grpc::metrics::CsiOperationMetrics::unregistered(),
    )
    .await
    .expect("a connection through the proxy");
    (driver, proxy, csi)
}

/// The requests of `method` the proxy forwarded.
fn requests<M: prost::Message + Default>(proxy: &CsiProxy, method: &str) -> Vec<M> {
    let suffix = format!("/{method}");
    proxy
        .calls()
        .into_iter()
        .filter(|call| call.path.ends_with(&suffix))
        .map(|call| M::decode(call.message).expect("a request"))
        .collect()
}

/// The IDs of the volumes the driver has.
async fn volume_ids(driver: &LocalCluster) -> Vec<String> {
    driver
        .controller
        .csi
        .list_volumes(
            csi_proto::csi::v1::ListVolumesRequest::default(),
            std::time::Duration::from_secs(10),
        )
        .await
        .expect("ListVolumes")
        .entries
        .into_iter()
        .filter_map(|entry| entry.volume.map(|v| v.volume_id))
        .collect()
}

/// csi-resizer with upstream's defaults and gates (fast retries), talking to the driver through
/// `csi` (`Cluster::start_resizer` talks to the scenario's driver); stopped by cancelling the
/// token and awaiting the task.
async fn start_resizer(
    cluster: &Cluster,
    csi: csi_grpc::conn::CsiConnection,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let timeout = std::time::Duration::from_secs(10);
    let driver =
        csi_grpc::conn::DriverInfo::discover(&csi, timeout, csi_grpc::conn::Services::CONTROLLER)
            .await
            .expect("driver discovery");
    let settings = csi_resizer::controller::Settings {
        resizer: Some(csi_resizer::resize::Resizer::of(&driver).expect("the driver expands")),
        driver_name: driver.name,
        timeout,
        retry_start: std::time::Duration::from_millis(200),
        retry_max: std::time::Duration::from_secs(5),
        workers: 10,
        resync: std::time::Duration::from_secs(600),
        handle_volume_in_use_error: true,
        recover: true,
        annotate_fs_resize: true,
        cache_sync: csi_sidecar::informers::CacheSyncHealth::new(
            csi_sidecar::informers::SYNC_GRACE_PERIOD,
        ),
        modify: None,
        workqueues: Default::default(),
    };
    let client = cluster.component_client(rbac::RESIZER);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        if let Err(error) = csi_resizer::controller::run(client, csi, settings, token).await {
            tracing::error!(%error, "csi-resizer stopped");
        }
    });
    (shutdown, task)
}

/// Whether the server's PV controller hands `kubernetes.io/aws-ebs` claims to the CSI driver
/// (kube-sim's leaves the claim to whichever provisioner knows the class, as that does).
async fn hands_ebs_claims_to_csi(cluster: &Cluster) -> bool {
    if !real_cluster() {
        return true;
    }
    let version = cluster
        .client
        .apiserver_version()
        .await
        .expect("the server's version");
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .expect("a numeric minor version");
    version.major == "1" && minor >= 23
}

/// The scenario's cluster; `None` after a named skip on a real server older than 1.23, whose
/// controller (`what` it does) serves `kubernetes.io/aws-ebs` in-tree.
async fn migrated_cluster(name: &str, scenario: &str, what: &str) -> Option<Cluster> {
    let cluster = Cluster::start(name).await;
    if hands_ebs_claims_to_csi(&cluster).await {
        return Some(cluster);
    }
    report_skip(
        scenario,
        &format!(
            "the server's {what} kubernetes.io/aws-ebs in-tree (CSIMigrationAWS is off before Kubernetes 1.23)"
        ),
    );
    cluster.stop().await;
    None
}

/// An EBS claim of a `gp2`-like class is provisioned through `ebs.csi.aws.com` with the class's
/// parameters translated (`fsType` → the volume capability's fsType, `type` as it is), its PV
/// written as an in-tree `awsElasticBlockStore` PV provisioned by `kubernetes.io/aws-ebs`, and
/// deleted through the driver once released.
#[tokio::test(flavor = "multi_thread")]
async fn aws_ebs_claims_are_provisioned_as_in_tree_volumes() {
    let Some(cluster) = migrated_cluster(
        "migration-provision",
        "aws_ebs_claims_are_provisioned_as_in_tree_volumes",
        "PV controller provisions",
    )
    .await
    else {
        return;
    };
    let (driver, proxy, csi) = ebs_driver(&cluster).await;
    // Without the Topology gate (upstream's default): the reference driver's node topology is
    // no EBS zone, from which no in-tree PV could be written.
    let provisioner = cluster
        .start_provisioner_via(csi, |settings| settings.topology = false)
        .await;
    let class = format!("{}-gp2", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<StorageClass>(),
            json!({"metadata": {"name": class}, "provisioner": IN_TREE, "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate", "parameters": {"type": "gp2", "fsType": "ext4"}}),
        )
        .await;
    // As a PV controller with CSI migration on annotates it (kube-sim's names the class's
    // provisioner and leaves migrated-to as it is).
    let mut data = claim("data", &class);
    data["metadata"]["annotations"] = json!({MIGRATED_TO: EBS});
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, data).await;
    let claimed = cluster
        .wait_for(&claims, "data", "the EBS claim bound", bound)
        .await;
    let handed = claimed.annotations().get(STORAGE_PROVISIONER).cloned();
    assert!(
        handed.as_deref() == Some(EBS) || handed.as_deref() == Some(IN_TREE),
        "storage-provisioner {handed:?}"
    );

    let requests = proxy.create_volume_requests();
    assert_eq!(requests.len(), 1, "one CreateVolume");
    let request = &requests[0];
    assert_eq!(
        request.parameters,
        [("type".to_string(), "gp2".to_string())].into(),
        "the class's parameters, fsType taken out"
    );
    let capability = request.volume_capabilities[0].clone();
    let Some(csi_proto::csi::v1::volume_capability::AccessType::Mount(mount)) =
        capability.access_type
    else {
        panic!("a mount capability: {capability:?}");
    };
    assert_eq!(mount.fs_type, "ext4");

    let pv_name = claimed.spec.and_then(|s| s.volume_name).expect("bound");
    let pvs = cluster.cluster_scoped::<PersistentVolume>();
    let pv = pvs.get(&pv_name).await.expect("the claim's PV");
    assert_eq!(
        pv.annotations().get(PROVISIONED_BY).map(String::as_str),
        Some(IN_TREE)
    );
    let spec = pv.spec.clone().expect("a spec");
    assert!(spec.csi.is_none(), "written as an in-tree PV: {spec:?}");
    let ebs = spec
        .aws_elastic_block_store
        .expect("an awsElasticBlockStore source");
    assert_eq!(
        volume_ids(&driver).await,
        vec![ebs.volume_id.clone()],
        "the PV names the created volume"
    );
    assert_eq!(ebs.fs_type.as_deref(), Some("ext4"));
    assert_eq!(spec.storage_class_name.as_deref(), Some(class.as_str()));
    assert!(
        pv.finalizers()
            .contains(&csi_provisioner::deletion::PV_FINALIZER.to_string()),
        "the provisioner's finalizer: {:?}",
        pv.finalizers()
    );

    cluster
        .delete_and_wait(&claims, "data", "the EBS claim deleted")
        .await;
    cluster
        .wait_gone(&pvs, &pv_name, "the released in-tree PV deleted")
        .await;
    assert_eq!(
        proxy.delete_volume_requests()[0].volume_id,
        ebs.volume_id,
        "DeleteVolume of the in-tree PV's volume"
    );
    assert!(volume_ids(&driver).await.is_empty(), "the volume deleted");
    provisioner.stop().await;
    cluster
        .cluster_scoped::<StorageClass>()
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the class");
    cluster.stop().await;
}

/// An in-tree `awsElasticBlockStore` PV a VolumeAttachment of `ebs.csi.aws.com` names (as the
/// attach/detach controller writes it under CSI migration) is attached through the driver as
/// its CSI volume: its volume ID (an `aws://<zone>/vol-…` one would lose its prefix; the
/// reference driver's IDs are no `vol-…`), the `partition` attribute; detached when the
/// attachment goes.
#[tokio::test(flavor = "multi_thread")]
async fn in_tree_ebs_volumes_are_attached_as_csi_volumes() {
    let cluster = Cluster::start("migration-attach").await;
    let (driver, proxy, csi) = ebs_driver(&cluster).await;
    let attacher = cluster.start_attacher_via(csi, |_| {}).await;
    let name = format!("{}-ebs", cluster.namespace);
    let handle = provision_static_volume(&driver.controller.csi, &name, 1 << 20).await;
    let pvs = cluster.cluster_scoped::<PersistentVolume>();
    cluster
        .create(
            &pvs,
            json!({"metadata": {"name": name}, "spec": {
                "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                "awsElasticBlockStore": {"volumeID": handle, "fsType": "xfs"}}}),
        )
        .await;
    // The node the driver's node instance registered on.
    let node = format!("{}-ebs-node", cluster.namespace);
    let csi_nodes = cluster.cluster_scoped::<CSINode>();
    cluster
        .create(
            &csi_nodes,
            json!({"metadata": {"name": node}, "spec": {"drivers": [
                {"name": EBS, "nodeID": EBS_NODE, "topologyKeys": null}]}}),
        )
        .await;
    let attachments = cluster.cluster_scoped::<VolumeAttachment>();
    cluster
        .create(
            &attachments,
            json!({"metadata": {"name": name}, "spec": {"attacher": EBS, "nodeName": node,
                "source": {"persistentVolumeName": name}}}),
        )
        .await;
    cluster
        .wait_for(&attachments, &name, "the in-tree PV attached", |va| {
            va.status.as_ref().is_some_and(|s| s.attached)
        })
        .await;
    let published: Vec<csi_proto::csi::v1::ControllerPublishVolumeRequest> =
        requests(&proxy, "ControllerPublishVolume");
    assert_eq!(published.len(), 1, "one ControllerPublishVolume");
    assert_eq!(published[0].volume_id, handle, "the in-tree volume ID");
    assert_eq!(published[0].node_id, EBS_NODE);
    assert_eq!(
        published[0].volume_context,
        [("partition".to_string(), "0".to_string())].into()
    );
    let pv = pvs.get(&name).await.expect("the PV");
    assert!(
        pv.finalizers()
            .contains(&csi_attacher::attach::finalizer(EBS)),
        "the attacher's PV finalizer: {:?}",
        pv.finalizers()
    );

    cluster
        .delete_and_wait(&attachments, &name, "the in-tree PV detached")
        .await;
    assert!(
        proxy
            .calls()
            .iter()
            .any(|call| call.path.ends_with("/ControllerUnpublishVolume")),
        "ControllerUnpublishVolume"
    );
    cluster
        .delete_and_wait(&pvs, &name, "the released PV deleted")
        .await;
    attacher.stop().await;
    cluster
        .delete_and_wait(&csi_nodes, &node, "the CSINode deleted")
        .await;
    cluster.stop().await;
}

/// An in-tree `awsElasticBlockStore` PV bound to a claim of an expandable `kubernetes.io/aws-ebs`
/// class: once the claim grows and the expand controller hands it to `ebs.csi.aws.com` (the
/// claim's `volume.kubernetes.io/storage-resizer`), the resizer expands the volume through the
/// driver by its translated volume ID (as in the attach scenario, the reference driver's IDs
/// are no `vol-…`, so the ID stays as it is); the PV's capacity grows and it stays an in-tree PV.
/// Before Kubernetes 1.23 the expand controller expands such a claim in-tree: skipped there.
#[tokio::test(flavor = "multi_thread")]
async fn in_tree_ebs_volumes_are_expanded_as_csi_volumes() {
    let Some(cluster) = migrated_cluster(
        "migration-resize",
        "in_tree_ebs_volumes_are_expanded_as_csi_volumes",
        "expand controller expands",
    )
    .await
    else {
        return;
    };
    let (driver, proxy, csi) = ebs_driver(&cluster).await;
    let (resizer, resizer_task) = start_resizer(&cluster, csi).await;
    let class = format!("{}-gp2", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<StorageClass>(),
            json!({"metadata": {"name": class}, "provisioner": IN_TREE, "reclaimPolicy": "Retain",
                "volumeBindingMode": "Immediate", "allowVolumeExpansion": true,
                "parameters": {"type": "gp2"}}),
        )
        .await;
    let name = format!("{}-ebs", cluster.namespace);
    let handle = provision_static_volume(&driver.controller.csi, &name, 1 << 20).await;
    let pvs = cluster.cluster_scoped::<PersistentVolume>();
    cluster
        .create(
            &pvs,
            json!({"metadata": {"name": name}, "spec": {
                "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": class,
                "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                    "namespace": cluster.namespace, "name": "data"},
                "awsElasticBlockStore": {"volumeID": handle, "fsType": "ext4"}}}),
        )
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster
        .create(
            &claims,
            json!({"metadata": {"name": "data"}, "spec": {"storageClassName": class,
                "volumeName": name, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Mi"}}}}),
        )
        .await;
    cluster
        .wait_for(&claims, "data", "the claim bound to the in-tree PV", bound)
        .await;

    let mut grow = json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}});
    if !real_cluster() {
        // As the kube-controller-manager's expand controller annotates a growing claim of a
        // migrated plugin (kube-sim has none).
        grow["metadata"] =
            json!({"annotations": {csi_resizer::resize::STORAGE_RESIZER_ANNOTATION: EBS}});
    }
    claims
        .patch("data", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .expect("growing the claim");
    let expanded = cluster
        .wait_for(&pvs, &name, "the in-tree PV expanded", |pv| {
            csi_resizer::resize::volume_capacity(pv) >= 2 << 20
        })
        .await;
    let spec = expanded.spec.expect("a spec");
    assert!(spec.csi.is_none(), "still an in-tree PV: {spec:?}");
    assert_eq!(
        spec.aws_elastic_block_store.map(|ebs| ebs.volume_id),
        Some(handle.clone()),
        "the awsElasticBlockStore source kept"
    );
    let expanded: Vec<csi_proto::csi::v1::ControllerExpandVolumeRequest> =
        requests(&proxy, "ControllerExpandVolume");
    assert!(!expanded.is_empty(), "ControllerExpandVolume");
    assert_eq!(expanded[0].volume_id, handle, "the translated volume ID");
    assert_eq!(
        expanded[0].capacity_range.map(|r| r.required_bytes),
        Some(2 << 20)
    );
    let claim = claims.get("data").await.expect("the claim");
    assert_eq!(
        claim
            .annotations()
            .get(csi_resizer::resize::STORAGE_RESIZER_ANNOTATION)
            .map(String::as_str),
        Some(EBS),
        "handed to the CSI driver's resizer"
    );

    resizer.cancel();
    resizer_task.await.expect("the resizer stopped");
    cluster
        .delete_and_wait(&claims, "data", "the claim deleted")
        .await;
    cluster
        .delete_and_wait(&pvs, &name, "the released PV deleted")
        .await;
    cluster
        .cluster_scoped::<StorageClass>()
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the class");
    cluster.stop().await;
}

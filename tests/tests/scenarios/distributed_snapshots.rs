//! Distributed snapshotting (issue 60 item 4): a snapshot-controller run with
//! `--enable-distributed-snapshotting` labels each content of a node-local volume with the
//! volume's node, and one csi-snapshotter per node, run with `--node-deployment` and its
//! `NODE_NAME`, cuts and deletes only the snapshots of its node's volumes.
//!
//! Each node's csi-snapshotter talks to the reference driver through a proxy of its own, which
//! records the CSI calls it sent: that is the per-node view. A snapshot of a volume of a node
//! without an instance waits until one starts there.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::snapshots::ready;
use csi_grpc::flags::try_parse_from;
use csi_kinds::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use csi_snapshotter::distributed::MANAGED_BY_LABEL;
use csi_snapshotter::flags::{ControllerArgs, SnapshotterArgs};
use csi_suite_scenarios::csi_proxy::CsiProxy;
use csi_suite_scenarios::fixtures::{bound, claim, install_snapshot_crds, pv_nodes};
use csi_suite_scenarios::{Cluster, Sidecar, rbac};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The identity of the distributed snapshot-controller: the chart grants the snapshot-controller
/// no Nodes, which distributed snapshotting watches (see the RBAC check below).
const DISTRIBUTED_CONTROLLER: &str = "snapshot-controller-distributed";

/// A csi-snapshotter of `node`, set up from the command line and `NODE_NAME` as the binary is,
/// talking to the driver through a proxy of its own.
async fn node_snapshotter(cluster: &Cluster, node: &str) -> (Sidecar, CsiProxy) {
    let args = try_parse_from::<SnapshotterArgs, _, _>(["csi-snapshotter", "--node-deployment"])
        .expect("csi-snapshotter accepts --node-deployment");
    let deployment = args
        .deployment_node(Some(node))
        .expect("the node deployment of NODE_NAME");
    assert_eq!(deployment.as_deref(), Some(node));
    let (proxy, csi) = cluster.csi_proxy().await;
    let sidecar = cluster.start_snapshotter_via(csi, deployment).await;
    (sidecar, proxy)
}

/// The volume handles of the CreateSnapshot and DeleteSnapshot calls `proxy` saw.
fn snapshot_calls(proxy: &CsiProxy) -> (Vec<String>, Vec<String>) {
    let created = proxy
        .create_snapshot_requests()
        .into_iter()
        .map(|r| r.source_volume_id)
        .collect();
    let deleted = proxy
        .delete_snapshot_requests()
        .into_iter()
        .map(|r| r.snapshot_id)
        .collect();
    (created, deleted)
}

#[tokio::test]
async fn each_node_cuts_and_deletes_the_snapshots_of_its_own_volumes() {
    let cluster = Cluster::start("distributed-snapshots").await;
    install_snapshot_crds(&cluster.client).await;
    let [a, b, c] = ["node-a", "node-b", "node-c"].map(|node| cluster.node(node));
    let controller_args = try_parse_from::<ControllerArgs, _, _>([
        "snapshot-controller",
        "--enable-distributed-snapshotting",
    ])
    .expect("snapshot-controller accepts --enable-distributed-snapshotting");
    let controller = cluster.start_snapshot_controller_configured(
        cluster.component_client(DISTRIBUTED_CONTROLLER),
        controller_args.enable_distributed_snapshotting,
    );
    // Strict topology: a volume is homed on, and affine to, its claim's selected node only.
    let provisioner = cluster
        .start_provisioner_with(|settings| settings.strict_topology = true)
        .await;
    let mut snapshotters = BTreeMap::new();
    for node in [&a, &b] {
        snapshotters.insert(node.clone(), node_snapshotter(&cluster, node).await);
    }

    // One volume local to each node.
    let storage = cluster
        .storage_class("local", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let mut volumes = BTreeMap::new();
    for node in [&a, &b, &c] {
        let name = format!("data-{}", &node[..6]);
        cluster.create(&claims, claim(&name, &storage)).await;
        let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
        let claimed = cluster
            .wait_for(&claims, &name, "the local claim Bound", bound)
            .await;
        assert_eq!(
            pv_nodes(&cluster, &claimed).await,
            std::slice::from_ref(node)
        );
        let handle = cluster
            .volume_handle(&claimed.spec.unwrap().volume_name.unwrap())
            .await;
        volumes.insert(node.clone(), (name, handle));
    }

    let class = format!("{}-local", cluster.namespace);
    cluster
        .create(
            &cluster.cluster_scoped::<VolumeSnapshotClass>(),
            json!({"metadata": {"name": class}, "driver": cluster.driver_name,
                   "deletionPolicy": "Delete"}),
        )
        .await;
    cluster.delete_at_cleanup::<VolumeSnapshotClass>(None, &class);
    let snapshots = cluster.namespaced::<VolumeSnapshot>();
    for (claim_name, _) in volumes.values() {
        cluster
            .create(
                &snapshots,
                json!({"metadata": {"name": format!("snap-{claim_name}")},
                       "spec": {"source": {"persistentVolumeClaimName": claim_name},
                                "volumeSnapshotClassName": class}}),
            )
            .await;
    }

    // Each content carries its volume's node; node-a's and node-b's are cut there.
    let contents = cluster.cluster_scoped::<VolumeSnapshotContent>();
    let mut content_of = BTreeMap::new();
    for (node, (claim_name, _)) in &volumes {
        let snapshot = format!("snap-{claim_name}");
        let labelled = cluster
            .wait_for(
                &snapshots,
                &snapshot,
                "the snapshot bound to its content",
                |s| {
                    s.status
                        .as_ref()
                        .is_some_and(|s| s.bound_volume_snapshot_content_name.is_some())
                },
            )
            .await;
        let name = labelled
            .status
            .and_then(|s| s.bound_volume_snapshot_content_name)
            .unwrap();
        let content = contents.get(&name).await.unwrap();
        assert_eq!(
            content.labels().get(MANAGED_BY_LABEL),
            Some(node),
            "{name} labelled with the node of its volume"
        );
        content_of.insert(node.clone(), name);
    }
    for node in [&a, &b] {
        let snapshot = format!("snap-{}", volumes[node].0);
        cluster
            .wait_for(&snapshots, &snapshot, "the node's snapshot ready", ready)
            .await;
    }
    let snapshot_c = format!("snap-{}", volumes[&c].0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = snapshots.get(&snapshot_c).await.unwrap();
    assert!(
        !ready(&waiting),
        "no instance on node-c: its volume's snapshot is not cut"
    );
    let (snapshotter_c, proxy_c) = node_snapshotter(&cluster, &c).await;
    snapshotters.insert(c.clone(), (snapshotter_c, proxy_c));
    cluster
        .wait_for(&snapshots, &snapshot_c, "node-c's snapshot ready", ready)
        .await;
    for (node, (_, proxy)) in &snapshotters {
        let (created, deleted) = snapshot_calls(proxy);
        assert_eq!(
            created,
            [volumes[node].1.clone()],
            "{node}'s instance cut its own volume's snapshot, once, and no other"
        );
        assert!(deleted.is_empty(), "{node}: {deleted:?}");
    }

    // Deletion: each snapshot is deleted at the driver by its node's instance.
    let mut handles = BTreeMap::new();
    for (node, content) in &content_of {
        let cut = contents.get(content).await.unwrap();
        handles.insert(
            node.clone(),
            cut.status
                .and_then(|s| s.snapshot_handle)
                .expect("a handle"),
        );
        let snapshot = format!("snap-{}", volumes[node].0);
        cluster
            .delete_and_wait(&snapshots, &snapshot, "the snapshot")
            .await;
        cluster.wait_gone(&contents, content, "its content").await;
    }
    for (node, (_, proxy)) in &snapshotters {
        let (_, deleted) = snapshot_calls(proxy);
        assert_eq!(
            deleted,
            [handles[node].clone()],
            "{node}'s instance deleted its own snapshot and no other"
        );
    }

    // What distributed snapshotting asks of the RBAC beyond the snapshot-controller's rules:
    // to list and watch the Nodes, and nothing else.
    if cluster.sim.is_some() {
        let granted = rbac::granted(rbac::SNAPSHOT_CONTROLLER);
        let beyond: Vec<(String, String, String)> = cluster
            .request_counts()
            .into_keys()
            .filter(|key| key.client == DISTRIBUTED_CONTROLLER)
            .filter(|key| !rbac::allows(granted, &key.verb, &key.group, &key.resource))
            .map(|key| (key.verb, key.group, key.resource))
            .collect();
        let nodes = |verb: &str| (verb.to_string(), String::new(), "nodes".to_string());
        assert_eq!(beyond, [nodes("list"), nodes("watch")]);
    }

    for (sidecar, _) in snapshotters.into_values() {
        sidecar.stop().await;
    }
    controller.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

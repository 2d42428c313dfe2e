//! The kubelet plugin-registration handshake, with a stand-in registration server (the real
//! node-driver-registrar is tested against the same kubelet in its own scenarios).

use csi_suite_scenarios::{Cluster, Options, RegistrationServer};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

fn unregistered() -> Options {
    Options {
        nodes: vec!["node-a".to_string()],
        register_driver: false,
        ..Options::default()
    }
}

fn driver_entry<'a>(
    cluster: &Cluster,
    csi_node: &'a CSINode,
) -> Option<&'a k8s_openapi::api::storage::v1::CSINodeDriver> {
    csi_node
        .spec
        .drivers
        .iter()
        .find(|d| d.name == cluster.driver_name)
}

/// The reference driver's topology key (it names the driver).
fn topology_key(cluster: &Cluster) -> String {
    format!("topology.{}/node", cluster.driver_name)
}

#[tokio::test]
async fn registration_handshake_records_the_driver_on_node_and_csinode() {
    let cluster = Cluster::start("registration-ok").await;
    for node in &cluster.nodes {
        let csi_node = cluster
            .wait_for(
                &cluster.cluster_scoped::<CSINode>(),
                node,
                "CSINode entry",
                |c| driver_entry(&cluster, c).is_some(),
            )
            .await;
        let entry = driver_entry(&cluster, &csi_node).unwrap();
        assert_eq!(&entry.node_id, node);
        assert_eq!(entry.topology_keys, Some(vec![topology_key(&cluster)]));
        assert_eq!(
            entry.allocatable, None,
            "the driver reports no volume limit"
        );
        let owner = &csi_node.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Node", node.as_str())
        );

        let node_object = cluster
            .wait_for(
                &cluster.cluster_scoped::<Node>(),
                node,
                "node-ID annotation",
                |n| n.annotations().contains_key(NODE_ID_ANNOTATION),
            )
            .await;
        let ids: serde_json::Value =
            serde_json::from_str(&node_object.annotations()[NODE_ID_ANNOTATION]).unwrap();
        assert_eq!(ids, json!({ cluster.driver_name.clone(): node }));
        assert_eq!(
            node_object.labels().get(&topology_key(&cluster)),
            Some(node)
        );
        assert_eq!(
            node_object
                .annotations()
                .get("volumes.kubernetes.io/controller-managed-attach-detach")
                .map(String::as_str),
            Some("true")
        );
    }
    for server in &cluster.registrations {
        let reported = server.reported();
        assert_eq!(
            reported.len(),
            1,
            "exactly one NotifyRegistrationStatus: {reported:?}"
        );
        assert!(reported[0].plugin_registered, "{reported:?}");
    }
    cluster.stop().await;
}

/// Serves a registration socket on node-a advertising `versions` and checks the kubelet
/// rejects it with an error containing `reason`, and writes nothing about the driver.
async fn expect_rejection(cluster: &mut Cluster, versions: &[&str], reason: &str) {
    let registry = cluster
        .driver
        .kubelet_dir(&cluster.node("node-a"))
        .join(kube_sim::roles::kubelet::PLUGINS_REGISTRY_DIR);
    let endpoint = cluster
        .driver
        .node(&cluster.node("node-a"))
        .endpoint
        .path()
        .display()
        .to_string();
    let server = RegistrationServer::start(&registry, &cluster.driver_name, &endpoint, versions)
        .await
        .unwrap();
    cluster
        .eventually("the kubelet's rejection", || !server.reported().is_empty())
        .await;
    let reported = server.reported();
    assert!(!reported[0].plugin_registered);
    assert!(reported[0].error.contains(reason), "{}", reported[0].error);
    let csi_node = cluster
        .cluster_scoped::<CSINode>()
        .get(&cluster.node("node-a"))
        .await
        .unwrap();
    assert!(
        driver_entry(cluster, &csi_node).is_none(),
        "no CSINode entry after a rejection"
    );
    let node = cluster
        .cluster_scoped::<Node>()
        .get(&cluster.node("node-a"))
        .await
        .unwrap();
    assert!(!node.annotations().contains_key(NODE_ID_ANNOTATION));
    cluster.registrations.push(server);
}

#[tokio::test]
async fn registration_rejected_for_an_unsupported_version() {
    let mut cluster = Cluster::start_with("registration-version", unregistered()).await;
    expect_rejection(&mut cluster, &["2.0.0"], "2.0.0").await;
    cluster.stop().await;
}

#[tokio::test]
async fn registration_rejected_for_a_topology_label_clash() {
    let mut cluster = Cluster::start_with("registration-clash", unregistered()).await;
    let key = topology_key(&cluster);
    let label = |value: serde_json::Value| {
        Patch::Merge(json!({"metadata": {"labels": {key.clone(): value}}}))
    };
    let nodes = cluster.cluster_scoped::<Node>();
    nodes
        .patch(
            &cluster.node("node-a"),
            &PatchParams::default(),
            &label(json!("elsewhere")),
        )
        .await
        .unwrap();
    expect_rejection(&mut cluster, &["1.0.0"], "collision").await;
    nodes
        .patch(
            &cluster.node("node-a"),
            &PatchParams::default(),
            &label(json!(null)),
        )
        .await
        .unwrap();
    cluster.stop().await;
}

#[tokio::test]
async fn registration_socket_removed_unregisters_the_driver() {
    let mut cluster = Cluster::start_with(
        "registration-removed",
        Options {
            nodes: vec!["node-a".to_string()],
            ..Options::default()
        },
    )
    .await;
    let server = cluster.registrations.pop().unwrap();
    server.stop().await;
    cluster
        .wait_for(
            &cluster.cluster_scoped::<CSINode>(),
            &cluster.node("node-a"),
            "the CSINode entry removed",
            |c| driver_entry(&cluster, c).is_none(),
        )
        .await;
    let node = cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &cluster.node("node-a"),
            "the node-ID annotation removed",
            |n| !n.annotations().contains_key(NODE_ID_ANNOTATION),
        )
        .await;
    assert_eq!(
        node.labels()
            .get(&topology_key(&cluster))
            .map(String::as_str),
        Some(cluster.node("node-a").as_str()),
        "topology labels stay, as with kubelet"
    );
    assert!(
        cluster
            .kubelet(&cluster.node("node-a"))
            .registered_drivers()
            .is_empty()
    );
    cluster.stop().await;
}

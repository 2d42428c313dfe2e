//! Distributed provisioning (`--node-deployment`, issue 19 item 4): one provisioner per node,
//! each knowing its node from NodeGetInfo. A WaitForFirstConsumer claim is provisioned only by
//! the instance of the node the scheduler selected; an Immediate claim is taken by exactly one
//! instance, which sets selected-node to its node; each instance deletes only its node's
//! volumes and publishes the CSIStorageCapacity of its node only.
//!
//! The reference driver's instances share one state directory and its controller instance
//! homes a volume on the node its topology requirement names, so every node's provisioner talks
//! to the controller instance: with a node's topology only, that is what a node-local driver
//! serving the controller service on the node does.

use std::time::Duration;

use csi_proto::csi::v1 as csi;
use csi_provisioner::capacity::controller::CapacitySettings;
use csi_provisioner::capacity::{DRIVER_NAME_LABEL, MANAGED_BY_LABEL, node_managed_by};
use csi_provisioner::node_deployment::NodeDeployment;
use csi_suite_scenarios::fixtures::{bound, claim, pv_nodes};
use csi_suite_scenarios::{Cluster, Sidecar};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The provisioner of `node`, set up from its driver instance's NodeGetInfo as the binary is,
/// tracking capacity when the server serves CSIStorageCapacity v1.
async fn node_provisioner(cluster: &Cluster, node: &str, capacity: bool) -> Sidecar {
    let info = cluster
        .driver
        .node(node)
        .csi
        .node_get_info(csi::NodeGetInfoRequest {}, Duration::from_secs(10))
        .await
        .expect("NodeGetInfo");
    let deployment = NodeDeployment {
        node_name: node.to_string(),
        segments: info
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default(),
        immediate_binding: true,
        base_delay: Duration::from_millis(300),
        max_delay: Duration::from_secs(2),
    };
    let capacity = capacity.then(|| CapacitySettings {
        managed_by: node_managed_by(node),
        ..cluster.capacity_settings(None)
    });
    cluster
        .start_provisioner_via(cluster.driver.controller.csi.clone(), move |settings| {
            settings.node_deployment = Some(deployment);
            settings.capacity = capacity;
        })
        .await
}

#[tokio::test]
async fn each_node_provisions_its_own_claims_and_one_takes_an_immediate_claim() {
    let cluster = Cluster::start("node-deployment").await;
    let [a, b, c] = ["node-a", "node-b", "node-c"].map(|node| cluster.node(node));
    let late = cluster
        .storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    let immediate = cluster
        .storage_class("immediate", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    // Reports the skip of the capacity part where CSIStorageCapacity v1 is not served.
    let capacity = cluster
        .serves("storage.k8s.io/v1", "csistoragecapacities")
        .await;

    // Without node-b's instance, a claim scheduled to node-b stays pending.
    let mut provisioners = vec![
        node_provisioner(&cluster, &a, capacity).await,
        node_provisioner(&cluster, &c, capacity).await,
    ];
    cluster.create(&claims, claim("on-b", &late)).await;
    let patch = json!({"metadata": {"annotations": {SELECTED_NODE: b}}});
    claims
        .patch("on-b", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pending = claims.get("on-b").await.unwrap();
    assert!(
        !bound(&pending) && cluster.driver_volumes().await.is_empty(),
        "the instances of node-a and node-c leave node-b's claim alone"
    );
    provisioners.push(node_provisioner(&cluster, &b, capacity).await);
    let on_b = cluster
        .wait_for(&claims, "on-b", "node-b's claim Bound", bound)
        .await;
    assert_eq!(pv_nodes(&cluster, &on_b).await, std::slice::from_ref(&b));

    // Each instance publishes its node's capacity of the WaitForFirstConsumer class, labelled
    // as its own.
    if capacity {
        let key = format!("topology.{}/node", cluster.driver_name);
        let selector = format!("{DRIVER_NAME_LABEL}={}", cluster.driver_name);
        let objects = cluster.namespaced::<CSIStorageCapacity>();
        cluster
            .eventually_async(
                "one CSIStorageCapacity per node, by its instance",
                || async {
                    let list = objects
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .unwrap()
                        .items;
                    let mut published: Vec<(String, String, String)> = list
                        .iter()
                        .map(|o| {
                            let node = o
                                .node_topology
                                .as_ref()
                                .and_then(|t| t.match_labels.as_ref())
                                .and_then(|l| l.get(&key).cloned())
                                .unwrap_or_default();
                            let managed_by = o.labels().get(MANAGED_BY_LABEL).cloned();
                            (
                                o.storage_class_name.clone(),
                                node,
                                managed_by.unwrap_or_default(),
                            )
                        })
                        .collect();
                    published.sort();
                    let mut wanted: Vec<(String, String, String)> = [&a, &b, &c]
                        .iter()
                        .map(|n| (late.clone(), n.to_string(), node_managed_by(n)))
                        .collect();
                    wanted.sort();
                    published == wanted
                },
            )
            .await;
    }

    // Immediate claims, all three instances competing: exactly one takes each, on its own
    // node, and nothing else is created.
    let immediate_claims = ["anywhere-1", "anywhere-2", "anywhere-3"];
    for name in immediate_claims {
        cluster.create(&claims, claim(name, &immediate)).await;
    }
    for name in immediate_claims {
        let taken = cluster
            .wait_for(&claims, name, "the Immediate claim Bound", bound)
            .await;
        let owner = taken
            .annotations()
            .get(SELECTED_NODE)
            .cloned()
            .expect("the owner's selected-node annotation");
        assert!(
            [&a, &b, &c].contains(&&owner),
            "{name} owned by a node: {owner}"
        );
        assert_eq!(pv_nodes(&cluster, &taken).await, [owner]);
    }
    assert_eq!(
        cluster.driver_volumes().await.len(),
        1 + immediate_claims.len()
    );

    // Each volume is deleted by its node's instance.
    for name in std::iter::once("on-b").chain(immediate_claims) {
        cluster.delete_and_wait(&claims, name, "the claim").await;
    }
    cluster
        .eventually_async("the volumes deleted", || async {
            cluster.driver_volumes().await.is_empty() && cluster.driver_pvs().await.is_empty()
        })
        .await;
    // The caches answer every read (but each instance's one read of its in-flight record at
    // start), and a node's instance watches no Nodes or CSINodes.
    if let Some(sim) = &cluster.sim {
        let reads: Vec<_> = sim
            .request_counts()
            .into_iter()
            .filter(|(key, _)| key.client == csi_suite_scenarios::rbac::PROVISIONER)
            .filter(|(key, _)| !(key.verb == "get" && key.resource == "leases"))
            .filter(|(key, _)| key.verb == "get" || ["nodes", "csinodes"].contains(&&*key.resource))
            .collect();
        assert!(reads.is_empty(), "{reads:?}");
    }
    for provisioner in provisioners {
        provisioner.stop().await;
    }
    cluster.stop().await;
}

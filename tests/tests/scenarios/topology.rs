//! Topology in CreateVolume: a class's allowedTopologies bound the requisite terms, the selected
//! node comes first among the preferred ones, and --strict-topology narrows both to it. The
//! requests are read at a proxy in front of the driver; the PVs' node affinity follows.

use csi_proto::csi::v1 as csi;
use csi_suite_scenarios::fixtures::{bound, claim, pv_nodes};
use csi_suite_scenarios::{Cluster, Options, RegistrationServer};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube_sim::roles::kubelet::PLUGINS_REGISTRY_DIR;
use serde_json::json;

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The node values of topology terms, in order.
fn nodes(terms: &[csi::Topology], key: &str) -> Vec<String> {
    terms
        .iter()
        .filter_map(|t| t.segments.get(key).cloned())
        .collect()
}

/// The CreateVolume request made for `claim` (by its volume name's UID suffix).
fn request_for(
    requests: &[csi::CreateVolumeRequest],
    claim: &PersistentVolumeClaim,
) -> csi::TopologyRequirement {
    let uid = claim.metadata.uid.clone().unwrap();
    requests
        .iter()
        .find(|r| r.name.ends_with(&uid))
        .and_then(|r| r.accessibility_requirements.clone())
        .expect("a CreateVolume with topology for the claim")
}

/// Creates `name` of `class` and selects `node` for it as the scheduler would.
async fn create_on(cluster: &Cluster, name: &str, class: &str, node: &str) {
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim(name, class)).await;
    let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
    claims
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// Creates `name` of `class`, selects `node` for it as the scheduler would, waits until Bound.
async fn provision(
    cluster: &Cluster,
    name: &str,
    class: &str,
    node: Option<&str>,
) -> PersistentVolumeClaim {
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    match node {
        Some(node) => create_on(cluster, name, class, node).await,
        None => {
            cluster.create(&claims, claim(name, class)).await;
        }
    }
    cluster
        .wait_for(&claims, name, "the claim Bound", bound)
        .await
}

#[tokio::test]
async fn allowed_topologies_and_strict_topology_shape_the_request() {
    let cluster = Cluster::start("topology").await;
    let key = format!("topology.{}/node", cluster.driver_name);
    let [a, b, c] = ["node-a", "node-b", "node-c"].map(|node| cluster.node(node));
    let allowed =
        |values: &[&str]| json!([{"matchLabelExpressions": [{"key": key, "values": values}]}]);
    let class = |suffix: &str, binding: &str, values: &[&str]| {
        let name = format!("{}-{suffix}", cluster.namespace);
        (
            name.clone(),
            json!({"metadata": {"name": name}, "provisioner": cluster.driver_name,
                "volumeBindingMode": binding, "allowedTopologies": allowed(values)}),
        )
    };
    let classes = cluster.cluster_scoped::<k8s_openapi::api::storage::v1::StorageClass>();
    let (immediate, manifest) = class("immediate", "Immediate", &[b.as_str(), c.as_str()]);
    cluster.create(&classes, manifest).await;
    let (late, manifest) = class("late", "WaitForFirstConsumer", &[a.as_str(), b.as_str()]);
    cluster.create(&classes, manifest).await;

    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    let anywhere = provision(&cluster, "anywhere", &immediate, None).await;
    let requirement = request_for(&proxy.create_volume_requests(), &anywhere);
    let mut requisite = nodes(&requirement.requisite, &key);
    requisite.sort();
    assert_eq!(
        requisite,
        [b.as_str(), c.as_str()],
        "only the allowed nodes"
    );
    let mut preferred = nodes(&requirement.preferred, &key);
    preferred.sort();
    assert_eq!(preferred, requisite, "every requisite term is preferred");
    let placed = pv_nodes(&cluster, &anywhere).await;
    assert!(
        !placed.is_empty() && placed.iter().all(|n| requisite.contains(n)),
        "reachable only from allowed nodes: {placed:?}"
    );

    let on_b = provision(&cluster, "on-b", &late, Some(b.as_str())).await;
    let requirement = request_for(&proxy.create_volume_requests(), &on_b);
    let mut requisite = nodes(&requirement.requisite, &key);
    requisite.sort();
    assert_eq!(requisite, [a.as_str(), b.as_str()]);
    assert_eq!(
        nodes(&requirement.preferred, &key),
        [b.as_str(), a.as_str()],
        "the selected node first"
    );
    let placed = pv_nodes(&cluster, &on_b).await;
    assert!(
        placed.contains(&b) && placed.iter().all(|n| requisite.contains(n)),
        "{placed:?}"
    );
    provisioner.stop().await;

    let (strict_proxy, csi) = cluster.csi_proxy().await;
    let strict = cluster
        .start_provisioner_via(csi, |s| s.strict_topology = true)
        .await;
    let on_a = provision(&cluster, "on-a", &late, Some(a.as_str())).await;
    let requirement = request_for(&strict_proxy.create_volume_requests(), &on_a);
    assert_eq!(nodes(&requirement.requisite, &key), [a.as_str()], "strict");
    assert_eq!(nodes(&requirement.preferred, &key), [a.as_str()], "strict");
    assert_eq!(pv_nodes(&cluster, &on_a).await, [a.as_str()]);
    strict.stop().await;
    cluster.stop().await;
}

/// As upstream: a selected node whose CSINode lacks the driver (its node plugin not registered
/// yet) keeps the claim, retried with "no topology key found", until the plugin registers;
/// only a node without a CSINode sends the claim back to the scheduler.
#[tokio::test]
async fn a_selected_node_without_the_driver_waits_for_its_registration() {
    let options = Options {
        register_driver: false,
        ..Options::default()
    };
    let cluster = Cluster::start_with("topology-unregistered", options).await;
    let node = cluster.node("node-a");
    let class = cluster
        .storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    let provisioner = cluster.start_provisioner().await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();

    create_on(&cluster, "waiting", &class, &node).await;
    let message = cluster
        .wait_for_event("waiting", "ProvisioningFailed", "no topology key")
        .await;
    assert_eq!(
        message,
        format!(
            "error generating accessibility requirements: no topology key found for node {node}"
        )
    );
    let waiting = claims.get("waiting").await.unwrap();
    assert_eq!(
        waiting.annotations().get(SELECTED_NODE),
        Some(&node),
        "not sent back to the scheduler"
    );
    let endpoint = cluster
        .driver
        .node(&node)
        .endpoint
        .path()
        .display()
        .to_string();
    let registry = cluster.kubelet(&node).root().join(PLUGINS_REGISTRY_DIR);
    let _registration =
        RegistrationServer::start(&registry, &cluster.driver_name, &endpoint, &["1.0.0"])
            .await
            .expect("the registration server starts");
    let placed = cluster
        .wait_for(
            &claims,
            "waiting",
            "the claim Bound once the plugin registered",
            bound,
        )
        .await;
    assert_eq!(pv_nodes(&cluster, &placed).await, [node.as_str()]);

    let ghost = format!("ghost-{}", cluster.id);
    create_on(&cluster, "nowhere", &class, &ghost).await;
    let message = cluster
        .wait_for_event(
            "nowhere",
            "ProvisioningFailed",
            "failed to get selected CSINode",
        )
        .await;
    assert_eq!(
        message,
        format!(
            "failed to get selected CSINode {ghost}: csinode.storage.k8s.io \"{ghost}\" not found"
        )
    );
    cluster
        .wait_for(&claims, "nowhere", "selected-node removed", |c| {
            !c.annotations().contains_key(SELECTED_NODE)
        })
        .await;
    provisioner.stop().await;
    cluster.stop().await;
}

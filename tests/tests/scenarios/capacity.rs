//! Storage capacity tracking: csi-provisioner publishes one CSIStorageCapacity per
//! WaitForFirstConsumer class and node segment, keeps it current as volumes come and go, puts
//! back what someone deletes, and removes what no class needs any more.

use std::time::Duration;

use csi_provisioner::capacity::{DRIVER_NAME_LABEL, MANAGED_BY_LABEL};
use csi_suite_scenarios::fixtures::{bound, claim, is_running, pod};
use csi_suite_scenarios::{Cluster, Options, skip_without_root};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

const POOL: u64 = 64 << 20;

async fn capacities(cluster: &Cluster) -> Vec<CSIStorageCapacity> {
    let selector = format!(
        "{DRIVER_NAME_LABEL}={},{MANAGED_BY_LABEL}=external-provisioner",
        cluster.driver_name
    );
    cluster
        .namespaced::<CSIStorageCapacity>()
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

/// The objects of `class` on `node`.
fn of<'a>(
    objects: &'a [CSIStorageCapacity],
    class: &'a str,
    node: &'a str,
) -> impl Iterator<Item = &'a CSIStorageCapacity> {
    objects.iter().filter(move |o| {
        let key = format!("topology.{}/node", o.labels()[DRIVER_NAME_LABEL]);
        o.storage_class_name == class
            && o.node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(&key))
                .is_some_and(|n| n == node)
    })
}

/// The capacities published for `class` on `node` (quantity strings).
fn published(objects: &[CSIStorageCapacity], class: &str, node: &str) -> Vec<String> {
    of(objects, class, node)
        .filter_map(|o| o.capacity.as_ref().map(|q| q.0.clone()))
        .collect()
}

fn published_name(objects: &[CSIStorageCapacity], class: &str, node: &str) -> String {
    of(objects, class, node)
        .map(|o| o.name_any())
        .next()
        .unwrap_or_default()
}

/// Polls the published objects until `check` holds.
async fn wait_for_capacities(
    cluster: &Cluster,
    what: &str,
    check: impl Fn(&[CSIStorageCapacity]) -> bool,
) -> Vec<CSIStorageCapacity> {
    let deadline = std::time::Instant::now() + csi_suite_scenarios::step_timeout();
    loop {
        let objects = capacities(cluster).await;
        if check(&objects) {
            return objects;
        }
        if std::time::Instant::now() > deadline {
            eprintln!("{objects:#?}");
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The only CSIStorageCapacity version csi-provisioner uses (as upstream since it dropped
/// v1beta1; Kubernetes serves v1 since 1.24).
const CAPACITY_API: &str = "storage.k8s.io/v1";

#[tokio::test]
async fn capacity_objects_appear_follow_volumes_and_vanish() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start_with(
        "capacity",
        Options {
            pool_bytes: Some(POOL),
            ..Options::default()
        },
    )
    .await;
    if !cluster.serves(CAPACITY_API, "csistoragecapacities").await {
        cluster.stop().await;
        return;
    }
    // The provisioner's own Pod owns the objects (--capacity-ownerref-level=0); it waits for
    // a node that does not exist, so nothing runs it.
    let owner: Pod = cluster
        .create(
            &cluster.namespaced::<Pod>(),
            json!({"metadata": {"name": "csi-provisioner"}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "nowhere"},
                "containers": [{"name": "csi-provisioner", "image": "csi-provisioner"}]}}),
        )
        .await;
    let owner_ref = csi_provisioner::capacity::owner::find(
        &cluster.component_client(csi_suite_scenarios::rbac::PROVISIONER),
        &cluster.namespace,
        "csi-provisioner",
        0,
    )
    .await
    .expect("the owner Pod");
    assert_eq!(owner_ref.uid, owner.uid().unwrap());
    let settings = cluster.capacity_settings(Some(owner_ref));
    let provisioner = cluster
        .start_provisioner_with(|s| s.capacity = Some(settings))
        .await;
    let attacher = cluster.start_attacher().await;
    let late = cluster
        .storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    let now = cluster
        .storage_class("now", "Immediate", "Delete", json!({}))
        .await;

    let full = format!("{}Mi", POOL >> 20);
    let objects = wait_for_capacities(&cluster, "one object per node", |objects| {
        cluster
            .nodes
            .iter()
            .all(|node| published(objects, &late, node) == [full.clone()])
    })
    .await;
    assert_eq!(objects.len(), cluster.nodes.len(), "{objects:#?}");
    assert!(
        objects.iter().all(|o| o
            .owner_references()
            .iter()
            .any(|r| r.uid == owner.uid().unwrap())),
        "owned by the provisioner's Pod"
    );
    assert!(
        objects.iter().all(|o| o.storage_class_name != now),
        "Immediate classes are not tracked by default"
    );

    // A 16Mi volume on node-a lowers node-a's capacity only.
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let mut data = claim("data", &late);
    data["spec"]["resources"]["requests"]["storage"] = json!("16Mi");
    cluster.create(&claims, data).await;
    let pods = cluster.namespaced::<Pod>();
    cluster
        .create(
            &pods,
            pod("user", &cluster.node("node-a"), Some("data"), false),
        )
        .await;
    cluster
        .wait_for(&pods, "user", "the pod Running", is_running)
        .await;
    cluster
        .wait_for(&claims, "data", "the claim Bound", bound)
        .await;
    let left = format!("{}Mi", (POOL >> 20) - 16);
    wait_for_capacities(&cluster, "node-a's capacity lowered", |objects| {
        published(objects, &late, &cluster.node("node-a")) == [left.clone()]
            && published(objects, &late, &cluster.node("node-b")) == [full.clone()]
    })
    .await;

    // An object someone deletes comes back.
    let api = cluster.namespaced::<CSIStorageCapacity>();
    let victim = published_name(&capacities(&cluster).await, &late, &cluster.node("node-b"));
    api.delete(&victim, &DeleteParams::default()).await.unwrap();
    wait_for_capacities(&cluster, "node-b's object recreated", |objects| {
        published(objects, &late, &cluster.node("node-b")) == [full.clone()]
            && published_name(objects, &late, &cluster.node("node-b")) != victim
    })
    .await;

    // Deleting the volume gives the space back.
    cluster.delete_and_wait(&pods, "user", "the pod gone").await;
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_capacities(&cluster, "node-a's capacity restored", |objects| {
        published(objects, &late, &cluster.node("node-a")) == [full.clone()]
    })
    .await;

    // Without the class its objects go.
    cluster
        .cluster_scoped::<StorageClass>()
        .delete(&late, &DeleteParams::default())
        .await
        .unwrap();
    wait_for_capacities(&cluster, "the objects removed", <[_]>::is_empty).await;

    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// The scheduler trusts published capacity; when the driver still runs out of space on the
/// selected node (RESOURCE_EXHAUSTED, strict topology), the provisioner drops selected-node and
/// refreshes the class's capacity, and the pod lands on a node with room.
#[tokio::test]
async fn resource_exhausted_reschedules_to_a_node_with_room() {
    if skip_without_root() {
        return;
    }
    let options = Options {
        driver_name: "capacity.csi-suite.io".to_string(),
        pool_bytes: Some(POOL),
        ..Options::default()
    };
    let cluster = Cluster::start_with("reschedule", options).await;
    if !cluster.serves(CAPACITY_API, "csistoragecapacities").await {
        cluster.stop().await;
        return;
    }
    let driver = cluster.driver_name.clone();
    cluster
        .create(
            &cluster.cluster_scoped::<CSIDriver>(),
            json!({"metadata": {"name": driver}, "spec": {"attachRequired": true, "storageCapacity": true}}),
        )
        .await;
    let settings = cluster.capacity_settings(None);
    let provisioner = cluster
        .start_provisioner_with(|s| {
            s.capacity = Some(settings);
            s.strict_topology = true;
        })
        .await;
    let attacher = cluster.start_attacher().await;
    let late = cluster
        .storage_class("late", "WaitForFirstConsumer", "Delete", json!({}))
        .await;
    let full = format!("{}Mi", POOL >> 20);
    wait_for_capacities(&cluster, "capacity published", |objects| {
        cluster
            .nodes
            .iter()
            .all(|node| published(objects, &late, node) == [full.clone()])
    })
    .await;

    // Someone else fills node-a behind the published numbers (no PV, no poll soon).
    let key = format!("topology.{driver}/node");
    let node_a = csi_proto::csi::v1::Topology {
        segments: [(key, cluster.node("node-a"))].into_iter().collect(),
    };
    cluster
        .driver
        .controller
        .csi
        .create_volume(
            csi_proto::csi::v1::CreateVolumeRequest {
                name: "squatter".to_string(),
                capacity_range: Some(csi_proto::csi::v1::CapacityRange {
                    required_bytes: i64::try_from(POOL - (8 << 20)).unwrap(),
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![csi_kinds::capability::volume_capability(
                    &csi_kinds::capability::AccessKind::from_volume_mode(None, "", vec![]),
                    csi_proto::csi::v1::volume_capability::access_mode::Mode::SingleNodeWriter,
                )],
                accessibility_requirements: Some(csi_proto::csi::v1::TopologyRequirement {
                    requisite: vec![node_a.clone()],
                    preferred: vec![node_a],
                }),
                ..Default::default()
            },
            Duration::from_secs(10),
        )
        .await
        .expect("the squatter volume");

    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let mut data = claim("data", &late);
    data["spec"]["resources"]["requests"]["storage"] = json!("16Mi");
    cluster.create(&claims, data).await;
    let pods = cluster.namespaced::<Pod>();
    // The scheduler's first choice is node-a, whose published capacity is stale (a real
    // scheduler picks any node that fits, kube-sim's the first).
    let mut affinity = cluster.on_scenario_nodes();
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = json!([{
        "weight": 100, "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname",
            "operator": "In", "values": [cluster.node("node-a")]}]}}]);
    let user = json!({"metadata": {"name": "user"}, "spec": {
        "containers": [{"name": "app", "image": "busybox"}], "affinity": affinity,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}});
    cluster.create(&pods, user).await;
    let message = cluster
        .wait_for_event("data", "ProvisioningFailed", "ResourceExhausted")
        .await;
    assert!(
        message.starts_with("rpc error: code = ResourceExhausted desc = "),
        "the driver's error, as upstream quotes it: {message}"
    );
    let running = cluster
        .wait_for(&pods, "user", "the pod Running elsewhere", is_running)
        .await;
    let node = running.spec.unwrap().node_name.unwrap();
    assert_ne!(
        node,
        cluster.node("node-a"),
        "rescheduled away from the full node"
    );
    cluster
        .wait_for(&claims, "data", "the claim Bound", bound)
        .await;
    wait_for_capacities(&cluster, "node-a's real capacity published", |objects| {
        published(objects, &late, &cluster.node("node-a")) == ["8Mi".to_string()]
    })
    .await;

    cluster.delete_and_wait(&pods, "user", "the pod gone").await;
    attacher.stop().await;
    provisioner.stop().await;
    cluster.stop().await;
}

/// Level 1 (a StatefulSet's or DaemonSet's Pod) is the Pod's own controller reference: one GET
/// of the Pod and nothing else, so the RBAC for it is `pods get` alone.
#[tokio::test]
async fn owner_at_level_one_costs_one_pod_get() {
    let sim = kube_sim::ApiServer::start().await.unwrap();
    let pods: kube::Api<Pod> = kube::Api::namespaced(sim.client(), "default");
    let set = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: "csi-controller".into(),
        uid: "5e7c0b6a-0000-4000-8000-000000000001".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    pods.create(
        &Default::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "csi-controller-0", "ownerReferences": [set]},
            "spec": {"containers": [{"name": "csi-provisioner", "image": "csi-provisioner"}]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    let before = sim.request_counts();
    let owner =
        csi_provisioner::capacity::owner::find(&sim.client(), "default", "csi-controller-0", 1)
            .await
            .expect("the StatefulSet");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("StatefulSet", "csi-controller")
    );
    let after = sim.request_counts();
    let made: Vec<_> = after
        .iter()
        .filter(|(key, count)| before.get(*key) != Some(*count))
        .map(|(key, _)| (key.verb.as_str(), key.resource.as_str()))
        .collect();
    assert_eq!(made, [("get", "pods")]);
}

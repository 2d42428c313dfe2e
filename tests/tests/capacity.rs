//! Storage capacity tracking: csi-provisioner publishes one CSIStorageCapacity per
//! WaitForFirstConsumer class and node segment, keeps it current as volumes come and go, puts
//! back what someone deletes, and removes what no class needs any more.

use std::time::Duration;

use csi_provisioner::capacity::controller::{CapacityMetrics, CapacitySettings};
use csi_provisioner::capacity::{DRIVER_NAME_LABEL, MANAGED_BY_LABEL};
use csi_suite_scenarios::fixtures::{bound, claim, is_running, pod};
use csi_suite_scenarios::{Cluster, Options};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;

const POOL: u64 = 64 << 20;
const TOPOLOGY_KEY: &str = "topology.hostpath.csi-suite.io/node";

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
        o.storage_class_name == class
            && o.node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(TOPOLOGY_KEY))
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

#[tokio::test]
async fn capacity_objects_appear_follow_volumes_and_vanish() {
    let cluster = Cluster::start_with(
        "capacity",
        Options {
            pool_bytes: Some(POOL),
            ..Options::default()
        },
    )
    .await;
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
        &cluster.client,
        &cluster.namespace,
        "csi-provisioner",
        0,
    )
    .await
    .expect("the owner Pod");
    assert_eq!(owner_ref.uid, owner.uid().unwrap());
    let settings = CapacitySettings {
        client: cluster.client.clone(),
        namespace: cluster.namespace.clone(),
        owner: Some(owner_ref),
        // Refreshes below come from volume changes, not from the poll.
        poll_interval: Duration::from_secs(3600),
        workers: 2,
        immediate_binding: false,
        default_fstype: String::new(),
        timeout: Duration::from_secs(10),
        retry_start: Duration::from_millis(200),
        retry_max: Duration::from_secs(2),
        metrics: CapacityMetrics::default(),
    };
    let provisioner = cluster
        .start_provisioner_with(|s| s.capacity = Some(settings))
        .await;
    let attacher = cluster.stand_in_attacher();
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
        .create(&pods, pod("user", "node-a", Some("data"), false))
        .await;
    cluster
        .wait_for(&pods, "user", "the pod Running", is_running)
        .await;
    cluster
        .wait_for(&claims, "data", "the claim Bound", bound)
        .await;
    let left = format!("{}Mi", (POOL >> 20) - 16);
    wait_for_capacities(&cluster, "node-a's capacity lowered", |objects| {
        published(objects, &late, "node-a") == [left.clone()]
            && published(objects, &late, "node-b") == [full.clone()]
    })
    .await;

    // An object someone deletes comes back.
    let api = cluster.namespaced::<CSIStorageCapacity>();
    let victim = published_name(&capacities(&cluster).await, &late, "node-b");
    api.delete(&victim, &DeleteParams::default()).await.unwrap();
    wait_for_capacities(&cluster, "node-b's object recreated", |objects| {
        published(objects, &late, "node-b") == [full.clone()]
            && published_name(objects, &late, "node-b") != victim
    })
    .await;

    // Deleting the volume gives the space back.
    pods.delete("user", &DeleteParams::default()).await.unwrap();
    cluster.wait_gone(&pods, "user", "the pod gone").await;
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_capacities(&cluster, "node-a's capacity restored", |objects| {
        published(objects, &late, "node-a") == [full.clone()]
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
    cluster.stop(&[("StorageClass", &now)]).await;
}

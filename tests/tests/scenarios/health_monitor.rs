//! csi-health-monitor on a live cluster, with the reference driver serving each volume-health
//! generation (CSI v1.13's health RPCs, and v1.12's VolumeCondition, as drivers before v1.13
//! do): a bound volume whose data goes missing behind the driver's back gets one Warning
//! `VolumeConditionAbnormal` on its claim, not repeated while it stays so nor by a restarted
//! monitor, and one Normal `VolumeConditionNormal` once the data is back. With the node
//! watcher, the claim of a pod on a node NotReady past the grace gets `NodeFailed`, once, and
//! `NodeRecovered` when the node is Ready again.

use std::time::Duration;

use csi_health_monitor::health::{ABNORMAL, NORMAL, RECOVERED};
use csi_health_monitor::monitor::component;
use csi_health_monitor::node::{NODE_FAILED, NODE_RECOVERED};
use csi_hostpath::health::HealthApi;
use csi_suite_scenarios::fixtures::{handle_of, pod, static_claim};
use csi_suite_scenarios::{Cluster, Options};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use serde_json::json;

/// How often the monitor checks in these scenarios.
const INTERVAL: Duration = Duration::from_millis(300);

/// The Events with `reason` about the claim `claim`.
async fn events(cluster: &Cluster, claim: &str, reason: &str) -> Vec<Event> {
    cluster
        .events()
        .await
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(claim))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// One Event with `reason` on the claim, recorded once, from the monitor.
async fn told_once(cluster: &Cluster, claim: &str, reason: &str) -> Event {
    let told = events(cluster, claim, reason).await;
    assert_eq!(told.len(), 1, "one {reason} Event: {told:?}");
    let event = told.into_iter().next().unwrap();
    assert_eq!(event.count, Some(1), "{reason} not repeated: {event:?}");
    assert_eq!(
        event.source.as_ref().and_then(|s| s.component.clone()),
        Some(component(&cluster.driver_name))
    );
    event
}

async fn abnormal_volume_is_told_once_and_its_recovery_once(scenario: &str, api: HealthApi) {
    let options = Options {
        volume_health: api,
        ..Options::default()
    };
    let cluster = Cluster::start_with(scenario, options).await;
    let pv = static_claim(&cluster, "data").await;
    let handle = handle_of(&cluster, &pv).await;
    let data = csi_hostpath::state::Store::open(&cluster.driver.state_dir)
        .expect("the driver's state")
        .volume_data(&handle, csi_hostpath::state::Layout::Directory);
    let away = data.with_extension("away");
    let monitor = cluster.start_health_monitor(INTERVAL, false).await;

    // The data goes missing behind the driver's back.
    std::fs::rename(&data, &away).expect("the volume's data moved away");
    let message = cluster
        .wait_for_event("data", ABNORMAL, "VolumeDataMissing")
        .await;
    assert!(
        message.contains(&data.display().to_string()) || message.contains("gone"),
        "{message}"
    );
    // Several passes later, and after a restart, the same condition is not told again.
    tokio::time::sleep(INTERVAL * 4).await;
    monitor.stop().await;
    let monitor = cluster.start_health_monitor(INTERVAL, false).await;
    tokio::time::sleep(INTERVAL * 4).await;
    let abnormal = told_once(&cluster, "data", ABNORMAL).await;
    assert_eq!(abnormal.type_.as_deref(), Some("Warning"));
    assert!(events(&cluster, "data", NORMAL).await.is_empty());

    // The data is back: one Normal Event.
    std::fs::rename(&away, &data).expect("the volume's data moved back");
    cluster.wait_for_event("data", NORMAL, RECOVERED).await;
    tokio::time::sleep(INTERVAL * 4).await;
    let recovered = told_once(&cluster, "data", NORMAL).await;
    assert_eq!(recovered.type_.as_deref(), Some("Normal"));
    told_once(&cluster, "data", ABNORMAL).await;

    monitor.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn a_v1_13_drivers_abnormal_volume_is_told_once_and_its_recovery_once() {
    abnormal_volume_is_told_once_and_its_recovery_once("health-v113", HealthApi::V1_13).await;
}

#[tokio::test]
async fn a_v1_12_drivers_abnormal_volume_is_told_once_and_its_recovery_once() {
    abnormal_volume_is_told_once_and_its_recovery_once("health-v112", HealthApi::V1_12).await;
}

/// The Ready condition's status of a node.
fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

#[tokio::test]
async fn claims_used_on_a_failed_node_are_told_once_and_told_of_its_recovery() {
    let cluster = Cluster::start("health-nodes").await;
    static_claim(&cluster, "data").await;
    let node = cluster.node("node-a");
    // It tolerates the node's taints: it stays on the failed node, as a pod of a StatefulSet
    // does until someone deletes it.
    let mut app = pod("app", &node, Some("data"), false);
    app["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    let pods = cluster.namespaced::<Pod>();
    cluster.create(&pods, app).await;
    cluster
        .wait_for(&pods, "app", "the pod on its node", |p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
        })
        .await;
    let monitor = cluster.start_health_monitor(INTERVAL, true).await;

    cluster.kubelet(&node).partition();
    let nodes = cluster.cluster_scoped::<Node>();
    let mut down = cluster
        .wait_for(&nodes, &node, "the node NotReady", |n| {
            ready_status(n).is_some_and(|s| s != "True")
        })
        .await;
    assert!(
        events(&cluster, "data", NODE_FAILED).await.is_empty(),
        "not before the grace"
    );
    // Down for ten minutes already: past the five minutes' grace.
    let ten_minutes_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(600);
    for condition in down.status.as_mut().unwrap().conditions.as_mut().unwrap() {
        if condition.type_ == "Ready" {
            condition.last_transition_time = Some(Time(ten_minutes_ago));
        }
    }
    nodes
        .replace_status(&node, &PostParams::default(), &down)
        .await
        .expect("the node's status");
    let message = cluster.wait_for_event("data", NODE_FAILED, &node).await;
    assert_eq!(
        message,
        format!(
            "Pods: [ app ] consuming PVC: data in namespace: {} are now on a failed node: {node}",
            cluster.namespace
        )
    );

    cluster.kubelet(&node).heal();
    cluster
        .wait_for_event("data", NODE_RECOVERED, &format!("Node: {node} recovered"))
        .await;
    tokio::time::sleep(INTERVAL * 4).await;
    told_once(&cluster, "data", NODE_FAILED).await;
    told_once(&cluster, "data", NODE_RECOVERED).await;

    monitor.stop().await;
    cluster.stop().await;
}

//! csi-health-monitor on a live cluster, with the reference driver serving each volume-health
//! generation (CSI v1.13's health RPCs, and v1.12's VolumeCondition, as drivers before v1.13
//! do): a bound volume whose data goes missing behind the driver's back gets one Warning
//! `VolumeConditionAbnormal` on its claim, not repeated while it stays so nor by a restarted
//! monitor, and one Normal `VolumeConditionNormal` once the data is back. With the node
//! watcher, the claim of a pod on a node NotReady past the grace gets `NodeFailed`, once, and
//! `NodeRecovered` when the node is Ready again.
//!
//! The kubelet's side (kube-sim's kubelet, as kubelets through 1.36 with the `CSIVolumeHealth`
//! gate): a running pod's volume going abnormal gets a Warning `VolumeConditionAbnormal` on the
//! pod, repeated as a count every stats period while it lasts, and the claim's abnormal gauge —
//! from drivers of the VolumeCondition generation only, as kubelet still speaks CSI v1.12.

use std::time::Duration;

use csi_health_monitor::health::{ABNORMAL, NORMAL, RECOVERED};
use csi_health_monitor::monitor::component;
use csi_health_monitor::node::{NODE_FAILED, NODE_RECOVERED};
use csi_hostpath::health::HealthApi;
use csi_suite_scenarios::fixtures::{handle_of, pod, running_pod_with_static_volume, static_claim};
use csi_suite_scenarios::{Cluster, Options, Sidecar, skip_without_root};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube_sim::roles::kubelet::{VOLUME_CONDITION_ABNORMAL, VolumeStats};
use kube_sim::roles::scheduling::node_ready_status;
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
    cluster
        .wait_for(&nodes, &node, "the node NotReady", |n| {
            node_ready_status(n).is_some_and(|s| s != "True")
        })
        .await;
    assert!(
        events(&cluster, "data", NODE_FAILED).await.is_empty(),
        "not before the grace"
    );
    // Down for ten minutes already: past the five minutes' grace. The node lifecycle
    // controller writes the status too: a conflict is read again and retried.
    let ten_minutes_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(600);
    loop {
        let mut down = nodes.get(&node).await.expect("the node");
        for condition in down.status.as_mut().unwrap().conditions.as_mut().unwrap() {
            if condition.type_ == "Ready" {
                condition.last_transition_time = Some(Time(ten_minutes_ago));
            }
        }
        match nodes
            .replace_status(&node, &PostParams::default(), &down)
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => panic!("the node's status: {error}"),
        }
    }
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

/// The kubelet's stats of the claim, once it has some.
fn kubelet_stats(cluster: &Cluster, node: &str, claim: &str) -> Option<VolumeStats> {
    cluster
        .kubelet(node)
        .volume_stats()
        .into_iter()
        .find(|s| s.persistent_volume_claim == claim && s.namespace == cluster.namespace)
}

/// A running pod whose claim `app` (1 MiB, nothing writing to it) is then filled past its
/// capacity through the pod's mount, with the kubelets' CSIVolumeHealth gate on; `None` when
/// not root (the driver mounts for real).
async fn pod_over_capacity(scenario: &str, api: HealthApi) -> Option<(Cluster, Sidecar, String)> {
    if skip_without_root() {
        return None;
    }
    let options = Options {
        volume_health: api,
        kubelet_volume_health: true,
        volume_stats_agg_period: INTERVAL,
        ..Options::default()
    };
    let cluster = Cluster::start_with(scenario, options).await;
    let attacher = cluster.start_attacher().await;
    let node = cluster.node("node-a");
    let (_, _, target) = running_pod_with_static_volume(&cluster, "app", &node, |pod| {
        pod["metadata"]["annotations"] = json!({});
    })
    .await;
    cluster
        .eventually("the kubelet's stats of the claim", || {
            kubelet_stats(&cluster, &node, "app").is_some()
        })
        .await;
    std::fs::write(target.join("fill"), vec![7u8; 2 << 20]).expect("the volume filled");
    cluster
        .eventually("the kubelet's stats of the filled volume", || {
            kubelet_stats(&cluster, &node, "app").is_some_and(|s| s.used_bytes >= 2 << 20)
        })
        .await;
    Some((cluster, attacher, target.display().to_string()))
}

async fn pod_events(cluster: &Cluster, pod: &str) -> Vec<Event> {
    events(cluster, pod, VOLUME_CONDITION_ABNORMAL).await
}

#[tokio::test]
async fn the_kubelet_tells_the_pod_of_a_v1_12_drivers_abnormal_volume_while_it_lasts() {
    let Some((cluster, attacher, target)) =
        pod_over_capacity("health-kubelet-v112", HealthApi::V1_12).await
    else {
        return;
    };
    let node = cluster.node("node-a");
    let message = cluster
        .wait_for_event("app", VOLUME_CONDITION_ABNORMAL, "Volume data: ")
        .await;
    assert!(message.contains("more than its capacity"), "{message}");
    let stats = kubelet_stats(&cluster, &node, "app").unwrap();
    assert_eq!(stats.abnormal, Some(true), "{stats:?}");
    // Told again every period while it lasts: one Event, counted.
    cluster
        .eventually_async("the Event repeated as a count", || async {
            let told = pod_events(&cluster, "app").await;
            told.len() == 1 && told[0].count.unwrap_or(0) >= 3
        })
        .await;
    let told = pod_events(&cluster, "app").await;
    assert_eq!(told[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        told[0].source.as_ref().and_then(|s| s.component.as_deref()),
        Some("kubelet")
    );
    assert_eq!(
        told[0].involved_object.kind.as_deref(),
        Some("Pod"),
        "{told:?}"
    );

    // Recovered: the gauge says so, and the pod is told nothing more.
    std::fs::remove_file(std::path::Path::new(&target).join("fill")).expect("the fill removed");
    cluster
        .eventually("the claim's gauge back to normal", || {
            kubelet_stats(&cluster, &node, "app").is_some_and(|s| s.abnormal == Some(false))
        })
        .await;
    let count = pod_events(&cluster, "app").await[0].count;
    tokio::time::sleep(INTERVAL * 6).await;
    let after = pod_events(&cluster, "app").await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].count, count, "no Event after the recovery");
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn the_kubelet_reads_no_condition_from_a_v1_13_driver() {
    let Some((cluster, attacher, _)) =
        pod_over_capacity("health-kubelet-v113", HealthApi::V1_13).await
    else {
        return;
    };
    let node = cluster.node("node-a");
    tokio::time::sleep(INTERVAL * 6).await;
    let stats = kubelet_stats(&cluster, &node, "app").unwrap();
    assert_eq!(
        stats.abnormal, None,
        "no gauge without VOLUME_CONDITION: {stats:?}"
    );
    assert!(
        pod_events(&cluster, "app").await.is_empty(),
        "kubelet speaks CSI v1.12: no condition from a v1.13 driver"
    );
    attacher.stop().await;
    cluster.stop().await;
}

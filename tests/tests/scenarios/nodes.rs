//! Node failures: a partitioned node (no heartbeats, zombie writers keep writing) is marked
//! Unknown and tainted unreachable, and recovers; a crash-looping pod; a rebooted node that
//! mounts its pods' volumes again.

use csi_suite_scenarios::fixtures::{
    file_size, is_running, pod, running_pod_with_static_volume, taint_effects,
};
use csi_suite_scenarios::{Cluster, Options, can_mount, skip_without_root};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube_sim::roles::scheduling::node_ready_status;
use serde_json::json;

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

fn two_nodes() -> Options {
    Options {
        nodes: vec!["node-a".to_string(), "node-b".to_string()],
        ..Options::default()
    }
}

#[tokio::test]
async fn node_partition_taints_unreachable_and_clears_on_recovery() {
    let cluster = Cluster::start_with("node-partition", two_nodes()).await;
    let attacher = cluster.start_attacher().await;
    // A writer that tolerates unreachable forever, so only the partition acts on it.
    let writer = if can_mount() {
        let tolerate = |pod: &mut serde_json::Value| {
            pod["spec"]["tolerations"] =
                json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]);
        };
        Some(
            running_pod_with_static_volume(&cluster, "writer", &cluster.node("node-a"), tolerate)
                .await,
        )
    } else {
        eprintln!("not root: the partition is checked without a writer pod");
        None
    };

    cluster.kubelet(&cluster.node("node-a")).partition();
    let node = cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &cluster.node("node-a"),
            "node-a tainted unreachable",
            |n| taint_effects(n, UNREACHABLE) == ["NoExecute", "NoSchedule"],
        )
        .await;
    assert_eq!(node_ready_status(&node), Some("Unknown"));
    let other = cluster
        .cluster_scoped::<Node>()
        .get(&cluster.node("node-b"))
        .await
        .unwrap();
    assert!(
        taint_effects(&other, UNREACHABLE).is_empty(),
        "the healthy node keeps heartbeating"
    );
    if let Some((_, _, target)) = &writer {
        let log = target.join("writer.log");
        let before = file_size(&log);
        cluster
            .eventually("the zombie writer still writing while partitioned", || {
                file_size(&log) > before
            })
            .await;
    }

    cluster.kubelet(&cluster.node("node-a")).heal();
    cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &cluster.node("node-a"),
            "node-a Ready and untainted again",
            |n| taint_effects(n, UNREACHABLE).is_empty() && node_ready_status(n) == Some("True"),
        )
        .await;
    if writer.is_some() {
        let pod = cluster.namespaced::<Pod>().get("writer").await.unwrap();
        assert!(
            is_running(&pod),
            "the tolerating pod survives the partition"
        );
    }
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn crash_looping_pod_reports_crash_loop_back_off() {
    let cluster = Cluster::start_with("crash-loop", two_nodes()).await;
    cluster
        .create(
            &cluster.namespaced::<Pod>(),
            pod("app", &cluster.node("node-a"), None, false),
        )
        .await;
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "app",
            "the pod Running",
            is_running,
        )
        .await;
    cluster
        .kubelet(&cluster.node("node-a"))
        .crash_loop(&cluster.namespace, "app");
    let restarts = |pod: &Pod| -> Option<i32> {
        let status = pod
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        let waiting = status.state?.waiting?.reason?;
        (waiting == "CrashLoopBackOff").then_some(status.restart_count)
    };
    let crashing = cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "app",
            "the pod in CrashLoopBackOff",
            |p| restarts(p).is_some(),
        )
        .await;
    assert!(!is_running(&crashing), "a crash-looping pod is not Ready");
    let first = restarts(&crashing).unwrap();
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "app",
            "the restart count growing",
            |p| restarts(p).is_some_and(|n| n > first),
        )
        .await;
    cluster.stop().await;
}

#[tokio::test]
async fn node_reboot_mounts_the_volumes_of_its_pods_again() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start_with("node-reboot", two_nodes()).await;
    let attacher = cluster.start_attacher().await;
    let (_, _, target) =
        running_pod_with_static_volume(&cluster, "app", &cluster.node("node-a"), |_| {}).await;
    let log = target.join("app.log");
    cluster
        .eventually("the pod writing", || file_size(&log) > 0)
        .await;
    cluster
        .kubelet(&cluster.node("node-a"))
        .reboot()
        .await
        .unwrap();
    cluster
        .eventually("the volume mounted again after the reboot", || {
            csi_grpc::mounts::is_mount_point(&target).unwrap_or(false)
        })
        .await;
    let after_reboot = file_size(&log);
    assert!(
        after_reboot > 0,
        "the data written before the reboot is still there"
    );
    cluster
        .eventually("the pod writing again", || file_size(&log) > after_reboot)
        .await;
    let pod = cluster.namespaced::<Pod>().get("app").await.unwrap();
    assert!(is_running(&pod));
    attacher.stop().await;
    cluster.stop().await;
}

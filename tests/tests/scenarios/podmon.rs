//! podmon scenarios: a failed node's protected pod is fenced, failed over and its zombie
//! cleaned up (with the data proof: no write of the zombie lands after the fence); the
//! driver's "connected" and "I/O in progress" answers stop a cleanup; a driver without the
//! extension fails over on taints alone, but one that does not answer yet holds cleanups;
//! crash-looping pods are deleted at most five times; the circuit breaker and the maintenance
//! switch hold cleanups; a driver rollout moves no Ready pod, and nothing is force-deleted
//! once the node is back; node-podmon survives a restart and a reboot mid-cleanup, and leaves
//! staged a volume an unprotected pod on the node still uses.

use std::path::PathBuf;
use std::time::Duration;

use csi_grpc::conn::CsiConnection;
use csi_proto::podmon::v1::ValidateVolumeHostConnectivityRequest;
use csi_suite_scenarios::csi_proxy::CsiProxy;
use csi_suite_scenarios::fixtures::{is_running, pod, running_pod_with_static_volume};
use csi_suite_scenarios::podmon::{
    DRIVER_POD_LABEL_KEY, PodmonController, failover_story, records_of,
};
use csi_suite_scenarios::{Cluster, Options, Sidecar, skip_without_root};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube_sim::roles::kubelet::StagingLayout;
use podmon::metrics::{FailoverResult, Sample};
use podmon::plan::{MAINTENANCE_ANNOTATION, fenced_taint_key};
use serde_json::json;

fn nodes(names: &[&str]) -> Options {
    Options {
        nodes: names.iter().map(|n| n.to_string()).collect(),
        ..Options::default()
    }
}

/// A cluster with the attacher and controller-podmon (settings changed by `change`), and a
/// protected pod `app-0` writing to a static volume on node-a; `None` (after saying why)
/// without root.
struct Scene {
    cluster: Cluster,
    attacher: Sidecar,
    controller: PodmonController,
    uid: String,
    pv: String,
    target: PathBuf,
}

async fn scene(
    name: &str,
    options: Options,
    change: impl FnOnce(&mut podmon::controller::Settings, &mut podmon::config::Tunables),
) -> Option<Scene> {
    if skip_without_root() {
        return None;
    }
    let cluster = Cluster::start_with(name, options).await;
    let csi = cluster.driver.controller.csi.clone();
    Some(scene_on(cluster, csi, change).await)
}

/// [`scene`] with controller-podmon talking to the driver through a fault-injecting proxy,
/// set up by `prepare` before controller-podmon starts.
async fn scene_with_proxy(
    name: &str,
    options: Options,
    prepare: impl FnOnce(&CsiProxy),
    change: impl FnOnce(&mut podmon::controller::Settings, &mut podmon::config::Tunables),
) -> Option<(Scene, CsiProxy)> {
    if skip_without_root() {
        return None;
    }
    let cluster = Cluster::start_with(name, options).await;
    let (proxy, through_proxy) = cluster.csi_proxy().await;
    prepare(&proxy);
    Some((scene_on(cluster, through_proxy, change).await, proxy))
}

async fn scene_on(
    cluster: Cluster,
    csi: CsiConnection,
    change: impl FnOnce(&mut podmon::controller::Settings, &mut podmon::config::Tunables),
) -> Scene {
    let attacher = cluster.start_attacher().await;
    let controller = cluster.start_podmon_controller_via(csi, change).await;
    let (pod, pv, target) =
        running_pod_with_static_volume(&cluster, "app-0", &cluster.node("node-a"), |p| {
            cluster.protect(p)
        })
        .await;
    let uid = pod.uid().unwrap();
    Scene {
        cluster,
        attacher,
        controller,
        uid,
        pv,
        target,
    }
}

/// Waits for podmon's abort of app-0's cleanup because the driver still hears node-a.
async fn aborted_as_connected(cluster: &Cluster, uid: &str) {
    cluster
        .wait_for_event(
            "app-0",
            "NodeFailure",
            &format!(
                "podmon aborted pod cleanup [{uid} {}] array connected or recent I/O",
                cluster.node("node-a")
            ),
        )
        .await;
}

/// node-a is back on both networks and app-0 Ready again where it was; then all stops.
async fn end_with_the_pod_in_place<const N: usize>(cluster: Cluster, sidecars: [Sidecar; N]) {
    cluster.recover_node(&cluster.node("node-a"));
    let pods = cluster.namespaced::<Pod>();
    cluster
        .wait_for(&pods, "app-0", "the pod Ready again in place", is_running)
        .await;
    cluster
        .delete_and_wait(&pods, "app-0", "the pod deleted")
        .await;
    stop(cluster, sidecars).await;
}

/// Stops the sidecars, then the cluster.
async fn stop<const N: usize>(cluster: Cluster, sidecars: [Sidecar; N]) {
    for sidecar in sidecars {
        sidecar.stop().await;
    }
    cluster.stop().await;
}

/// A cluster on node-a and node-b with the attacher and controller-podmon (the fixture's
/// settings); `None` (after saying why) without root.
async fn podmon_cluster(name: &str) -> Option<(Cluster, Sidecar, PodmonController)> {
    if skip_without_root() {
        return None;
    }
    let cluster = Cluster::start_with(name, nodes(&["node-a", "node-b"])).await;
    let attacher = cluster.start_attacher().await;
    let controller = cluster.start_podmon_controller(|_, _| {}).await;
    Some((cluster, attacher, controller))
}

/// Waits until the driver has reported a node disconnected more times than the loss
/// threshold, and asserts that pod `name` is still the pod `uid` (should it go, nothing
/// samples its node any more: the wait ends then too).
async fn stays_while_sampled_past_the_threshold(
    cluster: &Cluster,
    controller: &PodmonController,
    name: &str,
    uid: &str,
) {
    let pods = cluster.namespaced::<Pod>();
    let current = || async {
        let pod = pods.get_opt(name).await.unwrap();
        pod.and_then(|p| p.uid())
    };
    let threshold = u64::from(controller.live.get().loss_threshold);
    let target = controller
        .metrics
        .connectivity_samples(Sample::Disconnected)
        + threshold;
    cluster
        .eventually_async(
            "the node sampled disconnected past the threshold",
            || async {
                controller
                    .metrics
                    .connectivity_samples(Sample::Disconnected)
                    > target
                    || current().await.as_deref() != Some(uid)
            },
        )
        .await;
    assert_eq!(
        current().await.as_deref(),
        Some(uid),
        "{name} moved on connectivity samples"
    );
}

#[tokio::test]
async fn podmon_fails_over_a_failed_nodes_pod_and_no_zombie_write_lands_after_the_fence() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start_with("podmon-failover", nodes(&["node-a", "node-b"])).await;
    let attacher = cluster.start_attacher().await;
    let controller = cluster
        .start_podmon_controller(|_, t| t.skip_validation = true)
        .await;
    let node_a = cluster.start_podmon_node(&cluster.node("node-a")).await;
    let node_b = cluster.start_podmon_node(&cluster.node("node-b")).await;

    let story = failover_story(&cluster, &cluster.node("node-a"), |_| {}).await;
    assert_eq!(story.new_node, cluster.node("node-b"));
    let handle = cluster.volume_handle(&story.pv).await;
    let old_attachment = csi_kinds::kubelet_paths::attachment_name(
        &handle,
        &cluster.driver_name,
        &cluster.node("node-a"),
    );
    cluster
        .wait_gone(
            &cluster.cluster_scoped::<VolumeAttachment>(),
            &old_attachment,
            "the failed node's VolumeAttachment detached and gone",
        )
        .await;
    let uid = &story.old_uid;
    cluster
        .wait_for_event(
            "app-0",
            "NodeFailure",
            &format!(
                "podmon cleaning pod [{uid} {}] with force delete",
                cluster.node("node-a")
            ),
        )
        .await;
    assert!(
        std::fs::read_to_string(cluster.podmon_state_file(&cluster.node("node-a")))
            .unwrap()
            .contains("\"pods\": {}"),
        "node-podmon forgot the cleaned zombie"
    );
    let before = records_of(&story.log, &story.new_uid);
    cluster
        .eventually("the replacement still writing", || {
            records_of(&story.log, &story.new_uid) > before
        })
        .await;
    assert_eq!(records_of(&story.log, uid), story.zombie_records);
    cluster
        .eventually("the failover counted", || {
            controller.metrics.failovers(FailoverResult::Success) == 1
        })
        .await;
    tracing::info!(
        detect_and_fence = ?story.detect_and_fence,
        failover = ?story.failover,
        node_cleanup = ?story.node_cleanup,
        "podmon failover phases"
    );

    for sidecar in [node_a, node_b, controller.sidecar, attacher] {
        sidecar.stop().await;
    }
    cluster
        .delete_and_wait(
            &cluster.namespaced::<Pod>(),
            "app-0",
            "the replacement deleted",
        )
        .await;
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_does_not_clean_up_while_the_driver_sees_the_node_connected_or_busy() {
    let Some(Scene {
        cluster,
        attacher,
        controller,
        uid,
        pv,
        ..
    }) = scene("podmon-connected", nodes(&["node-a", "node-b"]), |_, _| {}).await
    else {
        return;
    };
    let handle = cluster.volume_handle(&pv).await;

    // Only the control plane lost the node: the driver still hears it and sees its writes.
    cluster.kubelet(&cluster.node("node-a")).partition();
    aborted_as_connected(&cluster, &uid).await;
    // Now the storage network too: the node is disconnected but the zombie's I/O is seen.
    cluster
        .driver_store()
        .set_link(&cluster.node("node-a"), false)
        .unwrap();
    let aborted = controller.metrics.failovers(FailoverResult::Aborted);
    cluster
        .eventually("more aborted attempts", || {
            controller.metrics.failovers(FailoverResult::Aborted) >= aborted + 2
        })
        .await;
    let pod = cluster.namespaced::<Pod>().get("app-0").await.unwrap();
    assert_eq!(
        pod.uid().as_deref(),
        Some(uid.as_str()),
        "the pod was not deleted"
    );
    assert!(
        !cluster.is_fenced(&handle, &cluster.node("node-a")),
        "nothing was fenced on doubt"
    );
    assert!(!cluster.podmon_tainted(&cluster.node("node-a")).await);
    assert_eq!(controller.metrics.failovers(FailoverResult::Success), 0);

    end_with_the_pod_in_place(cluster, [controller.sidecar, attacher]).await;
}

/// Puts podmon's fenced taint on `node` as anyone allowed to patch Nodes could.
async fn put_fenced_taint(cluster: &Cluster, node: &str) {
    let nodes = cluster.cluster_scoped::<Node>();
    let node = nodes.get(node).await.unwrap();
    let key = fenced_taint_key(&cluster.driver_name);
    podmon::taints::update_taints(&nodes, node, |t| {
        podmon::plan::with_taint(
            t,
            &key,
            "",
            "NoSchedule",
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ),
        )
    })
    .await
    .unwrap();
}

/// node-podmon's account may patch any Node (where no admission policy keeps it to its own):
/// a fenced taint that controller-podmon did not put there proves nothing, and never
/// overrules the driver hearing the node.
#[tokio::test]
async fn podmon_does_not_believe_a_fenced_taint_it_did_not_put_there() {
    let Some((cluster, attacher, controller)) = podmon_cluster("podmon-forged-taint").await else {
        return;
    };
    let node = cluster.node("node-a");
    let (uid, pv) = idle_protected_pod(&cluster, "app-0", &node).await;
    let handle = cluster.volume_handle(&pv).await;
    driver_sees_no_io(&cluster, &node, &handle).await;
    // Only the control plane loses the node; the driver hears it, and someone forges the taint.
    cluster.kubelet(&node).partition();
    put_fenced_taint(&cluster, &node).await;
    aborted_as_connected(&cluster, &uid).await;
    let aborted = controller.metrics.failovers(FailoverResult::Aborted);
    cluster
        .eventually("more aborted attempts with the taint there", || {
            controller.metrics.failovers(FailoverResult::Aborted) >= aborted + 2
        })
        .await;
    let pod = cluster.namespaced::<Pod>().get("app-0").await.unwrap();
    assert_eq!(
        pod.uid().as_deref(),
        Some(uid.as_str()),
        "the pod was deleted"
    );
    assert!(
        !cluster.is_fenced(&handle, &node),
        "a forged taint got the volume fenced"
    );
    assert_eq!(controller.metrics.failovers(FailoverResult::Success), 0);
    end_with_the_pod_in_place(cluster, [controller.sidecar, attacher]).await;
}

#[tokio::test]
async fn podmon_holds_cleanups_until_the_driver_says_whether_it_serves_the_extension() {
    // The driver does not answer while podmon starts: whether it serves the extension is
    // unknown, and taints alone must not decide meanwhile.
    let unavailable =
        |proxy: &CsiProxy| proxy.fail_with(Some((tonic::Code::Unavailable, "restarting")));
    let Some((
        Scene {
            cluster,
            attacher,
            controller,
            uid,
            pv,
            ..
        },
        proxy,
    )) = scene_with_proxy(
        "podmon-ext-unknown",
        nodes(&["node-a", "node-b"]),
        unavailable,
        |_, _| {},
    )
    .await
    else {
        return;
    };
    let handle = cluster.volume_handle(&pv).await;
    // Only the control plane loses node-a: the driver still hears it and sees its writes.
    cluster.kubelet(&cluster.node("node-a")).partition();
    cluster
        .wait_for_event(
            "app-0",
            "NodeFailure",
            &format!(
                "podmon held the cleanup of pod [{uid} {}]: the driver has not said yet whether it serves the podmon extension",
                cluster.node("node-a")
            ),
        )
        .await;
    controller
        .two_passes(&cluster, "podmon judged the pod again")
        .await;
    let pods = cluster.namespaced::<Pod>();
    let current = pods.get("app-0").await.unwrap();
    assert_eq!(current.uid().as_deref(), Some(uid.as_str()), "no failover");
    assert_eq!(proxy.forwarded("ControllerUnpublishVolume"), 0);
    assert!(!cluster.is_fenced(&handle, &cluster.node("node-a")));
    assert!(!cluster.podmon_tainted(&cluster.node("node-a")).await);

    // The driver answers again: podmon learns it serves the extension and asks it first.
    proxy.fail_with(None);
    aborted_as_connected(&cluster, &uid).await;
    let current = pods.get("app-0").await.unwrap();
    assert_eq!(current.uid().as_deref(), Some(uid.as_str()), "no failover");
    assert!(!cluster.is_fenced(&handle, &cluster.node("node-a")));
    assert_eq!(controller.metrics.failovers(FailoverResult::Success), 0);

    end_with_the_pod_in_place(cluster, [controller.sidecar, attacher]).await;
}

#[tokio::test]
async fn podmon_without_the_extension_fails_over_on_taints_alone() {
    let options = Options {
        podmon_extension: false,
        ..nodes(&["node-a", "node-b"])
    };
    let Some(Scene {
        cluster,
        attacher,
        controller,
        uid,
        pv,
        ..
    }) = scene("podmon-no-ext", options, |s, _| {
        s.out_of_service_taint = true
    })
    .await
    else {
        return;
    };
    let handle = cluster.volume_handle(&pv).await;
    cluster.kubelet(&cluster.node("node-a")).partition();
    cluster
        .eventually("node-a fenced from the volume", || {
            cluster.is_fenced(&handle, &cluster.node("node-a"))
        })
        .await;
    cluster
        .wait_gone(
            &cluster.namespaced::<Pod>(),
            "app-0",
            "the pod force-deleted",
        )
        .await;
    cluster
        .wait_for_event(
            "app-0",
            "NodeFailure",
            &format!("[{uid} {}] with force delete", cluster.node("node-a")),
        )
        .await;
    let node = cluster
        .cluster_scoped::<Node>()
        .get(&cluster.node("node-a"))
        .await
        .unwrap();
    assert!(
        podmon::plan::has_taint(&node, podmon::plan::OUT_OF_SERVICE_TAINT, "NoExecute"),
        "--out-of-service-taint adds node.kubernetes.io/out-of-service after fencing"
    );
    cluster
        .eventually("the failovers counted", || {
            controller.metrics.failovers(FailoverResult::Success) == 1
        })
        .await;
    controller.sidecar.stop().await;
    attacher.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_deletes_a_crash_looping_pod_at_most_five_times() {
    let cluster = Cluster::start_with("podmon-crash-loop", nodes(&["node-a"])).await;
    let controller = cluster.start_podmon_controller(|_, _| {}).await;
    let pods = cluster.namespaced::<Pod>();
    cluster
        .kubelet(&cluster.node("node-a"))
        .crash_loop(&cluster.namespace, "app-0");
    let mut uids = Vec::new();
    for _ in 0..=podmon::plan::MAX_CRASH_LOOP_DELETES {
        let mut manifest = pod("app-0", &cluster.node("node-a"), None, false);
        cluster.protect(&mut manifest);
        let created: Pod = cluster.create(&pods, manifest).await;
        uids.push(created.uid().unwrap());
        if uids.len() as u32 > podmon::plan::MAX_CRASH_LOOP_DELETES {
            break;
        }
        cluster
            .wait_gone(&pods, "app-0", "the crash-looping pod deleted")
            .await;
        cluster
            .wait_for_event(
                "app-0",
                "CrashLoopBackOff",
                &format!(
                    "podmon cleaning pod [{} {}] with delete",
                    created.uid().unwrap(),
                    cluster.node("node-a")
                ),
            )
            .await;
    }
    // The sixth incarnation crash-loops too, but podmon gave up on the pod.
    let last = uids.last().unwrap().clone();
    cluster
        .wait_for(&pods, "app-0", "the last pod crash-looping", |p| {
            podmon::plan::is_crash_looping(p)
        })
        .await;
    controller
        .two_passes(&cluster, "podmon judged the last pod")
        .await;
    let pod = pods.get("app-0").await.unwrap();
    assert_eq!(
        pod.uid().as_deref(),
        Some(last.as_str()),
        "deleted more than five times"
    );
    controller.sidecar.stop().await;
    cluster.stop().await;
}

async fn annotate(cluster: &Cluster, node: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"annotations": {MAINTENANCE_ANNOTATION: value}}});
    cluster
        .cluster_scoped::<Node>()
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn podmon_circuit_breaker_holds_a_mass_failure_and_maintenance_pauses() {
    let cluster =
        Cluster::start_with("podmon-breaker", nodes(&["node-a", "node-b", "node-c"])).await;
    let controller = cluster.start_podmon_controller(|_, _| {}).await;
    let pods = cluster.namespaced::<Pod>();
    for (name, node) in [
        ("app-a", &cluster.node("node-a")),
        ("app-b", &cluster.node("node-b")),
        ("app-c", &cluster.node("node-c")),
    ] {
        let mut manifest = pod(name, node, None, false);
        cluster.protect(&mut manifest);
        cluster.create(&pods, manifest).await;
        cluster
            .wait_for(&pods, name, "the pod Running", is_running)
            .await;
    }
    annotate(&cluster, &cluster.node("node-c"), Some("true")).await;
    // Three nodes without the driver: the breaker's base is the driver's three nodes, not the
    // cluster's six (a third of six would let both failed nodes go).
    let node_api = cluster.cluster_scoped::<Node>();
    let plain: Vec<String> = (1..=3)
        .map(|i| format!("{}-plain-{i}", cluster.node("node-a")))
        .collect();
    for name in &plain {
        cluster
            .create(&node_api, json!({"metadata": {"name": name}}))
            .await;
    }

    // Two of three nodes fail at once: a third may be evacuated, the other is held.
    cluster.kubelet(&cluster.node("node-a")).partition();
    cluster.kubelet(&cluster.node("node-b")).partition();
    cluster.kubelet(&cluster.node("node-c")).partition();
    cluster
        .eventually_async("one of the two pods force-deleted", || async {
            let a = pods.get_opt("app-a").await.unwrap().is_none();
            let b = pods.get_opt("app-b").await.unwrap().is_none();
            a != b
        })
        .await;
    let held = if pods.get_opt("app-a").await.unwrap().is_some() {
        "app-a"
    } else {
        "app-b"
    };
    cluster
        .wait_for_event(held, "NodeFailure", "circuit breaker: 1 of ")
        .await;
    cluster
        .wait_for_event(
            "app-c",
            "NodeFailure",
            "maintenance: the node is annotated for maintenance",
        )
        .await;
    controller
        .two_passes(&cluster, "podmon judged the held nodes again")
        .await;
    assert!(
        pods.get_opt(held).await.unwrap().is_some(),
        "the breaker held the second node"
    );
    assert!(
        pods.get_opt("app-c").await.unwrap().is_some(),
        "maintenance held node-c"
    );
    assert!(controller.metrics.failovers(FailoverResult::Held) >= 2);

    // The operator accepts the mass failure: both failed nodes are evacuated.
    let mut tunables = controller.live.get();
    tunables.max_evacuated_fraction = 1.0;
    tunables.maintenance = true;
    controller.live.set(tunables.clone());
    controller
        .two_passes(&cluster, "podmon judged with maintenance on")
        .await;
    assert!(
        pods.get_opt(held).await.unwrap().is_some(),
        "the global maintenance switch pauses all"
    );
    tunables.maintenance = false;
    controller.live.set(tunables);
    cluster
        .wait_gone(&pods, held, "the held pod force-deleted once allowed")
        .await;
    assert!(
        pods.get_opt("app-c").await.unwrap().is_some(),
        "the annotated node is still paused"
    );
    annotate(&cluster, &cluster.node("node-c"), None).await;
    cluster
        .wait_gone(&pods, "app-c", "node-c's pod cleaned after maintenance")
        .await;
    for node in [
        &cluster.node("node-a"),
        &cluster.node("node-b"),
        &cluster.node("node-c"),
    ] {
        let node = cluster.cluster_scoped::<Node>().get(node).await.unwrap();
        assert!(
            cluster.has_podmon_taint(&node),
            "{} tainted",
            node.name_any()
        );
    }
    cluster
        .eventually("the failovers counted", || {
            controller.metrics.failovers(FailoverResult::Success) == 3
        })
        .await;
    for name in &plain {
        node_api
            .delete(name, &Default::default())
            .await
            .unwrap_or_else(|error| panic!("deleting node {name}: {error}"));
    }
    controller.sidecar.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_node_cleanup_survives_a_node_podmon_restart_and_a_reboot() {
    let Some(Scene {
        cluster,
        attacher,
        controller,
        pv,
        target: old_target,
        ..
    }) = scene(
        "podmon-node-restart",
        // The kubelets stage as v1.19's does (the real node of `make test-node`): node-podmon
        // must unstage there, not at the newer layout's path.
        Options {
            staging_layout: StagingLayout::PvName,
            ..nodes(&["node-a", "node-b"])
        },
        |_, t| t.skip_validation = true,
    )
    .await
    else {
        return;
    };
    let node_a = cluster.start_podmon_node(&cluster.node("node-a")).await;
    cluster
        .eventually("node-podmon remembering the pod", || {
            std::fs::read_to_string(cluster.podmon_state_file(&cluster.node("node-a")))
                .is_ok_and(|s| s.contains("app-0"))
        })
        .await;
    cluster.fail_node(&cluster.node("node-a"));
    cluster
        .wait_gone(
            &cluster.namespaced::<Pod>(),
            "app-0",
            "the pod force-deleted",
        )
        .await;
    // node-podmon dies while the node is cut off and starts again with no API to list from:
    // only its persisted inventory knows the zombie.
    node_a.kill().await;
    let node_a = cluster.start_podmon_node(&cluster.node("node-a")).await;
    // kubelet stays down, so the cleanup is node-podmon's alone.
    cluster.kubelet(&cluster.node("node-a")).stop().await;
    cluster.recover_node(&cluster.node("node-a"));
    cluster
        .wait_podmon_untainted(&cluster.node("node-a"), "node-a cleaned and untainted")
        .await;
    assert!(
        !old_target.exists(),
        "the zombie's mount is cleaned by node-podmon (kubelet was down)"
    );
    let handle = cluster.volume_handle(&pv).await;
    let state = cluster.driver_store().read().expect("the driver's state");
    assert!(
        state.volumes[&handle]
            .nodes
            .get(&cluster.node("node-a"))
            .is_none_or(|used| used.staged.is_none()),
        "node-podmon unstaged the volume at the path the kubelet staged it"
    );

    // A reboot while tainted again: the new boot is noticed and the node is untainted.
    put_fenced_taint(&cluster, &cluster.node("node-a")).await;
    cluster
        .kubelet(&cluster.node("node-a"))
        .reboot()
        .await
        .unwrap();
    let boot_id = cluster.kubelet(&cluster.node("node-a")).boot_id();
    cluster
        .wait_podmon_untainted(&cluster.node("node-a"), "node-a untainted after the reboot")
        .await;
    cluster
        .eventually("the new boot recorded", || {
            std::fs::read_to_string(cluster.podmon_state_file(&cluster.node("node-a")))
                .is_ok_and(|s| s.contains(&boot_id))
        })
        .await;
    for sidecar in [node_a, controller.sidecar, attacher] {
        sidecar.stop().await;
    }
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_leader_failover_in_the_middle_of_a_cleanup_finishes_it() {
    if skip_without_root() {
        return;
    }
    let cluster = Cluster::start_with("podmon-leader", nodes(&["node-a", "node-b"])).await;
    let attacher = cluster.start_attacher().await;
    running_pod_with_static_volume(&cluster, "app-0", &cluster.node("node-a"), |p| {
        cluster.protect(p)
    })
    .await;
    let (proxy, through_proxy) = cluster.csi_proxy().await;
    let skip = |_: &mut podmon::controller::Settings, t: &mut podmon::config::Tunables| {
        t.skip_validation = true
    };
    let leader = cluster
        .start_podmon_replica("podmon-a", through_proxy, skip)
        .await;
    let lease = csi_sidecar::leader::sanitize_name(&podmon::plan::lease_name(&cluster.driver_name));
    let leases = cluster.namespaced::<k8s_openapi::api::coordination::v1::Lease>();
    let holder = |l: &k8s_openapi::api::coordination::v1::Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.clone())
    };
    cluster
        .wait_for(&leases, &lease, "podmon-a leading", |l| {
            holder(l).as_deref() == Some("podmon-a")
        })
        .await;
    let standby = cluster
        .start_podmon_replica("podmon-b", cluster.driver.controller.csi.clone(), skip)
        .await;
    // The leader's fencing call reaches the driver but its answer is held: it dies mid-cleanup.
    proxy.delay_responses(Some((
        "csi.v1.Controller/ControllerUnpublishVolume",
        std::time::Duration::from_secs(30),
    )));
    cluster.fail_node(&cluster.node("node-a"));
    cluster
        .eventually("the leader fencing", || {
            proxy.forwarded("ControllerUnpublishVolume") > 0
        })
        .await;
    assert!(
        !cluster.podmon_tainted(&cluster.node("node-a")).await,
        "the leader had not tainted yet"
    );
    leader.sidecar.kill().await;

    cluster
        .wait_for(&leases, &lease, "podmon-b leading", |l| {
            holder(l).as_deref() == Some("podmon-b")
        })
        .await;
    cluster
        .wait_gone(
            &cluster.namespaced::<Pod>(),
            "app-0",
            "the standby finished the cleanup",
        )
        .await;
    assert!(cluster.podmon_tainted(&cluster.node("node-a")).await);
    cluster
        .eventually("the standby counting its failover", || {
            standby.metrics.failovers(FailoverResult::Success) == 1
        })
        .await;
    assert_eq!(leader.metrics.failovers(FailoverResult::Success), 0);
    standby.sidecar.stop().await;
    attacher.stop().await;
    cluster.stop().await;
}

/// A protected pod `name` on `node` with a static volume it does not write to: the driver
/// sees no I/O once the volume's last write is 10 s old. Returns its UID and the PV.
async fn idle_protected_pod(cluster: &Cluster, name: &str, node: &str) -> (String, String) {
    let pv = csi_suite_scenarios::fixtures::static_claim(cluster, name).await;
    let mut manifest = pod(name, node, Some(name), false);
    cluster.protect(&mut manifest);
    let pods = cluster.namespaced::<Pod>();
    let created: Pod = cluster.create(&pods, manifest).await;
    cluster
        .wait_for(&pods, name, "the pod Running", is_running)
        .await;
    (created.uid().unwrap(), pv)
}

/// Waits until the driver sees no I/O from `node` on the volume `handle` (its last write is
/// 10 s old).
async fn driver_sees_no_io(cluster: &Cluster, node: &str, handle: &str) {
    cluster
        .eventually_async("the driver sees no I/O on the volume", || async {
            let request = ValidateVolumeHostConnectivityRequest {
                node_id: node.to_string(),
                volume_ids: vec![handle.to_string()],
                ..Default::default()
            };
            cluster
                .driver
                .controller
                .csi
                .validate_volume_host_connectivity(request, Duration::from_secs(5))
                .await
                .is_ok_and(|r| !r.ios_in_progress)
        })
        .await;
}

/// A driver node pod on `node`, labelled as podmon finds them; it tolerates podmon's taints
/// (else a restarted one could not come back).
fn driver_pod(cluster: &Cluster, name: &str, node: &str) -> serde_json::Value {
    let mut manifest = pod(name, node, None, false);
    manifest["metadata"]["labels"] = json!({DRIVER_POD_LABEL_KEY: cluster.driver_name});
    manifest["spec"]["tolerations"] = json!([{"operator": "Exists", "effect": "NoSchedule"}]);
    manifest
}

#[tokio::test]
async fn podmon_taints_a_node_whose_driver_pod_is_not_ready() {
    let cluster = Cluster::start_with("podmon-driver-pod", nodes(&["node-a", "node-b"])).await;
    let controller = cluster.start_podmon_controller(|_, _| {}).await;
    let offline = podmon::plan::offline_taint_key(&cluster.driver_name);
    let offline_on = |node: &Node| podmon::plan::has_taint(node, &offline, "NoSchedule");
    let pods = cluster.namespaced::<Pod>();
    cluster
        .create(
            &pods,
            driver_pod(&cluster, "driver-node-a", &cluster.node("node-a")),
        )
        .await;
    cluster
        .wait_for(&pods, "driver-node-a", "the driver pod Ready", is_running)
        .await;
    cluster
        .kubelet(&cluster.node("node-a"))
        .crash_loop(&cluster.namespace, "driver-node-a");
    let nodes = cluster.cluster_scoped::<Node>();
    cluster
        .wait_for(
            &nodes,
            &cluster.node("node-a"),
            "the driver-offline taint",
            offline_on,
        )
        .await;
    assert!(!offline_on(
        &nodes.get(&cluster.node("node-b")).await.unwrap()
    ));

    // A new driver pod that is Ready lifts it.
    cluster
        .delete_and_wait(&pods, "driver-node-a", "the crashing driver pod gone")
        .await;
    cluster
        .create(
            &pods,
            driver_pod(&cluster, "driver-node-a-2", &cluster.node("node-a")),
        )
        .await;
    cluster
        .wait_for(
            &nodes,
            &cluster.node("node-a"),
            "the driver-offline taint lifted",
            |n| !offline_on(n),
        )
        .await;
    controller.sidecar.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_fails_over_a_pod_whose_node_lost_its_storage_network() {
    let Some((cluster, attacher, controller)) = podmon_cluster("podmon-array-loss").await else {
        return;
    };
    let (uid, pv) = idle_protected_pod(&cluster, "app-0", &cluster.node("node-a")).await;
    // A protected pod without volumes beside it: storage connectivity is nothing to it.
    let mut manifest = pod("app-v", &cluster.node("node-a"), None, false);
    cluster.protect(&mut manifest);
    let volumeless: Pod = cluster.create(&cluster.namespaced::<Pod>(), manifest).await;
    cluster
        .wait_for(
            &cluster.namespaced::<Pod>(),
            "app-v",
            "the volumeless pod Running",
            is_running,
        )
        .await;

    // Only the storage network fails: the node stays Ready in Kubernetes.
    cluster
        .driver_store()
        .set_link(&cluster.node("node-a"), false)
        .unwrap();
    let message = cluster
        .wait_for_event("app-0", "ArrayConnectivityLoss", "with force delete")
        .await;
    assert!(message.contains(&uid), "{message}");
    cluster
        .wait_gone(
            &cluster.namespaced::<Pod>(),
            "app-0",
            "the pod force-deleted",
        )
        .await;
    assert!(cluster.podmon_tainted(&cluster.node("node-a")).await);
    let handle = cluster.volume_handle(&pv).await;
    assert!(
        !cluster.driver_store().read().unwrap().volumes[&handle]
            .published
            .contains_key(&cluster.node("node-a"))
    );
    let volumeless = volumeless.uid().unwrap();
    stays_while_sampled_past_the_threshold(&cluster, &controller, "app-v", &volumeless).await;
    controller
        .two_passes(&cluster, "podmon judged the volumeless pod")
        .await;
    let current = cluster.namespaced::<Pod>().get("app-v").await.unwrap();
    assert_eq!(current.uid(), Some(volumeless), "a volumeless pod moved");
    cluster
        .driver_store()
        .set_link(&cluster.node("node-a"), true)
        .unwrap();
    stop(cluster, [controller.sidecar, attacher]).await;
}

#[tokio::test]
async fn podmon_ignores_volumeless_pods_when_asked() {
    let cluster = Cluster::start_with("podmon-volumeless", nodes(&["node-a", "node-b"])).await;
    let controller = cluster
        .start_podmon_controller(|s, _| s.ignore_volumeless_pods = true)
        .await;
    let pods = cluster.namespaced::<Pod>();
    let mut manifest = pod("app-0", &cluster.node("node-a"), None, false);
    cluster.protect(&mut manifest);
    cluster.create(&pods, manifest).await;
    cluster
        .wait_for(&pods, "app-0", "the pod Running", is_running)
        .await;
    cluster.kubelet(&cluster.node("node-a")).partition();
    cluster
        .wait_for(
            &pods,
            "app-0",
            "the pod not Ready on the unreachable node",
            |p| !is_running(p),
        )
        .await;
    cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &cluster.node("node-a"),
            "the node tainted unreachable (what podmon acts on)",
            |n| podmon::plan::has_taint(n, "node.kubernetes.io/unreachable", "NoExecute"),
        )
        .await;
    controller
        .two_passes(&cluster, "podmon judged the pod on the unreachable node")
        .await;
    assert!(
        pods.get_opt("app-0").await.unwrap().is_some(),
        "a volumeless pod is left alone"
    );
    assert!(
        !cluster.podmon_tainted(&cluster.node("node-a")).await,
        "nothing to fence, no taint"
    );
    controller.sidecar.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn podmon_does_not_fail_over_ready_pods_during_a_driver_rollout() {
    let Some((cluster, attacher, controller)) = podmon_cluster("podmon-rollout").await else {
        return;
    };
    let pods = cluster.namespaced::<Pod>();
    let nodes = cluster.cluster_scoped::<Node>();
    let offline = podmon::plan::offline_taint_key(&cluster.driver_name);
    let offline_on = |node: &Node| podmon::plan::has_taint(node, &offline, "NoSchedule");
    // Per node: its driver pod and an idle protected pod with a volume.
    let mut apps = Vec::new();
    for (app, node) in [("app-a", "node-a"), ("app-b", "node-b")] {
        let node = cluster.node(node);
        let driver = format!("driver-{app}");
        cluster
            .create(&pods, driver_pod(&cluster, &driver, &node))
            .await;
        cluster
            .wait_for(&pods, &driver, "the driver pod Ready", is_running)
            .await;
        let (uid, pv) = idle_protected_pod(&cluster, app, &node).await;
        let handle = cluster.volume_handle(&pv).await;
        apps.push((app, uid, handle, node, driver));
    }
    // Idle as the driver sees it: Dell's rule would let a disconnected node's pods go.
    for (_, _, handle, node, _) in &apps {
        driver_sees_no_io(&cluster, node, handle).await;
    }

    // The DaemonSet replaces each node's driver pod in turn: the old one stops being Ready and
    // its plugin stops beating (the driver reports the node disconnected) for longer than the
    // loss threshold; then the new one is Ready.
    for (app, uid, _, node, driver) in &apps {
        cluster.kubelet(node).crash_loop(&cluster.namespace, driver);
        cluster
            .wait_for(&nodes, node, "the driver-offline taint", offline_on)
            .await;
        cluster.driver_store().set_link(node, false).unwrap();
        stays_while_sampled_past_the_threshold(&cluster, &controller, app, uid).await;
        cluster.driver_store().set_link(node, true).unwrap();
        cluster
            .delete_and_wait(&pods, driver, "the old driver pod gone")
            .await;
        cluster
            .create(&pods, driver_pod(&cluster, &format!("{driver}-2"), node))
            .await;
        cluster
            .wait_for(&nodes, node, "the driver-offline taint lifted", |n| {
                !offline_on(n)
            })
            .await;
    }
    controller
        .two_passes(&cluster, "podmon judged the pods after the rollout")
        .await;
    for (app, uid, handle, node, _) in &apps {
        let current = pods.get(app).await.unwrap();
        assert_eq!(current.uid().as_ref(), Some(uid), "{app} was failed over");
        assert!(
            !cluster.is_fenced(handle, node),
            "{app}'s volume was fenced"
        );
        assert!(!cluster.podmon_tainted(node).await, "{node} was tainted");
    }
    assert_eq!(controller.metrics.failovers(FailoverResult::Success), 0);
    stop(cluster, [controller.sidecar, attacher]).await;
}

#[tokio::test]
async fn podmon_does_not_force_delete_once_the_failed_node_is_back() {
    let skip = |_: &mut podmon::controller::Settings, t: &mut podmon::config::Tunables| {
        t.skip_validation = true
    };
    let Some((
        Scene {
            cluster,
            attacher,
            controller,
            uid,
            ..
        },
        proxy,
    )) = scene_with_proxy(
        "podmon-node-back",
        nodes(&["node-a", "node-b"]),
        |_| {},
        skip,
    )
    .await
    else {
        return;
    };
    // The fence reaches the driver, but podmon hears back only after the node is back.
    proxy.hold_responses("csi.v1.Controller/ControllerUnpublishVolume");
    cluster.fail_node(&cluster.node("node-a"));
    cluster
        .eventually("podmon fencing", || {
            proxy.forwarded("ControllerUnpublishVolume") > 0
        })
        .await;
    cluster.recover_node(&cluster.node("node-a"));
    cluster
        .wait_for(
            &cluster.cluster_scoped::<Node>(),
            &cluster.node("node-a"),
            "node-a Ready, no longer unreachable",
            |n| {
                podmon::plan::node_is_ready(n)
                    && !podmon::plan::has_taint(n, "node.kubernetes.io/unreachable", "NoExecute")
                    && !podmon::plan::has_taint(n, "node.kubernetes.io/unreachable", "NoSchedule")
            },
        )
        .await;
    let pods = cluster.namespaced::<Pod>();
    cluster
        .wait_for(&pods, "app-0", "the pod Ready again", is_running)
        .await;
    proxy.release_responses();
    cluster
        .wait_for_event(
            "app-0",
            "NodeFailure",
            &format!(
                "podmon aborted pod cleanup [{uid} {}] the node is no longer unreachable",
                cluster.node("node-a")
            ),
        )
        .await;
    let current = pods.get("app-0").await.unwrap();
    assert_eq!(
        current.uid().as_deref(),
        Some(uid.as_str()),
        "force-deleted on a node that is back"
    );
    assert_eq!(controller.metrics.failovers(FailoverResult::Success), 0);
    end_with_the_pod_in_place(cluster, [controller.sidecar, attacher]).await;
}

#[tokio::test]
async fn node_podmon_does_not_unstage_a_volume_an_unprotected_pod_on_the_node_still_uses() {
    let Some(Scene {
        cluster,
        attacher,
        controller,
        pv,
        ..
    }) = scene(
        "podmon-shared-volume",
        nodes(&["node-a", "node-b"]),
        |_, t| t.skip_validation = true,
    )
    .await
    else {
        return;
    };
    let node = cluster.node("node-a");
    let node_podmon = cluster.start_podmon_node(&node).await;
    // An unprotected pod on the same node with the same claim (ReadWriteOnce lets the pods of
    // one node share a volume); it rides out the failure in place, as podmon leaves it alone.
    let pods = cluster.namespaced::<Pod>();
    let mut manifest = pod("unprotected", &node, Some("app-0"), false);
    manifest["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]);
    cluster.create(&pods, manifest).await;
    cluster
        .wait_for(
            &pods,
            "unprotected",
            "the unprotected pod Running",
            is_running,
        )
        .await;
    cluster
        .eventually("node-podmon remembering the protected pod", || {
            std::fs::read_to_string(cluster.podmon_state_file(&node))
                .is_ok_and(|s| s.contains("app-0"))
        })
        .await;

    cluster.fail_node(&node);
    cluster
        .wait_gone(&pods, "app-0", "the protected pod force-deleted")
        .await;
    cluster.recover_node(&node);
    cluster
        .wait_podmon_untainted(&node, "node-a cleaned and untainted")
        .await;
    let handle = cluster.volume_handle(&pv).await;
    let staged = cluster.driver_store().read().unwrap().volumes[&handle]
        .nodes
        .get(&node)
        .and_then(|usage| usage.staged.clone());
    assert!(
        staged.is_some(),
        "node-podmon unstaged the volume the unprotected pod still uses"
    );
    assert!(pods.get_opt("unprotected").await.unwrap().is_some());
    stop(cluster, [node_podmon, controller.sidecar, attacher]).await;
}

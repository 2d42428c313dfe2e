//! The `podmon` binary as users run it, with Dell's flags, against kube-sim (through a
//! kubeconfig) and the reference driver: controller mode takes the Lease `podmon-<driver>`
//! and fails a protected pod of an unreachable node over (force delete, our taint), reading
//! its poll rate from the driver ConfigMap file; node mode then finds nothing left on the node
//! and removes the taint. Both serve /healthz and metrics; a bad flag is a usage error.

use std::process::{Command, Stdio};

use csi_hostpath::local::LocalCluster;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_sim_harness::{Running, eventually, free_address, http_get, lease_holder, spawn};
use serde_json::json;

const DRIVER: &str = "bin.podmon.test";
const TAINT: &str = "bin.podmon.storage/fenced";

fn tainted(node: &Node) -> bool {
    podmon::plan::has_taint(node, TAINT, "NoSchedule")
}

#[tokio::test(flavor = "multi_thread")]
async fn fails_over_under_its_lease_and_node_mode_untaints() {
    let root = tempfile::tempdir().unwrap();
    let (sim, kubeconfig) = kube_sim_harness::api_server_with_kubeconfig(root.path()).await;
    let client = sim.client();
    let driver = LocalCluster::start(root.path(), &["node-a"], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await
    .unwrap();
    let post = PostParams::default();
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["node-a", "node-b", "node-c"] {
        let node = json!({"metadata": {"name": name,
            "annotations": {"csi.volume.kubernetes.io/nodeid": json!({DRIVER: name}).to_string()}}});
        nodes
            .create(&post, &serde_json::from_value(node).unwrap())
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = json!({"metadata": {"name": "app-0", "labels": {"podmon.dellemc.com/driver": DRIVER}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "pause"}]}});
    pods.create(&post, &serde_json::from_value(pod).unwrap())
        .await
        .unwrap();
    let config = root.path().join("driver-config-params.yaml");
    std::fs::write(
        &config,
        "PODMON_ARRAY_CONNECTIVITY_POLL_RATE: 1\nPODMON_CONTROLLER_LOG_LEVEL: info\n",
    )
    .unwrap();

    let controller_address = free_address();
    let _controller = spawn(
        env!("CARGO_BIN_EXE_podmon"),
        [
            format!(
                "--csisock=unix:{}",
                driver.controller.endpoint.path().display()
            ),
            format!("-kubeconfig={}", kubeconfig.display()),
            "--mode=controller".to_string(),
            "--leader-election-namespace=default".to_string(),
            format!("--driver-config-params={}", config.display()),
            format!("--http-endpoint={controller_address}"),
        ],
    );
    lease_holder(&client, "podmon-bin-podmon-test").await;

    let unreachable = json!({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}});
    nodes
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(&unreachable),
        )
        .await
        .unwrap();
    eventually("the pod force-deleted", || async {
        pods.get_opt("app-0").await.ok().filter(Option::is_none)
    })
    .await;
    let node = nodes.get("node-a").await.unwrap();
    assert!(tainted(&node), "node-a carries podmon's taint");

    let (code, health) = http_get(controller_address, "/healthz/leader-election")
        .await
        .unwrap();
    assert_eq!(code, 200, "{health}");
    let (_, metrics) = http_get(controller_address, "/metrics").await.unwrap();
    for line in [
        "podmon_failover_total{result=\"success\"} 1",
        "podmon_cleanup_seconds_count 1",
        "podmon_tainted_nodes",
        "podmon_controller_passes_total",
    ] {
        assert!(
            metrics.contains(line),
            "{line} missing from the metrics:\n{metrics}"
        );
    }

    let kubelet_dir = root.path().join("kubelet/node-a");
    let node_address = free_address();
    let _node = Running(
        Command::new(env!("CARGO_BIN_EXE_podmon"))
            .arg(format!(
                "--csisock={}",
                driver.node("node-a").endpoint.path().display()
            ))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--mode=node")
            .arg("--leaderelection=false")
            .env("KUBE_NODE_NAME", "node-a")
            .arg(format!("--kubelet-dir={}", kubelet_dir.display()))
            .arg("--node-poll-interval=100ms")
            .arg(format!("--http-endpoint={node_address}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually("node mode removing the taint", || async {
        nodes.get("node-a").await.ok().filter(|n| !tainted(n))
    })
    .await;
    assert!(
        kubelet_dir
            .join("plugins")
            .join(DRIVER)
            .join("podmon-node-state.json")
            .exists()
    );
    let (code, _) = http_get(node_address, "/healthz").await.unwrap();
    assert_eq!(code, 200);
    driver.stop().await;
}

#[test]
fn a_bad_flag_is_a_usage_error() {
    let status = Command::new(env!("CARGO_BIN_EXE_podmon"))
        .arg("--mode=standby")
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));
}

//! The `csi-attacher` binary as users run it: against kube-sim (through a kubeconfig) and the
//! reference driver's controller socket, with `--leader-election` and `--http-endpoint`. It
//! takes the Lease `external-attacher-leader-<driver>`, attaches a VolumeAttachment, and serves
//! `/healthz/leader-election` and its metrics.

use csi_hostpath::local::LocalCluster;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, PostParams};
use kube_sim_harness::{eventually, free_address, http_get, lease_holder, spawn};
use serde_json::json;

const DRIVER: &str = "bin.attacher.test";
const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread")]
async fn attaches_under_its_lease_and_serves_health_and_metrics() {
    let root = tempfile::tempdir().unwrap();
    let (sim, kubeconfig) = kube_sim_harness::api_server_with_kubeconfig(root.path()).await;
    let client = sim.client();
    let driver = LocalCluster::start(root.path(), &[NODE], |config| {
        config.driver_name = DRIVER.to_string();
    })
    .await
    .unwrap();

    let volume = csi_hostpath::local::create_plain_volume(
        &driver.controller.csi,
        "vol-1",
        1 << 20,
        std::time::Duration::from_secs(30),
    )
    .await
    .unwrap();
    let post = PostParams::default();
    Api::<CSINode>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": NODE},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": DRIVER, "volumeHandle": volume.volume_id}}}))
            .unwrap(),
        )
        .await
        .unwrap();

    let address = free_address();
    let _attacher = spawn(
        env!("CARGO_BIN_EXE_csi-attacher"),
        [
            format!(
                "--csi-address={}",
                driver.controller.endpoint.path().display()
            ),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-election".to_string(),
            "--leader-election-namespace=default".to_string(),
            format!("--http-endpoint={address}"),
        ],
    );

    let holder = lease_holder(&client, "external-attacher-leader-bin-attacher-test").await;
    assert!(!holder.is_empty());

    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    attachments
        .create(&post, &serde_json::from_value(json!({"metadata": {"name": "va-1"},
            "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": "pv-1"}}}))
            .unwrap())
        .await
        .unwrap();
    let va = eventually("the VolumeAttachment attached", || async {
        attachments
            .get("va-1")
            .await
            .ok()
            .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
    })
    .await;
    assert_eq!(
        va.metadata.finalizers,
        Some(vec!["external-attacher/bin-attacher-test".to_string()])
    );

    let (code, health) = http_get(address, "/healthz/leader-election").await.unwrap();
    assert_eq!(code, 200, "{health}");
    let (_, metrics) = http_get(address, "/metrics").await.unwrap();
    for name in [
        "csi_sidecar_operations_seconds_count",
        "ControllerPublishVolume",
        "csi_attacher_pending_operations",
    ] {
        assert!(metrics.contains(name), "{name} missing from the metrics");
    }
    // client-go's queue metrics under upstream's queue names. va-1 went through its queue;
    // pv-1 goes through the PV queue when, deleted, it sheds the attacher's finalizer
    // (the API server's pv-protection finalizer keeps it).
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let attached = volumes.get("pv-1").await.unwrap().metadata.finalizers;
    assert!(
        attached.is_some_and(|f| f.contains(&"external-attacher/bin-attacher-test".to_string())),
        "the attacher's finalizer on pv-1"
    );
    attachments
        .delete("va-1", &Default::default())
        .await
        .unwrap();
    eventually("va-1 detached and gone", || async {
        attachments
            .get_opt("va-1")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    volumes.delete("pv-1", &Default::default()).await.unwrap();
    eventually("pv-1 released by the attacher", || async {
        let pv = volumes.get_opt("pv-1").await.unwrap();
        let finalizers = pv.map(|pv| pv.metadata.finalizers.unwrap_or_default());
        (!finalizers?
            .iter()
            .any(|f| f.starts_with("external-attacher/")))
        .then_some(())
    })
    .await;
    let sample = |metrics: &str, series: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse::<f64>().ok())
    };
    for queue in ["csi-attacher-va", "csi-attacher-pv"] {
        let adds = format!(r#"workqueue_adds_total{{name="{queue}"}}"#);
        let depth = format!(r#"workqueue_depth{{name="{queue}"}}"#);
        eventually(&format!("{queue} used and drained"), || async {
            let (_, metrics) = http_get(address, "/metrics").await?;
            (sample(&metrics, &adds)? >= 1.0 && sample(&metrics, &depth)? == 0.0).then_some(())
        })
        .await;
    }
    driver.stop().await;
}

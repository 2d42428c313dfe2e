//! The `csi-resizer` binary as users run it: against kube-sim (through a kubeconfig) and the
//! reference driver's controller socket, with `--leader-election` and `--http-endpoint`. It
//! takes the Lease `external-resizer-<driver>`, expands a bound claim's volume, records it on
//! the PV and the claim with upstream's Events, records an infeasible size and expands a
//! lowered request after it, and serves `/healthz` and its metrics; bad flags stop it with a
//! usage error.

use std::process::Command;

use csi_hostpath::local::LocalCluster;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_sim_harness::{eventually, free_address, http_get, lease_holder, spawn};
use serde_json::json;

const DRIVER: &str = "bin.resizer.test";
const NODE: &str = "node-a";
const MI: i64 = 1 << 20;

#[tokio::test(flavor = "multi_thread")]
async fn expands_a_claim_under_its_lease_and_serves_health_and_metrics() {
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
        MI,
        std::time::Duration::from_secs(30),
    )
    .await
    .unwrap();
    let post = PostParams::default();
    // The API server lets a claim grow only when its class allows expansion.
    Api::<StorageClass>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": "expandable"},
                "provisioner": DRIVER, "allowVolumeExpansion": true}))
            .unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = claims
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1",
                "storageClassName": "expandable",
                "resources": {"requests": {"storage": "1Mi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    claims
        .patch_status(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound", "capacity": {"storage": "1Mi"}}})),
        )
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    volumes
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                "claimRef": {"name": "data", "namespace": "default", "uid": claim.metadata.uid},
                "csi": {"driver": DRIVER, "volumeHandle": volume.volume_id}}}))
            .unwrap(),
        )
        .await
        .unwrap();

    let address = free_address();
    let _resizer = spawn(
        env!("CARGO_BIN_EXE_csi-resizer"),
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

    let holder = lease_holder(&client, "external-resizer-bin-resizer-test").await;
    assert!(!holder.is_empty());

    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}})),
        )
        .await
        .unwrap();
    eventually("the PV expanded", || async {
        let pv = volumes.get("pv-1").await.ok()?;
        let capacity = pv.spec?.capacity?.get("storage")?.0.clone();
        (capacity == "2Mi").then_some(())
    })
    .await;
    // The reference driver's directory volumes need nothing from the node.
    let claim = eventually("the claim's new capacity", || async {
        let claim = claims.get("data").await.ok()?;
        let capacity = claim
            .status
            .as_ref()?
            .capacity
            .as_ref()?
            .get("storage")?
            .0
            .clone();
        (capacity == "2Mi").then_some(claim)
    })
    .await;
    let status = claim.status.unwrap();
    assert_eq!(status.conditions, None, "the resize conditions are cleared");
    assert_eq!(
        status.allocated_resources.unwrap()["storage"].0,
        "2Mi",
        "the size in flight is recorded"
    );
    assert_eq!(status.allocated_resource_statuses, None);
    let reasons = eventually("the Events", || async {
        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let reasons: Vec<String> = events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("data"))
            .filter_map(|e| e.reason)
            .collect();
        (reasons.len() >= 2).then_some(reasons)
    })
    .await;
    assert!(reasons.iter().any(|r| r == "Resizing"), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r == "VolumeResizeSuccessful"),
        "{reasons:?}"
    );

    // More than the driver can have: infeasible, recorded; a lower request is then expanded.
    let request = |size: &'static str| {
        let claims = claims.clone();
        async move {
            claims
                .patch(
                    "data",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}})),
                )
                .await
                .unwrap();
        }
    };
    request("2Pi").await;
    let status = eventually("the infeasible expansion recorded", || async {
        let status = claims.get("data").await.ok()?.status?;
        let infeasible = status
            .allocated_resource_statuses
            .as_ref()?
            .get("storage")?
            == "ControllerResizeInfeasible";
        infeasible.then_some(status)
    })
    .await;
    let error = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "ControllerResizeError")
        .expect("a ControllerResizeError condition");
    assert!(
        error
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("OutOfRange"),
        "{error:?}"
    );
    request("3Mi").await;
    eventually("the lowered request expanded", || async {
        let status = claims.get("data").await.ok()?.status?;
        (status.capacity?.get("storage")?.0 == "3Mi"
            && status.allocated_resource_statuses.is_none())
        .then_some(())
    })
    .await;

    let (code, health) = http_get(address, "/healthz").await.unwrap();
    assert_eq!(code, 200, "{health}");
    let (_, metrics) = http_get(address, "/metrics").await.unwrap();
    for name in [
        "csi_sidecar_operations_seconds_count",
        "ControllerExpandVolume",
    ] {
        assert!(metrics.contains(name), "{name} missing from the metrics");
    }
    driver.stop().await;
}

#[test]
fn bad_flags_are_usage_errors() {
    for args in [
        &["--no-such-flag"][..],
        &["--workers=0"],
        &["--worker-threads=3"],
        &["--feature-gates=NoSuchGate=true"],
        &["--timeout=soon"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_csi-resizer"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(!output.stderr.is_empty(), "{args:?}: no message");
    }
}

#[test]
fn help_lists_upstream_flags() {
    let output = Command::new(env!("CARGO_BIN_EXE_csi-resizer"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--workers",
        "--handle-volume-inuse-error",
        "--resync-period",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

//! A missing secret and a driver that is unavailable are reported as Events, and
//! provisioning recovers once they are fixed — with one volume per PV.

use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::fixtures::{bound, claim, secret};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::json;

#[tokio::test]
async fn a_missing_secret_and_an_unavailable_driver_are_reported_then_recovered() {
    let cluster = Cluster::start("failures").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    let parameters = json!({
        "csi.storage.k8s.io/provisioner-secret-name": "late-creds",
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
    });
    let with_secret = cluster
        .storage_class("secret", "Immediate", "Delete", parameters)
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("first", &with_secret)).await;
    let message = cluster
        .wait_for_event("first", "ProvisioningFailed", "late-creds")
        .await;
    assert!(message.contains("not found"), "{message}");
    assert!(
        proxy.create_volume_requests().is_empty(),
        "no CreateVolume without its secret"
    );
    secret(&cluster, "late-creds", "pw").await;
    cluster
        .wait_for(
            &claims,
            "first",
            "the claim Bound once the secret exists",
            bound,
        )
        .await;

    proxy.fail_with(Some((tonic::Code::Unavailable, "driver restarting")));
    let plain = cluster
        .storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    cluster.create(&claims, claim("second", &plain)).await;
    let message = cluster
        .wait_for_event("second", "ProvisioningFailed", "driver restarting")
        .await;
    assert!(message.contains("Unavailable"), "{message}");
    proxy.fail_with(None);
    cluster
        .wait_for(
            &claims,
            "second",
            "the claim Bound once the driver is back",
            bound,
        )
        .await;
    let mut on_driver = cluster.driver_volumes().await;
    let mut handles: Vec<String> = cluster
        .driver_pvs()
        .await
        .into_iter()
        .filter_map(|pv| Some(pv.spec?.csi?.volume_handle))
        .collect();
    on_driver.sort();
    handles.sort();
    assert_eq!(on_driver, handles, "one volume per PV");
    provisioner.stop().await;
    cluster.stop().await;
}

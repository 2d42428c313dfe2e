//! A missing secret and a driver that is unavailable are reported as Events, and
//! provisioning recovers once they are fixed — with one volume per PV. A storage request that
//! is no size in bytes is reported, never sent to the driver.

use csi_suite_scenarios::fixtures::{bound, claim, secret};
use csi_suite_scenarios::{Cluster, report_skip};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::PostParams;
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

/// A storage request in any form the API server stores is sent to the driver in whole bytes,
/// rounded up (1126400m is 1127 bytes); one that is no size in bytes (over int64) is a
/// ProvisioningFailed Event on the claim, never a CreateVolume of 0 bytes.
#[tokio::test]
async fn storage_requests_reach_the_driver_in_bytes_or_are_reported() {
    let cluster = Cluster::start("request-bytes").await;
    let (proxy, csi) = cluster.csi_proxy().await;
    let provisioner = cluster.start_provisioner_via(csi, |_| {}).await;
    let class = cluster
        .storage_class("plain", "Immediate", "Delete", json!({}))
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    let sized = |name: &str, size: &str| {
        let mut claim = claim(name, &class);
        claim["spec"]["resources"]["requests"]["storage"] = json!(size);
        claim
    };

    let huge: PersistentVolumeClaim = csi_suite_scenarios::object(sized("huge", "1e30"));
    match claims.create(&PostParams::default(), &huge).await {
        Ok(_) => {
            let message = cluster
                .wait_for_event("huge", "ProvisioningFailed", "storage request")
                .await;
            assert!(
                message.contains("1e30") && message.contains("more than"),
                "{message}"
            );
            assert!(
                proxy.create_volume_requests().is_empty(),
                "no CreateVolume for a request over int64"
            );
        }
        Err(kube::Error::Api(status)) if status.code == 422 => report_skip(
            "storage_requests_reach_the_driver_in_bytes_or_are_reported (1e30)",
            &format!("the server refuses the request: {}", status.message),
        ),
        Err(error) => panic!("creating the claim huge: {error}"),
    }

    cluster.create(&claims, sized("milli", "1126400m")).await;
    cluster
        .wait_for(&claims, "milli", "the claim of 1126400m Bound", bound)
        .await;
    let sizes: Vec<i64> = proxy
        .create_volume_requests()
        .iter()
        .map(|r| r.capacity_range.as_ref().map_or(0, |c| c.required_bytes))
        .collect();
    assert!(!sizes.is_empty(), "the claim milli was provisioned");
    assert!(sizes.iter().all(|s| *s == 1127), "{sizes:?}");
    provisioner.stop().await;
    cluster.stop().await;
}

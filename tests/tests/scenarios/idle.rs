//! A provisioner with nothing to do stays idle: a claim that failed and was deleted leaves no
//! retry behind that wakes the controller loop over and over.

use std::time::Duration;

use csi_suite_scenarios::fixtures::claim;
use csi_suite_scenarios::{Cluster, logs, real_cluster};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::json;

/// The provisioner's trace event of every pass over its caches.
const PASS: &str = "pass over the caches";

#[tokio::test]
async fn a_failed_claim_that_was_deleted_leaves_the_provisioner_idle() {
    let logs = logs::capture("csi_provisioner::controller=trace");
    let cluster = Cluster::start("idle").await;
    let provisioner = cluster
        .start_provisioner_with(|settings| {
            settings.retry_start = Duration::from_millis(100);
            settings.retry_max = Duration::from_millis(500);
        })
        .await;
    let parameters = json!({
        "csi.storage.k8s.io/provisioner-secret-name": "never-created",
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
    });
    let class = cluster
        .storage_class("secret", "Immediate", "Delete", parameters)
        .await;
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    cluster.create(&claims, claim("doomed", &class)).await;
    cluster
        .wait_for_event("doomed", "ProvisioningFailed", "never-created")
        .await;
    cluster
        .delete_and_wait(&claims, "doomed", "the failed claim deleted")
        .await;
    // Past the last retry deadline the claim could have had (retry_max).
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Watch events and the periodic resync bring a pass now and then (more on a real cluster,
    // where other scenarios' objects change too); a loop woken again and again by the gone
    // claim's retry runs thousands of passes in these 3 s.
    let most = if real_cluster() { 300 } else { 30 };
    let before = logs.count(PASS);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let passes = logs.count(PASS) - before;
    assert!(passes < most, "{passes} passes in 3 s with nothing to do");
    provisioner.stop().await;
    cluster.stop().await;
}

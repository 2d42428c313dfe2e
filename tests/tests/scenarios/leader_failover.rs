//! Two csi-provisioner replicas under leader election: only the holder of the driver-name
//! Lease provisions; when it dies without releasing the Lease, the other takes over once the
//! Lease expires and provisions the rest. Both changes of leader are Events on the Lease.

use csi_suite_scenarios::Cluster;
use csi_suite_scenarios::csi_proxy::CsiProxy;
use csi_suite_scenarios::fixtures::{bound, claim};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::json;

async fn provision_all(cluster: &Cluster, class: &str, names: &[String]) {
    let claims = cluster.namespaced::<PersistentVolumeClaim>();
    for name in names {
        cluster.create(&claims, claim(name, class)).await;
    }
    for name in names {
        cluster
            .wait_for(&claims, name, "the claim Bound", bound)
            .await;
    }
}

/// How many distinct volumes were asked for through `proxy` (retries ask again by name).
fn volumes_asked(proxy: &CsiProxy) -> usize {
    let names: std::collections::BTreeSet<String> = proxy
        .create_volume_requests()
        .into_iter()
        .map(|r| r.name)
        .collect();
    names.len()
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

#[tokio::test]
async fn the_standby_replica_takes_over_when_the_leader_dies() {
    let cluster = Cluster::start("leader-failover").await;
    let lease_name = csi_sidecar::leader::sanitize_name(&cluster.driver_name);
    let leases = cluster.namespaced::<Lease>();
    let (proxy_a, csi_a) = cluster.csi_proxy().await;
    let (proxy_b, csi_b) = cluster.csi_proxy().await;
    let replica_a = cluster.start_provisioner_replica("replica-a", csi_a).await;
    cluster
        .wait_for(&leases, &lease_name, "replica-a leading", |l| {
            holder(l).as_deref() == Some("replica-a")
        })
        .await;
    let replica_b = cluster.start_provisioner_replica("replica-b", csi_b).await;
    let class = cluster
        .storage_class("ha", "Immediate", "Delete", json!({}))
        .await;

    let first: Vec<String> = (0..5).map(|i| format!("first-{i}")).collect();
    provision_all(&cluster, &class, &first).await;
    assert_eq!(volumes_asked(&proxy_a), first.len());
    assert!(
        proxy_b.create_volume_requests().is_empty(),
        "the standby made no CreateVolume"
    );

    replica_a.kill().await;
    let second: Vec<String> = (0..5).map(|i| format!("second-{i}")).collect();
    provision_all(&cluster, &class, &second).await;
    let lease = leases.get(&lease_name).await.unwrap();
    assert_eq!(holder(&lease).as_deref(), Some("replica-b"));
    let by_b = proxy_b.create_volume_requests();
    assert_eq!(
        by_b.len(),
        second.len(),
        "the new leader provisioned the rest"
    );
    assert_eq!(
        lease.spec.unwrap().lease_transitions,
        Some(1),
        "one change of leader"
    );
    replica_b.stop().await;

    // Each change of leader is an Event on the Lease, as the Go sidecars record it.
    let mut transitions: Vec<String> = cluster
        .events()
        .await
        .into_iter()
        .filter(|event| {
            event.involved_object.kind.as_deref() == Some("Lease")
                && event.involved_object.name.as_deref() == Some(lease_name.as_str())
                && event.reason.as_deref() == Some("LeaderElection")
        })
        .filter_map(|event| event.message)
        .collect();
    transitions.sort();
    assert_eq!(
        transitions,
        [
            "replica-a became leader",
            "replica-b became leader",
            "replica-b stopped leading"
        ]
    );
    cluster.stop().await;
}

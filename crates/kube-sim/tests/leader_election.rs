//! csi-sidecar's Lease-based leader election against kube-sim: one leader at a time,
//! failover within the lease duration, release on exit, and exit on loss.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use csi_sidecar::leader::{
    LeaderElectionConfig, LeaderElectionError, LeaderElectionTimings, LeaderStatus, run,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_sim::ApiServer;
use tokio_util::sync::CancellationToken;

const TIMINGS: LeaderElectionTimings = LeaderElectionTimings {
    lease_duration: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(1500),
    retry_period: Duration::from_millis(400),
};

fn config(identity: &str, release_on_exit: bool) -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_name: "external-attacher-leader-hostpath-csi-suite-io".into(),
        namespace: "default".into(),
        identity: identity.into(),
        event_source: format!("external-attacher-leader-hostpath.csi-suite.io/{identity}"),
        labels: [("app".to_string(), "csi".to_string())].into(),
        timings: TIMINGS,
        release_on_exit,
    }
}

struct Candidate {
    status: Arc<LeaderStatus>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), LeaderElectionError>>,
}

fn candidate(server: &ApiServer, identity: &str, release_on_exit: bool) -> Candidate {
    let status = LeaderStatus::new(TIMINGS.lease_duration);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(
        server.client(),
        config(identity, release_on_exit),
        status.clone(),
        shutdown.clone(),
        |stop: CancellationToken| async move { stop.cancelled().await },
    ));
    Candidate {
        status,
        shutdown,
        task,
    }
}

async fn wait_until(what: &str, limit: Duration, check: impl Fn() -> bool) -> Duration {
    let started = std::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

async fn lease(server: &ApiServer) -> Lease {
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    leases
        .get("external-attacher-leader-hostpath-csi-suite-io")
        .await
        .unwrap()
}

#[tokio::test]
async fn one_leader_then_failover_within_the_lease_duration() {
    let server = ApiServer::start().await.unwrap();
    let a = candidate(&server, "node-a", false);
    wait_until("a leads", Duration::from_secs(5), || a.status.is_leader()).await;
    let b = candidate(&server, "node-b", false);
    tokio::time::sleep(TIMINGS.lease_duration * 2).await;
    assert!(
        a.status.is_leader() && !b.status.is_leader(),
        "exactly one leader"
    );
    let held = lease(&server).await;
    let spec = held.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    assert_eq!(held.metadata.labels.unwrap()["app"], "csi");

    // a stops without releasing: b takes over once the lease has not been renewed for a
    // lease duration (plus a retry period and its jitter).
    a.shutdown.cancel();
    a.task.await.unwrap().unwrap();
    let took = wait_until("b leads", Duration::from_secs(6), || b.status.is_leader()).await;
    assert!(
        took >= Duration::from_millis(500),
        "b waited for the lease to expire ({took:?})"
    );
    let spec = lease(&server).await.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("node-b"));
    assert_eq!(spec.lease_transitions, Some(1));
    b.shutdown.cancel();
    b.task.await.unwrap().unwrap();

    // Each transition is an Event on the Lease, as client-go's resource lock records them.
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    let lease_events: Vec<Event> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|event| event.involved_object.kind.as_deref() == Some("Lease"))
        .collect();
    // node-a renewed for two lease durations: its last Event names the Lease as last renewed.
    let version_at = |message: &str| -> u64 {
        lease_events
            .iter()
            .find(|event| event.message.as_deref() == Some(message))
            .and_then(|event| event.involved_object.resource_version.as_deref())
            .and_then(|version| version.parse().ok())
            .unwrap_or_else(|| panic!("no Event {message:?} with a resourceVersion"))
    };
    assert!(
        version_at("node-a stopped leading") > version_at("node-a became leader"),
        "the Lease as renewed, not as acquired"
    );
    let mut seen: Vec<(String, String)> = lease_events
        .into_iter()
        .map(|event| {
            assert_eq!(event.reason.as_deref(), Some("LeaderElection"));
            assert_eq!(event.type_.as_deref(), Some("Normal"));
            assert_eq!(
                event.involved_object.name.as_deref(),
                Some("external-attacher-leader-hostpath-csi-suite-io")
            );
            let source = event.source.and_then(|s| s.component).unwrap_or_default();
            (event.message.unwrap_or_default(), source)
        })
        .collect();
    seen.sort();
    let source = |id: &str| format!("external-attacher-leader-hostpath.csi-suite.io/{id}");
    assert_eq!(
        seen,
        [
            ("node-a became leader".to_string(), source("node-a")),
            ("node-a stopped leading".to_string(), source("node-a")),
            ("node-b became leader".to_string(), source("node-b")),
            ("node-b stopped leading".to_string(), source("node-b")),
        ]
    );
}

#[tokio::test]
async fn released_lease_is_taken_at_once() {
    let server = ApiServer::start().await.unwrap();
    let a = candidate(&server, "node-a", true);
    wait_until("a leads", Duration::from_secs(5), || a.status.is_leader()).await;
    let b = candidate(&server, "node-b", true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.shutdown.cancel();
    a.task.await.unwrap().unwrap();
    assert_eq!(
        lease(&server).await.spec.unwrap().holder_identity,
        None,
        "released on exit"
    );
    // No waiting for expiry: the next retry takes it.
    wait_until("b leads", TIMINGS.lease_duration, || b.status.is_leader()).await;
    b.shutdown.cancel();
    b.task.await.unwrap().unwrap();
}

/// Lease requests by verb, from every client.
fn lease_requests(server: &ApiServer) -> BTreeMap<String, u64> {
    let mut by_verb = BTreeMap::new();
    for (key, count) in server.request_counts() {
        if key.resource == "leases" {
            *by_verb.entry(key.verb).or_default() += count;
        }
    }
    by_verb
}

/// client-go's fast path: the leader renews with one write over the Lease it last wrote, and
/// reads the Lease only when someone else wrote it meanwhile (counted as a slow path).
#[tokio::test]
async fn the_leader_renews_with_one_write_and_reads_only_after_a_foreign_write() {
    let server = ApiServer::start().await.unwrap();
    let a = candidate(&server, "node-a", false);
    let mut registry = prometheus_client::registry::Registry::default();
    a.status.register(&mut registry);
    wait_until("a leads", Duration::from_secs(5), || a.status.is_leader()).await;
    let before = lease_requests(&server);
    tokio::time::sleep(TIMINGS.retry_period * 4).await;
    let after = lease_requests(&server);
    let count = |counts: &BTreeMap<String, u64>, verb: &str| counts.get(verb).copied().unwrap_or(0);
    assert!(
        count(&after, "update") >= count(&before, "update") + 3,
        "renewals: {before:?} → {after:?}"
    );
    assert_eq!(
        count(&after, "get"),
        count(&before, "get"),
        "no reads while renewing"
    );
    let slowpath = || {
        csi_grpc::metrics::encode(&registry)
            .lines()
            .find_map(|line| line.strip_prefix("leader_election_slowpath_total{name=\"\"} "))
            .map(str::to_string)
    };
    assert_eq!(slowpath(), None);

    // Someone else writes the Lease (a label): the next renewal conflicts, reads, and renews.
    let leases: Api<Lease> = Api::namespaced(server.client(), "default");
    leases
        .patch(
            "external-attacher-leader-hostpath-csi-suite-io",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .unwrap();
    wait_until(
        "a renewal over the slow path",
        Duration::from_secs(5),
        || slowpath().as_deref() == Some("1"),
    )
    .await;
    let renewed = count(&lease_requests(&server), "get");
    assert!(
        renewed > count(&after, "get"),
        "the slow path reads the Lease"
    );
    tokio::time::sleep(TIMINGS.retry_period * 3).await;
    assert!(a.status.is_leader());
    assert_eq!(slowpath().as_deref(), Some("1"), "back on the fast path");
    assert_eq!(
        count(&lease_requests(&server), "get"),
        renewed,
        "no reads after the slow path"
    );
    a.shutdown.cancel();
    a.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn leadership_is_lost_when_renewals_fail() {
    let server = ApiServer::start().await.unwrap();
    let a = candidate(&server, "node-a", false);
    wait_until("a leads", Duration::from_secs(5), || a.status.is_leader()).await;
    // The API server refuses every Lease request from now on.
    server.faults().fail_next(
        "*",
        "leases",
        http::StatusCode::INTERNAL_SERVER_ERROR,
        usize::MAX,
        None,
    );
    let outcome = tokio::time::timeout(Duration::from_secs(10), a.task)
        .await
        .expect("run returns")
        .unwrap();
    assert!(
        matches!(outcome, Err(LeaderElectionError::Lost { .. })),
        "{outcome:?}"
    );
    assert!(!a.status.is_leader());
}

//! A controller whose cache cannot list (a 403, as from a missing RBAC verb) does not hang
//! silently: it warns, naming the resource and what the API said, and `/healthz` fails,
//! naming the cache, once the grace period for the initial lists is over.

use std::net::SocketAddr;
use std::time::Duration;

use csi_attacher::flags::AttacherArgs;
use csi_suite_scenarios::{Cluster, logs, real_cluster, report_skip};
use kube_sim::harness::{free_address, http_get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// `GET path` on the diagnostics server: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get(addr, path)
        .await
        .expect("the diagnostics server answers")
}

#[tokio::test]
async fn a_cache_that_cannot_list_is_warned_about_and_fails_healthz() {
    if real_cluster() {
        report_skip(
            "a_cache_that_cannot_list_is_warned_about_and_fails_healthz",
            "injects API faults (kube-sim only)",
        );
        return;
    }
    let logs = logs::capture("csi_sidecar::informers=warn");
    let cluster = Cluster::start("cache-sync").await;
    let sim = cluster.sim.as_ref().expect("kube-sim");
    // Only the attacher keeps a cache of CSINodes: every list of them is refused from now on.
    sim.fail_next(
        "GET",
        "csinodes",
        http::StatusCode::FORBIDDEN,
        usize::MAX,
        None,
    );

    // The attacher's /healthz, as its binary serves it, with a short grace period.
    let addr = free_address();
    let endpoint = format!("--http-endpoint={addr}");
    let args =
        csi_sidecar::flags::try_parse_from::<AttacherArgs, _, _>(["csi-attacher", &endpoint])
            .expect("attacher flags");
    let http = CancellationToken::new();
    let (_, caches) = csi_sidecar::startup::serve_http_with_caches(
        &args.sidecar,
        Registry::default(),
        Duration::from_secs(1),
        http.clone(),
    )
    .await
    .expect("the diagnostics server");
    assert_eq!(get(addr, "/healthz").await, (200, "ok".to_string()));

    let attacher = cluster
        .start_attacher_via(cluster.driver.controller.csi.clone(), |settings| {
            settings.cache_sync = caches.clone();
        })
        .await;
    cluster
        .eventually("a warning naming the resource and the API's answer", || {
            logs.lines().iter().any(|line| {
                line.starts_with("WARN")
                    && line.contains("csinodes.storage.k8s.io")
                    && line.contains("403")
                    && line.contains("injected failure")
            })
        })
        .await;
    cluster
        .eventually_async("/healthz failing once the grace period is over", || async {
            get(addr, "/healthz").await.0 == 500
        })
        .await;
    let (_, body) = get(addr, "/healthz").await;
    assert!(
        body.contains("[-]informer-sync failed") && body.contains("csinodes.storage.k8s.io"),
        "{body}"
    );
    let (status, body) = get(addr, "/healthz/informer-sync").await;
    assert_eq!(status, 500, "{body}");
    assert!(
        !body.contains("volumeattachments") && !body.contains("persistentvolumes"),
        "the caches that did list are not named: {body}"
    );

    attacher.stop().await;
    assert_eq!(
        get(addr, "/healthz").await,
        (200, "ok".to_string()),
        "a stopped controller's caches are not checked"
    );
    http.cancel();
    cluster.stop().await;
}

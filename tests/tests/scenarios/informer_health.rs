//! A controller whose cache cannot list (a 403, as from a missing RBAC verb) does not hang
//! silently: it warns, naming the resource and what the API said, and `/healthz` fails,
//! naming the cache, once the grace period for the initial lists is over. On kube-sim the 403
//! is injected; on a real cluster the attacher runs under a ServiceAccount whose role is the
//! chart's with one verb left out (issue 18, finding 11).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use csi_attacher::flags::AttacherArgs;
use csi_sidecar::informers::CacheSyncHealth;
use csi_suite_scenarios::logs::CapturedLogs;
use csi_suite_scenarios::service_accounts::skip_without_service_accounts;
use csi_suite_scenarios::{Cluster, Options, logs, rbac, report_skip};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ListParams};
use kube_sim_harness::{free_address, http_get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// `GET path` on the diagnostics server: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get(addr, path)
        .await
        .expect("the diagnostics server answers")
}

/// The attacher's diagnostics server, as its binary serves it, with a grace period of 1 s for
/// the initial lists: its address, the cache health its `/healthz` reports, and what stops it.
async fn diagnostics() -> (SocketAddr, Arc<CacheSyncHealth>, CancellationToken) {
    let addr = free_address();
    let endpoint = format!("--http-endpoint={addr}");
    let args = csi_grpc::flags::try_parse_from::<AttacherArgs, _, _>(["csi-attacher", &endpoint])
        .expect("attacher flags");
    let http = CancellationToken::new();
    let (_, caches) = csi_sidecar::startup::serve_http_with_caches(
        &args.sidecar,
        Registry::default(),
        csi_sidecar::startup::GoRegistries::ManagerThenLegacy,
        Duration::from_secs(1),
        http.clone(),
    )
    .await
    .expect("the diagnostics server");
    assert_eq!(get(addr, "/healthz").await, (200, "ok".to_string()));
    (addr, caches, http)
}

/// Waits until a warning names the CSINode cache and has every one of `said` (what the API
/// answered); then until `/healthz` at `addr` fails naming that cache, and that cache only.
async fn csinodes_reported(
    cluster: &Cluster,
    logs: &CapturedLogs,
    addr: SocketAddr,
    said: &[&str],
) {
    cluster
        .eventually("a warning naming the resource and the API's answer", || {
            logs.lines().iter().any(|line| {
                line.starts_with("WARN")
                    && line.contains("csinodes.storage.k8s.io")
                    && said.iter().all(|text| line.contains(text))
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
}

#[tokio::test]
async fn a_cache_that_cannot_list_is_warned_about_and_fails_healthz() {
    let logs = logs::capture("csi_sidecar::informers=warn");
    let cluster = Cluster::start_with("cache-sync", Options::with_api_faults()).await;
    // Only the attacher keeps a cache of CSINodes: every list of them is refused from now on.
    cluster.faults().fail_next(
        "GET",
        "csinodes",
        http::StatusCode::FORBIDDEN,
        usize::MAX,
        None,
    );

    let (addr, caches, http) = diagnostics().await;
    let attacher = cluster
        .start_attacher_via(cluster.driver.controller.csi.clone(), |settings| {
            settings.cache_sync = caches.clone();
        })
        .await;
    csinodes_reported(&cluster, &logs, addr, &["403", "injected failure"]).await;

    attacher.stop().await;
    assert_eq!(
        get(addr, "/healthz").await,
        (200, "ok".to_string()),
        "a stopped controller's caches are not checked"
    );
    http.cancel();
    cluster.stop().await;
}

/// The acceptance test of issue 18, finding 11, on a real cluster: the attacher deployed with
/// the chart's RBAC less `list` on CSINodes says so — a warning naming `csinodes` and the API
/// server's own "forbidden" message, and a failing `/healthz` — instead of hanging silently.
#[tokio::test]
async fn an_attacher_missing_list_csinodes_says_so() {
    const SCENARIO: &str = "an_attacher_missing_list_csinodes_says_so";
    if skip_without_service_accounts(SCENARIO) {
        return;
    }
    let logs = logs::capture("csi_sidecar::informers=warn");
    let options = Options {
        nodes: vec!["node-a".to_string()],
        register_driver: false,
        ..Options::default()
    };
    let cluster = Cluster::start_with("missing-verb", options).await;
    let account = "csi-attacher";
    let rules = rbac::without(
        rbac::granted(rbac::ATTACHER),
        "list",
        "storage.k8s.io",
        "csinodes",
    );
    let client = cluster
        .service_account_client(rbac::ATTACHER, account, &rules)
        .await;
    let user = format!("system:serviceaccount:{}:{account}", cluster.namespace);
    // The server must refuse the list itself, or there is nothing to report.
    match Api::<CSINode>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            assert!(status.message.contains(&user), "{}", status.message);
        }
        Ok(_) => {
            report_skip(SCENARIO, "the server does not enforce RBAC");
            cluster.stop().await;
            return;
        }
        Err(error) => panic!("listing CSINodes as {user}: {error}"),
    }

    let (addr, caches, http) = diagnostics().await;
    let attacher = cluster
        .start_attacher_as(client, cluster.driver.controller.csi.clone(), |settings| {
            settings.cache_sync = caches.clone();
        })
        .await;
    // kube-apiserver's words: `csinodes.storage.k8s.io is forbidden: User "…" cannot list
    // resource "csinodes" in API group "storage.k8s.io" at the cluster scope`.
    let forbidden = format!(r#"User "{user}" cannot list resource "csinodes""#);
    csinodes_reported(&cluster, &logs, addr, &["403", "Forbidden", &forbidden]).await;
    let warned = logs.lines();
    let others: Vec<_> = warned
        .iter()
        .filter(|line| !line.contains("csinodes"))
        .collect();
    assert!(
        others.is_empty(),
        "only the CSINode cache lacks a verb: {others:#?}"
    );

    attacher.stop().await;
    http.cancel();
    let admin = cluster.client.clone();
    let role = format!("{}-{account}", cluster.namespace);
    cluster.stop().await;
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(admin);
    assert!(
        roles
            .get_opt(&role)
            .await
            .expect("reading ClusterRoles")
            .is_none()
            && bindings
                .get_opt(&role)
                .await
                .expect("reading ClusterRoleBindings")
                .is_none(),
        "the scenario's ClusterRole and binding {role} are deleted"
    );
}

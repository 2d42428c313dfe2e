//! The fault proxy in front of an API server: kube-sim by default, the cluster of
//! `KUBE_SIM_COMPARE_KUBECONFIG` when set (as `make test-real` runs it). Through the proxy a
//! client sees the server's own answers, watches included, but for the faults a test sets:
//! failed requests, watches cut, and resumes refused as expired.

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use kube_sim::ApiServer;
use kube_sim::proxy::FaultProxy;
use kube_sim_harness::server_under_test;
use serde_json::json;

/// The upstream client, kube-sim when it is the upstream, and a namespace of the test's own.
async fn upstream(test: &str) -> (Client, Option<ApiServer>, String) {
    let (client, sim) = server_under_test().await;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let namespace = format!("{test}-{nanos:x}");
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    (client, sim, namespace)
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"key": "1"}})).unwrap()
}

#[tokio::test]
async fn the_proxy_forwards_writes_reads_and_watches() {
    let (client, _sim, namespace) = upstream("proxy-forwards").await;
    let proxy = FaultProxy::start(client.clone()).await.unwrap();
    let through = Client::try_from(proxy.config()).unwrap();
    let proxied: Api<ConfigMap> = Api::namespaced(through, &namespace);
    let direct: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);

    let created = proxied
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    assert_eq!(direct.get("a").await.unwrap().uid(), created.uid());
    let watch = proxied
        .watch(
            &WatchParams::default().timeout(30),
            &created.resource_version().unwrap(),
        )
        .await
        .unwrap();
    let mut watch = Box::pin(watch);
    let patch = json!({"data": {"key": "2"}});
    direct
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(30), watch.try_next())
        .await
        .expect("a watch event through the proxy")
        .unwrap();
    match event {
        Some(WatchEvent::Modified(changed)) => {
            assert_eq!(changed.data.unwrap()["key"], "2");
        }
        other => panic!("expected the change, got {other:?}"),
    }
    proxy.faults().cut_watches();
    let ended = tokio::time::timeout(Duration::from_secs(10), watch.try_next())
        .await
        .expect("the watch ends when cut");
    assert!(
        matches!(ended, Ok(None)),
        "no event after the cut: {ended:?}"
    );
    let missing = proxied.get("absent").await.unwrap_err();
    assert!(
        matches!(&missing, kube::Error::Api(status) if status.code == 404),
        "{missing}"
    );
    let listed = proxied.list(&Default::default()).await.unwrap();
    assert!(listed.items.iter().any(|c| c.name_any() == "a"));
    let counts = proxy.request_counts();
    let count = |verb: &str| -> u64 {
        counts
            .iter()
            .filter(|(key, _)| key.verb == verb && key.resource == "configmaps")
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(
        (count("create"), count("watch"), count("get"), count("list")),
        (1, 1, 1, 1)
    );
    Api::<Namespace>::all(client)
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_proxy_injects_faults_on_chosen_methods_and_resources() {
    let (client, _sim, namespace) = upstream("proxy-faults").await;
    let proxy = FaultProxy::start(client.clone()).await.unwrap();
    let through = Client::try_from(proxy.config()).unwrap();
    let proxied: Api<ConfigMap> = Api::namespaced(through.clone(), &namespace);
    proxied
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    proxy.faults().fail_next(
        "PATCH",
        "configmaps",
        http::StatusCode::INTERNAL_SERVER_ERROR,
        1,
        Some(2),
    );
    let path = format!("/api/v1/namespaces/{namespace}/configmaps/a");
    let patch = |value: &str| {
        http::Request::patch(path.clone())
            .header("content-type", "application/merge-patch+json")
            .body(serde_json::to_vec(&json!({"data": {"key": value}})).unwrap())
            .unwrap()
    };
    let response = through.send(patch("2").map(Into::into)).await.unwrap();
    // (A status kube::Client does not retry by itself, as it does 429, 503 and 504.)
    assert_eq!(response.status(), 500);
    assert_eq!(response.headers()["retry-after"], "2");
    // Other verbs and the next patch reach the server.
    assert_eq!(proxied.get("a").await.unwrap().data.unwrap()["key"], "1");
    let response = through.send(patch("3").map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 200);
    let direct: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    assert_eq!(direct.get("a").await.unwrap().data.unwrap()["key"], "3");
    Api::<Namespace>::all(client)
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_proxy_answers_watch_resumes_with_410_gone_when_asked() {
    let (client, _sim, namespace) = upstream("proxy-expired").await;
    let proxy = FaultProxy::start(client.clone()).await.unwrap();
    let proxied: Api<ConfigMap> =
        Api::namespaced(Client::try_from(proxy.config()).unwrap(), &namespace);
    let created = proxied
        .create(&PostParams::default(), &config_map("a"))
        .await
        .unwrap();
    let version = created.resource_version().unwrap();
    proxy.faults().expire_watch_resumes(1);
    // Only `a`: on a real server kube-controller-manager adds kube-root-ca.crt to every new
    // namespace, possibly after `a`.
    let only_a = WatchParams::default().fields("metadata.name=a");
    let watch = |version: String| {
        let only_a = only_a.clone();
        let proxied = proxied.clone();
        async move {
            let stream = proxied.watch(&only_a.timeout(5), &version).await.unwrap();
            tokio::time::timeout(Duration::from_secs(30), Box::pin(stream).try_next())
                .await
                .expect("an event or the end")
                .unwrap()
        }
    };
    match watch(version.clone()).await {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(status.message.starts_with("too old resource version: "));
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // A watch from "now" (a fresh list's state) is not a resume; the next resume is served.
    let fresh = proxied
        .watch(&only_a.clone().timeout(1), "0")
        .await
        .unwrap();
    assert!(matches!(
        Box::pin(fresh).try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    let patch = json!({"data": {"key": "2"}});
    proxied
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert!(
        matches!(watch(version).await, Some(WatchEvent::Modified(_))),
        "the fault expired after one"
    );
    Api::<Namespace>::all(client)
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
}

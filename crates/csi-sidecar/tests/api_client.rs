//! The Kubernetes client and Event recorder against a scripted HTTP server on 127.0.0.1: the
//! requests they send (method, path, body, count) and how they treat 429 and 404 answers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use csi_sidecar::events::{EventRecorder, EventType};
use csi_sidecar::flags::KubeArgs;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::Api;
use serde_json::Value;

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    body: Value,
    at: Instant,
}

type Script =
    dyn Fn(&Method, &str, usize) -> (StatusCode, Vec<(&'static str, String)>, Value) + Send + Sync;

/// Serves `script(method, path, nth request)`, recording every request.
async fn fake_apiserver(script: Arc<Script>) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    let app =
        axum::Router::new().fallback(move |method: Method, uri: Uri, _: HeaderMap, body: Bytes| {
            let log = log.clone();
            let script = script.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let nth = {
                    let mut log = log.lock().unwrap();
                    log.push(Seen {
                        method: method.clone(),
                        path: uri.path().to_string(),
                        body,
                        at: Instant::now(),
                    });
                    log.len()
                };
                let (status, headers, body) = script(&method, uri.path(), nth);
                let mut response: Response = (status, axum::Json(body)).into_response();
                for (name, value) in headers {
                    response.headers_mut().insert(name, value.parse().unwrap());
                }
                response
            }
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn kubeconfig(dir: &tempfile::TempDir, addr: SocketAddr) -> String {
    let path = dir.path().join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n    namespace: ns\n\
         current-context: c\n"
    );
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn client_for(
    addr: SocketAddr,
    qps: Option<f32>,
    burst: Option<u32>,
) -> (kube::Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let args = KubeArgs {
        kubeconfig: kubeconfig(&dir, addr),
        kube_api_qps: qps,
        kube_api_burst: burst,
    };
    (csi_sidecar::kube::client(&args).await.unwrap(), dir)
}

fn config_map(name: &str) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"}})
}

#[tokio::test]
async fn too_many_requests_is_retried_after_retry_after() {
    let script: Arc<Script> = Arc::new(|_, _, nth| {
        if nth == 1 {
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "TooManyRequests", "code": 429, "message": "too many requests"});
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "1".into())],
                status,
            )
        } else {
            (StatusCode::OK, vec![], config_map("settings"))
        }
    });
    let (addr, seen) = fake_apiserver(script).await;
    let (client, _dir) = client_for(addr, None, None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "ns");
    let got = api.get("settings").await.unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("settings"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "one 429, one retry");
    assert!(
        seen[1].at.duration_since(seen[0].at) >= Duration::from_secs(1),
        "the retry must wait for Retry-After"
    );
}

#[tokio::test]
async fn kubeconfig_selects_server_and_default_namespace() {
    let script: Arc<Script> = Arc::new(|_, _, _| (StatusCode::OK, vec![], config_map("a")));
    let (addr, seen) = fake_apiserver(script).await;
    let (client, _dir) = client_for(addr, None, None).await;
    assert_eq!(client.default_namespace(), "ns");
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    api.get("a").await.unwrap();
    assert_eq!(
        seen.lock().unwrap()[0].path,
        "/api/v1/namespaces/ns/configmaps/a"
    );
}

#[tokio::test]
async fn missing_kubeconfig_is_a_clear_error() {
    let args = KubeArgs {
        kubeconfig: "/nonexistent/kubeconfig".into(),
        kube_api_qps: None,
        kube_api_burst: None,
    };
    let Err(error) = csi_sidecar::kube::client(&args).await else {
        panic!("a missing kubeconfig must be an error");
    };
    let error = error.to_string();
    assert!(error.contains("/nonexistent/kubeconfig"), "{error}");
}

#[tokio::test]
async fn explicit_qps_paces_requests() {
    let script: Arc<Script> = Arc::new(|_, _, _| (StatusCode::OK, vec![], config_map("a")));
    let (addr, seen) = fake_apiserver(script).await;
    let (client, _dir) = client_for(addr, Some(10.0), Some(1)).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "ns");
    let started = Instant::now();
    for _ in 0..4 {
        api.get("a").await.unwrap();
    }
    // Burst 1 at 10 QPS: the 4th request may leave only 3 token intervals of 100 ms after the
    // 1st. Measured where the bucket is, at the client: the server's arrival times may bunch
    // up on a busy machine (a late 1st request, then quick ones).
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert_eq!(seen.lock().unwrap().len(), 4);
}

fn pvc_reference() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some("data".into()),
        namespace: Some("apps".into()),
        uid: Some("uid-1".into()),
        ..ObjectReference::default()
    }
}

#[tokio::test]
async fn repeated_events_are_patched_not_recreated() {
    let script: Arc<Script> = Arc::new(|method, _, _| match *method {
        Method::POST => (
            StatusCode::CREATED,
            vec![],
            serde_json::json!({"metadata": {"name": "x"}}),
        ),
        _ => (
            StatusCode::OK,
            vec![],
            serde_json::json!({"metadata": {"name": "x"}}),
        ),
    });
    let (addr, seen) = fake_apiserver(script).await;
    let (client, _dir) = client_for(addr, None, None).await;
    let recorder = EventRecorder::new(client, "external-provisioner", "node-1");
    let pvc = pvc_reference();
    recorder
        .publish(&pvc, EventType::Warning, "ProvisioningFailed", "no space")
        .await;
    recorder
        .publish(&pvc, EventType::Warning, "ProvisioningFailed", "no space")
        .await;
    recorder
        .publish(&pvc, EventType::Normal, "Provisioning", "started")
        .await;

    recorder.flush().await;
    let seen = seen.lock().unwrap();
    let calls: Vec<(Method, &str)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.path.as_str()))
        .collect();
    assert_eq!(seen.len(), 3, "no GET before writes: {calls:?}");
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].path, "/api/v1/namespaces/apps/events");
    let first = &seen[0].body;
    assert_eq!(first["reason"], "ProvisioningFailed");
    assert_eq!(first["type"], "Warning");
    assert_eq!(first["message"], "no space");
    assert_eq!(first["count"], 1);
    assert_eq!(first["involvedObject"]["name"], "data");
    assert_eq!(first["source"]["component"], "external-provisioner");
    assert_eq!(first["source"]["host"], "node-1");
    let name = first["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("data."), "{name}");

    assert_eq!(seen[1].method, Method::PATCH);
    assert_eq!(
        seen[1].path,
        format!("/api/v1/namespaces/apps/events/{name}")
    );
    assert_eq!(seen[1].body["count"], 2);
    assert_eq!(seen[2].method, Method::POST);
    assert_eq!(seen[2].body["reason"], "Provisioning");
}

#[tokio::test]
async fn expired_events_are_recreated() {
    let script: Arc<Script> = Arc::new(|method, _, _| match *method {
        Method::PATCH => (
            StatusCode::NOT_FOUND,
            vec![],
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "gone"}),
        ),
        _ => (
            StatusCode::CREATED,
            vec![],
            serde_json::json!({"metadata": {"name": "x"}}),
        ),
    });
    let (addr, seen) = fake_apiserver(script).await;
    let (client, _dir) = client_for(addr, None, None).await;
    let recorder = EventRecorder::new(client, "external-attacher", "");
    let pv = ObjectReference {
        kind: Some("PersistentVolume".into()),
        name: Some("pv-1".into()),
        ..ObjectReference::default()
    };
    recorder
        .publish(&pv, EventType::Normal, "Attached", "ok")
        .await;
    recorder
        .publish(&pv, EventType::Normal, "Attached", "ok")
        .await;
    recorder.flush().await;
    let methods: Vec<Method> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.method.clone())
        .collect();
    assert_eq!(methods, [Method::POST, Method::PATCH, Method::POST]);
    // Cluster-scoped objects get their Events in "default".
    assert_eq!(
        seen.lock().unwrap()[0].path,
        "/api/v1/namespaces/default/events"
    );
}

//! The HTTP API server: kube-apiserver's REST paths, verbs and semantics over [`Store`].

mod access_review;
pub(crate) mod admission;
mod cel;
mod create;
mod decode;
mod delete;
mod discovery;
mod go_time;
mod list;
pub(crate) mod objects;
mod openapi;
mod patch;
mod rbac_objects;
pub(crate) mod schema;
mod token_request;
mod token_review;
mod tokens;
mod update;
mod validation;
mod watch;

pub(crate) use watch::too_old as too_old_watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::conversion;
use crate::errors::ApiError;
pub use crate::faults::{Fault, Faults, RequestCounts, RequestKey};
use crate::faults::{RequestCounter, ResourcePath};
use crate::resources::{Registry, ResourceType};
use crate::roles;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{ObjectKey, Store};
use create::{bind_pod, create};
use delete::{delete, delete_collection};
use discovery::discovery;
pub use objects::{now_rfc3339, rfc3339};
use patch::{PatchRequest, patch};
use update::update;

/// The Kubernetes version kube-sim reports (the oldest the workspace's k8s-openapi supports).
pub const KUBERNETES_VERSION: (&str, &str) = ("1", "33");

/// Namespaces that exist in every cluster
/// (https://kubernetes.io/docs/concepts/overview/working-with-objects/namespaces/#initial-namespaces).
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Shared server state.
#[derive(Debug)]
pub struct Server {
    pub store: Store,
    pub registry: Registry,
    faults: Faults,
    bookmark_interval: Mutex<Duration>,
    /// Events a watcher may fall behind before it is disconnected.
    watch_buffer: Mutex<usize>,
    requests: RequestCounter,
    /// The ServiceAccount tokens issued by TokenRequests.
    tokens: tokens::Tokens,
}

/// A running server.
#[derive(Debug)]
pub struct ApiServer {
    pub addr: SocketAddr,
    pub server: Arc<Server>,
    shutdown: CancellationToken,
}

impl ApiServer {
    /// Starts a server on 127.0.0.1 (a free port) with the initial namespaces.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0").await
    }

    pub async fn start_on(address: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let addr = listener.local_addr()?;
        let server = Arc::new(Server {
            store: Store::default(),
            registry: Registry::default(),
            faults: Faults::default(),
            bookmark_interval: Mutex::new(watch::BOOKMARK_INTERVAL),
            watch_buffer: Mutex::new(crate::store::WATCH_BUFFER),
            requests: RequestCounter::default(),
            tokens: tokens::Tokens::default(),
        });
        server
            .create_initial_namespaces()
            .map_err(|e| std::io::Error::other(e.message))?;
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(server.clone());
        let shutdown = serve(listener, app, "kube-sim API server");
        Ok(Self {
            addr,
            server,
            shutdown,
        })
    }

    /// A `kube::Client` for this server.
    pub fn client(&self) -> kube::Client {
        crate::client(self.addr)
    }

    /// The server's fault injection (shared with clones of it).
    pub fn faults(&self) -> Faults {
        self.server.faults.clone()
    }

    /// How often watches that allow bookmarks get one (applies to watches opened later).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        *self
            .server
            .bookmark_interval
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = interval;
    }

    /// How many events a watcher may fall behind before it is disconnected (applies to
    /// watches opened later).
    pub fn set_watch_buffer(&self, events: usize) {
        *self
            .server
            .watch_buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = events;
    }

    /// Closes every open watch (clients must resume from their last resourceVersion).
    pub fn drop_watches(&self) {
        self.server.faults.cut_watches();
    }

    /// Simulates an API server restart that keeps its objects: open watches drop and the
    /// event history is lost, so resuming from an old resourceVersion answers 410 Gone.
    pub fn restart_keeping_state(&self) {
        self.drop_watches();
        self.server.store.compact();
    }

    /// Simulates an API server restart on an empty etcd: watches drop, every object is gone
    /// (but the built-in namespaces), resourceVersions keep increasing.
    pub fn restart_losing_state(&self) {
        self.drop_watches();
        self.server.store.wipe();
        if let Err(error) = self.server.create_initial_namespaces() {
            tracing::error!(error = %error.message, "cannot recreate the initial namespaces");
        }
    }

    /// The requests served so far (see [`RequestCounts`]).
    pub fn request_counts(&self) -> RequestCounts {
        self.server.requests.counts()
    }

    pub fn stop(&self) {
        self.drop_watches();
        self.shutdown.cancel();
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Server {
    fn create_initial_namespaces(&self) -> Result<(), ApiError> {
        let rt = self.resource("", "v1", "namespaces")?;
        let accounts = self.resource("", "v1", "serviceaccounts")?;
        let config_maps = self.resource("", "v1", "configmaps")?;
        let root_ca = roles::service_accounts::root_ca_config_map();
        for namespace in INITIAL_NAMESPACES {
            create(self, &rt, None, json!({"metadata": {"name": namespace}}))?;
            // As in a cluster whose controller manager has run: the initial namespaces have
            // their `default` ServiceAccount and the root CA ConfigMap.
            let account =
                json!({"metadata": {"name": roles::service_accounts::DEFAULT_SERVICE_ACCOUNT}});
            create(self, &accounts, Some(namespace), account)?;
            create(self, &config_maps, Some(namespace), root_ca.clone())?;
        }
        Ok(())
    }

    fn resource(&self, group: &str, version: &str, plural: &str) -> Result<ResourceType, ApiError> {
        self.registry.find(group, version, plural).ok_or_else(|| {
            ApiError::not_found(group, plural, "").with_message(format!(
                "the server could not find the requested resource ({plural}.{version}.{group})"
            ))
        })
    }

    fn bookmark_interval(&self) -> Duration {
        *self
            .bookmark_interval
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn watch_buffer(&self) -> usize {
        *self.watch_buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn watch_token(&self) -> CancellationToken {
        self.faults.watches()
    }
}

impl ApiError {
    fn with_message(mut self, message: String) -> Self {
        self.message = message;
        self
    }
}

/// What a resource path names.
#[derive(Debug)]
struct Target {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (code, axum::Json(value)).into_response()
}

async fn handle(
    State(server): State<Arc<Server>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let latency = server.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let path = uri.path().trim_end_matches('/');
    let query: HashMap<String, String> =
        serde_urlencoded::from_str(uri.query().unwrap_or_default()).unwrap_or_default();
    match discovery(&server, path) {
        Some(response) => response,
        None => match route(&server, path) {
            Ok(target) => {
                let resource = (
                    target.rt.group.as_str(),
                    target.rt.plural.as_str(),
                    target.subresource.as_deref(),
                );
                let named = target.name.is_some();
                server
                    .requests
                    .count(&method, resource, named, &headers, &query);
                if let Some(response) = server.faults.injected(&method, &target.rt.plural) {
                    return response;
                }
                if let Some(response) = server.faults.expired_resume(&query) {
                    return response;
                }
                dispatch(&server, &method, target, &headers, &query, &body)
                    .await
                    .unwrap_or_else(IntoResponse::into_response)
            }
            Err(error) => error.into_response(),
        },
    }
}

/// Serves `app` on `listener` in a task of its own until the token it returns is cancelled.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    what: &'static str,
) -> CancellationToken {
    let shutdown = CancellationToken::new();
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopping.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "{what} failed");
        }
    });
    shutdown
}

/// Resolves `/api/v1/…` and `/apis/<group>/<version>/…` resource paths
/// (https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris).
fn route(server: &Server, path: &str) -> Result<Target, ApiError> {
    let Some(ResourcePath {
        group,
        version,
        namespace,
        plural,
        name,
        subresource,
    }) = ResourcePath::parse(path)
    else {
        return Err(ApiError::not_found("", "", path)
            .with_message("the server could not find the requested resource".into()));
    };
    let (group, plural) = (group.as_str(), plural.as_str());
    let rt = server.resource(group, &version, plural)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::not_found(group, plural, "")
            .with_message(format!("{plural} is not namespaced")));
    }
    if let Some(sub) = &subresource
        && !rt.subresources.contains(sub)
    {
        return Err(
            ApiError::not_found(group, plural, name.as_deref().unwrap_or_default()).with_message(
                format!("the server could not find the requested resource ({plural}/{sub})"),
            ),
        );
    }
    Ok(Target {
        rt,
        namespace,
        name,
        subresource,
    })
}

fn key(rt: &ResourceType, namespace: Option<&str>, name: &str) -> ObjectKey {
    (
        rt.storage_key(),
        namespace.unwrap_or_default().to_string(),
        name.to_string(),
    )
}

async fn dispatch(
    server: &Arc<Server>,
    method: &Method,
    target: Target,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let Target {
        rt,
        namespace,
        name,
        subresource,
    } = target;
    let ns = namespace.as_deref();
    if rt.namespaced && ns.is_none() && !(method == Method::GET && name.is_none()) {
        return Err(ApiError::not_found(
            &rt.group,
            &rt.plural,
            name.as_deref().unwrap_or_default(),
        )
        .with_message(format!(
            "{} must be addressed within a namespace",
            rt.plural
        )));
    }
    let sub = subresource.as_deref();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // Objects are JSON here: a protobuf body (typed clients' default) is decoded first.
    let decoded;
    let body = if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        decoded =
            Bytes::from(serde_json::to_vec(&crate::protobuf::decode(body)?).unwrap_or_default());
        &decoded
    } else {
        body
    };
    // `served` is the resource as requested; `rt` the one whose storage and registry
    // semantics apply (they differ for events.k8s.io Events, stored as core Events).
    let served = rt;
    let rt = conversion::storage_type(&served);
    let out = |code: StatusCode, object: &Value| {
        json_response(code, &conversion::to_served(&served, object))
    };
    let incoming = || {
        let mut object = parse_body(body)?;
        decode::check_body(&served, &mut object)?;
        Ok::<_, ApiError>(conversion::to_storage(&served, object))
    };
    if served.create_only {
        return match *method {
            Method::POST => {
                let mut review = parse_body(body)?;
                decode::check_body(&served, &mut review)?;
                match served.kind.as_str() {
                    "TokenReview" => token_review::create(server, review),
                    kind => access_review::create(server, kind, ns, review),
                }
            }
            _ => Err(method_not_allowed()),
        };
    }
    match (method.clone(), name) {
        (_, Some(_)) if sub == Some("token") && *method != Method::POST => {
            Err(method_not_allowed())
        }
        (Method::POST, Some(name)) if sub == Some("token") => {
            token_request::create(server, ns.unwrap_or_default(), &name, body)
        }
        (Method::GET, None) if is_watch(query) => {
            watch::serve(server.clone(), served, namespace, query)
        }
        (Method::GET, None) => list::list(server, &served, ns, query).await,
        (Method::GET, Some(name)) => get(server, &rt, ns, &name).map(|o| out(StatusCode::OK, &o)),
        (Method::POST, None) => {
            create(server, &rt, ns, incoming()?).map(|o| out(StatusCode::CREATED, &o))
        }
        (Method::POST, Some(name)) if sub == Some("binding") => {
            bind_pod(server, &rt, ns, &name, parse_body(body)?)
        }
        // pods/eviction deletes with the Eviction's DeleteOptions (no PodDisruptionBudgets here;
        // pkg/registry/core/pod/storage/eviction.go).
        (Method::POST, Some(name)) if sub == Some("eviction") => {
            let eviction: Value = if body.is_empty() {
                json!({})
            } else {
                parse_body(body)?
            };
            let options = serde_json::to_vec(&eviction["deleteOptions"]).unwrap_or_default();
            let options = objects::DeleteOptions::parse(&options, query)?;
            delete(server, &rt, ns, &name, &options)?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ))
        }
        (Method::PUT, Some(name)) => {
            let body = incoming()?;
            require_custom_resource_kind(&rt, &body)?;
            update(server, &rt, ns, &name, body, sub == Some("status"))
                .map(|o| out(StatusCode::OK, &o))
        }
        (Method::PATCH, Some(name)) => {
            let request = PatchRequest {
                served: &served,
                ns,
                name: &name,
                status_only: sub == Some("status"),
                content_type,
                query,
            };
            patch(server, &request, body)
        }
        (Method::DELETE, Some(name)) => {
            let options = objects::DeleteOptions::parse(body, query)?;
            delete(server, &rt, ns, &name, &options).map(|o| out(StatusCode::OK, &o))
        }
        (Method::DELETE, None) => delete_collection(server, &served, ns, query, body),
        (method, _) => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            rt.plural
        ))),
    }
}

/// A verb the resource does not have (a review's or a TokenRequest's other than create).
fn method_not_allowed() -> ApiError {
    let mut error = ApiError::method_not_allowed(
        "the server does not allow this method on the requested resource",
    );
    error.details = Some(json!({}));
    error
}

/// Whether a GET with `query` is a watch (`watch=true` or `watch=1`).
pub(crate) fn is_watch(query: &HashMap<String, String>) -> bool {
    matches!(query.get("watch").map(String::as_str), Some("true" | "1"))
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn get(
    server: &Server,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    server
        .store
        .get(&key(rt, ns, name))
        .map(|o| (*o).clone())
        .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
}

/// Parsed list/watch filters
/// (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors,
/// https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/).
pub(crate) struct Filters {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
    kind: String,
}

impl Filters {
    fn parse(rt: &ResourceType, query: &HashMap<String, String>) -> Result<Self, ApiError> {
        // Field names differ per kind, and two groups serve a kind named Event.
        let kind = crate::selectors::qualified_kind(&rt.group, &rt.kind);
        let labels = match query.get("labelSelector").filter(|s| !s.is_empty()) {
            Some(text) => {
                Some(LabelSelector::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))?)
            }
            None => None,
        };
        let fields = match query.get("fieldSelector").filter(|s| !s.is_empty()) {
            Some(text) => {
                let selector =
                    FieldSelector::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
                let valid = if is_builtin_group(&rt.group) || rt.group.is_empty() {
                    selector.validate_for(&kind)
                } else {
                    selector.validate_for_custom_resource(rt.namespaced, &[])
                };
                valid.map_err(|e| ApiError::bad_request(e.to_string()))?;
                Some(selector)
            }
            None => None,
        };
        Ok(Self {
            labels,
            fields,
            kind,
        })
    }

    /// No selector: every object matches.
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none()
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.labels
            .as_ref()
            .is_none_or(|s| s.matches_object(object))
            && self
                .fields
                .as_ref()
                .is_none_or(|s| s.matches_object(&self.kind, object))
    }
}

/// Whether `rt` is served from a CustomResourceDefinition.
fn is_custom_resource(rt: &ResourceType) -> bool {
    !crate::resources::builtin()
        .iter()
        .any(|b| b.group == rt.group && b.plural == rt.plural)
}

/// A custom resource's body must name its kind: the API server decodes it as unstructured data,
/// which has no type to default the kind from (built-in kinds are defaulted from the path).
fn require_custom_resource_kind(rt: &ResourceType, body: &Value) -> Result<(), ApiError> {
    if !is_custom_resource(rt) || body["kind"].as_str().is_some_and(|k| !k.is_empty()) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: Object 'Kind' is missing",
        kind = rt.kind,
        version = rt.version
    )))
}

fn is_builtin_group(group: &str) -> bool {
    crate::resources::builtin().iter().any(|t| t.group == group)
}

/// The chunked body of a watch.
pub(crate) fn stream_body(
    stream: impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

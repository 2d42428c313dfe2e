//! Fault injection and request counting, shared by kube-sim's API server and by the
//! [`crate::proxy::FaultProxy`] that puts the same faults in front of a real API server: a test
//! says which requests fail (method, resource, status, how often, `Retry-After`), how slow
//! every request is, when the open watches end and whether they may resume, and reads what was
//! asked, by client, verb and resource.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use crate::errors::ApiError;

/// Injected failures, for tests of retries and backoff.
#[derive(Debug, Clone)]
pub struct Fault {
    /// HTTP method (`GET`, `POST`, …) or `*`.
    pub method: String,
    /// Resource plural (`leases`) or `*`.
    pub resource: String,
    pub status: StatusCode,
    pub remaining: usize,
    /// `Retry-After` seconds to send with it.
    pub retry_after: Option<u64>,
}

#[derive(Debug, Default)]
struct Rules {
    fail: Vec<Fault>,
    latency: Duration,
    /// Cancelled to end every open watch; replaced afterwards.
    watches: CancellationToken,
    /// How many more watches that resume from a resourceVersion get 410 Gone.
    expire_resumes: usize,
}

/// The faults of one server or proxy; clones share them.
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<Mutex<Rules>>);

impl Faults {
    /// Fails the next `count` requests matching `method` and `resource` (`*` for any).
    pub fn fail_next(
        &self,
        method: &str,
        resource: &str,
        status: StatusCode,
        count: usize,
        retry_after: Option<u64>,
    ) {
        self.rules().fail.push(Fault {
            method: method.into(),
            resource: resource.into(),
            status,
            remaining: count,
            retry_after,
        });
    }

    /// Delays every request.
    pub fn set_latency(&self, latency: Duration) {
        self.rules().latency = latency;
    }

    /// Ends every open watch (clients must resume from their last resourceVersion).
    pub fn cut_watches(&self) {
        let mut rules = self.rules();
        rules.watches.cancel();
        rules.watches = CancellationToken::new();
    }

    /// Answers the next `count` watches that resume from a resourceVersion with 410 Gone, as
    /// a server answers once that version has left its history (a restart, a compaction):
    /// their clients must list again.
    pub fn expire_watch_resumes(&self, count: usize) {
        self.rules().expire_resumes = count;
    }

    /// The failures and expired resumes asked for that have not happened yet (`PATCH
    /// leases 409 ×2`, `1 watch resume(s) to expire`): a test checks with it that its faults
    /// were met.
    pub fn unspent(&self) -> Vec<String> {
        let rules = self.rules();
        let mut unspent: Vec<String> = rules
            .fail
            .iter()
            .filter(|f| f.remaining > 0)
            .map(|f| {
                let status = f.status.as_u16();
                format!("{} {} {status} ×{}", f.method, f.resource, f.remaining)
            })
            .collect();
        if rules.expire_resumes > 0 {
            unspent.push(format!(
                "{} watch resume(s) to expire",
                rules.expire_resumes
            ));
        }
        unspent
    }

    pub(crate) fn latency(&self) -> Duration {
        self.rules().latency
    }

    /// Cancelled when the watches open now are cut.
    pub(crate) fn watches(&self) -> CancellationToken {
        self.rules().watches.clone()
    }

    /// The failure a request of `method` on `resource` gets instead of its answer, if any
    /// (and counts it against its fault).
    pub(crate) fn injected(&self, method: &Method, resource: &str) -> Option<Response> {
        let mut rules = self.rules();
        let fault = rules.fail.iter_mut().find(|f| {
            f.remaining > 0
                && (f.method == "*" || f.method == method.as_str())
                && (f.resource == "*" || f.resource == resource)
        })?;
        fault.remaining -= 1;
        let mut response = ApiError::injected(fault.status, "injected failure").into_response();
        if let Some(seconds) = fault.retry_after
            && let Ok(value) = seconds.to_string().parse()
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        Some(response)
    }

    /// The 410 Gone a watch with `query` gets instead of its events, if it resumes from a
    /// resourceVersion while [`Faults::expire_watch_resumes`] has some left.
    pub(crate) fn expired_resume(&self, query: &HashMap<String, String>) -> Option<Response> {
        let from: u64 = query
            .get("resourceVersion")
            .filter(|_| crate::apiserver::is_watch(query))?
            .parse()
            .ok()
            .filter(|&version| version != 0)?;
        let mut rules = self.rules();
        rules.expire_resumes = rules.expire_resumes.checked_sub(1)?;
        Some(crate::apiserver::too_old_watch(
            from,
            from.saturating_add(1),
        ))
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Requests served, by client (the User-Agent's program name), verb and resource — what
/// kube-apiserver's `apiserver_request_total` counts, plus who sent them.
pub type RequestCounts = BTreeMap<RequestKey, u64>;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    pub client: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group (`""` for core): with verb and resource, what an RBAC rule matches.
    pub group: String,
    /// The plural, with `/subresource` when there is one.
    pub resource: String,
}

/// The resource a request's path names (https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl ResourcePath {
    /// `/api/v1/…` or `/apis/<group>/<version>/…`, then `[namespaces/<ns>/]<plural>[/<name>[/<sub>]]`
    /// (`namespaces/<name>` itself names a namespace); `None` for discovery and other paths.
    pub fn parse(path: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match parts.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        // A namespace's own subresources follow its name, as any object's.
        let (namespace, rest) = match rest {
            ["namespaces", namespace, plural, rest @ ..]
                if !matches!(*plural, "status" | "finalize") =>
            {
                (
                    Some(namespace.to_string()),
                    &parts[parts.len() - rest.len() - 1..],
                )
            }
            _ => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        if plural.is_empty() {
            return None;
        }
        Some(Self {
            group: group.to_string(),
            version: version.to_string(),
            namespace,
            plural: plural.to_string(),
            name,
            subresource,
        })
    }
}

/// Counts requests into a shared [`RequestCounts`].
#[derive(Clone, Debug, Default)]
pub struct RequestCounter(Arc<Mutex<RequestCounts>>);

impl RequestCounter {
    /// Counts one request of `method` on `(group, plural, subresource)`, `named` when its path
    /// names an object.
    pub(crate) fn count(
        &self,
        method: &Method,
        resource: (&str, &str, Option<&str>),
        named: bool,
        headers: &HeaderMap,
        query: &HashMap<String, String>,
    ) {
        let (group, plural, subresource) = resource;
        let verb = match *method {
            Method::GET if named => "get",
            Method::GET if crate::apiserver::is_watch(query) => "watch",
            Method::GET => "list",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if named => "delete",
            Method::DELETE => "deletecollection",
            _ => "other",
        };
        let client = headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|name| !name.is_empty())
            .unwrap_or("unknown")
            .to_string();
        let resource = match subresource {
            Some(sub) => format!("{plural}/{sub}"),
            None => plural.to_string(),
        };
        let key = RequestKey {
            client,
            verb: verb.to_string(),
            group: group.to_string(),
            resource,
        };
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }

    /// The requests counted so far.
    pub fn counts(&self) -> RequestCounts {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_paths() {
        let path =
            |group: &str, ns: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>| {
                Some(ResourcePath {
                    group: group.into(),
                    version: "v1".into(),
                    namespace: ns.map(Into::into),
                    plural: plural.into(),
                    name: name.map(Into::into),
                    subresource: sub.map(Into::into),
                })
            };
        let rows = [
            ("/api/v1/nodes", path("", None, "nodes", None, None)),
            (
                "/api/v1/nodes/n1/status",
                path("", None, "nodes", Some("n1"), Some("status")),
            ),
            (
                "/api/v1/namespaces",
                path("", None, "namespaces", None, None),
            ),
            (
                "/api/v1/namespaces/ns",
                path("", None, "namespaces", Some("ns"), None),
            ),
            (
                "/api/v1/namespaces/ns/status",
                path("", None, "namespaces", Some("ns"), Some("status")),
            ),
            (
                "/api/v1/namespaces/ns/finalize",
                path("", None, "namespaces", Some("ns"), Some("finalize")),
            ),
            (
                "/api/v1/namespaces/ns/pods",
                path("", Some("ns"), "pods", None, None),
            ),
            (
                "/api/v1/namespaces/ns/pods/p/binding",
                path("", Some("ns"), "pods", Some("p"), Some("binding")),
            ),
            (
                "/apis/storage.k8s.io/v1/volumeattachments/va",
                path(
                    "storage.k8s.io",
                    None,
                    "volumeattachments",
                    Some("va"),
                    None,
                ),
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l/",
                path("coordination.k8s.io", Some("ns"), "leases", Some("l"), None),
            ),
            ("/api", None),
            ("/api/v1", None),
            ("/apis/storage.k8s.io/v1", None),
            ("/version", None),
            ("/openapi/v3", None),
        ];
        for (text, expected) in rows {
            assert_eq!(ResourcePath::parse(text), expected, "{text}");
        }
    }

    #[test]
    fn faults_match_method_and_resource_then_run_out() {
        let faults = Faults::default();
        faults.fail_next("PATCH", "persistentvolumes", StatusCode::CONFLICT, 2, None);
        faults.fail_next("*", "leases", StatusCode::TOO_MANY_REQUESTS, 1, Some(3));
        assert_eq!(
            faults.unspent(),
            ["PATCH persistentvolumes 409 ×2", "* leases 429 ×1"]
        );
        let status = |method: Method, resource: &str| {
            faults.injected(&method, resource).map(|r| {
                let retry = r
                    .headers()
                    .get(header::RETRY_AFTER)
                    .map(|v| v.to_str().unwrap().to_string());
                (r.status().as_u16(), retry)
            })
        };
        assert_eq!(status(Method::GET, "persistentvolumes"), None);
        assert_eq!(
            status(Method::PATCH, "persistentvolumes"),
            Some((409, None))
        );
        assert_eq!(
            status(Method::PATCH, "persistentvolumes"),
            Some((409, None))
        );
        assert_eq!(status(Method::PATCH, "persistentvolumes"), None);
        assert_eq!(status(Method::PUT, "leases"), Some((429, Some("3".into()))));
        assert_eq!(status(Method::PUT, "leases"), None);
        assert!(faults.unspent().is_empty());
    }

    #[test]
    fn only_watches_resuming_from_a_version_expire() {
        let faults = Faults::default();
        let query = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let resume = query(&[("watch", "true"), ("resourceVersion", "42")]);
        assert!(faults.expired_resume(&resume).is_none(), "none asked");
        faults.expire_watch_resumes(2);
        for not_a_resume in [
            query(&[("resourceVersion", "42")]),
            query(&[("watch", "true")]),
            query(&[("watch", "true"), ("resourceVersion", "0")]),
            query(&[("watch", "1"), ("resourceVersion", "x")]),
        ] {
            assert!(
                faults.expired_resume(&not_a_resume).is_none(),
                "{not_a_resume:?}"
            );
        }
        let expired = faults.expired_resume(&resume).expect("the first resume");
        assert_eq!(
            expired.status(),
            StatusCode::OK,
            "a watch's 410 is an ERROR event"
        );
        assert!(
            faults
                .expired_resume(&query(&[("watch", "1"), ("resourceVersion", "7")]))
                .is_some()
        );
        assert!(faults.expired_resume(&resume).is_none(), "two were asked");
        assert!(faults.unspent().is_empty());
    }
}

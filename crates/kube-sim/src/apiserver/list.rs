//! List: selectors, `limit`/`continue` paging over a consistent snapshot, and the
//! resourceVersion / resourceVersionMatch semantics of
//! https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-get-and-list .

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::{Filters, Server, json_response};
use crate::conversion;
use crate::errors::ApiError;
use crate::resources::ResourceType;

/// How long a list waits for a resourceVersion the server has not reached yet before
/// answering 504 (k8s.io/apiserver/pkg/storage/cacher/watch_cache.go, blockTimeout).
const FRESHNESS_TIMEOUT: Duration = Duration::from_secs(3);

/// The 410 messages of k8s.io/apiserver/pkg/storage/etcd3/store.go.
const EXPIRED: &str = "The resourceVersion for the provided list is too old.";
const INCONSISTENT_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// The state a list reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// resourceVersion unset: the most recent state (a consistent read).
    Latest,
    /// resourceVersion="0": any state; served whole like the watch cache, which ignores
    /// `limit` for it (cacher.go computeListLimit).
    Any,
    /// At least as new as the revision: the most recent state once the server has it.
    NotOlderThan(u64),
    /// Exactly the revision (410 once compacted); also a legacy paged list with a
    /// resourceVersion and no resourceVersionMatch.
    Exact(u64),
}

/// Where a continued list resumes: the snapshot revision (None: a token whose snapshot
/// expired, which continues on the latest state) and the last key returned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Continue {
    revision: Option<u64>,
    after: (String, String),
}

pub(super) async fn list(
    server: &Server,
    served: &ResourceType,
    ns: Option<&str>,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let filters = Filters::parse(served, query)?;
    let rt = conversion::storage_type(served);
    let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let param = |name: &str| {
        query
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let (read, resume) = match param("continue") {
        Some(token) => {
            // k8s.io/apiserver/pkg/storage/etcd3/store.go GetList.
            if param("resourceVersion").is_some_and(|v| v != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            validate(
                param("resourceVersion"),
                param("resourceVersionMatch"),
                param("sendInitialEvents"),
                true,
                false,
            )?;
            let resume = decode_continue(token, &rt, ns)?;
            let read = resume.revision.map_or(Read::Latest, Read::Exact);
            (read, Some(resume))
        }
        None => {
            validate(
                param("resourceVersion"),
                param("resourceVersionMatch"),
                param("sendInitialEvents"),
                false,
                false,
            )?;
            let read = read_of(
                param("resourceVersion"),
                param("resourceVersionMatch"),
                limit,
            )?;
            (read, None)
        }
    };
    let limit = if read == Read::Any { 0 } else { limit };
    let current = server.store.revision();
    let wanted = match read {
        Read::NotOlderThan(revision) | Read::Exact(revision) => revision,
        Read::Latest | Read::Any => current,
    };
    if wanted > current && !server.store.wait_for(wanted, FRESHNESS_TIMEOUT).await {
        return Err(ApiError::too_large_resource_version(
            wanted,
            server.store.revision(),
        ));
    }
    let revision = match read {
        Read::Exact(revision) => revision,
        Read::Latest | Read::Any | Read::NotOlderThan(_) => server.store.revision(),
    };
    let objects = match server.store.list_at(&rt.storage_key(), ns, revision) {
        Ok(objects) => objects,
        Err(_) => {
            return Err(match resume {
                // The continuation can go on, inconsistently, with a token for the latest
                // state (etcd3/store.go handleCompactedErrorForPaging).
                Some(resume) => ApiError::gone(INCONSISTENT_CONTINUE)
                    .with_continue(encode_continue(-1, &resume.after, &rt, ns)),
                None => ApiError::gone(EXPIRED),
            });
        }
    };
    // The snapshot is in key order: the page starts right after the continue key.
    let start = resume.map_or(0, |r| {
        let after = (r.after.0.as_str(), r.after.1.as_str());
        objects.partition_point(|o| position(o) <= after)
    });
    let candidates = &objects[start..];
    let mut matching: Vec<&Value> = Vec::new();
    let mut more = false;
    for object in candidates.iter().filter(|o| filters.matches(o)) {
        if limit > 0 && matching.len() == limit {
            more = true;
            break;
        }
        matching.push(object);
    }
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if more && let Some(last) = matching.last() {
        let snapshot = i64::try_from(revision).unwrap_or(i64::MAX);
        let (last_ns, last_name) = position(last);
        let after = (last_ns.to_string(), last_name.to_string());
        metadata["continue"] = json!(encode_continue(snapshot, &after, &rt, ns));
        // Counted only when no selector filters the list (etcd3/store.go GetList).
        if filters.is_empty() {
            metadata["remainingItemCount"] = json!(candidates.len() - matching.len());
        }
    }
    let matching: Vec<Cow<Value>> = matching
        .into_iter()
        .map(|o| conversion::to_served(served, o))
        .collect();
    let list = json!({
        "kind": format!("{}List", served.kind),
        "apiVersion": served.api_version(),
        "metadata": metadata,
        "items": matching,
    });
    Ok(json_response(StatusCode::OK, &list))
}

/// ListOptions validation (k8s.io/apimachinery/pkg/apis/meta/internalversion/validation
/// ValidateListOptions), answered as 422 on ListOptions like the list handler does. A watch may
/// ask for its initial events (`sendInitialEvents`, the streaming list of newer clients) only
/// where the WatchList feature is on: kube-sim answers as a server with it off (Kubernetes
/// 1.27 to 1.31), and such clients fall back to list and watch.
pub(super) fn validate(
    resource_version: Option<&str>,
    matching: Option<&str>,
    send_initial_events: Option<&str>,
    continued: bool,
    watch: bool,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if watch {
        if send_initial_events.is_some() {
            if matching != Some("NotOlderThan") {
                errors.push("resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".to_string());
            }
            errors.push("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled".to_string());
        }
        if let Some(matching) = matching {
            if send_initial_events.is_none() {
                errors.push("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".to_string());
            }
            if matching != "NotOlderThan" {
                errors.push(format!("resourceVersionMatch: Unsupported value: {matching:?}: supported values: \"NotOlderThan\""));
            }
            if continued {
                errors.push("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided".to_string());
            }
        }
    } else {
        if let Some(matching) = matching {
            if resource_version.is_none() {
                errors.push("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".to_string());
            }
            if continued {
                errors.push("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided".to_string());
            }
            if !matches!(matching, "Exact" | "NotOlderThan") {
                errors.push(format!("resourceVersionMatch: Unsupported value: {matching:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""));
            }
            if matching == "Exact" && resource_version == Some("0") {
                errors.push("resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".to_string());
            }
        }
        if send_initial_events.is_some() {
            errors.push(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list".to_string(),
            );
        }
    }
    match errors.as_slice() {
        [] => Ok(()),
        [one] => Err(ApiError::invalid(
            "ListOptions.meta.k8s.io",
            "",
            one.clone(),
        )),
        many => Err(ApiError::invalid(
            "ListOptions.meta.k8s.io",
            "",
            format!("[{}]", many.join(", ")),
        )),
    }
}

/// The state a list without `continue` reads (the table of the semantics page).
fn read_of(
    resource_version: Option<&str>,
    matching: Option<&str>,
    limit: usize,
) -> Result<Read, ApiError> {
    let Some(version) = resource_version else {
        return Ok(Read::Latest);
    };
    let revision: u64 = version.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "resourceVersion: Invalid value: {version:?}: invalid resource version"
        ))
    })?;
    Ok(match (revision, matching) {
        (0, _) => Read::Any,
        (_, Some("Exact")) => Read::Exact(revision),
        (_, Some(_)) => Read::NotOlderThan(revision),
        (_, None) if limit > 0 => Read::Exact(revision),
        (_, None) => Read::NotOlderThan(revision),
    })
}

/// An object's key within its resource: (namespace, name).
fn position(object: &Value) -> (&str, &str) {
    let meta = &object["metadata"];
    let text = |field: &str| meta[field].as_str().unwrap_or_default();
    (text("namespace"), text("name"))
}

/// The continue token: base64url of `{"v":"meta.k8s.io/v1","rv":…,"start":…}`, the start
/// key being the last key returned plus a NUL, relative to the list's key prefix
/// (k8s.io/apiserver/pkg/storage/continue.go EncodeContinue).
fn encode_continue(
    revision: i64,
    after: &(String, String),
    rt: &ResourceType,
    ns: Option<&str>,
) -> String {
    let relative = if rt.namespaced && ns.is_none() {
        format!("{}/{}", after.0, after.1)
    } else {
        after.1.clone()
    };
    let token = json!({"v": "meta.k8s.io/v1", "rv": revision, "start": format!("{relative}\u{0}")});
    URL_SAFE_NO_PAD.encode(token.to_string())
}

/// k8s.io/apiserver/pkg/storage/continue.go DecodeContinue; a bad token is a 400.
fn decode_continue(token: &str, rt: &ResourceType, ns: Option<&str>) -> Result<Continue, ApiError> {
    let invalid = |why: String| {
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid: {why}"
        ))
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| invalid(e.to_string()))?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if value["v"] != "meta.k8s.io/v1" {
        return Err(invalid(format!(
            "server does not recognize this encoded version {}",
            value["v"]
        )));
    }
    let revision = value["rv"].as_i64().unwrap_or(0);
    if revision == 0 {
        return Err(invalid(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into(),
        ));
    }
    let start = value["start"].as_str().unwrap_or_default();
    if start.is_empty() {
        return Err(invalid(
            "encoded start key empty (version meta.k8s.io/v1)".into(),
        ));
    }
    let key = start.strip_suffix('\u{0}').unwrap_or(start);
    let after = if rt.namespaced && ns.is_none() {
        let (namespace, name) = key
            .split_once('/')
            .ok_or_else(|| invalid(start.to_string()))?;
        (namespace.to_string(), name.to_string())
    } else {
        (ns.unwrap_or_default().to_string(), key.to_string())
    };
    Ok(Continue {
        revision: u64::try_from(revision).ok(),
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    #[test]
    fn continue_tokens_round_trip() {
        let configmaps = builtin()
            .into_iter()
            .find(|t| t.plural == "configmaps")
            .unwrap();
        let after = ("ns".to_string(), "a".to_string());
        for ns in [None, Some("ns")] {
            let token = encode_continue(42, &after, &configmaps, ns);
            let decoded = decode_continue(&token, &configmaps, ns).unwrap();
            assert_eq!(decoded.after, after);
            assert_eq!(decoded.revision, Some(42));
        }
        let latest = encode_continue(-1, &after, &configmaps, None);
        assert_eq!(
            decode_continue(&latest, &configmaps, None)
                .unwrap()
                .revision,
            None
        );
        assert_eq!(
            decode_continue("not a token", &configmaps, None)
                .unwrap_err()
                .code,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn resource_version_semantics() {
        assert_eq!(read_of(None, None, 0).unwrap(), Read::Latest);
        assert_eq!(read_of(Some("0"), None, 10).unwrap(), Read::Any);
        assert_eq!(read_of(Some("5"), None, 0).unwrap(), Read::NotOlderThan(5));
        assert_eq!(read_of(Some("5"), None, 10).unwrap(), Read::Exact(5));
        assert_eq!(
            read_of(Some("5"), Some("NotOlderThan"), 10).unwrap(),
            Read::NotOlderThan(5)
        );
        assert_eq!(
            read_of(Some("5"), Some("Exact"), 0).unwrap(),
            Read::Exact(5)
        );
        for (version, matching) in [(None, "Exact"), (Some("0"), "Exact"), (Some("5"), "Newest")] {
            let error = validate(version, Some(matching), None, false, false).unwrap_err();
            assert_eq!(
                error.code,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{version:?} {matching}"
            );
        }
    }

    /// What the v1.28 server answers (WatchList off), message for message.
    #[test]
    fn list_options_validation() {
        let message = |version, matching, initial, continued, watch| {
            validate(version, matching, initial, continued, watch)
                .err()
                .map(|error| error.message)
        };
        let prefix = "ListOptions.meta.k8s.io \"\" is invalid: ";
        let cases = [
            (
                (None, Some("NotOlderThan"), Some("true"), false, true),
                Some(
                    "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                ),
            ),
            (
                (Some("5"), Some("NotOlderThan"), None, false, true),
                Some(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ),
            ),
            (
                (None, None, Some("true"), false, true),
                Some(
                    "[resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled]",
                ),
            ),
            (
                (None, Some("Exact"), None, true, true),
                Some(
                    "[resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\", resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided]",
                ),
            ),
            (
                (None, None, Some("true"), false, false),
                Some("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"),
            ),
            (
                (None, Some("Exact"), None, false, false),
                Some(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                ),
            ),
            ((Some("5"), None, None, false, true), None),
            ((Some("5"), Some("Exact"), None, false, false), None),
        ];
        for ((version, matching, initial, continued, watch), expected) in cases {
            assert_eq!(
                message(version, matching, initial, continued, watch),
                expected.map(|e| format!("{prefix}{e}")),
                "{version:?} {matching:?} {initial:?} continue={continued} watch={watch}"
            );
        }
    }
}

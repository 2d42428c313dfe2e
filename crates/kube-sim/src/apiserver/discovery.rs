//! `/version`, health endpoints and API discovery documents.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{KUBERNETES_VERSION, Server, json_response, openapi};
use crate::resources::ResourceType;

/// `/version`, health endpoints and API discovery
/// (https://kubernetes.io/docs/concepts/overview/kubernetes-api/#discovery-api,
/// https://kubernetes.io/docs/reference/using-api/health-checks/).
pub(super) fn discovery(server: &Server, path: &str) -> Option<Response> {
    let all = server.registry.all();
    let value = match path {
        "/healthz" | "/readyz" | "/livez" => return Some((StatusCode::OK, "ok").into_response()),
        _ if path.starts_with("/openapi/v3") => openapi::document(path, &all)?,
        "/version" => json!({
            "major": KUBERNETES_VERSION.0,
            "minor": KUBERNETES_VERSION.1,
            "gitVersion": format!("v{}.{}.0-kube-sim", KUBERNETES_VERSION.0, KUBERNETES_VERSION.1),
            "platform": "linux/amd64",
        }),
        "/api" => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        }
        "/apis" => {
            let mut groups: Vec<(String, Vec<String>)> = Vec::new();
            for rt in all.iter().filter(|t| !t.group.is_empty()) {
                match groups.iter_mut().find(|(g, _)| *g == rt.group) {
                    Some((_, versions)) if !versions.contains(&rt.version) => {
                        versions.push(rt.version.clone())
                    }
                    Some(_) => {}
                    None => groups.push((rt.group.clone(), vec![rt.version.clone()])),
                }
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(group, versions)| api_group(&group, &versions))
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        _ => {
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let (group, version) = match parts.as_slice() {
                ["api", version] => ("", *version),
                ["apis", group, version] => (*group, *version),
                ["apis", group] => {
                    let versions: Vec<String> = all
                        .iter()
                        .filter(|t| t.group == *group)
                        .map(|t| t.version.clone())
                        .collect();
                    if versions.is_empty() {
                        return None;
                    }
                    return Some(json_response(StatusCode::OK, &api_group(group, &versions)));
                }
                _ => return None,
            };
            let resources: Vec<Value> = all
                .iter()
                .filter(|t| t.group == group && t.version == version)
                .flat_map(ResourceType::discovery)
                .collect();
            if resources.is_empty() {
                return None;
            }
            let group_version = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
        }
    };
    Some(json_response(StatusCode::OK, &value))
}

fn api_group(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions, "preferredVersion": versions[0]})
}

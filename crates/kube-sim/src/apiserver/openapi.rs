//! OpenAPI v3 discovery: `/openapi/v3` lists one document per served group-version, and each
//! document has the paths and operations of that group-version's resources
//! (k8s.io/kube-openapi/pkg/handler3). The operations carry what clients look up in them:
//! `x-kubernetes-group-version-kind` and the query parameters, among them `fieldValidation`,
//! which is how kubectl learns that the server validates fields itself and so needs no
//! schema download (k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go). Component
//! schemas are not published: kube-sim does not validate objects against schemas.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use super::KUBERNETES_VERSION;
use crate::resources::ResourceType;

/// `api/v1` or `apis/<group>/<version>`: a group-version's key in `/openapi/v3`.
fn api_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The body of `/openapi/v3` or of `/openapi/v3/<group-version path>`, if `path` is one.
pub(super) fn document(path: &str, types: &[ResourceType]) -> Option<Value> {
    let mut by_gv: BTreeMap<String, Vec<&ResourceType>> = BTreeMap::new();
    for rt in types {
        by_gv
            .entry(api_path(&rt.group, &rt.version))
            .or_default()
            .push(rt);
    }
    if path == "/openapi/v3" {
        let paths: Map<String, Value> = by_gv
            .iter()
            .map(|(gv, types)| {
                let url = format!("/openapi/v3/{gv}?hash={}", hash(&group_version(types)));
                (gv.clone(), json!({"serverRelativeURL": url}))
            })
            .collect();
        return Some(json!({"paths": paths}));
    }
    let gv = path.strip_prefix("/openapi/v3/")?;
    by_gv.get(gv).map(|types| group_version(types))
}

fn hash(value: &Value) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

fn group_version(types: &[&ResourceType]) -> Value {
    let mut paths = Map::new();
    for rt in types {
        let prefix = format!("/{}", api_path(&rt.group, &rt.version));
        let collection = if rt.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", rt.plural)
        } else {
            format!("{prefix}/{}", rt.plural)
        };
        if rt.create_only {
            // A review API has one operation: create.
            paths.insert(
                collection,
                json!({"post": operation(rt, "post", WRITE_PARAMETERS)}),
            );
            continue;
        }
        let item = format!("{collection}/{{name}}");
        paths.insert(
            collection.clone(),
            json!({
                "get": operation(rt, "list", &["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "resourceVersionMatch", "watch", "allowWatchBookmarks", "timeoutSeconds"]),
                "post": operation(rt, "post", WRITE_PARAMETERS),
                "delete": operation(rt, "deletecollection", &["labelSelector", "fieldSelector", "gracePeriodSeconds", "propagationPolicy"]),
            }),
        );
        paths.insert(item.clone(), object_operations(rt));
        for sub in rt.subresources.iter().filter(|s| *s == "status") {
            paths.insert(format!("{item}/{sub}"), object_operations(rt));
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", KUBERNETES_VERSION.0, KUBERNETES_VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}},
    })
}

/// Query parameters of create, update and patch (apimachinery CreateOptions/UpdateOptions/
/// PatchOptions).
const WRITE_PARAMETERS: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "pretty"];

fn object_operations(rt: &ResourceType) -> Value {
    let mut patch = WRITE_PARAMETERS.to_vec();
    patch.push("force");
    json!({
        "get": operation(rt, "get", &["pretty"]),
        "put": operation(rt, "put", WRITE_PARAMETERS),
        "patch": operation(rt, "patch", &patch),
        "delete": operation(rt, "delete", &["gracePeriodSeconds", "propagationPolicy", "dryRun"]),
    })
}

fn operation(rt: &ResourceType, action: &str, parameters: &[&str]) -> Value {
    let parameters: Vec<Value> = parameters
        .iter()
        .map(|name| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    json!({
        "operationId": format!("{action}{}", rt.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "parameters": parameters,
        "responses": {"200": {"description": "OK"}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    #[test]
    fn every_group_version_has_a_document_with_field_validation_on_patch() {
        let types = builtin();
        let root = document("/openapi/v3", &types).unwrap();
        let paths = root["paths"].as_object().unwrap();
        assert!(paths.contains_key("api/v1") && paths.contains_key("apis/storage.k8s.io/v1"));
        let url = paths["api/v1"]["serverRelativeURL"].as_str().unwrap();
        let (path, _) = url.split_once('?').unwrap();
        let core = document(path, &types).unwrap();
        let patch = &core["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "", "version": "v1", "kind": "ConfigMap"})
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation" && p["in"] == "query")
        );
        assert!(document("/openapi/v3/apis/nothing.example.com/v1", &types).is_none());
        let authorization = document("/openapi/v3/apis/authorization.k8s.io/v1", &types).unwrap();
        let reviews = &authorization["paths"]["/apis/authorization.k8s.io/v1/subjectaccessreviews"];
        assert_eq!(
            reviews.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["post"],
            "a review is only ever created"
        );
    }
}

//! Delete and deletecollection: finalizers and grace periods, namespace termination, and the
//! garbage collection of dependents (background, foreground, orphan).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::{Filters, Server, json_response, key, objects, rfc3339};
use crate::conversion;
use crate::errors::ApiError;
use crate::resources::ResourceType;
use crate::store::ObjectKey;

/// Delete: preconditions; finalizers (or a pod's grace period) keep the object with a
/// deletionTimestamp; otherwise it goes, and its dependents are collected by the propagation
/// policy (k8s.io/apiserver/pkg/registry/generic/registry/store.go Delete;
/// https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/).
pub(super) fn delete(
    server: &Arc<Server>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    options: &objects::DeleteOptions,
) -> Result<Value, ApiError> {
    let foreground = options.propagation.as_deref() == Some("Foreground");
    let result = server.store.commit(&key(rt, ns, name), |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        options.check(rt, current)?;
        let mut next = current.clone();
        let grace = pod_grace(rt, current, options);
        if foreground && !objects::finalizers(current).contains(&"foregroundDeletion") {
            let mut list = objects::finalizers(current);
            list.push("foregroundDeletion");
            next["metadata"]["finalizers"] = json!(list);
        }
        let keep = !objects::finalizers(&next).is_empty() || grace > 0 || rt.kind == "Namespace";
        if !keep {
            return Ok(None);
        }
        if !objects::is_deleting(current) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            next["metadata"]["deletionTimestamp"] =
                json!(rfc3339(now + u64::try_from(grace).unwrap_or(0)));
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            if rt.kind == "Namespace" {
                next["status"]["phase"] = json!("Terminating");
            }
        } else if rt.kind == "Pod"
            && grace
                < current["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(0)
        {
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            if grace == 0 && objects::finalizers(&next).is_empty() {
                return Ok(None);
            }
        }
        Ok(Some(next))
    })?;
    let object = result.map(|o| (*o).clone()).unwrap_or_default();
    let gone = server.store.get(&key(rt, ns, name)).is_none();
    if gone {
        after_removal(server, rt, &object);
        if options.propagation.as_deref() == Some("Orphan") {
            orphan_dependents(server, &object);
        }
    } else if foreground || rt.kind == "Namespace" {
        let server = server.clone();
        let rt = rt.clone();
        let object = object.clone();
        tokio::spawn(async move { finish_blocking_deletion(server, rt, object).await });
    }
    Ok(object)
}

/// The grace period a pod delete gets: the request's, else the pod's
/// terminationGracePeriodSeconds (30 by default); unscheduled pods go at once
/// (pkg/registry/core/pod/strategy.go CheckGracefulDelete).
fn pod_grace(rt: &ResourceType, pod: &Value, options: &objects::DeleteOptions) -> i64 {
    if rt.kind != "Pod" || pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty) {
        return 0;
    }
    options
        .grace_period_seconds
        .unwrap_or_else(|| {
            pod["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30)
        })
        .max(0)
}

/// After an object is removed: collect its dependents in the background (the garbage
/// collector's default policy,
/// https://kubernetes.io/docs/concepts/architecture/garbage-collection/#background-deletion),
/// and stop serving a deleted CRD's resource.
pub(super) fn after_removal(server: &Arc<Server>, rt: &ResourceType, object: &Value) {
    if rt.kind == "CustomResourceDefinition" {
        server.registry.remove_crd(object);
    }
    let Some(uid) = object["metadata"]["uid"].as_str() else {
        return;
    };
    if server.store.dependents(uid).is_empty() {
        return;
    }
    let server = server.clone();
    let uid = uid.to_string();
    tokio::spawn(async move { collect_dependents(&server, &uid) });
}

/// Deletes every object owned by `uid` (background propagation).
fn collect_dependents(server: &Arc<Server>, uid: &str) {
    for ((storage_key, ns, name), _) in server.store.dependents(uid) {
        let Some(rt) = server
            .registry
            .all()
            .into_iter()
            .find(|t| t.storage_key() == storage_key)
        else {
            continue;
        };
        let ns = (!ns.is_empty()).then_some(ns);
        let _ = delete(
            server,
            &rt,
            ns.as_deref(),
            &name,
            &objects::DeleteOptions::default(),
        );
    }
}

/// Orphan propagation: dependents lose their reference to the deleted owner
/// (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#orphaned-dependents).
fn orphan_dependents(server: &Server, owner: &Value) {
    let Some(uid) = owner["metadata"]["uid"].as_str() else {
        return;
    };
    for (key, _) in server.store.dependents(uid) {
        let _ = server.store.commit::<ApiError>(&key, |current| {
            let Some(current) = current else {
                return Ok(None);
            };
            let mut next = current.clone();
            if let Some(references) = next["metadata"]["ownerReferences"].as_array_mut() {
                references.retain(|r| r["uid"].as_str() != Some(uid));
            }
            Ok(Some(next))
        });
    }
}

/// Foreground deletion and namespace termination: delete the dependents (or the namespace's
/// content), wait until they are gone, then drop the blocking finalizer / the namespace
/// (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#foreground-deletion,
/// pkg/controller/namespace/deletion/namespaced_resources_deleter.go).
async fn finish_blocking_deletion(server: Arc<Server>, rt: ResourceType, object: Value) {
    let uid = object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
    loop {
        let remaining: Vec<(ObjectKey, Arc<Value>)> = if rt.kind == "Namespace" {
            server
                .store
                .all()
                .into_iter()
                .filter(|((_, object_ns, _), _)| *object_ns == name)
                .collect()
        } else {
            server.store.dependents(&uid)
        };
        if remaining.is_empty() {
            break;
        }
        for ((storage_key, object_ns, object_name), _) in remaining {
            if let Some(child_rt) = server
                .registry
                .all()
                .into_iter()
                .find(|t| t.storage_key() == storage_key)
            {
                let child_ns = (!object_ns.is_empty()).then_some(object_ns);
                let _ = delete(
                    &server,
                    &child_rt,
                    child_ns.as_deref(),
                    &object_name,
                    &objects::DeleteOptions {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = server
        .store
        .commit::<ApiError>(&key(&rt, ns.as_deref(), &name), |current| {
            let Some(current) = current else {
                return Ok(None);
            };
            let mut finalizers = objects::finalizers(current);
            finalizers.retain(|f| *f != "foregroundDeletion");
            if finalizers.is_empty() {
                return Ok(None);
            }
            let mut next = current.clone();
            next["metadata"]["finalizers"] = json!(finalizers);
            Ok(Some(next))
        });
}

/// deletecollection: deletes each object the selectors match, as single deletes
/// (k8s.io/apiserver/pkg/registry/generic/registry/store.go DeleteCollection).
pub(super) fn delete_collection(
    server: &Arc<Server>,
    served: &ResourceType,
    ns: Option<&str>,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let filters = Filters::parse(served, query)?;
    let options = objects::DeleteOptions::parse(body, query)?;
    let rt = &conversion::storage_type(served);
    let (objects, _) = server.store.list(&rt.storage_key(), ns);
    let mut deleted = Vec::new();
    for object in objects.iter().filter(|o| filters.matches(o)) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let object_ns = object["metadata"]["namespace"].as_str();
        match delete(server, rt, object_ns, name, &options) {
            Ok(object) => deleted.push(conversion::to_served(served, &object).into_owned()),
            Err(error) if error.code == StatusCode::NOT_FOUND => {}
            Err(error) => return Err(error),
        }
    }
    let list = json!({
        "kind": format!("{}List", served.kind),
        "apiVersion": served.api_version(),
        "metadata": {"resourceVersion": server.store.revision().to_string()},
        "items": deleted,
    });
    Ok(json_response(StatusCode::OK, &list))
}

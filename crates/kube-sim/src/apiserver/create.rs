//! Create (POST to a collection) with the checks that run only on create, and the pod
//! `binding` subresource (also a POST, counted as a create).

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::{
    Server, admission, is_custom_resource, json_response, key, now_rfc3339, objects, rbac_objects,
    require_custom_resource_kind, schema, validation,
};
use crate::errors::ApiError;
use crate::resources::ResourceType;
use crate::roles;

/// Create: the registry's create rules, the target namespace must exist and not be terminating
/// (plugin/pkg/admission/namespace/lifecycle/admission.go), and a taken name is 409
/// AlreadyExists (k8s.io/apiserver/pkg/registry/generic/registry/store.go Create).
pub(super) fn create(
    server: &Server,
    rt: &ResourceType,
    ns: Option<&str>,
    object: Value,
) -> Result<Value, ApiError> {
    require_custom_resource_kind(rt, &object)?;
    let mut object = objects::prepare_create(rt, ns, object)?;
    // A custom resource with a status subresource is created without one: its status is
    // written through `/status` only (apiextensions-apiserver customResourceStrategy
    // PrepareForCreate).
    if is_custom_resource(rt)
        && rt.subresources.iter().any(|s| s == "status")
        && let Some(fields) = object.as_object_mut()
    {
        fields.remove("status");
    }
    let mut object = admission::admit(rt, object, || {
        server
            .resource("storage.k8s.io", "v1", "storageclasses")
            .map(|classes| server.store.list(&classes.storage_key(), None).0)
            .unwrap_or_default()
    });
    rbac_objects::default(rt, &mut object);
    validation::on_create(rt, &object)?;
    schema::apply(rt, &mut object, None)?;
    if let Some(ns) = ns {
        let namespaces = server.resource("", "v1", "namespaces")?;
        match server.store.get(&key(&namespaces, None, ns)) {
            None => return Err(ApiError::not_found("", "namespaces", ns)),
            Some(namespace) if objects::is_deleting(&namespace) => {
                return Err(ApiError::forbidden(format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                )));
            }
            Some(_) => {}
        }
        if rt.group.is_empty() && rt.kind == "Pod" {
            admit_service_account(server, ns, &object)?;
        }
    }
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if rt.kind == "CustomResourceDefinition" {
        require_api_approval(&object)?;
    }
    let object = if rt.kind == "CustomResourceDefinition" {
        established(object)
    } else {
        object
    };
    let created = server
        .store
        .commit(&key(rt, ns, &name), |current| match current {
            Some(_) => Err(ApiError::already_exists(&rt.group, &rt.plural, &name)),
            None => Ok(Some(object)),
        })?
        .map(|o| (*o).clone())
        .unwrap_or_default();
    if rt.kind == "CustomResourceDefinition" {
        server.registry.add_crd(&created);
    }
    Ok(created)
}

/// CRDs of the Kubernetes project's own groups (`*.k8s.io`, `*.kubernetes.io`) need the
/// `api-approved.kubernetes.io` annotation, a link to the approved API review or a value starting
/// with `unapproved` (apiextensions validation, KEP 1111).
fn require_api_approval(crd: &Value) -> Result<(), ApiError> {
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let protected = ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|domain| group == *domain || group.ends_with(&format!(".{domain}")));
    let approval = crd["metadata"]["annotations"]["api-approved.kubernetes.io"].as_str();
    if !protected || approval.is_some_and(|a| !a.is_empty()) {
        return Ok(());
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::invalid(
        "CustomResourceDefinition",
        name,
        "metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111",
    ))
}

/// The ServiceAccount admission plugin (plugin/pkg/admission/serviceaccount): a pod runs as a
/// ServiceAccount of its namespace (`default` unless it names one, defaulted in
/// [`admission::admit`]) and is refused until that ServiceAccount exists — in a new namespace,
/// until kube-controller-manager has made its `default` one.
fn admit_service_account(server: &Server, ns: &str, pod: &Value) -> Result<(), ApiError> {
    let account = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or(roles::service_accounts::DEFAULT_SERVICE_ACCOUNT);
    let accounts = server.resource("", "v1", "serviceaccounts")?;
    if server
        .store
        .get(&key(&accounts, Some(ns), account))
        .is_some()
    {
        return Ok(());
    }
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::forbidden(format!(
        "pods \"{name}\" is forbidden: error looking up service account {ns}/{account}: serviceaccount \"{account}\" not found"
    )))
}

/// A CRD is served as soon as it is created; its status says so (apiextensions-apiserver
/// pkg/controller/establish and status/naming_controller.go set these conditions).
fn established(mut crd: Value) -> Value {
    let now = now_rfc3339();
    crd["status"] = json!({
        "acceptedNames": crd["spec"]["names"].clone(),
        "storedVersions": crd["spec"]["versions"].as_array().into_iter().flatten()
            .filter(|v| v["storage"].as_bool() == Some(true)).map(|v| v["name"].clone()).collect::<Vec<_>>(),
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
    crd
}

/// `pods/<name>/binding`: assigns the pod to a node, once (pkg/registry/core/pod/storage/
/// storage.go BindingREST, assignPod).
pub(super) fn bind_pod(
    server: &Arc<Server>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    binding: Value,
) -> Result<Response, ApiError> {
    let node = binding["target"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid("Binding", name, "target.name: Required value"))?
        .to_string();
    server.store.commit(&key(rt, ns, name), |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        if objects::is_deleting(current) {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(bound) = current["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!("pod {name} is already assigned to node {bound:?}"),
            ));
        }
        let mut next = current.clone();
        next["spec"]["nodeName"] = json!(node);
        // pkg/registry/core/pod/storage/storage.go assignPod: the binding also marks the pod
        // scheduled, replacing an earlier Unschedulable condition.
        let mut conditions: Vec<Value> = current["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "PodScheduled");
        conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now_rfc3339()}));
        next["status"]["conditions"] = json!(conditions);
        Ok(Some(next))
    })?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

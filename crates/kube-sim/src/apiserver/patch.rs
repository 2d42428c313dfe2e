//! Patch (PATCH): merge, JSON, strategic-merge and apply patches.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use super::create::create;
use super::update::update;
use super::{Server, decode, is_builtin_group, json_response, key, objects, parse_body};
use crate::conversion;
use crate::errors::ApiError;
use crate::resources::ResourceType;
use crate::strategic;

/// What a PATCH request names.
pub(super) struct PatchRequest<'a> {
    pub(super) served: &'a ResourceType,
    pub(super) ns: Option<&'a str>,
    pub(super) name: &'a str,
    pub(super) status_only: bool,
    pub(super) content_type: &'a str,
    pub(super) query: &'a HashMap<String, String>,
}

/// Patch: the patch applies to the object as the client's group serves it (a patch through
/// events.k8s.io names events.k8s.io fields), then it is stored like an update
/// (k8s.io/apiserver/pkg/endpoints/handlers/patch.go; patch types:
/// https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/).
pub(super) fn patch(
    server: &Arc<Server>,
    request: &PatchRequest,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let PatchRequest {
        served,
        ns,
        name,
        status_only,
        content_type,
        query,
    } = *request;
    let rt = &conversion::storage_type(served);
    let out =
        |object: &Value| json_response(StatusCode::OK, &conversion::to_served(served, object));
    let media = content_type.split(';').next().unwrap_or_default().trim();
    // Apply bodies are YAML (JSON is YAML too); the other patch types are JSON.
    let patch: Value = if media == "application/apply-patch+yaml" {
        serde_norway::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the apply body is not valid YAML: {e}")))?
    } else {
        parse_body(body)?
    };
    // A merge or strategic patch that names a resourceVersion is a guarded write.
    let patch_sets_version = objects::expected_version(&patch).is_some();
    let current = server.store.get(&key(rt, ns, name));
    if media == "application/apply-patch+yaml" {
        if query.get("fieldManager").is_none_or(String::is_empty) {
            return Err(ApiError::bad_request(
                "PATCH: fieldManager is required for apply requests",
            ));
        }
        // Server-side apply, simplified: the applied configuration is merged into the live
        // object without field ownership; an absent object is created from it
        // (https://kubernetes.io/docs/reference/using-api/server-side-apply/).
        let Some(current) = current else {
            let mut patch = patch;
            decode::check_patched(served, &mut patch)?;
            let created = create(server, rt, ns, conversion::to_storage(served, patch))?;
            return Ok(json_response(
                StatusCode::CREATED,
                &conversion::to_served(served, &created),
            ));
        };
        let mut merged = conversion::to_served(served, &current).into_owned();
        json_patch::merge(&mut merged, &without_version(patch));
        decode::check_patched(served, &mut merged)?;
        let merged = conversion::to_storage(served, merged);
        return update(server, rt, ns, name, merged, status_only).map(|o| out(&o));
    }
    let current = current.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
    let mut patched = conversion::to_served(served, &current).into_owned();
    match media {
        "application/merge-patch+json" => json_patch::merge(&mut patched, &patch),
        "application/json-patch+json" => apply_json_patch(&mut patched, patch)?,
        "application/strategic-merge-patch+json" => {
            if !strategic::supports_kind(&served.kind)
                || !served.group.is_empty() && !is_builtin_group(&served.group)
            {
                return Err(ApiError::unsupported_media_type(format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patch is not supported for {})",
                    served.kind
                )));
            }
            patched =
                strategic::apply_strategic_merge(&served.kind, &patched, &patch).map_err(|e| {
                    let code = StatusCode::from_u16(e.http_status())
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    ApiError::with_reason(code, e.reason(), e.to_string())
                })?;
        }
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format: {other:?}"
            )));
        }
    }
    decode::check_patched(served, &mut patched)?;
    let mut patched = conversion::to_storage(served, patched);
    // A patch that names no resourceVersion applies to whatever is current.
    if objects::expected_version(&patched) == current["metadata"]["resourceVersion"].as_str()
        && !patch_sets_version
        && let Some(meta) = patched["metadata"].as_object_mut()
    {
        meta.remove("resourceVersion");
    }
    update(server, rt, ns, name, patched, status_only).map(|o| out(&o))
}

fn without_version(mut object: Value) -> Value {
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    object
}

/// A JSON patch as kube-apiserver's patch handler applies it: a body that is no list of
/// operations is 400; an operation it cannot apply (unknown, a failed `test`, a missing path)
/// is 422 Invalid with apimachinery's generic message, which names neither the operation nor
/// the object (so v1.19 and v1.28 answer).
fn apply_json_patch(object: &mut Value, patch: Value) -> Result<(), ApiError> {
    let go_type = |value: &Value| match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Null => "null",
    };
    let not_decoded = |value: &Value, into: &str| {
        ApiError::bad_request(format!(
            "error decoding patch: json: cannot unmarshal {} into Go value of type {into}",
            go_type(value)
        ))
    };
    let Value::Array(operations) = &patch else {
        return Err(not_decoded(&patch, "[]handlers.jsonPatchOp"));
    };
    if let Some(operation) = operations
        .iter()
        .find(|op| !op.is_object() && !op.is_null())
    {
        return Err(not_decoded(operation, "handlers.jsonPatchOp"));
    }
    let not_applied = || {
        ApiError::with_reason(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
    };
    let operations: json_patch::Patch = serde_json::from_value(patch).map_err(|_| not_applied())?;
    json_patch::patch(object, &operations).map_err(|_| not_applied())
}

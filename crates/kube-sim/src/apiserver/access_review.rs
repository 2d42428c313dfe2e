//! `POST subjectaccessreviews` and `POST namespaces/<ns>/localsubjectaccessreviews`: whether a
//! user may make a request, decided by [`crate::rbac`] over the stored RBAC objects and answered
//! as kube-apiserver's REST does (pkg/registry/authorization/subjectaccessreview/rest.go,
//! localsubjectaccessreview/rest.go, validation in pkg/apis/authorization/validation).

use axum::http::StatusCode;
use axum::response::Response;
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{Server, json_response};
use crate::errors::{ApiError, FieldError};
use crate::rbac::{self, Policy, Request, User};

/// Answers the decoded review; `namespace` is that of a LocalSubjectAccessReview's path.
pub(super) fn create(
    server: &Server,
    kind: &str,
    namespace: Option<&str>,
    mut review: Value,
) -> Result<Response, ApiError> {
    if let Some(namespace) = namespace {
        // The generic create handler: a namespace in the body must be the path's.
        match review["metadata"]["namespace"].as_str() {
            Some(given) if !given.is_empty() && given != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => review["metadata"]["namespace"] = json!(namespace),
        }
    }
    // Decoded already: what remains is of the spec's types (a missing spec is an empty one).
    let spec: SubjectAccessReviewSpec = if review["spec"].is_null() {
        SubjectAccessReviewSpec::default()
    } else {
        serde_json::from_value(review["spec"].clone())
            .map_err(|e| ApiError::bad_request(format!("the review's spec: {e}")))?
    };
    let errors = validate(&review, &spec, namespace);
    if !errors.is_empty() {
        return Err(invalid(&errors));
    }
    let user = User {
        name: spec.user.clone().unwrap_or_default(),
        groups: spec.groups.clone().unwrap_or_default(),
    };
    let request = match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(r), _) => Request::Resource {
            namespace: r.namespace.clone().unwrap_or_default(),
            verb: r.verb.clone().unwrap_or_default(),
            group: r.group.clone().unwrap_or_default(),
            resource: r.resource.clone().unwrap_or_default(),
            subresource: r.subresource.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
        },
        (None, Some(n)) => Request::NonResource {
            path: n.path.clone().unwrap_or_default(),
            verb: n.verb.clone().unwrap_or_default(),
        },
        // Refused by validate.
        (None, None) => return Err(invalid(&validate(&review, &spec, namespace))),
    };
    let decision = rbac::authorize(&policy(server), &user, &request);
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    review["status"] = status;
    review["kind"] = json!(kind);
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["metadata"]["creationTimestamp"] = Value::Null;
    Ok(json_response(StatusCode::CREATED, &review))
}

/// ValidateSubjectAccessReview / ValidateLocalSubjectAccessReview.
fn validate(
    review: &Value,
    spec: &SubjectAccessReviewSpec,
    namespace: Option<&str>,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(_), Some(n)) => errors.push(FieldError::invalid_printed(
            "spec.nonResourceAttributes",
            &go_non_resource(n),
            "cannot be specified in combination with resourceAttributes",
        )),
        (None, None) => errors.push(FieldError::invalid(
            "spec.resourceAttributes",
            &json!("null"),
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    if spec.user.as_deref().unwrap_or_default().is_empty()
        && spec.groups.as_deref().unwrap_or_default().is_empty()
    {
        errors.push(FieldError::invalid(
            "spec.user",
            &json!(""),
            "at least one of user or group must be specified",
        ));
    }
    let mut metadata = review["metadata"].as_object().cloned().unwrap_or_default();
    metadata
        .retain(|field, value| !(value.is_null() || namespace.is_some() && field == "namespace"));
    if !metadata.is_empty() {
        let what = if namespace.is_some() {
            "must be empty except for namespace"
        } else {
            "must be empty"
        };
        errors.push(FieldError::invalid_printed(
            "metadata",
            &Value::Object(metadata).to_string(),
            what,
        ));
    }
    if let Some(namespace) = namespace {
        if let Some(attributes) = &spec.resource_attributes {
            let given = attributes.namespace.as_deref().unwrap_or_default();
            if given != namespace {
                errors.push(FieldError::invalid(
                    "spec.resourceAttributes.namespace",
                    &json!(given),
                    "must match metadata.namespace",
                ));
            }
        }
        if let Some(n) = &spec.non_resource_attributes {
            errors.push(FieldError::invalid_printed(
                "spec.nonResourceAttributes",
                &go_non_resource(n),
                "disallowed on this kind of request",
            ));
        }
    }
    errors
}

/// The attributes as Go's `%#v` prints the internal type.
fn go_non_resource(n: &k8s_openapi::api::authorization::v1::NonResourceAttributes) -> String {
    format!(
        "authorization.NonResourceAttributes{{Path:{:?}, Verb:{:?}}}",
        n.path.as_deref().unwrap_or_default(),
        n.verb.as_deref().unwrap_or_default()
    )
}

/// 422 as the review REST words it: errors.NewInvalid with the kind of the internal object,
/// which is empty, so the message begins `.authorization.k8s.io "" is invalid`.
fn invalid(errors: &[FieldError]) -> ApiError {
    let mut error = ApiError::invalid_causes(".authorization.k8s.io", "", errors);
    if let Some(details) = error.details.as_mut() {
        details["group"] = json!("authorization.k8s.io");
    }
    error
}

/// The stored RBAC objects.
fn policy(server: &Server) -> Policy {
    Policy {
        cluster_roles: stored(server, "clusterroles"),
        roles: stored(server, "roles"),
        cluster_role_bindings: stored(server, "clusterrolebindings"),
        role_bindings: stored(server, "rolebindings"),
    }
}

fn stored<T: DeserializeOwned>(server: &Server, plural: &str) -> Vec<T> {
    let Ok(rt) = server.resource("rbac.authorization.k8s.io", "v1", plural) else {
        return Vec::new();
    };
    server
        .store
        .list(&rt.storage_key(), None)
        .0
        .iter()
        .filter_map(|o| serde_json::from_value((**o).clone()).ok())
        .collect()
}

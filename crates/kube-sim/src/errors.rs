//! API errors as kube-apiserver returns them: a `metav1.Status` body with code and reason
//! (k8s.io/apimachinery/pkg/api/errors/errors.go).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::resources::ResourceType;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// `metadata.continue` of the Status (an expired continue token's replacement).
    pub continue_token: Option<String>,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            continue_token: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": group, "kind": kind}));
        self
    }

    /// `<plural>[.<group>] "<name>" not found`, as upstream words it.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    pub fn invalid(kind: &str, name: &str, why: impl Into<String>) -> Self {
        let why = why.into();
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {why}"),
        )
    }

    /// One field refused by validation, with its cause in the details
    /// (k8s.io/apimachinery/pkg/api/errors/errors.go NewInvalid): the kind is qualified by its
    /// group, as `schema.GroupKind`'s String.
    pub fn invalid_field(
        rt: &ResourceType,
        name: &str,
        field: &str,
        reason: &str,
        detail: String,
    ) -> Self {
        let kind = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut error = Self::invalid(&kind, name, format!("{field}: {detail}"));
        let mut details = json!({
            "name": name,
            "kind": rt.kind,
            "causes": [{"reason": reason, "message": detail, "field": field}],
        });
        if !rt.group.is_empty() {
            details["group"] = json!(rt.group);
        }
        error.details = Some(details);
        error
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "Expired", message)
    }

    /// A read that asked for a resourceVersion newer than the server has, after waiting for
    /// it (k8s.io/apiserver/pkg/storage/errors.go NewTooLargeResourceVersionError).
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut error = Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        );
        error.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        error
    }

    pub fn with_continue(mut self, token: String) -> Self {
        self.continue_token = Some(token);
        self
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            message,
        )
    }

    pub fn injected(code: StatusCode, message: impl Into<String>) -> Self {
        let reason = match code.as_u16() {
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        Self::new(code, reason, message)
    }

    /// The `metav1.Status` object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        if let Some(token) = &self.continue_token {
            status["metadata"]["continue"] = json!(token);
        }
        status
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.code, axum::Json(self.status())).into_response();
        // The Status's retryAfterSeconds also goes out as Retry-After
        // (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/writers.go ErrorNegotiated).
        let retry_after = self
            .details
            .as_ref()
            .and_then(|d| d["retryAfterSeconds"].as_u64());
        if let Some(value) = retry_after.and_then(|s| s.to_string().parse().ok()) {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, value);
        }
        response
    }
}

impl ApiError {
    /// An error whose code and reason were decided elsewhere (e.g. strategic merge patch).
    pub fn with_reason(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(code, reason, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }
}

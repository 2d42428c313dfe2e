//! API errors as kube-apiserver returns them: a `metav1.Status` body with code and reason
//! (k8s.io/apimachinery/pkg/api/errors/errors.go).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::resources::ResourceType;

/// One field's violation (k8s.io/apimachinery/pkg/util/validation/field): its path, the
/// cause's reason, and its message after the path (`Required value`, `Invalid value: …`).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub reason: &'static str,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueRequired",
            detail: "Required value".into(),
        }
    }

    /// `Required value: <why>`.
    pub fn required_because(field: impl Into<String>, why: &str) -> Self {
        Self {
            detail: format!("Required value: {why}"),
            ..Self::required(field)
        }
    }

    /// `Invalid value: <value>: <why>`, the value as Go's `%#v` prints it (strings quoted).
    pub fn invalid(field: impl Into<String>, value: &Value, why: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {}: {why}", go_value(value)),
        }
    }

    /// `Invalid value: <printed>: <why>` for a value Go prints unquoted (`%#v` of a struct or
    /// a slice), printed by the caller.
    pub fn invalid_printed(field: impl Into<String>, printed: &str, why: &str) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {printed}: {why}"),
        }
    }

    /// `Unsupported value: <value>: supported values: "a", "b"`.
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let supported: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Self {
            field: field.into(),
            reason: "FieldValueNotSupported",
            detail: format!(
                "Unsupported value: {}: supported values: {}",
                go_value(value),
                supported.join(", ")
            ),
        }
    }

    pub fn forbidden(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: "FieldValueForbidden",
            detail: format!("Forbidden: {}", why.into()),
        }
    }
}

/// `<field>: <detail>`, as a Status message lists it.
impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// A JSON value as Go's `%#v` prints the scalar it decoded to.
fn go_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

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

    /// Field validation's refusal (k8s.io/apimachinery/pkg/api/errors/errors.go NewInvalid):
    /// one error reads `<Kind> "<name>" is invalid: <field>: <detail>`, several are listed in
    /// brackets, and each is a cause in the details; the kind is qualified by its group, as
    /// `schema.GroupKind`'s String.
    pub fn invalid_fields(rt: &ResourceType, name: &str, errors: &[FieldError]) -> Self {
        let kind = crate::selectors::qualified_kind(&rt.group, &rt.kind);
        let mut error = Self::invalid_causes(&kind, name, errors);
        if let Some(details) = error.details.as_mut() {
            details["name"] = json!(name);
            details["kind"] = json!(rt.kind);
            if !rt.group.is_empty() {
                details["group"] = json!(rt.group);
            }
        }
        error
    }

    /// [`Self::invalid_fields`]' message and causes, for a kind printed as `kind` (the review
    /// APIs print an empty kind: `.authorization.k8s.io "" is invalid: …`).
    pub fn invalid_causes(kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let why = match messages.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut error = Self::invalid(kind, name, why);
        error.details = Some(json!({
            "causes": errors.iter().map(|e| json!({
                "reason": e.reason,
                "message": e.detail,
                "field": e.field,
            })).collect::<Vec<_>>(),
        }));
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

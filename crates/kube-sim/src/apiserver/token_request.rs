//! `POST serviceaccounts/<name>/token`: a TokenRequest issues a token of the ServiceAccount,
//! checked and answered as kube-apiserver's TokenREST does (pkg/registry/core/serviceaccount/
//! storage/token.go, pkg/apis/authentication/validation): the name in the body must be the
//! ServiceAccount's, the ServiceAccount must exist, `expirationSeconds` (default 3600) is at
//! least 10 minutes and at most 2^32 seconds, and a bound Pod or Secret must exist (a Pod must
//! run as the ServiceAccount) and have the uid the reference names, if it names one.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::tokens::{API_AUDIENCE, BoundObject, Claims};
use super::{Server, decode, json_response, key, objects, parse_body};
use crate::errors::{ApiError, FieldError};

const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
const MIN_EXPIRATION_SECONDS: i64 = 600;
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

pub(super) fn create(
    server: &Server,
    namespace: &str,
    account: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let mut request = parse_body(body)?;
    decode::check_kind_body("authentication.k8s.io", "v1", "TokenRequest", &mut request)?;
    // The namespace lifecycle admission plugin answers before the REST handler.
    let namespaces = server.resource("", "v1", "namespaces")?;
    if server
        .store
        .get(&key(&namespaces, None, namespace))
        .is_none()
    {
        return Err(ApiError::not_found("", "namespaces", namespace));
    }
    let metadata_mismatch = |field: &str, given: &str, what: &str| {
        invalid(
            account,
            &[FieldError::invalid(
                format!("metadata.{field}"),
                &json!(given),
                &format!("must match the service account {what} if specified"),
            )],
        )
    };
    if let Some(name) = request["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        && name != account
    {
        return Err(metadata_mismatch("name", name, "name"));
    }
    if let Some(ns) = request["metadata"]["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        && ns != namespace
    {
        return Err(metadata_mismatch("namespace", ns, "namespace"));
    }
    let accounts = server.resource("", "v1", "serviceaccounts")?;
    let service_account = server
        .store
        .get(&key(&accounts, Some(namespace), account))
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", account))?;
    let spec = &request["spec"];
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        Some(given) if !given.is_empty() => given
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => vec![API_AUDIENCE.to_string()],
    };
    let expiration = spec["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    let too = if expiration < MIN_EXPIRATION_SECONDS {
        Some("may not specify a duration less than 10 minutes")
    } else if expiration > MAX_EXPIRATION_SECONDS {
        Some("may not specify a duration larger than 2^32 seconds")
    } else {
        None
    };
    if let Some(why) = too {
        return Err(invalid(
            "",
            &[FieldError::invalid(
                "spec.expirationSeconds",
                &json!(expiration),
                why,
            )],
        ));
    }
    let reference = &spec["boundObjectRef"];
    let bound = if reference.is_object() {
        Some(bound_object(server, namespace, account, reference)?)
    } else {
        None
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let expires = now + expiration.unsigned_abs();
    let claims = Claims {
        namespace: namespace.to_string(),
        account: account.to_string(),
        account_uid: service_account["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        audiences: audiences.clone(),
        expires,
        bound,
    };
    let token = server.tokens.issue(claims, now);
    Ok(json_response(
        StatusCode::CREATED,
        &json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": account, "namespace": namespace, "creationTimestamp": objects::rfc3339(now)},
            "spec": {
                "audiences": audiences,
                "expirationSeconds": expiration,
                "boundObjectRef": if reference.is_object() { reference.clone() } else { Value::Null },
            },
            "status": {"token": token, "expirationTimestamp": objects::rfc3339(expires)},
        }),
    ))
}

/// The Pod or Secret `reference` names, as it is now.
fn bound_object(
    server: &Server,
    namespace: &str,
    account: &str,
    reference: &Value,
) -> Result<BoundObject, ApiError> {
    let api_version = reference["apiVersion"].as_str().unwrap_or_default();
    let kind = reference["kind"].as_str().unwrap_or_default();
    let name = reference["name"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let plural = match (group, kind) {
        ("", "Pod") => "pods",
        ("", "Secret") => "secrets",
        _ => {
            // schema.GroupVersionKind's String.
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {group}/{version}, Kind={kind}"
            )));
        }
    };
    let rt = server.resource("", "v1", plural)?;
    let object = server
        .store
        .get(&key(&rt, Some(namespace), name))
        .ok_or_else(|| ApiError::not_found("", plural, name))?;
    if kind == "Pod" {
        let runs_as = object["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_default();
        if runs_as != account {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount {account:?} to pod running with different serviceaccount name."
            )));
        }
    }
    let uid = object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(wanted) = reference["uid"].as_str().filter(|u| !u.is_empty())
        && wanted != uid
    {
        return Err(ApiError::conflict(
            "",
            kind,
            name,
            &format!(
                "the UID in the bound object reference ({wanted}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    Ok(BoundObject {
        kind: kind.to_string(),
        name: name.to_string(),
        uid,
    })
}

/// 422 on a TokenRequest (errors.NewInvalid of the authentication.k8s.io TokenRequest kind;
/// the details leave an empty name out).
fn invalid(name: &str, errors: &[FieldError]) -> ApiError {
    let mut error = ApiError::invalid_causes("TokenRequest.authentication.k8s.io", name, errors);
    if let Some(details) = error.details.as_mut() {
        details["group"] = json!("authentication.k8s.io");
        details["kind"] = json!("TokenRequest");
        if !name.is_empty() {
            details["name"] = json!(name);
        }
    }
    error
}

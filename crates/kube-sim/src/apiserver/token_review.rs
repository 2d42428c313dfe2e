//! `POST tokenreviews`: whether a token authenticates, for which user and audiences, answered
//! as kube-apiserver's TokenReview REST does (pkg/registry/authentication/tokenreview/
//! storage.go): a token is required; a review without audiences asks for the API audience; an
//! unauthenticated token is no error of the request, its reason is `status.error`.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::tokens::{self, API_AUDIENCE, Current};
use super::{Server, json_response, key};
use crate::errors::ApiError;

/// Answers the decoded TokenReview `review`.
pub(super) fn create(server: &Server, mut review: Value) -> Result<Response, ApiError> {
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let wanted: Vec<String> = match review["spec"]["audiences"].as_array() {
        Some(given) if !given.is_empty() => given
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => vec![API_AUDIENCE.to_string()],
    };
    let claims = server.tokens.claims(token);
    let current = claims
        .as_ref()
        .map(|c| current(server, c))
        .transpose()?
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    review["status"] = match tokens::authenticate(claims.as_ref(), &wanted, &current, now) {
        Ok(authenticated) => json!({
            "authenticated": true,
            "user": authenticated.user,
            "audiences": authenticated.audiences,
        }),
        Err(error) => json!({"user": {}, "error": error}),
    };
    review["kind"] = json!("TokenReview");
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["metadata"]["creationTimestamp"] = Value::Null;
    Ok(json_response(StatusCode::CREATED, &review))
}

/// The uids the token's ServiceAccount and bound object have now.
fn current(server: &Server, claims: &tokens::Claims) -> Result<Current, ApiError> {
    let uid_of = |plural: &str, name: &str| -> Result<Option<String>, ApiError> {
        let rt = server.resource("", "v1", plural)?;
        Ok(server
            .store
            .get(&key(&rt, Some(&claims.namespace), name))
            .and_then(|o| o["metadata"]["uid"].as_str().map(str::to_string)))
    };
    let bound_uid = match &claims.bound {
        Some(bound) if bound.kind == "Pod" => uid_of("pods", &bound.name)?,
        Some(bound) => uid_of("secrets", &bound.name)?,
        None => None,
    };
    Ok(Current {
        account_uid: uid_of("serviceaccounts", &claims.account)?,
        bound_uid,
    })
}

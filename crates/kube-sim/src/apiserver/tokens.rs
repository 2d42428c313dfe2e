//! The ServiceAccount tokens kube-sim has issued (TokenRequest) and how a token authenticates
//! (TokenReview), as kube-apiserver's service account token authenticator decides it
//! (pkg/serviceaccount/jwt.go, claims.go). A real server issues signed JWTs and keeps nothing;
//! kube-sim issues opaque random tokens and remembers what their claims would say — clients
//! must not parse a token either way.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

/// The issuer, which is also the API audience: a token requested without audiences is for it,
/// and a review without audiences asks for it (kube-apiserver's `--api-audiences` default to
/// `--service-account-issuer`; this is the issuer clusters conventionally use).
pub(super) const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Expired tokens and deleted objects still count for this long, as go-jose's default leeway
/// (jwt.DefaultLeeway) lets them.
const LEEWAY_SECONDS: u64 = 60;

/// What a token's claims say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claims {
    pub(super) namespace: String,
    pub(super) account: String,
    pub(super) account_uid: String,
    pub(super) audiences: Vec<String>,
    /// Seconds since the epoch.
    pub(super) expires: u64,
    pub(super) bound: Option<BoundObject>,
}

/// The Pod or Secret a token is bound to: it is valid while that object exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BoundObject {
    /// `Pod` or `Secret`.
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) uid: String,
}

/// The tokens issued so far, by token.
#[derive(Debug, Default)]
pub(super) struct Tokens {
    issued: Mutex<HashMap<String, Claims>>,
}

impl Tokens {
    /// A new token with `claims`; tokens long expired are forgotten meanwhile.
    pub(super) fn issue(&self, claims: Claims, now: u64) -> String {
        let token = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let mut issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        issued.retain(|_, c| c.expires + LEEWAY_SECONDS >= now);
        issued.insert(token.clone(), claims);
        token
    }

    pub(super) fn claims(&self, token: &str) -> Option<Claims> {
        self.issued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()
    }
}

/// What the authenticator finds: the ServiceAccount's and the bound object's current uids
/// (`None`: not found).
#[derive(Debug, Clone, Default)]
pub(super) struct Current {
    pub(super) account_uid: Option<String>,
    pub(super) bound_uid: Option<String>,
}

/// An authenticated token: the user and the audiences both sides share.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Authenticated {
    pub(super) user: Value,
    pub(super) audiences: Vec<String>,
}

/// Authenticates a token whose claims are `claims` (`None`: not a token kube-sim issued) for
/// `wanted` audiences (those of the review, else the API audience). The error is the
/// TokenReview's `status.error`, worded as the real server's authenticator union aggregates it.
pub(super) fn authenticate(
    claims: Option<&Claims>,
    wanted: &[String],
    current: &Current,
    now: u64,
) -> Result<Authenticated, String> {
    const INVALID: &str = "invalid bearer token";
    let Some(claims) = claims else {
        return Err(INVALID.into());
    };
    let refused = |why: String| format!("[{INVALID}, {why}]");
    let audiences: Vec<String> = claims
        .audiences
        .iter()
        .filter(|a| wanted.contains(a))
        .cloned()
        .collect();
    if audiences.is_empty() {
        return Err(refused(format!(
            "token audiences {} is invalid for the target audiences {}",
            go_quoted(&claims.audiences),
            go_quoted(wanted)
        )));
    }
    if now > claims.expires + LEEWAY_SECONDS {
        return Err(refused("service account token has expired".into()));
    }
    match &current.account_uid {
        None => {
            return Err(refused(format!(
                "serviceaccounts {:?} not found",
                claims.account
            )));
        }
        Some(uid) if *uid != claims.account_uid => {
            return Err(refused(format!(
                "service account UID ({uid}) does not match claim ({})",
                claims.account_uid
            )));
        }
        Some(_) => {}
    }
    let mut extra = serde_json::Map::new();
    if let Some(bound) = &claims.bound {
        match &current.bound_uid {
            None => return Err(refused("service account token has been invalidated".into())),
            Some(uid) if *uid != bound.uid => {
                let kind = bound.kind.to_lowercase();
                return Err(refused(format!(
                    "{kind} UID ({uid}) does not match service account {kind} ref claim ({})",
                    bound.uid
                )));
            }
            Some(_) => {}
        }
        if bound.kind == "Pod" {
            extra.insert(
                "authentication.kubernetes.io/pod-name".into(),
                json!([bound.name]),
            );
            extra.insert(
                "authentication.kubernetes.io/pod-uid".into(),
                json!([bound.uid]),
            );
        }
    }
    let mut user = json!({
        "username": format!("system:serviceaccount:{}:{}", claims.namespace, claims.account),
        "uid": claims.account_uid,
        "groups": [
            "system:serviceaccounts",
            format!("system:serviceaccounts:{}", claims.namespace),
            "system:authenticated",
        ],
    });
    if !extra.is_empty() {
        user["extra"] = Value::Object(extra);
    }
    Ok(Authenticated { user, audiences })
}

/// A string list as Go's `%q` prints a `[]string`: `["a" "b"]`.
fn go_quoted(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(bound: Option<BoundObject>) -> Claims {
        Claims {
            namespace: "apps".into(),
            account: "backup".into(),
            account_uid: "sa-1".into(),
            audiences: vec!["a1".into(), "a2".into()],
            expires: 1000,
            bound,
        }
    }

    fn pod() -> BoundObject {
        BoundObject {
            kind: "Pod".into(),
            name: "p".into(),
            uid: "pod-1".into(),
        }
    }

    fn current(account: Option<&str>, bound: Option<&str>) -> Current {
        Current {
            account_uid: account.map(str::to_string),
            bound_uid: bound.map(str::to_string),
        }
    }

    fn wanted(audiences: &[&str]) -> Vec<String> {
        audiences.iter().map(|a| (*a).to_string()).collect()
    }

    /// What is reviewed, the audiences wanted, what exists now, the time, the outcome.
    type Case = (
        &'static str,
        Option<Claims>,
        Vec<String>,
        Current,
        u64,
        Result<Authenticated, String>,
    );

    #[test]
    fn authentication() {
        let user = json!({"username": "system:serviceaccount:apps:backup", "uid": "sa-1",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated"]});
        let mut pod_user = user.clone();
        pod_user["extra"] = json!({"authentication.kubernetes.io/pod-name": ["p"],
            "authentication.kubernetes.io/pod-uid": ["pod-1"]});
        let ok = |user: &Value, audiences: &[&str]| {
            Ok(Authenticated {
                user: user.clone(),
                audiences: wanted(audiences),
            })
        };
        let cases: Vec<Case> = vec![
            ("the audiences both have", Some(claims(None)), wanted(&["a2", "a3"]), current(Some("sa-1"), None), 900,
                ok(&user, &["a2"])),
            ("in the token's order", Some(claims(None)), wanted(&["a2", "a1"]), current(Some("sa-1"), None), 900,
                ok(&user, &["a1", "a2"])),
            ("not a token", None, wanted(&["a1"]), current(Some("sa-1"), None), 900,
                Err("invalid bearer token".into())),
            ("another audience", Some(claims(None)), wanted(&["zz"]), current(Some("sa-1"), None), 900,
                Err(r#"[invalid bearer token, token audiences ["a1" "a2"] is invalid for the target audiences ["zz"]]"#.into())),
            ("within the leeway", Some(claims(None)), wanted(&["a1"]), current(Some("sa-1"), None), 1060,
                ok(&user, &["a1"])),
            ("expired", Some(claims(None)), wanted(&["a1"]), current(Some("sa-1"), None), 1061,
                Err("[invalid bearer token, service account token has expired]".into())),
            ("ServiceAccount deleted", Some(claims(None)), wanted(&["a1"]), current(None, None), 900,
                Err(r#"[invalid bearer token, serviceaccounts "backup" not found]"#.into())),
            ("ServiceAccount recreated", Some(claims(None)), wanted(&["a1"]), current(Some("sa-2"), None), 900,
                Err("[invalid bearer token, service account UID (sa-2) does not match claim (sa-1)]".into())),
            ("bound pod", Some(claims(Some(pod()))), wanted(&["a1"]), current(Some("sa-1"), Some("pod-1")), 900,
                ok(&pod_user, &["a1"])),
            ("bound pod deleted", Some(claims(Some(pod()))), wanted(&["a1"]), current(Some("sa-1"), None), 900,
                Err("[invalid bearer token, service account token has been invalidated]".into())),
            ("bound pod recreated", Some(claims(Some(pod()))), wanted(&["a1"]), current(Some("sa-1"), Some("pod-2")), 900,
                Err("[invalid bearer token, pod UID (pod-2) does not match service account pod ref claim (pod-1)]".into())),
        ];
        for (case, claims, wanted, current, now, expected) in cases {
            assert_eq!(
                authenticate(claims.as_ref(), &wanted, &current, now),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn issued_tokens_are_remembered_until_long_expired() {
        let tokens = Tokens::default();
        let first = tokens.issue(claims(None), 900);
        assert_eq!(tokens.claims(&first), Some(claims(None)));
        let second = tokens.issue(claims(None), 900);
        assert_ne!(first, second, "every token is new");
        tokens.issue(
            Claims {
                expires: 5000,
                ..claims(None)
            },
            1061,
        );
        assert_eq!(
            tokens.claims(&first),
            None,
            "forgotten once past its expiry and the leeway"
        );
    }
}

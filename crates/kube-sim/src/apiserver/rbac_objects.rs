//! The rbac.authorization.k8s.io objects' defaults and validation, as kube-apiserver's RBAC
//! registries apply them (pkg/apis/rbac/v1/defaults.go, pkg/apis/rbac/validation): a
//! binding's roleRef and User/Group subjects default to the RBAC group; a rule has verbs and
//! either resources with API groups or non-resource URLs (those only in a ClusterRole); a
//! roleRef names a Role or ClusterRole and never changes; a subject is a ServiceAccount, User
//! or Group.

use serde_json::{Value, json};

use crate::errors::FieldError;
use crate::resources::ResourceType;
use crate::selectors::dns1123_subdomain_errors;

const GROUP: &str = "rbac.authorization.k8s.io";

fn is_binding(rt: &ResourceType) -> bool {
    rt.group == GROUP && matches!(rt.kind.as_str(), "RoleBinding" | "ClusterRoleBinding")
}

/// The v1 defaults of a binding.
pub(super) fn default(rt: &ResourceType, object: &mut Value) {
    if !is_binding(rt) {
        return;
    }
    if object["roleRef"]["apiGroup"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        object["roleRef"]["apiGroup"] = json!(GROUP);
    }
    for subject in object["subjects"].as_array_mut().into_iter().flatten() {
        let kind = subject["kind"].as_str().unwrap_or_default();
        if subject["apiGroup"].as_str().unwrap_or_default().is_empty()
            && matches!(kind, "User" | "Group")
        {
            subject["apiGroup"] = json!(GROUP);
        }
    }
}

/// The rules of an object of `rt` that hold on create and update.
pub(super) fn errors(rt: &ResourceType, object: &Value) -> Vec<FieldError> {
    if rt.group != GROUP {
        return Vec::new();
    }
    match rt.kind.as_str() {
        "Role" | "ClusterRole" => rules_errors(&object["rules"], rt.kind == "Role"),
        "RoleBinding" | "ClusterRoleBinding" => binding_errors(object, rt.kind == "RoleBinding"),
        _ => Vec::new(),
    }
}

/// ValidateRoleBindingUpdate / ValidateClusterRoleBindingUpdate.
pub(super) fn update_errors(rt: &ResourceType, current: &Value, next: &Value) -> Vec<FieldError> {
    if !is_binding(rt) || current["roleRef"] == next["roleRef"] {
        return Vec::new();
    }
    let text = |field: &str| {
        next["roleRef"][field]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    vec![FieldError::invalid_printed(
        "roleRef",
        &format!(
            "rbac.RoleRef{{APIGroup:{:?}, Kind:{:?}, Name:{:?}}}",
            text("apiGroup"),
            text("kind"),
            text("name")
        ),
        "cannot change roleRef",
    )]
}

/// ValidatePolicyRule of each rule.
fn rules_errors(rules: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, rule) in rules.as_array().into_iter().flatten().enumerate() {
        let field = |name: &str| format!("rules[{i}].{name}");
        let listed = |name: &str| rule[name].as_array().map_or(0, Vec::len);
        if listed("verbs") == 0 {
            errors.push(FieldError::required_because(
                field("verbs"),
                "verbs must contain at least one value",
            ));
        }
        if listed("nonResourceURLs") > 0 {
            let urls = go_strings(&rule["nonResourceURLs"]);
            if namespaced {
                errors.push(FieldError::invalid_printed(
                    field("nonResourceURLs"),
                    &urls,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if listed("apiGroups") > 0 || listed("resources") > 0 || listed("resourceNames") > 0 {
                errors.push(FieldError::invalid_printed(
                    field("nonResourceURLs"),
                    &urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if listed("apiGroups") == 0 {
            errors.push(FieldError::required_because(
                field("apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if listed("resources") == 0 {
            errors.push(FieldError::required_because(
                field("resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
    errors
}

/// ValidateRoleBinding / ValidateClusterRoleBinding after the metadata.
fn binding_errors(binding: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let role_ref = &binding["roleRef"];
    let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
    let api_group = text(&role_ref["apiGroup"]);
    if api_group != GROUP {
        errors.push(FieldError::not_supported(
            "roleRef.apiGroup",
            &json!(api_group),
            &[GROUP],
        ));
    }
    let kind = text(&role_ref["kind"]);
    if !matches!(kind.as_str(), "Role" | "ClusterRole") {
        errors.push(FieldError::not_supported(
            "roleRef.kind",
            &json!(kind),
            &["Role", "ClusterRole"],
        ));
    }
    let name = text(&role_ref["name"]);
    if name.is_empty() {
        errors.push(FieldError::required("roleRef.name"));
    }
    for why in path_segment_errors(&name) {
        errors.push(FieldError::invalid("roleRef.name", &json!(name), why));
    }
    for (i, subject) in binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        errors.extend(subject_errors(
            subject,
            namespaced,
            &format!("subjects[{i}]"),
        ));
    }
    errors
}

/// ValidateRoleBindingSubject.
fn subject_errors(subject: &Value, namespaced: bool, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let field = |name: &str| format!("{path}.{name}");
    let text = |name: &str| subject[name].as_str().unwrap_or_default().to_string();
    let (kind, name, api_group) = (text("kind"), text("name"), text("apiGroup"));
    if name.is_empty() {
        errors.push(FieldError::required(field("name")));
    }
    match kind.as_str() {
        "ServiceAccount" => {
            if !name.is_empty() {
                for why in dns1123_subdomain_errors(&name) {
                    errors.push(FieldError::invalid(field("name"), &json!(name), &why));
                }
            }
            if !api_group.is_empty() {
                errors.push(FieldError::not_supported(
                    field("apiGroup"),
                    &json!(api_group),
                    &[""],
                ));
            }
            if !namespaced && text("namespace").is_empty() {
                errors.push(FieldError::required(field("namespace")));
            }
        }
        "User" | "Group" if api_group != GROUP => errors.push(FieldError::not_supported(
            field("apiGroup"),
            &json!(api_group),
            &[GROUP],
        )),
        "User" | "Group" => {}
        _ => errors.push(FieldError::not_supported(
            field("kind"),
            &json!(kind),
            &["ServiceAccount", "User", "Group"],
        )),
    }
    errors
}

/// ValidateRBACName: a name that is a path segment.
fn path_segment_errors(name: &str) -> Vec<&'static str> {
    let mut errors = Vec::new();
    if name == "." || name == ".." {
        errors.push(if name == "." {
            "may not be '.'"
        } else {
            "may not be '..'"
        });
    }
    if name.contains('/') {
        errors.push("may not contain '/'");
    }
    if name.contains('%') {
        errors.push("may not contain '%'");
    }
    errors
}

/// A string list as Go's `%#v` prints it: `[]string{"a", "b"}`.
fn go_strings(values: &Value) -> String {
    let quoted: Vec<String> = values
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| format!("{:?}", v.as_str().unwrap_or_default()))
        .collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    fn rt(kind: &str) -> ResourceType {
        builtin()
            .into_iter()
            .find(|t| t.group == GROUP && t.kind == kind)
            .unwrap()
    }

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn rules() {
        let cases = [
            (
                "Role",
                json!({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
                vec![],
            ),
            (
                "Role",
                json!({"rules": [{"resources": ["pods"], "verbs": ["get"]}]}),
                vec![
                    "rules[0].apiGroups: Required value: resource rules must supply at least one api group",
                ],
            ),
            (
                "ClusterRole",
                json!({"rules": [{"apiGroups": [""]}]}),
                vec![
                    "rules[0].verbs: Required value: verbs must contain at least one value",
                    "rules[0].resources: Required value: resource rules must supply at least one resource",
                ],
            ),
            (
                "ClusterRole",
                json!({"rules": [{"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]}),
                vec![],
            ),
            (
                "Role",
                json!({"rules": [{"nonResourceURLs": ["/healthz"], "resources": ["pods"], "verbs": ["get"]}]}),
                vec![
                    r#"rules[0].nonResourceURLs: Invalid value: []string{"/healthz"}: namespaced rules cannot apply to non-resource URLs"#,
                    r#"rules[0].nonResourceURLs: Invalid value: []string{"/healthz"}: rules cannot apply to both regular resources and non-resource URLs"#,
                ],
            ),
        ];
        for (kind, object, expected) in cases {
            assert_eq!(messages(&errors(&rt(kind), &object)), expected, "{object}");
        }
    }

    #[test]
    fn bindings() {
        let role_ref = json!({"apiGroup": GROUP, "kind": "Role", "name": "r"});
        let cases = [
            (
                "RoleBinding",
                json!({"roleRef": role_ref, "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}),
                vec![],
            ),
            (
                "RoleBinding",
                json!({"roleRef": {"apiGroup": GROUP}, "subjects": [{"kind": "User", "name": "x", "apiGroup": GROUP}]}),
                vec![
                    r#"roleRef.kind: Unsupported value: "": supported values: "Role", "ClusterRole""#,
                    "roleRef.name: Required value",
                ],
            ),
            (
                "RoleBinding",
                json!({"roleRef": role_ref, "subjects": [{"kind": "Robot", "name": "x"}]}),
                vec![
                    r#"subjects[0].kind: Unsupported value: "Robot": supported values: "ServiceAccount", "User", "Group""#,
                ],
            ),
            (
                "ClusterRoleBinding",
                json!({"roleRef": role_ref, "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}),
                vec!["subjects[0].namespace: Required value"],
            ),
            (
                "ClusterRoleBinding",
                json!({"roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "a/b"}, "subjects": [{"kind": "Group", "name": "g"}]}),
                vec![
                    r#"roleRef.name: Invalid value: "a/b": may not contain '/'"#,
                    r#"subjects[0].apiGroup: Unsupported value: "": supported values: "rbac.authorization.k8s.io""#,
                ],
            ),
        ];
        for (kind, object, expected) in cases {
            assert_eq!(messages(&errors(&rt(kind), &object)), expected, "{object}");
        }
    }

    #[test]
    fn binding_defaults_and_fixed_role_ref() {
        let binding = rt("RoleBinding");
        let mut object = json!({"roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "u"}, {"kind": "ServiceAccount", "name": "sa"}]});
        default(&binding, &mut object);
        assert_eq!(object["roleRef"]["apiGroup"], GROUP);
        assert_eq!(object["subjects"][0]["apiGroup"], GROUP);
        assert!(object["subjects"][1]["apiGroup"].is_null());
        assert!(errors(&binding, &object).is_empty());
        let mut changed = object.clone();
        changed["roleRef"]["name"] = json!("other");
        assert_eq!(
            messages(&update_errors(&binding, &object, &changed)),
            [
                r#"roleRef: Invalid value: rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"Role", Name:"other"}: cannot change roleRef"#
            ]
        );
        assert!(update_errors(&binding, &object, &object).is_empty());
    }
}

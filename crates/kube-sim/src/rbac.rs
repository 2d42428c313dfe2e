//! The RBAC authorizer, pure: whether a user may make a request under the stored Roles,
//! ClusterRoles, RoleBindings and ClusterRoleBindings, and the reason kube-apiserver gives
//! (plugin/pkg/auth/authorizer/rbac/rbac.go, pkg/apis/rbac/v1/evaluation_helpers.go, the
//! describers of pkg/registry/rbac/validation/rule.go). The `system:masters` group is allowed
//! everything before RBAC is asked, without a reason (the privileged-group authorizer that
//! kube-apiserver puts first in its union).

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};

/// The group whose members are allowed everything (k8s.io/apiserver/pkg/authentication/user).
pub const PRIVILEGED_GROUP: &str = "system:masters";

/// Who asks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// What is asked: a resource request (SubjectAccessReview `resourceAttributes`) or a request for
/// a path outside the API (`nonResourceAttributes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Resource {
        namespace: String,
        verb: String,
        group: String,
        resource: String,
        subresource: String,
        name: String,
    },
    NonResource {
        path: String,
        verb: String,
    },
}

/// The policy objects RBAC reads, as stored.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub cluster_roles: Vec<ClusterRole>,
    pub roles: Vec<Role>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub role_bindings: Vec<RoleBinding>,
}

/// The answer: allowed or not (RBAC never denies outright, it has no opinion), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// `RBAC: allowed by …` when allowed; when not, the roles that could not be read, if any.
    pub reason: String,
}

/// Decides `request` for `user`: ClusterRoleBindings first, then the RoleBindings of the
/// request's namespace; the first rule that allows it names its binding in the reason.
pub fn authorize(policy: &Policy, user: &User, request: &Request) -> Decision {
    if user.groups.iter().any(|g| g == PRIVILEGED_GROUP) {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let mut errors = Vec::new();
    for binding in sorted(&policy.cluster_role_bindings, |b| {
        b.metadata.name.clone().unwrap_or_default()
    }) {
        let Some(subject) = applies_to(user, binding.subjects.as_deref(), "") else {
            continue;
        };
        match cluster_role_rules(policy, &binding.role_ref.name) {
            Ok(rules) if rules.iter().any(|r| rule_allows(request, r)) => {
                return allowed(format!(
                    "ClusterRoleBinding {:?} of {} {:?} to {}",
                    binding.metadata.name.as_deref().unwrap_or_default(),
                    binding.role_ref.kind,
                    binding.role_ref.name,
                    describe_subject(subject, "")
                ));
            }
            Ok(_) => {}
            Err(error) => errors.push(error),
        }
    }
    let namespace = match request {
        Request::Resource { namespace, .. } => namespace.as_str(),
        Request::NonResource { .. } => "",
    };
    if !namespace.is_empty() {
        let in_namespace = policy
            .role_bindings
            .iter()
            .filter(|b| b.metadata.namespace.as_deref() == Some(namespace));
        for binding in sorted(in_namespace, |b| {
            b.metadata.name.clone().unwrap_or_default()
        }) {
            let Some(subject) = applies_to(user, binding.subjects.as_deref(), namespace) else {
                continue;
            };
            let rules = match binding.role_ref.kind.as_str() {
                "Role" => role_rules(policy, namespace, &binding.role_ref.name),
                _ => cluster_role_rules(policy, &binding.role_ref.name),
            };
            match rules {
                Ok(rules) if rules.iter().any(|r| rule_allows(request, r)) => {
                    return allowed(format!(
                        "RoleBinding {:?} of {} {:?} to {}",
                        format!(
                            "{}/{namespace}",
                            binding.metadata.name.as_deref().unwrap_or_default()
                        ),
                        binding.role_ref.kind,
                        binding.role_ref.name,
                        describe_subject(subject, namespace)
                    ));
                }
                Ok(_) => {}
                Err(error) => errors.push(error),
            }
        }
    }
    // utilerrors.NewAggregate: one error alone, several in brackets.
    let reason = match errors.as_slice() {
        [] => String::new(),
        [one] => format!("RBAC: {one}"),
        many => format!("RBAC: [{}]", many.join(", ")),
    };
    Decision {
        allowed: false,
        reason,
    }
}

fn allowed(by: String) -> Decision {
    Decision {
        allowed: true,
        reason: format!("RBAC: allowed by {by}"),
    }
}

/// The bindings in name order: kube-apiserver reads them from an informer cache, in no order
/// it promises; by name, the reason is at least the same on every call.
fn sorted<'a, T: 'a>(
    items: impl IntoIterator<Item = &'a T>,
    name: impl Fn(&T) -> String,
) -> Vec<&'a T> {
    let mut items: Vec<&T> = items.into_iter().collect();
    items.sort_by_key(|item| name(item));
    items
}

fn cluster_role_rules<'a>(policy: &'a Policy, name: &str) -> Result<&'a [PolicyRule], String> {
    policy
        .cluster_roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))
        .map(|r| r.rules.as_deref().unwrap_or_default())
        .ok_or_else(|| format!("clusterrole.rbac.authorization.k8s.io {name:?} not found"))
}

fn role_rules<'a>(
    policy: &'a Policy,
    namespace: &str,
    name: &str,
) -> Result<&'a [PolicyRule], String> {
    policy
        .roles
        .iter()
        .find(|r| {
            r.metadata.namespace.as_deref() == Some(namespace)
                && r.metadata.name.as_deref() == Some(name)
        })
        .map(|r| r.rules.as_deref().unwrap_or_default())
        .ok_or_else(|| format!("role.rbac.authorization.k8s.io {name:?} not found"))
}

/// The first subject of a binding that is `user` (rbac.go appliesTo); a ServiceAccount without
/// a namespace is one of the binding's namespace.
fn applies_to<'a>(
    user: &User,
    subjects: Option<&'a [Subject]>,
    namespace: &str,
) -> Option<&'a Subject> {
    subjects
        .unwrap_or_default()
        .iter()
        .find(|s| match s.kind.as_str() {
            "User" => s.name == user.name,
            "Group" => user.groups.contains(&s.name),
            "ServiceAccount" => {
                let account_namespace = s
                    .namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(namespace);
                !account_namespace.is_empty()
                    && user.name == format!("system:serviceaccount:{account_namespace}:{}", s.name)
            }
            _ => false,
        })
}

/// `User "alice"`, `Group "g"`, `ServiceAccount "name/namespace"` (rule.go describeSubject).
fn describe_subject(subject: &Subject, binding_namespace: &str) -> String {
    match subject.kind.as_str() {
        "ServiceAccount" => {
            let namespace = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            format!(
                "{} {:?}",
                subject.kind,
                format!("{}/{namespace}", subject.name)
            )
        }
        _ => format!("{} {:?}", subject.kind, subject.name),
    }
}

fn listed(values: &Option<Vec<String>>) -> &[String] {
    values.as_deref().unwrap_or_default()
}

/// Whether one rule allows the request (evaluation_helpers.go RuleAllows).
pub fn rule_allows(request: &Request, rule: &PolicyRule) -> bool {
    let verb_matches = |verb: &str| rule.verbs.iter().any(|v| v == "*" || v == verb);
    match request {
        Request::Resource {
            verb,
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            let combined = if subresource.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{subresource}")
            };
            verb_matches(verb)
                && listed(&rule.api_groups)
                    .iter()
                    .any(|g| g == "*" || g == group)
                && listed(&rule.resources).iter().any(|r| {
                    r == "*"
                        || *r == combined
                        || (!subresource.is_empty()
                            && r.strip_prefix("*/") == Some(subresource.as_str()))
                })
                && (listed(&rule.resource_names).is_empty()
                    || listed(&rule.resource_names).contains(name))
        }
        Request::NonResource { path, verb } => {
            verb_matches(verb)
                && listed(&rule.non_resource_urls).iter().any(|url| {
                    url == "*"
                        || url == path
                        || (url.ends_with('*') && path.starts_with(url.trim_end_matches('*')))
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn policy() -> Policy {
        Policy {
            cluster_roles: vec![
                parse(json!({"metadata": {"name": "snapshots"}, "rules": [
                    {"apiGroups": ["snapshot.storage.k8s.io"], "resources": ["volumesnapshots"], "verbs": ["get", "list"]}]})),
                parse(json!({"metadata": {"name": "logs-of-p1"}, "rules": [
                    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"], "resourceNames": ["p1"]}]})),
                parse(json!({"metadata": {"name": "metrics"}, "rules": [
                    {"nonResourceURLs": ["/healthz", "/metrics/*"], "verbs": ["get"]}]})),
                parse(json!({"metadata": {"name": "any-status"}, "rules": [
                    {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}]})),
            ],
            roles: vec![parse(
                json!({"metadata": {"name": "pod-reader", "namespace": "apps"}, "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
            )],
            cluster_role_bindings: vec![
                parse(json!({"metadata": {"name": "alice-snapshots"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "snapshots"},
                    "subjects": [{"kind": "User", "name": "alice"}]})),
                parse(json!({"metadata": {"name": "metrics"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics"},
                    "subjects": [{"kind": "Group", "name": "monitoring"}]})),
                parse(json!({"metadata": {"name": "status-writer"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "any-status"},
                    "subjects": [{"kind": "ServiceAccount", "name": "ctrl", "namespace": "kube-system"}]})),
                parse(json!({"metadata": {"name": "dangling"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gone"},
                    "subjects": [{"kind": "User", "name": "dave"}]})),
            ],
            role_bindings: vec![
                parse(json!({"metadata": {"name": "readers", "namespace": "apps"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "backup"}]})),
                parse(json!({"metadata": {"name": "logs", "namespace": "apps"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "logs-of-p1"},
                    "subjects": [{"kind": "Group", "name": "g1"}]})),
                parse(
                    json!({"metadata": {"name": "missing-role", "namespace": "apps"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nope"},
                    "subjects": [{"kind": "User", "name": "dave"}]}),
                ),
            ],
        }
    }

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_string()).collect(),
        }
    }

    fn resource(namespace: &str, verb: &str, group: &str, resource: &str, name: &str) -> Request {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Request::Resource {
            namespace: namespace.into(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: name.into(),
        }
    }

    fn path(path: &str) -> Request {
        Request::NonResource {
            path: path.into(),
            verb: "get".into(),
        }
    }

    #[test]
    fn decisions_and_reasons() {
        let snapshots = "snapshot.storage.k8s.io";
        let backup = "system:serviceaccount:apps:backup";
        let cases = [
            (
                "via ClusterRoleBinding",
                user("alice", &[]),
                resource("x", "list", snapshots, "volumesnapshots", ""),
                true,
                r#"RBAC: allowed by ClusterRoleBinding "alice-snapshots" of ClusterRole "snapshots" to User "alice""#,
            ),
            (
                "cluster-wide via ClusterRoleBinding",
                user("alice", &[]),
                resource("", "get", snapshots, "volumesnapshots", "s"),
                true,
                r#"RBAC: allowed by ClusterRoleBinding "alice-snapshots" of ClusterRole "snapshots" to User "alice""#,
            ),
            (
                "verb not in the rule",
                user("alice", &[]),
                resource("x", "delete", snapshots, "volumesnapshots", ""),
                false,
                "",
            ),
            (
                "group not in the rule",
                user("alice", &[]),
                resource("x", "list", "", "volumesnapshots", ""),
                false,
                "",
            ),
            (
                "via RoleBinding, ServiceAccount of the binding's namespace",
                user(backup, &[]),
                resource("apps", "get", "", "pods", "p"),
                true,
                r#"RBAC: allowed by RoleBinding "readers/apps" of Role "pod-reader" to ServiceAccount "backup/apps""#,
            ),
            (
                "RoleBinding in another namespace",
                user(backup, &[]),
                resource("other", "get", "", "pods", "p"),
                false,
                "",
            ),
            (
                "RoleBinding does not grant cluster-wide",
                user(backup, &[]),
                resource("", "get", "", "pods", "p"),
                false,
                "",
            ),
            (
                "RoleBinding to a ClusterRole, subresource and name",
                user("bob", &["g1"]),
                resource("apps", "get", "", "pods/log", "p1"),
                true,
                r#"RBAC: allowed by RoleBinding "logs/apps" of ClusterRole "logs-of-p1" to Group "g1""#,
            ),
            (
                "another name",
                user("bob", &["g1"]),
                resource("apps", "get", "", "pods/log", "p2"),
                false,
                "",
            ),
            (
                "no name where names are listed",
                user("bob", &["g1"]),
                resource("apps", "get", "", "pods/log", ""),
                false,
                "",
            ),
            (
                "the resource without the subresource",
                user("bob", &["g1"]),
                resource("apps", "get", "", "pods", "p1"),
                false,
                "",
            ),
            (
                "*/subresource and * verbs",
                user("system:serviceaccount:kube-system:ctrl", &[]),
                resource(
                    "a",
                    "patch",
                    "storage.k8s.io",
                    "volumeattachments/status",
                    "va",
                ),
                true,
                r#"RBAC: allowed by ClusterRoleBinding "status-writer" of ClusterRole "any-status" to ServiceAccount "ctrl/kube-system""#,
            ),
            (
                "*/subresource is not the resource",
                user("system:serviceaccount:kube-system:ctrl", &[]),
                resource("a", "patch", "storage.k8s.io", "volumeattachments", "va"),
                false,
                "",
            ),
            (
                "ServiceAccount of another namespace",
                user("system:serviceaccount:apps:ctrl", &[]),
                resource("a", "patch", "", "pods/status", "p"),
                false,
                "",
            ),
            (
                "non-resource URL",
                user("m", &["monitoring"]),
                path("/healthz"),
                true,
                r#"RBAC: allowed by ClusterRoleBinding "metrics" of ClusterRole "metrics" to Group "monitoring""#,
            ),
            (
                "non-resource URL prefix",
                user("m", &["monitoring"]),
                path("/metrics/a/b"),
                true,
                r#"RBAC: allowed by ClusterRoleBinding "metrics" of ClusterRole "metrics" to Group "monitoring""#,
            ),
            (
                "non-resource URL prefix is not the bare path",
                user("m", &["monitoring"]),
                path("/metrics"),
                false,
                "",
            ),
            (
                "non-resource rule does not allow resources",
                user("m", &["monitoring"]),
                resource("a", "get", "", "healthz", ""),
                false,
                "",
            ),
            (
                "system:masters, without a reason",
                user("root", &["system:masters"]),
                resource("a", "delete", "", "pods", ""),
                true,
                "",
            ),
            (
                "missing roles are the reason of a refusal",
                user("dave", &[]),
                resource("apps", "get", "", "pods", ""),
                false,
                r#"RBAC: [clusterrole.rbac.authorization.k8s.io "gone" not found, role.rbac.authorization.k8s.io "nope" not found]"#,
            ),
            (
                "one missing role",
                user("dave", &[]),
                resource("x", "get", "", "pods", ""),
                false,
                r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#,
            ),
            (
                "nobody",
                user("eve", &[]),
                resource("apps", "get", "", "pods", ""),
                false,
                "",
            ),
        ];
        let policy = policy();
        for (case, user, request, allowed, reason) in cases {
            let decision = authorize(&policy, &user, &request);
            assert_eq!(
                decision,
                Decision {
                    allowed,
                    reason: reason.into()
                },
                "{case}"
            );
        }
    }

    #[test]
    fn rule_matching() {
        let rule = |v: serde_json::Value| -> PolicyRule { serde_json::from_value(v).unwrap() };
        let all = rule(json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}));
        assert!(rule_allows(
            &resource("a", "delete", "x.io", "things/scale", "n"),
            &all
        ));
        assert!(
            !rule_allows(&path("/healthz"), &all),
            "resource rules never allow paths"
        );
        let star_url = rule(json!({"nonResourceURLs": ["*"], "verbs": ["get"]}));
        assert!(rule_allows(&path("/anything"), &star_url));
        let no_groups = rule(json!({"resources": ["pods"], "verbs": ["get"]}));
        assert!(!rule_allows(
            &resource("a", "get", "", "pods", ""),
            &no_groups
        ));
    }
}

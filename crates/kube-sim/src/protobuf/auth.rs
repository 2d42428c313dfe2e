//! The protobuf bodies of the authentication and RBAC kinds kubectl writes: `kubectl create
//! token` (TokenRequest) and `kubectl create role|clusterrole|rolebinding|clusterrolebinding`.

use k8s_pb::api::authentication::v1 as authentication;
use k8s_pb::api::rbac::v1 as rbac;
use serde_json::{Map, Value, json};

use super::{Object, object_meta, strings};

pub(super) fn token_request(t: authentication::TokenRequest) -> Map<String, Value> {
    let spec = t.spec.unwrap_or_default();
    let bound = spec.bound_object_ref.map(|r| {
        Value::Object(
            Object::default()
                .set("kind", r.kind.map(Value::from))
                .set("apiVersion", r.api_version.map(Value::from))
                .set("name", r.name.map(Value::from))
                .set("uid", r.u_id.map(Value::from))
                .0,
        )
    });
    Object::default()
        .set("metadata", object_meta(t.metadata))
        .set(
            "spec",
            Value::Object(
                Object::default()
                    .set("audiences", json!(spec.audiences))
                    .set(
                        "expirationSeconds",
                        spec.expiration_seconds.map(Value::from),
                    )
                    .set("boundObjectRef", bound)
                    .0,
            ),
        )
        .0
}

pub(super) fn role(r: rbac::Role) -> Map<String, Value> {
    Object::default()
        .set("metadata", object_meta(r.metadata))
        .set("rules", rules(r.rules))
        .0
}

pub(super) fn cluster_role(r: rbac::ClusterRole) -> Map<String, Value> {
    let aggregation = r.aggregation_rule.map(|a| {
        let selectors: Vec<Value> = a
            .cluster_role_selectors
            .into_iter()
            .map(|s| {
                let expressions: Vec<Value> = s
                    .match_expressions
                    .into_iter()
                    .map(|e| {
                        Value::Object(
                            Object::default()
                                .set("key", e.key.map(Value::from))
                                .set("operator", e.operator.map(Value::from))
                                .set("values", json!(e.values))
                                .0,
                        )
                    })
                    .collect();
                Value::Object(
                    Object::default()
                        .set("matchLabels", strings(s.match_labels))
                        .set("matchExpressions", json!(expressions))
                        .0,
                )
            })
            .collect();
        json!({"clusterRoleSelectors": selectors})
    });
    Object::default()
        .set("metadata", object_meta(r.metadata))
        .set("rules", rules(r.rules))
        .set("aggregationRule", aggregation)
        .0
}

pub(super) fn role_binding(b: rbac::RoleBinding) -> Map<String, Value> {
    binding(b.metadata, b.subjects, b.role_ref)
}

pub(super) fn cluster_role_binding(b: rbac::ClusterRoleBinding) -> Map<String, Value> {
    binding(b.metadata, b.subjects, b.role_ref)
}

fn binding(
    metadata: Option<k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    subjects: Vec<rbac::Subject>,
    role_ref: Option<rbac::RoleRef>,
) -> Map<String, Value> {
    // Go marshals a subject's empty apiGroup and namespace; its JSON omits them.
    let text = |value: Option<String>| value.filter(|v| !v.is_empty()).map(Value::from);
    let subjects: Vec<Value> = subjects
        .into_iter()
        .map(|s| {
            Value::Object(
                Object::default()
                    .set("kind", s.kind.map(Value::from))
                    .set("apiGroup", text(s.api_group))
                    .set("name", s.name.map(Value::from))
                    .set("namespace", text(s.namespace))
                    .0,
            )
        })
        .collect();
    let role_ref = role_ref.unwrap_or_default();
    Object::default()
        .set("metadata", object_meta(metadata))
        .set("subjects", json!(subjects))
        .set(
            "roleRef",
            json!({
                "apiGroup": role_ref.api_group.unwrap_or_default(),
                "kind": role_ref.kind.unwrap_or_default(),
                "name": role_ref.name.unwrap_or_default(),
            }),
        )
        .0
}

fn rules(rules: Vec<rbac::PolicyRule>) -> Value {
    rules
        .into_iter()
        .map(|r| {
            Value::Object(
                Object::default()
                    .set("verbs", json!(r.verbs))
                    .set("apiGroups", json!(r.api_groups))
                    .set("resources", json!(r.resources))
                    .set("resourceNames", json!(r.resource_names))
                    .set("nonResourceURLs", json!(r.non_resource_ur_ls))
                    .0,
            )
        })
        .collect()
}

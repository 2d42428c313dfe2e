//! The protobuf bodies of the authentication, authorization and RBAC kinds: those kubectl
//! writes (`kubectl create token` (TokenRequest) and `kubectl create
//! role|clusterrole|rolebinding|clusterrolebinding`) and the reviews typed clients create (the
//! TokenReview and SubjectAccessReview of external-snapshot-metadata).

use k8s_pb::api::authentication::v1 as authentication;
use k8s_pb::api::authorization::v1 as authorization;
use k8s_pb::api::rbac::v1 as rbac;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use serde_json::{Map, Value, json};

use super::{Object, object_meta, strings, text};

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

pub(super) fn token_review(t: authentication::TokenReview) -> Map<String, Value> {
    let spec = t.spec.unwrap_or_default();
    let spec = Object::default()
        .set("token", text(spec.token))
        .set("audiences", json!(spec.audiences));
    Object::default()
        .set("metadata", object_meta(t.metadata))
        .set("spec", Value::Object(spec.0))
        .0
}

/// A SubjectAccessReview; the server answers its status, so the request's is not read.
pub(super) fn subject_access_review(r: authorization::SubjectAccessReview) -> Map<String, Value> {
    access_review(r.metadata, r.spec)
}

pub(super) fn local_subject_access_review(
    r: authorization::LocalSubjectAccessReview,
) -> Map<String, Value> {
    access_review(r.metadata, r.spec)
}

fn access_review(
    metadata: Option<meta::ObjectMeta>,
    spec: Option<authorization::SubjectAccessReviewSpec>,
) -> Map<String, Value> {
    let spec = spec.unwrap_or_default();
    let extra: Map<String, Value> = spec
        .extra
        .into_iter()
        .map(|(key, value)| (key, json!(value.items)))
        .collect();
    // Go marshals the attributes' empty strings; their JSON omits them.
    let resource = spec.resource_attributes.map(|a| {
        Value::Object(
            Object::default()
                .set("namespace", text(a.namespace))
                .set("verb", text(a.verb))
                .set("group", text(a.group))
                .set("version", text(a.version))
                .set("resource", text(a.resource))
                .set("subresource", text(a.subresource))
                .set("name", text(a.name))
                .set(
                    "fieldSelector",
                    a.field_selector
                        .map(|s| selector(s.raw_selector, requirements(s.requirements))),
                )
                .set(
                    "labelSelector",
                    a.label_selector
                        .map(|s| selector(s.raw_selector, requirements(s.requirements))),
                )
                .0,
        )
    });
    let non_resource = spec.non_resource_attributes.map(|a| {
        Value::Object(
            Object::default()
                .set("path", text(a.path))
                .set("verb", text(a.verb))
                .0,
        )
    });
    Object::default()
        .set("metadata", object_meta(metadata))
        .set(
            "spec",
            Value::Object(
                Object::default()
                    .set("resourceAttributes", resource)
                    .set("nonResourceAttributes", non_resource)
                    .set("user", text(spec.user))
                    .set("groups", json!(spec.groups))
                    .set("extra", Value::Object(extra))
                    .set("uid", text(spec.uid))
                    .0,
            ),
        )
        .0
}

fn selector(raw: Option<String>, requirements: Value) -> Value {
    Value::Object(
        Object::default()
            .set("rawSelector", text(raw))
            .set("requirements", requirements)
            .0,
    )
}

/// Field and label selector requirements (of reviews and of label selectors).
fn requirements<R: Requirement>(requirements: Vec<R>) -> Value {
    requirements
        .into_iter()
        .map(|r| {
            let (key, operator, values) = r.parts();
            Value::Object(
                Object::default()
                    .set("key", key.map(Value::from))
                    .set("operator", operator.map(Value::from))
                    .set("values", json!(values))
                    .0,
            )
        })
        .collect()
}

trait Requirement {
    fn parts(self) -> (Option<String>, Option<String>, Vec<String>);
}

impl Requirement for meta::FieldSelectorRequirement {
    fn parts(self) -> (Option<String>, Option<String>, Vec<String>) {
        (self.key, self.operator, self.values)
    }
}

impl Requirement for meta::LabelSelectorRequirement {
    fn parts(self) -> (Option<String>, Option<String>, Vec<String>) {
        (self.key, self.operator, self.values)
    }
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
                Value::Object(
                    Object::default()
                        .set("matchLabels", strings(s.match_labels))
                        .set("matchExpressions", requirements(s.match_expressions))
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
    metadata: Option<meta::ObjectMeta>,
    subjects: Vec<rbac::Subject>,
    role_ref: Option<rbac::RoleRef>,
) -> Map<String, Value> {
    // Go marshals a subject's empty apiGroup and namespace; its JSON omits them.
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
